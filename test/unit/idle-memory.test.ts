import fs from 'node:fs';
import koffi from 'koffi';
import { describe, expect, it } from 'vitest';
import { IdleRelease } from '../../src/idle-release.js';
import { releaseIdleMemory } from '../../src/sys/idle-memory.js';

describe('releaseIdleMemory, in this process', () => {
  it('gives back the pages of memory malloc freed but kept', async () => {
    const libc = koffi.load('libc.so.6');
    const malloc = libc.func('void *malloc(size_t size)');
    const free = libc.func('void free(void *ptr)');
    const memset = libc.func('void *memset(void *s, int c, size_t n)');
    const rss = () => Number(/^VmRSS:\s+(\d+)/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))![1]);
    // 64 KiB blocks stay below glibc's mmap threshold: they live in the heap, and freeing all
    // but the last leaves 60 MiB of free pages that the heap's top cannot give back by itself.
    const blocks = Array.from({ length: 1000 }, () => malloc(64 << 10));
    for (const b of blocks) memset(b, 1, 64 << 10);
    for (const b of blocks.slice(0, -1)) free(b);
    const before = rss();
    const r = await releaseIdleMemory();
    expect(r.trimmed).toBe(true);
    expect(rss()).toBeLessThan(before - 40 * 1024);
    free(blocks.at(-1));
  });
});

/** A clock and one timer slot that the test moves by hand. */
function fakeTime() {
  let now = 0;
  let timer: { at: number; fn: () => void } | undefined;
  return {
    now: () => now,
    setTimer: (fn: () => void, ms: number) => ((timer = { at: now + ms, fn }), {}),
    clearTimer: () => (timer = undefined),
    async advance(ms: number) {
      const until = now + ms;
      await new Promise((r) => setImmediate(r));
      while (timer && timer.at <= until) {
        const t = timer;
        timer = undefined;
        now = t.at;
        t.fn();
        await new Promise((r) => setImmediate(r));
      }
      now = until;
    },
  };
}

describe('IdleRelease', () => {
  it('releases once per quiet spell, after afterMs with no calls', async () => {
    const t = fakeTime();
    let runs = 0;
    const idle = new IdleRelease({ afterMs: 5000, release: () => runs++, ...t });
    await t.advance(4999);
    expect(runs).toBe(0);
    await t.advance(1);
    expect(runs).toBe(1);
    await t.advance(60_000);
    expect(runs).toBe(1);
    idle.touch();
    await t.advance(5000);
    expect(runs).toBe(2);
    idle.close();
  });

  it('never releases while calls keep coming, then does once they stop', async () => {
    const t = fakeTime();
    let runs = 0;
    const idle = new IdleRelease({ afterMs: 5000, release: () => runs++, ...t });
    for (let i = 0; i < 100; i++) {
      idle.touch();
      await t.advance(1000);
    }
    expect(runs).toBe(0);
    await t.advance(3999);
    expect(runs).toBe(0);
    await t.advance(1);
    expect(runs).toBe(1);
    idle.close();
  });

  it('a call during a release starts a new spell; close stops it', async () => {
    const t = fakeTime();
    let runs = 0;
    let finish: () => void = () => {};
    const idle = new IdleRelease({ afterMs: 100, release: () => (runs++, new Promise<void>((r) => (finish = r))), ...t });
    await t.advance(100);
    expect(runs).toBe(1);
    idle.touch();
    finish();
    await t.advance(100);
    expect(runs).toBe(2);
    finish();
    idle.touch();
    idle.close();
    await t.advance(1000);
    expect(runs).toBe(2);
  });

  it('a failing release is reported and the next spell still releases', async () => {
    const t = fakeTime();
    const errors: unknown[] = [];
    let runs = 0;
    const idle = new IdleRelease({ afterMs: 10, release: () => { runs++; throw new Error('no'); }, onError: (e) => errors.push(e), ...t });
    await t.advance(10);
    idle.touch();
    await t.advance(10);
    expect(runs).toBe(2);
    expect(errors).toHaveLength(2);
    idle.close();
  });
});
