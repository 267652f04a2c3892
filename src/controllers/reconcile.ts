/**
 * One pass of every workload controller: groups the observed pods by the
 * workload that owns them, runs each controller on its workload, and returns
 * the complete desired pod set, the statuses and the new memory. Pure: the
 * same input (time and randomness included) gives the same output.
 */
import type { JobSpec } from 'kubernetes-types/batch/v1.js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import { append, controllerOf, CREATE_BURST, desiredCopy, isTerminating, podKey, type Ctx } from './common.js';
import { reconcileCronJob } from './cronjob.js';
import { POD_TEMPLATE_HASH_LABEL, reconcileDeployment } from './deployment.js';
import { reconcileDaemonSet } from './daemonset.js';
import { reconcileJob } from './job.js';
import { emptyState, WORKLOAD_KINDS, type ControllerState, type ReconcileInput, type ReconcileOutput, type WorkloadKind, type WorkloadStatus } from './types.js';
import { isObject, validateWorkload } from './validate.js';

/** The workload a pod belongs to, as "Kind/namespace/name" (a ReplicaSet's pods belong to its Deployment). */
export function ownerKey(p: Pod): string | undefined {
  const ref = controllerOf(p);
  if (!ref || typeof ref.name !== 'string') return undefined;
  const ns = p.metadata?.namespace ?? 'default';
  switch (ref.kind) {
    case 'ReplicaSet': {
      const hash = p.metadata?.labels?.[POD_TEMPLATE_HASH_LABEL];
      if (!hash || !ref.name.endsWith(`-${hash}`)) return undefined;
      return `Deployment/${ns}/${ref.name.slice(0, -(hash.length + 1))}`;
    }
    case 'DaemonSet':
    case 'Job':
      return `${ref.kind}/${ns}/${ref.name}`;
    default:
      return undefined;
  }
}

/** A state from disk or from a caller: anything unusable becomes empty rather than throwing later. */
export function sanitizeState(s: unknown): ControllerState {
  const base = emptyState();
  if (!isObject(s) || s.version !== 1) return base;
  const out = structuredClone(s) as unknown as ControllerState;
  for (const k of Object.keys(base) as (keyof ControllerState)[]) {
    if (k === 'version') continue;
    if (!isObject(out[k])) (out as unknown as Record<string, unknown>)[k] = {};
  }
  return out;
}

function stringRecord(v: unknown): Record<string, string> | undefined {
  if (!isObject(v)) return undefined;
  return Object.fromEntries(Object.entries(v).filter(([, x]) => typeof x === 'string')) as Record<string, string>;
}

const list = (v: unknown): Record<string, unknown>[] => (Array.isArray(v) ? v.filter(isObject) : []);

/**
 * A pod as reported, reduced to the shapes the controllers read (the agent's
 * pods are well-formed; this keeps a bad one from breaking every workload).
 */
export function sanitizePod(p: unknown): Pod | undefined {
  if (!isObject(p) || !isObject(p.metadata) || typeof p.metadata.name !== 'string') return undefined;
  const m = p.metadata;
  const refs = list(m.ownerReferences).filter((r) => typeof r.kind === 'string' && typeof r.name === 'string');
  const st = isObject(p.status) ? p.status : {};
  const statuses = (v: unknown) =>
    list(v).map((c) => ({ ...c, restartCount: typeof c.restartCount === 'number' ? c.restartCount : 0, state: isObject(c.state) ? c.state : {} }));
  return {
    ...p,
    metadata: {
      ...m,
      namespace: typeof m.namespace === 'string' ? m.namespace : 'default',
      labels: stringRecord(m.labels) ?? {},
      annotations: stringRecord(m.annotations) ?? {},
      ownerReferences: refs,
    },
    spec: isObject(p.spec) ? p.spec : { containers: [] },
    status: {
      ...st,
      phase: typeof st.phase === 'string' ? st.phase : undefined,
      conditions: list(st.conditions),
      containerStatuses: statuses(st.containerStatuses),
      initContainerStatuses: statuses(st.initContainerStatuses),
    },
  } as unknown as Pod;
}

function isWorkloadKind(k: unknown): k is WorkloadKind {
  return typeof k === 'string' && (WORKLOAD_KINDS as readonly string[]).includes(k);
}

function usable(o: unknown): o is StoredObject {
  return isObject(o) && isWorkloadKind(o.kind) && typeof o.namespace === 'string' && typeof o.name === 'string';
}

