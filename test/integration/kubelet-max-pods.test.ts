/**
 * --max-pods through a real agent and runtime: pods beyond the cap wait,
 * Pending and unscheduled, start in turn as running pods go, and pods that
 * have finished do not hold a place.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

const sleeper = (name: string, image: string) =>
  podYaml(name, image, `  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: IMAGE
    command: [sleep, "3600"]
`);

const unscheduled = (p: Pod | undefined) => p?.status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False');

describe.skipIf(!isRoot)('kubelet-lite: --max-pods', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-max-pods', ['--max-pods', '2']);
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const all = async () => (await node.get<{ items: Pod[] }>('/pods')).body.items ?? [];

  it('runs two pods and keeps the third Pending and unscheduled until one of them goes', async () => {
    for (const n of ['a', 'b', 'c']) await node.write(`${n}.yaml`, sleeper(n, node.image));
    const { running, waiting } = await waitFor('two pods ready and one waiting', async () => {
      const ps = await all();
      const running = ps.filter(ready);
      const waiting = ps.filter((p) => unscheduled(p));
      return running.length === 2 && waiting.length === 1 ? { running, waiting: waiting[0]! } : undefined;
    }, 60_000);
    expect(waiting.status?.phase).toBe('Pending');
    expect(unscheduled(waiting)).toMatchObject({ reason: 'Unschedulable', message: expect.stringMatching(/maximum of 2 pods \(--max-pods\)/) });
    expect(waiting.status?.containerStatuses ?? []).toEqual([]);
    // It stays so: nothing else ends.
    await new Promise((r) => setTimeout(r, 1500));
    expect(unscheduled(await node.pod(waiting.metadata!.name!))).toBeDefined();

    await node.remove(`${running[0]!.metadata!.name}.yaml`);
    const started = await node.waitPod(waiting.metadata!.name!, ready, 'the waiting pod to start');
    expect(unscheduled(started)).toBeUndefined();
    expect((await all()).filter(ready)).toHaveLength(2);
  });

  it('does not count pods that finished', async () => {
    const [left] = (await all()).filter(ready);
    await node.write('done.yaml', podYaml('done', node.image, `  restartPolicy: Never
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "exit 0"]
`));
    // At the cap: it waits, then runs to completion once a place frees.
    await node.waitPod('done', (p) => !!unscheduled(p), 'the finishing pod to wait');
    await node.remove(`${left!.metadata!.name}.yaml`);
    await node.waitPod('done', (p) => p.status?.phase === 'Succeeded', 'the finishing pod to succeed');
    // One sleeper and one finished pod: a new pod has room.
    await node.write('d.yaml', sleeper('d', node.image));
    const d = await node.waitPod('d', ready, 'a pod started beside the finished one');
    expect(unscheduled(d)).toBeUndefined();
    for (const f of ['a', 'b', 'c', 'd', 'done']) await node.remove(`${f}.yaml`);
    await waitFor('every pod gone', async () => ((await all()).length === 0 ? true : undefined), 30_000);
  });

  it('after a restart, adopts the running pods first: a waiting pod listed before them still waits, and so does an adopted pod written again', async () => {
    await waitFor('no pods left from the tests before', async () => ((await all()).length === 0 ? true : undefined), 30_000);
    for (const n of ['r1', 'r2']) await node.write(`${n}.yaml`, sleeper(n, node.image));
    for (const n of ['r1', 'r2']) await node.waitPod(n, ready, `${n} to run`);
    // Its file sorts first, so the restarted agent meets it before the two it must adopt.
    await node.write('a-waits.yaml', sleeper('a-waits', node.image));
    await node.waitPod('a-waits', (p) => !!unscheduled(p), 'the third pod to wait');
    await node.restartAgent('SIGKILL');
    for (const n of ['r1', 'r2']) await node.waitPod(n, ready, `${n} adopted`);
    await new Promise((r) => setTimeout(r, 2000));
    const waiting = await node.pod('a-waits');
    expect(unscheduled(waiting)).toBeDefined();
    expect(waiting?.status?.containerStatuses ?? []).toEqual([]);
    expect((await all()).filter(ready).map((p) => p.metadata!.name).sort()).toEqual(['r1', 'r2']);
    // Room again: it starts.
    await node.remove('r1.yaml');
    await node.waitPod('a-waits', ready, 'the waiting pod to start once r1 went');
    // r1 back as it was (the same pod, the same uid): it was adopted once, but now it is a new pod
    // and waits like any other.
    await node.write('r1.yaml', sleeper('r1', node.image));
    await node.waitPod('r1', (p) => !!unscheduled(p), 'r1, written again, to wait');
    await new Promise((r) => setTimeout(r, 1500));
    expect((await all()).filter(ready).map((p) => p.metadata!.name).sort()).toEqual(['a-waits', 'r2']);
    for (const f of ['r1', 'r2', 'a-waits']) await node.remove(`${f}.yaml`);
    await waitFor('every pod gone', async () => ((await all()).length === 0 ? true : undefined), 30_000);
  });

  it('starts waiting pods in the order they began to wait, not in the order of their files', async () => {
    await waitFor('no pods left from the tests before', async () => ((await all()).length === 0 ? true : undefined), 30_000);
    for (const n of ['z-run1', 'z-run2']) await node.write(`${n}.yaml`, sleeper(n, node.image));
    for (const n of ['z-run1', 'z-run2']) await node.waitPod(n, ready, `${n} to run`);
    await node.write('z-first.yaml', sleeper('z-first', node.image));
    await node.waitPod('z-first', (p) => !!unscheduled(p), 'the first pod to wait');
    // Waits after z-first, though its file sorts (and is listed) first.
    await node.write('a-second.yaml', sleeper('a-second', node.image));
    await node.waitPod('a-second', (p) => !!unscheduled(p), 'the second pod to wait');
    await node.remove('z-run1.yaml');
    await node.waitPod('z-first', ready, 'the pod that waited longest to start');
    expect(unscheduled(await node.pod('a-second'))).toBeDefined();
    await node.remove('z-run2.yaml');
    await node.waitPod('a-second', ready, 'the second pod to start in its turn');
    for (const f of ['z-first', 'a-second']) await node.remove(`${f}.yaml`);
    await waitFor('every pod gone', async () => ((await all()).length === 0 ? true : undefined), 30_000);
  });
});
