/**
 * The node registers itself as a kubelet does: its Node object (labels,
 * addresses, capacity and allocatable, nodeInfo, the runtime's images,
 * the Ready condition from the runtime's own status), a Lease in
 * kube-node-lease renewed every 10 s, and the Node's status written when
 * it changes and at least every 5 minutes.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { CriEndpoint } from '../kubelet-lite/cri-client.js';
import { PRESSURE_TAINTS, thresholdQuantity, type Condition, type Threshold } from '../kubelet-lite/eviction.js';
import { metadataErrors } from '../kubelet-lite/validate.js';
import type { Logger } from '../log.js';
import { KUBE_VERSION } from '../version.js';

export interface NodeReporterOptions {
  client: ApiClient;
  cri: CriEndpoint;
  nodeName: string;
  hostIP: string;
  rootDir: string;
  maxPods: number;
  /** The port of the node's status API (the kubelet's daemon endpoint). */
  statusPort: number;
  log: Logger;
  now?: () => number;
  /** How often the lease is renewed and the status looked at (the kubelet's 10 s). */
  everyMs?: number;
  /** The status is written at least this often even unchanged (the kubelet's nodeStatusReportFrequency, 5 min). */
  reportEveryMs?: number;
  /** `--node-labels` and `--register-with-taints`: put on the Node at registration, and again at a start that finds them missing. */
  labels?: Record<string, string>;
  taints?: Obj[];
  /** The eviction manager: its pressure conditions, and its hard thresholds (kept out of allocatable). */
  eviction?: { conditions(): Set<Condition>; thresholds: Threshold[] };
  /** Records an Event on the Node (a condition's transition: NodeReady, NodeHasDiskPressure and the like). */
  nodeEvent?(type: 'Normal' | 'Warning', reason: string, message: string): void;
}

/** The memory the kubelet's default hard eviction threshold keeps back (memory.available<100Mi), without an eviction manager. */
const EVICTION_MEMORY = 100 * 1024 * 1024;
/** nodefs.available<10%. */
const EVICTION_NODEFS = 0.1;

/** Each pressure condition as the kubelet words it, when true and when false. */
const PRESSURE_WORDS: Record<Condition, { true: [string, string]; false: [string, string] }> = {
  MemoryPressure: { true: ['KubeletHasInsufficientMemory', 'kubelet has insufficient memory available'], false: ['KubeletHasSufficientMemory', 'kubelet has sufficient memory available'] },
  DiskPressure: { true: ['KubeletHasDiskPressure', 'kubelet has disk pressure'], false: ['KubeletHasNoDiskPressure', 'kubelet has no disk pressure'] },
  PIDPressure: { true: ['KubeletHasInsufficientPID', 'kubelet has insufficient PID available'], false: ['KubeletHasSufficientPID', 'kubelet has sufficient PID available'] },
};
/** The reason of the Normal event the kubelet records on the Node when a condition is set to each status. */
const CONDITION_EVENTS: Record<Condition | 'Ready', { True: string; False: string }> = {
  MemoryPressure: { True: 'NodeHasInsufficientMemory', False: 'NodeHasSufficientMemory' },
  DiskPressure: { True: 'NodeHasDiskPressure', False: 'NodeHasNoDiskPressure' },
  PIDPressure: { True: 'NodeHasInsufficientPID', False: 'NodeHasSufficientPID' },
  Ready: { True: 'NodeReady', False: 'NodeNotReady' },
};
const MAX_IMAGES = 50;

const rfc3339 = (ms: number) => new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
/** metav1.MicroTime. */
const microTime = (ms: number) => new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
const ki = (bytes: number) => `${Math.floor(bytes / 1024)}Ki`;

async function readText(file: string): Promise<string> {
  return fs.readFile(file, 'utf8').catch(() => '');
}

export class NodeReporter {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private lastReport = 0;
  private lastConditions = '';
  private readonly now: () => number;
  private ticking: Promise<void> | undefined;

