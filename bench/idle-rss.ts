/**
 * Where an idle daemon's memory goes, for several builds or settings in the
 * same minutes. Each variant runs as its own `skiff cri` in its own network
 * namespace; all are measured (a) 10 s after they say they serve, with no
 * call yet, and (b) after a small workload (a pull, a few pods started,
 * listed, exec'd into, stopped and removed) and then `--quiet` seconds
 * (default 30) with no calls. Each measure is VmRSS, PSS, the thread count,
 * an /proc/<pid>/smaps breakdown (node's own file pages, other files, glibc's
 * [heap] and thread arenas, thread stacks, other anonymous memory — V8's heap
 * is most of that) and V8's own heap statistics, asked of the daemon through
 * a tiny preloaded hook (SIGUSR2 → JSON file), the same for every variant.
 *
 *   tsx bench/idle-rss.ts [--quiet S] [--latency N] [--pods N] VARIANT...
 *
 * VARIANT is `label=dir` (dir holds bin/skiff.js, dist/ and proto/), followed
 * by `:NAME=value` for the daemon's environment, `:--flag` for node's own
 * flags or `:+--flag=value` for skiff's, e.g. `base=/work/main
 * arena2=/work/main:MALLOC_ARENA_MAX=2 norelease=.:+--idle-release-after=0`.
 * With --latency N, each variant then answers N warmed ListContainers calls
 * (in rounds that alternate between variants, 5 pods up) and p50/p99 print.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { makeDirs, type DaemonDirs } from '../test/helpers/daemon.js';
import { Pusher } from '../test/helpers/oci.js';
import { startRegistry, waitFor } from '../test/helpers/registry.js';
import { busyboxImage } from '../test/helpers/busybox.js';
import { TestNetns } from '../test/helpers/netns.js';
import { client, ms, pct } from './pods.js';

interface Variant {
  label: string;
  dir: string;
  env: Record<string, string>;
  nodeFlags: string[];
  skiffArgs: string[];
}

interface Side extends Variant {
  dirs: DaemonDirs;
  ns: TestNetns;
  child: ChildProcess;
  /** The daemon's own pid (the child is nsenter, which execs it: the same pid). */
  pid: number;
  log: string;
  cri: ReturnType<typeof client>;
  startMs: number;
  lat: number[];
}

export function parseVariant(arg: string): Variant {
  const eq = arg.indexOf('=');
  if (eq <= 0) throw new Error(`variant ${arg}: want label=dir[:NAME=value|:--flag]...`);
  const [dir, ...rest] = arg.slice(eq + 1).split(':');
  const v: Variant = { label: arg.slice(0, eq), dir: path.resolve(dir!), env: {}, nodeFlags: [], skiffArgs: [] };
  for (const r of rest) {
    if (r.startsWith('--')) v.nodeFlags.push(r);
    else if (r.startsWith('+')) v.skiffArgs.push(r.slice(1));
    else {
      const i = r.indexOf('=');
      if (i <= 0) throw new Error(`variant ${arg}: ${r} is neither NAME=value nor --flag`);
      v.env[r.slice(0, i)] = r.slice(i + 1);
    }
  }
  return v;
}

/** The preloaded hook: on SIGUSR2 it writes V8's heap figures to $SKIFF_BENCH_HEAPSTAT. */
const HOOK = `'use strict';
const v8 = require('node:v8');
const fs = require('node:fs');
process.on('SIGUSR2', () => {
  const h = v8.getHeapStatistics();
  const spaces = Object.fromEntries(v8.getHeapSpaceStatistics().map((s) => [s.space_name, { committed: s.physical_space_size, used: s.space_used_size }]));
  const code = v8.getHeapCodeStatistics ? v8.getHeapCodeStatistics() : {};
  fs.writeFileSync(process.env.SKIFF_BENCH_HEAPSTAT, JSON.stringify({ h, spaces, code, mem: process.memoryUsage(), res: process.resourceUsage().maxRSS }));
  // Only when asked (a variant's :SKIFF_BENCH_SNAPSHOT=/dir/prefix): a snapshot costs the daemon memory afterwards.
  if (process.env.SKIFF_BENCH_SNAPSHOT) v8.writeHeapSnapshot(process.env.SKIFF_BENCH_SNAPSHOT + '-' + Date.now() + '.heapsnapshot');
});
`;

