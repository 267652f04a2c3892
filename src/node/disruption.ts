/**
 * The disruption controller (kube-controller-manager's), over the ApiClient:
 * for every PodDisruptionBudget, the pods it covers, how many of them are
 * healthy (Ready, not terminating, not just evicted), how many must be
 * (minAvailable, or the expected count less maxUnavailable, percentages of
 * the expected count rounded up), and from those the disruptions allowed
 * that the eviction subresource spends. The expected count of a percentage
 * or maxUnavailable budget is the scale of the pods' controllers
 * (Deployment through its ReplicaSet, ReplicaSet, StatefulSet); a budget
 * whose pods have none it can find allows no disruption (SyncFailed).
 */
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { budgetSelects } from '../api/kinds/pdb.js';
import { timestamp } from '../api/store.js';
import type { ApiObject, Obj } from '../api/types.js';
import type { Logger } from '../log.js';
import { LevelLoop } from './level-loop.js';

/** How long a pod the eviction subresource named stays counted as going (upstream's DeletionTimeout). */
export const DELETION_TIMEOUT_MS = 2 * 60 * 1000;
const PDBS = 'poddisruptionbudgets.policy';

export interface DisruptionControllerOptions {
  client: ApiClient;
  log: Logger;
  now?: () => number;
  everyMs?: number;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const specOf = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
const statusOf = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});
const ready = (pod: ApiObject) => Array.isArray(statusOf(pod).conditions) && (statusOf(pod).conditions as Obj[]).some((c) => isObj(c) && c.type === 'Ready' && c.status === 'True');

/** intstr.GetScaledValueFromIntOrPercent with rounding up. */
export function scaled(v: unknown, total: number): number {
  if (typeof v === 'number') return v;
  const m = /^(\d+)%$/.exec(String(v));
  return m ? Math.ceil((Number(m[1]) * total) / 100) : 0;
}

const controllerOf = (o: ApiObject): Obj | undefined => (o.metadata.ownerReferences ?? []).find((r) => r.controller === true);

export interface BudgetCounts {
  expectedPods: number;
  desiredHealthy: number;
  currentHealthy: number;
  disruptedPods: Record<string, string>;
}

/**
 * The budget's numbers from its pods (pure). `scaleOf` gives the replicas a
 * pod's controller wants, or undefined when it finds none; throws then.
 */
export function countBudget(pdb: ApiObject, pods: ApiObject[], scaleOf: (owner: Obj, namespace: string) => number | undefined, nowMs: number): BudgetCounts {
  const spec = specOf(pdb);
  const expectedScale = (): number => {
    const seen = new Map<string, number>();
    for (const p of pods) {
      const ref = controllerOf(p);
      if (!ref) continue; // unmanaged: not counted, as upstream (which warns)
      const uid = String(ref.uid ?? '');
      if (seen.has(uid)) continue;
      const n = scaleOf(ref, p.metadata.namespace ?? 'default');
      if (n === undefined) throw new Error(`found no controllers for pod "${p.metadata.name}"`);
      seen.set(uid, n);
    }
    return [...seen.values()].reduce((a, b) => a + b, 0);
  };
  let expectedPods = 0;
  let desiredHealthy = 0;
  if (spec.maxUnavailable !== undefined && spec.maxUnavailable !== null) {
    expectedPods = expectedScale();
    desiredHealthy = Math.max(0, expectedPods - scaled(spec.maxUnavailable, expectedPods));
  } else if (spec.minAvailable !== undefined && spec.minAvailable !== null) {
    if (typeof spec.minAvailable === 'number') {
      desiredHealthy = spec.minAvailable;
      expectedPods = pods.length;
    } else {
      expectedPods = expectedScale();
      desiredHealthy = scaled(spec.minAvailable, expectedPods);
    }
  }
  // Pods the eviction subresource said are going: kept until they are terminating or the timeout passes.
  const byName = new Map(pods.map((p) => [String(p.metadata.name), p]));
  const disruptedPods: Record<string, string> = {};
  const old = isObj(statusOf(pdb).disruptedPods) ? (statusOf(pdb).disruptedPods as Obj) : {};
  for (const [name, at] of Object.entries(old)) {
    const p = byName.get(name);
    if (!p || p.metadata.deletionTimestamp) continue;
    const t = Date.parse(String(at));
    if (Number.isNaN(t) || t + DELETION_TIMEOUT_MS < nowMs) continue;
    disruptedPods[name] = String(at);
  }
  let currentHealthy = 0;
  for (const p of pods) {
    if (p.metadata.deletionTimestamp || disruptedPods[String(p.metadata.name)] !== undefined) continue;
    if (ready(p)) currentHealthy++;
  }
  return { expectedPods, desiredHealthy, currentHealthy, disruptedPods };
}

