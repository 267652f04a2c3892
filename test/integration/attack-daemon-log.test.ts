/**
 * The daemon when whoever read its log goes away (a log collector that
 * restarts, `skiff cri 2>&1 | tee` interrupted): its log lines then fail
 * with EPIPE. Logging is best effort; serving is not.
 */
import fs from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';

/** The process' CPU time so far, in clock ticks (user + system). */
function cpuTicks(pid: number): number {
  const fields = fs.readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

describe.skipIf(!isRoot)('the daemon once nobody reads its log', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  });

  afterAll(async () => {
    await skiff?.stop();
    await fs.promises.rm(dirs.base, { recursive: true, force: true });
  });

  it('keeps answering, and does not spin, when its stderr is a pipe nobody reads any more (EPIPE)', async () => {
    const pid = skiff.child.pid!;
    await skiff.runtime.Version({});
    // Close our ends of its output pipes: its next log line fails with EPIPE.
    skiff.child.stderr!.destroy();
    skiff.child.stdout!.destroy();
    for (let i = 0; i < 5; i++) {
      const t0 = Date.now();
      const answered = await Promise.race([skiff.runtime.Version({}).then(() => true), new Promise((r) => setTimeout(() => r(false), 3000))]);
      expect(answered, `Version call ${i} after the log reader left`).toBe(true);
      expect(Date.now() - t0).toBeLessThan(1000);
    }
    // Idle, it uses next to no CPU (a crash guard logging its own EPIPE for ever would use a whole core).
    const before = cpuTicks(pid);
    await new Promise((r) => setTimeout(r, 2000));
    const used = cpuTicks(pid) - before;
    console.info(`CPU ticks over 2 s once the log reader left: ${used}`);
    expect(used).toBeLessThan(50);
    expect(skiff.child.exitCode).toBeNull();
  });
});
