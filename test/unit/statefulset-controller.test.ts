/**
 * The StatefulSet controller as a pure function: ordinals made in order and
 * removed from the top, rolling updates from the highest ordinal down to the
 * partition, OnDelete, claims per ordinal with the retention policy's
 * owners, and a huge set never built in one call.
 */
import { describe, expect, it } from 'vitest';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { planRevisions, revisionData } from '../../src/controllers/history.js';
import { reconcileStatefulSet, type StatefulSetInput, type StatefulSetOutput } from '../../src/controllers/statefulset.js';

const NOW = Date.parse('2026-12-02T10:00:00Z');
type Obj = Record<string, unknown>;

const template = (image: string): Obj => ({ metadata: { labels: { app: 'db' } }, spec: { containers: [{ name: 'c', image }] } });

function setOf(spec: Obj = {}, status: Obj = {}): StatefulSetInput['set'] {
  return {
    metadata: { name: 'db', namespace: 'default', uid: 'uid-db', generation: 1 },
    spec: { replicas: 3, serviceName: 'db-svc', selector: { matchLabels: { app: 'db' } }, template: template('busybox:1'), podManagementPolicy: 'OrderedReady', updateStrategy: { type: 'RollingUpdate', rollingUpdate: { partition: 0 } }, ...spec },
    status,
  };
}

/** A world the tests step: the revisions and claims the controller asked for exist, and pods it made run. */
class World {
  pods = new Map<string, Pod>();
  revisions: StatefulSetInput['revisions'] = [];
  claims = new Map<string, Array<{ apiVersion: string; kind: string; name: string; uid: string }>>();
  status: Obj = {};
  uid = 0;
  constructor(public set: StatefulSetInput['set'], public burst = 500) {}
  step(): StatefulSetOutput {
    const out = reconcileStatefulSet({ set: { ...this.set, status: this.status }, pods: [...this.pods.values()], revisions: this.revisions, claims: this.claims, nodeName: 'n1', now: NOW, burst: this.burst });
    if (out.revisions.create) this.revisions.push({ name: out.revisions.create.name, revision: out.revisions.create.revision, data: out.revisions.create.data });
    for (const r of out.revisions.renumber) this.revisions.find((x) => x.name === r.name)!.revision = r.revision;
    this.revisions = this.revisions.filter((r) => !out.revisions.prune.includes(r.name));
    for (const c of out.createClaims) this.claims.set(String((c.metadata as Obj).name), ((c.metadata as Obj).ownerReferences as never) ?? []);
    for (const c of out.claimOwners) this.claims.set(c.name, c.ownerReferences);
    for (const p of out.createPods) this.pods.set(p.metadata!.name!, { ...p, metadata: { ...p.metadata, uid: `pod-uid-${++this.uid}` }, status: { phase: 'Pending' } });
    for (const p of out.deletePods) this.pods.set(p.metadata!.name!, { ...this.pods.get(p.metadata!.name!)!, metadata: { ...p.metadata, deletionTimestamp: new Date(NOW).toISOString() } });
    this.status = out.status;
    return out;
  }
  ready(name: string) {
    const p = this.pods.get(name)!;
    this.pods.set(name, { ...p, status: { phase: 'Running', conditions: [{ type: 'Ready', status: 'True', lastTransitionTime: new Date(NOW - 60_000).toISOString() }] } });
  }
  readyAll() {
    for (const n of this.pods.keys()) if (!this.pods.get(n)!.metadata?.deletionTimestamp) this.ready(n);
  }
  /** The agent finished stopping the deleted pods. */
  reap() {
    for (const [n, p] of this.pods) if (p.metadata?.deletionTimestamp) this.pods.delete(n);
  }
  names = () => [...this.pods.keys()].sort();
  revisionOf = (name: string) => this.pods.get(name)?.metadata?.labels?.['controller-revision-hash'];
}

const names = (pods: Pod[]) => pods.map((p) => p.metadata!.name!);

