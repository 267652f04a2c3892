/**
 * pods/eviction and PodDisruptionBudgets in the node API's store, with the
 * disruption controller and the node's scheduling run over the in-process
 * client: a budget that allows no disruption refuses (429, DisruptionBudget
 * cause) and leaves the pod alone; one that allows one spends it; Pending and
 * unready pods follow the upstream rules; a cordoned Node gets its taint and
 * keeps new pods Pending until uncordoned.
 */
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { ApiError } from '../../src/api/errors.js';
import { evict } from '../../src/api/eviction.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { placementRefusal } from '../../src/api/kinds/placement.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject, Obj } from '../../src/api/types.js';
import { DisruptionController } from '../../src/node/disruption.js';
import { NodeScheduling } from '../../src/node/scheduling.js';
import { silentLogger } from '../../src/log.js';

const NODE = 'test-node';

function world(opts: { refusal?: boolean } = {}) {
  let store!: Store;
  const refusal = opts.refusal
    ? (pod: ApiObject) => {
        try {
          return placementRefusal(store.get(store.kind('nodes')!, '', NODE), pod);
        } catch {
          return undefined;
        }
      }
    : undefined;
  store = new Store({ kinds: nodeKinds(NODE, refusal) });
  const client = localClient(store);
  const k = (r: string) => store.kind(r)!;
  const pod = (name: string, labels: Record<string, string>, phase = 'Running', ready = true, extra: Obj = {}) => {
    const p = store.create(k('pods'), 'default', { metadata: { name, labels, ...extra }, spec: { containers: [{ name: 'c', image: 'busybox' }] } });
    if (phase === 'Pending') return p;
    return store.update(k('pods'), 'default', name, { ...p, status: { phase, conditions: [{ type: 'Ready', status: ready ? 'True' : 'False' }] } }, { status: true });
  };
  const pdb = (name: string, spec: Obj) => store.create(k('poddisruptionbudgets.policy'), 'default', { metadata: { name }, spec });
  const controller = new DisruptionController({ client, log: silentLogger });
  const eviction = (name: string, apiVersion = 'policy/v1', deleteOptions?: Obj) => ({ apiVersion, kind: 'Eviction', metadata: { name, namespace: 'default' }, ...(deleteOptions ? { deleteOptions } : {}) });
  const getPod = (name: string) => store.get(k('pods'), 'default', name);
  const getPdb = (name: string) => store.get(k('poddisruptionbudgets.policy'), 'default', name);
  return { store, client, k, pod, pdb, controller, eviction, getPod, getPdb };
}

function refusal(fn: () => void): ApiError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error('no error');
}

