/**
 * The short soak (60 pod cycles): the same run as `npm run soak`, small
 * enough for CI. The daemon's open fds must not grow after the warm-up and no
 * conmon or child process may accumulate. Its RSS may grow by 32 MiB here:
 * 60 cycles still include V8's heap and SQLite's cache warming up (about
 * 15 MiB between cycles 20 and 60 on the 2-core dev machine, flat after
 * cycle 150); the full `npm run soak` holds it to 10 MiB after cycle 100.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { formatTable, soak } from '../../bench/soak.js';

describe.skipIf(!isRoot)('soak: pod cycles leak no memory, fds or processes', () => {
  let fx: PodFixture;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/soak-busybox');
  });

  afterAll(async () => {
    const leaks = await fx?.cleanup();
    expect(leaks?.mounts ?? [], 'mounts left behind').toEqual([]);
    expect(leaks?.processes ?? [], 'processes left behind').toEqual([]);
  });

  it('60 cycles of run, create, start, exec, stop, remove', { timeout: 300_000 }, async () => {
    const r = await soak(fx.skiff, fx.image, { cycles: 60, every: 10, warmup: 20, maxRssGrowthKiB: 32 * 1024, maxFdGrowth: 0 });
    console.log(`${formatTable(r.samples)}\ngrowth after cycle 20: ${JSON.stringify(r.growth)}; ${r.msPerCycle.toFixed(0)} ms per cycle`);
    expect(r.failures).toEqual([]);
    expect(r.samples.at(-1)!.conmons).toBe(0);
  });
});