  constructor(private readonly o: NodeReporterOptions) {
    this.now = o.now ?? Date.now;
  }

  start(): void {
    const loop = () => {
      if (this.stopped) return;
      this.ticking = this.tick().catch((err) => this.o.log.warn('could not report the node to the API', { error: errorMessage(err) }));
      void this.ticking.finally(() => {
        if (this.stopped) return;
        this.timer = setTimeout(loop, this.o.everyMs ?? 10_000);
        this.timer.unref();
      });
    };
    loop();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.ticking;
  }

  /** One round: the Node exists, its status is current, the lease renewed. */
  async tick(): Promise<void> {
    const node = await this.ensureNode();
    await this.report(node);
    await this.taint();
    await this.renewLease();
  }

  /** Looks now (the pressure changed), not at the next period. */
  poke(): void {
    if (this.stopped) return;
    void (this.ticking ?? Promise.resolve()).then(() => (this.stopped ? undefined : this.tick())).catch((err) => this.o.log.warn('could not report the node to the API', { error: errorMessage(err) }));
  }

  /**
   * The node lifecycle controller's TaintNodesByCondition, done by the node
   * itself (there is no other controller to): each pressure condition's
   * NoSchedule taint while it holds, so the scheduler places no pod here
   * that does not tolerate it.
   */
  private async taint(): Promise<void> {
    if (!this.o.eviction) return;
    const pressure = this.o.eviction.conditions();
    for (let attempt = 0; attempt < 3; attempt++) {
      const node = await this.o.client.get('nodes', '', this.o.nodeName);
      const spec = (node.spec ?? {}) as Obj;
      const taints = Array.isArray(spec.taints) ? (spec.taints as Obj[]) : [];
      const ours = new Set(Object.values(PRESSURE_TAINTS));
      const kept = taints.filter((t) => !(ours.has(String(t.key)) && t.effect === 'NoSchedule'));
      const wanted = [...kept, ...(Object.keys(PRESSURE_TAINTS) as Condition[]).filter((c) => pressure.has(c)).map((c) => taints.find((t) => t.key === PRESSURE_TAINTS[c] && t.effect === 'NoSchedule') ?? { key: PRESSURE_TAINTS[c], effect: 'NoSchedule' })];
      if (JSON.stringify(wanted) === JSON.stringify(taints)) return;
      const next: Obj = { ...spec, taints: wanted };
      if (!wanted.length) delete next.taints;
      try {
        await this.o.client.update('nodes', '', this.o.nodeName, { ...node, spec: next });
        return;
      } catch (err) {
        if (!(err instanceof ApiError && err.reason === 'Conflict')) throw err;
      }
    }
  }

  private async get(resource: string, namespace: string, name: string): Promise<ApiObject | undefined> {
    try {
      return await this.o.client.get(resource, namespace, name);
    } catch (err) {
      if (err instanceof ApiError && err.reason === 'NotFound') return undefined;
      throw err;
    }
  }

  private async ensureNode(): Promise<ApiObject> {
    const existing = await this.get('nodes', '', this.o.nodeName);
    if (existing) return this.withFlags(existing);
    const labels = {
      ...this.o.labels,
      'beta.kubernetes.io/arch': goArch(),
      'beta.kubernetes.io/os': 'linux',
      'kubernetes.io/arch': goArch(),
      'kubernetes.io/hostname': this.o.nodeName,
      'kubernetes.io/os': 'linux',
    };
    this.lastReport = 0;
    const spec = this.o.taints?.length ? { taints: this.o.taints } : {};
    return this.o.client.create('nodes', '', { apiVersion: 'v1', kind: 'Node', metadata: { name: this.o.nodeName, labels }, spec });
  }

