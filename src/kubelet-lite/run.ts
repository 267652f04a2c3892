/**
 * `skiff kubelet`: kubelet-lite wired together — the manifest directory, the
 * agent over a CRI endpoint, the prober, and the read-only status API.
 * `skiff node` starts the same thing inside the runtime's process.
 */
import type { PodNetworkReady } from './pod-network.js';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod, Service } from 'kubernetes-types/core/v1.js';
import type { Logger } from '../log.js';
import { Agent, detectHostIP, type ManifestSource } from './agent.js';
import { connectCri, type CriEndpoint } from './cri-client.js';
import { terminationLogHostPath, KubeletConfigBuilder } from './cri-config.js';
import { EventRecorder } from './events.js';
import { ImageGc } from './image-gc.js';
import { EvictionManager, parseEvictionConfig, type EvictionConfig, type EvictionSource } from './eviction.js';
import { NodeSignals } from './node-signals.js';
import { ContainerLogManager, DEFAULT_CONTAINER_LOG_MAX_FILES, DEFAULT_CONTAINER_LOG_MAX_SIZE } from './log-rotation.js';
import { runHook } from './hooks.js';
import { AgentMetrics } from './metrics.js';
import { MANAGED_BY_LABEL, NODE_LABEL, POD_UID_LABEL, type AgentView, type ObjectChange, type ProbeResult } from './model.js';
import type { ProberPort } from './pod-worker.js';
import { ProberManager } from './prober.js';
import { createProbeRunner } from './probes.js';
import { qosClass } from './resources.js';
import { SummaryBuilder } from './stats-summary.js';
import { StatusServer } from './status-server.js';
import { ObjectStore } from './store.js';
import { admitPod, SysctlAllowlist } from './sysctls.js';
import { admitAppArmor, appArmorHostError } from './apparmor.js';
import { validatePod } from './validate.js';
import { StateFile } from './state-file.js';
import { UsernsAllocator } from './userns.js';
import { HostVolumeManager } from './volumes.js';
import { ManifestWatcher } from './watch.js';

export interface KubeletOptions {
  manifests: string;
  /**
   * The object store to read, when the caller has already filled it with
   * objects from elsewhere (the node's API): they are in it before the
   * agent's first pass, so the pods they define are adopted, not stopped.
   */
  objects?: ObjectStore;
  /**
   * The workloads' statuses for the status API: the workload controllers run
   * beside the agent (the node's controller manager, on its API); the agent
   * runs only Pods.
   */
  workloads?: AgentView['workloads'];
  runtimeEndpoint: string;
  statusAddress: string;
  rootDir: string;
  nodeName: string;
  clusterDomain: string;
  /** Empty: the host's nameservers. */
  clusterDNS: string[];
  nodeIP?: string;
  /** The image GC's marks, and how long an unused image stays at least (the kubelet's --minimum-image-ttl-duration, 2 min). */
  imageGc?: { highThresholdPercent: number; lowThresholdPercent: number; minAgeMs?: number };
  /** Unsafe sysctls (names or `prefix*`) pods may set beside the safe ones, as the kubelet's flag. */
  allowedUnsafeSysctls?: string[];
  /** Pods running at once; more wait (default 110, as the kubelet's maxPods). */
  maxPods?: number;
  /** Container log rotation (the kubelet's containerLogMaxSize, containerLogMaxFiles and its 10 s monitor period). */
  containerLogs?: { maxSize: number; maxFiles: number; monitorMs?: number };
  /** The eviction manager's thresholds (default: the kubelet's --eviction-hard default, nothing soft). */
  eviction?: EvictionConfig;
  /** Where the eviction manager measures (tests inject one; default the real cgroups and filesystems). */
  evictionSource?: EvictionSource;
  /** Safety-net rescan of the manifest directory (the watcher is the main path). */
  rescanMs?: number;
  /** Called before a pod's containers start, with its address (see pod-network.ts). */
  podNetworkReady?: PodNetworkReady;
  log: Logger;
}

export interface RunningKubelet {
  agent: Agent;
  status: StatusServer;
  /** Every object from the manifest directory (the proxy reads the Services here). */
  objects: ObjectStore;
  /** The agent's metrics registry, served on the status API (the proxy adds its own series). */
  metrics: AgentMetrics;
  /** The events the agent records about its pods (the node's API shows them). */
  events: EventRecorder;
  /** The pressure conditions, and the signals they come from (the Node's status reads them). */
  eviction: EvictionManager;
  /** The stats the status API's /stats/summary serves (the node's metrics.k8s.io reads them too). */
  summary: SummaryBuilder;
  /** Lets a proxy in the same process show its Services on the status API. */
  setServices(view: () => Service[]): void;
  /** Stops the agent's loops and the status API; pods keep running. */
  stop(): Promise<void>;
}

