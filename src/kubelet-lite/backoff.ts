/**
 * The kubelet's restart back-off: the first restart is immediate, then a
 * container that dies again waits 10 s, 20 s, 40 s … up to 5 min. A key that
 * has not needed a restart for twice the cap (10 min of clean running) starts
 * over. The same shape, with its own key, paces image pull retries.
 */
export interface BackoffOptions {
  initialMs: number;
  maxMs: number;
}

export const CONTAINER_BACKOFF: BackoffOptions = { initialMs: 10_000, maxMs: 300_000 };
export const IMAGE_BACKOFF: BackoffOptions = { initialMs: 10_000, maxMs: 300_000 };

interface Entry {
  delayMs: number;
  lastUpdate: number;
}

export class Backoff {
  private readonly entries = new Map<string, Entry>();

  constructor(private readonly opts: BackoffOptions = CONTAINER_BACKOFF) {}

  /** The delay that applies to `key` now, or 0 when it has none (or it expired). */
  delay(key: string, now: number): number {
    const e = this.entries.get(key);
    if (!e || this.expired(e, now)) return 0;
    return e.delayMs;
  }

  /**
   * When `key` may run again if its last run ended at `since`, or undefined
   * when it may run now.
   */
  blockedUntil(key: string, since: number, now: number): number | undefined {
    const d = this.delay(key, now);
    if (d === 0) return undefined;
    const until = since + d;
    return until > now ? until : undefined;
  }

  /** Records a restart of `key` at `now`: the next one waits longer. */
  next(key: string, now: number): void {
    const e = this.entries.get(key);
    if (!e || this.expired(e, now)) {
      this.entries.set(key, { delayMs: this.opts.initialMs, lastUpdate: now });
      return;
    }
    e.delayMs = Math.min(e.delayMs * 2, this.opts.maxMs);
    e.lastUpdate = now;
  }

  reset(key: string): void {
    this.entries.delete(key);
  }

  /** Forgets every key with `prefix` (a pod's keys when it goes away). */
  forget(prefix: string): void {
    for (const k of this.entries.keys()) if (k.startsWith(prefix)) this.entries.delete(k);
  }

  private expired(e: Entry, now: number): boolean {
    return now - e.lastUpdate > 2 * this.opts.maxMs;
  }
}
