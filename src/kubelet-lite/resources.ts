/**
 * A pod's QoS class and the CRI resources of its containers, computed as the
 * kubelet's qos helper and kuberuntime do: cpu shares from the request, CFS
 * quota from the limit, the memory limit, and oom_score_adj by QoS class.
 */
import os from 'node:os';
import type { Container, Pod } from 'kubernetes-types/core/v1.js';
import type { LinuxContainerResources } from '../gen/runtime/v1/LinuxContainerResources.js';
import { ceilDiv, parseExact, parseMilliQuantity, quantityValue, type Fraction } from './quantity.js';

// ---------------------------------------------------------------- quantities

export { quantityValue } from './quantity.js';
/** Thousandths, rounded up (Quantity.MilliValue()). */
export const quantityMilli = parseMilliQuantity;
/** Exact: QoS and resourceFieldRef arithmetic never rounds. */
const parseQuantity = parseExact;

function compare(a: Fraction, b: Fraction): number {
  const l = a.num * b.den;
  const r = b.num * a.den;
  return l < r ? -1 : l > r ? 1 : 0;
}

function add(a: Fraction, b: Fraction): Fraction {
  return { num: a.num * b.den + b.num * a.den, den: a.den * b.den };
}

// ---------------------------------------------------------------- node

/** What the node offers, for limits a container leaves open. */
export interface NodeCapacity {
  milliCpu: number;
  memoryBytes: number;
}

export function hostCapacity(): NodeCapacity {
  return { milliCpu: os.cpus().length * 1000, memoryBytes: os.totalmem() };
}

/**
 * The pod's memory limit in bytes, as the kubelet sizes the pod cgroup: the
 * larger of the app containers' sum and the biggest init container, plus
 * the overhead; undefined unless every container has a memory limit.
 */
export function podMemoryLimit(pod: Pod): number | undefined {
  const limitOf = (c: Container) => {
    const q = c.resources?.limits?.memory;
    return q === undefined ? undefined : quantityValue(q);
  };
  let apps = 0;
  for (const c of pod.spec?.containers ?? []) {
    const l = limitOf(c);
    if (l === undefined) return undefined;
    apps += l;
  }
  let inits = 0;
  for (const c of pod.spec?.initContainers ?? []) {
    const l = limitOf(c);
    if (l === undefined) return undefined;
    // A sidecar runs beside the app containers; the others run one at a time.
    if (c.restartPolicy === 'Always') apps += l;
    else inits = Math.max(inits, l);
  }
  const overhead = pod.spec?.overhead?.memory;
  return Math.max(apps, inits) + (overhead === undefined ? 0 : quantityValue(overhead));
}

// ---------------------------------------------------------------- QoS

export type QosClass = 'Guaranteed' | 'Burstable' | 'BestEffort';

const QOS_RESOURCES = ['cpu', 'memory'];

/** A container's requests, with the API server's default applied: an unset request is the limit. */
export function effectiveRequests(c: Container): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(c.resources?.limits ?? {})) out[k] = String(v);
  for (const [k, v] of Object.entries(c.resources?.requests ?? {})) out[k] = String(v);
  return out;
}

/**
 * The pod's QoS class as the API defines it over init and app containers:
 * BestEffort without any cpu/memory request or limit; Guaranteed when every
 * container limits both and the summed requests equal the summed limits;
 * Burstable otherwise.
 */
export function qosClass(pod: Pod): QosClass {
  const requests = new Map<string, Fraction>();
  const limits = new Map<string, Fraction>();
  let guaranteed = true;
  const zero: Fraction = { num: 0n, den: 1n };
  for (const c of [...(pod.spec?.containers ?? []), ...(pod.spec?.initContainers ?? [])]) {
    for (const [name, q] of Object.entries(effectiveRequests(c))) {
      if (!QOS_RESOURCES.includes(name)) continue;
      const v = parseQuantity(q);
      if (compare(v, zero) > 0) requests.set(name, requests.has(name) ? add(requests.get(name)!, v) : v);
    }
    const found = new Set<string>();
    for (const [name, q] of Object.entries(c.resources?.limits ?? {})) {
      if (!QOS_RESOURCES.includes(name)) continue;
      const v = parseQuantity(String(q));
      if (compare(v, zero) > 0) {
        found.add(name);
        limits.set(name, limits.has(name) ? add(limits.get(name)!, v) : v);
      }
    }
    if (!QOS_RESOURCES.every((r) => found.has(r))) guaranteed = false;
  }
  if (requests.size === 0 && limits.size === 0) return 'BestEffort';
  if (guaranteed) {
    for (const [name, req] of requests) {
      const lim = limits.get(name);
      if (!lim || compare(lim, req) !== 0) {
        guaranteed = false;
        break;
      }
    }
  }
  return guaranteed && requests.size === limits.size ? 'Guaranteed' : 'Burstable';
}

// ---------------------------------------------------------------- CRI resources

export const GUARANTEED_OOM_SCORE_ADJ = -997;
export const BEST_EFFORT_OOM_SCORE_ADJ = 1000;
const MIN_SHARES = 2;
const MAX_SHARES = 262144;
const QUOTA_PERIOD = 100_000;
const MIN_QUOTA = 1000;