describe('StatefulSet controller', () => {
  it('makes ordinals 0..n-1 one at a time under OrderedReady, each Ready before the next', () => {
    const w = new World(setOf());
    const order: string[] = [];
    for (let i = 0; i < 10 && order.length < 3; i++) {
      const out = w.step();
      expect(out.createPods.length).toBeLessThanOrEqual(1);
      order.push(...names(out.createPods));
      // Nothing more while the newest is not Ready.
      expect(w.step().createPods).toEqual([]);
      w.readyAll();
    }
    expect(order).toEqual(['db-0', 'db-1', 'db-2']);
    w.step();
    expect(w.status).toMatchObject({ replicas: 3, readyReplicas: 3, availableReplicas: 3, currentReplicas: 3, updatedReplicas: 3, observedGeneration: 1 });
    expect(w.status.currentRevision).toBe(w.status.updateRevision);
  });

  it('gives each pod its identity: name, labels, hostname, subdomain, its claims as volumes', () => {
    const w = new World(setOf({ volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } }] }));
    const out = w.step();
    expect(names(out.createPods)).toEqual(['db-0']);
    expect(out.createClaims.map((c) => (c.metadata as Obj).name)).toEqual(['data-db-0']);
    const p = out.createPods[0]!;
    expect(p.metadata!.labels).toMatchObject({ app: 'db', 'statefulset.kubernetes.io/pod-name': 'db-0', 'apps.kubernetes.io/pod-index': '0', 'controller-revision-hash': out.revisions.update.name });
    expect(p.metadata!.ownerReferences).toEqual([{ apiVersion: 'apps/v1', kind: 'StatefulSet', name: 'db', uid: 'uid-db', controller: true, blockOwnerDeletion: true }]);
    expect(p.spec).toMatchObject({ hostname: 'db-0', subdomain: 'db-svc', nodeName: 'n1', volumes: [{ name: 'data', persistentVolumeClaim: { claimName: 'data-db-0' } }] });
    // Whatever happens to the pod, its claim stays: deleting the pod asks for no claim deletion, and it comes back on the same claim.
    w.ready('db-0');
    w.pods.delete('db-0');
    const again = w.step();
    expect(again.createClaims).toEqual([]);
    expect(again.createPods[0]!.spec!.volumes).toEqual([{ name: 'data', persistentVolumeClaim: { claimName: 'data-db-0' } }]);
  });

  it('waits, and says why, when the API serves no claims', () => {
    const out = reconcileStatefulSet({ set: setOf({ volumeClaimTemplates: [{ metadata: { name: 'data' }, spec: {} }] }), pods: [], revisions: [], claims: undefined, nodeName: 'n1', now: NOW, burst: 500 });
    expect(out.createPods).toEqual([]);
    expect(out.waiting).toMatch(/PersistentVolumeClaims are not served/);
  });

  it('makes every ordinal at once under Parallel, at most the burst a call', () => {
    const w = new World(setOf({ podManagementPolicy: 'Parallel' }), 2);
    expect(names(w.step().createPods)).toEqual(['db-0', 'db-1']);
    expect(names(w.step().createPods)).toEqual(['db-2']);
  });

  it('never builds a 100000-replica set in one call', () => {
    const ordered = reconcileStatefulSet({ set: setOf({ replicas: 100_000 }), pods: [], revisions: [], claims: new Map(), nodeName: 'n1', now: NOW, burst: 500 });
    expect(ordered.createPods).toHaveLength(1);
    const parallel = reconcileStatefulSet({ set: setOf({ replicas: 100_000, podManagementPolicy: 'Parallel' }), pods: [], revisions: [], claims: new Map(), nodeName: 'n1', now: NOW, burst: 500 });
    expect(parallel.createPods).toHaveLength(500);
  });

  it('scales down from the highest ordinal, one at a time, each gone before the next', () => {
    const w = new World(setOf());
    for (let i = 0; i < 6; i++) {
      w.step();
      w.readyAll();
    }
    expect(w.names()).toEqual(['db-0', 'db-1', 'db-2']);
    w.set = setOf({ replicas: 1 });
    expect(names(w.step().deletePods)).toEqual(['db-2']);
    // db-2 still terminating: db-1 waits.
    expect(w.step().deletePods).toEqual([]);
    w.reap();
    expect(names(w.step().deletePods)).toEqual(['db-1']);
    w.reap();
    expect(w.step().deletePods).toEqual([]);
    expect(w.names()).toEqual(['db-0']);
  });

  it('scales down all at once under Parallel', () => {
    const w = new World(setOf({ podManagementPolicy: 'Parallel' }));
    w.step();
    w.readyAll();
    w.set = setOf({ podManagementPolicy: 'Parallel', replicas: 1 });
    expect(names(w.step().deletePods)).toEqual(['db-2', 'db-1']);
  });

  it('rolls a new template from the highest ordinal down, each Ready before the next', () => {
    const w = new World(setOf());
    for (let i = 0; i < 6; i++) {
      w.step();
      w.readyAll();
    }
    const old = w.revisionOf('db-0');
    w.set = setOf({ template: template('busybox:2') });
    const replaced: string[] = [];
    for (let i = 0; i < 20; i++) {
      const out = w.step();
      replaced.push(...names(out.deletePods));
      w.reap();
      w.step();
      w.readyAll();
    }
    expect(replaced).toEqual(['db-2', 'db-1', 'db-0']);
    const next = w.revisionOf('db-0');
    expect(next).not.toBe(old);
    expect(['db-0', 'db-1', 'db-2'].map(w.revisionOf)).toEqual([next, next, next]);
    expect(w.status).toMatchObject({ currentRevision: next, updateRevision: next, updatedReplicas: 3, currentReplicas: 3 });
    expect(w.revisions.map((r) => r.revision).sort()).toEqual([1, 2]);
  });

  it('stops a rolling update at the partition', () => {
    const w = new World(setOf());
    for (let i = 0; i < 6; i++) {
      w.step();
      w.readyAll();
    }
    const old = w.revisionOf('db-0');
    w.set = setOf({ template: template('busybox:2'), updateStrategy: { type: 'RollingUpdate', rollingUpdate: { partition: 2 } } });
    for (let i = 0; i < 10; i++) {
      w.step();
      w.reap();
      w.readyAll();
    }
    expect(['db-0', 'db-1'].map(w.revisionOf)).toEqual([old, old]);
    expect(w.revisionOf('db-2')).not.toBe(old);
    expect(w.status).toMatchObject({ currentRevision: old, currentReplicas: 2, updatedReplicas: 1 });
    // A pod below the partition that is deleted comes back at the current revision.
    w.pods.delete('db-0');
    expect(w.step().createPods[0]!.metadata!.labels!['controller-revision-hash']).toBe(old);
  });

  it('replaces nothing under OnDelete; a deleted pod comes back at the new revision', () => {
    const w = new World(setOf({ updateStrategy: { type: 'OnDelete' } }));
    for (let i = 0; i < 6; i++) {
      w.step();
      w.readyAll();
    }
    const old = w.revisionOf('db-1');
    w.set = setOf({ template: template('busybox:2'), updateStrategy: { type: 'OnDelete' } });
    for (let i = 0; i < 5; i++) expect(w.step().deletePods).toEqual([]);
    w.pods.delete('db-1');
    const out = w.step();
    expect(names(out.createPods)).toEqual(['db-1']);
    expect(w.revisionOf('db-1')).not.toBe(old);
    expect(w.revisionOf('db-2')).toBe(old);
  });

  it('recreates a failed pod in place', () => {
    const w = new World(setOf({ replicas: 1 }));
    w.step();
    w.pods.set('db-0', { ...w.pods.get('db-0')!, status: { phase: 'Failed' } });
    expect(names(w.step().deletePods)).toEqual(['db-0']);
    w.reap();
    expect(names(w.step().createPods)).toEqual(['db-0']);
  });

  it('owns claims as the retention policy says: by the set (whenDeleted), by the pod once scaled away (whenScaled)', () => {
    const vct = [{ metadata: { name: 'data' }, spec: {} }];
    const retain = new World(setOf({ replicas: 1, volumeClaimTemplates: vct }));
    expect(retain.step().createClaims[0]!.metadata).not.toHaveProperty('ownerReferences');

    const policy = { whenDeleted: 'Delete', whenScaled: 'Delete' };
    const w = new World(setOf({ replicas: 2, podManagementPolicy: 'Parallel', volumeClaimTemplates: vct, persistentVolumeClaimRetentionPolicy: policy }));
    const out = w.step();
    expect(out.createClaims.map((c) => (c.metadata as Obj).ownerReferences)).toEqual([
      [{ apiVersion: 'apps/v1', kind: 'StatefulSet', name: 'db', uid: 'uid-db', controller: true, blockOwnerDeletion: true }],
      [{ apiVersion: 'apps/v1', kind: 'StatefulSet', name: 'db', uid: 'uid-db', controller: true, blockOwnerDeletion: true }],
    ]);
    w.readyAll();
    w.step();
    w.set = setOf({ replicas: 1, podManagementPolicy: 'Parallel', volumeClaimTemplates: vct, persistentVolumeClaimRetentionPolicy: policy });
    const down = w.step();
    expect(names(down.deletePods)).toEqual(['db-1']);
    expect(down.claimOwners).toEqual([{ name: 'data-db-1', ownerReferences: [{ apiVersion: 'apps/v1', kind: 'StatefulSet', name: 'db', uid: 'uid-db', controller: true, blockOwnerDeletion: true }, { apiVersion: 'v1', kind: 'Pod', name: 'db-1', uid: w.pods.get('db-1')!.metadata!.uid }] }]);
    // Converged: the same pass again writes nothing.
    expect(w.step().claimOwners).toEqual([]);
  });
});

