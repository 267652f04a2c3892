/**
 * The kubelet's /stats/summary: the node's CPU and memory from /proc and
 * each pod's and container's from the runtime's CRI stats
 * (ListPodSandboxStats), in the kubelet's Summary shape (the fields
 * metrics-server and `kubectl top` read).
 */
import fsp from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { CpuUsage__Output } from '../gen/runtime/v1/CpuUsage.js';
import type { MemoryUsage__Output } from '../gen/runtime/v1/MemoryUsage.js';
import type { CriEndpoint } from './cri-client.js';

export interface CpuStats {
  time: string;
  usageNanoCores?: number;
  usageCoreNanoSeconds?: number;
}

export interface MemoryStats {
  time: string;
  availableBytes?: number;
  usageBytes?: number;
  workingSetBytes?: number;
  rssBytes?: number;
}

export interface ContainerSummary {
  name: string;
  startTime?: string;
  cpu?: CpuStats;
  memory?: MemoryStats;
}

export interface PodSummary {
  podRef: { name: string; namespace: string; uid: string };
  startTime?: string;
  containers: ContainerSummary[];
  cpu?: CpuStats;
  memory?: MemoryStats;
}

export interface Summary {
  node: { nodeName: string; startTime?: string; cpu?: CpuStats; memory?: MemoryStats };
  pods: PodSummary[];
}

/** CPU time in /proc/stat is in USER_HZ ticks, 100 a second on every Linux that matters. */
const NS_PER_TICK = 10_000_000;

/** The host's total CPU time spent working (not idle or waiting on I/O), in ns. */
export function parseProcStatCpu(text: string): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith('cpu '));
  if (!line) return undefined;
  const f = line.trim().split(/\s+/).slice(1).map(Number);
  if (f.length < 4 || f.some((x) => !Number.isFinite(x))) return undefined;
  // user nice system idle iowait irq softirq steal (guest time is already in user).
  const busy = (f[0] ?? 0) + (f[1] ?? 0) + (f[2] ?? 0) + (f[5] ?? 0) + (f[6] ?? 0) + (f[7] ?? 0);
  return busy * NS_PER_TICK;
}

/** The node's memory as the kubelet reports it: working set is usage less inactive file pages. */
export function parseMeminfo(text: string): { usageBytes: number; workingSetBytes: number; availableBytes: number } | undefined {
  const kb = new Map<string, number>();
  for (const l of text.split('\n')) {
    const m = /^([^:]+):\s+(\d+)(?:\s+kB)?$/.exec(l.trim());
    if (m) kb.set(m[1]!, Number(m[2]) * 1024);
  }
  const total = kb.get('MemTotal');
  const free = kb.get('MemFree');
  if (total === undefined || free === undefined) return undefined;
  const usage = total - free;
  const workingSet = Math.max(0, usage - (kb.get('Inactive(file)') ?? 0));
  return { usageBytes: usage, workingSetBytes: workingSet, availableBytes: Math.max(0, total - workingSet) };
}

/** Two CPU samples make a rate: the builder keeps the previous one. */
interface CpuSample {
  atNs: bigint;
  usageNs: number;
}

export interface SummaryBuilderOptions {
  nodeName: string;
  cri: CriEndpoint;
  /** The pods the agent runs: only their sandboxes are reported. */
  pods: () => Pod[];
  /** Where /proc is (tests hand in a directory with stat and meminfo). */
  procRoot?: string;
  now?: () => Date;
  /** How long to wait for a second CPU sample when there is no earlier one. */
  firstSampleGapMs?: number;
}

export class SummaryBuilder {
  private last: CpuSample | undefined;

  constructor(private readonly opts: SummaryBuilderOptions) {}

  async build(): Promise<Summary> {
    const [node, pods] = await Promise.all([this.nodeStats(), this.podStats()]);
    return { node, pods };
  }

