/**
 * The controller manager over a real API store (no node) for the kinds with
 * ordinals and histories: a StatefulSet's pods and revisions in the store,
 * a DaemonSet's ControllerRevisions as kubectl reads them (and a rollback
 * by the revision's own patch), a ReplicaSet no Deployment owns and a
 * ReplicationController running their pods. `runAll` plays the kubelet,
 * `reap` the node finishing a graceful delete.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { applyPatch } from '../../src/api/patch.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject, Kind, Obj } from '../../src/api/types.js';
import { silentLogger } from '../../src/log.js';
import { ControllerManager } from '../../src/node/controller-manager.js';

let manager: ControllerManager | undefined;
afterEach(async () => {
  await manager?.stop();
  manager = undefined;
});

/**
 * The claims' shape only (the storage kinds are another part's): enough of a
 * PersistentVolumeClaim kind to see what the StatefulSet controller writes.
 */
const claimKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'PersistentVolumeClaim',
  plural: 'persistentvolumeclaims',
  singular: 'persistentvolumeclaim',
  shortNames: ['pvc'],
  namespaced: true,
  validate: () => [],
  known: { spec: 'map', status: 'map' },
  columns: [{ name: 'Name', type: 'string' }],
  row: (o) => [o.metadata.name],
};

async function setUp(opts: { claims?: boolean; creates?: string[] } = {}) {
  const clock = Date.parse('2026-12-02T10:00:30Z');
  const store = new Store({ kinds: [...nodeKinds('n1').filter((k) => k.plural !== 'persistentvolumeclaims'), ...(opts.claims ? [claimKind] : [])] });
  const client = localClient(store);
  if (opts.creates) {
    const seen = opts.creates;
    const create = client.create.bind(client);
    client.create = (resource, namespace, body) => {
      seen.push(`${resource} ${String((body.metadata as Obj | undefined)?.name)}`);
      return create(resource, namespace, body);
    };
  }
  manager = await ControllerManager.create({ client, nodeName: 'n1', log: silentLogger, now: () => clock });
  await manager.start();
  const k = (r: string) => store.kind(r)!;
  const settle = async () => {
    for (let i = 0; i < 5; i++) {
      await new Promise((r) => setTimeout(r, 30));
      await manager!.idle();
    }
  };
  const runAll = async () => {
    for (const p of store.list(k('pods')).items) {
      if (p.metadata.deletionTimestamp || (p.status as Obj | undefined)?.phase === 'Running') continue;
      const status = { phase: 'Running', conditions: [{ type: 'Ready', status: 'True', lastTransitionTime: new Date(clock - 60_000).toISOString() }] };
      store.update(k('pods'), p.metadata.namespace!, p.metadata.name!, { ...p, status }, { status: true });
    }
    await settle();
  };
  const reap = async () => {
    for (const p of store.list(k('pods')).items) if (p.metadata.deletionTimestamp) store.delete(k('pods'), p.metadata.namespace!, p.metadata.name!, { gracePeriodSeconds: 0 });
    await settle();
  };
  const list = (r: string) => store.list(k(r)).items;
  const live = () => list('pods').filter((p) => !p.metadata.deletionTimestamp).map((p) => p.metadata.name).sort();
  return { store, k, settle, runAll, reap, list, live };
}

const container = (image: string) => ({ containers: [{ name: 'c', image }] });
const sts = (spec: Obj = {}): Obj => ({
  apiVersion: 'apps/v1',
  kind: 'StatefulSet',
  metadata: { name: 'db' },
  spec: { replicas: 3, serviceName: 'db', selector: { matchLabels: { app: 'db' } }, template: { metadata: { labels: { app: 'db' } }, spec: container('busybox:1') }, ...spec },
});
const ownerOf = (o: ApiObject) => (o.metadata.ownerReferences as Obj[] | undefined)?.find((r) => r.controller === true);

