/**
 * Whether a pod nobody placed may be placed on the node, as the scheduler's
 * filters decide for a one-node cluster: a cordoned node (spec.unschedulable)
 * takes only pods that tolerate node.kubernetes.io/unschedulable:NoSchedule,
 * a NoSchedule or NoExecute taint only pods that tolerate it (TaintToleration),
 * the pod's nodeSelector and required node affinity must match the Node's
 * labels and name (NodeAffinity), and its requests must fit what the pods
 * already on the node leave of its allocatable cpu and memory
 * (NodeResourcesFit). A pod with scheduling gates is not looked at until
 * they are removed. The refusal is worded as the scheduler words its
 * PodScheduled=False condition.
 */
import { tryParseExact } from '../../kubelet-lite/quantity.js';
import type { Change } from '../watch.js';
import type { ApiObject, Obj } from '../types.js';
import { isObj } from './common.js';

export const UNSCHEDULABLE_TAINT = 'node.kubernetes.io/unschedulable';

const list = (v: unknown): Obj[] => (Array.isArray(v) ? v.filter(isObj) : []);

/** v1helper.TolerationsTolerateTaint: the key (or an empty key with Exists), the effect (or none), the value. */
export function tolerates(tolerations: Obj[], taint: Obj): boolean {
  return tolerations.some((t) => {
    if (t.effect !== undefined && t.effect !== '' && t.effect !== taint.effect) return false;
    const key = String(t.key ?? '');
    if (key !== '' && key !== taint.key) return false;
    const op = t.operator ?? 'Equal';
    if (op === 'Exists') return true;
    if (key === '') return false; // an empty key must go with Exists
    return String(t.value ?? '') === String(taint.value ?? '');
  });
}

/** The PodScheduled=False condition's reason and message for a gated pod, as the scheduler's gate plugin sets them. */
export const GATED = { reason: 'SchedulingGated', message: 'Scheduling is blocked due to non-empty scheduling gates' };

export const isGated = (pod: ApiObject): boolean => isObj(pod.spec) && Array.isArray(pod.spec.schedulingGates) && pod.spec.schedulingGates.length > 0;

/** What a pod asks of a node: thousandths of a cpu and bytes of memory. */
export interface Requests {
  milliCpu: number;
  memory: number;
}

const quantity = (v: unknown, scale: number): number => {
  const f = tryParseExact(v);
  return f ? Math.ceil((Number(f.num) * scale) / Number(f.den)) : 0;
};

/** The scheduler's pod request: the containers' sum or the largest init container's, whichever is more, plus the pod's overhead. */
export function podRequests(pod: ApiObject): Requests {
  const spec = isObj(pod.spec) ? pod.spec : {};
  const of = (c: Obj): Requests => {
    const r = isObj(c.resources) && isObj((c.resources as Obj).requests) ? ((c.resources as Obj).requests as Obj) : {};
    return { milliCpu: quantity(r.cpu, 1000), memory: quantity(r.memory, 1) };
  };
  const apps = list(spec.containers).map(of).reduce((a, b) => ({ milliCpu: a.milliCpu + b.milliCpu, memory: a.memory + b.memory }), { milliCpu: 0, memory: 0 });
  for (const i of list(spec.initContainers).map(of)) {
    apps.milliCpu = Math.max(apps.milliCpu, i.milliCpu);
    apps.memory = Math.max(apps.memory, i.memory);
  }
  const overhead = isObj(spec.overhead) ? spec.overhead : {};
  return { milliCpu: apps.milliCpu + quantity(overhead.cpu, 1000), memory: apps.memory + quantity(overhead.memory, 1) };
}

/** One nodeSelectorRequirement against a label (or field) map. */
function requirementMatches(r: Obj, values: Record<string, string>): boolean {
  const key = String(r.key ?? '');
  const has = Object.prototype.hasOwnProperty.call(values, key);
  const vals = Array.isArray(r.values) ? r.values.map(String) : [];
  switch (r.operator) {
    case 'In':
      return has && vals.includes(values[key]!);
    case 'NotIn':
      return !has || !vals.includes(values[key]!);
    case 'Exists':
      return has;
    case 'DoesNotExist':
      return !has;
    case 'Gt':
    case 'Lt': {
      if (!has || vals.length !== 1) return false;
      const [a, b] = [Number(values[key]), Number(vals[0])];
      if (!Number.isInteger(a) || !Number.isInteger(b)) return false;
      return r.operator === 'Gt' ? a > b : a < b;
    }
    default:
      return false;
  }
}

