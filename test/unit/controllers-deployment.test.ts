import type { Deployment } from 'kubernetes-types/apps/v1.js';
import { describe, expect, it } from 'vitest';
import { templateHash } from '../../src/controllers/common.js';
import { rollingFenceposts } from '../../src/controllers/deployment.js';
import { rolloutStatus } from '../../src/cli/workload-format.js';
import { deployment, podTemplate, Sim } from '../helpers/controllers-sim.js';

function readyAll(sim: Sim, prefix: string): void {
  for (const p of sim.podsOf(prefix)) if (p.status?.phase === 'Pending') sim.setReady(p.metadata!.name!);
}

function hashOf(sim: Sim, name: string): string {
  return templateHash((sim.workloads.find((w) => w.name === name)!.object.spec as Record<string, unknown>).template);
}

describe('Deployment: scale', () => {
  it('creates replicas pods named <name>-<hash>-<suffix>, default 1, and keeps their names', () => {
    const sim = new Sim();
    sim.workloads = [deployment('web', {})];
    sim.step();
    expect(sim.names('web')).toHaveLength(1);
    sim.workloads = [deployment('web', { replicas: 3 })];
    sim.step();
    const names = sim.names('web');
    expect(names).toHaveLength(3);
    const hash = hashOf(sim, 'web');
    for (const n of names) expect(n).toMatch(new RegExp(`^web-${hash}-[bcdfghjklmnpqrstvwxz2456789]{5}$`));
    for (const p of sim.podsOf('web')) {
      expect(p.metadata!.labels).toMatchObject({ app: 'web', 'pod-template-hash': hash });
      expect(p.metadata!.ownerReferences![0]).toMatchObject({ kind: 'ReplicaSet', name: `web-${hash}`, controller: true });
    }
    sim.step();
    sim.step();
    expect(sim.names('web').sort()).toEqual([...names].sort());
  });

  it('the template hash is stable and changes with the template', () => {
    const a = templateHash(podTemplate({ app: 'x' }));
    expect(templateHash(podTemplate({ app: 'x' }))).toBe(a);
    expect(templateHash(JSON.parse(JSON.stringify({ spec: podTemplate({ app: 'x' }).spec, metadata: { labels: { app: 'x' } } })))).toBe(a);
    expect(templateHash(podTemplate({ app: 'x' }, 'web:2'))).not.toBe(a);
    expect(a).toMatch(/^[bcdfghjklmnpqrstvwxz2456789]{1,7}$/);
  });

  it('scales down not-ready pods first, then the newest', () => {
    const sim = new Sim();
    sim.workloads = [deployment('web', { replicas: 3 })];
    sim.step();
    const first = sim.names('web');
    for (const n of first) sim.setReady(n);
    sim.advance(10_000);
    sim.workloads = [deployment('web', { replicas: 5 })];
    sim.step();
    const added = sim.names('web').filter((n) => !first.includes(n));
    expect(added).toHaveLength(2);
    sim.setReady(added[0]!); // ready, but newer than the first three
    // added[1] stays Pending (not ready)
    sim.advance(1000);
    sim.workloads = [deployment('web', { replicas: 3 })];
    sim.step();
    expect(sim.names('web').sort()).toEqual([...first].sort());
    sim.workloads = [deployment('web', { replicas: 0 })];
    sim.step();
    expect(sim.names('web')).toEqual([]);
    expect(sim.status('Deployment', 'web').status).toMatchObject({ replicas: 0, readyReplicas: 0 });
  });

  it('replaces a failed pod', () => {
    const sim = new Sim();
    sim.workloads = [deployment('web', { replicas: 2 })];
    sim.step();
    const [a, b] = sim.names('web');
    sim.setReady(a!).finish(b!, 'Failed');
    sim.step();
    const now = sim.names('web');
    expect(now).toHaveLength(2);
    expect(now).toContain(a);
    expect(now).not.toContain(b);
  });

  it('refuses a selector that does not match the template and makes no pods', () => {
    const sim = new Sim();
    sim.workloads = [deployment('web', { selector: { matchLabels: { app: 'other' } } })];
    sim.step();
    expect(sim.names('web')).toEqual([]);
    const s = sim.status('Deployment', 'web');
    expect(s.problems.join()).toMatch(/spec.selector: does not match the template's labels/);
    expect(s.status.conditions).toEqual([expect.objectContaining({ type: 'ReplicaFailure', status: 'True', reason: 'InvalidSpec' })]);
  });

  it('refuses replicas the node could never run, rather than building that many pods', () => {
    const sim = new Sim();
    sim.workloads = [deployment('typo', { replicas: 100_001 })];
    sim.step();
    expect(sim.names('typo')).toEqual([]);
    const s = sim.status('Deployment', 'typo');
    expect(s.problems).toEqual(['spec.replicas: must be at most 100000 (no node runs more pods at once), got 100001']);
    expect(s.status.conditions).toEqual([expect.objectContaining({ type: 'ReplicaFailure', status: 'True', reason: 'InvalidSpec' })]);
  });
});

describe('Deployment: fenceposts', () => {
  const cases: Array<[string, unknown, unknown, number, number, number]> = [
    ['defaults on 4', undefined, undefined, 4, 1, 1],
    ['defaults on 10: surge rounds up, unavailable down', undefined, undefined, 10, 3, 2],
    ['defaults on 1', undefined, undefined, 1, 1, 0],
    ['ints', 2, 0, 5, 2, 0],
    ['both zero: unavailable becomes 1', 0, 0, 3, 0, 1],
    ['percent', '50%', '50%', 3, 2, 1],
  ];
  it.each(cases)('%s', (_n, maxSurge, maxUnavailable, replicas, surge, unavailable) => {
    const d = { spec: { strategy: { rollingUpdate: { maxSurge, maxUnavailable } } } } as Deployment;
    expect(rollingFenceposts(d, replicas)).toEqual({ maxSurge: surge, maxUnavailable: unavailable });
  });
});

/** Rolls out a new image, marking pods Ready as they appear, and checks invariants after each step. */
function rollOut(opts: { replicas: number; strategy: Record<string, unknown>; minReadySeconds?: number }) {
  const sim = new Sim(7);
  const spec = { replicas: opts.replicas, strategy: opts.strategy, ...(opts.minReadySeconds ? { minReadySeconds: opts.minReadySeconds } : {}) };
  sim.workloads = [deployment('web', spec)];
  sim.step();
  readyAll(sim, 'web');
  sim.advance(60_000);
  sim.step();
  expect(sim.readyCount('web')).toBe(opts.replicas);
  sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
  const newHash = hashOf(sim, 'web');
  const trace: Array<{ total: number; ready: number; updated: number }> = [];
  for (let i = 0; i < 50; i++) {
    sim.advance(1000);
    sim.step();
    const pods = sim.podsOf('web');
    trace.push({ total: pods.length, ready: sim.readyCount('web'), updated: pods.filter((p) => p.metadata!.labels!['pod-template-hash'] === newHash).length });
    if (pods.length === opts.replicas && pods.every((p) => p.metadata!.labels!['pod-template-hash'] === newHash) && sim.readyCount('web') === opts.replicas) break;
    readyAll(sim, 'web');
  }
  return { sim, trace, newHash };
}

describe('Deployment: rolling update', () => {
  it('maxSurge 1 / maxUnavailable 0 never has fewer than replicas ready nor more than replicas+1 pods', () => {
    const { sim, trace, newHash } = rollOut({ replicas: 3, strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } });
    for (const t of trace) {
      expect(t.ready).toBeGreaterThanOrEqual(3);
      expect(t.total).toBeLessThanOrEqual(4);
    }
    expect(sim.podsOf('web').every((p) => p.metadata!.labels!['pod-template-hash'] === newHash)).toBe(true);
    expect(trace.length).toBeGreaterThan(3); // it went one pod at a time
    sim.step();
    expect(sim.status('Deployment', 'web').status).toMatchObject({ replicas: 3, updatedReplicas: 3, readyReplicas: 3, availableReplicas: 3, unavailableReplicas: 0 });
    const conds = sim.status('Deployment', 'web').status.conditions as Array<Record<string, string>>;
    expect(conds.find((c) => c.type === 'Progressing')).toMatchObject({ status: 'True', reason: 'NewReplicaSetAvailable' });
    expect(conds.find((c) => c.type === 'Available')).toMatchObject({ status: 'True', reason: 'MinimumReplicasAvailable' });
    expect(rolloutStatus(sim.status('Deployment', 'web'))).toEqual({ done: true, message: 'deployment "web" successfully rolled out' });
  });

  it('maxSurge 0 / maxUnavailable 1 never exceeds replicas and keeps replicas-1 ready', () => {
    const { sim, trace, newHash } = rollOut({ replicas: 4, strategy: { rollingUpdate: { maxSurge: 0, maxUnavailable: 1 } } });
    for (const t of trace) {
      expect(t.total).toBeLessThanOrEqual(4);
      expect(t.ready).toBeGreaterThanOrEqual(3);
    }
    expect(sim.podsOf('web').every((p) => p.metadata!.labels!['pod-template-hash'] === newHash)).toBe(true);
  });

  it('does not move while new pods are not Ready, and reports it', () => {
    const sim = new Sim(3);
    const spec = { replicas: 3, strategy: { rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    readyAll(sim, 'web');
    sim.step();
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
    for (let i = 0; i < 5; i++) sim.advance(1000).step();
    expect(sim.podsOf('web')).toHaveLength(4);
    expect(sim.readyCount('web')).toBe(3);
    const s = sim.status('Deployment', 'web');
    expect(s.status).toMatchObject({ replicas: 4, updatedReplicas: 1, readyReplicas: 3 });
    expect(rolloutStatus(s)).toEqual({ done: false, message: 'Waiting for deployment "web" rollout to finish: 1 out of 3 new replicas have been updated...' });
    expect((s.status.conditions as Array<Record<string, string>>).find((c) => c.type === 'Progressing')).toMatchObject({ reason: 'ReplicaSetUpdated' });
  });

  it('minReadySeconds: a Ready pod counts as available only after it, and the controller asks to be called then', () => {
    const sim = new Sim(5);
    const spec = { replicas: 2, minReadySeconds: 30, strategy: { rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    readyAll(sim, 'web');
    sim.advance(10_000).step();
    expect(sim.status('Deployment', 'web').status).toMatchObject({ readyReplicas: 2, availableReplicas: 0 });
    expect(sim.last.requeueAfterMs).toBe(20_000);
    sim.advance(20_000).step();
    expect(sim.status('Deployment', 'web').status).toMatchObject({ availableReplicas: 2 });
    // A rollout waits for the new pod's minReadySeconds before removing an old one.
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.podsOf('web')).toHaveLength(3);
    readyAll(sim, 'web');
    sim.advance(29_000).step();
    expect(sim.podsOf('web')).toHaveLength(3);
    expect(sim.last.requeueAfterMs).toBe(1000);
    sim.advance(1000).step();
    // One old pod goes (the new one is available now); the next new pod comes on the following pass, as in Kubernetes.
    expect(sim.podsOf('web')).toHaveLength(2);
    sim.step();
    expect(sim.podsOf('web')).toHaveLength(3);
    expect(rolloutStatus(sim.status('Deployment', 'web'))).toMatchObject({ done: false });
  });

  it('rollout status while old replicas are pending termination and while updated ones are not available', () => {
    const base = { kind: 'Deployment' as const, namespace: 'default', name: 'x', problems: [], createdAt: 0, spec: { replicas: 3 } };
    expect(rolloutStatus({ ...base, status: { replicas: 4, updatedReplicas: 3, availableReplicas: 3 } })).toEqual({
      done: false,
      message: 'Waiting for deployment "x" rollout to finish: 1 old replicas are pending termination...',
    });
    expect(rolloutStatus({ ...base, status: { replicas: 3, updatedReplicas: 3, availableReplicas: 1 } })).toEqual({
      done: false,
      message: 'Waiting for deployment "x" rollout to finish: 1 of 3 updated replicas are available...',
    });
    expect(
      rolloutStatus({ ...base, status: { conditions: [{ type: 'Progressing', status: 'False', reason: 'ProgressDeadlineExceeded' }] } }),
    ).toEqual({ error: 'deployment "x" exceeded its progress deadline' });
  });

  it('a scale-down in the middle of a rollout sheds old pods first', () => {
    const sim = new Sim(9);
    const spec = { replicas: 4, strategy: { rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    readyAll(sim, 'web');
    sim.step();
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.podsOf('web')).toHaveLength(5);
    sim.workloads = [deployment('web', { ...spec, replicas: 2, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    const newHash = hashOf(sim, 'web');
    expect(sim.podsOf('web').length).toBeLessThanOrEqual(3);
    expect(sim.podsOf('web').filter((p) => p.metadata!.labels!['pod-template-hash'] === newHash).length).toBeGreaterThanOrEqual(1);
  });
});

describe('Deployment: progress and pause', () => {
  it('a rollout that makes no progress for progressDeadlineSeconds is reported as ProgressDeadlineExceeded', () => {
    const sim = new Sim(21);
    const spec = { replicas: 2, progressDeadlineSeconds: 60, strategy: { rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    readyAll(sim, 'web');
    sim.step();
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:broken') })];
    sim.step();
    expect(sim.last.requeueAfterMs).toBe(60_000);
    sim.advance(59_000).step();
    const progressing = () => (sim.status('Deployment', 'web').status.conditions as Array<Record<string, string>>).find((c) => c.type === 'Progressing');
    expect(progressing()).toMatchObject({ status: 'True', reason: 'ReplicaSetUpdated' });
    sim.advance(1000).step();
    expect(progressing()).toMatchObject({ status: 'False', reason: 'ProgressDeadlineExceeded' });
    expect(rolloutStatus(sim.status('Deployment', 'web'))).toEqual({ error: 'deployment "web" exceeded its progress deadline' });
    // The old pods still serve.
    expect(sim.readyCount('web')).toBe(2);
  });

  it('paused: a template change waits until resumed, but scaling still happens with the running template', () => {
    const sim = new Sim(22);
    sim.workloads = [deployment('web', { replicas: 2 })];
    sim.step();
    const names = sim.names('web');
    const oldHash = sim.pod(names[0]!).metadata!.labels!['pod-template-hash'];
    sim.workloads = [deployment('web', { replicas: 2, paused: true, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.names('web').sort()).toEqual([...names].sort());
    expect((sim.status('Deployment', 'web').status.conditions as Array<Record<string, string>>)[1]).toMatchObject({ reason: 'DeploymentPaused' });
    sim.workloads = [deployment('web', { replicas: 4, paused: true, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.podsOf('web')).toHaveLength(4);
    for (const p of sim.podsOf('web')) {
      expect(p.spec!.containers[0]!.image).toBe('web:1');
      expect(p.metadata!.labels!['pod-template-hash']).toBe(oldHash);
    }
    expect(sim.status('Deployment', 'web').status).toMatchObject({ replicas: 4, updatedReplicas: 0 });
    sim.workloads = [deployment('web', { replicas: 4, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.podsOf('web').some((p) => p.spec!.containers[0]!.image === 'web:2')).toBe(true);
  });
});

describe('Deployment: Recreate', () => {
  it('removes every old pod before creating any new one', () => {
    const sim = new Sim(11);
    const spec = { replicas: 3, strategy: { type: 'Recreate' } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    readyAll(sim, 'web');
    sim.step();
    const old = sim.names('web');
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    expect(sim.names('web')).toEqual([]);
    expect(sim.last.requeueAfterMs).toBeGreaterThan(0);
    sim.step();
    const now = sim.names('web');
    expect(now).toHaveLength(3);
    expect(now.some((n) => old.includes(n))).toBe(false);
    expect(sim.status('Deployment', 'web').status).toMatchObject({ updatedReplicas: 3, availableReplicas: 0 });
    expect((sim.status('Deployment', 'web').status.conditions as Array<Record<string, string>>)[0]).toMatchObject({ type: 'Available', status: 'False' });
  });

  it('waits while an old pod is still terminating', () => {
    const sim = new Sim(12);
    const spec = { replicas: 1, strategy: { type: 'Recreate' } };
    sim.workloads = [deployment('web', spec)];
    sim.step();
    const [old] = sim.names('web');
    sim.workloads = [deployment('web', { ...spec, template: podTemplate({ app: 'web' }, 'web:2') })];
    sim.step();
    // The agent still reports the old pod, being killed.
    sim.pods.set(old!, { metadata: { name: old, namespace: 'default', deletionTimestamp: new Date(sim.now).toISOString(), labels: { 'pod-template-hash': 'zzz' }, ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'web-zzz', uid: 'u', controller: true }] }, status: { phase: 'Running' } });
    sim.step();
    expect(sim.last.pods).toHaveLength(0);
    sim.pods.delete(old!);
    sim.step();
    expect(sim.last.pods).toHaveLength(1);
  });
});