describe('ControllerManager: StatefulSets', () => {
  it('makes db-0, db-1, db-2 in order, each once the one before is Ready, with a ControllerRevision and status', async () => {
    const { store, k, runAll, settle, list, live } = await setUp();
    const set = store.create(k('statefulsets.apps'), 'default', sts());
    await settle();
    expect(live()).toEqual(['db-0']);
    await settle();
    expect(live()).toEqual(['db-0']);
    await runAll();
    expect(live()).toEqual(['db-0', 'db-1']);
    await runAll();
    await runAll();
    expect(live()).toEqual(['db-0', 'db-1', 'db-2']);
    const [rev, ...more] = list('controllerrevisions.apps');
    expect(more).toEqual([]);
    expect(ownerOf(rev!)).toMatchObject({ kind: 'StatefulSet', uid: set.metadata.uid });
    expect(rev!.revision).toBe(1);
    expect(rev!.metadata.labels).toMatchObject({ app: 'db' });
    const pod = store.get(k('pods'), 'default', 'db-1');
    expect(pod.metadata.labels).toMatchObject({ 'controller-revision-hash': rev!.metadata.name, 'statefulset.kubernetes.io/pod-name': 'db-1', 'apps.kubernetes.io/pod-index': '1' });
    expect(pod.spec).toMatchObject({ hostname: 'db-1', subdomain: 'db', nodeName: 'n1' });
    expect(store.get(k('statefulsets.apps'), 'default', 'db').status).toMatchObject({ replicas: 3, readyReplicas: 3, currentReplicas: 3, updatedReplicas: 3, currentRevision: rev!.metadata.name, updateRevision: rev!.metadata.name, observedGeneration: 1 });
  });

  it('scales down from the top and rolls a template change from the highest ordinal, then rolls back by the revision\'s patch', async () => {
    const { store, k, runAll, reap, list, live } = await setUp();
    store.create(k('statefulsets.apps'), 'default', sts());
    for (let i = 0; i < 4; i++) await runAll();
    const first = list('controllerrevisions.apps')[0]!;
    store.patch(k('statefulsets.apps'), 'default', 'db', (c) => applyPatch('merge', c as Obj, { spec: { template: { spec: container('busybox:2') } } }));
    await runAll();
    // db-2 goes first; nothing else until it is back.
    expect(list('pods').filter((p) => p.metadata.deletionTimestamp).map((p) => p.metadata.name)).toEqual(['db-2']);
    const deleted: string[] = [];
    for (let i = 0; i < 8; i++) {
      deleted.push(...list('pods').filter((p) => p.metadata.deletionTimestamp).map((p) => p.metadata.name!));
      await reap();
      await runAll();
    }
    expect(deleted).toEqual(['db-2', 'db-1', 'db-0']);
    const revs = list('controllerrevisions.apps').sort((a, b) => Number(a.revision) - Number(b.revision));
    expect(revs.map((r) => r.revision)).toEqual([1, 2]);
    expect(new Set(list('pods').map((p) => p.metadata.labels!['controller-revision-hash']))).toEqual(new Set([revs[1]!.metadata.name]));

    // `kubectl rollout undo`: the old revision's data as a strategic merge patch.
    store.patch(k('statefulsets.apps'), 'default', 'db', (c) => applyPatch('strategic', c as Obj, first.data));
    for (let i = 0; i < 8; i++) {
      await reap();
      await runAll();
    }
    expect(store.get(k('controllerrevisions.apps'), 'default', first.metadata.name!).revision).toBe(3);
    expect(list('controllerrevisions.apps')).toHaveLength(2);
    expect(new Set(list('pods').map((p) => p.metadata.labels!['controller-revision-hash']))).toEqual(new Set([first.metadata.name]));

    store.patch(k('statefulsets.apps'), 'default', 'db', (c) => applyPatch('merge', c as Obj, { spec: { replicas: 1 } }));
    await runAll();
    expect(list('pods').filter((p) => p.metadata.deletionTimestamp).map((p) => p.metadata.name)).toEqual(['db-2']);
    await reap();
    expect(list('pods').filter((p) => p.metadata.deletionTimestamp).map((p) => p.metadata.name)).toEqual(['db-1']);
    await reap();
    expect(live()).toEqual(['db-0']);
  });
});