export function reconcile(input: ReconcileInput): ReconcileOutput {
  const now = input.now;
  const state = sanitizeState(input.state);
  let requeue: number | undefined;
  const pods = (Array.isArray(input.pods) ? input.pods : []).map(sanitizePod).filter((p): p is Pod => p !== undefined);
  const ctx: Ctx = {
    now,
    nodeName: input.nodeName,
    random: input.random ?? Math.random,
    state,
    burst: typeof input.createBurst === 'number' && input.createBurst > 0 ? input.createBurst : CREATE_BURST,
    taken: new Set([...pods.map(podKey), ...(Array.isArray(input.reservedPodNames) ? input.reservedPodNames.filter((n) => typeof n === 'string') : [])]),
    requeueAt(at: number) {
      if (Number.isFinite(at) && at > now && (requeue === undefined || at < requeue)) requeue = at;
    },
  };

  const byOwner = new Map<string, Pod[]>();
  for (const p of pods) {
    const k = ownerKey(p);
    if (!k) continue;
    // Appended in place: copying the list per pod made a 100000-pod Job's pass quadratic (minutes).
    const same = byOwner.get(k);
    if (same) same.push(p);
    else byOwner.set(k, [p]);
  }
  const podsByJob = new Map<string, Pod[]>();
  for (const [k, v] of byOwner) if (k.startsWith('Job/')) podsByJob.set(k.slice(4), v);

  // One object per kind/namespace/name (the first, if a directory holds two).
  const workloads = new Map<string, StoredObject>();
  for (const o of Array.isArray(input.workloads) ? input.workloads : []) {
    if (!usable(o)) continue;
    const k = `${o.kind}/${o.namespace}/${o.name}`;
    if (!workloads.has(k)) workloads.set(k, o);
  }
  forgetVanished(state, workloads);
  const fileJobs = new Set([...workloads.values()].filter((o) => o.kind === 'Job').map((o) => `${o.namespace}/${o.name}`));

  const outPods: Pod[] = [];
  const statuses: WorkloadStatus[] = [];
  for (const [k, o] of workloads) {
    const kind = o.kind as WorkloadKind;
    const createdAt = (state.firstSeen[k] ??= now);
    const owned = byOwner.get(k) ?? [];
    const spec = isObject(o.object) && isObject(o.object.spec) ? o.object.spec : {};
    const entry = { kind, namespace: o.namespace, name: o.name, spec, createdAt };
    let problems: string[] = [];
    try {
      problems = validateWorkload(o, kind);
      switch (kind) {
        case 'Deployment':
        case 'DaemonSet': {
          const r = kind === 'Deployment' ? reconcileDeployment(ctx, o, owned, problems) : reconcileDaemonSet(ctx, o, owned, problems);
          append(outPods, r.pods);
          statuses.push({ ...entry, status: r.status, problems });
          break;
        }
        case 'Job': {
          const r = reconcileJob(ctx, { namespace: o.namespace, name: o.name, spec: spec as unknown as JobSpec, uid: o.uid, problems }, owned);
          append(outPods, r.pods);
          statuses.push({ ...entry, status: r.status as unknown as Record<string, unknown>, problems, ...(r.expired ? { deleted: true } : {}) });
          break;
        }
        case 'CronJob': {
          const r = reconcileCronJob(ctx, o, podsByJob, fileJobs, problems);
          append(outPods, r.pods);
          statuses.push({ ...entry, status: r.status as unknown as Record<string, unknown>, problems: r.problems }, ...r.jobs);
          break;
        }
      }
    } catch (e) {
      // A shape the validator let through and a controller tripped on: keep what runs, say why.
      const msg = `internal error reconciling ${k}: ${e instanceof Error ? e.message : String(e)}`;
      append(outPods, owned.filter((p) => !isTerminating(p)).map(desiredCopy));
      statuses.push({ ...entry, status: {}, problems: [...problems, msg] });
    }
  }

  // Jobs of CronJobs that went away take their pods with them; so do pods whose owner is gone.
  const seen = new Set<string>();
  const unique = outPods.filter((p) => {
    const k = podKey(p);
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  return { pods: unique, statuses, state, ...(requeue !== undefined ? { requeueAfterMs: requeue - now } : {}) };
}

/** Drops the memory of workloads (and their CronJobs' Jobs) no longer in the manifests. */
function forgetVanished(state: ControllerState, workloads: Map<string, StoredObject>): void {
  for (const [k, j] of Object.entries(state.virtualJobs)) {
    if (!workloads.has(`CronJob/${j.namespace}/${j.cronJob}`)) delete state.virtualJobs[k];
  }
  for (const k of Object.keys(state.jobs)) {
    if (!workloads.has(`Job/${k}`) && !state.virtualJobs[k]) delete state.jobs[k];
  }
  for (const k of Object.keys(state.cronJobs)) if (!workloads.has(`CronJob/${k}`)) delete state.cronJobs[k];
  for (const k of Object.keys(state.progress)) if (!workloads.has(`Deployment/${k}`)) delete state.progress[k];
  for (const k of Object.keys(state.firstSeen)) if (!workloads.has(k)) delete state.firstSeen[k];
  for (const k of Object.keys(state.conditions)) {
    const owner = k.split('/').slice(0, 3).join('/');
    if (!workloads.has(owner)) delete state.conditions[k];
  }
}