interface Smaps {
  rssKiB: number;
  pssKiB: number;
  threads: number;
  /** Category → RSS KiB. */
  parts: Record<string, number>;
  v8?: { committedKiB: number; usedKiB: number; codeKiB: number; spaces: Record<string, { committed: number; used: number }> };
}

interface Mapping {
  start: bigint;
  end: bigint;
  perms: string;
  path: string;
  rss: number;
}

async function readMappings(pid: number): Promise<Mapping[]> {
  const text = await fsp.readFile(`/proc/${pid}/smaps`, 'utf8');
  const out: Mapping[] = [];
  for (const line of text.split('\n')) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$/.exec(line);
    if (head) {
      out.push({ start: BigInt(`0x${head[1]}`), end: BigInt(`0x${head[2]}`), perms: head[3]!, path: head[4]!, rss: 0 });
      continue;
    }
    const rss = /^Rss:\s+(\d+) kB/.exec(line);
    if (rss && out.length) out[out.length - 1]!.rss = Number(rss[1]);
  }
  return out;
}

const MiB64 = 64n << 20n;

/** Sorts every mapping into one of the categories the report prints. */
export function categorize(maps: Mapping[], exe: string): Record<string, number> {
  const parts: Record<string, number> = {};
  const add = (k: string, v: number) => (parts[k] = (parts[k] ?? 0) + v);
  for (const [i, m] of maps.entries()) {
    const size = m.end - m.start;
    const prev = maps[i - 1];
    const next = maps[i + 1];
    if (m.path === exe) add('node binary', m.rss);
    else if (m.path === '[heap]') add('glibc [heap]', m.rss);
    else if (m.path === '[stack]') add('main stack', m.rss);
    else if (m.path.startsWith('/')) add(/\.node$/.test(m.path) ? 'native addons (.node)' : 'other files (.so, ...)', m.rss);
    else if (m.path.startsWith('[')) add('vdso/vvar', m.rss);
    else if (m.perms.startsWith('rw') && m.start % MiB64 === 0n && next?.start === m.end && next.perms === '---p' && next.end - m.start === MiB64) add('glibc thread arenas', m.rss);
    // A thread's stack: rw anonymous memory right above its guard page.
    else if (m.perms.startsWith('rw') && prev?.end === m.start && prev.perms === '---p' && prev.end - prev.start <= 65536n && size >= 256n << 10n) add('thread stacks', m.rss);
    else add(`anon ${size >= 1n << 20n ? '>=1MiB' : size > 256n << 10n ? '256K-1M' : '<=256K'} maps (V8 heap, buffers)`, m.rss);
  }
  return parts;
}

async function measure(side: Side): Promise<Smaps> {
  const exe = await fsp.readlink(`/proc/${side.pid}/exe`);
  const maps = await readMappings(side.pid);
  const status = await fsp.readFile(`/proc/${side.pid}/status`, 'utf8');
  const rollup = await fsp.readFile(`/proc/${side.pid}/smaps_rollup`, 'utf8');
  const num = (re: RegExp, t: string) => Number(re.exec(t)?.[1] ?? NaN);
  const stat = path.join(side.dirs.base, 'heapstat.json');
  await fsp.rm(stat, { force: true });
  process.kill(side.pid, 'SIGUSR2');
  const v8stat = await waitFor('heap statistics', async () => {
    const t = await fsp.readFile(stat, 'utf8').catch(() => '');
    try {
      return t ? (JSON.parse(t) as { h: Record<string, number>; spaces: Record<string, { committed: number; used: number }>; code: Record<string, number> }) : undefined;
    } catch {
      return undefined;
    }
  }, 5_000).catch(() => undefined);
  return {
    rssKiB: num(/^VmRSS:\s+(\d+) kB$/m, status),
    pssKiB: num(/^Pss:\s+(\d+) kB$/m, rollup),
    threads: num(/^Threads:\s+(\d+)$/m, status),
    parts: categorize(maps, exe),
    v8: v8stat && {
      committedKiB: v8stat.h.total_physical_size! / 1024,
      usedKiB: v8stat.h.used_heap_size! / 1024,
      codeKiB: ((v8stat.code.code_and_metadata_size ?? 0) + (v8stat.code.bytecode_and_metadata_size ?? 0)) / 1024,
      spaces: v8stat.spaces,
    },
  };
}