describe('ControllerManager: StatefulSet claims', () => {
  const vct = [{ metadata: { name: 'data' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } }];

  it('makes a claim per ordinal before its pod, keeps it through a pod delete, hands it to its pod on scale-down (whenScaled: Delete)', async () => {
    const { store, k, runAll, reap, list, live } = await setUp({ claims: true });
    const set = store.create(k('statefulsets.apps'), 'default', sts({ replicas: 2, podManagementPolicy: 'Parallel', volumeClaimTemplates: vct, persistentVolumeClaimRetentionPolicy: { whenDeleted: 'Delete', whenScaled: 'Delete' } }));
    await runAll();
    expect(live()).toEqual(['db-0', 'db-1']);
    const claims = list('persistentvolumeclaims');
    expect(claims.map((c) => c.metadata.name).sort()).toEqual(['data-db-0', 'data-db-1']);
    for (const c of claims) {
      expect(c.metadata.ownerReferences).toEqual([expect.objectContaining({ kind: 'StatefulSet', uid: set.metadata.uid })]);
      expect(c.spec).toMatchObject({ accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } });
      expect(c.metadata.labels).toMatchObject({ app: 'db' });
    }
    expect((store.get(k('pods'), 'default', 'db-0').spec as Obj).volumes).toEqual([{ name: 'data', persistentVolumeClaim: { claimName: 'data-db-0' } }]);
    const uid0 = store.get(k('persistentvolumeclaims'), 'default', 'data-db-0').metadata.uid;
    store.delete(k('pods'), 'default', 'db-0', { gracePeriodSeconds: 0 });
    await runAll();
    expect(live()).toEqual(['db-0', 'db-1']);
    expect(store.get(k('persistentvolumeclaims'), 'default', 'data-db-0').metadata.uid).toBe(uid0);

    const pod1 = store.get(k('pods'), 'default', 'db-1');
    store.patch(k('statefulsets.apps'), 'default', 'db', (c) => applyPatch('merge', c as Obj, { spec: { replicas: 1 } }));
    await runAll();
    await reap();
    expect(live()).toEqual(['db-0']);
    expect(store.get(k('persistentvolumeclaims'), 'default', 'data-db-1').metadata.ownerReferences).toEqual([
      expect.objectContaining({ kind: 'StatefulSet', uid: set.metadata.uid }),
      expect.objectContaining({ kind: 'Pod', name: 'db-1', uid: pod1.metadata.uid }),
    ]);
  });

  it('keeps claims ownerless under Retain, and lets pods of claims wait (saying so) where claims are not served', async () => {
    const withClaims = await setUp({ claims: true });
    withClaims.store.create(withClaims.k('statefulsets.apps'), 'default', sts({ replicas: 1, volumeClaimTemplates: vct }));
    await withClaims.runAll();
    expect(withClaims.list('persistentvolumeclaims').map((c) => c.metadata.ownerReferences)).toEqual([undefined]);
    await manager!.stop();

    const without = await setUp();
    without.store.create(without.k('statefulsets.apps'), 'default', sts({ replicas: 1, volumeClaimTemplates: vct }));
    await without.runAll();
    expect(without.live()).toEqual([]);
    expect((without.store.get(without.k('statefulsets.apps'), 'default', 'db').status as Obj).conditions).toEqual([expect.objectContaining({ type: 'PodsWaiting', reason: 'ClaimsNotServed' })]);
  });
});

