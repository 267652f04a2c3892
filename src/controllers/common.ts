/** Small helpers every controller shares: hashes, names, pod readiness, selectors, conditions. */
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import type { LabelSelector, OwnerReference } from 'kubernetes-types/meta/v1.js';
import type { ConditionMemory, ControllerState } from './types.js';
import { keyOf, selectorMatches } from '../labels.js';

/** Consonants and digits only, as Kubernetes' generated names use, so no suffix spells a word. */
const SAFE_ALPHABET = 'bcdfghjklmnpqrstvwxz2456789';
/** Kubernetes keeps generated names at most 63 characters: a 58-character base plus 5 random. */
const MAX_NAME_BASE = 58;

/**
 * At most this many new pods from one workload in one call (upstream's
 * burstReplicas): a Deployment scaled to 100,000 grows a step per call, and
 * no call builds 100,000 pods at once. The caller calls again soon.
 */
export const CREATE_BURST = 500;
/** How soon a workload held back by CREATE_BURST wants its next call. */
export const BURST_REQUEUE_MS = 100;

/** Annotation on every pod the controllers create: when it was made (ms), for scale-down order. */
export const CREATED_ANNOTATION = 'controllers.skiff.io/created';

/** JSON with object keys sorted, so equal templates always give the same text. */
export function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v && typeof v === 'object') {
    const entries = Object.entries(v as Record<string, unknown>)
      .filter(([, x]) => x !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return `{${entries.map(([k, x]) => `${JSON.stringify(k)}:${canonicalJson(x)}`).join(',')}}`;
  }
  return JSON.stringify(v ?? null);
}

export function fnv32a(text: string): number {
  let h = 0x811c9dc5;
  const bytes = Buffer.from(text, 'utf8');
  for (const b of bytes) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** A short name-safe hash of a pod template (the pod-template-hash label). */
export function templateHash(template: unknown): string {
  let n = fnv32a(canonicalJson(template));
  let out = '';
  do {
    out = SAFE_ALPHABET[n % SAFE_ALPHABET.length] + out;
    n = Math.floor(n / SAFE_ALPHABET.length);
  } while (n > 0);
  return out;
}

/** A UUID-shaped id derived from text, for owners that have no uid of their own (virtual Jobs, ReplicaSets). */
export function derivedUid(text: string): string {
  const parts = [0, 1, 2, 3].map((i) => fnv32a(`${i}:${text}`).toString(16).padStart(8, '0')).join('');
  return `${parts.slice(0, 8)}-${parts.slice(8, 12)}-4${parts.slice(13, 16)}-8${parts.slice(17, 20)}-${parts.slice(20, 32)}`;
}

export function randomSuffix(random: () => number): string {
  let s = '';
  for (let i = 0; i < 5; i++) s += SAFE_ALPHABET[Math.min(SAFE_ALPHABET.length - 1, Math.floor(random() * SAFE_ALPHABET.length))];
  return s;
}

/**
 * `<base>-<5 random>` with the base cut to Kubernetes' limit, never a name in
 * `taken` (keys "namespace/name"), which it then joins.
 */
export function generateName(base: string, namespace: string, random: () => number, taken: Set<string>): string {
  const prefix = `${base}-`.slice(0, MAX_NAME_BASE);
  for (let i = 0; i < 100; i++) {
    const name = prefix + randomSuffix(random);
    if (!taken.has(`${namespace}/${name}`)) {
      taken.add(`${namespace}/${name}`);
      return name;
    }
  }
  // A broken random source (always the same value): fall back to a counter so names stay unique.
  for (let i = 0; ; i++) {
    const name = `${prefix}${String(i).padStart(5, '0')}`;
    if (!taken.has(`${namespace}/${name}`)) {
      taken.add(`${namespace}/${name}`);
      return name;
    }
  }
}

/** What every controller gets besides its object and its pods. */
export interface Ctx {
  now: number;
  nodeName: string;
  random: () => number;
  state: ControllerState;
  /** Every pod name in use ("namespace/name"), so new names never collide. */
  taken: Set<string>;
  /** Asks to be called again at `at` (ms since the epoch). */
  requeueAt(at: number): void;
  /** New pods one workload may make in this call (CREATE_BURST unless the caller says). */
  burst: number;
}

/** Being removed by the agent: never put back in the desired set, but still there. */
export function isTerminating(p: Pod): boolean {
  return !!p.metadata?.deletionTimestamp;
}

/** push(...items) passes every item as an argument: past about 100000 pods that overflows the stack. */
export function append<T>(out: T[], items: readonly T[]): void {
  for (const x of items) out.push(x);
}

export function iso(ms: number): string {
  return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
}

export function parseTime(v: unknown): number | undefined {
  if (typeof v !== 'string') return undefined;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : t;
}

// ---------------------------------------------------------------- pods

export const podKey: (p: Pod) => string = keyOf;

export function controllerOf(p: Pod): OwnerReference | undefined {
  return (p.metadata?.ownerReferences ?? []).find((r) => r && r.controller) ?? p.metadata?.ownerReferences?.[0];
}

export function isFinished(p: Pod): boolean {
  return p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed';
}

export function readySince(p: Pod): number | undefined {
  if (p.status?.phase !== 'Running') return undefined;
  const c = (p.status?.conditions ?? []).find((x) => x?.type === 'Ready');
  if (!c || c.status !== 'True') return undefined;
  return parseTime(c.lastTransitionTime) ?? 0;
}

export function isReady(p: Pod): boolean {
  return readySince(p) !== undefined;
}

/** Ready for at least minReadySeconds. */
export function isAvailable(p: Pod, minReadySeconds: number, now: number): boolean {
  const since = readySince(p);
  return since !== undefined && (minReadySeconds <= 0 || since + minReadySeconds * 1000 <= now);
}

/** When a Ready pod becomes available, if that is still ahead. */
export function availableAt(p: Pod, minReadySeconds: number, now: number): number | undefined {
  const since = readySince(p);
  if (since === undefined || minReadySeconds <= 0) return undefined;
  const at = since + minReadySeconds * 1000;
  return at > now ? at : undefined;
}

export function createdAt(p: Pod): number {
  const a = Number(p.metadata?.annotations?.[CREATED_ANNOTATION]);
  if (Number.isFinite(a)) return a;
  return parseTime(p.metadata?.creationTimestamp) ?? 0;
}

export function restartCount(p: Pod): number {
  let n = 0;
  for (const s of [...(p.status?.initContainerStatuses ?? []), ...(p.status?.containerStatuses ?? [])]) n += s?.restartCount ?? 0;
  return n;
}

function phaseRank(p: Pod): number {
  switch (p.status?.phase) {
    case 'Pending':
    case undefined:
      return 0;
    case 'Unknown':
      return 1;
    case 'Running':
      return 2;
    default:
      return 3;
  }
}

/**
 * The ReplicaSet controller's order for removing pods: the least useful first —
 * not yet running before running, not ready before ready, ready for less time
 * first, more restarts first, newer first.
 */
export function removalOrder(a: Pod, b: Pod): number {
  const pr = phaseRank(a) - phaseRank(b);
  if (pr !== 0) return pr;
  const ra = readySince(a);
  const rb = readySince(b);
  if ((ra === undefined) !== (rb === undefined)) return ra === undefined ? -1 : 1;
  if (ra !== undefined && rb !== undefined && ra !== rb) return rb - ra;
  const rc = restartCount(b) - restartCount(a);
  if (rc !== 0) return rc;
  const ca = createdAt(a);
  const cb = createdAt(b);
  if (ca !== cb) return cb - ca;
  const na = a.metadata?.name ?? '';
  const nb = b.metadata?.name ?? '';
  return na < nb ? -1 : na > nb ? 1 : 0;
}

/** A pod as the desired set carries it: identity, labels, owners and spec; never status. */
export function desiredCopy(p: Pod): Pod {
  const m = p.metadata ?? {};
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: m.name,
      namespace: m.namespace,
      ...(m.labels ? { labels: { ...m.labels } } : {}),
      ...(m.annotations ? { annotations: { ...m.annotations } } : {}),
      ...(m.ownerReferences ? { ownerReferences: m.ownerReferences.map((r) => ({ ...r })) } : {}),
    },
    spec: structuredClone(p.spec),
  } as Pod;
}

