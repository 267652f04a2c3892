/**
 * The prober manager, as the kubelet's pkg/kubelet/prober: one worker per
 * (pod, container, probe kind) for a running container, each probing on its
 * own timer and keeping a cached result with the kubelet's semantics:
 *
 * - readiness starts as failure, liveness as success, startup as unknown;
 * - a result is cached only after successThreshold / failureThreshold runs
 *   in a row; an 'unknown' run (the probe could not run) is thrown away;
 * - while a startup probe has not succeeded, liveness and readiness do not
 *   run; once it has, the startup probe stops and readiness runs at once;
 * - a liveness or startup result of failure is reported and the worker
 *   holds (probes no more) until the container is replaced: killing and
 *   restarting it is the pod worker's job, not the prober's.
 *
 * The manager only reports (onResult); it never acts on containers.
 */
import type { Container, Probe } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import type { ProbeKind, ProbeOutcome, ProbeResult, ProbeRunner, ProbeTarget } from './model.js';
import { timerMs } from './probes.js';

/** Time and chance, injected so tests run on fake time (STYLE: inject the world). */
export interface ProberClock {
  now(): number;
  /** Must not keep the process alive (unref'd). */
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
  /** In [0, 1). */
  random(): number;
}

export const realClock: ProberClock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
  random: () => Math.random(),
};

export interface ProbeResultEvent {
  podUid: string;
  container: string;
  containerId: string;
  kind: ProbeKind;
  result: ProbeResult;
  /** The last run's message (what failed, for an Unhealthy event). */
  message: string;
  /** The cached result changed; false for a repeated liveness/startup failure report. */
  changed: boolean;
  /** The run was a success the kubelet reports as a ProbeWarning. */
  warning?: boolean;
}

export interface ProberOptions {
  runner: ProbeRunner;
  /** Called when a cached result changes, and on each liveness/startup failure reaching the threshold. Must not throw. */
  onResult: (e: ProbeResultEvent) => void;
  clock?: ProberClock;
  /** Where a throwing onResult is reported. */
  log?: (msg: string) => void;
}

/** A container that has just started (or was found running), with what its probes need. */
export interface RunningContainer {
  podUid: string;
  target: ProbeTarget;
  /** When the container started (ms since the epoch): initialDelaySeconds counts from here. */
  startedAt: number;
  /**
   * Results to start from instead of the kubelet's initial ones: what an earlier agent last
   * saw for this same container (by ID), so that restarting the agent does not take every
   * Ready pod out of its Services until its probes have run again.
   */
  initial?: Partial<Record<ProbeKind, ProbeResult>>;
}

const KINDS: ProbeKind[] = ['startup', 'liveness', 'readiness'];

const INITIAL: Record<ProbeKind, ProbeResult> = { readiness: 'failure', liveness: 'success', startup: 'unknown' };

function probeOf(c: Container, kind: ProbeKind): Probe | undefined {
  switch (kind) {
    case 'liveness':
      return c.livenessProbe;
    case 'readiness':
      return c.readinessProbe;
    case 'startup':
      return c.startupProbe;
  }
}

/** A probe's settings with the API server's defaults, for a pod that somehow lacks them. */
function settings(p: Probe) {
  const pos = (v: number | undefined, d: number) => (v !== undefined && v > 0 ? v : d);
  return {
    initialDelayMs: Math.max(0, p.initialDelaySeconds ?? 0) * 1000,
    periodMs: pos(p.periodSeconds, 10) * 1000,
    successThreshold: pos(p.successThreshold, 1),
    failureThreshold: pos(p.failureThreshold, 3),
  };
}

interface ContainerEntry {
  containerId: string;
  workers: Map<ProbeKind, Worker>;
}

class Worker {
  cached: ProbeResult;
  private lastResult: ProbeResult | undefined;
  private resultRun = 0;
  private stopped = false;
  private timer: unknown;
  private nextAt = 0;
  private inflight: AbortController | undefined;
  private readonly s: ReturnType<typeof settings>;

  constructor(
    private readonly m: ProberManager,
    private readonly clock: ProberClock,
    readonly podUid: string,
    readonly kind: ProbeKind,
    private readonly spec: Probe,
    private readonly target: ProbeTarget,
    private readonly entry: ContainerEntry,
    initial?: ProbeResult,
  ) {
    this.cached = initial ?? INITIAL[kind];
    this.s = settings(spec);
  }

