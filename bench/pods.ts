/**
 * Pod lifecycle benchmark, run against skiff and, when it is running on this
 * machine (shared/conformance/containerd.sh), containerd, in the same run:
 * serial pod start/stop, 50 pods started 8 at a time, daemon + monitor memory
 * per running pod, and ExecSync / ListContainers latency with 50 pods up.
 */
import * as grpc from '@grpc/grpc-js';
import fs from 'node:fs/promises';
import path from 'node:path';
import pLimit from 'p-limit';
import { loadCri } from '../src/server/proto.js';
import type { FloorSamples } from './floor.js';

export interface Target {
  name: string;
  socket: string;
  /** Processes whose memory counts: the daemon and every per-container monitor. */
  processes: () => Promise<number[]>;
}

type Call = (req: unknown) => Promise<Record<string, unknown>>;
type Client = Record<string, Call>;

/** A CRI client (runtime and image services) on `socket`, each call a promise with a two-minute deadline. */
export function client(socket: string): { rt: Client; img: Client; close(): void } {
  const cri = loadCri();
  const wrap = (c: grpc.Client): Client =>
    new Proxy({} as Client, {
      get: (_t, m: string) => (req: unknown) =>
        new Promise((resolve, reject) =>
          (c as unknown as Record<string, (r: unknown, md: grpc.Metadata, o: grpc.CallOptions, cb: (e: unknown, r: unknown) => void) => void>)[m]!.call(
            c, req, new grpc.Metadata(), { deadline: Date.now() + 120_000 }, (e, r) => (e ? reject(e) : resolve(r as Record<string, unknown>)),
          ),
        ),
    });
  const rtc = new cri.runtime.v1.RuntimeService(`unix:${socket}`, grpc.credentials.createInsecure());
  const imc = new cri.runtime.v1.ImageService(`unix:${socket}`, grpc.credentials.createInsecure());
  return { rt: wrap(rtc), img: wrap(imc), close: () => (rtc.close(), imc.close()) };
}

export async function rssKiB(pids: number[]): Promise<number> {
  let total = 0;
  for (const pid of pids) {
    const st = await fs.readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
    const m = /^VmRSS:\s+(\d+) kB$/m.exec(st);
    if (m) total += Number(m[1]);
  }
  return total;
}

/** Proportional set size: shared pages split among the processes that share them. */
export async function pssKiB(pids: number[]): Promise<number> {
  let total = 0;
  for (const pid of pids) {
    const st = await fs.readFile(`/proc/${pid}/smaps_rollup`, 'utf8').catch(() => '');
    const m = /^Pss:\s+(\d+) kB$/m.exec(st);
    if (m) total += Number(m[1]);
  }
  return total;
}

/** Pids whose command line matches `re`. */
export async function pidsMatching(re: RegExp): Promise<number[]> {
  const out: number[] = [];
  for (const d of await fs.readdir('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const cmd = (await fs.readFile(`/proc/${d}/cmdline`, 'utf8').catch(() => '')).split('\0').join(' ');
    if (re.test(cmd)) out.push(Number(d));
  }
  return out;
}

/** The p-th percentile of `xs`. */
export const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
};
/** How long `f` takes, in milliseconds. */
export const ms = async (f: () => Promise<unknown>) => {
  const t = process.hrtime.bigint();
  await f();
  return Number(process.hrtime.bigint() - t) / 1e6;
};

export interface PodResults {
  serial: Record<string, number[]>;
  parallelWallMs: number;
  parallelPodMs: number[];
  rssIdleKiB: number;
  /** After QUIET_MS with no calls at all: what a daemon settles to between bursts. */
  rssQuietKiB: number;
  pssQuietKiB: number;
  rss50KiB: number;
  pssIdleKiB: number;
  pss50KiB: number;
  execMs: number[];
  listMs: number[];
  /** Measured while another client runs ExecSync back to back, as a kubelet's probes do. */
  listBusyMs: number[];
  statusBusyMs: number[];
  /** After WARM_CALLS more lists, no other call running. */
  listWarmMs: number[];
  /** After those, while another client runs ExecSync back to back again. */
  listWarmBusyMs: number[];
}

let uniq = 0;
const QUIET_MS = 30_000;
const WARM_CALLS = 5000;

