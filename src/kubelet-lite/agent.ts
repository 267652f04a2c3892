/**
 * kubelet-lite's sync loop (the kubelet's syncLoop): manifest changes, runtime
 * events, probe results and a slow relist all end in the one place that
 * decides which pod workers must sync. The agent owns the workers and the
 * pods' statuses and serves them read-only to the status API.
 */
import type { PodNetworkReady } from './pod-network.js';
import type { Event, Pod, PodStatus } from 'kubernetes-types/core/v1.js';
import os from 'node:os';
import path from 'node:path';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { Backoff, CONTAINER_BACKOFF } from './backoff.js';
import { grpcCode, isNotFound, type CriEndpoint } from './cri-client.js';
import { containerLogIn } from './cri-config.js';
import { ImageManager } from './images.js';
import type { LogRef } from './log-files.js';
import {
  MANAGED_BY_LABEL,
  NODE_LABEL,
  POD_UID_LABEL,
  type ConfigBuilder,
  type ManifestProblem,
  type ObjectChange,
  type ObjectLookup,
  type PodContext,
  type PodValidation,
  type StoredObject,
  type VolumeManager,
} from './model.js';
import { PodWorker, type EventSink, type HookRunner, type ProberPort } from './pod-worker.js';
import { iso } from './pod-status.js';
import { RuntimeObserver, type ObservedPod } from './runtime-state.js';
import type { UsernsAllocator } from './userns.js';
import { namespacedKey as podKey } from '../labels.js';
import { API_SOURCE_FILE } from '../stored-object.js';

/** Where manifests come from: the directory store and its watcher, behind one face. */
export interface ManifestSource {
  readonly objects: ObjectLookup;
  /** Loads everything once, then reports changes until stopped. */
  start(onChange: (changes: ObjectChange[]) => void): Promise<void>;
  stop(): void;
  problems(): ManifestProblem[];
}

export interface AgentOptions {
  nodeName: string;
  rootDir: string;
  clusterDomain: string;
  clusterDNS: string[];
  hostResolvConf: string;
  hostIP: string;
  /** How often the runtime is relisted while its event stream works (and when it does not: 1 s). */
  relistMs?: number;
  /**
   * At most this many pods that have not finished run at once (the kubelet's
   * maxPods, default 110); more wait, Pending, until one ends.
   */
  maxPods?: number;
}

export const DEFAULT_MAX_PODS = 110;

export interface AgentParts {
  cri: CriEndpoint;
  manifests: ManifestSource;
  validatePod(obj: StoredObject): PodValidation;
  builder: ConfigBuilder;
  volumes: VolumeManager;
  prober: ProberPort;
  hooks: HookRunner;
  events: EventSink & { list(): Event[] };
  qosClass(pod: Pod): string;
  terminationLogPath(podDir: string, name: string, restartCount: number): string;
  log: Logger;
  now?: () => number;
  /** Host id ranges for `hostUsers: false` pods; without it such pods never run. */
  userns?: UsernsAllocator;
  /**
   * Admission beside --max-pods (the eviction manager's: no BestEffort pod
   * under memory pressure): a refused new pod is Failed with the reason and
   * "Pod was rejected: <message>", as the kubelet rejects it.
   */
  admit?: (pod: Pod) => { reason: string; message: string } | undefined;
  /** Metrics hooks. */
  onPodRunning?: (pod: Pod, latencyMs: number) => void;
  onRestart?: (pod: Pod, container: string) => void;
  /** Before a pod's containers start (see pod-network.ts). */
  podNetworkReady?: PodNetworkReady;
}

export type WatchType = 'ADDED' | 'MODIFIED' | 'DELETED';

interface PodEntry {
  key: string;
  uid: string;
  worker?: PodWorker;
  /** The pod as last reported: spec + status. */
  view: Pod;
  /** Not started: the node already runs maxPods pods. It starts, in turn, when one ends. */
  waiting?: boolean;
  /** When it began to wait (a sequence number): the pod that waited longest starts first. */
  waitingSince?: number;
  /** From a manifest file, not the API: the kubelet's static pod, which eviction spares. */
  fromFile?: boolean;
}