/** The nameservers in a resolv.conf. */
export function nameservers(resolvConf: string): string[] {
  return resolvConf
    .split('\n')
    .map((l) => /^\s*nameserver\s+(\S+)/.exec(l)?.[1])
    .filter((x): x is string => !!x);
}

export async function startKubelet(opts: KubeletOptions, cri: CriEndpoint = connectCri(opts.runtimeEndpoint)): Promise<RunningKubelet> {
  const log = opts.log;
  const sysctls = new SysctlAllowlist(opts.allowedUnsafeSysctls);
  await fs.mkdir(opts.rootDir, { recursive: true, mode: 0o700 });
  await ownRootDir(opts.rootDir, log);
  const hostResolvConf = await fs.readFile('/etc/resolv.conf', 'utf8').catch(() => '');
  const store = opts.objects ?? new ObjectStore({ nodeName: opts.nodeName, log });
  const watcher = new ManifestWatcher({ dir: opts.manifests, store, log });
  let rescan: NodeJS.Timeout | undefined;
  const manifests: ManifestSource = {
    objects: store,
    problems: () => store.problems(),
    async start(onChange: (changes: ObjectChange[]) => void) {
      store.subscribe(onChange);
      await watcher.start();
      rescan = setInterval(() => void watcher.rescan(), opts.rescanMs ?? 60_000);
      rescan.unref();
    },
    stop() {
      if (rescan) clearInterval(rescan);
      void watcher.close();
    },
  };
  // Readiness and startup results survive a restart of the agent, per container ID (see RunningContainer.initial).
  const probeFile = path.join(opts.rootDir, 'probe-results.json');
  const probeResults = new Map<string, ProbeResult>(
    await fs.readFile(probeFile, 'utf8').then(
      (t) => Object.entries(JSON.parse(t) as Record<string, unknown>).filter((e): e is [string, ProbeResult] => e[1] === 'success' || e[1] === 'failure'),
      () => [],
    ),
  );
  const probeState = new StateFile(probeFile);
  const flushProbeResults = () =>
    probeState.write(JSON.stringify(Object.fromEntries(probeResults))).catch((err) => log.warn('could not save probe results', { err: String(err) }));
  // Written at once (a crash right after a pod became Ready must not lose it); changes that
  // come while a write is running are coalesced into the next one.
  let probeWriting = false;
  let probeDirty = false;
  const saveProbeResults = () => {
    if (probeWriting) {
      probeDirty = true;
      return;
    }
    probeWriting = true;
    void flushProbeResults().finally(() => {
      probeWriting = false;
      if (probeDirty) {
        probeDirty = false;
        saveProbeResults();
      }
    });
  };
  const forgetProbeResults = (prefix: string) => {
    let changed = false;
    for (const k of probeResults.keys()) if (k.startsWith(prefix)) changed = probeResults.delete(k) || changed;
    if (changed) saveProbeResults();
  };
  const events = new EventRecorder({ node: opts.nodeName });
  const metrics = new AgentMetrics();
  const unhealthy = new Map<string, string>();
  let agent: Agent | undefined;
  let eviction: EvictionManager | undefined;
  const manager = new ProberManager({
    runner: createProbeRunner({ cri }),
    onResult: (e) => {
      if (e.kind !== 'liveness' && e.changed && (e.result === 'success' || e.result === 'failure')) {
        probeResults.set(`${e.podUid}/${e.container}/${e.containerId}/${e.kind}`, e.result);
        saveProbeResults();
      }
      log.debug('probe result', { uid: e.podUid, container: e.container, kind: e.kind, result: e.result, changed: e.changed, message: e.message });
      const pod = agent?.podByUid(e.podUid);
      const label = e.kind === 'liveness' ? 'Liveness' : e.kind === 'readiness' ? 'Readiness' : 'Startup';
      if (pod && e.result === 'failure') events.record(ref(pod), 'Warning', 'Unhealthy', `${label} probe failed: ${e.message}`, e.container);
      if (pod && e.warning) events.record(ref(pod), 'Warning', 'ProbeWarning', `${label} probe warning: ${e.message}`, e.container);
      // The prober reports liveness and startup failures once they reach their threshold: the worker kills the container.
      if ((e.kind === 'liveness' || e.kind === 'startup') && e.result === 'failure') {
        unhealthy.set(`${e.podUid}/${e.container}`, `Container ${e.container} failed ${e.kind} probe, will be restarted`);
      }
      agent?.probeChanged(e.podUid);
    },
    log: (m) => log.warn(m),
  });
  const prober: ProberPort = {
    addContainer: (pod, container, target, startedAt) => {
      const key = `${pod.metadata!.uid}/${container.name}/${target.containerId}`;
      const initial = { readiness: probeResults.get(`${key}/readiness`), startup: probeResults.get(`${key}/startup`) };
      manager.addContainer({ podUid: pod.metadata!.uid!, target: { ...target, pod: { name: pod.metadata!.name!, namespace: pod.metadata!.namespace!, uid: pod.metadata!.uid! } }, startedAt, initial });
    },
    removeContainer: (uid, name) => {
      manager.removeContainer(uid, name);
      forgetProbeResults(`${uid}/${name}/`);
    },
    removePod: (uid) => {
      manager.removePod(uid);
      forgetProbeResults(`${uid}/`);
      for (const k of unhealthy.keys()) if (k.startsWith(`${uid}/`)) unhealthy.delete(k);
    },
    ready: (uid, name) => manager.ready(uid, name),
    started: (uid, name) => manager.started(uid, name),
    unhealthy: (uid, name) => unhealthy.get(`${uid}/${name}`),
    clearUnhealthy: (uid, name) => void unhealthy.delete(`${uid}/${name}`),
  };
  // Whether the host can confine a pod with AppArmor: asked once, it does not change without a reboot.
  const appArmorMissing = await appArmorHostError();
  // The host id ranges of hostUsers:false pods: the same ones after a restart.
  const userns = await UsernsAllocator.load({ file: path.join(opts.rootDir, 'userns-ranges.json'), log });
  agent = new Agent(
    {
      nodeName: opts.nodeName,
      rootDir: opts.rootDir,
      clusterDomain: opts.clusterDomain,
      clusterDNS: opts.clusterDNS.length ? opts.clusterDNS : nameservers(hostResolvConf),
      hostResolvConf,
      hostIP: opts.nodeIP ?? detectHostIP(),
      ...(opts.maxPods !== undefined ? { maxPods: opts.maxPods } : {}),
    },
    {
      cri,
      manifests,
      validatePod: (obj) => admitAppArmor(admitPod(validatePod(obj), sysctls), appArmorMissing),
      builder: new KubeletConfigBuilder(),
      volumes: new HostVolumeManager({ rootDir: opts.rootDir, log }),
      prober,
      hooks: (handler, target, timeoutMs, signal) => runHook(handler, target, cri, timeoutMs, signal),
      events: { record: (pod, type, reason, message, container) => events.record(ref(pod), type, reason, message, container), list: () => events.list() },
      qosClass,
      terminationLogPath: terminationLogHostPath,
      userns,
      log,
      admit: (pod) => eviction?.admit(pod),
      onPodRunning: (_pod, ms) => metrics.observePodStart(ms / 1000),
      onRestart: (pod, c) => metrics.incRestart(pod.metadata?.namespace ?? '', pod.metadata?.name ?? '', c),
      ...(opts.podNetworkReady ? { podNetworkReady: opts.podNetworkReady } : {}),
    },
  );
  let servicesView: (() => Service[]) | undefined;
  const view: AgentView = {
    pods: () => agent!.listPods(),
    pod: (ns, name) => agent!.getPod(ns, name),
    events: () => events.list(),
    problems: () => agent!.problems(),
    logPath: (ns, pod, c, previous) => agent!.logPath(ns, pod, c, previous),
    watchPods: (l) => agent!.watchPods(l),
    ...(opts.workloads ? { workloads: opts.workloads } : {}),
    services: () => servicesView?.() ?? [],
    cri,
  };
  const gauges = setInterval(() => {
    const c = agent!.counts();
    metrics.setRunning(c.pods, { running: c.containers.running, exited: c.containers.terminated, created: c.containers.waiting });
    metrics.setManifestProblems(store.problems().length);
  }, 5_000);
  gauges.unref();
  await agent.start();
  const gc = new ImageGc(cri, { highThresholdPercent: 85, lowThresholdPercent: 80, ...opts.imageGc, log });
  const stopGc = gc.start();
  eviction = new EvictionManager({
    config: opts.eviction ?? parseEvictionConfig({}),
    source: opts.evictionSource ?? new NodeSignals({ cri, rootDir: opts.rootDir }),
    activePods: () => agent!.activePods(),
    evict: async (pod, message, grace) => {
      log.warn('evicting a pod', { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, message, graceSeconds: grace });
      await agent!.evictPod(pod.metadata?.uid ?? '', message, grace);
    },
    reclaimer: { images: () => gc.freeUnused(), containers: () => removeDeadContainers(cri, opts.nodeName) },
    nodeEvent: (type, reason, message) => void events.recordNode(type, reason, message),
    log,
  });
  const stopEviction = eviction.start();
  const stopLogRotation = new ContainerLogManager(cri, {
    rootDir: opts.rootDir,
    maxSize: opts.containerLogs?.maxSize ?? DEFAULT_CONTAINER_LOG_MAX_SIZE,
    maxFiles: opts.containerLogs?.maxFiles ?? DEFAULT_CONTAINER_LOG_MAX_FILES,
    monitorMs: opts.containerLogs?.monitorMs,
    log,
  }).start();
  const summary = new SummaryBuilder({ nodeName: opts.nodeName, cri, pods: () => agent!.listPods() });
  const status = await StatusServer.listen({
    address: opts.statusAddress,
    view,
    metrics,
    summary,
    log,
  });
  log.info('kubelet-lite serving', { status: opts.statusAddress, manifests: opts.manifests, node: opts.nodeName });
  return {
    agent,
    status,
    objects: store,
    metrics,
    events,
    eviction,
    summary,
    setServices(fn) {
      servicesView = fn;
    },
    async stop() {
      clearInterval(gauges);
      await probeState.settled();
      stopGc();
      stopEviction();
      await eviction!.settled();
      stopLogRotation();
      agent!.stop();
      manager.stopAll();
      await status.close();
      cri.close();
    },
  };
}