/** The status the controller writes for the counts (DisruptionAllowed as pdbhelper sets it). */
export function budgetStatus(pdb: ApiObject, c: BudgetCounts, nowMs: number): Obj {
  let allowed = c.currentHealthy - c.desiredHealthy;
  if (c.expectedPods <= 0 || allowed <= 0) allowed = 0;
  const generation = pdb.metadata.generation ?? 0;
  const status: Obj = {
    ...(Object.keys(c.disruptedPods).length > 0 ? { disruptedPods: c.disruptedPods } : {}),
    disruptionsAllowed: allowed,
    currentHealthy: c.currentHealthy,
    desiredHealthy: c.desiredHealthy,
    expectedPods: c.expectedPods,
    observedGeneration: generation,
  };
  status.conditions = [condition(pdb, allowed > 0 ? { status: 'True', reason: 'SufficientPods' } : { status: 'False', reason: 'InsufficientPods' }, generation, nowMs)];
  return status;
}

function condition(pdb: ApiObject, c: { status: string; reason: string; message?: string }, generation: number, nowMs: number): Obj {
  const old = (Array.isArray(statusOf(pdb).conditions) ? (statusOf(pdb).conditions as Obj[]) : []).find((x) => isObj(x) && x.type === 'DisruptionAllowed');
  return {
    type: 'DisruptionAllowed',
    status: c.status,
    observedGeneration: generation,
    lastTransitionTime: old && old.status === c.status && typeof old.lastTransitionTime === 'string' ? old.lastTransitionTime : timestamp(nowMs),
    reason: c.reason,
    message: c.message ?? '',
  };
}

export class DisruptionController {
  private readonly loop: LevelLoop;
  private readonly now: () => number;

  constructor(private readonly o: DisruptionControllerOptions) {
    this.now = o.now ?? Date.now;
    this.loop = new LevelLoop({
      client: o.client,
      // The workloads are read for the expected count of percentage budgets.
      resources: [PDBS, 'pods', 'replicasets.apps', 'deployments.apps', 'statefulsets.apps'],
      sync: () => this.sync(),
      log: o.log,
      name: 'the disruption controller',
      everyMs: o.everyMs ?? 10_000,
    });
  }

  start(): Promise<void> {
    return this.loop.start();
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }

  /** Resolves once the syncs due have run (tests). */
  idle(): Promise<void> {
    return this.loop.idle();
  }

  async sync(): Promise<void> {
    const { client } = this.o;
    const pdbs = (await client.list(PDBS)).items;
    if (pdbs.length === 0) return;
    const pods = (await client.list('pods')).items;
    const owners = new Map<string, ApiObject[]>();
    for (const r of ['replicasets.apps', 'deployments.apps', 'statefulsets.apps']) owners.set(r, (await client.list(r).catch(() => ({ items: [] }))).items);
    const find = (resource: string, namespace: string, uid: unknown) => owners.get(resource)!.find((x) => x.metadata.namespace === namespace && x.metadata.uid === uid);
    const replicas = (o: ApiObject) => (typeof specOf(o).replicas === 'number' ? (specOf(o).replicas as number) : 1);
    const scaleOf = (ref: Obj, namespace: string): number | undefined => {
      if (ref.kind === 'ReplicaSet') {
        const rs = find('replicasets.apps', namespace, ref.uid);
        if (!rs) return undefined;
        const up = controllerOf(rs);
        const deploy = up?.kind === 'Deployment' ? find('deployments.apps', namespace, up.uid) : undefined;
        return replicas(deploy ?? rs);
      }
      if (ref.kind === 'StatefulSet') {
        const ss = find('statefulsets.apps', namespace, ref.uid);
        return ss ? replicas(ss) : undefined;
      }
      return undefined;
    };
    const now = this.now();
    for (const pdb of pdbs) {
      const covered = pods.filter((p) => budgetSelects(pdb, p));
      let status: Obj;
      try {
        status = budgetStatus(pdb, countBudget(pdb, covered, scaleOf, now), now);
      } catch (err) {
        // As upstream's failSafe: nothing may be disrupted while the budget cannot be computed.
        const generation = pdb.metadata.generation ?? 0;
        status = { ...statusOf(pdb), disruptionsAllowed: 0, observedGeneration: generation, conditions: [condition(pdb, { status: 'False', reason: 'SyncFailed', message: (err as Error).message }, generation, now)] };
      }
      if (JSON.stringify(status) === JSON.stringify(statusOf(pdb))) continue;
      await client.update(PDBS, pdb.metadata.namespace ?? 'default', String(pdb.metadata.name), { ...pdb, status }, { status: true }).catch((err: unknown) => {
        // Changed meanwhile (an eviction spent a disruption): the next sync sees it.
        if (!(err instanceof ApiError && (err.reason === 'Conflict' || err.reason === 'NotFound'))) throw err;
        this.loop.kick(0);
      });
    }
  }
}