const MiB = (k: number) => (k / 1024).toFixed(1);

function report(title: string, sides: Side[], m: Smaps[]): void {
  const w = Math.max(...sides.map((s) => s.label.length), 8);
  const row = (name: string, vals: string[]) => process.stdout.write(`  ${name.padEnd(36)}${vals.map((v) => v.padStart(w + 2)).join('')}\n`);
  process.stdout.write(`${title}\n`);
  row('', sides.map((s) => s.label));
  row('RSS MiB', m.map((x) => MiB(x.rssKiB)));
  row('PSS MiB', m.map((x) => MiB(x.pssKiB)));
  row('threads', m.map((x) => String(x.threads)));
  const cats = [...new Set(m.flatMap((x) => Object.keys(x.parts)))].sort();
  for (const c of cats) row(`  ${c}`, m.map((x) => MiB(x.parts[c] ?? 0)));
  row('V8 heap committed MiB', m.map((x) => (x.v8 ? MiB(x.v8.committedKiB) : '?')));
  row('V8 heap used MiB', m.map((x) => (x.v8 ? MiB(x.v8.usedKiB) : '?')));
  row('V8 code+bytecode MiB', m.map((x) => (x.v8 ? MiB(x.v8.codeKiB) : '?')));
  const spaces = [...new Set(m.flatMap((x) => Object.keys(x.v8?.spaces ?? {})))];
  for (const s of spaces) row(`  ${s} committed/used`, m.map((x) => (x.v8?.spaces[s] ? `${MiB(x.v8.spaces[s]!.committed / 1024)}/${MiB(x.v8.spaces[s]!.used / 1024)}` : '?')));
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  const opt = (name: string, dflt: number) => {
    const i = args.indexOf(name);
    if (i < 0) return dflt;
    const v = Number(args[i + 1]);
    args.splice(i, 2);
    return v;
  };
  const quietS = opt('--quiet', 30);
  const latencyN = opt('--latency', 0);
  const podCount = opt('--pods', 5);
  const variants = args.map(parseVariant);
  if (!variants.length) throw new Error('usage: idle-rss.ts [--quiet S] [--latency N] [--pods N] label=dir[:NAME=value|:--flag|:+--skiff-flag]...');
  const hookDir = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-idle-rss-'));
  const hook = path.join(hookDir, 'heapstat-hook.cjs');
  await fsp.writeFile(hook, HOOK);
  const registry = await startRegistry();
  const sides: Side[] = [];
  const image = `${registry.host}/idle/busybox:v1`;
  try {
    await new Pusher(registry.url).image('idle/busybox', 'v1', await busyboxImage());
    for (const v of variants) {
      const dirs = await makeDirs();
      const ns = new TestNetns().create();
      await ns.bridgePort(Number(registry.host.split(':')[1]), dirs.base);
      await fsp.mkdir(path.join(dirs.base, 'net.d'));
      const argv = ns.wrap([process.execPath, ...v.nodeFlags, '--require', hook, path.join(v.dir, 'bin', 'skiff.js'), 'cri', '--socket', dirs.socket, '--root', dirs.root, '--state', dirs.state, '--registry-config', dirs.certs, '--cni-conf-dir', path.join(dirs.base, 'net.d'), '--images-dir', '', '--log-level', 'info', ...v.skiffArgs]);
      const t0 = process.hrtime.bigint();
      const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...v.env, SKIFF_BENCH_HEAPSTAT: path.join(dirs.base, 'heapstat.json') } });
      const side: Side = { ...v, dirs, ns, child, pid: child.pid!, log: '', cri: undefined as never, startMs: 0, lat: [] };
      child.stdout!.on('data', (d: Buffer) => (side.log += d.toString()));
      child.stderr!.on('data', (d: Buffer) => (side.log += d.toString()));
      sides.push(side);
      await waitFor(`skiff ${v.label}`, async () => side.log.includes('skiff cri serving'), 30_000);
      side.startMs = Number(process.hrtime.bigint() - t0) / 1e6;
      side.cri = client(dirs.socket);
    }
    process.stdout.write(`start to serving (ms): ${sides.map((s) => `${s.label} ${s.startMs.toFixed(0)}`).join(', ')}\n`);
    await new Promise((r) => setTimeout(r, 10_000));
    report('(a) 10 s after start, no calls', sides, await Promise.all(sides.map(measure)));

    const ownPid = { network: 'POD', pid: 'CONTAINER', ipc: 'POD' };
    const pods = new Map<Side, { pod: string; ctr: string }[]>();
    for (const s of sides) {
      await s.cri.img.PullImage({ image: { image } });
      const up: { pod: string; ctr: string }[] = [];
      for (let i = 0; i < podCount; i++) {
        const name = `idle-${s.label}-${i}`;
        const config = { metadata: { name, namespace: 'idle', uid: `${name}-uid`, attempt: 0 }, logDirectory: path.join(s.dirs.base, 'logs', name), linux: { securityContext: { namespaceOptions: ownPid } } };
        const pod = (await s.cri.rt.RunPodSandbox({ config })).podSandboxId as string;
        const ctr = (await s.cri.rt.CreateContainer({ podSandboxId: pod, config: { metadata: { name: 'sleep' }, image: { image }, command: ['sleep', '100000'], logPath: 'sleep.log', linux: { securityContext: { namespaceOptions: ownPid } } }, sandboxConfig: config })).containerId as string;
        await s.cri.rt.StartContainer({ containerId: ctr });
        up.push({ pod, ctr });
      }
      for (let i = 0; i < 50; i++) await s.cri.rt.ListContainers({});
      for (const { ctr } of up) {
        await s.cri.rt.ContainerStatus({ containerId: ctr, verbose: true });
        await s.cri.rt.ExecSync({ containerId: ctr, cmd: ['true'], timeout: 10 });
      }
      await s.cri.rt.ListContainerStats({});
      pods.set(s, up);
    }
    if (latencyN > 0) {
      for (const s of sides) for (let i = 0; i < 200; i++) await s.cri.rt.ListContainers({});
      const rounds = 4;
      for (let r = 0; r < rounds; r++) {
        for (const s of r % 2 ? [...sides].reverse() : sides) {
          for (let i = 0; i < latencyN / rounds; i++) s.lat.push(await ms(() => s.cri.rt.ListContainers({})));
        }
      }
      process.stdout.write(`ListContainers with ${podCount} pods, ${latencyN} warmed calls (ms): ${sides.map((s) => `${s.label} p50 ${pct(s.lat, 50).toFixed(3)} p99 ${pct(s.lat, 99).toFixed(3)}`).join(' | ')}\n`);
    }
    for (const s of sides) {
      for (const { pod, ctr } of pods.get(s) ?? []) {
        await s.cri.rt.StopContainer({ containerId: ctr, timeout: 0 });
        await s.cri.rt.RemoveContainer({ containerId: ctr });
        await s.cri.rt.StopPodSandbox({ podSandboxId: pod });
        await s.cri.rt.RemovePodSandbox({ podSandboxId: pod });
      }
    }
    // The clients go too: an open connection is not what an idle daemon has.
    for (const s of sides) s.cri.close();
    await new Promise((r) => setTimeout(r, quietS * 1000));
    report(`(b) after ${podCount} pods (pull, run, list, exec, stats, stop, remove), ${quietS} s quiet`, sides, await Promise.all(sides.map(measure)));
    // What coming back from quiet costs: a new client's first ListContainers, then its second.
    const first: string[] = [];
    for (const s of sides) {
      s.cri = client(s.dirs.socket);
      const a = await ms(() => s.cri.rt.ListContainers({}));
      const b = await ms(() => s.cri.rt.ListContainers({}));
      first.push(`${s.label} ${a.toFixed(1)} then ${b.toFixed(1)}`);
    }
    process.stdout.write(`first ListContainers after the quiet spell, new connection (ms): ${first.join(' | ')}\n`);
  } finally {
    for (const s of sides) {
      s.cri?.close();
      if (s.child.exitCode === null) {
        const exited = new Promise((r) => s.child.once('exit', r));
        s.child.kill('SIGTERM');
        await exited;
      }
      await s.ns.destroy();
      await fsp.rm(s.dirs.base, { recursive: true, force: true });
    }
    await registry.stop();
    fs.rmSync(hookDir, { recursive: true, force: true });
  }
}

main().then(() => process.exit(0), (e) => {
  process.stderr.write(`${e instanceof Error ? e.stack : String(e)}\n`);
  process.exit(1);
});