const isTerminal = (p: Pod) => p.status?.phase === 'Succeeded' || p.status?.phase === 'Failed';


/** The first non-loopback IPv4 address of this host, as the kubelet picks its node IP. */
export function detectHostIP(): string {
  for (const addrs of Object.values(os.networkInterfaces())) {
    for (const a of addrs ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  }
  return '127.0.0.1';
}

export class Agent {
  private readonly workers = new Map<string, PodWorker>();
  private readonly pods = new Map<string, PodEntry>();
  private readonly invalid = new Map<string, Pod>();
  private readonly watchers = new Set<(type: WatchType, pod: Pod) => void>();
  private readonly observer: RuntimeObserver;
  private readonly images: ImageManager;
  private readonly backoff = new Backoff(CONTAINER_BACKOFF);
  private readonly now: () => number;
  private runtimeName = 'cri';
  private events?: { cancel(): void };
  private relistTimer: NodeJS.Timeout | undefined;
  private reconnectTimer: NodeJS.Timeout | undefined;
  private eventsWork = false;
  private stopped = false;
  private readonly lastStates = new Map<string, string>();
  /** uids the runtime holds for this node (from its sandboxes' labels). */
  private readonly known = new Set<string>();
  /**
   * Of those, the ones a wanted pod may still take whatever --max-pods says: adopted pods start
   * whatever the count, but once retired, the same pod written again is new and waits its turn.
   */
  private readonly adoptable = new Set<string>();
  private admitTimer: NodeJS.Immediate | undefined;
  private waitSeq = 0;
  /** Every manifest file has been read once (see reconcilePods: until then only adopted pods start). */
  private manifestsLoaded = false;

  constructor(
    readonly opts: AgentOptions,
    private readonly parts: AgentParts,
  ) {
    this.now = parts.now ?? Date.now;
    this.observer = new RuntimeObserver(parts.cri);
    this.images = new ImageManager(parts.cri, this.now);
  }

  get cri(): CriEndpoint {
    return this.parts.cri;
  }

  async start(): Promise<void> {
    const { cri, log } = this.parts;
    const v = await cri.runtime.version({ version: '0.1.0' }, 10_000);
    this.runtimeName = v.runtimeName || 'cri';
    log.info('kubelet-lite connected to the runtime', { runtime: v.runtimeName, version: v.runtimeVersion, node: this.opts.nodeName });
    // What this node's agent left running last time: adopted if still wanted, stopped otherwise.
    const existing = await cri.runtime.listPodSandbox({ filter: { labelSelector: { [MANAGED_BY_LABEL]: 'true', [NODE_LABEL]: this.opts.nodeName } } });
    for (const sb of existing.items) {
      const uid = sb.labels[POD_UID_LABEL];
      if (uid) {
        this.known.add(uid);
        this.adoptable.add(uid);
      }
    }
    this.subscribeEvents();
    await this.parts.manifests.start((changes) => this.onChanges(changes));
    this.manifestsLoaded = true;
    this.onChanges([]);
    for (const uid of this.known) {
      if (!this.workers.has(uid)) {
        log.info('stopping a pod no manifest wants any more', { uid });
        this.terminateOrphan(uid);
      }
    }
    // Ranges of pods that are gone (removed while the agent was down): neither wanted nor in the runtime.
    const live = new Set([...this.known, ...[...this.pods.values()].map((e) => e.uid)]);
    for (const uid of this.parts.userns?.uids() ?? []) {
      if (!live.has(uid)) {
        log.info('releasing the user namespace range of a pod that is gone', { uid });
        await this.parts.userns!.release(uid);
      }
    }
    this.scheduleRelist();
  }

  /** Stops the agent's loops; the pods keep running for the next agent to adopt. */
  stop(): void {
    this.stopped = true;
    this.parts.manifests.stop();
    this.events?.cancel();
    if (this.relistTimer) clearTimeout(this.relistTimer);
    if (this.reconnectTimer) clearTimeout(this.reconnectTimer);
    if (this.admitTimer) clearImmediate(this.admitTimer);
    for (const w of this.workers.values()) w.halt();
  }

  // ------------------------------------------------------------ manifests

  private onChanges(changes: ObjectChange[]): void {
    if (this.stopped) return;
    const touchedConfig = new Set<string>();
    for (const ch of changes) {
      const o = ch.object;
      if ((o.kind === 'ConfigMap' || o.kind === 'Secret') && o.apiVersion === 'v1') touchedConfig.add(`${o.kind}/${o.namespace}/${o.name}`);
    }
    this.reconcilePods();
    if (touchedConfig.size) {
      for (const e of this.pods.values()) {
        if (e.worker && referencesAny(e.view, touchedConfig)) e.worker.update(this.context(e.view, e.uid), { refreshVolumes: true });
      }
    }
  }

  /** Makes the set of pod workers match the Pods in the manifest directory. */
  private reconcilePods(): void {
    const wanted = new Map<string, { obj: StoredObject; v: PodValidation }>();
    for (const obj of this.parts.manifests.objects.list('Pod')) {
      if (obj.apiVersion !== 'v1') continue;
      wanted.set(podKey(obj.namespace, obj.name), { obj, v: this.parts.validatePod(obj) });
    }
    // Invalid pods are shown with the reason, never run: those that did not even decode are
    // manifest problems naming a Pod.
    const invalidNow = new Set<string>();
    const undecodable = new Map<string, ManifestProblem[]>();
    for (const p of this.parts.manifests.problems()) {
      const m = /^Pod\/([^/]+)\/(.+)$/.exec(p.object ?? '');
      if (!m || wanted.has(podKey(m[1]!, m[2]!))) continue;
      const key = podKey(m[1]!, m[2]!);
      undecodable.set(key, [...(undecodable.get(key) ?? []), p]);
    }
    for (const [key, problems] of undecodable) {
      const [namespace, name] = [key.slice(0, key.indexOf('/')), key.slice(key.indexOf('/') + 1)];
      const first = problems[0]!;
      const obj: StoredObject = { apiVersion: 'v1', kind: 'Pod', namespace, name, uid: '', object: { metadata: { name, namespace } }, source: { file: first.file, line: first.line, document: 0 } };
      invalidNow.add(key);
      const pod = invalidPod(obj, problems.map((p) => p.reason), this.now());
      const had = this.invalid.get(key);
      this.invalid.set(key, pod);
      if (JSON.stringify(had?.status?.message) !== JSON.stringify(pod.status?.message)) this.notify(had ? 'MODIFIED' : 'ADDED', pod);
    }
    for (const [key, { obj, v }] of wanted) {
      if (v.ok) continue;
      invalidNow.add(key);
      const pod = v.blocked ? blockedPod(obj, v.blocked, v.reasons, v.reason ?? 'Blocked', this.now()) : invalidPod(obj, v.reasons, this.now(), v.reason);
      const had = this.invalid.get(key);
      this.invalid.set(key, pod);
      if (JSON.stringify(had?.status?.message) !== JSON.stringify(pod.status?.message)) this.notify(had ? 'MODIFIED' : 'ADDED', pod);
    }
    for (const [key, pod] of this.invalid) {
      if (!invalidNow.has(key)) {
        this.invalid.delete(key);
        if (!this.pods.has(key)) this.notify('DELETED', pod);
      }
    }
    for (const [key, e] of this.pods) {
      const w = wanted.get(key);
      if (w?.v.ok && w.obj.uid === e.uid) continue;
      // Deleted, invalid now, or edited (a new uid): stop the old one first.
      this.retire(e);
    }
    // Pods that have not finished, started or stopping, count against maxPods; a pod the runtime
    // already runs (found at start) is adopted whatever the count.
    const maxPods = this.opts.maxPods ?? DEFAULT_MAX_PODS;
    let active = 0;
    for (const e of this.pods.values()) if (!e.waiting && !isTerminal(e.view)) active++;
    // Pods already waiting are placed first, longest waiting first, as a scheduler queue would:
    // in the manifests' order, a workload listed first and making pods as fast as they end (a
    // long Job) would keep every place, and a pod of one listed after it would wait for its end.
    const waitedSince = (key: string) => {
      const e = this.pods.get(key);
      return e?.waiting ? e.waitingSince ?? 0 : Infinity;
    };
    const inTurn = [...wanted].sort(([a], [b]) => waitedSince(a) - waitedSince(b) || 0);
    for (const [key, { obj, v }] of inTurn) {
      if (!v.ok) continue;
      const cur = this.pods.get(key);
      if (cur && cur.uid === obj.uid && !cur.waiting) {
        // The same pod updated in place (the API lets a container's image change): its worker follows the new spec.
        if (cur.worker && JSON.stringify(v.pod.spec) !== JSON.stringify(cur.view.spec)) {
          cur.view = { ...cur.view, spec: v.pod.spec };
          cur.worker.update(this.context(cur.view, cur.uid));
        }
        continue;
      }
      // An edited pod (a new uid under the same name) takes the slot of the one it replaces.
      if (cur && cur.uid !== obj.uid && !cur.waiting && !isTerminal(cur.view)) active--;
      const room = active < maxPods || this.adoptable.has(obj.uid);
      // While the manifests first load, file by file, only pods the runtime already runs start: a
      // new pod whose file is read before theirs would take a place they then take as well, and
      // the node would run more than maxPods. The others come once every file is read.
      if (!cur && !this.manifestsLoaded && !this.adoptable.has(obj.uid)) continue;
      if (cur && cur.uid === obj.uid) {
        // Waiting for room: it starts now if there is some (and the node's pressure admits it).
        if (!room) continue;
        const refusedNow = cur.fromFile ? undefined : this.parts.admit?.(cur.view);
        if (refusedNow) {
          cur.waiting = false;
          cur.view = { ...cur.view, status: { phase: 'Failed', reason: refusedNow.reason, message: `Pod was rejected: ${refusedNow.message}`, startTime: iso(this.now()) } };
          this.parts.events.record(cur.view, 'Warning', refusedNow.reason, refusedNow.message);
          this.notify('MODIFIED', cur.view);
          continue;
        }
        active++;
        cur.waiting = false;
        cur.view = { ...cur.view, status: { phase: 'Pending' } };
        this.launch(cur, cur.view, undefined);
        this.notify('MODIFIED', cur.view);
        continue;
      }
      const pod = v.pod;
      pod.metadata = { ...pod.metadata, uid: obj.uid, namespace: obj.namespace, name: obj.name, creationTimestamp: iso(this.now()) };
      const fromFile = obj.source.file !== API_SOURCE_FILE;
      const refused = room && !fromFile && !this.adoptable.has(obj.uid) ? this.parts.admit?.(pod) : undefined;
      if (refused) {
        const rejected: PodEntry = { key, uid: obj.uid, view: { ...pod, status: { phase: 'Failed', reason: refused.reason, message: `Pod was rejected: ${refused.message}`, startTime: iso(this.now()) } } };
        this.pods.set(key, rejected);
        this.parts.events.record(pod, 'Warning', refused.reason, refused.message);
        this.parts.log.info('pod rejected at admission', { pod: key, reason: refused.reason, message: refused.message });
        if (cur?.worker) this.retire(cur);
        this.notify(cur ? 'MODIFIED' : 'ADDED', rejected.view);
        continue;
      }
      const entry: PodEntry = { key, uid: obj.uid, view: { ...pod, status: room ? { phase: 'Pending' } : waitingStatus(maxPods, this.now()) }, fromFile: obj.source.file !== API_SOURCE_FILE };
      this.pods.set(key, entry);
      if (room) {
        active++;
        this.launch(entry, pod, cur?.worker);
      } else {
        entry.waiting = true;
        entry.waitingSince = ++this.waitSeq;
        this.parts.log.info('the node runs its maximum of pods; this one waits until one ends', { pod: key, maxPods });
      }
      this.notify(cur ? 'MODIFIED' : 'ADDED', entry.view);
    }
  }

  /** Starts `entry`'s worker, once `previous` (the pod it replaces under the same name) has stopped. */
  private launch(entry: PodEntry, pod: Pod, previous: PodWorker | undefined): void {
    const go = () => {
      if (this.stopped || this.pods.get(entry.key) !== entry) return;
      const worker = this.newWorker(entry.uid, this.context(pod, entry.uid));
      entry.worker = worker;
      worker.schedule(0);
    };
    if (previous && !previous.isTerminated) void previous.settled().then(go);
    else go();
  }

  /** A pod ended or went: if others wait for room, look again (once per turn of the loop). */
  private admitWaiting(): void {
    if (this.stopped || this.admitTimer || ![...this.pods.values()].some((e) => e.waiting)) return;
    this.admitTimer = setImmediate(() => {
      this.admitTimer = undefined;
      if (!this.stopped) this.reconcilePods();
    });
  }

  private retire(e: PodEntry): void {
    if (e.view.metadata?.deletionTimestamp) return;
    this.adoptable.delete(e.uid);
    e.view = { ...e.view, metadata: { ...e.view.metadata, deletionTimestamp: iso(this.now()) } };
    this.notify('MODIFIED', e.view);
    const w = e.worker;
    if (w) {
      w.update(undefined);
      void w.settled().then(() => {
        if (w.isTerminated) this.workers.delete(e.uid);
      });
    }
    if (this.pods.get(e.key) === e) {
      // Keep the pod visible (terminating) until its worker is done.
      void (w ? w.settled() : Promise.resolve()).then(() => {
        if (this.pods.get(e.key) === e) {
          this.pods.delete(e.key);
          this.notify('DELETED', e.view);
          this.admitWaiting();
        }
      });
    }
  }

  private terminateOrphan(uid: string): void {
    const w = this.newWorker(uid, undefined);
    w.update(undefined);
    void w.settled().then(() => this.workers.delete(uid));
  }

  private context(pod: Pod, uid: string): PodContext {
    return {
      pod,
      uid,
      nodeName: this.opts.nodeName,
      hostIP: this.opts.hostIP,
      clusterDomain: this.opts.clusterDomain,
      clusterDNS: this.opts.clusterDNS,
      hostResolvConf: this.opts.hostResolvConf,
      podDir: `${this.opts.rootDir}/pods/${uid}`,
      objects: this.parts.manifests.objects,
      userns: pod.spec?.hostUsers === false ? this.parts.userns?.get(uid) : undefined,
    };
  }

  private newWorker(uid: string, ctx: PodContext | undefined): PodWorker {
    const p = this.parts;
    const w = new PodWorker(uid, {
      cri: p.cri,
      observer: this.observer,
      builder: p.builder,
      volumes: p.volumes,
      prober: p.prober,
      hooks: p.hooks,
      images: this.images,
      backoff: this.backoff,
      events: p.events,
      log: p.log,
      runtimeName: () => this.runtimeName,
      qosClass: p.qosClass,
      terminationLogPath: p.terminationLogPath,
      userns: p.userns && {
        prepare: async (pod, id) => {
          await this.checkUsernsSupport(pod.spec?.runtimeClassName ?? '');
          return p.userns!.allocate(id);
        },
        release: (id) => p.userns!.release(id),
      },
      now: this.now,
      onStatus: (id, pod, status) => this.onStatus(id, pod, status),
      onStarted: (pod, c, restart) => {
        if (restart) p.onRestart?.(pod, c);
      },
      onPodRunning: p.onPodRunning,
      ...(p.podNetworkReady ? { podNetworkReady: p.podNetworkReady } : {}),
    }, ctx);
    this.workers.set(uid, w);
    return w;
  }

  /**
   * Throws unless the runtime says the handler can run pods in user
   * namespaces (RuntimeStatus features), as the kubelet checks before it
   * asks: an older runtime would otherwise run the pod in the host's.
   * A runtime that lists no "" entry for its default handler is taken at
   * its word only when every handler it lists supports them.
   */
  private async checkUsernsSupport(handler: string): Promise<void> {
    const st = await this.parts.cri.runtime.status({ verbose: false }, 10_000);
    const handlers = st.runtimeHandlers ?? [];
    const named = handlers.find((h) => h.name === handler);
    const ok = named ? named.features?.userNamespaces === true : handler === '' && handlers.length > 0 && handlers.every((h) => h.features?.userNamespaces === true);
    if (!ok) {
      throw new Error(handler ? `can't set \`spec.hostUsers: false\`, RuntimeClass handler "${handler}" does not support user namespaces` : "can't set `spec.hostUsers: false`, runtime does not support user namespaces");
    }
  }

  private onStatus(uid: string, pod: Pod, status: PodStatus): void {
    const key = podKey(pod.metadata?.namespace ?? 'default', pod.metadata?.name ?? '');
    const e = this.pods.get(key);
    if (!e || e.uid !== uid) return;
    const before = JSON.stringify(e.view.status);
    e.view = { ...e.view, status };
    // An adopted pod is as old as its sandbox, not as this agent.
    if (status.startTime && e.view.metadata?.creationTimestamp && status.startTime < e.view.metadata.creationTimestamp) {
      e.view = { ...e.view, metadata: { ...e.view.metadata, creationTimestamp: status.startTime } };
    }
    if (JSON.stringify(status) !== before) {
      this.notify('MODIFIED', e.view);
      if (isTerminal(e.view)) this.admitWaiting();
    }
  }

  /** A probe result changed: the pod's worker looks again. */
  probeChanged(uid: string): void {
    this.workers.get(uid)?.schedule(0);
  }

  // ------------------------------------------------------------ runtime events

  private subscribeEvents(): void {
    if (this.stopped) return;
    const started = this.now();
    this.events = this.parts.cri.containerEvents(
      (ev) => {
        this.eventsWork = true;
        const uid = ev.podSandboxStatus?.labels?.[POD_UID_LABEL] ?? ev.containersStatuses.find((c) => c.id === ev.containerId)?.labels?.[POD_UID_LABEL];
        if (uid) this.workers.get(uid)?.schedule(0);
        else this.relistSoon();
      },
      (err) => {
        if (this.stopped) return;
        const unimplemented = grpcCode(err) === 12;
        if (unimplemented) {
          this.parts.log.info('the runtime has no container event stream; relisting every second instead');
          this.eventsWork = false;
          return;
        }
        this.eventsWork = false;
        this.parts.log.warn('runtime event stream ended; reconnecting', { err: err ? errorMessage(err) : 'closed' });
        const wait = this.now() - started > 10_000 ? 200 : 2_000;
        this.reconnectTimer = setTimeout(() => {
          this.relistSoon();
          this.subscribeEvents();
        }, wait);
        this.reconnectTimer.unref();
      },
    );
    // An open stream that has sent nothing yet still counts as working.
    this.eventsWork = true;
  }

  private relistSoon(): void {
    if (this.relistTimer) clearTimeout(this.relistTimer);
    this.relistTimer = setTimeout(() => void this.relist(), 50);
    this.relistTimer.unref();
  }

  private scheduleRelist(): void {
    if (this.stopped) return;
    const every = this.eventsWork ? (this.opts.relistMs ?? 10_000) : 1_000;
    this.relistTimer = setTimeout(() => void this.relist(), every);
    this.relistTimer.unref();
  }

  /** The safety net under the event stream: any container whose state changed wakes its pod. */
  private async relist(): Promise<void> {
    try {
      const r = await this.parts.cri.runtime.listContainers({ filter: { labelSelector: { [MANAGED_BY_LABEL]: 'true', [NODE_LABEL]: this.opts.nodeName } } }, 30_000);
      const seen = new Set<string>();
      for (const c of r.containers) {
        seen.add(c.id);
        if (this.lastStates.get(c.id) !== c.state) {
          this.lastStates.set(c.id, c.state);
          this.workers.get(c.labels[POD_UID_LABEL] ?? '')?.schedule(0);
        }
      }
      for (const id of this.lastStates.keys()) if (!seen.has(id)) this.lastStates.delete(id);
    } catch (err) {
      this.parts.log.warn('relist failed', { err: errorMessage(err) });
    }
    this.scheduleRelist();
  }

  // ------------------------------------------------------------ views

  private notify(type: WatchType, pod: Pod): void {
    if (!this.watchers.size) return;
    const copy = structuredClone(pod);
    for (const w of this.watchers) w(type, copy);
  }

  watchPods(listener: (type: WatchType, pod: Pod) => void): () => void {
    this.watchers.add(listener);
    return () => this.watchers.delete(listener);
  }

  listPods(): Pod[] {
    const out: Pod[] = [];
    for (const e of this.pods.values()) out.push(structuredClone(e.view));
    for (const [key, p] of this.invalid) if (!this.pods.has(key)) out.push(structuredClone(p));
    out.sort((a, b) => `${a.metadata?.namespace}/${a.metadata?.name}`.localeCompare(`${b.metadata?.namespace}/${b.metadata?.name}`));
    return out;
  }

  /** The API deleted the pod with this grace (deletionGracePeriodSeconds): its worker stops it within that. */
  deletionGrace(uid: string, seconds: number): void {
    this.workers.get(uid)?.deletionGrace(seconds);
  }

  /**
   * The pods the eviction manager may rank: started, not finished, not
   * being deleted, and not from a manifest file (the kubelet's static
   * pods are critical: never evicted). Copies.
   */
  activePods(): Pod[] {
    const out: Pod[] = [];
    for (const e of this.pods.values()) {
      if (e.fromFile || !e.worker || e.waiting || isTerminal(e.view) || e.view.metadata?.deletionTimestamp || e.worker.isEvicted || e.worker.isTerminated) continue;
      out.push(structuredClone(e.view));
    }
    return out;
  }

  /**
   * Evicts a pod (the eviction manager's verdict): its containers are
   * killed with `graceSeconds`, it is shown Failed with reason Evicted and
   * `message`. Resolves once its worker has done so, or after the grace and
   * 30 s more.
   */
  async evictPod(uid: string, message: string, graceSeconds: number): Promise<void> {
    const w = this.workers.get(uid);
    if (!w || w.isTerminated) return;
    w.evict(message, graceSeconds);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([w.settled(), new Promise<void>((r) => (timer = setTimeout(r, (graceSeconds + 30) * 1000)))]);
    clearTimeout(timer);
  }

  /** The pod a worker runs (no copy: for the agent's own parts). */
  podByUid(uid: string): Pod | undefined {
    return this.workers.get(uid)?.pod;
  }

  getPod(namespace: string, name: string): Pod | undefined {
    const key = podKey(namespace, name);
    const e = this.pods.get(key);
    if (e) return structuredClone(e.view);
    const inv = this.invalid.get(key);
    return inv ? structuredClone(inv) : undefined;
  }

  problems(): ManifestProblem[] {
    return this.parts.manifests.problems();
  }

  listEvents(): Event[] {
    return this.parts.events.list();
  }

  /** The CRI log file of a pod's container (its previous instance with `previous`). */
  async logPath(namespace: string, name: string, container: string, previous: boolean): Promise<LogRef | undefined> {
    const e = this.pods.get(podKey(namespace, name));
    if (!e) return undefined;
    const observed = await this.observer.observe(e.uid);
    const instances = observed.containers.filter((c) => c.name === container);
    const c = previous ? instances.find((x, i) => i > 0 && x.state === 'exited') ?? undefined : instances[0];
    const file = c ? containerLogIn(path.join(this.opts.rootDir, 'pods', e.uid), c.logPath) : undefined;
    if (!c || !file) return undefined;
    const running = async () => {
      try {
        const r = await this.parts.cri.runtime.containerStatus({ containerId: c.id, verbose: false });
        return r.status?.state === 'CONTAINER_RUNNING' || r.status?.state === 'CONTAINER_CREATED';
      } catch (err) {
        if (isNotFound(err)) return false;
        return true; // the runtime did not answer: keep following, and ask again later
      }
    };
    return { root: this.opts.rootDir, path: path.relative(this.opts.rootDir, file), running };
  }

  /** What the runtime holds for a pod (sandboxes and containers, newest first), and the runtime to ask for streams. */
  async runtimeOf(namespace: string, name: string): Promise<{ observed: ObservedPod; cri: CriEndpoint } | undefined> {
    const e = this.pods.get(podKey(namespace, name));
    return e ? { observed: await this.observer.observe(e.uid), cri: this.parts.cri } : undefined;
  }

  /** Counts for the metrics: running pods and containers by state. */
  counts(): { pods: number; containers: Record<string, number> } {
    let pods = 0;
    const containers: Record<string, number> = { running: 0, waiting: 0, terminated: 0 };
    for (const e of this.pods.values()) {
      if (e.view.status?.phase === 'Running') pods++;
      for (const s of [...(e.view.status?.initContainerStatuses ?? []), ...(e.view.status?.containerStatuses ?? [])]) {
        if (s.state?.running) containers.running!++;
        else if (s.state?.terminated) containers.terminated!++;
        else containers.waiting!++;
      }
    }
    return { pods, containers };
  }

  /** Waits until every worker is idle (tests and shutdown). */
  async settled(): Promise<void> {
    await Promise.all([...this.workers.values()].map((w) => w.settled()));
  }
}

/** Does the pod use any of these ConfigMaps/Secrets ("Kind/ns/name") in volumes or env? */
function referencesAny(pod: Pod, refs: Set<string>): boolean {
  const ns = pod.metadata?.namespace ?? 'default';
  const has = (kind: string, name?: string) => !!name && refs.has(`${kind}/${ns}/${name}`);
  for (const v of pod.spec?.volumes ?? []) {
    if (has('ConfigMap', v.configMap?.name) || has('Secret', v.secret?.secretName)) return true;
    for (const s of v.projected?.sources ?? []) if (has('ConfigMap', s.configMap?.name) || has('Secret', s.secret?.name)) return true;
  }
  for (const c of [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])]) {
    for (const e of c.env ?? []) if (has('ConfigMap', e.valueFrom?.configMapKeyRef?.name) || has('Secret', e.valueFrom?.secretKeyRef?.name)) return true;
    for (const e of c.envFrom ?? []) if (has('ConfigMap', e.configMapRef?.name) || has('Secret', e.secretRef?.name)) return true;
  }
  return false;
}

