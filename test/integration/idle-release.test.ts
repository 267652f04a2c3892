/**
 * An idle daemon gives back the free pages glibc keeps after a burst of
 * work, once per quiet spell, and never while calls keep coming.
 */
import fs from 'node:fs/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';

const releases = (log: string) =>
  log
    .split('\n')
    .filter((l) => l.includes('"msg":"idle: memory released"'))
    .map((l) => JSON.parse(l) as { rssBeforeKiB: number; rssAfterKiB: number; trimmed: boolean });


describe.skipIf(!isRoot)('skiff cri: memory given back when idle', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs, ['--idle-release-after', '1s', '--images-dir', '']).start();
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('trims once quiet after starting, and still answers afterwards', async () => {
    const [r] = await waitFor('a release', async () => (releases(skiff.log).length ? releases(skiff.log) : undefined), 20_000);
    expect(r!.rssAfterKiB).toBeLessThanOrEqual(r!.rssBeforeKiB);
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');
    expect((await skiff.runtime.ListContainers({})).containers).toEqual([]);
  });

  it('does not release while changing calls keep coming, and does once, after they stop', async () => {
    await waitFor('a first release', async () => releases(skiff.log).length > 0 || undefined, 20_000);
    // UpdateRuntimeConfig changes the node's state (here: nothing to change), so it is no poll.
    const change = () => skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: {} });
    await change();
    const before = releases(skiff.log).length;
    const until = Date.now() + 3_500;
    let calls = 0;
    while (Date.now() < until) {
      await change();
      calls++;
    }
    expect(calls).toBeGreaterThan(10);
    expect(releases(skiff.log).length).toBe(before);
    await waitFor('the release after the calls', async () => releases(skiff.log).length === before + 1 || undefined, 10_000);
    // Once per quiet spell: nothing more while it stays quiet.
    await new Promise((r) => setTimeout(r, 2_500));
    expect(releases(skiff.log).length).toBe(before + 1);
  });

  it("a kubelet's polls do not hold it off: it comes a second after the last change while lists go on", async () => {
    await skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: {} });
    const before = releases(skiff.log).length;
    const deadline = Date.now() + 10_000;
    while (releases(skiff.log).length === before && Date.now() < deadline) {
      expect((await skiff.runtime.ListContainers({})).containers).toEqual([]);
      await skiff.runtime.ListPodSandbox({});
    }
    expect(releases(skiff.log).length).toBe(before + 1);
  });
});
