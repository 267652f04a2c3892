import type { StatusRequest__Output } from '../gen/runtime/v1/StatusRequest.js';
import type { StatusResponse } from '../gen/runtime/v1/StatusResponse.js';
import type { RuntimeCondition } from '../gen/runtime/v1/RuntimeCondition.js';
import { NO_FEATURES, type HandlerFeatures } from '../oci/features.js';

type Condition = { ready: boolean; reason?: string; message?: string };

export interface Readiness {
  runtime(): Condition | Promise<Condition>;
  network(): Condition | Promise<Condition>;
  /** The runtime handlers that work on this host. */
  handlers(): string[];
  /** The handler a pod without one gets; listed a second time under the name "", as containerd does. */
  defaultHandler?: string;
  /** What a handler supports, as its runtime reported at start. */
  features?(handler: string): HandlerFeatures;
  /** Whether a handler's pods may have a user namespace (runtime and kernel probed at start). */
  userNamespaces?(handler: string): boolean;
  /** Shown to `crictl info` under verbose. */
  info(): Record<string, unknown>;
}

function condition(type: string, c: Condition): RuntimeCondition {
  return { type, status: c.ready, reason: c.ready ? '' : (c.reason ?? ''), message: c.ready ? '' : (c.message ?? '') };
}

/** [name as listed, handler it stands for]: every working handler, then "" for the default one. */
function handlerNames(readiness: Readiness): Array<[string, string]> {
  const names = readiness.handlers();
  const listed = names.map((n): [string, string] => [n, n]);
  return readiness.defaultHandler && names.includes(readiness.defaultHandler) ? [...listed, ['', readiness.defaultHandler]] : listed;
}

export function status(readiness: Readiness) {
  return async (req: StatusRequest__Output): Promise<StatusResponse> => ({
    status: {
      conditions: [condition('RuntimeReady', await readiness.runtime()), condition('NetworkReady', await readiness.network())],
    },
    runtimeHandlers: handlerNames(readiness).map(([name, handler]) => ({
      name,
      features: { recursiveReadOnlyMounts: (readiness.features?.(handler) ?? NO_FEATURES).recursiveReadOnlyMounts, userNamespaces: readiness.userNamespaces?.(handler) ?? false },
    })),
    info: req.verbose ? { config: JSON.stringify(readiness.info()) } : {},
  });
}
