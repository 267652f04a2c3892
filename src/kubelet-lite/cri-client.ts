/**
 * kubelet-lite's CRI client: the runtime and image services on any CRI
 * endpoint (skiff, containerd, CRI-O), each call with its own deadline.
 */
import * as grpc from '@grpc/grpc-js';
import type { ImageServiceClient } from '../gen/runtime/v1/ImageService.js';
import type { RuntimeServiceClient } from '../gen/runtime/v1/RuntimeService.js';
import type { ContainerEventResponse__Output } from '../gen/runtime/v1/ContainerEventResponse.js';
import { loadCri } from '../server/proto.js';

type Unary<C> = {
  [K in keyof C as C[K] extends (req: infer _R, cb: infer _CB) => unknown ? K : never]: C[K] extends {
    (argument: infer Req, callback: grpc.requestCallback<infer Res>): grpc.ClientUnaryCall;
  }
    ? (req: Req, timeoutMs?: number) => Promise<Res>
    : never;
};

export type RuntimeCalls = Unary<RuntimeServiceClient>;
export type ImageCalls = Unary<ImageServiceClient>;

/** What the agent needs from a CRI endpoint; tests may hand in a double. */
export interface CriEndpoint {
  readonly runtime: RuntimeCalls;
  readonly images: ImageCalls;
  /** The runtime's container event stream; `onEnd` is called once when it ends for any reason. */
  containerEvents(onEvent: (e: ContainerEventResponse__Output) => void, onEnd: (err?: Error) => void): { cancel(): void };
  close(): void;
}

/** The default deadline of a CRI call, as the kubelet's runtime client uses (2 minutes). */
export const DEFAULT_CRI_TIMEOUT_MS = 120_000;

function unary<C extends grpc.Client>(client: C): Unary<C> {
  return new Proxy(client, {
    get(target, prop) {
      const fn = (target as unknown as Record<string | symbol, unknown>)[prop];
      if (typeof fn !== 'function') return fn;
      return (req: unknown, timeoutMs = DEFAULT_CRI_TIMEOUT_MS) =>
        new Promise((resolve, reject) =>
          (fn as (r: unknown, m: grpc.Metadata, o: grpc.CallOptions, cb: (e: unknown, r: unknown) => void) => void).call(
            target,
            req,
            new grpc.Metadata(),
            { deadline: Date.now() + timeoutMs },
            (err, res) => (err ? reject(err) : resolve(res)),
          ),
        );
    },
  }) as unknown as Unary<C>;
}

/** `unix:///run/skiff/skiff.sock`, `unix:/path` or a bare path, as the kubelet's --container-runtime-endpoint. */
export function grpcTarget(endpoint: string): string {
  if (endpoint.startsWith('unix://')) return `unix:${endpoint.slice('unix://'.length)}`;
  if (endpoint.startsWith('unix:')) return endpoint;
  if (endpoint.startsWith('/')) return `unix:${endpoint}`;
  throw new Error(`runtime endpoint must be unix:///path/to.sock, not "${endpoint}"`);
}

export function connectCri(endpoint: string): CriEndpoint {
  const cri = loadCri();
  const target = grpcTarget(endpoint);
  const options = { 'grpc.max_receive_message_length': 16 * 1024 * 1024 };
  const rt = new cri.runtime.v1.RuntimeService(target, grpc.credentials.createInsecure(), options);
  const img = new cri.runtime.v1.ImageService(target, grpc.credentials.createInsecure(), options);
  return {
    runtime: unary(rt),
    images: unary(img),
    containerEvents(onEvent, onEnd) {
      const call = rt.getContainerEvents({});
      let ended = false;
      const end = (err?: Error) => {
        if (ended) return;
        ended = true;
        onEnd(err);
      };
      call.on('data', onEvent);
      call.on('error', (err) => end(err));
      call.on('end', () => end());
      return { cancel: () => call.cancel() };
    },
    close() {
      rt.close();
      img.close();
    },
  };
}

/** The gRPC status code of a failed CRI call, or undefined for anything else. */
export function grpcCode(err: unknown): grpc.status | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'number' ? code : undefined;
}

export function isNotFound(err: unknown): boolean {
  return grpcCode(err) === grpc.status.NOT_FOUND;
}
