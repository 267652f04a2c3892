/**
 * The controller manager over a real API store (no node): Deployments own
 * ReplicaSets that own Pods, rollouts keep revisions that a rollback reuses,
 * CronJobs own real Jobs whose selectors find their pods, and what nothing
 * wants goes. The kubelet's part (pod status) is played by `runAll`.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { applyPatch } from '../../src/api/patch.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject, Obj } from '../../src/api/types.js';
import type { ApiClient } from '../../src/api/client.js';
import { silentLogger, type Logger } from '../../src/log.js';
import { ControllerManager, POD_BURST, REVISION_ANNOTATION } from '../../src/node/controller-manager.js';

let manager: ControllerManager | undefined;
afterEach(async () => {
  await manager?.stop();
  manager = undefined;
});

let clock = Date.parse('2026-12-02T10:00:30Z');

async function setUp(opts: { maxObjects?: number; log?: Logger; client?: (c: ApiClient) => ApiClient } = {}) {
  clock = Date.parse('2026-12-02T10:00:30Z');
  const store = new Store({ kinds: nodeKinds('n1'), ...(opts.maxObjects ? { maxObjects: opts.maxObjects } : {}) });
  const client = localClient(store);
  manager = await ControllerManager.create({ client: opts.client ? opts.client(client) : client, nodeName: 'n1', log: opts.log ?? silentLogger, now: () => clock });
  await manager.start();
  const k = (r: string) => store.kind(r)!;
  /** Waits until the manager has nothing left to do. */
  const settle = async () => {
    for (let i = 0; i < 5; i++) {
      await new Promise((r) => setTimeout(r, 30));
      await manager!.idle();
    }
  };
  /** The kubelet's part: every pod not yet Running becomes Running and Ready (or Succeeded, for Job pods). */
  const runAll = async () => {
    for (const p of store.list(k('pods')).items) {
      if (p.metadata.deletionTimestamp || ['Running', 'Succeeded'].includes(String((p.status as Obj | undefined)?.phase))) continue;
      const job = (p.metadata.ownerReferences ?? []).some((r) => (r as Obj).kind === 'Job');
      const at = new Date(clock).toISOString();
      const status = job ? { phase: 'Succeeded' } : { phase: 'Running', conditions: [{ type: 'Ready', status: 'True', lastTransitionTime: at }] };
      store.update(k('pods'), p.metadata.namespace!, p.metadata.name!, { ...p, status }, { status: true });
    }
    await settle();
  };
  const list = (r: string) => store.list(k(r)).items;
  return { store, k, settle, runAll, list };
}

const deployment = (image: string): Obj => ({
  apiVersion: 'apps/v1',
  kind: 'Deployment',
  metadata: { name: 'web' },
  spec: { replicas: 2, selector: { matchLabels: { app: 'web' } }, template: { metadata: { labels: { app: 'web' } }, spec: { containers: [{ name: 'c', image }] } } },
});

const ownerOf = (o: ApiObject) => (o.metadata.ownerReferences as Obj[] | undefined)?.find((r) => r.controller === true);

