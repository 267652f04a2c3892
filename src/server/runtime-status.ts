import type { StatusRequest__Output } from '../gen/runtime/v1/StatusRequest.js';
import type { StatusResponse } from '../gen/runtime/v1/StatusResponse.js';
import type { RuntimeCondition } from '../gen/runtime/v1/RuntimeCondition.js';

export interface Readiness {
  runtime(): { ready: boolean; reason?: string; message?: string };
  network(): { ready: boolean; reason?: string; message?: string };
  /** Shown to `crictl info` under verbose. */
  info(): Record<string, unknown>;
}

function condition(type: string, c: { ready: boolean; reason?: string; message?: string }): RuntimeCondition {
  return { type, status: c.ready, reason: c.ready ? '' : (c.reason ?? ''), message: c.ready ? '' : (c.message ?? '') };
}

export function status(readiness: Readiness) {
  return async (req: StatusRequest__Output): Promise<StatusResponse> => ({
    status: {
      conditions: [condition('RuntimeReady', readiness.runtime()), condition('NetworkReady', readiness.network())],
    },
    info: req.verbose ? { config: JSON.stringify(readiness.info()) } : {},
  });
}
