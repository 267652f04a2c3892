/**
 * The kubelet's eviction manager: every monitoring period it measures the
 * node's signals (memory.available, nodefs/imagefs available and inodes
 * free, pid.available), compares them with the hard and soft thresholds
 * (the kubelet's --eviction-* flags and defaults), keeps the pressure
 * conditions (held for --eviction-pressure-transition-period after the last
 * time a threshold was met), reclaims node-level resources first for disk
 * (unused images, dead containers) and then evicts one pod per pass,
 * ranked as the kubelet ranks them. Before any of that, pods whose emptyDir
 * outgrew its sizeLimit or whose containers passed their ephemeral-storage
 * limit are evicted (the kubelet's local storage eviction).
 *
 * The measurements come from an injected source (real cgroups and statfs in
 * `node-signals.ts`, fakes in the unit tests) and time from an injected clock.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { tryParseQuantity } from './quantity.js';
import { effectiveRequests, qosClass } from './resources.js';

export const SIGNALS = ['memory.available', 'nodefs.available', 'nodefs.inodesFree', 'imagefs.available', 'imagefs.inodesFree', 'pid.available'] as const;
export type Signal = (typeof SIGNALS)[number];

/** The kubelet's --eviction-hard default on Linux. */
export const DEFAULT_EVICTION_HARD = 'memory.available<100Mi,nodefs.available<10%,imagefs.available<15%,nodefs.inodesFree<5%';
/** --eviction-pressure-transition-period's default (5m0s). */
export const DEFAULT_PRESSURE_TRANSITION_MS = 5 * 60_000;
/** The kubelet's eviction monitoring period (housekeeping, 10 s). */
export const DEFAULT_MONITOR_MS = 10_000;
/** Pods at or above this priority are critical: never evicted (scheduling.SystemCriticalPriority). */
export const SYSTEM_CRITICAL_PRIORITY = 2_000_000_000;
/** A hard eviction kills at once: the kubelet gives such pods this grace (immediateEvictionGracePeriodSeconds). */
const IMMEDIATE_GRACE_SECONDS = 1;

export type Amount = { quantity: number } | { percentage: number };

export interface Threshold {
  signal: Signal;
  value: Amount;
  /** 0 for hard thresholds. */
  gracePeriodMs: number;
  hard: boolean;
  minReclaim?: Amount;
}

export interface EvictionConfig {
  thresholds: Threshold[];
  pressureTransitionMs: number;
  /** --eviction-max-pod-grace-period: the most a soft eviction gives a pod (0: the pod's own). */
  maxPodGraceSeconds: number;
  monitorMs: number;
}

export interface EvictionFlags {
  hard?: string;
  soft?: string;
  softGracePeriod?: string;
  minimumReclaim?: string;
  pressureTransitionPeriod?: string;
  maxPodGracePeriod?: string;
}

const MAX_FLAG = 4096;

