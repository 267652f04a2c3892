/**
 * Work that several callers wait on together (one pull of an image for every
 * concurrent PullImage of it). A caller that goes away stops waiting at once;
 * the work itself is aborted only when no caller is left.
 */
import { SkiffError } from '../errors.js';

/** The end of a pull whose callers all went away: not a fault of the registry or the image. */
export class PullCancelled extends SkiffError {
  constructor(message: string) {
    super('DeadlineExceeded', message);
  }
}

export function cancelledError(reason: unknown, what: string): SkiffError {
  if (reason instanceof SkiffError) return reason;
  return new PullCancelled(`${what} cancelled: ${reason instanceof Error ? reason.message : 'the client went away'}`);
}

/** True when `err`, or an error it wraps, is a cancellation: another pull sharing the work may redo it. */
export function isCancellation(err: unknown): boolean {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 10; e = e.cause, depth++) {
    if (e instanceof PullCancelled) return true;
  }
  return false;
}

export class SharedWork<T> {
  private readonly controller = new AbortController();
  private waiters = 0;
  readonly result: Promise<T>;

  constructor(
    work: (signal: AbortSignal) => Promise<T>,
    private readonly what: string,
    /** Called when the last caller leaves and the work is aborted. */
    private readonly onAbandoned: () => void = () => {},
  ) {
    this.result = work(this.controller.signal);
    this.result.catch(() => {});
  }

  get abandoned(): boolean {
    return this.controller.signal.aborted;
  }

  /** Waits for the result; aborting `signal` rejects this caller alone, and the work with the last one. */
  join(signal?: AbortSignal): Promise<T> {
    this.waiters++;
    if (!signal) return this.result;
    return new Promise<T>((resolve, reject) => {
      const leave = () => {
        this.waiters--;
        reject(cancelledError(signal.reason, this.what));
        if (this.waiters === 0) {
          this.controller.abort(signal.reason);
          this.onAbandoned();
        }
      };
      if (signal.aborted) {
        leave();
        return;
      }
      signal.addEventListener('abort', leave, { once: true });
      this.result.then(
        (v) => {
          signal.removeEventListener('abort', leave);
          resolve(v);
        },
        (e: unknown) => {
          signal.removeEventListener('abort', leave);
          reject(e);
        },
      );
    });
  }
}
