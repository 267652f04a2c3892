/**
 * Resource usage from cgroups, v1 or v2 (detected, not assumed), and the
 * writable layer's disk usage.
 */
import fsSync, { type Dir } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { AT_FDCWD, O_CLOEXEC, openat2, RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, RESOLVE_NO_XDEV } from '../sys/libc.js';

const { O_RDONLY, O_DIRECTORY, O_NOFOLLOW } = fsSync.constants;

const CG = '/sys/fs/cgroup';

async function read(p: string): Promise<string | undefined> {
  try {
    return await fs.readFile(p, 'utf8');
  } catch {
    return undefined;
  }
}

function statField(text: string | undefined, key: string): number | undefined {
  if (!text) return undefined;
  const m = new RegExp(`^${key} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : undefined;
}

let unifiedOnly: boolean | undefined;
async function isUnified(): Promise<boolean> {
  unifiedOnly ??= (await read(path.join(CG, 'cgroup.controllers'))) !== undefined;
  return unifiedOnly;
}

export interface CgroupUsage {
  cpuNs?: number;
  memoryUsage?: number;
  workingSet?: number;
  rss?: number;
  pageFaults?: number;
  majorPageFaults?: number;
  limit?: number;
  pids?: number;
}

/** Usage of the cgroup at `cgroupsPath` (the OCI config's cgroupfs path). */
export async function cgroupUsage(cgroupsPath: string): Promise<CgroupUsage> {
  const rel = cgroupsPath.replace(/^\/+/, '');
  if (await isUnified()) {
    const dir = path.join(CG, rel);
    const cpu = statField(await read(path.join(dir, 'cpu.stat')), 'usage_usec');
    const mem = await read(path.join(dir, 'memory.current'));
    const stat = await read(path.join(dir, 'memory.stat'));
    const usage = mem ? Number(mem) : undefined;
    const inactive = statField(stat, 'inactive_file') ?? 0;
    const max = (await read(path.join(dir, 'memory.max')))?.trim();
    const procs = await read(path.join(dir, 'cgroup.procs'));
    return {
      cpuNs: cpu === undefined ? undefined : cpu * 1000,
      memoryUsage: usage,
      workingSet: usage === undefined ? undefined : Math.max(0, usage - inactive),
      rss: statField(stat, 'anon'),
      pageFaults: statField(stat, 'pgfault'),
      majorPageFaults: statField(stat, 'pgmajfault'),
      limit: max && max !== 'max' ? Number(max) : undefined,
      pids: procs === undefined ? undefined : procs.split('\n').filter(Boolean).length,
    };
  }
  const cpu = await read(path.join(CG, 'cpuacct', rel, 'cpuacct.usage'));
  const mem = await read(path.join(CG, 'memory', rel, 'memory.usage_in_bytes'));
  const stat = await read(path.join(CG, 'memory', rel, 'memory.stat'));
  const limit = await read(path.join(CG, 'memory', rel, 'memory.limit_in_bytes'));
  const procs = await read(path.join(CG, 'pids', rel, 'cgroup.procs'));
  const usage = mem ? Number(mem) : undefined;
  const inactive = statField(stat, 'total_inactive_file') ?? 0;
  const lim = limit ? Number(limit) : undefined;
  return {
    cpuNs: cpu ? Number(cpu) : undefined,
    memoryUsage: usage,
    workingSet: usage === undefined ? undefined : Math.max(0, usage - inactive),
    rss: statField(stat, 'total_rss'),
    pageFaults: statField(stat, 'total_pgfault'),
    majorPageFaults: statField(stat, 'total_pgmajfault'),
    // v1 reports "no limit" as a huge number
    limit: lim !== undefined && lim < 2 ** 62 ? lim : undefined,
    pids: procs === undefined ? undefined : procs.split('\n').filter(Boolean).length,
  };
}

/** Deeper than this, a writable layer's directories are not walked (each level holds two descriptors). */
const MAX_WALK_DEPTH = 256;
/** Layers walked at once: ListContainerStats asks for all of them together. */
const MAX_WALKS = 4;
const WALK_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV;

/**
 * Bytes and inodes under a container's writable layer. Its processes
 * change it while it is walked: every directory is opened beneath the one
 * before with no symlink followed (a directory swapped for a link to the
 * host's / is not entered), entries are read a batch at a time (a directory
 * of a million names is never held whole), and callers asking for the same
 * layer while a walk runs share it. One per daemon: it bounds the walks of
 * every stats and metrics call together.
 */
export class LayerUsage {
  private walking = 0;
  private readonly waiting: Array<() => void> = [];
  private readonly inflight = new Map<string, Promise<{ bytes: number; inodes: number }>>();

  of(dir: string): Promise<{ bytes: number; inodes: number }> {
    let running = this.inflight.get(dir);
    if (!running) {
      running = (async () => {
        // Bounds the descriptors all walks hold together (MAX_WALKS × 2 × MAX_WALK_DEPTH).
        // A finished walk hands its slot straight to the next one waiting.
        if (this.walking >= MAX_WALKS) await new Promise<void>((r) => this.waiting.push(r));
        else this.walking++;
        try {
          return await walkUsage(dir);
        } finally {
          const next = this.waiting.shift();
          if (next) next();
          else this.walking--;
        }
      })().finally(() => this.inflight.delete(dir));
      this.inflight.set(dir, running);
    }
    return running;
  }
}

async function walkUsage(dir: string): Promise<{ bytes: number; inodes: number }> {
  let bytes = 0;
  let inodes = 0;
  const walk = async (fd: number, depth: number): Promise<void> => {
    let entries: Dir;
    try {
      entries = await fs.opendir(`/proc/self/fd/${fd}`, { bufferSize: 64 });
    } catch {
      return;
    }
    for await (const e of entries) {
      const st = await fs.lstat(`/proc/self/fd/${fd}/${e.name}`).catch(() => undefined);
      if (!st) continue;
      inodes++;
      bytes += st.blocks * 512;
      if (!st.isDirectory() || depth >= MAX_WALK_DEPTH) continue;
      let child: number;
      try {
        child = openat2(fd, e.name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, WALK_RESOLVE);
      } catch {
        continue; // gone, or replaced by a symlink
      }
      try {
        await walk(child, depth + 1);
      } finally {
        fsSync.closeSync(child);
      }
    }
  };
  let root: number;
  try {
    root = openat2(AT_FDCWD, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
  } catch {
    return { bytes, inodes };
  }
  try {
    await walk(root, 0);
  } finally {
    fsSync.closeSync(root);
  }
  return { bytes, inodes };
}

export type NetDevCounters = Array<{ name: string; rxBytes: number; rxErrors: number; txBytes: number; txErrors: number }>;

/** Counters of every interface but lo in the network namespace that `pid` lives in. */
export async function netDev(pid: number): Promise<NetDevCounters> {
  return parseNetDev(await read(`/proc/${pid}/net/dev`));
}

/** The interfaces of a /proc/net/dev text, lo left out. */
export function parseNetDev(text: string | undefined): NetDevCounters {
  if (!text) return [];
  return text
    .split('\n')
    .slice(2)
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => {
      const [name, rest] = l.split(':');
      const f = rest!.trim().split(/\s+/).map(Number);
      return { name: name!.trim(), rxBytes: f[0]!, rxErrors: f[2]!, txBytes: f[8]!, txErrors: f[10]! };
    })
    .filter((i) => i.name !== 'lo');
}

/** The `oom_kill` counter of cgroup v1's memory.oom_control or v2's memory.events. */
export function oomKillCount(text: string | undefined): number {
  return statField(text, 'oom_kill') ?? 0;
}

/**
 * Whether the kernel's OOM killer killed a process of the cgroup at
 * `cgroupsPath`: v1 counts it in memory.oom_control, v2 in memory.events
 * (at the root on a unified host, under /sys/fs/cgroup/unified when hybrid).
 */
export async function oomKilled(cgroupsPath: string, root = CG): Promise<boolean> {
  const rel = cgroupsPath.replace(/^\/+/, '');
  const files = [path.join(root, 'memory', rel, 'memory.oom_control'), path.join(root, rel, 'memory.events'), path.join(root, 'unified', rel, 'memory.events')];
  for (const f of files) if (oomKillCount(await read(f)) > 0) return true;
  return false;
}

/**
 * CPU use as a rate (nanocores: 1e9 is one core busy), from two cumulative
 * usage samples, as containerd and cAdvisor report it. Keeps the last sample
 * per key; the first call for a key has no earlier sample, so the caller
 * takes a second one a moment later.
 */
export class CpuRates {
  private readonly last = new Map<string, { cpuNs: number; atNs: bigint; rate?: number }>();
  constructor(private readonly clock: () => bigint = () => process.hrtime.bigint()) {}

  has(key: string): boolean {
    return this.last.has(key);
  }

  /**
   * Records a sample; returns the rate since the previous one, if there is one at least `minWindowNs`
   * back, else the last rate. A short window measures the scheduler, not the load: two stats calls a
   * few milliseconds apart (ListContainerStats, then PodSandboxStats) gave a busy container 0 cores
   * when it had not run in between.
   */
  sample(key: string, cpuNs: number, minWindowNs = 500_000_000n): number | undefined {
    const atNs = this.clock();
    const prev = this.last.get(key);
    if (prev && atNs - prev.atNs < minWindowNs) return prev.rate; // too close: the last rate stands
    let rate: number | undefined;
    if (prev && cpuNs >= prev.cpuNs) rate = Math.round(((cpuNs - prev.cpuNs) * 1e9) / Number(atNs - prev.atNs));
    this.last.set(key, { cpuNs, atNs, rate: rate ?? prev?.rate });
    return rate;
  }

  /** Forgets keys that are not in `live` (removed containers and pods). */
  retain(live: Set<string>): void {
    for (const k of this.last.keys()) if (!live.has(k)) this.last.delete(k);
  }
}
