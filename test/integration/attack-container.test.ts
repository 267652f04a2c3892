/**
 * What a container's own processes can make the daemon do through the files
 * they write in their writable layer, which the daemon walks to report its
 * disk usage: a directory swapped for a symlink to the host's / while the walk
 * runs, and a directory of very many files.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { peakRss, rssOf } from '../helpers/hostile-registry.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

let seq = 0;

describe.skipIf(!isRoot)('a hostile container against the daemon', () => {
  let fx: PodFixture;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-attack-container');
  });

  afterAll(async () => {
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  async function runContainer(script: string) {
    const n = `cpod${++seq}`;
    const config = { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: n, logDirectory: path.join(fx.dirs.base, 'logs', n), linux: {} };
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: podSandboxId!,
      config: { metadata: { name: `c${seq}` }, image: { image: fx.image }, logPath: `c${seq}.log`, linux: {}, command: ['sh', '-c', script] },
      sandboxConfig: config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    return { pod: podSandboxId!, id: containerId! };
  }

  it('never walks the host through a directory the container swaps for a symlink to /', async () => {
    // Eight directories of one file each among 1000 files; eight loops keep each a symlink to / most of the
    // time and a directory now and then. A walk that trusts what readdir said meets the symlink a little later.
    const swap = (i: number) => `(mkdir -p /w/d${i} && touch /w/d${i}/f && cd /w && while :; do mv d${i} x${i}; ln -s / d${i}; usleep 30000; rm d${i}; mv x${i} d${i}; done) &`;
    const c = await runContainer(`mkdir -p /w && cd /w && seq 1 1000 | xargs touch && ${Array.from({ length: 8 }, (_, i) => swap(i)).join(' ')} wait`);
    let most = 0;
    const deadline = Date.now() + 8_000;
    while (Date.now() < deadline) {
      const st = await fx.skiff.runtime.ContainerStats({ containerId: c.id });
      most = Math.max(most, Number(st.stats!.writableLayer!.inodesUsed!.value));
    }
    // The layer holds about a thousand entries; the host's / holds hundreds of thousands.
    expect(most).toBeLessThan(1100);
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: c.pod });
  });

  it('reports a layer of 200k files without holding their names: RSS flat, other RPCs answer', async () => {
    const c = await runContainer('mkdir /many && cd /many && seq 1 200000 | xargs touch && touch /done; sleep 1000');
    await (async () => {
      for (let i = 0; i < 120; i++) {
        const r = await fx.skiff.runtime.ExecSync({ containerId: c.id, cmd: ['test', '-e', '/done'], timeout: 5 });
        if (r.exitCode === 0) return;
        await new Promise((res) => setTimeout(res, 500));
      }
      throw new Error('the container did not make its files');
    })();
    const pid = fx.skiff.child.pid!;
    const base = await rssOf(pid);
    let slowest = 0;
    const { result, peak } = await peakRss(pid, async () => {
      const stats = fx.skiff.runtime.ContainerStats({ containerId: c.id });
      let done = false;
      void stats.finally(() => (done = true)).catch(() => undefined);
      while (!done) {
        const t0 = Date.now();
        await fx.skiff.runtime.Version({});
        slowest = Math.max(slowest, Date.now() - t0);
        await new Promise((r) => setTimeout(r, 20));
      }
      return stats;
    });
    expect(result.status).toBe('fulfilled');
    const st = (result as PromiseFulfilledResult<Awaited<ReturnType<typeof fx.skiff.runtime.ContainerStats>>>).value;
    expect(Number(st.stats!.writableLayer!.inodesUsed!.value)).toBeGreaterThan(200_000);
    expect(slowest).toBeLessThan(1000);
    expect(peak - base, `RSS grew from ${base >> 20} to ${peak >> 20} MiB`).toBeLessThan(32 << 20);
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: c.pod });
  });
});