  /** A Node registered before: the flags' labels and taints it lacks are put back (ones removed from the flags stay, as the kubelet leaves them). */
  private flagsChecked = false;
  private async withFlags(node: ApiObject): Promise<ApiObject> {
    if (this.flagsChecked) return node;
    this.flagsChecked = true;
    const labels = node.metadata.labels ?? {};
    const spec = (node.spec ?? {}) as Obj;
    const taints = Array.isArray(spec.taints) ? (spec.taints as Obj[]) : [];
    const missingLabels = Object.entries(this.o.labels ?? {}).filter(([k, v]) => labels[k] !== v);
    const missingTaints = (this.o.taints ?? []).filter((t) => !taints.some((x) => x.key === t.key && x.effect === t.effect));
    if (missingLabels.length === 0 && missingTaints.length === 0) return node;
    const next = { ...node, metadata: { ...node.metadata, labels: { ...labels, ...Object.fromEntries(missingLabels) } }, spec: { ...spec, ...(missingTaints.length ? { taints: [...taints, ...missingTaints] } : {}) } };
    return this.o.client.update('nodes', '', this.o.nodeName, next);
  }

  private async report(node: ApiObject): Promise<void> {
    const now = this.now();
    const status = await this.status(node, now);
    const conditions = JSON.stringify((status.conditions as Obj[]).map((c) => [c.type, c.status, c.reason, c.message]));
    const rest = JSON.stringify({ ...status, conditions: undefined });
    const old = (node.status ?? {}) as Obj;
    const oldRest = JSON.stringify({ ...old, conditions: undefined });
    if (conditions === this.lastConditions && rest === oldRest && now - this.lastReport < (this.o.reportEveryMs ?? 300_000)) return;
    try {
      await this.o.client.update('nodes', '', this.o.nodeName, { ...node, status }, { status: true });
    } catch (err) {
      // A client changed the Node's spec meanwhile (kubectl cordon): the status goes onto the Node as it is now.
      // Only the status is written (the status subresource), so that spec stays as the client made it.
      if (!(err instanceof ApiError && err.reason === 'Conflict')) throw err;
      const fresh = await this.o.client.get('nodes', '', this.o.nodeName);
      await this.o.client.update('nodes', '', this.o.nodeName, { ...fresh, status }, { status: true });
    }
    this.lastReport = now;
    this.lastConditions = conditions;
    // A condition set anew (or first set, at registration): the kubelet's "status is now" event.
    const before = new Map((((old.conditions as Obj[] | undefined) ?? []) as Obj[]).map((c) => [String(c.type), String(c.status)]));
    for (const c of status.conditions as Obj[]) {
      const words = CONDITION_EVENTS[c.type as Condition | 'Ready'] as { True: string; False: string } | undefined;
      if (!words || before.get(String(c.type)) === c.status) continue;
      const reason = c.status === 'True' ? words.True : words.False;
      this.o.nodeEvent?.('Normal', reason, `Node ${this.o.nodeName} status is now: ${reason}`);
    }
  }

