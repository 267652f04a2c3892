/**
 * Pods without an infra process (pid CONTAINER) under a hostile or merely
 * busy client. With no running container in such a pod, its net counters come
 * from a helper entered into the pinned network namespace; a burst of stats
 * calls must not fork one helper per call.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

/** The daemon's child processes, by name. */
function children(pid: number): string[] {
  let kids: string[] = [];
  try {
    kids = fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
  } catch {
    return [];
  }
  return kids.flatMap((k) => {
    try {
      return [fs.readFileSync(`/proc/${k}/comm`, 'utf8').trim()];
    } catch {
      return [];
    }
  });
}

const openFds = (pid: number) => fs.readdirSync(`/proc/${pid}/fd`).length;

describe.skipIf(!isRoot)('pods without an infra process under load', () => {
  let f: PodFixture;
  let seq = 0;

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-attack-noinfra');
  });

  afterAll(async () => {
    const leaks = await f?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function runPod(): Promise<string> {
    const n = `atkni${++seq}`;
    const config = {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}-${randomBytes(3).toString('hex')}`, attempt: 0 },
      hostname: n,
      logDirectory: path.join(f.dirs.base, 'logs', n),
      linux: { securityContext: { namespaceOptions: { pid: 'CONTAINER' as const } } },
    };
    return (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
  }

  it('a burst of PodSandboxStats on a pod with no running container runs a bounded number of helpers', async () => {
    const pods = [await runPod(), await runPod()];
    const pid = f.skiff.child.pid!;
    const fdsBefore = openFds(pid);
    let maxHelpers = 0;
    let maxFds = 0;
    const sampler = setInterval(() => {
      maxHelpers = Math.max(maxHelpers, children(pid).filter((c) => c === 'nsenter' || c === 'cat').length);
      maxFds = Math.max(maxFds, openFds(pid));
    }, 5);
    let slowest = 0;
    let probing = true;
    const probe = (async () => {
      while (probing) {
        const t = Date.now();
        await f.skiff.runtime.Version({});
        slowest = Math.max(slowest, Date.now() - t);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    try {
      const calls = [
        ...Array.from({ length: 300 }, (_, i) => f.skiff.runtime.PodSandboxStats({ podSandboxId: pods[i % 2]! })),
        ...Array.from({ length: 20 }, () => f.skiff.runtime.ListPodSandboxStats({})),
      ];
      const res = await Promise.all(calls);
      // Every answer still carries the pod's interfaces (read through the pin).
      for (const r of res.slice(0, 300) as Array<{ stats?: { linux?: { network?: { interfaces?: Array<{ name?: string }> } } } }>) {
        expect(r.stats?.linux?.network?.interfaces?.map((i) => i.name)).toContain('eth0');
      }
    } finally {
      probing = false;
      clearInterval(sampler);
      await probe;
    }
    // Before the fix: one nsenter per call at once (~150 alive, hundreds of pipe fds).
    expect(maxHelpers).toBeLessThanOrEqual(2);
    expect(maxFds - fdsBefore).toBeLessThan(100);
    expect(slowest).toBeLessThan(1_000);
    expect(f.skiff.log).not.toContain('crash guard');
    for (const id of pods) await f.skiff.runtime.RemovePodSandbox({ podSandboxId: id });
  });
});
