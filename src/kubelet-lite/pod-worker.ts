/**
 * One worker per pod (the kubelet's pod_workers): updates to a pod are
 * coalesced and synced one at a time, so no two syncs of a pod race. A sync
 * observes the runtime, asks computePodActions what to do, and does it:
 * kill, make the sandbox, pull, create and start, then reports the status.
 */
import type { PodNetworkReady } from './pod-network.js';
import fs from 'node:fs/promises';
import { closeSync } from 'node:fs';
import path from 'node:path';
import type { Container, LifecycleHandler, Pod, PodStatus } from 'kubernetes-types/core/v1.js';
import type { PodSandboxConfig } from '../gen/runtime/v1/PodSandboxConfig.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { computePodActions, type KillAction, type ProbeView, type StartAction } from './actions.js';
import type { Backoff } from './backoff.js';
import { containerLogIn } from './cri-config.js';
import { openLogDir, openLogFile } from './log-files.js';
import { readTerminationLog, removeTerminationLog } from './termination-log.js';
import { isNotFound, type CriEndpoint } from './cri-client.js';
import { grpcDetails, type ImageManager } from './images.js';
import { ContainerConfigError, type ConfigBuilder, type PodContext, type ProbeTarget, type VolumeManager } from './model.js';
import { buildPodStatus, iso, type Waiting } from './pod-status.js';
import type { ObservedContainer, ObservedPod, RuntimeObserver } from './runtime-state.js';

export type EventType = 'Normal' | 'Warning';

/** Where the worker records Kubernetes events. */
export interface EventSink {
  record(pod: Pod, type: EventType, reason: string, message: string, container?: string): void;
}

/** What the worker needs from the prober manager. */
export interface ProberPort {
  addContainer(pod: Pod, container: Container, target: ProbeTarget, startedAt: number): void;
  removeContainer(uid: string, name: string): void;
  removePod(uid: string): void;
  ready(uid: string, name: string): boolean;
  started(uid: string, name: string): boolean;
  /** Why a container must be killed (liveness or startup failed), or undefined. */
  unhealthy(uid: string, name: string): string | undefined;
  /** The container was killed for being unhealthy: forget that verdict. */
  clearUnhealthy(uid: string, name: string): void;
}

export interface HookRunner {
  /** `signal` ends the hook early (the pod is being deleted). */
  (handler: LifecycleHandler, target: ProbeTarget, timeoutMs: number, signal?: AbortSignal): Promise<{ ok: boolean; message: string }>;
}

export interface WorkerDeps {
  cri: CriEndpoint;
  observer: RuntimeObserver;
  builder: ConfigBuilder;
  volumes: VolumeManager;
  prober: ProberPort;
  hooks: HookRunner;
  images: ImageManager;
  backoff: Backoff;
  events: EventSink;
  log: Logger;
  runtimeName: () => string;
  qosClass: (pod: Pod) => string;
  terminationLogPath: (podDir: string, name: string, restartCount: number) => string;
  /**
   * User namespaces for `hostUsers: false` pods: `prepare` checks the runtime
   * can make one and gives the pod its id range (throws with the reason
   * otherwise); `release` gives the range back once the pod is gone.
   * Without it such a pod never runs.
   */
  userns?: {
    prepare(pod: Pod, uid: string): Promise<{ hostId: number; length: number }>;
    release(uid: string): Promise<void>;
  };
  now: () => number;
  /** Called after every sync with the pod's new status. */
  onStatus: (uid: string, pod: Pod, status: PodStatus) => void;
  /** Called when a container the worker started began running (for metrics). */
  onStarted?: (pod: Pod, container: string, restart: boolean) => void;
  /** Called once when every container of the pod first runs. */
  onPodRunning?: (pod: Pod, latencyMs: number) => void;
  /** Before the sandbox's containers start (see pod-network.ts). */
  podNetworkReady?: PodNetworkReady;
}

