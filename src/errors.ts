/** Every failure skiff reports has a kind; src/server maps kinds to gRPC codes in one place. */
export type ErrorKind =
  | 'NotFound'
  | 'AlreadyExists'
  | 'InvalidArgument'
  | 'FailedPrecondition'
  | 'Unavailable'
  | 'DeadlineExceeded'
  | 'Unauthenticated'
  | 'PermissionDenied'
  | 'Unimplemented'
  | 'ResourceExhausted'
  | 'Internal';

export class SkiffError extends Error {
  readonly kind: ErrorKind;
  constructor(kind: ErrorKind, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.kind = kind;
    this.name = 'SkiffError';
  }
}

export const notFound = (msg: string) => new SkiffError('NotFound', msg);
export const invalidArgument = (msg: string) => new SkiffError('InvalidArgument', msg);
export const failedPrecondition = (msg: string) => new SkiffError('FailedPrecondition', msg);

/** Wraps any error with context, keeping its kind when it has one. */
export function wrap(err: unknown, context: string, fallback: ErrorKind = 'Internal'): SkiffError {
  const kind = err instanceof SkiffError ? err.kind : fallback;
  return new SkiffError(kind, `${context}: ${errorMessage(err)}`, { cause: err });
}

export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

/** Node's fs errors carry a string code (ENOENT, EEXIST, ...). */
export function isErrno(err: unknown, code: string): boolean {
  return typeof err === 'object' && err !== null && (err as { code?: unknown }).code === code;
}
