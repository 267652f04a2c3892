/**
 * The eviction manager's measurements from the real node, as the kubelet
 * (through cAdvisor) takes them: memory.available is the machine's memory
 * less the root memory cgroup's working set (usage less inactive file
 * pages; cgroup v1, or /proc/meminfo where the root has no counters),
 * nodefs from statfs of the agent's root dir, imagefs from statfs of the
 * runtime's image filesystem (CRI ImageFsInfo), pid.available from the
 * kernel's pid limit and its count of tasks; each pod's memory and
 * writable layers from the runtime's CRI stats, its logs and emptyDirs by a
 * bounded walk of their directories.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { CriEndpoint } from './cri-client.js';
import type { EvictionSource, EvictionStats, Observations, PodUsage } from './eviction.js';

/** The most entries one walk looks at: a pod cannot make the agent stat a million files every pass. */
export const DU_MAX_ENTRIES = 100_000;
const DU_MAX_DEPTH = 64;

/**
 * Bytes allocated under `dir` (st_blocks, each hard link counted once), not
 * following symlinks nor crossing into other filesystems. Stops after
 * `maxEntries`, with what it counted so far (a lower bound, enough to see a
 * limit passed).
 */
export async function diskUsage(dir: string, maxEntries = DU_MAX_ENTRIES): Promise<{ bytes: number; inodes: number; complete: boolean } | undefined> {
  let root;
  try {
    root = await fs.lstat(dir, { bigint: true });
  } catch {
    return undefined;
  }
  if (!root.isDirectory()) return undefined;
  const seen = new Set<bigint>();
  let bytes = Number(root.blocks) * 512;
  let inodes = 1;
  let budget = maxEntries;
  const walk = async (d: string, depth: number): Promise<boolean> => {
    if (depth > DU_MAX_DEPTH) return false;
    let handle;
    try {
      handle = await fs.opendir(d);
    } catch {
      return true;
    }
    try {
      for await (const e of handle) {
        if (--budget < 0) return false;
        const p = path.join(d, e.name);
        let st;
        try {
          st = await fs.lstat(p, { bigint: true });
        } catch {
          continue;
        }
        if (st.dev !== root.dev) continue;
        if (st.nlink > 1n) {
          if (seen.has(st.ino)) continue;
          seen.add(st.ino);
        }
        bytes += Number(st.blocks) * 512;
        inodes++;
        if (st.isDirectory() && !(await walk(p, depth + 1))) return false;
      }
    } catch {
      // removed meanwhile
    }
    return true;
  };
  const complete = await walk(dir, 0);
  return { bytes, inodes, complete };
}

/** The root memory cgroup's working set (usage less inactive file), cgroup v1; undefined where there is none. */
export function workingSetV1(usageText: string, statText: string): number | undefined {
  const usage = Number(usageText.trim());
  if (!usageText.trim() || !Number.isFinite(usage)) return undefined;
  const m = /^total_inactive_file (\d+)$/m.exec(statText);
  const inactive = m ? Number(m[1]) : 0;
  return Math.max(0, usage - inactive);
}

export interface NodeSignalsOptions {
  cri: CriEndpoint;
  rootDir: string;
  procRoot?: string;
  cgroupRoot?: string;
}

async function read(file: string): Promise<string> {
  return fs.readFile(file, 'utf8').catch(() => '');
}

export class NodeSignals implements EvictionSource {
  constructor(private readonly o: NodeSignalsOptions) {}