  get periodMs(): number {
    return this.s.periodMs;
  }

  start(startedAt: number, jitterMs: number): void {
    const now = this.clock.now();
    this.nextAt = Math.max(now, startedAt + this.s.initialDelayMs) + jitterMs;
    this.arm();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.inflight?.abort();
    this.inflight = undefined;
  }

  /** Probe now (readiness, right after the startup probe passes), unless a run is under way. */
  trigger(): void {
    if (this.stopped || this.inflight) return;
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.nextAt = this.clock.now();
    void this.tick();
  }

  /** The pod is going away: liveness and startup end quietly as success (the kubelet's graceful shutdown). */
  quiet(): void {
    this.stop();
    this.set('success', '', false);
  }

  private arm(): void {
    if (this.stopped) return;
    // A period or initial delay past what a timer takes is waited for in steps (see tick).
    this.timer = this.clock.setTimeout(() => {
      this.timer = undefined;
      void this.tick();
    }, timerMs(this.nextAt - this.clock.now()));
  }

  /**
   * The next tick one period on. A run that overran its period is followed
   * by one at once and then the ticks go on from where they would have been,
   * as a ticker that drops the ticks nobody took.
   */
  private schedule(): void {
    this.nextAt += this.s.periodMs;
    const now = this.clock.now();
    if (this.nextAt < now) this.nextAt += Math.floor((now - this.nextAt) / this.s.periodMs) * this.s.periodMs;
    this.arm();
  }

  private async tick(): Promise<void> {
    if (this.stopped) return;
    // Woken before its time (a long delay waited for in steps): not yet.
    if (this.clock.now() < this.nextAt) return this.arm();
    if (this.shouldRun()) await this.run();
    if (!this.stopped) this.schedule();
  }

  private shouldRun(): boolean {
    const started = this.m.started(this.podUid, this.target.container.name);
    // Startup probes stop once the container has started; the others wait for it.
    return this.kind === 'startup' ? !started : started;
  }

  private async run(): Promise<void> {
    const ac = new AbortController();
    this.inflight = ac;
    let o: ProbeOutcome;
    try {
      o = await this.m.runner.probe(this.spec, this.target, ac.signal);
    } catch (err) {
      o = { result: 'unknown', message: errorMessage(err) };
    }
    if (this.inflight === ac) this.inflight = undefined;
    // Removed while it ran: the result belongs to no one.
    if (this.stopped || ac.signal.aborted) return;
    if (o.result === 'unknown') return;
    if (this.lastResult === o.result) this.resultRun++;
    else {
      this.lastResult = o.result;
      this.resultRun = 1;
    }
    if ((o.result === 'failure' && this.resultRun < this.s.failureThreshold) || (o.result === 'success' && this.resultRun < this.s.successThreshold)) return;
    const failedHard = o.result === 'failure' && (this.kind === 'liveness' || this.kind === 'startup');
    this.set(o.result, o.message, failedHard, o.warning);
    if (failedHard) {
      // Hold until the container is replaced (a new addContainer): no exec into a container being killed.
      this.resultRun = 0;
      this.stop();
    }
  }

  private set(result: ProbeResult, message: string, alwaysReport: boolean, warning?: boolean): void {
    const changed = this.cached !== result;
    this.cached = result;
    if (changed || alwaysReport) {
      this.m.report({
        podUid: this.podUid,
        container: this.target.container.name,
        containerId: this.entry.containerId,
        kind: this.kind,
        result,
        message,
        changed,
        ...(warning ? { warning } : {}),
      });
    }
    if (changed && this.kind === 'startup' && result === 'success') this.entry.workers.get('readiness')?.trigger();
  }
}

export class ProberManager {
  readonly runner: ProbeRunner;
  private readonly clock: ProberClock;
  private readonly createdAt: number;
  private readonly pods = new Map<string, Map<string, ContainerEntry>>();

  constructor(private readonly o: ProberOptions) {
    this.runner = o.runner;
    this.clock = o.clock ?? realClock;
    this.createdAt = this.clock.now();
  }

