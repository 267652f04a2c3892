/**
 * `npm run soak [-- --cycles N]`: N pod cycles (RunPodSandbox, CreateContainer,
 * StartContainer, ExecSync, StopPodSandbox, RemovePodSandbox) against a real
 * `skiff cri` in a network namespace of its own, sampling the daemon's RSS,
 * open fds, child processes, conmon processes and database size every
 * `--every` cycles. Prints a table and the growth after the warm-up; exits
 * non-zero when the RSS grew by more than 10 MiB or the fd count grew at all.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { makeDirs, SkiffProcess } from '../test/helpers/daemon.js';
import { busyboxImage } from '../test/helpers/busybox.js';
import { TestNetns } from '../test/helpers/netns.js';
import { Pusher } from '../test/helpers/oci.js';
import { mountsUnder, processesMentioning } from '../test/helpers/pods.js';
import { startRegistry } from '../test/helpers/registry.js';

export interface SoakSample {
  cycle: number;
  rssKiB: number;
  fds: number;
  children: number;
  conmons: number;
  dbBytes: number;
}

export interface SoakOptions {
  cycles: number;
  /** Sample every this many cycles (and before the first). */
  every: number;
  /** Growth is measured from the sample at this cycle. */
  warmup: number;
  maxRssGrowthKiB: number;
  maxFdGrowth: number;
  log?: (line: string) => void;
}

export interface SoakResult {
  samples: SoakSample[];
  growth: { rssKiB: number; fds: number; children: number; conmons: number; dbBytes: number };
  failures: string[];
  msPerCycle: number;
}

function sample(cycle: number, pid: number, dbFile: string, base: string): SoakSample {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKiB = Number(/^VmRSS:\s+(\d+) kB$/m.exec(status)?.[1] ?? NaN);
  const fds = fs.readdirSync(`/proc/${pid}/fd`).length;
  let children = 0;
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    const st = fs.readFileSync(`/proc/${d}/stat`, 'utf8').toString();
    const ppid = Number(st.slice(st.lastIndexOf(')') + 2).split(' ')[1]);
    if (ppid === pid) children++;
  }
  const conmons = processesMentioning(base).filter((l) => /\bconmon\b/.test(l)).length;
  let dbBytes = 0;
  for (const f of [dbFile, `${dbFile}-wal`, `${dbFile}-shm`]) dbBytes += fs.statSync(f, { throwIfNoEntry: false })?.size ?? 0;
  return { cycle, rssKiB, fds, children, conmons, dbBytes };
}

export function formatTable(samples: SoakSample[]): string {
  const head = ['cycle', 'rss MiB', 'fds', 'children', 'conmons', 'db KiB'];
  const rows = samples.map((s) => [String(s.cycle), (s.rssKiB / 1024).toFixed(1), String(s.fds), String(s.children), String(s.conmons), (s.dbBytes / 1024).toFixed(0)]);
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  return [head, ...rows].map((r) => r.map((c, i) => c.padStart(w[i]!)).join('  ')).join('\n');
}