/** A new pod from a template, owned by `owner`. */
export function podFromTemplate(opts: {
  template: PodTemplateSpec;
  name: string;
  namespace: string;
  labels: Record<string, string>;
  owner: OwnerReference;
  now: number;
  nodeName: string;
}): Pod {
  const t = structuredClone(opts.template);
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: {
      name: opts.name,
      namespace: opts.namespace,
      labels: { ...(t.metadata?.labels ?? {}), ...opts.labels },
      annotations: { ...(t.metadata?.annotations ?? {}), [CREATED_ANNOTATION]: String(opts.now) },
      ownerReferences: [{ ...opts.owner, controller: true, blockOwnerDeletion: true }],
    },
    spec: { ...t.spec!, nodeName: opts.nodeName },
  };
}

// ---------------------------------------------------------------- selectors

export { selectorMatches };

// ---------------------------------------------------------------- conditions

export interface ConditionOut {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
  lastTransitionTime: string;
  lastUpdateTime?: string;
  lastProbeTime?: string;
}

/**
 * A condition whose lastTransitionTime moves only when its status flips (and
 * lastUpdateTime when its reason or message changes), remembered in `state`.
 */
export function condition(
  state: ControllerState,
  owner: string,
  type: string,
  status: 'True' | 'False' | 'Unknown',
  reason: string,
  message: string,
  now: number,
): ConditionMemory & { type: string; message: string } {
  const key = `${owner}/${type}`;
  const prev = state.conditions[key];
  const next: ConditionMemory = {
    status,
    reason,
    lastTransitionTime: prev && prev.status === status ? prev.lastTransitionTime : now,
    lastUpdateTime: prev && prev.status === status && prev.reason === reason ? prev.lastUpdateTime : now,
  };
  state.conditions[key] = next;
  return { ...next, type, message };
}

// ---------------------------------------------------------------- int-or-percent

/** An IntOrString as Kubernetes scales it: percentages of `total`, rounded up or down. */
export function scaledValue(v: number | string | undefined, total: number, roundUp: boolean, dflt: string): number | undefined {
  const raw = v ?? dflt;
  if (typeof raw === 'number') return Number.isInteger(raw) && raw >= 0 ? raw : undefined;
  const m = /^(\d+)%$/.exec(raw);
  if (m) {
    const x = (Number(m[1]) * total) / 100;
    return roundUp ? Math.ceil(x) : Math.floor(x);
  }
  if (/^\d+$/.test(raw)) return Number(raw);
  return undefined;
}
