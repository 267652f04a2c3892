/**
 * The one place where skiff's errors become gRPC statuses, and where every
 * RPC is logged with its method, duration and result code.
 */
import { SkiffError, isNoSpace, type ErrorKind } from '../errors.js';
import type { Logger } from '../log.js';
import type { UnaryCall } from './rpc.js';
import { Status, statusName, type ServiceError } from './status.js';

const codes: Record<ErrorKind, Status> = {
  NotFound: Status.NOT_FOUND,
  AlreadyExists: Status.ALREADY_EXISTS,
  InvalidArgument: Status.INVALID_ARGUMENT,
  FailedPrecondition: Status.FAILED_PRECONDITION,
  Unavailable: Status.UNAVAILABLE,
  DeadlineExceeded: Status.DEADLINE_EXCEEDED,
  Unauthenticated: Status.UNAUTHENTICATED,
  PermissionDenied: Status.PERMISSION_DENIED,
  Unimplemented: Status.UNIMPLEMENTED,
  ResourceExhausted: Status.RESOURCE_EXHAUSTED,
  Internal: Status.INTERNAL,
};

export function toServiceError(err: unknown): ServiceError {
  const code = err instanceof SkiffError ? codes[err.kind] : isNoSpace(err) ? Status.RESOURCE_EXHAUSTED : Status.UNKNOWN;
  const message = err instanceof Error ? err.message : String(err);
  return { code, details: message };
}

export type UnaryHandler<Req, Res> = (req: Req, call: UnaryCall) => Promise<Res>;

/**
 * The calls a kubelet makes over and over (relists, statuses, stats, probes): logged at debug when they
 * succeed, so that a node's log at info says what changed rather than every poll. Failures are logged at
 * info (or error) like any other call.
 */
const POLLED = new Set([
  'Version',
  'Status',
  'RuntimeConfig',
  'ListPodSandbox',
  'PodSandboxStatus',
  'ListContainers',
  'ContainerStatus',
  'ContainerStats',
  'ListContainerStats',
  'PodSandboxStats',
  'ListPodSandboxStats',
  'ListMetricDescriptors',
  'ListPodSandboxMetrics',
  'ExecSync',
  'ListImages',
  'ImageStatus',
  'ImageFsInfo',
]);

/** Whether `path` (`/runtime.v1.RuntimeService/ListContainers`, or the bare method name) is one a kubelet polls. */
export function isPolledMethod(path: string): boolean {
  return POLLED.has(path.slice(path.lastIndexOf('/') + 1));
}

/** Runs a handler for a unary call, answers with its result or its error as a status, and logs the call. */
export function unary<Req, Res>(method: string, log: Logger, fn: UnaryHandler<Req, Res>): (call: UnaryCall) => void {
  const polled = POLLED.has(method.slice(method.lastIndexOf('/') + 1));
  return (call) => {
    const started = process.hrtime.bigint();
    const done = (err: ServiceError | null, res?: Res) => {
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      const code = err ? statusName(err.code) : call.cancelled ? 'CANCELLED' : 'OK';
      const fields = { method, ms: Math.round(ms * 100) / 100, code, ...(err ? { error: err.details } : {}) };
      if (err && err.code === Status.UNKNOWN) log.error('rpc', fields);
      else if (polled && !err) log.debug('rpc', fields);
      else log.info('rpc', fields);
      call.respond(err, res);
    };
    let p: Promise<Res>;
    try {
      p = fn(call.request as Req, call);
    } catch (err) {
      done(toServiceError(err));
      return;
    }
    p.then(
      (res) => done(null, res),
      (err) => done(toServiceError(err)),
    );
  };
}

export function unimplemented(method: string, log: Logger, what: string): (call: UnaryCall) => void {
  return unary(method, log, async () => {
    throw new SkiffError('Unimplemented', `${method} is not implemented by skiff yet (${what})`);
  });
}

/**
 * Runs `fn` once the answer to `call` has been taken by the client, or the
 * call has ended otherwise: memory held for an answer is then held exactly
 * as long as the client takes to read it. Without a call (a handler run
 * directly), on the next turn.
 */
export function whenAnswered(call: UnaryCall | undefined, fn: () => void): void {
  if (call) call.whenAnswered(fn);
  else setImmediate(fn);
}