export async function benchPods(t: Target, image: string, logDir: string, serialRuns = 20, pods = 50, parallel = 8): Promise<PodResults> {
  const { rt, img, close } = client(t.socket);
  try {
    await img.PullImage({ image: { image } });
    // What a kubelet sends for a pod without shareProcessNamespace: each container has its own PID namespace.
    // A pod with shareProcessNamespace shares one (pid POD) and so needs a process to hold it.
    const ownPid = { network: 'POD', pid: 'CONTAINER', ipc: 'POD' };
    const sharedPid = { network: 'POD', pid: 'POD', ipc: 'POD' };
    const start = async (timings?: Record<string, number[]>, namespaceOptions = ownPid) => {
      const podConfig = (n: string) => ({
        metadata: { name: n, namespace: 'bench', uid: `${n}-uid`, attempt: 0 },
        logDirectory: path.join(logDir, n),
        linux: { securityContext: { namespaceOptions } },
      });
      const n = `bench-${t.name}-${process.pid}-${++uniq}`;
      const config = podConfig(n);
      let podId = '';
      let ctrId = '';
      const rec = (k: string, v: number) => timings && (timings[k] ??= []).push(v);
      rec('RunPodSandbox', await ms(async () => (podId = (await rt.RunPodSandbox({ config })).podSandboxId as string)));
      rec('CreateContainer', await ms(async () => {
        ctrId = (await rt.CreateContainer({ podSandboxId: podId, config: { metadata: { name: 'sleep' }, image: { image }, command: ['sleep', '100000'], logPath: 'sleep.log', linux: { securityContext: { namespaceOptions } } }, sandboxConfig: config })).containerId as string;
      }));
      rec('StartContainer', await ms(() => rt.StartContainer({ containerId: ctrId })));
      return { podId, ctrId };
    };
    const stop = async (p: { podId: string; ctrId: string }, timings?: Record<string, number[]>) => {
      const rec = (k: string, v: number) => timings && (timings[k] ??= []).push(v);
      rec('StopContainer', await ms(() => rt.StopContainer({ containerId: p.ctrId, timeout: 0 })));
      rec('RemoveContainer', await ms(() => rt.RemoveContainer({ containerId: p.ctrId })));
      rec('StopPodSandbox', await ms(() => rt.StopPodSandbox({ podSandboxId: p.podId })));
      rec('RemovePodSandbox', await ms(() => rt.RemovePodSandbox({ podSandboxId: p.podId })));
    };

    // One warm-up round trip, not counted.
    await stop(await start());
    const serial: Record<string, number[]> = {};
    for (let i = 0; i < serialRuns; i++) {
      const t0 = process.hrtime.bigint();
      const p = await start(serial);
      (serial['pod start (run+create+start)'] ??= []).push(Number(process.hrtime.bigint() - t0) / 1e6);
      const t1 = process.hrtime.bigint();
      await stop(p, serial);
      (serial['pod teardown (stop+remove)'] ??= []).push(Number(process.hrtime.bigint() - t1) / 1e6);
    }
    for (let i = 0; i < Math.ceil(serialRuns / 2); i++) {
      const t0 = process.hrtime.bigint();
      const p = await start(undefined, sharedPid);
      (serial['pod start, shared PID namespace'] ??= []).push(Number(process.hrtime.bigint() - t0) / 1e6);
      await stop(p);
    }

    const idlePids = await t.processes();
    const rssIdleKiB = await rssKiB(idlePids);
    const pssIdleKiB = await pssKiB(idlePids);
    await new Promise((r) => setTimeout(r, QUIET_MS));
    const quietPids = await t.processes();
    const rssQuietKiB = await rssKiB(quietPids);
    const pssQuietKiB = await pssKiB(quietPids);
    const limit = pLimit(parallel);
    const podMs: number[] = [];
    const up: Array<{ podId: string; ctrId: string }> = [];
    const w0 = process.hrtime.bigint();
    await Promise.all(
      Array.from({ length: pods }, () =>
        limit(async () => {
          const t0 = process.hrtime.bigint();
          up.push(await start());
          podMs.push(Number(process.hrtime.bigint() - t0) / 1e6);
        }),
      ),
    );
    const parallelWallMs = Number(process.hrtime.bigint() - w0) / 1e6;
    // Measured as the idle figures are, once the burst of starts has settled.
    await new Promise((r) => setTimeout(r, QUIET_MS));
    const upPids = await t.processes();
    const rss50KiB = await rssKiB(upPids);
    const pss50KiB = await pssKiB(upPids);
    const execMs: number[] = [];
    const listMs: number[] = [];
    // Each call in its own loop: an ExecSync's runc processes are still exiting when it
    // returns, and would otherwise be measured as list latency.
    for (let i = 0; i < 30; i++) {
      const p = up[i % up.length]!;
      execMs.push(await ms(() => rt.ExecSync({ containerId: p.ctrId, cmd: ['true'], timeout: 10 })));
    }
    await new Promise((r) => setTimeout(r, 500));
    for (let i = 0; i < 100; i++) listMs.push(await ms(() => rt.ListContainers({})));
    // Lists and status interleaved with execs: a second connection keeps an ExecSync in flight throughout.
    const whileExec = async (listOut: number[], statusOut: number[]) => {
      const busy = client(t.socket);
      try {
        let execing = true;
        const execLoop = (async () => {
          for (let i = 0; execing; i++) await busy.rt.ExecSync({ containerId: up[i % up.length]!.ctrId, cmd: ['true'], timeout: 10 });
        })();
        for (let i = 0; i < 200; i++) {
          listOut.push(await ms(() => rt.ListContainers({})));
          statusOut.push(await ms(() => rt.ContainerStatus({ containerId: up[i % up.length]!.ctrId })));
          await new Promise((r) => setTimeout(r, 5));
        }
        execing = false;
        await execLoop;
      } finally {
        busy.close();
      }
    };
    const listBusyMs: number[] = [];
    const statusBusyMs: number[] = [];
    await whileExec(listBusyMs, statusBusyMs);
    // A kubelet relists every second for as long as the node runs: the same call once the daemon
    // has answered it a few thousand times (V8 has optimized its path by then; Go's is compiled ahead).
    for (let i = 0; i < WARM_CALLS; i++) await rt.ListContainers({});
    const listWarmMs: number[] = [];
    for (let i = 0; i < 300; i++) listWarmMs.push(await ms(() => rt.ListContainers({})));
    // And the interleaved window again, warm: the steady state of a node whose probes exec.
    const listWarmBusyMs: number[] = [];
    await whileExec(listWarmBusyMs, []);
    await Promise.all(up.map((p) => limit(() => stop(p))));
    return { serial, parallelWallMs, parallelPodMs: podMs, rssIdleKiB, rssQuietKiB, pssQuietKiB, rss50KiB, pssIdleKiB, pss50KiB, execMs, listMs, listBusyMs, statusBusyMs, listWarmMs, listWarmBusyMs };
  } finally {
    close();
  }
}

