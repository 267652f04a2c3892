/** ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats. */
import fsp from 'node:fs/promises';
import pLimit from 'p-limit';
import type { ContainerStats } from '../gen/runtime/v1/ContainerStats.js';
import type { PodSandboxStats } from '../gen/runtime/v1/PodSandboxStats.js';
import type { ContainerRecord, ContainerService } from '../container/service.js';
import { cgroupUsage, CpuRates, LayerUsage, netDev, parseNetDev, type NetDevCounters } from '../container/stats.js';
import { nowWireNs } from '../container/time.js';
import { hasInfra, type SandboxRecord, type SandboxService } from '../sandbox/service.js';
import { invalidArgument } from '../errors.js';
import { run } from '../sys/run.js';
import { matchLabels } from './sandbox.js';

const u64 = (v: number | undefined) => (v === undefined ? null : { value: v });

/**
 * The CPU rate of the cgroup at `cgroupsPath` since the last sample of `key`;
 * with no earlier sample, over a short interval now.
 */
async function cpuRate(rates: CpuRates, key: string, cgroupsPath: string, cpuNs: number | undefined): Promise<number | undefined> {
  if (cpuNs === undefined) return undefined;
  if (rates.has(key)) return rates.sample(key, cpuNs);
  // A first call measures over 100 ms of its own, so that it has a rate to give.
  rates.sample(key, cpuNs);
  await new Promise((r) => setTimeout(r, 100));
  const again = (await cgroupUsage(cgroupsPath)).cpuNs;
  return again === undefined ? undefined : rates.sample(key, again, 50_000_000n);
}

type Layers = Pick<ContainerService, 'writableLayer'>;

/** What the stats and metrics calls of one daemon share: the walks of writable layers and the reads of pinned namespaces. */
export interface StatsReaders {
  layers: LayerUsage;
  pins: PinnedNetDev;
}

export function statsReaders(): StatsReaders {
  return { layers: new LayerUsage(), pins: new PinnedNetDev() };
}

async function containerStats(c: ContainerRecord, rates: CpuRates, layers: Layers, readers: StatsReaders, processes?: { count: number }): Promise<ContainerStats> {
  const ts = nowWireNs();
  const running = c.state === 'CONTAINER_RUNNING';
  const cg = running ? await cgroupUsage(c.spec.linux.cgroupsPath) : {};
  if (processes) processes.count += cg.pids ?? 0;
  const nanoCores = running ? await cpuRate(rates, c.id, c.spec.linux.cgroupsPath, cg.cpuNs) : undefined;
  const upper = layers.writableLayer(c.id);
  const disk = await readers.layers.of(upper);
  return {
    attributes: { id: c.id, metadata: c.config.metadata, labels: c.config.labels, annotations: c.config.annotations },
    cpu: { timestamp: ts, usageCoreNanoSeconds: u64(cg.cpuNs ?? 0), usageNanoCores: u64(nanoCores ?? (running ? undefined : 0)) },
    memory: {
      timestamp: ts,
      workingSetBytes: u64(cg.workingSet ?? 0),
      availableBytes: u64(cg.limit !== undefined && cg.workingSet !== undefined ? Math.max(0, cg.limit - cg.workingSet) : undefined),
      usageBytes: u64(cg.memoryUsage ?? 0),
      rssBytes: u64(cg.rss),
      pageFaults: u64(cg.pageFaults),
      majorPageFaults: u64(cg.majorPageFaults),
    },
    writableLayer: { timestamp: ts, fsId: { mountpoint: upper }, usedBytes: u64(disk.bytes), inodesUsed: u64(disk.inodes) },
  };
}

/**
 * The pod's interface counters. Any process in the pod's network namespace
 * shows them in /proc/<pid>/net/dev: the infra process, or, in a pod without
 * one, a running container; with neither, a helper entered into the pinned
 * namespace reads them.
 */
