/**
 * Fake time for unit tests of the node agent: vitest's fake timers drive
 * setTimeout/setImmediate, and `now` reads the same clock, for the parts
 * that take it injected (the agent, its workers, the fake runtime). Date
 * stays real, so a part that read the wall clock instead of `now` would
 * show a date years away from the fake one.
 *
 * `advance` moves time one timer at a time and, before each, lets the code
 * under test finish everything it can without time passing — promise
 * chains and real file I/O (the termination-log reads) — so what happens
 * depends only on the timers, never on how fast the machine is.
 */
import { vi } from 'vitest';

// Taken before any test fakes timers.
const realSetImmediate = globalThis.setImmediate;
const realTurn = () => new Promise<void>((resolve) => realSetImmediate(resolve));

/** libuv requests of file system calls in flight (a FileHandle's close is a CloseReq). */
const FILE_IO = /^(FSReq|CloseReq|FileHandle)/;

/** 2030-01-01T00:00:00Z: far enough from today that a read of the real clock stands out. */
export const FAKE_EPOCH = Date.UTC(2030, 0, 1);

export class FakeClock {
  constructor(start = FAKE_EPOCH) {
    vi.useFakeTimers({ now: start, toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'setImmediate', 'clearImmediate'] });
  }

  readonly now = (): number => vi.getMockedSystemTime()!.getTime();

  /**
   * Resolves once nothing can happen without time passing: every promise
   * chain has run as far as it can and no file system request is pending.
   */
  async settle(): Promise<void> {
    let quiet = 0;
    for (let i = 0; i < 100_000; i++) {
      await realTurn();
      const io = process.getActiveResourcesInfo().some((r) => FILE_IO.test(r));
      quiet = io ? 0 : quiet + 1;
      if (quiet >= 2) return;
    }
    throw new Error('the code under test never settled (file I/O kept running)');
  }

  /** Moves the clock `ms` forward, firing each timer in turn and settling after each. */
  async advance(ms: number): Promise<void> {
    const end = this.now() + ms;
    await this.settle();
    // A timer of our own at the end: the next timer is never past it.
    const mark = setTimeout(() => undefined, ms);
    try {
      while (this.now() < end) {
        await vi.advanceTimersToNextTimerAsync();
        await this.settle();
      }
      // Timers set for this very moment by what just ran (setImmediate, 0 ms).
      for (let i = 0; i < 3; i++) {
        await vi.advanceTimersByTimeAsync(0);
        await this.settle();
      }
    } finally {
      clearTimeout(mark);
    }
  }

  /** Advances until `done()` holds, checking after every timer; throws after `limitMs`. */
  async until(done: () => boolean, limitMs: number, what = 'the condition'): Promise<void> {
    const end = this.now() + limitMs;
    await this.advance(0);
    while (!done()) {
      if (this.now() >= end) throw new Error(`${what} did not come true within ${limitMs} ms of fake time`);
      const mark = setTimeout(() => undefined, end - this.now());
      await vi.advanceTimersToNextTimerAsync();
      clearTimeout(mark);
      await this.settle();
    }
  }

  uninstall(): void {
    vi.useRealTimers();
  }
}
