/**
 * The one place where skiff's errors become gRPC statuses, and where every
 * RPC is logged with its method, duration and result code.
 */
import * as grpc from '@grpc/grpc-js';
import { SkiffError, isNoSpace, type ErrorKind } from '../errors.js';
import type { Logger } from '../log.js';

const codes: Record<ErrorKind, grpc.status> = {
  NotFound: grpc.status.NOT_FOUND,
  AlreadyExists: grpc.status.ALREADY_EXISTS,
  InvalidArgument: grpc.status.INVALID_ARGUMENT,
  FailedPrecondition: grpc.status.FAILED_PRECONDITION,
  Unavailable: grpc.status.UNAVAILABLE,
  DeadlineExceeded: grpc.status.DEADLINE_EXCEEDED,
  Unauthenticated: grpc.status.UNAUTHENTICATED,
  PermissionDenied: grpc.status.PERMISSION_DENIED,
  Unimplemented: grpc.status.UNIMPLEMENTED,
  ResourceExhausted: grpc.status.RESOURCE_EXHAUSTED,
  Internal: grpc.status.INTERNAL,
};

export function toServiceError(err: unknown): grpc.ServiceError {
  const code = err instanceof SkiffError ? codes[err.kind] : isNoSpace(err) ? grpc.status.RESOURCE_EXHAUSTED : grpc.status.UNKNOWN;
  const message = err instanceof Error ? err.message : String(err);
  return Object.assign(new Error(message), { code, details: message, metadata: new grpc.Metadata() });
}

export type UnaryHandler<Req, Res> = (req: Req, call: grpc.ServerUnaryCall<Req, Res>) => Promise<Res>;

export function unary<Req, Res>(method: string, log: Logger, fn: UnaryHandler<Req, Res>): grpc.handleUnaryCall<Req, Res> {
  return (call, callback) => {
    const started = process.hrtime.bigint();
    const done = (err: grpc.ServiceError | null, res?: Res) => {
      const ms = Number(process.hrtime.bigint() - started) / 1e6;
      const code = err ? grpc.status[err.code] : 'OK';
      const fields = { method, ms: Math.round(ms * 100) / 100, code, ...(err ? { error: err.message } : {}) };
      if (err && err.code === grpc.status.UNKNOWN) log.error('rpc', fields);
      else log.info('rpc', fields);
      callback(err, res);
    };
    let p: Promise<Res>;
    try {
      p = fn(call.request, call);
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

export function unimplemented(method: string, log: Logger, what: string): grpc.handleUnaryCall<unknown, unknown> {
  return unary(method, log, async () => {
    throw new SkiffError('Unimplemented', `${method} is not implemented by skiff yet (${what})`);
  });
}

const ANSWERED = Symbol('skiff.answered');
type AnsweredHook = (fn: () => void) => void;

/**
 * A server interceptor for the methods named: each request message carries a
 * hook that runs callbacks once the call's answer has been written out (its
 * status is sent only after its message has been written) or the call has
 * ended otherwise. Memory held for an answer is then held exactly as long as
 * the client takes to read it.
 */
export function answerTracker(paths: Set<string>): grpc.ServerInterceptor {
  return (method, call) => {
    if (!paths.has(method.path)) return new grpc.ServerInterceptingCall(call);
    const waiting: Array<() => void> = [];
    let done = false;
    const fire = () => {
      if (done) return;
      done = true;
      for (const fn of waiting.splice(0)) fn();
    };
    const hook: AnsweredHook = (fn) => (done ? fn() : void waiting.push(fn));
    return new grpc.ServerInterceptingCall(call, {
      start: (next) =>
        next({
          onReceiveMessage: (message, nextMessage) => {
            if (message && typeof message === 'object') Object.defineProperty(message, ANSWERED, { value: hook });
            nextMessage(message);
          },
          onCancel: fire,
        }),
      sendStatus: (status, next) => {
        next(status);
        fire();
      },
    });
  };
}

/** Runs `fn` once the answer to the call that received `request` has left (see answerTracker). */
export function whenAnswered(request: object, fn: () => void): void {
  const hook = (request as { [ANSWERED]?: AnsweredHook })[ANSWERED];
  if (hook) hook(fn);
  else setImmediate(fn);
}