/** NodeAffinity's filter: the nodeSelector's every label, and one of the required terms (an empty term matches nothing). */
export function matchesNodeAffinity(node: ApiObject, pod: ApiObject): boolean {
  const labels: Record<string, string> = isObj(node.metadata.labels) ? (node.metadata.labels as Record<string, string>) : {};
  const spec = isObj(pod.spec) ? pod.spec : {};
  if (isObj(spec.nodeSelector) && !Object.entries(spec.nodeSelector).every(([k, v]) => labels[k] === String(v))) return false;
  const affinity = isObj(spec.affinity) && isObj(spec.affinity.nodeAffinity) ? (spec.affinity.nodeAffinity as Obj) : undefined;
  const required = affinity && isObj(affinity.requiredDuringSchedulingIgnoredDuringExecution) ? (affinity.requiredDuringSchedulingIgnoredDuringExecution as Obj) : undefined;
  if (!required) return true;
  const fields = { 'metadata.name': String(node.metadata.name ?? '') };
  return list(required.nodeSelectorTerms).some((term) => {
    const exprs = list(term.matchExpressions);
    const fieldExprs = list(term.matchFields);
    if (exprs.length === 0 && fieldExprs.length === 0) return false;
    return exprs.every((r) => requirementMatches(r, labels)) && fieldExprs.every((r) => requirementMatches(r, fields));
  });
}

/**
 * Why the pod cannot go on the node ("0/1 nodes are available: …"), or
 * undefined when it can (or the node has not registered yet). `used`: what
 * the pods already on the node request; none, no resource check.
 */
export function placementRefusal(node: ApiObject | undefined, pod: ApiObject, used?: Requests): string | undefined {
  if (!node) return undefined;
  const spec = isObj(node.spec) ? node.spec : {};
  const podSpec = isObj(pod.spec) ? pod.spec : {};
  const tolerations = list(podSpec.tolerations);
  const why = (...reasons: string[]) => `0/1 nodes are available: ${reasons.map((r) => `1 ${r}`).join(', ')}.`;
  if (spec.unschedulable === true && !tolerates(tolerations, { key: UNSCHEDULABLE_TAINT, effect: 'NoSchedule' })) return why('node(s) were unschedulable');
  if (!matchesNodeAffinity(node, pod)) return why("node(s) didn't match Pod's node affinity/selector");
  for (const taint of list(spec.taints)) {
    if (taint.effect !== 'NoSchedule' && taint.effect !== 'NoExecute') continue;
    if (!tolerates(tolerations, taint)) return why(`node(s) had untolerated taint {${String(taint.key ?? '')}: ${String(taint.value ?? '')}}`);
  }
  if (used) {
    const allocatable = isObj(node.status) && isObj((node.status as Obj).allocatable) ? ((node.status as Obj).allocatable as Obj) : {};
    const want = podRequests(pod);
    const short: string[] = [];
    if (allocatable.cpu !== undefined && want.milliCpu > 0 && used.milliCpu + want.milliCpu > quantity(allocatable.cpu, 1000)) short.push('Insufficient cpu');
    if (allocatable.memory !== undefined && want.memory > 0 && used.memory + want.memory > quantity(allocatable.memory, 1)) short.push('Insufficient memory');
    if (short.length > 0) return why(...short);
  }
  return undefined;
}

const holdsResources = (pod: ApiObject, nodeName: string): boolean => {
  const phase = isObj(pod.status) ? (pod.status as Obj).phase : undefined;
  return isObj(pod.spec) && pod.spec.nodeName === nodeName && phase !== 'Succeeded' && phase !== 'Failed';
};

/** What the pods bound to one node request, summed (pure: the pods given). */
export function requestsOn(pods: ApiObject[], nodeName: string): Requests {
  const out = { milliCpu: 0, memory: 0 };
  for (const p of pods) {
    if (!holdsResources(p, nodeName)) continue;
    const r = podRequests(p);
    out.milliCpu += r.milliCpu;
    out.memory += r.memory;
  }
  return out;
}

/**
 * The same sum kept as pods change (fed the store's watch of pods), so a
 * pod's admission does not read every pod: each pod's requests by uid
 * while it is bound to the node and not finished.
 */
export class NodeRequests {
  private readonly byUid = new Map<string, Requests>();
  private total: Requests = { milliCpu: 0, memory: 0 };

  constructor(private readonly nodeName: string) {}

  apply(c: Change): void {
    const uid = String(c.object.metadata.uid ?? '');
    const before = this.byUid.get(uid);
    if (before) {
      this.total = { milliCpu: this.total.milliCpu - before.milliCpu, memory: this.total.memory - before.memory };
      this.byUid.delete(uid);
    }
    if (c.type === 'DELETED' || !holdsResources(c.object, this.nodeName)) return;
    const r = podRequests(c.object);
    this.byUid.set(uid, r);
    this.total = { milliCpu: this.total.milliCpu + r.milliCpu, memory: this.total.memory + r.memory };
  }

  get used(): Requests {
    return { ...this.total };
  }
}