/**
 * The root dir holds every pod's volumes (Secrets among them), logs and
 * termination messages: the agent's alone, as the runtime's --root is. One
 * made here is 0700; an existing one open to others is tightened, one
 * another user owns is refused.
 */
async function ownRootDir(dir: string, log: Logger): Promise<void> {
  const st = await fs.stat(dir);
  if (!st.isDirectory()) throw new Error(`--root-dir ${dir} is not a directory`);
  const me = process.getuid?.() ?? 0;
  if (st.uid !== me) throw new Error(`--root-dir ${dir} belongs to uid ${st.uid}, not to this agent's uid ${me}: give it to uid ${me} (chown) or choose another`);
  if ((st.mode & 0o077) !== 0) {
    await fs.chmod(dir, 0o700);
    log.warn('--root-dir was open to other users; its mode is now 0700', { rootDir: dir, was: `0${(st.mode & 0o7777).toString(8)}` });
  }
}

/**
 * The kubelet's dead-container GC under disk pressure: every exited
 * container of this node's pods but the newest of each name (kept for its
 * status's lastState) is removed.
 */
async function removeDeadContainers(cri: CriEndpoint, nodeName: string): Promise<void> {
  const r = await cri.runtime.listContainers({ filter: { labelSelector: { [MANAGED_BY_LABEL]: 'true', [NODE_LABEL]: nodeName } } }, 30_000);
  const newest = new Map<string, { id: string; createdAt: number }>();
  const dead = r.containers.filter((c) => c.state === 'CONTAINER_EXITED');
  for (const c of dead) {
    const k = `${c.labels[POD_UID_LABEL] ?? ''}/${c.metadata?.name ?? ''}`;
    const at = Number(c.createdAt ?? 0);
    const cur = newest.get(k);
    if (!cur || at > cur.createdAt) newest.set(k, { id: c.id, createdAt: at });
  }
  const keep = new Set([...newest.values()].map((c) => c.id));
  for (const c of dead) {
    if (keep.has(c.id)) continue;
    await cri.runtime.removeContainer({ containerId: c.id }).catch(() => undefined);
  }
}

function ref(pod: Pod): { namespace: string; name: string; uid: string } {
  return { namespace: pod.metadata?.namespace ?? 'default', name: pod.metadata?.name ?? '', uid: pod.metadata?.uid ?? '' };
}