describe('ControllerManager', () => {
  it('makes a Deployment\'s ReplicaSet and the ReplicaSet\'s pods, bound to the node and owned by uid', async () => {
    const { store, k, settle, runAll, list } = await setUp();
    const d = store.create(k('deployments.apps'), 'default', deployment('busybox:1'));
    await settle();
    const [rs, ...more] = list('replicasets.apps');
    expect(more).toEqual([]);
    expect(ownerOf(rs!)).toMatchObject({ kind: 'Deployment', name: 'web', uid: d.metadata.uid, blockOwnerDeletion: true });
    expect(rs!.metadata.annotations).toMatchObject({ [REVISION_ANNOTATION]: '1', 'deployment.kubernetes.io/desired-replicas': '2' });
    expect((rs!.spec as Obj).replicas).toBe(2);
    const hash = (rs!.metadata.labels as Record<string, string>)['pod-template-hash'];
    expect(rs!.metadata.name).toBe(`web-${hash}`);
    const pods = list('pods');
    expect(pods).toHaveLength(2);
    for (const p of pods) {
      expect(ownerOf(p)).toMatchObject({ kind: 'ReplicaSet', name: rs!.metadata.name, uid: rs!.metadata.uid });
      expect((p.spec as Obj).nodeName).toBe('n1');
      expect(p.metadata.labels).toMatchObject({ app: 'web', 'pod-template-hash': hash });
    }
    await runAll();
    expect(store.get(k('replicasets.apps'), 'default', rs!.metadata.name!).status).toMatchObject({ replicas: 2, readyReplicas: 2, availableReplicas: 2 });
    const got = store.get(k('deployments.apps'), 'default', 'web');
    expect(got.status).toMatchObject({ replicas: 2, readyReplicas: 2, updatedReplicas: 2, observedGeneration: got.metadata.generation });
    expect(got.metadata.annotations).toMatchObject({ [REVISION_ANNOTATION]: '1' });
  });

  it('rolls out a new template into a new ReplicaSet, and a rollback (kubectl\'s JSON patch) reuses the old one as the newest revision', async () => {
    const { store, k, runAll, list } = await setUp();
    store.create(k('deployments.apps'), 'default', deployment('busybox:1'));
    await runAll();
    const first = list('replicasets.apps')[0]!;
    store.patch(k('deployments.apps'), 'default', 'web', (cur) => applyPatch('strategic', cur as Obj, { spec: { template: { spec: { containers: [{ name: 'c', image: 'busybox:2' }] } } } }));
    for (let i = 0; i < 6; i++) await runAll();
    const sets = list('replicasets.apps').sort((a, b) => Number(a.metadata.annotations![REVISION_ANNOTATION]) - Number(b.metadata.annotations![REVISION_ANNOTATION]));
    expect(sets.map((s) => [s.metadata.annotations![REVISION_ANNOTATION], (s.spec as Obj).replicas])).toEqual([['1', 0], ['2', 2]]);
    expect(list('pods').filter((p) => !p.metadata.deletionTimestamp).map((p) => ownerOf(p)!.name)).toEqual([sets[1]!.metadata.name, sets[1]!.metadata.name]);

    // What `kubectl rollout undo` sends: the old ReplicaSet's template (without its hash label), round-tripped as a client would.
    const old = structuredClone((first.spec as Obj).template) as Obj;
    delete ((old.metadata as Obj).labels as Obj)['pod-template-hash'];
    (old.metadata as Obj).creationTimestamp = null;
    ((old.spec as Obj).containers as Obj[])[0]!.resources = {};
    const annotations = store.get(k('deployments.apps'), 'default', 'web').metadata.annotations;
    store.patch(k('deployments.apps'), 'default', 'web', (cur) =>
      applyPatch('json', cur as Obj, [
        { op: 'replace', path: '/spec/template', value: old },
        { op: 'replace', path: '/metadata/annotations', value: annotations },
      ]),
    );
    for (let i = 0; i < 6; i++) await runAll();
    const after = list('replicasets.apps');
    expect(after.map((s) => s.metadata.name).sort()).toEqual(sets.map((s) => s.metadata.name).sort());
    expect(store.get(k('replicasets.apps'), 'default', first.metadata.name!).metadata.annotations![REVISION_ANNOTATION]).toBe('3');
    expect(store.get(k('replicasets.apps'), 'default', first.metadata.name!).spec).toMatchObject({ replicas: 2 });
    expect(store.get(k('deployments.apps'), 'default', 'web').metadata.annotations![REVISION_ANNOTATION]).toBe('3');
  });

  it('takes a deleted Deployment\'s ReplicaSets and pods with it, and replaces a deleted pod', async () => {
    const { store, k, runAll, list } = await setUp();
    store.create(k('deployments.apps'), 'default', deployment('busybox:1'));
    await runAll();
    const victim = list('pods')[0]!;
    store.delete(k('pods'), 'default', victim.metadata.name!, { gracePeriodSeconds: 0 });
    await runAll();
    const names = list('pods').map((p) => p.metadata.name);
    expect(names).toHaveLength(2);
    expect(names).not.toContain(victim.metadata.name);
    store.delete(k('deployments.apps'), 'default', 'web');
    await runAll();
    expect(list('replicasets.apps')).toEqual([]);
    // Pods are deleted gracefully: marked, for the node to stop.
    expect(list('pods').every((p) => p.metadata.deletionTimestamp)).toBe(true);
  });

  it('makes a CronJob\'s Jobs as objects it owns, whose selector finds their pods, and forgets one deleted by hand', async () => {
    const { store, k, settle, runAll, list } = await setUp();
    const cj = store.create(k('cronjobs.batch'), 'default', {
      apiVersion: 'batch/v1',
      kind: 'CronJob',
      metadata: { name: 'tick' },
      spec: { schedule: '* * * * *', jobTemplate: { spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'c', image: 'busybox:1' }] } } } } },
    });
    await settle();
    expect(list('jobs.batch')).toEqual([]);
    clock = Date.parse('2026-12-02T10:01:05Z');
    store.patch(k('cronjobs.batch'), 'default', 'tick', (c) => ({ ...c, metadata: { ...c.metadata, labels: { poke: '1' } } }));
    await settle();
    const [job] = list('jobs.batch');
    expect(job?.metadata.name).toBe(`tick-${Math.floor(Date.parse('2026-12-02T10:01:00Z') / 60_000)}`);
    expect(ownerOf(job!)).toMatchObject({ kind: 'CronJob', uid: cj.metadata.uid });
    const selector = ((job!.spec as Obj).selector as Obj).matchLabels as Record<string, string>;
    const pods = list('pods');
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata.labels).toMatchObject(selector);
    expect(ownerOf(pods[0]!)).toMatchObject({ kind: 'Job', uid: job!.metadata.uid });
    await runAll();
    expect(store.get(k('jobs.batch'), 'default', job!.metadata.name!).status).toMatchObject({ succeeded: 1 });
    expect(store.get(k('cronjobs.batch'), 'default', 'tick').status).toMatchObject({ lastScheduleTime: '2026-12-02T10:01:00Z' });
    store.delete(k('jobs.batch'), 'default', job!.metadata.name!);
    await runAll();
    expect(list('jobs.batch')).toEqual([]);
  });

  it('fills a store that cannot hold every replica a step at a time, says so once, and does not spin', async () => {
    const warnings: string[] = [];
    const log: Logger = { ...silentLogger, warn: (msg) => void warnings.push(msg) };
    let creates = 0;
    const counting = (c: ApiClient): ApiClient => ({
      ...c,
      create: (...args) => {
        if (args[0] === 'pods') creates++;
        return c.create(...args);
      },
    });
    const { store, k, settle, list } = await setUp({ maxObjects: 700, log, client: counting });
    store.create(k('deployments.apps'), 'default', { ...deployment('busybox:1'), spec: { ...(deployment('busybox:1').spec as Obj), replicas: 100_000 } });
    await settle();
    await settle();
    const pods = list('pods').length;
    expect(pods).toBeGreaterThan(POD_BURST);
    expect(pods).toBeLessThan(700);
    const tried = creates;
    // Refused, not a race: tried again only as the controllers' next step comes (every 100 ms), one pod a time.
    await new Promise((r) => setTimeout(r, 500));
    expect(creates - tried).toBeLessThanOrEqual(8);
    expect(warnings.filter((w) => w.includes('could not write'))).toHaveLength(1);
  });
});