/** How a pod waiting for room is shown: Pending and not scheduled, as the scheduler leaves a pod that does not fit. */
function waitingStatus(maxPods: number, now: number): PodStatus {
  return {
    phase: 'Pending',
    conditions: [
      {
        type: 'PodScheduled',
        status: 'False',
        reason: 'Unschedulable',
        message: `the node runs its maximum of ${maxPods} pods (--max-pods); this one starts when one of them ends`,
        lastTransitionTime: iso(now),
      },
    ],
  };
}

/**
 * How a valid pod that soft admission refused is shown, as the kubelet
 * leaves it: Pending with the admission's reason and message, every
 * container waiting with reason Blocked, nothing started.
 */
function blockedPod(obj: StoredObject, pod: Pod, reasons: string[], reason: string, now: number): Pod {
  const waiting = (c: { name: string; image?: string }) => ({ name: c.name, image: c.image ?? '', imageID: '', ready: false, restartCount: 0, started: false, state: { waiting: { reason: 'Blocked' } } });
  const init = pod.spec?.initContainers ?? [];
  return {
    ...pod,
    metadata: { ...pod.metadata, name: obj.name, namespace: obj.namespace, uid: obj.uid },
    status: {
      phase: 'Pending',
      reason,
      message: reasons.join('; '),
      startTime: iso(now),
      ...(init.length ? { initContainerStatuses: init.map(waiting) } : {}),
      containerStatuses: (pod.spec?.containers ?? []).map(waiting),
    },
  };
}

/** How a Pod that did not validate (or was not admitted) is shown: never run, with its file, line and reasons. */
function invalidPod(obj: StoredObject, reasons: string[], now: number, reason?: string): Pod {
  const meta = (obj.object.metadata ?? {}) as Pod['metadata'];
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { ...(typeof meta === 'object' ? meta : {}), name: obj.name, namespace: obj.namespace, uid: obj.uid },
    spec: { containers: [] },
    status: {
      phase: 'Failed',
      reason: reason ?? 'InvalidManifest',
      message: reason ? reasons.join('; ') : `${obj.source.file}:${obj.source.line}: ${reasons.join('; ')}`,
      startTime: iso(now),
    },
  };
}