/** A sync that failed is retried after this long (the kubelet retries on its next resync). */
const RETRY_MS = 2_000;
/** A pod with nothing to wait for is still synced this often, as the kubelet's resync. */
const RESYNC_MS = 60_000;
const TERMINATION_MESSAGE_MAX = 4096;
/** The kubelet's minimumGracePeriodInSeconds: a deletion's shorter grace still gets this long. */
const MIN_GRACE_SECONDS = 2;

export class PodWorker {
  private desired: PodContext | undefined;
  /** Aborted when the pod is deleted: what a sync waits on for the pod's sake (a postStart hook) stops waiting. */
  private deleting = new AbortController();
  private sandboxConfig: PodSandboxConfig | undefined;
  private sandboxId = '';
  /** The sandbox whose address the node's network fence has (podNetworkReady). */
  private fencedSandbox = '';
  private etcHosts: string | undefined;
  private volumePaths: Map<string, string> | undefined;
  private readonly waiting = new Map<string, Waiting>();
  private readonly messages = new Map<string, string>();
  private podMessage: { reason: string; message: string } | undefined;
  status: PodStatus | undefined;
  private busy = false;
  private dirty = false;
  private timer: NodeJS.Timeout | undefined;
  private timerAt = 0;
  private terminated = false;
  private graceOverride: number | undefined;
  private halted = false;
  private refreshVolumes = false;
  private readonly createdAt: number;
  private reportedRunning = false;
  private idle: Array<() => void> = [];
  /** The pod the worker last ran, kept for events and status after deletion. */
  private lastPod: Pod | undefined;
  /** Set once the eviction manager evicted the pod: its containers stop for good, its phase is Failed. */
  private evicted: { message: string; graceSeconds: number } | undefined;
  private emptiedDirs = false;

  constructor(
    readonly uid: string,
    private readonly deps: WorkerDeps,
    ctx: PodContext | undefined,
  ) {
    this.desired = ctx;
    this.lastPod = ctx?.pod;
    this.createdAt = deps.now();
  }

  get pod(): Pod | undefined {
    return this.lastPod;
  }

  get isTerminated(): boolean {
    return this.terminated;
  }

  /** A new desired state: the pod (same uid, e.g. a ConfigMap it uses changed) or undefined to stop it. */
  update(ctx: PodContext | undefined, opts: { refreshVolumes?: boolean } = {}): void {
    this.desired = ctx;
    if (!ctx) this.deleting.abort();
    else if (this.deleting.signal.aborted) this.deleting = new AbortController();
    if (ctx) this.lastPod = ctx.pod;
    if (opts.refreshVolumes) this.refreshVolumes = true;
    this.schedule(0);
  }

  /**
   * The grace the API's deletion gives (metadata.deletionGracePeriodSeconds,
   * `kubectl delete --grace-period`): it wins over the spec's when the pod is
   * stopped, as in the kubelet, at least the kubelet's 2 s. Only ever shortened.
   */
  deletionGrace(seconds: number): void {
    this.graceOverride = Math.min(this.graceOverride ?? Infinity, Math.max(seconds, MIN_GRACE_SECONDS));
  }

  /**
   * The eviction manager evicts the pod: its containers are killed with
   * this grace and never started again, the sandbox stopped, and the pod
   * shown Failed with reason Evicted and the message, as the kubelet's.
   */
  evict(message: string, graceSeconds: number): void {
    if (this.evicted || this.terminated) return;
    this.evicted = { message, graceSeconds };
    this.event('Warning', 'Evicted', message);
    this.schedule(0);
  }

  get isEvicted(): boolean {
    return this.evicted !== undefined;
  }