describe('pods/eviction', () => {
  it('refuses with 429 and the DisruptionBudget cause while the budget allows no disruption, then evicts once it allows one', async () => {
    const w = world();
    w.pod('web-1', { app: 'web' });
    w.pdb('web', { minAvailable: 1, selector: { matchLabels: { app: 'web' } } });
    await w.controller.sync();
    expect(w.getPdb('web').status).toMatchObject({ currentHealthy: 1, desiredHealthy: 1, expectedPods: 1, disruptionsAllowed: 0, observedGeneration: 1 });
    expect((w.getPdb('web').status as Obj).conditions).toMatchObject([{ type: 'DisruptionAllowed', status: 'False', reason: 'InsufficientPods' }]);

    const e = refusal(() => evict(w.store, 'default', 'web-1', w.eviction('web-1')));
    expect(e.code).toBe(429);
    expect(e.status()).toMatchObject({
      reason: 'TooManyRequests',
      message: "Cannot evict pod as it would violate the pod's disruption budget.",
      details: { causes: [{ reason: 'DisruptionBudget', message: 'The disruption budget web needs 1 healthy pods and has 1 currently' }] },
    });
    expect(w.getPod('web-1').metadata.deletionTimestamp).toBeUndefined();

    // A second ready pod: one disruption allowed, spent by the first eviction, refused for the next.
    w.pod('web-2', { app: 'web' });
    await w.controller.sync();
    expect(w.getPdb('web').status).toMatchObject({ currentHealthy: 2, disruptionsAllowed: 1 });
    evict(w.store, 'default', 'web-1', w.eviction('web-1'));
    const gone = w.getPod('web-1');
    expect(gone.metadata.deletionTimestamp).toBeDefined();
    expect(gone.metadata.deletionGracePeriodSeconds).toBe(30);
    expect((gone.status as Obj).conditions).toContainEqual(expect.objectContaining({ type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI', message: 'Eviction API: evicting' }));
    expect(w.getPdb('web').status).toMatchObject({ disruptionsAllowed: 0, disruptedPods: { 'web-1': expect.any(String) } });
    expect(refusal(() => evict(w.store, 'default', 'web-2', w.eviction('web-2'))).code).toBe(429);
    // The controller counts the terminating pod out and keeps the budget at 0.
    await w.controller.sync();
    expect(w.getPdb('web').status).toMatchObject({ currentHealthy: 1, disruptionsAllowed: 0 });
    expect((w.getPdb('web').status as Obj).disruptedPods).toBeUndefined();
  });

  it('takes deleteOptions (grace, dry run, preconditions) and policy/v1beta1 bodies; a name that differs is 400', async () => {
    const w = world();
    w.pod('a', { app: 'a' });
    evict(w.store, 'default', 'a', w.eviction('a', 'policy/v1', { dryRun: ['All'] }));
    expect(w.getPod('a').metadata.deletionTimestamp).toBeUndefined();
    expect(refusal(() => evict(w.store, 'default', 'a', w.eviction('a', 'policy/v1', { preconditions: { uid: 'other' } }))).code).toBe(409);
    expect(refusal(() => evict(w.store, 'default', 'a', w.eviction('b'))).message).toBe('name in URL does not match name in Eviction object');
    evict(w.store, 'default', 'a', w.eviction('a', 'policy/v1beta1', { gracePeriodSeconds: 5 }));
    expect(w.getPod('a').metadata.deletionGracePeriodSeconds).toBe(5);
    // Grace 0: gone at once.
    w.pod('b', { app: 'b' });
    evict(w.store, 'default', 'b', w.eviction('b', 'policy/v1', { gracePeriodSeconds: 0 }));
    expect(refusal(() => w.getPod('b')).code).toBe(404);
    expect(refusal(() => evict(w.store, 'default', 'nope', w.eviction('nope'))).code).toBe(404);
  });

  it('evicts Pending and finished pods whatever the budget; unready pods by unhealthyPodEvictionPolicy', async () => {
    const w = world();
    w.pod('ready', { app: 'x' });
    w.pod('pending', { app: 'x' }, 'Pending');
    w.pod('done', { app: 'x' }, 'Succeeded', false);
    w.pod('sick', { app: 'x' }, 'Running', false);
    w.pdb('x', { minAvailable: 2, selector: { matchLabels: { app: 'x' } } });
    await w.controller.sync();
    expect(w.getPdb('x').status).toMatchObject({ currentHealthy: 1, desiredHealthy: 2, disruptionsAllowed: 0, expectedPods: 4 });
    evict(w.store, 'default', 'pending', w.eviction('pending'));
    expect(w.getPod('pending').metadata.deletionTimestamp).toBeDefined();
    evict(w.store, 'default', 'done', w.eviction('done'));
    expect(refusal(() => w.getPod('done')).code).toBe(404);
    // IfHealthyBudget (the default): the budget is not healthy (1 < 2), so the unready pod is protected.
    expect(refusal(() => evict(w.store, 'default', 'sick', w.eviction('sick'))).code).toBe(429);
    w.store.patch(w.k('poddisruptionbudgets.policy'), 'default', 'x', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), unhealthyPodEvictionPolicy: 'AlwaysAllow' } }));
    // Changed but not yet seen by the controller: the budget is still being processed.
    const busy = refusal(() => evict(w.store, 'default', 'ready', w.eviction('ready')));
    expect(busy.status()).toMatchObject({ code: 429, details: { causes: [{ reason: 'DisruptionBudget', message: 'The disruption budget x is still being processed by the server.' }] } });
    await w.controller.sync();
    evict(w.store, 'default', 'sick', w.eviction('sick'));
    expect(w.getPod('sick').metadata.deletionTimestamp).toBeDefined();
  });

  it('refuses a pod covered by two budgets (500), as the eviction subresource does', async () => {
    const w = world();
    w.pod('p', { app: 'p', tier: 't' });
    w.pdb('one', { maxUnavailable: 1, selector: { matchLabels: { app: 'p' } } });
    w.pdb('two', { maxUnavailable: 1, selector: { matchLabels: { tier: 't' } } });
    const e = refusal(() => evict(w.store, 'default', 'p', w.eviction('p')));
    expect(e.code).toBe(500);
    expect(e.message).toBe('This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.');
  });
});

