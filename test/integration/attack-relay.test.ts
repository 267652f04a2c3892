/**
 * The CRI relay's socket pairs (h2-authority-proxy.ts) when the daemon is out
 * of descriptors: each client that sends the HTTP/2 preface needs a pair of
 * two more, and one that cannot get it is refused. The refusals must cost
 * nothing that lasts (descriptors, a crash) and, like the connections
 * refused past MAX_CRI_CONNECTIONS, one warning per burst rather than a log
 * line per connection a client cares to open.
 */
import { readdirSync } from 'node:fs';
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeDirs, removeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { frame, PREFACE } from '../helpers/h2-frames.js';
import { waitFor } from '../helpers/registry.js';
import { fdCount, GUARD, nofile, setNofile } from '../helpers/streaming-probe.js';

const NO_PAIR = /no socket pair/;

/** The `n` lowest descriptor numbers `pid` has free. */
function freeNumbers(pid: number, n: number): number[] {
  const used = new Set(readdirSync(`/proc/${pid}/fd`).map(Number));
  const free: number[] = [];
  for (let fd = 0; free.length < n; fd++) if (!used.has(fd)) free.push(fd);
  return free;
}

describe.skipIf(!isRoot)('the CRI relay out of descriptors', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
    await skiff.runtime.Version({});
  });

  afterAll(async () => {
    await skiff?.stop();
    await removeDirs(dirs);
  });

  it('refuses clients it has no socket pair for with one warning per burst, leaks nothing, and serves again once it can', async () => {
    const pid = skiff.child.pid!;
    const limits = nofile(pid);
    const before = fdCount(pid);
    const N = 60;
    // A descriptor the daemon holds for a moment may free room for a pair now and then: that client is served.
    let served = 0;
    const socks: net.Socket[] = [];
    // Room for a client's own descriptor, not for the two of its pair. The limit bounds descriptor numbers, not
    // how many are open: it is set to the second free number, leaving the first one free below it.
    setNofile(pid, freeNumbers(pid, 2)[1]!, limits.hard);
    try {
      // One after another, each once the last is gone: each is accepted, and refused for want of a pair.
      for (let i = 0; i < N; i++) {
        const s = net.connect(dirs.socket);
        s.on('error', () => undefined);
        s.once('data', () => served++);
        s.on('connect', () => s.write(Buffer.concat([PREFACE, frame(0x4, 0, 0, Buffer.alloc(0))])));
        socks.push(s);
        await waitFor('the client refused or served', async () => s.destroyed || s.bytesRead > 0, 5000);
      }
      expect(served).toBeLessThan(N / 10);
    } finally {
      setNofile(pid, limits.soft, limits.hard);
      for (const s of socks) s.destroy();
    }
    const warnings = skiff.log.split('\n').filter((l) => NO_PAIR.test(l));
    console.info(`${warnings.length} log lines for ${N} clients refused for want of a socket pair`);
    expect(warnings.length).toBeGreaterThanOrEqual(1);
    expect(warnings.length).toBeLessThanOrEqual(2);
    await waitFor('descriptors back to where they were', async () => fdCount(pid) <= before, 5000);
    // Served again (a new connection gets its pair and the server's SETTINGS), and the burst is summed up once.
    const fresh = net.connect(dirs.socket);
    fresh.on('error', () => undefined);
    fresh.write(Buffer.concat([PREFACE, frame(0x4, 0, 0, Buffer.alloc(0))]));
    await new Promise<void>((resolve) => fresh.once('data', () => resolve()));
    fresh.destroy();
    const t0 = Date.now();
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');
    expect(Date.now() - t0).toBeLessThan(1000);
    await waitFor('the refusals summed up', async () => /CRI connections served again/.test(skiff.log), 2000);
    expect(skiff.child.exitCode).toBeNull();
    expect(skiff.log).not.toContain(GUARD);
  });
});