  private async status(node: ApiObject, now: number): Promise<Obj> {
    const { cri } = this.o;
    const [runtime, version, images, statfs, osRelease, machineId, bootId] = await Promise.all([
      cri.runtime.status({ verbose: false }, 10_000).catch((err: unknown) => err as Error),
      cri.runtime.version({ version: '0.1.0' }, 10_000).catch(() => undefined),
      cri.images.listImages({}, 10_000).catch(() => undefined),
      fs.statfs(this.o.rootDir).catch(() => undefined),
      readText('/etc/os-release'),
      readText('/etc/machine-id'),
      readText('/proc/sys/kernel/random/boot_id'),
    ]);
    const storage = statfs ? statfs.blocks * statfs.bsize : 0;
    const memory = os.totalmem();
    const capacity = { cpu: String(os.cpus().length), 'ephemeral-storage': ki(storage), 'hugepages-1Gi': '0', 'hugepages-2Mi': '0', memory: ki(memory), pods: String(this.o.maxPods) };
    // Allocatable keeps back the hard eviction thresholds of memory and nodefs, as the kubelet's.
    const hard = (signal: string) => this.o.eviction?.thresholds.find((t) => t.hard && t.signal === signal);
    const memReserve = this.o.eviction ? (hard('memory.available') ? thresholdQuantity(hard('memory.available')!.value, memory) : 0) : EVICTION_MEMORY;
    const fsReserve = this.o.eviction ? (hard('nodefs.available') ? thresholdQuantity(hard('nodefs.available')!.value, storage) : 0) : storage * EVICTION_NODEFS;
    const allocatable = { ...capacity, 'ephemeral-storage': String(Math.max(0, Math.floor(storage - fsReserve))), memory: ki(Math.max(0, memory - memReserve)) };
    const pressure = this.o.eviction?.conditions() ?? new Set<Condition>();
    const pressureCondition = (c: Condition) => {
      const [reason, message] = PRESSURE_WORDS[c][pressure.has(c) ? 'true' : 'false'];
      return condition(c, { status: pressure.has(c) ? 'True' : 'False', reason, message });
    };

    // Ready as the kubelet reports it: the runtime answers and says it and its network are ready.
    let ready = { status: 'True', reason: 'KubeletReady', message: 'kubelet is posting ready status' };
    if (runtime instanceof Error) {
      ready = { status: 'False', reason: 'KubeletNotReady', message: `container runtime is down: ${runtime.message}` };
    } else {
      const conds = runtime.status?.conditions ?? [];
      const problems = conds.filter((c) => !c.status).map((c) => `container runtime ${c.type === 'NetworkReady' ? 'network ' : ''}not ready: ${c.type}=false reason:${c.reason} message:${c.message}`);
      if (problems.length > 0) ready = { status: 'False', reason: 'KubeletNotReady', message: problems.join(', ') };
    }
    const before = new Map(((node.status as Obj | undefined)?.conditions as Obj[] | undefined ?? []).map((c) => [String(c.type), c]));
    const condition = (type: string, s: { status: string; reason: string; message: string }) => {
      const old = before.get(type);
      return { type, ...s, lastHeartbeatTime: rfc3339(now), lastTransitionTime: old && old.status === s.status ? old.lastTransitionTime : rfc3339(now) };
    };
    const pretty = /^PRETTY_NAME="?([^"\n]*)"?$/m.exec(osRelease)?.[1] ?? 'Linux';
    const statusAddress = [{ type: 'InternalIP', address: this.o.hostIP }, { type: 'Hostname', address: os.hostname() }];
    return {
      capacity,
      allocatable,
      conditions: [
        pressureCondition('MemoryPressure'),
        pressureCondition('DiskPressure'),
        pressureCondition('PIDPressure'),
        condition('Ready', ready),
      ],
      addresses: statusAddress,
      daemonEndpoints: { kubeletEndpoint: { Port: this.o.statusPort } },
      nodeInfo: {
        machineID: machineId.trim(),
        systemUUID: machineId.trim(),
        bootID: bootId.trim(),
        kernelVersion: os.release(),
        osImage: pretty,
        containerRuntimeVersion: version ? `${version.runtimeName}://${version.runtimeVersion}` : 'unknown://',
        kubeletVersion: KUBE_VERSION.gitVersion,
        kubeProxyVersion: '',
        operatingSystem: 'linux',
        architecture: goArch(),
      },
      images: (images?.images ?? [])
        .slice()
        .sort((a, b) => Number(b.size ?? 0) - Number(a.size ?? 0))
        .slice(0, MAX_IMAGES)
        .map((i) => ({ names: [...(i.repoDigests ?? []), ...(i.repoTags ?? [])], sizeBytes: Number(i.size ?? 0) })),
    };
  }

  private async renewLease(): Promise<void> {
    const now = microTime(this.now());
    const lease = await this.get('leases.coordination.k8s.io', 'kube-node-lease', this.o.nodeName);
    const spec = { holderIdentity: this.o.nodeName, leaseDurationSeconds: 40, renewTime: now };
    if (!lease) {
      await this.o.client.create('leases.coordination.k8s.io', 'kube-node-lease', { apiVersion: 'coordination.k8s.io/v1', kind: 'Lease', metadata: { name: this.o.nodeName, namespace: 'kube-node-lease' }, spec });
      return;
    }
    await this.o.client.update('leases.coordination.k8s.io', 'kube-node-lease', this.o.nodeName, { ...lease, spec: { ...(lease.spec as Obj), ...spec } });
  }
}

