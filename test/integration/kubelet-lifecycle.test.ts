/**
 * kubelet-lite end to end: real manifests in a directory, a real `skiff
 * kubelet` process, a real `skiff cri` under it; every assertion goes through
 * the agent's status API (and ExecSync where the test must look inside).
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

const idOf = (p: Pod, c: string) => containerStatus(p, c)?.containerID?.replace(/^[a-z]+:\/\//, '') ?? '';

describe.skipIf(!isRoot)('kubelet-lite: pod lifecycle through a real runtime', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-lifecycle');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function exec(p: Pod, container: string, script: string): Promise<{ code: number; out: string }> {
    const r = await node.pods.skiff.runtime.ExecSync({ containerId: idOf(p, container), cmd: ['sh', '-c', script], timeout: 10 });
    return { code: r.exitCode ?? -1, out: Buffer.from(r.stdout ?? '').toString() + Buffer.from(r.stderr ?? '').toString() };
  }

  it('runs a pod from a new manifest and reports it Running and Ready with its IP', async () => {
    await node.write('web.yaml', podYaml('web', node.image, `  containers:
  - name: main
    image: IMAGE
    command: [sleep, "3600"]
`, '  labels:\n    app: web\n'));
    const p = await node.waitPod('web', ready, 'Ready');
    expect(p.status?.phase).toBe('Running');
    expect(p.status?.podIP).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(p.status?.qosClass).toBe('BestEffort');
    expect(containerStatus(p, 'main')?.containerID).toMatch(/^skiff:\/\/[0-9a-f]{64}$/);
    expect(p.metadata?.labels?.app).toBe('web');
    const reasons = (await node.events('web')).map((e) => e.reason);
    expect(reasons).toEqual(expect.arrayContaining(['Created', 'Started']));
  });

  it('shows CrashLoopBackOff with growing delays between restarts', async () => {
    await node.write('crash.yaml', podYaml('crash', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sh, -c, "date +%s; exit 3"]
`));
    const p = await node.waitPod('crash', (x) => (containerStatus(x, 'c')?.restartCount ?? 0) >= 3, 'three restarts', 90_000);
    const cs = containerStatus(p, 'c')!;
    expect(cs.lastState?.terminated?.exitCode).toBe(3);
    await node.waitPod('crash', (x) => containerStatus(x, 'c')?.state?.waiting?.reason === 'CrashLoopBackOff', 'CrashLoopBackOff');
    // Each start is an event: first restart at once, then 10 s, then 20 s.
    const starts = (await node.events('crash')).filter((e) => e.reason === 'Started');
    expect(starts[0]!.count).toBeGreaterThanOrEqual(4);
    const backoffs = (await node.events('crash')).filter((e) => e.reason === 'BackOff');
    expect(backoffs.length).toBeGreaterThan(0);
    expect(backoffs[0]!.type).toBe('Warning');
    expect(p.status?.phase).toBe('Running');
    await node.remove('crash.yaml');
  }, 120_000);

  it('records the growing gaps: the restart after the second crash waits about 10 s, the next about 20 s', async () => {
    await node.write('crash2.yaml', podYaml('crash2', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sh, -c, "exit 1"]
`));
    const starts: number[] = [];
    await waitFor('four starts of crash2', async () => {
      const p = await node.pod('crash2');
      const cs = p && containerStatus(p, 'c');
      // The newest instance is the current state, or the last state while it waits out its back-off.
      const current = cs?.state?.running ?? cs?.state?.terminated;
      const n = cs?.restartCount ?? 0;
      const inst = current ?? cs?.lastState?.terminated;
      if (cs && inst?.startedAt) starts[n] = Date.parse(inst.startedAt);
      // While one runs, the last state is the one before it: an instance that came and went
      // between two polls (the first restart is immediate) is still counted.
      const before = current && n > 0 ? cs?.lastState?.terminated : undefined;
      if (before?.startedAt) starts[n - 1] ??= Date.parse(before.startedAt);
      return [0, 1, 2, 3].every((i) => starts[i]) ? true : undefined;
    }, 90_000);
    const gaps = [starts[1]! - starts[0]!, starts[2]! - starts[1]!, starts[3]! - starts[2]!];
    expect(gaps[0]).toBeLessThan(3_000);
    expect(gaps[1]).toBeGreaterThanOrEqual(9_000);
    expect(gaps[1]).toBeLessThan(14_000);
    expect(gaps[2]).toBeGreaterThanOrEqual(19_000);
    await node.remove('crash2.yaml');
  }, 120_000);

  it('restarts a container whose liveness probe fails', async () => {
    await node.write('live.yaml', podYaml('live', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sh, -c, "touch /tmp/alive; exec sleep 3600"]
    livenessProbe:
      exec:
        command: [test, -f, /tmp/alive]
      periodSeconds: 1
      failureThreshold: 2
      terminationGracePeriodSeconds: 1
`));
    const p = await node.waitPod('live', (x) => !!containerStatus(x, 'c')?.state?.running, 'running');
    expect(containerStatus(p, 'c')?.restartCount).toBe(0);
    await exec(p, 'c', 'rm /tmp/alive');
    const after = await node.waitPod('live', (x) => containerStatus(x, 'c')?.restartCount === 1 && !!containerStatus(x, 'c')?.state?.running, 'restarted once', 30_000);
    expect(idOf(after, 'c')).not.toBe(idOf(p, 'c'));
    const unhealthy = (await node.events('live')).filter((e) => e.reason === 'Unhealthy');
    expect(unhealthy[0]?.message).toMatch(/Liveness probe failed/);
    // The new instance made its file again and stays up.
    await new Promise((r) => setTimeout(r, 3_000));
    expect(containerStatus((await node.pod('live'))!, 'c')?.restartCount).toBe(1);
    await node.remove('live.yaml');
  });

  it('flips Ready both ways with the readiness probe', async () => {
    await node.write('rd.yaml', podYaml('rd', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
    readinessProbe:
      exec:
        command: [test, -f, /tmp/ready]
      periodSeconds: 1
`));
    const p = await node.waitPod('rd', (x) => !!containerStatus(x, 'c')?.state?.running, 'running');
    expect(ready(p)).toBe(false);
    await exec(p, 'c', 'touch /tmp/ready');
    await node.waitPod('rd', ready, 'Ready', 15_000);
    await exec(p, 'c', 'rm /tmp/ready');
    const notReady = await node.waitPod('rd', (x) => !ready(x), 'not Ready again', 15_000);
    expect(notReady.status?.conditions?.find((c) => c.type === 'ContainersReady')?.status).toBe('False');
    expect(containerStatus(notReady, 'c')?.restartCount).toBe(0);
    await node.remove('rd.yaml');
  });

  it('starts a sidecar, then the init container, then the app, sharing an emptyDir', async () => {
    await node.write('order.yaml', podYaml('order', node.image, `  initContainers:
  - name: side
    image: IMAGE
    restartPolicy: Always
    command: [sh, -c, "echo side >> /shared/log; exec sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  - name: init
    image: IMAGE
    command: [sh, -c, "sleep 1; echo init >> /shared/log"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  containers:
  - name: app
    image: IMAGE
    command: [sh, -c, "echo app >> /shared/log; exec sleep 3600"]
    volumeMounts: [{name: shared, mountPath: /shared}]
  volumes:
  - name: shared
    emptyDir: {}
`));
    const p = await node.waitPod('order', ready, 'Ready');
    expect((await exec(p, 'app', 'cat /shared/log')).out).toBe('side\ninit\napp\n');
    expect(containerStatus(p, 'init')?.state?.terminated?.reason).toBe('Completed');
    expect(containerStatus(p, 'side')?.state?.running).toBeTruthy();
    expect(p.status?.conditions?.find((c) => c.type === 'Initialized')?.status).toBe('True');
    await node.remove('order.yaml');
  });

  it('runs preStop before the container is stopped when its manifest is deleted', async () => {
    await node.write('stop.yaml', podYaml('stop', node.image, `  terminationGracePeriodSeconds: 10
  containers:
  - name: c
    image: IMAGE
    command: [sh, -c, "trap 'echo term >> /out/log; exit 0' TERM; while true; do sleep 0.2; done"]
    volumeMounts: [{name: out, mountPath: /out}]
    lifecycle:
      preStop:
        exec:
          command: [sh, -c, "echo prestop >> /out/log"]
  volumes:
  - name: out
    hostPath:
      path: ${node.pods.dirs.base}/prestop
      type: DirectoryOrCreate
`));
    await node.waitPod('stop', (x) => !!containerStatus(x, 'c')?.state?.running, 'running');
    await node.remove('stop.yaml');
    await node.waitGone('stop', 30_000);
    const fs = await import('node:fs/promises');
    expect(await fs.readFile(`${node.pods.dirs.base}/prestop/log`, 'utf8')).toBe('prestop\nterm\n');
    const left = await node.pods.skiff.runtime.ListPodSandbox({ filter: { labelSelector: { 'io.kubernetes.pod.name': 'stop' } } });
    expect(left.items ?? []).toEqual([]);
  });

  it('replaces an edited pod and removes a deleted one', async () => {
    const manifest = (v: string) => podYaml('edit', node.image, `  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
    env: [{name: V, value: "${v}"}]
`);
    await node.write('edit.yaml', manifest('one'));
    const first = await node.waitPod('edit', ready, 'Ready');
    await node.write('edit.yaml', manifest('two'));
    const second = await node.waitPod('edit', (x) => x.metadata?.uid !== first.metadata?.uid && ready(x), 'replaced and Ready');
    expect((await exec(second, 'c', 'echo $V')).out).toBe('two\n');
    const old = await node.pods.skiff.runtime.ListContainers({ filter: { labelSelector: { 'io.kubernetes.pod.uid': first.metadata!.uid! } } });
    expect(old.containers ?? []).toEqual([]);
    await node.remove('edit.yaml');
    await node.waitGone('edit', 30_000);
  });

  it('adopts its pods after a kill -9, keeping restart counts and never restarting a healthy container', async () => {
    const before = await node.waitPod('web', ready, 'Ready');
    const sandboxes = (await node.pods.skiff.runtime.ListPodSandbox({})).items!.length;
    await node.restartAgent('SIGKILL');
    const after = await node.waitPod('web', ready, 'Ready again after adoption', 30_000);
    expect(idOf(after, 'main')).toBe(idOf(before, 'main'));
    expect(containerStatus(after, 'main')?.restartCount).toBe(containerStatus(before, 'main')?.restartCount);
    expect(after.metadata?.uid).toBe(before.metadata?.uid);
    expect((await node.pods.skiff.runtime.ListPodSandbox({})).items!.length).toBe(sandboxes);
  });
});