  async observations(): Promise<Observations> {
    const proc = this.o.procRoot ?? '/proc';
    const cg = this.o.cgroupRoot ?? '/sys/fs/cgroup';
    const out: Observations = {};
    const meminfo = await read(path.join(proc, 'meminfo'));
    const kb = (k: string) => {
      const m = new RegExp(`^${k.replace(/[()]/g, '\\$&')}:\\s+(\\d+)`, 'm').exec(meminfo);
      return m ? Number(m[1]) * 1024 : undefined;
    };
    const total = kb('MemTotal');
    if (total !== undefined) {
      let ws = workingSetV1(await read(path.join(cg, 'memory', 'memory.usage_in_bytes')), await read(path.join(cg, 'memory', 'memory.stat')));
      if (ws === undefined) {
        // cgroup v2's root has no memory.current: the whole machine's, as cAdvisor takes it there.
        const free = kb('MemFree') ?? 0;
        ws = Math.max(0, total - free - (kb('Inactive(file)') ?? 0));
      }
      out['memory.available'] = { available: Math.max(0, total - ws), capacity: total };
    }
    const nodefs = await fs.statfs(this.o.rootDir).catch(() => undefined);
    if (nodefs) {
      out['nodefs.available'] = { available: nodefs.bavail * nodefs.bsize, capacity: nodefs.blocks * nodefs.bsize };
      if (nodefs.files > 0) out['nodefs.inodesFree'] = { available: nodefs.ffree, capacity: nodefs.files };
    }
    const info = await this.o.cri.images.imageFsInfo({}, 10_000).catch(() => undefined);
    const mount = info?.imageFilesystems?.[0]?.fsId?.mountpoint;
    const imagefs = mount ? await fs.statfs(mount).catch(() => undefined) : undefined;
    if (imagefs) {
      out['imagefs.available'] = { available: imagefs.bavail * imagefs.bsize, capacity: imagefs.blocks * imagefs.bsize };
      if (imagefs.files > 0) out['imagefs.inodesFree'] = { available: imagefs.ffree, capacity: imagefs.files };
    } else if (nodefs) {
      out['imagefs.available'] = out['nodefs.available'];
      if (out['nodefs.inodesFree']) out['imagefs.inodesFree'] = out['nodefs.inodesFree'];
    }
    const pidMax = Number((await read(path.join(proc, 'sys', 'kernel', 'pid_max'))).trim());
    const threadsMax = Number((await read(path.join(proc, 'sys', 'kernel', 'threads-max'))).trim());
    const tasks = Number((await read(path.join(proc, 'loadavg'))).split(' ')[3]?.split('/')[1]);
    const max = Math.min(...[pidMax, threadsMax].filter((n) => Number.isFinite(n) && n > 0));
    if (Number.isFinite(max) && Number.isFinite(tasks)) out['pid.available'] = { available: Math.max(0, max - tasks), capacity: max };
    return out;
  }

  async stats(pods: Pod[]): Promise<EvictionStats> {
    const observations = await this.observations();
    const out = new Map<string, PodUsage>();
    if (!pods.length) return { observations, pods: out };
    const byUid = new Map(pods.map((p) => [p.metadata?.uid ?? '', p]));
    const stats = await this.o.cri.runtime.listPodSandboxStats({}, 30_000).catch(() => undefined);
    const fromCri = new Map<string, NonNullable<NonNullable<typeof stats>['stats']>[number]>();
    for (const s of stats?.stats ?? []) {
      const uid = s.attributes?.metadata?.uid;
      const ready = s.linux?.containers?.length ?? 0;
      // The newest sandbox of a pod wins (one with containers over an empty, stopped one).
      if (uid && byUid.has(uid) && (!fromCri.has(uid) || ready > 0)) fromCri.set(uid, s);
    }
    for (const [uid, pod] of byUid) {
      const podDir = path.join(this.o.rootDir, 'pods', uid);
      const s = fromCri.get(uid);
      const containers: PodUsage['containers'] = [];
      let disk = 0;
      for (const c of pod.spec?.containers ?? []) {
        const cs = (s?.linux?.containers ?? []).find((x) => x.attributes?.metadata?.name === c.name);
        const layer = Number(cs?.writableLayer?.usedBytes?.value ?? 0);
        const logs = (await diskUsage(path.join(podDir, 'logs', c.name)))?.bytes ?? 0;
        const mem = cs?.memory?.workingSetBytes?.value;
        containers.push({ name: c.name, ...(mem !== undefined ? { memory: Number(mem) } : {}), disk: layer + logs });
        disk += layer + logs;
      }
      const emptyDirs = new Map<string, number>();
      for (const v of pod.spec?.volumes ?? []) {
        if (!v.emptyDir) continue;
        const u = await diskUsage(path.join(podDir, 'volumes', 'kubernetes.io~empty-dir', v.name));
        if (!u) continue;
        emptyDirs.set(v.name, u.bytes);
        if (v.emptyDir.medium !== 'Memory') disk += u.bytes;
      }
      const podMem = s?.linux?.memory?.workingSetBytes?.value;
      const summed = containers.reduce((n, c) => n + (c.memory ?? 0), 0);
      out.set(uid, {
        ...(podMem !== undefined ? { memory: Number(podMem) } : s ? { memory: summed } : {}),
        disk,
        containers,
        emptyDirs,
      });
    }
    return { observations, pods: out };
  }
}