export function milliCpuToShares(milli: number): number {
  if (milli === 0) return MIN_SHARES;
  const shares = Math.floor((milli * 1024) / 1000);
  return Math.min(MAX_SHARES, Math.max(MIN_SHARES, shares));
}

export function milliCpuToQuota(milli: number, period: number): number {
  if (milli === 0) return 0;
  return Math.max(MIN_QUOTA, Math.floor((milli * period) / 1000));
}

/**
 * The kubelet's OOM policy: node-critical and Guaranteed pods -997,
 * BestEffort 1000, Burstable containers scaled by their memory request, kept
 * above any Guaranteed container (1000 - 997) and below BestEffort.
 */
export function oomScoreAdj(pod: Pod, c: Container, node: NodeCapacity): number {
  const own = containerOomScoreAdj(pod, c, node);
  // A sidecar must not die before the workload it serves: no higher than the lowest app container.
  const sidecar = (pod.spec?.initContainers ?? []).some((x) => x === c || (x.name === c.name && x.restartPolicy === 'Always'));
  if (!sidecar || c.restartPolicy !== 'Always') return own;
  return Math.min(own, ...(pod.spec?.containers ?? []).map((x) => containerOomScoreAdj(pod, x, node)));
}

function containerOomScoreAdj(pod: Pod, c: Container, node: NodeCapacity): number {
  if (pod.spec?.priorityClassName === 'system-node-critical') return GUARANTEED_OOM_SCORE_ADJ;
  switch (qosClass(pod)) {
    case 'Guaranteed':
      return GUARANTEED_OOM_SCORE_ADJ;
    case 'BestEffort':
      return BEST_EFFORT_OOM_SCORE_ADJ;
    case 'Burstable':
      break;
  }
  const req = effectiveRequests(c).memory;
  const memRequest = req ? BigInt(quantityValue(req)) : 0n;
  const adj = 1000 - Number((1000n * memRequest) / BigInt(Math.max(1, node.memoryBytes)));
  if (adj < 1000 + GUARANTEED_OOM_SCORE_ADJ) return 1000 + GUARANTEED_OOM_SCORE_ADJ;
  if (adj === BEST_EFFORT_OOM_SCORE_ADJ) return adj - 1;
  return adj;
}

/** The CRI linux resources of one container, as kuberuntime fills them. */
export function containerResources(pod: Pod, c: Container, node: NodeCapacity): LinuxContainerResources {
  const req = effectiveRequests(c);
  const lim = c.resources?.limits ?? {};
  const cpuRequest = req.cpu ? quantityMilli(req.cpu) : 0;
  const cpuLimit = lim.cpu !== undefined ? quantityMilli(String(lim.cpu)) : 0;
  const memLimit = lim.memory !== undefined ? quantityValue(String(lim.memory)) : 0;
  const out: LinuxContainerResources = {
    cpuShares: milliCpuToShares(cpuRequest === 0 && cpuLimit !== 0 ? cpuLimit : cpuRequest),
    cpuPeriod: QUOTA_PERIOD,
    cpuQuota: milliCpuToQuota(cpuLimit, QUOTA_PERIOD),
    oomScoreAdj: oomScoreAdj(pod, c, node),
  };
  if (memLimit !== 0) out.memoryLimitInBytes = memLimit;
  return out;
}

/**
 * A container's resource as the downward API shows it (limits.cpu,
 * requests.memory...), divided by `divisor` and rounded up; an unset limit is
 * the node's capacity.
 */
export function resourceFieldValue(c: Container, resource: string, divisor: string | number | undefined, node: NodeCapacity): string {
  const req = effectiveRequests(c);
  const lim = c.resources?.limits ?? {};
  const div = divisor === undefined || divisor === '' ? '1' : divisor;
  const ratio = (value: Fraction, d: Fraction): string => {
    if (d.num === 0n) throw new Error(`divisor of ${resource} must not be zero`);
    return String(ceilDiv(value.num * d.den, value.den * d.num));
  };
  const cpu = (v: string | undefined, fallbackMilli: number): string =>
    ratio(v !== undefined ? parseQuantity(v) : { num: BigInt(fallbackMilli), den: 1000n }, parseQuantity(div));
  const mem = (v: string | undefined, fallback: number): string =>
    ratio(v !== undefined ? parseQuantity(v) : { num: BigInt(fallback), den: 1n }, parseQuantity(div));
  switch (resource) {
    case 'limits.cpu':
      return cpu(lim.cpu !== undefined ? String(lim.cpu) : undefined, node.milliCpu);
    case 'limits.memory':
      return mem(lim.memory !== undefined ? String(lim.memory) : undefined, node.memoryBytes);
    case 'requests.cpu':
      return cpu(req.cpu, 0);
    case 'requests.memory':
      return mem(req.memory, 0);
    case 'limits.ephemeral-storage':
    case 'requests.ephemeral-storage': {
      const v = resource.startsWith('limits') ? lim['ephemeral-storage'] : req['ephemeral-storage'];
      return mem(v !== undefined ? String(v) : undefined, 0);
    }
    default:
      throw new Error(`unsupported container resource : ${resource}`);
  }
}