  /**
   * Starts probing a running container: a worker for each probe it has.
   * Idempotent for the same container ID; a new ID (a restart) replaces the
   * old workers and starts over from the initial results.
   */
  addContainer(c: RunningContainer): void {
    const name = c.target.container.name;
    let containers = this.pods.get(c.podUid);
    const old = containers?.get(name);
    if (old?.containerId === c.target.containerId) return;
    if (old) for (const w of old.workers.values()) w.stop();
    const entry: ContainerEntry = { containerId: c.target.containerId, workers: new Map() };
    for (const kind of KINDS) {
      const spec = probeOf(c.target.container, kind);
      if (spec) entry.workers.set(kind, new Worker(this, this.clock, c.podUid, kind, spec, c.target, entry, c.initial?.[kind]));
    }
    if (!containers) {
      containers = new Map();
      this.pods.set(c.podUid, containers);
    }
    if (entry.workers.size === 0) {
      containers.delete(name);
      if (containers.size === 0) this.pods.delete(c.podUid);
      return;
    }
    containers.set(name, entry);
    for (const w of entry.workers.values()) w.start(c.startedAt, this.jitter(c.startedAt, w));
  }

  /**
   * The kubelet spreads the first probes of the containers it finds running
   * when it (re)starts over a period; a container that starts later gets a
   * small jitter only (at most a tenth of its period, and 1 s).
   */
  private jitter(startedAt: number, w: Worker): number {
    const periodMs = w.periodMs;
    const now = this.clock.now();
    if (startedAt < this.createdAt && now - this.createdAt < periodMs) return this.clock.random() * periodMs;
    return this.clock.random() * Math.min(periodMs / 10, 1000);
  }

  /** The container stopped (or is being killed): its workers and results go. */
  removeContainer(podUid: string, container: string): void {
    const containers = this.pods.get(podUid);
    const entry = containers?.get(container);
    if (!entry) return;
    for (const w of entry.workers.values()) w.stop();
    containers!.delete(container);
    if (containers!.size === 0) this.pods.delete(podUid);
  }

  /** The pod is gone: every worker stops and every run in flight is abandoned. */
  removePod(podUid: string): void {
    const containers = this.pods.get(podUid);
    if (!containers) return;
    for (const entry of containers.values()) for (const w of entry.workers.values()) w.stop();
    this.pods.delete(podUid);
  }

  /**
   * The pod is shutting down: liveness and startup end as success so nothing
   * restarts a container that is being stopped; readiness goes on (a
   * terminating pod reports itself unready when its probe says so).
   */
  podTerminating(podUid: string): void {
    for (const entry of this.pods.get(podUid)?.values() ?? []) {
      for (const kind of ['liveness', 'startup'] as const) entry.workers.get(kind)?.quiet();
    }
  }

  stopAll(): void {
    for (const uid of [...this.pods.keys()]) this.removePod(uid);
  }

  /** The cached result of one probe, or undefined when the container has no such probe (or is not being probed). */
  result(podUid: string, container: string, kind: ProbeKind): ProbeResult | undefined {
    return this.pods.get(podUid)?.get(container)?.workers.get(kind)?.cached;
  }

  /**
   * The kubelet's `started` for a container the caller knows to be running:
   * true without a startup probe, else once the startup probe has succeeded.
   */
  started(podUid: string, container: string): boolean {
    const r = this.result(podUid, container, 'startup');
    return r === undefined || r === 'success';
  }

  /**
   * The kubelet's `ready` for a container the caller knows to be running:
   * started, and its readiness probe's cached result is success (without a
   * readiness probe, ready as soon as started).
   */
  ready(podUid: string, container: string): boolean {
    if (!this.started(podUid, container)) return false;
    const r = this.result(podUid, container, 'readiness');
    return r === undefined || r === 'success';
  }

  /** How many workers run (for tests and the status view). */
  workerCount(): number {
    let n = 0;
    for (const containers of this.pods.values()) for (const e of containers.values()) n += e.workers.size;
    return n;
  }

  /** @internal */
  report(e: ProbeResultEvent): void {
    try {
      this.o.onResult(e);
    } catch (err) {
      this.o.log?.(`probe result callback failed: ${errorMessage(err)}`);
    }
  }
}
