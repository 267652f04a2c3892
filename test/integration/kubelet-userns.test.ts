/**
 * kubelet-lite with `hostUsers: false` over a real `skiff cri`: a pod is
 * refused with a reason while the runtime does not offer user namespaces;
 * once it does, each such pod runs as root inside a user namespace of its
 * own block of 65536 host ids, kept across a restart of the agent and given
 * back when the pod is removed. Ids are read inside the containers through
 * ExecSync.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';

const idOf = (p: Pod, c: string) => containerStatus(p, c)?.containerID?.replace(/^[a-z]+:\/\//, '') ?? '';

describe.skipIf(!isRoot)('kubelet-lite: pods with hostUsers: false', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-userns');
  }, 120_000);

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const usernsPod = (name: string) =>
    podYaml(name, node.image, `  hostUsers: false
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
`);

  async function exec(p: Pod, script: string): Promise<string> {
    const r = await node.pods.skiff.runtime.ExecSync({ containerId: idOf(p, 'c'), cmd: ['sh', '-c', script], timeout: 10 });
    return Buffer.from(r.stdout ?? '').toString() + Buffer.from(r.stderr ?? '').toString();
  }

  /** The pod's uid and gid maps, which must be the same single range: its first host id. */
  async function hostIdOf(p: Pod): Promise<number> {
    const out = await exec(p, 'cat /proc/self/uid_map /proc/self/gid_map');
    const m = /^\s*0\s+(\d+)\s+65536\n\s*0\s+(\d+)\s+65536\n$/.exec(out);
    expect(m, `uid_map and gid_map: ${JSON.stringify(out)}`).not.toBeNull();
    expect(m![1]).toBe(m![2]);
    return Number(m![1]);
  }

  const savedRanges = async () => JSON.parse(await fs.readFile(path.join(node.rootDir, 'userns-ranges.json'), 'utf8').catch(() => '{"pods":{}}')) as { pods: Record<string, number> };

  it('refuses the pod with a reason while the runtime does not report user namespaces, making no sandbox', async () => {
    // The test's state dir is 0700 under a 0700 base: the runtime reports userNamespaces false.
    await node.write('u0.yaml', usernsPod('u0'));
    const p = await node.waitPod('u0', (x) => x.status?.reason === 'CreatePodSandboxConfigError', 'CreatePodSandboxConfigError', 30_000);
    expect(p.status?.message).toContain("can't set `spec.hostUsers: false`, runtime does not support user namespaces");
    expect(p.status?.phase).toBe('Pending');
    const sandboxes = await node.pods.skiff.runtime.ListPodSandbox({});
    expect((sandboxes.items ?? []).filter((s) => s.metadata?.name === 'u0')).toEqual([]);
    expect((await savedRanges()).pods).toEqual({});
    await node.remove('u0.yaml');
    await node.waitGone('u0');
  });

  it('runs each pod in its own range of host ids once the runtime offers user namespaces', async () => {
    // runc reaches a pod's rootfs from inside its user namespace: the state dir and those above it
    // must be searchable by others; the daemon probes that when it starts.
    await node.agent.stop();
    for (const d of [node.pods.dirs.base, node.pods.dirs.state]) await fs.chmod(d, 0o711);
    await node.pods.skiff.stop();
    await node.pods.skiff.start();
    await node.agent.start();
    const st = await node.pods.skiff.runtime.Status({});
    expect(st.runtimeHandlers?.some((h) => h.features?.userNamespaces)).toBe(true);

    await node.write('u1.yaml', usernsPod('u1'));
    await node.write('u2.yaml', usernsPod('u2'));
    const p1 = await node.waitPod('u1', ready, 'Ready', 90_000);
    const p2 = await node.waitPod('u2', ready, 'Ready', 90_000);
    const id1 = await hostIdOf(p1);
    const id2 = await hostIdOf(p2);
    for (const id of [id1, id2]) {
      expect(id).toBeGreaterThanOrEqual(65536);
      expect(id % 65536).toBe(0);
    }
    expect(Math.abs(id1 - id2)).toBeGreaterThanOrEqual(65536);
    expect(await exec(p1, 'id -u; id -g')).toBe('0\n0\n');
    expect((await savedRanges()).pods).toEqual({ [p1.metadata!.uid!]: id1, [p2.metadata!.uid!]: id2 });
  }, 240_000);

  it('keeps a pod\'s range across a restart of the agent, and gives it back when the pod is removed', async () => {
    const before = await node.waitPod('u1', ready, 'Ready');
    const id1 = await hostIdOf(before);
    const id2 = await hostIdOf(await node.waitPod('u2', ready, 'Ready'));
    await node.restartAgent();
    const after = await node.waitPod('u1', (x) => ready(x) && x.metadata?.uid === before.metadata?.uid, 'Ready again');
    expect(idOf(after, 'c')).toBe(idOf(before, 'c'));
    expect(containerStatus(after, 'c')?.restartCount).toBe(0);
    expect((await savedRanges()).pods[before.metadata!.uid!]).toBe(id1);

    await node.remove('u1.yaml');
    await node.waitGone('u1');
    expect(Object.values((await savedRanges()).pods)).toEqual([id2]);
    // u1 and u2 held the two lowest ranges: the lowest free one, handed out next, is u1's.
    await node.write('u3.yaml', usernsPod('u3'));
    const p3 = await node.waitPod('u3', ready, 'Ready', 90_000);
    expect(await hostIdOf(p3)).toBe(id1);
  }, 240_000);
});