  private async nodeStats(): Promise<Summary['node']> {
    const proc = this.opts.procRoot ?? '/proc';
    const time = (this.opts.now?.() ?? new Date()).toISOString();
    const node: Summary['node'] = { nodeName: this.opts.nodeName };
    const usage = parseProcStatCpu(await fsp.readFile(path.join(proc, 'stat'), 'utf8').catch(() => ''));
    if (usage !== undefined) {
      let rate = this.rate(usage);
      if (rate === undefined) {
        await new Promise((r) => setTimeout(r, this.opts.firstSampleGapMs ?? 100).unref());
        const again = parseProcStatCpu(await fsp.readFile(path.join(proc, 'stat'), 'utf8').catch(() => ''));
        if (again !== undefined) rate = this.rate(again);
      }
      node.cpu = { time, usageCoreNanoSeconds: this.last?.usageNs ?? usage, ...(rate !== undefined ? { usageNanoCores: rate } : {}) };
    }
    const mem = parseMeminfo(await fsp.readFile(path.join(proc, 'meminfo'), 'utf8').catch(() => ''));
    if (mem) node.memory = { time, ...mem };
    const uptime = Number((await fsp.readFile(path.join(proc, 'uptime'), 'utf8').catch(() => '')).split(' ')[0]);
    if (Number.isFinite(uptime) && uptime > 0) node.startTime = new Date(Date.now() - uptime * 1000).toISOString().replace(/\.\d{3}Z$/, 'Z');
    return node;
  }

  private rate(usageNs: number): number | undefined {
    const at = process.hrtime.bigint();
    const prev = this.last;
    this.last = { atNs: at, usageNs };
    if (!prev || at <= prev.atNs || usageNs < prev.usageNs) return undefined;
    return Math.round(((usageNs - prev.usageNs) / Number(at - prev.atNs)) * 1e9);
  }

  private async podStats(): Promise<PodSummary[]> {
    const pods = this.opts.pods();
    const byUid = new Map(pods.map((p) => [p.metadata?.uid ?? '', p]));
    const byName = new Map(pods.map((p) => [`${p.metadata?.namespace ?? 'default'}/${p.metadata?.name ?? ''}`, p]));
    const ready = await this.opts.cri.runtime.ListPodSandbox({ filter: { state: { state: 'SANDBOX_READY' } } });
    const readyIds = new Set((ready.items ?? []).map((s) => s.id));
    const stats = await this.opts.cri.runtime.ListPodSandboxStats({});
    const out: PodSummary[] = [];
    for (const s of stats.stats ?? []) {
      const md = s.attributes?.metadata;
      if (!md || !readyIds.has(s.attributes?.id ?? '')) continue;
      const pod = byUid.get(md.uid) ?? byName.get(`${md.namespace}/${md.name}`);
      if (!pod) continue;
      out.push({
        podRef: { name: pod.metadata?.name ?? md.name, namespace: pod.metadata?.namespace ?? md.namespace, uid: pod.metadata?.uid ?? md.uid },
        ...(pod.status?.startTime ? { startTime: pod.status.startTime } : {}),
        cpu: cpuOf(s.linux?.cpu),
        memory: memoryOf(s.linux?.memory),
        containers: (s.linux?.containers ?? []).map((c) => ({
          name: c.attributes?.metadata?.name ?? '',
          cpu: cpuOf(c.cpu),
          memory: memoryOf(c.memory),
        })),
      });
    }
    return out;
  }
}

function wireTime(ns: number | undefined): string {
  return ns ? new Date(Math.floor(ns / 1e6)).toISOString() : new Date().toISOString();
}

function cpuOf(c: CpuUsage__Output | null | undefined): CpuStats | undefined {
  if (!c) return undefined;
  return {
    time: wireTime(c.timestamp),
    ...(c.usageNanoCores ? { usageNanoCores: c.usageNanoCores.value } : {}),
    ...(c.usageCoreNanoSeconds ? { usageCoreNanoSeconds: c.usageCoreNanoSeconds.value } : {}),
  };
}

function memoryOf(m: MemoryUsage__Output | null | undefined): MemoryStats | undefined {
  if (!m) return undefined;
  return {
    time: wireTime(m.timestamp),
    ...(m.availableBytes ? { availableBytes: m.availableBytes.value } : {}),
    ...(m.usageBytes ? { usageBytes: m.usageBytes.value } : {}),
    ...(m.workingSetBytes ? { workingSetBytes: m.workingSetBytes.value } : {}),
    ...(m.rssBytes ? { rssBytes: m.rssBytes.value } : {}),
  };
}