/** Runs the cycles against a started daemon with `image` pulled. */
export async function soak(skiff: SkiffProcess, image: string, o: SoakOptions): Promise<SoakResult> {
  const pid = skiff.child.pid!;
  const dbFile = path.join(skiff.dirs.root, 'metadata.db');
  const samples: SoakSample[] = [];
  const take = async (cycle: number) => {
    // Let runc and conmon children of the last cycle exit before counting.
    await new Promise((r) => setTimeout(r, 200));
    const s = sample(cycle, pid, dbFile, skiff.dirs.base);
    samples.push(s);
    o.log?.(`cycle ${s.cycle}: rss ${(s.rssKiB / 1024).toFixed(1)} MiB, ${s.fds} fds, ${s.children} children, ${s.conmons} conmons, db ${(s.dbBytes / 1024).toFixed(0)} KiB`);
  };
  await take(0);
  const t0 = Date.now();
  for (let i = 1; i <= o.cycles; i++) {
    const config = {
      metadata: { name: `soak${i}`, namespace: 'soak', uid: `uid-soak-${i}`, attempt: 0 },
      hostname: `soak${i}`,
      logDirectory: path.join(skiff.dirs.base, 'logs', `soak${i}`),
      linux: {},
    };
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId,
      config: { metadata: { name: 'c' }, image: { image }, command: ['sleep', '1000'], logPath: 'c.log', linux: {} },
      sandboxConfig: config,
    });
    await skiff.runtime.StartContainer({ containerId: containerId! });
    const r = await skiff.runtime.ExecSync({ containerId: containerId!, cmd: ['echo', `cycle ${i}`], timeout: 10 });
    if (r.exitCode !== 0 || String(r.stdout).trim() !== `cycle ${i}`) throw new Error(`cycle ${i}: ExecSync gave exit ${r.exitCode}, stdout ${JSON.stringify(String(r.stdout))}`);
    await skiff.runtime.StopPodSandbox({ podSandboxId: podSandboxId! });
    await skiff.runtime.RemovePodSandbox({ podSandboxId: podSandboxId! });
    await fsp.rm(config.logDirectory, { recursive: true, force: true });
    if (i % o.every === 0 || i === o.cycles) await take(i);
  }
  const msPerCycle = (Date.now() - t0) / o.cycles;
  const base = samples.find((s) => s.cycle >= o.warmup) ?? samples[0]!;
  const last = samples[samples.length - 1]!;
  const growth = {
    rssKiB: last.rssKiB - base.rssKiB,
    fds: last.fds - base.fds,
    children: last.children - base.children,
    conmons: last.conmons - base.conmons,
    dbBytes: last.dbBytes - base.dbBytes,
  };
  const failures: string[] = [];
  if (growth.rssKiB > o.maxRssGrowthKiB) failures.push(`RSS grew by ${(growth.rssKiB / 1024).toFixed(1)} MiB after cycle ${base.cycle} (limit ${(o.maxRssGrowthKiB / 1024).toFixed(0)} MiB)`);
  if (growth.fds > o.maxFdGrowth) failures.push(`open fds grew by ${growth.fds} after cycle ${base.cycle}`);
  if (last.conmons > 0) failures.push(`${last.conmons} conmon processes remain with no pod`);
  if (growth.children > 0) failures.push(`child processes grew by ${growth.children} after cycle ${base.cycle}`);
  return { samples, growth, failures, msPerCycle };
}

function flag(args: string[], name: string, dflt: number): number {
  const i = args.indexOf(`--${name}`);
  const v = i >= 0 ? args[i + 1] : args.find((a) => a.startsWith(`--${name}=`))?.split('=')[1];
  if (v === undefined) return dflt;
  const n = Number(v);
  if (!Number.isInteger(n) || n <= 0) throw new Error(`--${name} wants a positive integer, got "${v}"`);
  return n;
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0) {
    console.error('soak: needs root (pods, mounts, network namespaces)');
    return 2;
  }
  const args = process.argv.slice(2);
  const cycles = flag(args, 'cycles', 1000);
  const every = flag(args, 'every', 50);
  const warmup = flag(args, 'warmup', Math.min(100, Math.floor(cycles / 2)));
  const registry = await startRegistry();
  const dirs = await makeDirs();
  const ns = new TestNetns().create();
  let skiff: SkiffProcess | undefined;
  try {
    const image = `${registry.host}/soak/busybox:v1`;
    await new Pusher(`http://${registry.host}`).image('soak/busybox', 'v1', await busyboxImage());
    await ns.bridgePort(Number(registry.host.split(':')[1]), dirs.base);
    await fsp.mkdir(path.join(dirs.base, 'net.d'));
    skiff = new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns.wrap(a));
    await skiff.start();
    // The harness keeps the daemon's log; a long run needs none of it.
    skiff.child.stdout!.removeAllListeners('data').resume();
    skiff.child.stderr!.removeAllListeners('data').resume();
    await skiff.images.PullImage({ image: { image } });
    console.log(`soak: ${cycles} pod cycles, sampling every ${every}, growth measured from cycle ${warmup}`);
    const r = await soak(skiff, image, { cycles, every, warmup, maxRssGrowthKiB: 10 * 1024, maxFdGrowth: 0, log: (l) => console.log(l) });
    console.log(`\n${formatTable(r.samples)}\n`);
    console.log(
      `growth after cycle ${warmup}: rss ${(r.growth.rssKiB / 1024).toFixed(1)} MiB, fds ${r.growth.fds}, children ${r.growth.children}, conmons ${r.growth.conmons}, db ${(r.growth.dbBytes / 1024).toFixed(0)} KiB; ${r.msPerCycle.toFixed(0)} ms per cycle`,
    );
    for (const f of r.failures) console.log(`FAIL: ${f}`);
    return r.failures.length ? 1 : 0;
  } finally {
    if (skiff?.child) await skiff.stop();
    await ns.destroy();
    await registry.stop();
    const left = mountsUnder(dirs.base);
    if (left.length) console.error(`soak: mounts left behind: ${left.join(', ')}`);
    else await fsp.rm(dirs.base, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().then(
    (code) => process.exit(code),
    (err) => {
      console.error(`soak: ${err instanceof Error ? err.stack : String(err)}`);
      process.exit(1);
    },
  );
}