/** GOARCH names, as node labels carry them. */
function goArch(): string {
  const a = os.arch();
  return a === 'x64' ? 'amd64' : a === 'ia32' ? '386' : a;
}

/** The kubernetes.io and k8s.io labels the kubelet lets `--node-labels` set: these names, and any under an allowed prefix. */
const KUBELET_LABELS = new Set([
  'beta.kubernetes.io/arch', 'beta.kubernetes.io/instance-type', 'beta.kubernetes.io/os',
  'failure-domain.beta.kubernetes.io/region', 'failure-domain.beta.kubernetes.io/zone',
  'kubernetes.io/arch', 'kubernetes.io/hostname', 'kubernetes.io/os',
  'node.kubernetes.io/instance-type', 'topology.kubernetes.io/region', 'topology.kubernetes.io/zone',
]);
/** The kubelet's two prefixes, and node-role: on a whole node there is no NodeRestriction to keep roles from the kubelet. */
const KUBELET_LABEL_PREFIXES = ['kubelet.kubernetes.io', 'node.kubernetes.io', 'node-role.kubernetes.io'];

function isKubernetesDomain(key: string): boolean {
  const slash = key.indexOf('/');
  if (slash < 0) return false;
  const prefix = key.slice(0, slash);
  return ['kubernetes.io', 'k8s.io'].some((d) => prefix === d || prefix.endsWith(`.${d}`));
}

/**
 * `--node-labels k=v,k2=v2` (repeatable), each label checked as the API checks
 * a Node's, and those in the kubernetes.io and k8s.io namespaces limited as the kubelet limits them.
 */
export function parseNodeLabels(values: string[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of values.flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean)) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new Error(`--node-labels takes key=value pairs, not "${item}"`);
    out[item.slice(0, eq)] = item.slice(eq + 1);
  }
  const bad = metadataErrors({ name: 'node', labels: out }, false);
  if (bad.length > 0) throw new Error(`--node-labels: ${bad.map((e) => e.message).join('; ')}`);
  const reserved = Object.keys(out).filter((k) => isKubernetesDomain(k) && !KUBELET_LABELS.has(k) && !KUBELET_LABEL_PREFIXES.some((p) => k.startsWith(`${p}/`) || k.slice(0, k.indexOf('/')).endsWith(`.${p}`)));
  if (reserved.length > 0) {
    throw new Error(
      `--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels: ${reserved.join(', ')}; those namespaces take only ${[...KUBELET_LABELS].join(', ')}, and labels under ${KUBELET_LABEL_PREFIXES.join(', ')}`,
    );
  }
  return out;
}

const TAINT_EFFECTS = ['NoSchedule', 'PreferNoSchedule', 'NoExecute'];

/** `--register-with-taints key=value:Effect,key:Effect` (repeatable), as the kubelet's flag. */
export function parseTaints(values: string[]): Obj[] {
  const out: Obj[] = [];
  for (const item of values.flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean)) {
    const m = /^([^=:]+)(?:=([^:]*))?:([A-Za-z]+)$/.exec(item);
    if (!m || !TAINT_EFFECTS.includes(m[3]!)) throw new Error(`--register-with-taints takes key=value:Effect or key:Effect with Effect one of ${TAINT_EFFECTS.join(', ')}, not "${item}"`);
    const [, key, value, effect] = m;
    const bad = metadataErrors({ name: 'node', labels: { [key!]: value ?? '' } }, false);
    if (bad.length > 0) throw new Error(`--register-with-taints "${item}": ${bad.map((e) => e.message).join('; ')}`);
    if (out.some((t) => t.key === key && t.effect === effect)) throw new Error(`--register-with-taints names ${key}:${effect} twice`);
    out.push({ key, ...(value ? { value } : {}), effect });
  }
  return out;
}
