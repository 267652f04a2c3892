/**
 * A CriEndpoint test double for kubelet-lite's probes and hooks: only
 * ExecSync answers, with whatever the test scripts (exit codes, delays,
 * gRPC errors); every call is recorded.
 */
import * as grpc from '@grpc/grpc-js';
import type { CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import type { ExecSyncRequest } from '../../src/gen/runtime/v1/ExecSyncRequest.js';

export interface ExecAnswer {
  exitCode?: number;
  stdout?: string | Buffer;
  stderr?: string;
  /** Answer after this long (real time). */
  delayMs?: number;
  /** Fail the call with this gRPC status instead. */
  code?: grpc.status;
  details?: string;
  /** Never answer (the call's own deadline is ignored, as a broken runtime would). */
  hang?: boolean;
}

export interface ExecCall {
  req: ExecSyncRequest;
  timeoutMs: number | undefined;
}

export function grpcError(code: grpc.status, details: string): grpc.ServiceError {
  return Object.assign(new Error(`${code} ${grpc.status[code]}: ${details}`), { code, details, metadata: new grpc.Metadata() });
}

export function execDouble(answer: (req: ExecSyncRequest) => ExecAnswer): CriEndpoint & { calls: ExecCall[]; pending: number } {
  const calls: ExecCall[] = [];
  const state = { pending: 0 };
  const runtime = new Proxy(
    {},
    {
      get(_t, prop) {
        if (prop === 'execSync') {
          return (req: ExecSyncRequest, timeoutMs?: number) => {
            calls.push({ req, timeoutMs });
            const a = answer(req);
            if (a.hang) return new Promise(() => undefined);
            state.pending++;
            return new Promise((resolve, reject) => {
              const t = setTimeout(() => {
                state.pending--;
                if (a.code !== undefined) return reject(grpcError(a.code, a.details ?? ''));
                resolve({ stdout: Buffer.from(a.stdout ?? ''), stderr: Buffer.from(a.stderr ?? ''), exitCode: a.exitCode ?? 0 });
              }, a.delayMs ?? 0);
              t.unref();
            });
          };
        }
        return () => Promise.reject(grpcError(grpc.status.UNIMPLEMENTED, `${String(prop)} is not in the test double`));
      },
    },
  );
  return {
    calls,
    get pending() {
      return state.pending;
    },
    runtime: runtime as CriEndpoint['runtime'],
    images: runtime as unknown as CriEndpoint['images'],
    containerEvents: () => ({ cancel: () => undefined }),
    close: () => undefined,
  };
}
