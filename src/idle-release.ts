/**
 * Runs `release` once the daemon has been quiet for `afterMs`: no call
 * started or ended in that time. It runs at most once per quiet spell and
 * never while calls keep coming; the next call after it starts a new spell.
 *
 * `touch()` is on every call's path, so it only notes the time: the one
 * timer is armed when none is, and re-armed for the remainder when it fires
 * early.
 */
export interface IdleReleaseOptions {
  afterMs: number;
  release: () => Promise<unknown> | unknown;
  now?: () => number;
  setTimer?: (fn: () => void, ms: number) => { unref?(): unknown };
  clearTimer?: (t: { unref?(): unknown }) => void;
  onError?: (err: unknown) => void;
}

export class IdleRelease {
  private last: number;
  private timer: { unref?(): unknown } | undefined;
  /** Released since the last call: nothing more to give back until calls come again. */
  private released = false;
  private running = false;
  private closed = false;
  private touches = 0;
  private readonly now: () => number;
  private readonly setTimer: NonNullable<IdleReleaseOptions['setTimer']>;
  private readonly clearTimer: NonNullable<IdleReleaseOptions['clearTimer']>;

  constructor(private readonly opts: IdleReleaseOptions) {
    this.now = opts.now ?? (() => performance.now());
    this.setTimer = opts.setTimer ?? ((fn, ms) => setTimeout(fn, ms));
    this.clearTimer = opts.clearTimer ?? ((t) => clearTimeout(t as NodeJS.Timeout));
    this.last = this.now();
    // A daemon that has just started is idle too: what starting touched is given back.
    this.arm(opts.afterMs);
  }

  /** A call started or ended. */
  touch(): void {
    this.last = this.now();
    this.touches++;
    this.released = false;
    if (!this.timer) this.arm(this.opts.afterMs);
  }

  close(): void {
    this.closed = true;
    if (this.timer) this.clearTimer(this.timer);
    this.timer = undefined;
  }

  private arm(ms: number): void {
    if (this.closed) return;
    this.timer = this.setTimer(() => this.fire(), ms);
    this.timer.unref?.();
  }

  private fire(): void {
    this.timer = undefined;
    if (this.released || this.closed) return;
    // Still releasing after calls came and went: looked at again once that is done.
    if (this.running) return this.arm(this.opts.afterMs);
    const quiet = this.now() - this.last;
    if (quiet < this.opts.afterMs) return this.arm(this.opts.afterMs - quiet);
    this.running = true;
    const seen = this.touches;
    Promise.resolve()
      .then(() => this.opts.release())
      .catch((err) => this.opts.onError?.(err))
      .finally(() => {
        this.running = false;
        // A call that came while releasing starts a new spell; its touch() armed the timer.
        if (this.touches === seen) this.released = true;
      });
  }
}
