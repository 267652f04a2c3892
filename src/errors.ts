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

/** Wraps any error with context, keeping its kind when it has one; a full disk is always ResourceExhausted. */
export function wrap(err: unknown, context: string, fallback: ErrorKind = 'Internal'): SkiffError {
  const kind = err instanceof SkiffError ? err.kind : isNoSpace(err) ? 'ResourceExhausted' : fallback;
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

/**
 * A full filesystem (blocks or inodes), a full quota, or SQLite finding its
 * disk full, anywhere along the cause chain.
 */
export function isNoSpace(err: unknown): boolean {
  for (let e = err, depth = 0; e && depth < 10; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof SkiffError && e.kind === 'ResourceExhausted') return true;
    const code = typeof e === 'object' ? (e as { code?: unknown }).code : undefined;
    if (code === 'ENOSPC' || code === 'EDQUOT' || code === 'SQLITE_FULL') return true;
  }
  return false;
}

/**
 * `err` as ResourceExhausted naming `where` (Node's write errors name no
 * path), when it is a full disk; otherwise `err` unchanged.
 */
export function noSpaceAt(err: unknown, where: string): unknown {
  if (!isNoSpace(err) || (err instanceof SkiffError && err.kind === 'ResourceExhausted')) return err;
  return new SkiffError('ResourceExhausted', `no space left on device for ${where}: ${errorMessage(err)}`, { cause: err });
}