/** Go's time.ParseDuration for the forms a kubelet flag takes (1m30s, 500ms, 2h). */
export function parseDuration(text: string, flag: string): number {
  const s = text.trim();
  if (s === '0') return 0;
  const units: Record<string, number> = { ns: 1e-6, us: 1e-3, µs: 1e-3, ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  const re = /(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/y;
  let ms = 0;
  let at = 0;
  while (at < s.length) {
    re.lastIndex = at;
    const m = re.exec(s);
    if (!m) throw new Error(`${flag}: invalid duration "${text}" (write it as Go does: 30s, 1m30s, 2h)`);
    ms += Number(m[1]) * units[m[2]!]!;
    at = re.lastIndex;
  }
  if (!s.length || !Number.isFinite(ms) || ms > 365 * 86_400_000) throw new Error(`${flag}: invalid duration "${text}"`);
  return ms;
}

function parseAmount(text: string, signal: string, flag: string): Amount {
  const t = text.trim();
  if (t.endsWith('%')) {
    const p = Number(t.slice(0, -1));
    if (!Number.isFinite(p) || p < 0 || p > 100 || t.length === 1) throw new Error(`${flag}: eviction percentage threshold ${signal} must be a number from 0% to 100%, not "${t}"`);
    return { percentage: p / 100 };
  }
  const q = tryParseQuantity(t);
  if (q === undefined || q < 0 || !Number.isFinite(q)) throw new Error(`${flag}: eviction threshold ${signal} must be a quantity (100Mi, 1Gi) or a percentage, not "${t}"`);
  if (signal === 'pid.available' && !Number.isInteger(q)) throw new Error(`${flag}: pid.available must be a whole number of processes, not "${t}"`);
  return { quantity: q };
}

function isSignal(s: string): s is Signal {
  return (SIGNALS as readonly string[]).includes(s);
}

function entries(text: string, flag: string): string[] {
  if (text.length > MAX_FLAG) throw new Error(`${flag} is longer than ${MAX_FLAG} characters`);
  const list = text.split(',').map((e) => e.trim()).filter(Boolean);
  if (list.length > 32) throw new Error(`${flag} names more than 32 thresholds`);
  return list;
}

/** `signal<value` pairs, as --eviction-hard and --eviction-soft take them. */
function parseThresholdList(text: string, flag: string): Map<Signal, Amount> {
  const out = new Map<Signal, Amount>();
  for (const e of entries(text, flag)) {
    const m = /^([a-zA-Z.]+)\s*<\s*(.+)$/.exec(e);
    if (!m) throw new Error(`${flag}: invalid eviction threshold "${e}" (write signal<quantity, such as memory.available<100Mi)`);
    const signal = m[1]!;
    if (!isSignal(signal)) throw new Error(`${flag}: unsupported eviction signal ${signal} (one of ${SIGNALS.join(', ')})`);
    if (out.has(signal)) throw new Error(`${flag}: found duplicate eviction threshold for signal ${signal}`);
    out.set(signal, parseAmount(m[2]!, signal, flag));
  }
  return out;
}

/** `signal=value` pairs, as --eviction-soft-grace-period and --eviction-minimum-reclaim take them. */
function parsePairs(text: string, flag: string): Map<Signal, string> {
  const out = new Map<Signal, string>();
  for (const e of entries(text, flag)) {
    const i = e.indexOf('=');
    if (i <= 0) throw new Error(`${flag}: invalid entry "${e}" (write signal=value)`);
    const signal = e.slice(0, i).trim();
    if (!isSignal(signal)) throw new Error(`${flag}: unsupported eviction signal ${signal} (one of ${SIGNALS.join(', ')})`);
    if (out.has(signal)) throw new Error(`${flag}: ${signal} given twice`);
    out.set(signal, e.slice(i + 1).trim());
  }
  return out;
}

/**
 * The thresholds from the kubelet's flags. As the kubelet's, a given
 * --eviction-hard replaces the default set whole (a signal it leaves out
 * has no hard threshold); a soft threshold needs a grace period.
 */
export function parseEvictionConfig(f: EvictionFlags, monitorMs = DEFAULT_MONITOR_MS): EvictionConfig {
  const hard = parseThresholdList(f.hard ?? DEFAULT_EVICTION_HARD, '--eviction-hard');
  const soft = parseThresholdList(f.soft ?? '', '--eviction-soft');
  const graces = parsePairs(f.softGracePeriod ?? '', '--eviction-soft-grace-period');
  const reclaims = parsePairs(f.minimumReclaim ?? '', '--eviction-minimum-reclaim');
  const thresholds: Threshold[] = [];
  const minReclaim = (s: Signal) => {
    const r = reclaims.get(s);
    return r === undefined ? {} : { minReclaim: parseAmount(r, s, '--eviction-minimum-reclaim') };
  };
  for (const [signal, value] of hard) thresholds.push({ signal, value, gracePeriodMs: 0, hard: true, ...minReclaim(signal) });
  for (const [signal, value] of soft) {
    const g = graces.get(signal);
    if (g === undefined) throw new Error(`--eviction-soft-grace-period: grace period must be specified for the soft eviction threshold ${signal}`);
    const ms = parseDuration(g, '--eviction-soft-grace-period');
    thresholds.push({ signal, value, gracePeriodMs: ms, hard: false, ...minReclaim(signal) });
  }
  for (const s of graces.keys()) if (!soft.has(s)) throw new Error(`--eviction-soft-grace-period: grace period specified for ${s}, which has no --eviction-soft threshold`);
  const transition = f.pressureTransitionPeriod === undefined ? DEFAULT_PRESSURE_TRANSITION_MS : parseDuration(f.pressureTransitionPeriod, '--eviction-pressure-transition-period');
  const maxGrace = f.maxPodGracePeriod === undefined ? 0 : Number(f.maxPodGracePeriod);
  if (!Number.isInteger(maxGrace) || maxGrace < 0 || maxGrace > 86_400) throw new Error(`--eviction-max-pod-grace-period must be whole seconds from 0 to 86400, not "${f.maxPodGracePeriod}"`);
  return { thresholds, pressureTransitionMs: transition, maxPodGraceSeconds: maxGrace, monitorMs };
}

// ------------------------------------------------------------ observations

export interface SignalObservation {
  available: number;
  capacity: number;
}
export type Observations = Partial<Record<Signal, SignalObservation>>;

export interface ContainerUsage {
  name: string;
  /** Working set bytes. */
  memory?: number;
  /** Writable layer plus logs, bytes. */
  disk?: number;
}

export interface PodUsage {
  memory?: number;
  /** Everything the pod keeps on the node's filesystem: containers' disk and its disk-backed emptyDirs. */
  disk?: number;
  containers: ContainerUsage[];
  /** Each emptyDir's usage in bytes, by volume name. */
  emptyDirs: Map<string, number>;
}

export interface EvictionStats {
  observations: Observations;
  /** By pod uid. */
  pods: Map<string, PodUsage>;
}

export interface EvictionSource {
  stats(pods: Pod[]): Promise<EvictionStats>;
}

/** The node-level clean-ups tried before pods for disk signals. */
export interface NodeReclaimer {
  /** Removes unused images; returns the bytes freed. */
  images(): Promise<number>;
  /** Removes dead containers of running pods. */
  containers(): Promise<void>;
}

export type Condition = 'MemoryPressure' | 'DiskPressure' | 'PIDPressure';

const CONDITION_OF: Record<Signal, Condition> = {
  'memory.available': 'MemoryPressure',
  'nodefs.available': 'DiskPressure',
  'nodefs.inodesFree': 'DiskPressure',
  'imagefs.available': 'DiskPressure',
  'imagefs.inodesFree': 'DiskPressure',
  'pid.available': 'PIDPressure',
};

/** The resource an eviction message names, as the kubelet's signalToResource. */
const RESOURCE_OF: Record<Signal, string> = {
  'memory.available': 'memory',
  'nodefs.available': 'ephemeral-storage',
  'nodefs.inodesFree': 'inodes',
  'imagefs.available': 'ephemeral-storage',
  'imagefs.inodesFree': 'inodes',
  'pid.available': 'pids',
};

/** The taint the node lifecycle controller puts on a node with each condition. */
export const PRESSURE_TAINTS: Record<Condition, string> = {
  MemoryPressure: 'node.kubernetes.io/memory-pressure',
  DiskPressure: 'node.kubernetes.io/disk-pressure',
  PIDPressure: 'node.kubernetes.io/pid-pressure',
};

/** The threshold's value in the signal's units, given the capacity it is a share of. */
export function thresholdQuantity(v: Amount, capacity: number): number {
  return 'quantity' in v ? v.quantity : Math.ceil(capacity * v.percentage);
}

/** A byte count as a Kubernetes quantity prints it (binary suffixes when they divide it exactly). */
export function formatBytes(n: number): string {
  const v = Math.max(0, Math.round(n));
  if (v === 0) return '0';
  for (const [suffix, size] of [['Ei', 2 ** 60], ['Pi', 2 ** 50], ['Ti', 2 ** 40], ['Gi', 2 ** 30], ['Mi', 2 ** 20], ['Ki', 2 ** 10]] as const) {
    if (v % size === 0) return `${v / size}${suffix}`;
  }
  return String(v);
}

function formatSignal(signal: Signal, n: number): string {
  return signal === 'pid.available' || signal.endsWith('inodesFree') ? String(Math.max(0, Math.round(n))) : formatBytes(n);
}

/** Is the threshold met (with its minimum reclaim added once it has been met, until it is resolved)? */
function met(t: Threshold, obs: Observations, withReclaim: boolean): boolean {
  const o = obs[t.signal];
  if (!o) return false;
  let q = thresholdQuantity(t.value, o.capacity);
  if (withReclaim && t.minReclaim) q += thresholdQuantity(t.minReclaim, o.capacity);
  return o.available < q;
}

const key = (t: Threshold) => `${t.hard ? 'hard' : 'soft'}:${t.signal}`;

// ------------------------------------------------------------ pod ranking

const priorityOf = (p: Pod) => p.spec?.priority ?? 0;

function podRequest(pod: Pod, resource: string): number {
  // The larger of the app containers' sum and any one init container, as the scheduler counts a pod.
  const req = (c: { resources?: unknown }) => tryParseQuantity(effectiveRequests(c as Parameters<typeof effectiveRequests>[0])[resource] ?? 0) ?? 0;
  const apps = (pod.spec?.containers ?? []).reduce((s, c) => s + req(c), 0);
  const inits = Math.max(0, ...(pod.spec?.initContainers ?? []).map(req));
  return Math.max(apps, inits);
}

function usageOf(u: PodUsage | undefined, resource: 'memory' | 'disk'): number | undefined {
  return u?.[resource];
}

/**
 * The kubelet's ranking: pods whose usage exceeds their requests first,
 * then lower priority first, then the most usage above requests first. A
 * pod without stats ranks first (as the kubelet's, which cannot tell).
 */
export function rankPods(pods: Pod[], usage: Map<string, PodUsage>, resource: 'memory' | 'disk'): Pod[] {
  const req = resource === 'memory' ? 'memory' : 'ephemeral-storage';
  const info = new Map(
    pods.map((p) => {
      const u = usageOf(usage.get(p.metadata?.uid ?? ''), resource);
      const r = podRequest(p, req);
      return [p, { known: u !== undefined, exceeds: u === undefined || u > r, above: (u ?? 0) - r }] as const;
    }),
  );
  return [...pods].sort((a, b) => {
    const ia = info.get(a)!;
    const ib = info.get(b)!;
    if (ia.exceeds !== ib.exceeds) return ia.exceeds ? -1 : 1;
    if (priorityOf(a) !== priorityOf(b)) return priorityOf(a) - priorityOf(b);
    if (ia.known !== ib.known) return ia.known ? 1 : -1;
    return ib.above - ia.above;
  });
}

/** Critical pods are never evicted: the kubelet's static pods and those at system-critical priority. */
export function isCritical(pod: Pod): boolean {
  const source = pod.metadata?.annotations?.['kubernetes.io/config.source'];
  if (source !== undefined && source !== 'api') return true;
  if (pod.metadata?.annotations?.['kubernetes.io/config.mirror'] !== undefined) return true;
  return priorityOf(pod) >= SYSTEM_CRITICAL_PRIORITY;
}

// ------------------------------------------------------------ the manager

export interface EvictionDeps {
  config: EvictionConfig;
  source: EvictionSource;
  /** The pods that are running or about to (not terminal, not being deleted). */
  activePods(): Pod[];
  /** Kills the pod's containers with this grace and marks it Failed/Evicted with the message. */
  evict(pod: Pod, message: string, graceSeconds: number): Promise<void>;
  /** Records a node-level Event (EvictionThresholdMet). */
  nodeEvent?(type: 'Normal' | 'Warning', reason: string, message: string): void;
  reclaimer?: NodeReclaimer;
  now?: () => number;
  log: Logger;
  /** The pressure conditions changed. */
  onPressure?(conditions: Set<Condition>): void;
}

export interface EvictionResult {
  evicted: Array<{ pod: Pod; message: string }>;
  conditions: Set<Condition>;
}

export class EvictionManager {
  private readonly now: () => number;
  /** The thresholds met at the last pass (their minimum reclaim applies until they are resolved). */
  private metBefore: Threshold[] = [];
  private readonly firstObserved = new Map<string, number>();
  private readonly conditionLastSeen = new Map<Condition, number>();
  private current = new Set<Condition>();
  private lastObservations: Observations = {};
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<unknown> | undefined;
  private stopped = false;
  private readonly listeners = new Set<(c: Set<Condition>) => void>();

  constructor(private readonly d: EvictionDeps) {
    this.now = d.now ?? Date.now;
  }

  get thresholds(): Threshold[] {
    return this.d.config.thresholds;
  }

  /** Calls `fn` whenever the pressure conditions change. */
  onPressure(fn: (c: Set<Condition>) => void): () => void {
    this.listeners.add(fn);
    return () => this.listeners.delete(fn);
  }

  /** The pressure conditions now. */
  conditions(): Set<Condition> {
    return new Set(this.current);
  }

  observations(): Observations {
    return this.lastObservations;
  }

  /**
   * The kubelet's eviction admission: under memory pressure only pods that
   * are not BestEffort (or tolerate the memory-pressure taint) and critical
   * pods are admitted; under disk or PID pressure only critical pods and
   * those tolerating the condition's taint.
   */
  admit(pod: Pod): { reason: string; message: string } | undefined {
    if (this.current.size === 0 || isCritical(pod)) return undefined;
    const tolerates = (c: Condition) =>
      (pod.spec?.tolerations ?? []).some((t) => (t.operator === 'Exists' && !t.key) || (t.key === PRESSURE_TAINTS[c] && (t.effect === undefined || t.effect === '' || t.effect === 'NoSchedule')));
    const blocking = [...this.current].filter((c) => {
      if (tolerates(c)) return false;
      if (c === 'MemoryPressure') return qosClass(pod) === 'BestEffort';
      return true;
    });
    if (!blocking.length) return undefined;
    return { reason: 'Evicted', message: `The node had condition: [${blocking.sort().join(', ')}]. ` };
  }

  start(): () => void {
    const loop = () => {
      if (this.stopped) return;
      this.running = this.synchronize()
        .catch((err) => this.d.log.warn('eviction manager pass failed', { err: errorMessage(err) }))
        .finally(() => {
          if (this.stopped) return;
          this.timer = setTimeout(loop, this.d.config.monitorMs);
          this.timer.unref();
        });
    };
    loop();
    return () => {
      this.stopped = true;
      if (this.timer) clearTimeout(this.timer);
    };
  }

  async settled(): Promise<void> {
    await this.running;
  }

  /** One pass (the kubelet's synchronize). */
  async synchronize(): Promise<EvictionResult> {
    const pods = this.d.activePods();
    const stats = await this.d.source.stats(pods);
    const obs = stats.observations;
    this.lastObservations = obs;
    const now = this.now();
    const evicted: EvictionResult['evicted'] = [];

    // Local storage first: a pod past its own limits goes whatever the node's state.
    for (const pod of pods) {
      const message = localStorageViolation(pod, stats.pods.get(pod.metadata?.uid ?? ''));
      if (!message || isCritical(pod)) continue;
      await this.d.evict(pod, message, this.softGrace(pod, true));
      evicted.push({ pod, message });
    }

    // Thresholds met now, and those met before that are not yet past their minimum reclaim.
    const { thresholds } = this.d.config;
    const metNow = thresholds.filter((t) => met(t, obs, false));
    for (const t of this.metBefore) if (met(t, obs, true) && !metNow.some((x) => key(x) === key(t))) metNow.push(t);
    for (const k of this.firstObserved.keys()) if (!metNow.some((t) => key(t) === k)) this.firstObserved.delete(k);
    for (const t of metNow) if (!this.firstObserved.has(key(t))) this.firstObserved.set(key(t), now);

    for (const t of metNow) this.conditionLastSeen.set(CONDITION_OF[t.signal], now);
    const conditions = new Set<Condition>();
    for (const [c, at] of this.conditionLastSeen) {
      if (now - at < this.d.config.pressureTransitionMs || metNow.some((t) => CONDITION_OF[t.signal] === c)) conditions.add(c);
      else this.conditionLastSeen.delete(c);
    }
    const changed = [...conditions].sort().join() !== [...this.current].sort().join();
    for (const c of conditions) {
      if (!this.current.has(c)) this.d.log.warn('eviction manager: node condition observed', { condition: c });
    }
    this.current = conditions;
    if (changed) {
      this.d.onPressure?.(new Set(conditions));
      for (const l of this.listeners) l(new Set(conditions));
    }

    const active = metNow.filter((t) => now - this.firstObserved.get(key(t))! >= t.gracePeriodMs);
    this.metBefore = active;
    if (!active.length || evicted.length) return { evicted, conditions };

    // Memory first, then the rest in the kubelet's order; hard before soft.
    const order = (t: Threshold) => SIGNALS.indexOf(t.signal) * 2 + (t.hard ? 0 : 1);
    const t = [...active].sort((a, b) => order(a) - order(b))[0]!;
    const o = obs[t.signal]!;
    const quantity = thresholdQuantity(t.value, o.capacity);
    this.d.log.warn('eviction manager: attempting to reclaim', { signal: t.signal, threshold: formatSignal(t.signal, quantity), available: formatSignal(t.signal, o.available) });
    this.d.nodeEvent?.('Warning', 'EvictionThresholdMet', `Attempting to reclaim ${RESOURCE_OF[t.signal]}`);

    if (await this.reclaimNodeLevel(t)) return { evicted, conditions };

    const resource = t.signal === 'memory.available' ? 'memory' : 'disk';
    const candidates = rankPods(pods.filter((p) => !isCritical(p)), stats.pods, resource);
    const victim = candidates[0];
    if (!victim) {
      this.d.log.warn('eviction manager: no pod to evict; the node stays under pressure', { signal: t.signal });
      return { evicted, conditions };
    }
    const message = pressureMessage(t, quantity, o.available, victim, stats.pods.get(victim.metadata?.uid ?? ''));
    await this.d.evict(victim, message, t.hard ? IMMEDIATE_GRACE_SECONDS : this.softGrace(victim, false));
    evicted.push({ pod: victim, message });
    return { evicted, conditions };
  }

  /** Soft evictions give the pod its own grace, at most --eviction-max-pod-grace-period (when set). */
  private softGrace(pod: Pod, local: boolean): number {
    const own = pod.spec?.terminationGracePeriodSeconds ?? 30;
    if (local) return IMMEDIATE_GRACE_SECONDS;
    const max = this.d.config.maxPodGraceSeconds;
    return max > 0 ? Math.min(own, max) : own;
  }

  /** Images and dead containers for disk signals; true when that brought the signal back over its threshold. */
  private async reclaimNodeLevel(t: Threshold): Promise<boolean> {
    const r = this.d.reclaimer;
    if (!r || t.signal === 'memory.available' || t.signal === 'pid.available') return false;
    try {
      await r.containers();
      await r.images();
    } catch (err) {
      this.d.log.warn('eviction manager: node-level reclaim failed', { err: errorMessage(err) });
    }
    const again = await this.d.source.stats([]);
    this.lastObservations = { ...this.lastObservations, ...again.observations };
    const ok = !met(t, again.observations, true);
    if (ok) this.d.log.info('eviction manager: node-level reclaim was enough; no pod evicted', { signal: t.signal });
    return ok;
  }
}

/** The message of a pod evicted for a node signal, worded as the kubelet's. */
function pressureMessage(t: Threshold, quantity: number, available: number, pod: Pod, usage: PodUsage | undefined): string {
  const resource = RESOURCE_OF[t.signal];
  let msg = `The node was low on resource: ${resource}. Threshold quantity: ${formatSignal(t.signal, quantity)}, available: ${formatSignal(t.signal, available)}. `;
  if (t.signal === 'memory.available' || t.signal === 'nodefs.available' || t.signal === 'imagefs.available') {
    const reqName = t.signal === 'memory.available' ? 'memory' : 'ephemeral-storage';
    for (const c of pod.spec?.containers ?? []) {
      const used = usage?.containers.find((u) => u.name === c.name)?.[t.signal === 'memory.available' ? 'memory' : 'disk'];
      if (used === undefined) continue;
      const req = tryParseQuantity(effectiveRequests(c)[reqName] ?? 0) ?? 0;
      if (used > req) msg += `Container ${c.name} was using ${formatBytes(used)}, request is ${formatBytes(req)}, has larger consumption of ${resource}. `;
    }
  }
  return msg;
}

/**
 * The kubelet's local storage eviction: an emptyDir over its sizeLimit, a
 * container over its ephemeral-storage limit, or the pod over the sum of
 * its containers' limits. The message names what was exceeded.
 */
export function localStorageViolation(pod: Pod, usage: PodUsage | undefined): string | undefined {
  if (!usage) return undefined;
  for (const v of pod.spec?.volumes ?? []) {
    const limit = v.emptyDir?.sizeLimit;
    if (limit === undefined) continue;
    const bytes = tryParseQuantity(limit);
    const used = usage.emptyDirs.get(v.name);
    if (bytes === undefined || bytes <= 0 || used === undefined) continue;
    if (used > bytes) return `Usage of EmptyDir volume ${JSON.stringify(v.name)} exceeds the limit ${JSON.stringify(String(limit))}. `;
  }
  let total = 0;
  let allLimited = (pod.spec?.containers ?? []).length > 0;
  for (const c of pod.spec?.containers ?? []) {
    const limit = c.resources?.limits?.['ephemeral-storage'];
    if (limit === undefined) {
      allLimited = false;
      continue;
    }
    const bytes = tryParseQuantity(limit) ?? Infinity;
    total += bytes;
    const used = usage.containers.find((u) => u.name === c.name)?.disk;
    if (used !== undefined && used > bytes) return `Container ${c.name} exceeded its local ephemeral storage limit ${JSON.stringify(String(limit))}. `;
  }
  if (allLimited && usage.disk !== undefined && usage.disk > total) return `Pod ephemeral local storage usage exceeds the total limit of containers ${formatBytes(total)}. `;
  return undefined;
}