  /** Stops scheduling syncs (the agent is shutting down; its pods keep running). */
  halt(): void {
    this.halted = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  /** Resolves once the worker has nothing left to do (used after termination). */
  settled(): Promise<void> {
    if (this.terminated || (!this.busy && !this.dirty)) return Promise.resolve();
    return new Promise((resolve) => this.idle.push(resolve));
  }

  schedule(delayMs: number): void {
    if (this.terminated || this.halted) return;
    if (delayMs <= 0) {
      if (this.timer) clearTimeout(this.timer);
      this.timer = undefined;
      this.dirty = true;
      if (!this.busy) void this.loop();
      return;
    }
    const at = this.deps.now() + delayMs;
    if (this.timer && this.timerAt <= at) return;
    if (this.timer) clearTimeout(this.timer);
    this.timerAt = at;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.schedule(0);
    }, delayMs);
    this.timer.unref();
  }

  private async loop(): Promise<void> {
    this.busy = true;
    try {
      while (this.dirty && !this.terminated) {
        this.dirty = false;
        let next = RESYNC_MS;
        try {
          next = this.desired ? await this.sync(this.desired) : (await this.terminate(), 0);
        } catch (err) {
          this.deps.log.warn('pod sync failed', { pod: this.name(), err: errorMessage(err) });
          next = RETRY_MS;
        }
        if (next > 0) this.schedule(next);
      }
    } finally {
      this.busy = false;
      if (!this.dirty || this.terminated) {
        const waiters = this.idle;
        this.idle = [];
        for (const w of waiters) w();
      }
    }
  }

  private name(): string {
    const m = this.lastPod?.metadata;
    return `${m?.namespace ?? ''}/${m?.name ?? this.uid}`;
  }

  private event(type: EventType, reason: string, message: string, container?: string): void {
    if (this.lastPod) this.deps.events.record(this.lastPod, type, reason, message, container);
  }

  private probeView(): ProbeView {
    return {
      unhealthy: (n) => this.deps.prober.unhealthy(this.uid, n),
      started: (n) => this.deps.prober.started(this.uid, n),
    };
  }

  /** One sync; returns when the worker wants to look again (ms). */
  private async sync(ctx: PodContext): Promise<number> {
    const { cri, observer, now } = this.deps;
    const pod = ctx.pod;
    if (this.evicted) return this.syncEvicted(ctx, this.evicted);
    let observed = await observer.observe(this.uid);
    await this.readTerminationMessages(ctx, observed);
    const actions = computePodActions(pod, observed, this.probeView());
    let changed = false;
    let wakeAt = Infinity;

    for (const k of actions.kill) {
      await this.kill(ctx, k, k.graceSeconds ?? pod.spec?.terminationGracePeriodSeconds ?? 30);
      changed = true;
    }
    if (actions.createSandbox || actions.removeSandboxes.length) {
      for (const id of actions.removeSandboxes) await this.removeSandbox(id);
      changed = true;
    }

    let sandbox = observed.sandboxes[0];
    if (actions.createSandbox) {
      if (!(await this.makeSandbox(ctx, actions.sandboxAttempt))) return RETRY_MS * 2;
      observed = await observer.observe(this.uid);
      sandbox = observed.sandboxes[0];
      changed = false;
    }
    if (sandbox && sandbox.id !== this.sandboxId) {
      // Adopted (the agent restarted) or new: learn its config and write the pod's files.
      this.sandboxId = sandbox.id;
      this.sandboxConfig = this.deps.builder.sandboxConfig(ctx, sandbox.attempt);
      this.etcHosts = undefined;
    }
    if (sandbox?.ready) {
      ctx.podIP = sandbox.ip;
      // Containers found running (an adopted pod, or started by a sync that failed half-way) are probed too.
      for (const c of observed.containers) {
        if (c.state !== 'running' || c.sandboxId !== sandbox.id) continue;
        const spec = this.containerSpec(pod, c.name);
        if (spec) this.deps.prober.addContainer(pod, spec, { containerId: c.id, podIP: sandbox.ip, container: spec }, c.startedAt || now());
      }
      if (this.refreshVolumes) {
        this.refreshVolumes = false;
        await this.deps.volumes.refresh(ctx).catch((err) => this.event('Warning', 'FailedMount', `failed to refresh volumes: ${errorMessage(err)}`));
      }
    }

    if (actions.terminal) {
      if (sandbox?.ready) {
        await this.stopSandbox(sandbox.id);
        changed = true;
      }
    } else if (sandbox?.ready) {
      if (!this.etcHosts) {
        try {
          this.volumePaths = await this.deps.volumes.setUp(ctx);
          this.etcHosts = await this.deps.volumes.writeEtcHosts(ctx);
          this.podMessage = undefined;
        } catch (err) {
          this.podMessage = { reason: 'FailedMount', message: errorMessage(err) };
          this.event('Warning', 'FailedMount', `MountVolume.SetUp failed: ${errorMessage(err)}`);
          this.report(ctx, observed);
          return RETRY_MS * 2;
        }
      }
      // The pod's network rules hold its address before any container of it runs (NetworkPolicy).
      if (this.deps.podNetworkReady && this.fencedSandbox !== sandbox.id && actions.start.length > 0 && !pod.spec?.hostNetwork) {
        try {
          await this.deps.podNetworkReady(pod, sandbox.ip);
          this.fencedSandbox = sandbox.id;
          if (this.podMessage?.reason === 'NetworkNotReady') this.podMessage = undefined;
        } catch (err) {
          this.podMessage = { reason: 'NetworkNotReady', message: `network policy rules for the pod could not be written: ${errorMessage(err)}` };
          this.event('Warning', 'NetworkNotReady', this.podMessage.message);
          this.report(ctx, observed);
          return RETRY_MS * 2;
        }
      }
      for (const s of actions.start) {
        // A newer desired state (the pod deleted or edited) wins over the rest of this start: a
        // pod of many containers removed half-way is not started to the end and then torn down.
        if (this.desired !== ctx) break;
        const r = await this.start(ctx, sandbox.id, s);
        if (r === 'started') changed = true;
        else if (typeof r === 'number') wakeAt = Math.min(wakeAt, r);
        // Init containers run one at a time; the rest start together.
        if (s.kind === 'init') break;
      }
    }

    const seen = observed.containers;
    for (const id of actions.remove) {
      await cri.runtime.removeContainer({ containerId: id }).catch((err) => {
        if (!isNotFound(err)) this.deps.log.warn('failed to remove a dead container', { pod: this.name(), id, err: grpcDetails(err) });
      });
      observer.forget([id]);
      await this.forgetDead(ctx, seen, id);
    }

    if (changed) {
      observed = await observer.observe(this.uid);
      // A container may have exited meanwhile: its message belongs in the status it first shows in.
      await this.readTerminationMessages(ctx, observed);
    }
    this.report(ctx, observed);
    return Number.isFinite(wakeAt) ? Math.max(50, wakeAt - now()) : RESYNC_MS;
  }

  /** An evicted pod's sync: whatever still runs is stopped, and the status says why. */
  private async syncEvicted(ctx: PodContext, ev: { message: string; graceSeconds: number }): Promise<number> {
    const { observer } = this.deps;
    let observed = await observer.observe(this.uid);
    const live = observed.containers.filter((c) => c.state === 'running' || c.state === 'created');
    const apps = live.filter((c) => c.kind !== 'sidecar');
    await Promise.all(apps.map((c) => this.kill(ctx, { id: c.id, name: c.name, reason: `Stopping container ${c.name}`, remove: false }, ev.graceSeconds)));
    for (const c of live.filter((x) => x.kind === 'sidecar').reverse()) await this.kill(ctx, { id: c.id, name: c.name, reason: `Stopping container ${c.name}`, remove: false }, ev.graceSeconds);
    for (const sb of observed.sandboxes) if (sb.ready) await this.stopSandbox(sb.id);
    if (live.length || observed.sandboxes.some((sb) => sb.ready)) observed = await observer.observe(this.uid);
    if (!this.emptiedDirs) {
      // Nothing runs in the pod any more: its emptyDirs' space (and a tmpfs's memory) is given back.
      await this.deps.volumes.emptyEmptyDirs?.(ctx).catch((err) => this.deps.log.warn('could not empty an evicted pod\'s emptyDirs', { pod: this.name(), err: errorMessage(err) }));
      this.emptiedDirs = true;
    }
    await this.readTerminationMessages(ctx, observed);
    this.podMessage = { reason: 'Evicted', message: ev.message };
    this.report(ctx, observed, false, ev.message);
    return RESYNC_MS;
  }

  private report(ctx: PodContext, observed: ObservedPod, terminating = false, evictedMessage?: string): void {
    const pod = ctx.pod;
    const firstSandbox = observed.sandboxes[observed.sandboxes.length - 1];
    const status = buildPodStatus({
      pod,
      observed,
      waiting: this.waiting,
      ready: (n) => this.deps.prober.ready(this.uid, n),
      started: (n) => this.deps.prober.started(this.uid, n),
      terminationMessage: (c) => this.messages.get(c.id),
      runtimeName: this.deps.runtimeName(),
      hostIP: ctx.hostIP,
      qosClass: this.deps.qosClass(pod),
      startTime: firstSandbox?.createdAt || this.createdAt,
      previous: this.status,
      podMessage: this.podMessage,
      terminating,
      now: this.deps.now(),
    });
    if (evictedMessage !== undefined) {
      // As the kubelet's evictPod: Failed whatever the containers say, with the kubelet's DisruptionTarget condition.
      status.phase = 'Failed';
      const prev = this.status?.conditions?.find((c) => c.type === 'DisruptionTarget');
      const target = { type: 'DisruptionTarget', status: 'True', reason: 'TerminationByKubelet', message: evictedMessage, lastTransitionTime: prev?.lastTransitionTime ?? iso(this.deps.now()) };
      status.conditions = [...(status.conditions ?? []).filter((c) => c.type !== 'DisruptionTarget').map((c) => (c.type === 'Ready' || c.type === 'ContainersReady' ? { ...c, status: 'False', reason: 'PodCompleted', message: undefined } : c)), target];
      for (const c of status.conditions) if (c.message === undefined) delete c.message;
    }
    this.status = status;
    if (!this.reportedRunning && status.phase === 'Running' && status.containerStatuses?.every((c) => c.state?.running)) {
      this.reportedRunning = true;
      this.deps.onPodRunning?.(pod, this.deps.now() - this.createdAt);
    }
    this.deps.onStatus(this.uid, pod, status);
  }

  private async makeSandbox(ctx: PodContext, attempt: number): Promise<boolean> {
    if (ctx.pod.spec?.hostUsers === false) {
      try {
        if (!this.deps.userns) throw new Error("can't set `spec.hostUsers: false`: this agent has no user namespace allocator");
        ctx.userns = await this.deps.userns.prepare(ctx.pod, this.uid);
      } catch (err) {
        // As the kubelet: the sandbox config cannot be made; the pod waits and is tried again.
        const message = `Failed to generate sandbox config for pod: ${errorMessage(err)}`;
        this.podMessage = { reason: 'CreatePodSandboxConfigError', message };
        this.event('Warning', 'CreatePodSandboxConfigError', message);
        this.report(ctx, { sandboxes: [], containers: [] });
        return false;
      }
    }
    try {
      await this.deps.volumes.setUp(ctx);
    } catch (err) {
      this.podMessage = { reason: 'FailedMount', message: errorMessage(err) };
      this.event('Warning', 'FailedMount', `MountVolume.SetUp failed: ${errorMessage(err)}`);
      this.report(ctx, { sandboxes: [], containers: [] });
      return false;
    }
    const config = this.deps.builder.sandboxConfig(ctx, attempt);
    try {
      const r = await this.deps.cri.runtime.runPodSandbox({ config, runtimeHandler: ctx.pod.spec?.runtimeClassName ?? '' });
      this.sandboxId = r.podSandboxId;
      this.sandboxConfig = config;
      this.etcHosts = undefined;
      this.podMessage = undefined;
      if (attempt > 0) this.event('Normal', 'SandboxChanged', 'Pod sandbox changed, it will be killed and re-created.');
      return true;
    } catch (err) {
      const message = `Failed to create pod sandbox: ${grpcDetails(err)}`;
      this.podMessage = { reason: 'FailedCreatePodSandBox', message };
      this.event('Warning', 'FailedCreatePodSandBox', message);
      this.report(ctx, await this.deps.observer.observe(this.uid).catch(() => ({ sandboxes: [], containers: [] })));
      return false;
    }
  }

  private async stopSandbox(id: string): Promise<void> {
    await this.deps.cri.runtime.stopPodSandbox({ podSandboxId: id }).catch((err) => {
      if (!isNotFound(err)) throw err;
    });
  }

  private async removeSandbox(id: string): Promise<void> {
    await this.stopSandbox(id);
    await this.deps.cri.runtime.removePodSandbox({ podSandboxId: id }).catch((err) => {
      if (!isNotFound(err)) throw err;
    });
    this.deps.observer.forget([id]);
  }

  /** Starts one container; returns 'started', the time to try again, or 'skipped'. */
  private async start(ctx: PodContext, sandboxId: string, s: StartAction): Promise<'started' | 'skipped' | number> {
    const { cri, backoff, now } = this.deps;
    const name = s.container.name;
    const key = `${this.uid}/${name}`;
    if (s.lastFinishedAt > 0) {
      const until = backoff.blockedUntil(key, s.lastFinishedAt, now());
      if (until !== undefined) {
        const secs = Math.round(backoff.delay(key, now()) / 1000);
        const message = `back-off ${secs >= 60 ? `${Math.floor(secs / 60)}m${secs % 60}s` : `${secs}s`} restarting failed container=${name} pod=${ctx.pod.metadata?.name}_${ctx.pod.metadata?.namespace}(${this.uid})`;
        if (this.waiting.get(name)?.reason !== 'CrashLoopBackOff') this.event('Warning', 'BackOff', 'Back-off restarting failed container', name);
        this.waiting.set(name, { reason: 'CrashLoopBackOff', message });
        return until;
      }
    }
    const sandboxConfig = this.sandboxConfig ?? this.deps.builder.sandboxConfig(ctx, 0);
    const image = await this.deps.images.ensure(ctx.pod, s.container, sandboxConfig, (type, reason, message) => this.event(type, reason, message, name), ctx.objects);
    // A pull can take minutes: the pod may have been deleted meanwhile.
    if (this.desired !== ctx) return 'skipped';
    if (!image.ok) {
      this.waiting.set(name, { reason: image.reason, message: image.message });
      return now() + (image.reason === 'ErrImageNeverPull' ? RESYNC_MS : 5_000);
    }
    let config;
    const warnings: string[] = [];
    try {
      config = this.deps.builder.containerConfig(ctx, s.container, {
        kind: s.kind,
        restartCount: s.restartCount,
        image: image.imageRef || s.container.image!,
        volumes: this.volumePaths ?? (this.volumePaths = await this.deps.volumes.setUp(ctx)),
        etcHosts: this.etcHosts,
        imageUser: image.user,
        warnings,
      });
      for (const w of warnings) this.event('Warning', 'InvalidEnvironmentVariableNames', w, name);
    } catch (err) {
      if (!(err instanceof ContainerConfigError)) throw err;
      this.waiting.set(name, { reason: 'CreateContainerConfigError', message: err.message });
      this.event('Warning', 'Failed', `Error: ${err.message}`, name);
      return now() + 5_000;
    }
    if (s.lastFinishedAt > 0) backoff.next(key, now());
    let id: string;
    try {
      id = (await cri.runtime.createContainer({ podSandboxId: sandboxId, config, sandboxConfig })).containerId;
    } catch (err) {
      const message = grpcDetails(err);
      this.waiting.set(name, { reason: 'CreateContainerError', message });
      this.event('Warning', 'Failed', `Error: ${message}`, name);
      return now() + 5_000;
    }
    this.event('Normal', 'Created', `Created container ${name}`, name);
    try {
      await cri.runtime.startContainer({ containerId: id });
    } catch (err) {
      const message = grpcDetails(err);
      this.waiting.delete(name);
      this.event('Warning', 'Failed', `Error: ${message}`, name);
      return now() + 1_000;
    }
    this.waiting.delete(name);
    this.event('Normal', 'Started', `Started container ${name}`, name);
    this.deps.onStarted?.(ctx.pod, name, s.restartCount > 0);
    const target: ProbeTarget = { containerId: id, podIP: ctx.podIP ?? '', container: s.container };
    const postStart = s.container.lifecycle?.postStart;
    if (postStart) {
      // The kubelet cancels a postStart hook when the pod is deleted: a hook that blocks for the whole
      // grace period would otherwise hold the deletion (and every other change of the pod) that long.
      const deleting = this.deleting.signal;
      const r = await this.deps.hooks(postStart, target, (ctx.pod.spec?.terminationGracePeriodSeconds ?? 30) * 1000, deleting);
      if (deleting.aborted) return 'started';
      if (!r.ok) {
        this.event('Warning', 'FailedPostStartHook', r.message, name);
        await this.kill(ctx, { id, name, reason: `FailedPostStartHook`, remove: false }, ctx.pod.spec?.terminationGracePeriodSeconds ?? 30, false);
        return 'started';
      }
    }
    this.deps.prober.addContainer(ctx.pod, s.container, target, now());
    return 'started';
  }

  private containerSpec(pod: Pod, name: string): Container | undefined {
    return [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])].find((c) => c.name === name);
  }

  /** Stops a container gracefully: preStop first, then the runtime's stop with what is left of the grace period. */
  private async kill(ctx: PodContext, k: KillAction, graceSeconds: number, runPreStop = true): Promise<void> {
    const { cri } = this.deps;
    const spec = this.containerSpec(ctx.pod, k.name);
    const deadline = this.deps.now() + graceSeconds * 1000;
    this.deps.log.debug('killing container', { pod: this.name(), container: k.name, id: k.id, reason: k.reason });
    this.event('Normal', 'Killing', k.reason.startsWith('Container') ? `${k.reason}` : `Stopping container ${k.name}`, k.name);
    const preStop = spec?.lifecycle?.preStop;
    if (runPreStop && preStop) {
      const target: ProbeTarget = { containerId: k.id, podIP: ctx.podIP ?? '', container: spec };
      const r = await this.deps.hooks(preStop, target, Math.max(0, deadline - this.deps.now()));
      if (!r.ok) this.event('Warning', 'FailedPreStopHook', r.message, k.name);
    }
    const left = Math.max(0, Math.ceil((deadline - this.deps.now()) / 1000));
    this.deps.prober.removeContainer(this.uid, k.name);
    this.deps.prober.clearUnhealthy(this.uid, k.name);
    await cri.runtime.stopContainer({ containerId: k.id, timeout: left }, (left + 30) * 1000).catch((err) => {
      if (!isNotFound(err)) throw err;
    });
    if (k.remove) {
      await cri.runtime.removeContainer({ containerId: k.id }).catch((err) => {
        if (!isNotFound(err)) throw err;
      });
      this.deps.observer.forget([k.id]);
    }
  }

  /**
   * Drops what the agent kept of a removed container: its termination
   * message, and its termination-log file, which the container may have
   * filled with as much as it liked (one per restart would otherwise pile up
   * under the pod directory until the pod goes). A file another instance of
   * the same name and restart count still uses is left alone.
   */
  private async forgetDead(ctx: PodContext, seen: ObservedContainer[], id: string): Promise<void> {
    this.messages.delete(id);
    const c = seen.find((x) => x.id === id);
    if (!c || seen.some((x) => x.id !== id && x.name === c.name && x.restartCount === c.restartCount)) return;
    try {
      await removeTerminationLog(ctx.podDir, this.deps.terminationLogPath(ctx.podDir, c.name, c.restartCount));
    } catch {
      // not a name the agent made a file for, or already gone
    }
  }

  /** Reads the termination message of containers that exited since the last sync. */
  private async readTerminationMessages(ctx: PodContext, observed: ObservedPod): Promise<void> {
    for (const c of observed.containers) {
      if (c.state !== 'exited' || this.messages.has(c.id)) continue;
      const spec = this.containerSpec(ctx.pod, c.name);
      let msg = '';
      try {
        // Only a regular file of its own, reached with no symlink: the message is shown to anyone on the host.
        msg = await readTerminationLog(ctx.podDir, this.deps.terminationLogPath(ctx.podDir, c.name, c.restartCount), TERMINATION_MESSAGE_MAX);
      } catch {
        // no file: no message
      }
      if (!msg && c.exitCode !== 0 && spec?.terminationMessagePolicy === 'FallbackToLogsOnError') {
        // The monitor may still be writing the last output when the exit is seen: look again briefly.
        for (let i = 0; i < 5 && !msg; i++) {
          if (i > 0) await new Promise((r) => setTimeout(r, 100));
          msg = await tailLog(ctx.podDir, containerLogIn(ctx.podDir, c.logPath));
        }
      }
      this.messages.set(c.id, msg);
    }
  }

  /** Stops and removes everything of the pod, gracefully; the worker is done afterwards. */
  private async terminate(): Promise<void> {
    const { cri, observer, prober } = this.deps;
    const observed = await observer.observe(this.uid);
    const pod = this.lastPod;
    const grace = this.graceOverride ?? pod?.spec?.terminationGracePeriodSeconds ?? 30;
    const ctx: PodContext | undefined = pod ? ({ pod, podIP: observed.sandboxes[0]?.ip } as PodContext) : undefined;
    const live = observed.containers.filter((c) => c.state === 'running' || c.state === 'created');
    // App containers first, then sidecars in reverse order, as the kubelet.
    const apps = live.filter((c) => c.kind !== 'sidecar');
    const sidecars = live.filter((c) => c.kind === 'sidecar');
    const killOne = (c: ObservedContainer) =>
      ctx
        ? this.kill(ctx, { id: c.id, name: c.name, reason: `Stopping container ${c.name}`, remove: false }, grace)
        : cri.runtime.stopContainer({ containerId: c.id, timeout: grace }, (grace + 30) * 1000).then(() => undefined);
    await Promise.all(apps.map(killOne));
    for (const c of sidecars.reverse()) await killOne(c);
    for (const c of observed.containers) {
      await cri.runtime.removeContainer({ containerId: c.id }).catch((err) => {
        if (!isNotFound(err)) throw err;
      });
    }
    for (const sb of observed.sandboxes) await this.removeSandbox(sb.id);
    observer.forget(observed.containers.map((c) => c.id));
    prober.removePod(this.uid);
    this.deps.backoff.forget(`${this.uid}/`);
    this.deps.images.forgetPod(this.uid);
    await this.deps.volumes.tearDown(this.uid);
    // Its sandboxes are gone: no process uses the pod's host ids any more.
    await this.deps.userns?.release(this.uid);
    this.terminated = true;
    if (this.timer) clearTimeout(this.timer);
  }
}

/** The last lines of a container's log, for FallbackToLogsOnError (the kubelet takes 80 lines, 2 KiB). */
/** The end of a container's log, opened as the status API opens it (no symlink, FIFO or device: the message is served). */
async function tailLog(podDir: string, file: string | undefined): Promise<string> {
  if (!file) return '';
  try {
    // The agent's root (`<root>/pods/<uid>`), opened as it is; the rest beneath it strictly.
    const root = path.dirname(path.dirname(podDir));
    const { dirFd, name } = openLogDir({ root, path: path.relative(root, file) });
    let fh: fs.FileHandle;
    let size: number;
    try {
      ({ fh, st: { size } } = await openLogFile(dirFd, name));
    } finally {
      closeSync(dirFd);
    }
    try {
      const len = Math.min(size, 64 * 1024);
      const buf = Buffer.alloc(len);
      await fh.read(buf, 0, len, size - len);
      const lines = buf
        .toString('utf8')
        .split('\n')
        .filter(Boolean)
        .map((l) => l.replace(/^\S+ (stdout|stderr) [PF] /, ''))
        .slice(-80)
        .join('\n');
      return lines.slice(-2048);
    } finally {
      await fh.close();
    }
  } catch {
    return '';
  }
}