async function podNetDev(s: SandboxRecord, running: ContainerRecord[], pins: PinnedNetDev): Promise<NetDevCounters> {
  if (!s.netns) return [];
  const pin = await fsp.stat(s.netns).catch(() => undefined);
  if (!pin) return [];
  // A recorded pid may be stale and reused by another process: it counts only while it is in the pod's namespace.
  const inPod = async (pid: number) => {
    const ns = await fsp.stat(`/proc/${pid}/ns/net`).catch(() => undefined);
    return ns !== undefined && ns.ino === pin.ino && ns.dev === pin.dev;
  };
  for (const pid of [...(hasInfra(s) && s.infraPid ? [s.infraPid] : []), ...running.map((c) => c.pid ?? 0).filter(Boolean)]) {
    if (!(await inPod(pid))) continue;
    const ifaces = await netDev(pid);
    if (ifaces.length) return ifaces;
  }
  return hasInfra(s) ? [] : pins.read(s.netns);
}

/**
 * The helper reads of pinned namespaces under way, by pin: every stats call
 * on a pod without a running process asked for its own `nsenter`, so a burst
 * of PodSandboxStats (or ListPodSandboxStats over many such pods) forked one
 * helper per call at once (1000 calls: ~500 helpers alive, ~1600 fds, other
 * RPCs waiting over a second). Calls for the same pin share one read, and at
 * most two helpers run at a time.
 */
class PinnedNetDev {
  private readonly reads = new Map<string, Promise<NetDevCounters>>();
  private readonly helpers = pLimit(2);

  read(netns: string): Promise<NetDevCounters> {
    let read = this.reads.get(netns);
    if (!read) {
      read = this.helpers(
        () =>
          run('nsenter', [`--net=${netns}`, 'cat', '/proc/net/dev'], { timeoutMs: 5_000, maxOutput: 1 << 20 }).then(
            (r) => (r.code === 0 ? parseNetDev(r.stdout) : []),
            () => [],
          ),
      ).finally(() => this.reads.delete(netns));
      this.reads.set(netns, read);
    }
    return read;
  }
}

async function podStats(s: SandboxRecord, containers: ContainerRecord[], rates: CpuRates, layers: Layers, readers: StatsReaders): Promise<PodSandboxStats> {
  const ts = nowWireNs();
  // The pod's processes: its containers' and, if it has one, the infra process's.
  const processes = { count: 0 };
  const cs = await Promise.all(containers.map((c) => containerStats(c, rates, layers, readers, processes)));
  const infraCgroup = `${s.cgroupParent.replace(/\/+$/, '')}/skiff-${s.id}`;
  const infra = s.infraPid ? await cgroupUsage(infraCgroup) : {};
  const infraRate = s.infraPid ? await cpuRate(rates, s.id, infraCgroup, infra.cpuNs) : undefined;
  const sum = (f: (x: ContainerStats) => number | undefined, base = 0) => cs.reduce((a, x) => a + (f(x) ?? 0), base);
  const ifaces = await podNetDev(s, containers, readers.pins);
  const toIface = (i: (typeof ifaces)[0]) => ({ name: i.name, rxBytes: u64(i.rxBytes), rxErrors: u64(i.rxErrors), txBytes: u64(i.txBytes), txErrors: u64(i.txErrors) });
  return {
    attributes: { id: s.id, metadata: s.config.metadata, labels: s.config.labels, annotations: s.config.annotations },
    linux: {
      cpu: {
        timestamp: ts,
        usageCoreNanoSeconds: u64(sum((x) => Number(x.cpu?.usageCoreNanoSeconds?.value ?? 0), infra.cpuNs ?? 0)),
        usageNanoCores: u64(sum((x) => Number(x.cpu?.usageNanoCores?.value ?? 0), infraRate ?? 0)),
      },
      memory: { timestamp: ts, workingSetBytes: u64(sum((x) => Number(x.memory?.workingSetBytes?.value ?? 0), infra.workingSet ?? 0)), usageBytes: u64(sum((x) => Number(x.memory?.usageBytes?.value ?? 0), infra.memoryUsage ?? 0)) },
      network: { timestamp: ts, defaultInterface: ifaces.find((i) => i.name === 'eth0') ? toIface(ifaces.find((i) => i.name === 'eth0')!) : null, interfaces: ifaces.map(toIface) },
      process: { timestamp: ts, processCount: u64(processes.count + (infra.pids ?? 0)) },
      containers: cs,
    },
  };
}

