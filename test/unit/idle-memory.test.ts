import fs from 'node:fs';
import { describe, expect, it } from 'vitest';
import { IdleRelease } from '../../src/idle-release.js';
import { droppableMappings, releaseIdleMemory } from '../../src/sys/idle-memory.js';

const entry = (range: string, perms: string, file: string, rss: number, anon: number) =>
  `${range} ${perms} 00000000 fe:00 260689                             ${file}
Size:               1024 kB
Rss:                 ${rss} kB
Pss:                 ${rss} kB
Private_Clean:       ${rss - anon} kB
Anonymous:           ${anon} kB
VmFlags: rd mr mw me sd
`;

describe('droppableMappings', () => {
  const smaps = [
    entry('00400000-00b6f000', 'r--p', '/usr/bin/node', 5944, 0),
    entry('00b72000-025fe000', 'r-xp', '/usr/bin/node', 16620, 0),
    // RELRO: relocated, so its pages differ from the file.
    entry('0563a000-0563e000', 'r--p', '/usr/bin/node', 16, 8),
    entry('0563e000-0565d000', 'rw-p', '/usr/bin/node', 124, 92),
    entry('7f0000000000-7f0000100000', 'r-xp', '/usr/lib/x86_64-linux-gnu/libc.so.6', 704, 0),
    entry('7f0000100000-7f0000200000', 'r-xp', '/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30', 284, 0),
    entry('7f0000200000-7f0000300000', 'r-xp', '/n/koffi/build/koffi.node', 244, 0),
    entry('7f0000300000-7f0000400000', 'r--p', '/n/koffi/build/koffi.node', 0, 0),
    // Not program files, or not private, or writable, or anonymous: never touched.
    entry('7f0000400000-7f0000500000', 'r--p', '/var/lib/skiff/metadata.db-shm', 32, 0),
    entry('7f0000500000-7f0000600000', 'r--s', '/usr/lib/x86_64-linux-gnu/libfoo.so', 32, 0),
    entry('7f0000600000-7f0000700000', 'rw-p', '/usr/lib/x86_64-linux-gnu/libc.so.6', 8, 0),
    entry('7f0000700000-7f0000800000', 'rw-p', '', 2048, 2048),
    entry('7f0000800000-7f0000900000', 'r--p', '/usr/bin/other-node', 100, 0),
    entry('7f0000900000-7f0000a00000', 'r-xp', '/tmp/x.so (deleted)', 100, 0),
  ].join('');

  it('picks the resident, unmodified, read-only private mappings of node, libraries and addons', () => {
    const got = droppableMappings(smaps, '/usr/bin/node');
    expect(got.map((m) => [m.start.toString(16), m.path, m.rssKiB])).toEqual([
      ['400000', '/usr/bin/node', 5944],
      ['b72000', '/usr/bin/node', 16620],
      ['7f0000000000', '/usr/lib/x86_64-linux-gnu/libc.so.6', 704],
      ['7f0000100000', '/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30', 284],
      ['7f0000200000', '/n/koffi/build/koffi.node', 244],
    ]);
    expect(got[1]!.end - got[1]!.start).toBe(0x25fe000n - 0xb72000n);
  });

  it('leaves a mapping whose Anonymous line is missing alone', () => {
    const noAnon = '00400000-00b6f000 r--p 00000000 fe:00 1 /usr/bin/node\nRss: 100 kB\n';
    expect(droppableMappings(noAnon, '/usr/bin/node')).toEqual([]);
  });
});

describe('releaseIdleMemory, in this process', () => {
  it('drops resident node pages and the process keeps running the same code', async () => {
    const rss = () => Number(/^VmRSS:\s+(\d+)/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))![1]);
    const before = rss();
    const r = await releaseIdleMemory();
    expect(r.droppedKiB).toBeGreaterThan(5 * 1024);
    expect(rss()).toBeLessThan(before - 5 * 1024);
    // Code, relocated data and libraries still work after their pages went.
    expect(JSON.parse(JSON.stringify({ a: [1, 2, { b: 'c' }] }))).toEqual({ a: [1, 2, { b: 'c' }] });
    expect(new Intl.NumberFormat('en').format(1234.5)).toBe('1,234.5');
    expect((await import('node:crypto')).createHash('sha256').update('x').digest('hex')).toMatch(/^2d71/);
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