describe('the disruption controller', () => {
  it('counts maxUnavailable and percentages against the scale of the pods\' Deployment', async () => {
    const w = world();
    const deploy = w.store.create(w.k('deployments.apps'), 'default', {
      metadata: { name: 'web' },
      spec: { replicas: 4, selector: { matchLabels: { app: 'web' } }, template: { metadata: { labels: { app: 'web' } }, spec: { containers: [{ name: 'c', image: 'busybox' }] } } },
    });
    const rs = w.store.create(w.k('replicasets.apps'), 'default', {
      metadata: { name: 'web-1', ownerReferences: [{ apiVersion: 'apps/v1', kind: 'Deployment', name: 'web', uid: deploy.metadata.uid, controller: true }] },
      spec: { replicas: 4, selector: { matchLabels: { app: 'web' } }, template: { metadata: { labels: { app: 'web' } }, spec: { containers: [{ name: 'c', image: 'busybox' }] } } },
    });
    const owner = { ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'web-1', uid: rs.metadata.uid, controller: true }] };
    for (const n of ['a', 'b', 'c']) w.pod(n, { app: 'web' }, 'Running', true, owner);
    w.pdb('max', { maxUnavailable: '25%', selector: { matchLabels: { app: 'web' } } });
    await w.controller.sync();
    // 4 expected, 25% of 4 is 1: 3 must be healthy, 3 are.
    expect(w.getPdb('max').status).toMatchObject({ expectedPods: 4, desiredHealthy: 3, currentHealthy: 3, disruptionsAllowed: 0 });
    w.store.patch(w.k('deployments.apps'), 'default', 'web', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), replicas: 3 } }));
    await w.controller.sync();
    // 25% of 3 rounds up to 1: 2 must be healthy.
    expect(w.getPdb('max').status).toMatchObject({ expectedPods: 3, desiredHealthy: 2, currentHealthy: 3, disruptionsAllowed: 1 });
    expect((w.getPdb('max').status as Obj).conditions).toMatchObject([{ type: 'DisruptionAllowed', status: 'True', reason: 'SufficientPods' }]);
  });

  it('allows nothing (SyncFailed) when a percentage budget\'s pods have no controller it can find', async () => {
    const w = world();
    w.pod('lone', { app: 'l' }, 'Running', true, { ownerReferences: [{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'gone', uid: 'nope', controller: true }] });
    w.pdb('l', { minAvailable: '50%', selector: { matchLabels: { app: 'l' } } });
    await w.controller.sync();
    expect(w.getPdb('l').status).toMatchObject({ disruptionsAllowed: 0, conditions: [{ type: 'DisruptionAllowed', status: 'False', reason: 'SyncFailed', message: 'found no controllers for pod "lone"' }] });
  });

  it('validates budgets as the API server does', () => {
    const w = world();
    expect(refusal(() => w.pdb('both', { minAvailable: 1, maxUnavailable: 1 })).message).toContain('minAvailable and maxUnavailable cannot be both set');
    expect(refusal(() => w.pdb('neg', { minAvailable: -1 })).message).toContain('spec.minAvailable: Invalid value: -1: must be greater than or equal to 0');
    expect(refusal(() => w.pdb('pct', { maxUnavailable: '120%' })).message).toContain('must not be greater than 100%');
    expect(refusal(() => w.pdb('pol', { minAvailable: 1, unhealthyPodEvictionPolicy: 'Sometimes' })).code).toBe(422);
    const row = w.store.kind('poddisruptionbudgets.policy')!.row(w.pdb('ok', { minAvailable: 1 }), Date.now());
    expect(row).toEqual(['ok', '1', 'N/A', 0, '0s']);
  });
});

describe('a cordoned node', () => {
  it('gets the unschedulable taint, keeps new pods Pending and unbound, and binds them once uncordoned', async () => {
    const w = world({ refusal: true });
    const scheduling = new NodeScheduling({ client: w.client, nodeName: NODE, log: silentLogger });
    w.store.create(w.k('nodes'), '', { metadata: { name: NODE }, spec: { unschedulable: true } });
    await scheduling.sync();
    expect((w.store.get(w.k('nodes'), '', NODE).spec as Obj).taints).toMatchObject([{ key: 'node.kubernetes.io/unschedulable', effect: 'NoSchedule', timeAdded: expect.any(String) }]);
    const p = w.pod('late', { app: 'l' }, 'Pending');
    expect((p.spec as Obj).nodeName).toBeUndefined();
    expect(p.status).toMatchObject({ phase: 'Pending', conditions: [{ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/1 nodes are available: 1 node(s) were unschedulable.' }] });
    // A pod that tolerates the cordon (a DaemonSet's) is placed anyway.
    const tolerant = w.store.create(w.k('pods'), 'default', { metadata: { name: 'ds' }, spec: { tolerations: [{ key: 'node.kubernetes.io/unschedulable', operator: 'Exists', effect: 'NoSchedule' }], containers: [{ name: 'c', image: 'busybox' }] } });
    expect((tolerant.spec as Obj).nodeName).toBe(NODE);
    await scheduling.sync();
    expect((w.getPod('late').spec as Obj).nodeName).toBeUndefined();

    w.store.patch(w.k('nodes'), '', NODE, (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), unschedulable: false } }));
    await scheduling.sync();
    expect((w.store.get(w.k('nodes'), '', NODE).spec as Obj).taints).toBeUndefined();
    const bound = w.getPod('late');
    expect((bound.spec as Obj).nodeName).toBe(NODE);
    expect((bound.status as Obj).conditions).toMatchObject([{ type: 'PodScheduled', status: 'True' }]);
    // Bound once: moving it elsewhere is still refused.
    expect(refusal(() => w.store.patch(w.k('pods'), 'default', 'late', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), nodeName: 'other' } }))).code).toBe(422);
  });
});