export function report(results: Array<[string, PodResults]>, floor?: FloorSamples, pods = 50): string {
  const lines: string[] = [];
  const names = results.map(([n]) => n);
  const row = (label: string, vals: string[]) => lines.push(`${label.padEnd(34)} ${vals.map((v) => v.padStart(18)).join(' ')}`);
  row('', names);
  const keys = Object.keys(results[0]![1].serial);
  for (const k of keys) row(`${k} p50/p95 ms`, results.map(([, r]) => `${pct(r.serial[k] ?? [], 50).toFixed(1)} / ${pct(r.serial[k] ?? [], 95).toFixed(1)}`));
  row(`${pods} pods, 8 at a time: wall s`, results.map(([, r]) => (r.parallelWallMs / 1000).toFixed(2)));
  row('  per pod start p50/p95 ms', results.map(([, r]) => `${pct(r.parallelPodMs, 50).toFixed(0)} / ${pct(r.parallelPodMs, 95).toFixed(0)}`));
  row('memory idle MiB RSS (daemon+monitors)', results.map(([, r]) => (r.rssIdleKiB / 1024).toFixed(1)));
  row(`  the same after ${QUIET_MS / 1000} s with no calls`, results.map(([, r]) => (r.rssQuietKiB / 1024).toFixed(1)));
  row(`memory with ${pods} pods MiB RSS (settled)`, results.map(([, r]) => (r.rss50KiB / 1024).toFixed(1)));
  row('memory per running pod MiB (RSS)', results.map(([, r]) => ((r.rss50KiB - r.rssQuietKiB) / 1024 / pods).toFixed(2)));
  row('memory per running pod MiB (PSS)', results.map(([, r]) => ((r.pss50KiB - r.pssQuietKiB) / 1024 / pods).toFixed(2)));
  row(`ExecSync p50/p95 ms (${pods} pods)`, results.map(([, r]) => `${pct(r.execMs, 50).toFixed(1)} / ${pct(r.execMs, 95).toFixed(1)}`));
  row(`ListContainers p50/p95 ms (${pods} pods)`, results.map(([, r]) => `${pct(r.listMs, 50).toFixed(2)} / ${pct(r.listMs, 95).toFixed(2)}`));
  row('  while ExecSync runs p50/p95 ms', results.map(([, r]) => `${pct(r.listBusyMs, 50).toFixed(2)} / ${pct(r.listBusyMs, 95).toFixed(2)}`));
  row(`  after ${WARM_CALLS} more calls p50/p95 ms`, results.map(([, r]) => `${pct(r.listWarmMs, 50).toFixed(2)} / ${pct(r.listWarmMs, 95).toFixed(2)}`));
  row('  then while ExecSync runs p50/p95 ms', results.map(([, r]) => `${pct(r.listWarmBusyMs, 50).toFixed(2)} / ${pct(r.listWarmBusyMs, 95).toFixed(2)}`));
  row('ContainerStatus, ExecSync running', results.map(([, r]) => `${pct(r.statusBusyMs, 50).toFixed(2)} / ${pct(r.statusBusyMs, 95).toFixed(2)}`));
  const start = 'pod start (run+create+start)';
  if (floor) {
    const f = pct(floor.cniAddMs, 50) + pct(floor.runcRunMs, 50);
    lines.push('');
    lines.push(`floor: CNI bridge ADD p50 ${pct(floor.cniAddMs, 50).toFixed(1)} ms + runc run -d p50 ${pct(floor.runcRunMs, 50).toFixed(1)} ms = ${f.toFixed(1)} ms`);
    lines.push(`ratio ${names[0]} pod start p50 / floor: ${(pct(results[0]![1].serial[start]!, 50) / f).toFixed(2)}× (target ≤ 2×)`);
  }
  if (results.length === 2) {
    const [a, b] = [results[0]![1], results[1]![1]];
    const r = (x: number, y: number) => `${(x / y).toFixed(2)}×`;
    lines.push('');
    lines.push(`ratios ${names[0]}/${names[1]}:`);
    lines.push(`  pod start p50 ${r(pct(a.serial[start]!, 50), pct(b.serial[start]!, 50))} (target ≤ 0.45×)`);
    lines.push(`  memory per pod ${r(a.rss50KiB - a.rssQuietKiB, b.rss50KiB - b.rssQuietKiB)} (RSS), ${r(a.pss50KiB - a.pssQuietKiB, b.pss50KiB - b.pssQuietKiB)} (PSS) (no regression)`);
    lines.push(`  ExecSync p50 ${r(pct(a.execMs, 50), pct(b.execMs, 50))} (no regression)`);
    lines.push(`  ListContainers p50 while ExecSync runs ${r(pct(a.listBusyMs, 50), pct(b.listBusyMs, 50))} (target ≤ 1×); alone ${r(pct(a.listMs, 50), pct(b.listMs, 50))}, after ${WARM_CALLS} more calls ${r(pct(a.listWarmMs, 50), pct(b.listWarmMs, 50))}, then while ExecSync runs ${r(pct(a.listWarmBusyMs, 50), pct(b.listWarmBusyMs, 50))}`);
    lines.push(`  idle RSS right after the serial runs ${r(a.rssIdleKiB, b.rssIdleKiB)}, after ${QUIET_MS / 1000} s quiet ${r(a.rssQuietKiB, b.rssQuietKiB)}; ${names[0]} ${(a.rssQuietKiB / 1024).toFixed(1)} MiB quiet (target ≤ 60 MiB)`);
  }
  return lines.join('\n') + '\n';
}