describe('ControllerManager: DaemonSet history, bare ReplicaSets, ReplicationControllers', () => {
  it('keeps a DaemonSet\'s templates as ControllerRevisions `<ds>-<hash>` and renumbers on rollback', async () => {
    const { store, k, runAll, reap, list } = await setUp();
    const ds = store.create(k('daemonsets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'agent' }, spec: { selector: { matchLabels: { app: 'agent' } }, template: { metadata: { labels: { app: 'agent' } }, spec: container('busybox:1') } } });
    await runAll();
    const [r1] = list('controllerrevisions.apps');
    const hash = list('pods')[0]!.metadata.labels!['controller-revision-hash'];
    expect(r1!.metadata.name).toBe(`agent-${hash}`);
    expect(r1).toMatchObject({ revision: 1, metadata: { labels: { app: 'agent', 'controller-revision-hash': hash } } });
    expect(ownerOf(r1!)).toMatchObject({ kind: 'DaemonSet', uid: ds.metadata.uid });
    store.patch(k('daemonsets.apps'), 'default', 'agent', (c) => applyPatch('merge', c as Obj, { spec: { template: { spec: container('busybox:2') } } }));
    for (let i = 0; i < 3; i++) {
      await reap();
      await runAll();
    }
    expect(list('controllerrevisions.apps').map((r) => r.revision).sort()).toEqual([1, 2]);
    store.patch(k('daemonsets.apps'), 'default', 'agent', (c) => applyPatch('strategic', c as Obj, r1!.data));
    for (let i = 0; i < 3; i++) {
      await reap();
      await runAll();
    }
    expect(store.get(k('controllerrevisions.apps'), 'default', r1!.metadata.name!).revision).toBe(3);
    expect(list('pods').filter((p) => !p.metadata.deletionTimestamp).map((p) => p.metadata.labels!['controller-revision-hash'])).toEqual([hash]);
  });

  it('runs a ReplicaSet no Deployment owns and a ReplicationController, scaling both', async () => {
    const { store, k, runAll, settle, list } = await setUp();
    const rs = store.create(k('replicasets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'ReplicaSet', metadata: { name: 'bare' }, spec: { replicas: 2, selector: { matchLabels: { app: 'bare' } }, template: { metadata: { labels: { app: 'bare' } }, spec: container('busybox:1') } } });
    const rc = store.create(k('replicationcontrollers'), 'default', { apiVersion: 'v1', kind: 'ReplicationController', metadata: { name: 'old' }, spec: { replicas: 3, template: { metadata: { labels: { app: 'old' } }, spec: container('busybox:1') } } });
    await settle();
    await runAll();
    const owned = (uid: string | undefined) => list('pods').filter((p) => !p.metadata.deletionTimestamp && ownerOf(p)?.uid === uid);
    expect(owned(rs.metadata.uid)).toHaveLength(2);
    expect(owned(rc.metadata.uid)).toHaveLength(3);
    for (const p of owned(rc.metadata.uid)) expect(p.metadata.name).toMatch(/^old-[a-z0-9]{5}$/);
    expect(owned(rc.metadata.uid)[0]!.metadata.labels).toMatchObject({ app: 'old' });
    expect(store.get(k('replicasets.apps'), 'default', 'bare').status).toMatchObject({ replicas: 2, readyReplicas: 2, observedGeneration: 1 });
    expect(store.get(k('replicationcontrollers'), 'default', 'old').status).toMatchObject({ replicas: 3, readyReplicas: 3, availableReplicas: 3 });
    store.patch(k('replicationcontrollers'), 'default', 'old', (c) => applyPatch('merge', c as Obj, { spec: { replicas: 1 } }));
    await runAll();
    expect(owned(rc.metadata.uid)).toHaveLength(1);
    // The bare ReplicaSet's pods are not the Deployment controller's: still there.
    expect(owned(rs.metadata.uid)).toHaveLength(2);
  });

  it('backs off while a member\'s name is held by a pod it does not own (AlreadyExists each pass), and makes it at once when that pod goes', async () => {
    const creates: string[] = [];
    const { store, k, settle, live } = await setUp({ creates });
    store.create(k('pods'), 'default', { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'db-0', labels: { app: 'other' } }, spec: { nodeName: 'n1', ...container('busybox:1') } });
    store.create(k('statefulsets.apps'), 'default', sts({ replicas: 1 }));
    await new Promise((r) => setTimeout(r, 3000));
    // 200 ms, then twice as late each time: a handful in 3 s (a retry each pass ran it over a hundred times).
    const tries = creates.filter((c) => c === 'pods db-0').length;
    expect(tries).toBeGreaterThanOrEqual(2);
    expect(tries).toBeLessThanOrEqual(8);
    store.delete(k('pods'), 'default', 'db-0', { gracePeriodSeconds: 0 });
    await settle();
    expect(live()).toEqual(['db-0']);
    expect(store.get(k('pods'), 'default', 'db-0').metadata.labels).toMatchObject({ app: 'db' });
  }, 10_000);
});