describe('ControllerRevision history', () => {
  it('numbers templates, reuses an old one on rollback, prunes beyond the limit what nothing runs', () => {
    const a = { spec: { containers: [{ name: 'c', image: 'a' }] } };
    const b = { spec: { containers: [{ name: 'c', image: 'b' }] } };
    const p1 = planRevisions('ds', a, [], 10, new Set());
    expect(p1.create).toMatchObject({ name: `ds-${p1.hash}`, revision: 1, data: revisionData(a) });
    expect((p1.create!.data as { spec: { template: Obj } }).spec.template.$patch).toBe('replace');
    const r1 = { name: p1.create!.name, revision: 1, template: a };
    const p2 = planRevisions('ds', b, [r1], 10, new Set());
    expect(p2.create).toMatchObject({ revision: 2 });
    const r2 = { name: p2.create!.name, revision: 2, template: b };
    // Back to a: its revision becomes 3, nothing new.
    const p3 = planRevisions('ds', a, [r1, r2], 10, new Set());
    expect(p3.create).toBeUndefined();
    expect(p3.renumber).toEqual([{ name: r1.name, revision: 3 }]);
    // Limit 0: the old one goes unless a pod still runs it.
    expect(planRevisions('ds', b, [r1, r2], 0, new Set()).prune).toEqual([r1.name]);
    expect(planRevisions('ds', b, [r1, r2], 0, new Set([r1.name])).prune).toEqual([]);
  });
});