export function statsHandlers(sandboxes: SandboxService, containers: ContainerService, readers: StatsReaders) {
  // The previous CPU sample of each container and pod, for usageNanoCores.
  const rates = new CpuRates();
  const forgetGone = () => rates.retain(new Set([...containers.listView().map((c) => c.id), ...sandboxes.listView().map((s) => s.id)]));
  return {
    ContainerStats: async (req: { containerId: string }) => {
      if (!req.containerId) throw invalidArgument('ContainerStats: container_id is required');
      return { stats: await containerStats(containers.mustView(req.containerId), rates, containers, readers) };
    },
    ListContainerStats: async (req: { filter: { id: string; podSandboxId: string; labelSelector: Record<string, string> } | null }) => {
      const f = req.filter;
      // Every container, created and exited ones included (with zero usage), as containerd answers.
      let items = containers.listView();
      if (f?.id) items = items.filter((c) => c.id.startsWith(f.id));
      if (f?.podSandboxId) items = items.filter((c) => c.sandboxId.startsWith(f.podSandboxId));
      if (f && Object.keys(f.labelSelector).length) items = items.filter((c) => matchLabels(c.config.labels, f.labelSelector));
      forgetGone();
      return { stats: await Promise.all(items.map((c) => containerStats(c, rates, containers, readers))) };
    },
    PodSandboxStats: async (req: { podSandboxId: string }) => {
      const s = sandboxes.mustView(req.podSandboxId);
      return { stats: await podStats(s, containers.listView(s.id).filter((c) => c.state === 'CONTAINER_RUNNING'), rates, containers, readers) };
    },
    ListPodSandboxStats: async (req: { filter: { id: string; labelSelector: Record<string, string> } | null }) => {
      const f = req.filter;
      let items = sandboxes.listView().filter((s) => s.state === 'SANDBOX_READY');
      if (f?.id) items = items.filter((s) => s.id.startsWith(f.id));
      if (f && Object.keys(f.labelSelector).length) items = items.filter((s) => matchLabels(s.config.labels, f.labelSelector));
      forgetGone();
      return { stats: await Promise.all(items.map((s) => podStats(s, containers.listView(s.id).filter((c) => c.state === 'CONTAINER_RUNNING'), rates, containers, readers))) };
    },
  };
}

/** The cAdvisor-style metrics skiff reports through ListPodSandboxMetrics. */
const METRICS = [
  { name: 'container_cpu_usage_seconds_total', help: 'Cumulative cpu time consumed in seconds.', type: 'COUNTER' as const },
  { name: 'container_memory_working_set_bytes', help: 'Current working set in bytes.', type: 'GAUGE' as const },
  { name: 'container_memory_usage_bytes', help: 'Current memory usage in bytes, including all memory regardless of when it was accessed.', type: 'GAUGE' as const },
  { name: 'container_fs_usage_bytes', help: 'Number of bytes that are consumed by the container on this filesystem.', type: 'GAUGE' as const },
];
const LABELS = ['container', 'pod', 'namespace'];

export function metricsHandlers(sandboxes: SandboxService, containers: ContainerService, readers: StatsReaders) {
  const rates = new CpuRates();
  return {
    ListMetricDescriptors: async () => ({ descriptors: METRICS.map((m) => ({ name: m.name, help: m.help, labelKeys: LABELS })) }),
    ListPodSandboxMetrics: async () => {
      const out = [];
      for (const s of sandboxes.listView().filter((x) => x.state === 'SANDBOX_READY')) {
        const md = s.config.metadata!;
        const ctrs = [];
        for (const c of containers.listView(s.id).filter((x) => x.state === 'CONTAINER_RUNNING')) {
          const st = await containerStats(c, rates, containers, readers);
          const ts = nowWireNs();
          const labels = [c.config.metadata?.name ?? '', md.name, md.namespace];
          const values: Record<string, number> = {
            container_cpu_usage_seconds_total: Math.floor(Number(st.cpu?.usageCoreNanoSeconds?.value ?? 0) / 1e9),
            container_memory_working_set_bytes: Number(st.memory?.workingSetBytes?.value ?? 0),
            container_memory_usage_bytes: Number(st.memory?.usageBytes?.value ?? 0),
            container_fs_usage_bytes: Number(st.writableLayer?.usedBytes?.value ?? 0),
          };
          ctrs.push({
            containerId: c.id,
            metrics: METRICS.map((m) => ({ name: m.name, timestamp: ts, metricType: m.type, labelValues: labels, value: { value: values[m.name] } })),
          });
        }
        out.push({ podSandboxId: s.id, metrics: [], containerMetrics: ctrs });
      }
      return { podMetrics: out };
    },
  };
}
