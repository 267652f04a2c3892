/**
 * `npm run bench`: cold pull throughput against containerd and this machine's floor.
 *
 * Builds an image of three 56 MiB layers of random bytes (gzip barely shrinks
 * them), serves it from a local docker-registry, and pulls it cold with a real
 * `skiff cri` several times, and with containerd 1.6 through its CRI socket
 * when it runs here. The floor is the least work any runtime must do for
 * those bytes, measured in the same run: read each blob, sha256 it, gunzip it
 * and sha256 the tar, the layers spread over both cores.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import zlib from 'node:zlib';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { makeDirs, SkiffProcess } from '../test/helpers/daemon.js';
import { buildImage, Pusher, tarOf } from '../test/helpers/oci.js';
import { startRegistry } from '../test/helpers/registry.js';
import { busyboxImage } from '../test/helpers/busybox.js';
import { TestNetns } from '../test/helpers/netns.js';
import { benchKubelet, reportKubelet, type KubeletResults } from './kubelet.js';
import { benchNode, reportNode } from './node.js';
import { benchProxy, proxyBenchArgs } from './proxy.js';
import { benchDns } from './dns.js';
import { benchNetpol } from './netpol.js';
import { benchApi, reportApi } from './api.js';
import { measureFloor, type FloorSamples } from './floor.js';
import { client, report, type PodResults } from './pods.js';
import type { PodsChildSpec } from './pods-child.js';
import { chainIds } from '../src/image/service.js';

const LAYERS = 3;
const LAYER_MIB = 56;
const RUNS = 5;

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

function sink(onChunk: (c: Buffer) => void): Writable {
  return new Writable({
    highWaterMark: 1 << 20,
    write(c: Buffer, _e, cb) {
      onChunk(c);
      cb();
    },
  });
}

async function floorOnce(files: string[]): Promise<number> {
  const t0 = process.hrtime.bigint();
  for (const f of files) {
    const compressed = createHash('sha256');
    const plain = createHash('sha256');
    const gunzip = zlib.createGunzip({ chunkSize: 1 << 18 });
    const read = fs.createReadStream(f, { highWaterMark: 1 << 20 });
    read.on('data', (c) => compressed.update(c as Buffer));
    await pipeline(read, gunzip, sink((c) => plain.update(c)));
    compressed.digest();
    plain.digest();
  }
  return Number(process.hrtime.bigint() - t0) / 1e9;
}

/** The per-layer floor work (read, sha256, gunzip, sha256), run on a thread of its own. */
const FLOOR_WORKER = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const fs = require('node:fs');
const zlib = require('node:zlib');
parentPort.on('message', (file) => {
  const compressed = createHash('sha256');
  const plain = createHash('sha256');
  const gunzip = zlib.createGunzip({ chunkSize: 1 << 18 });
  const read = fs.createReadStream(file, { highWaterMark: 1 << 20 });
  read.on('data', (c) => compressed.update(c));
  gunzip.on('data', (c) => plain.update(c));
  const fail = (e) => parentPort.postMessage({ error: String(e) });
  read.on('error', fail);
  gunzip.on('error', fail);
  gunzip.on('end', () => {
    compressed.digest();
    plain.digest();
    parentPort.postMessage({});
  });
  read.pipe(gunzip);
});
`;

/**
 * The floor on both cores: the same per-layer work as floorOnce, the layers
 * shared among two threads (the machine has two cores), as a runtime that
 * hashes and decompresses layers concurrently could at best.
 */
class TwoCoreFloor {
  private readonly workers = [0, 1].map(() => new Worker(FLOOR_WORKER, { eval: true }));

  async run(files: string[]): Promise<number> {
    const queue = [...files];
    const t0 = process.hrtime.bigint();
    await Promise.all(
      this.workers.map(async (w) => {
        for (let f = queue.shift(); f !== undefined; f = queue.shift()) {
          const done = new Promise<void>((resolve, reject) => {
            w.once('message', (m: { error?: string }) => (m.error ? reject(new Error(m.error)) : resolve()));
          });
          w.postMessage(f);
          await done;
        }
      }),
    );
    return Number(process.hrtime.bigint() - t0) / 1e9;
  }

  async close(): Promise<void> {
    await Promise.all(this.workers.map((w) => w.terminate()));
  }
}

/** CPU seconds (user + system) `pid` has used so far, its threads included. */
function cpuSeconds(pid: number): number {
  try {
    const st = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / 100;
  } catch {
    return NaN;
  }
}

/** `pid`'s resident set in MiB (NaN once it is gone). */
function rssMiB(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

/** The highest RSS `pid` reaches while `work` runs, sampled every 10 ms. */
async function peakRss<T>(pid: number, work: () => Promise<T>): Promise<{ value: T; peak: number }> {
  let peak = rssMiB(pid);
  const t = setInterval(() => (peak = Math.max(peak, rssMiB(pid))), 10);
  try {
    const value = await work();
    return { value, peak: Math.max(peak, rssMiB(pid)) };
  } finally {
    clearInterval(t);
  }
}

const ctrArgs = ['-a', '/run/steer-containerd/containerd.sock', '-n', 'k8s.io'];

/** The digests in containerd's content store, and the keys of its snapshots. */
function containerdHolds(): { content: Set<string>; snapshots: Set<string> } {
  const lines = (args: string[]) => {
    const r = spawnSync('ctr', [...ctrArgs, ...args], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`ctr ${args.join(' ')}: ${r.stderr.trim()}`);
    return r.stdout.split('\n').map((l) => l.trim()).filter(Boolean);
  };
  return { content: new Set(lines(['content', 'ls', '-q'])), snapshots: new Set(lines(['snapshots', 'ls']).slice(1).map((l) => l.split(/\s+/)[0]!)) };
}

/**
 * Removes the bench image from containerd and makes sure nothing of it is
 * left: its blobs in the content store or its layer snapshots would make the
 * next pull warm. CRI RemoveImage deletes the last name synchronously, which
 * runs containerd's garbage collection; anything it left is waited for, then
 * removed with ctr. Returns what had to be removed by hand.
 */
async function containerdForget(img: Record<string, (r: unknown) => Promise<Record<string, unknown>>>, id: string, blobs: string[], chain: string[]): Promise<string[]> {
  await img.RemoveImage!({ image: { image: id } });
  const deadline = Date.now() + 5_000;
  for (;;) {
    const held = containerdHolds();
    const left = [...blobs.filter((b) => held.content.has(b)), ...chain.filter((c) => held.snapshots.has(c))];
    if (!left.length) return [];
    if (Date.now() > deadline) {
      for (const c of [...chain].reverse()) if (held.snapshots.has(c)) spawnSync('ctr', [...ctrArgs, 'snapshots', 'rm', c]);
      for (const b of blobs) if (held.content.has(b)) spawnSync('ctr', [...ctrArgs, 'content', 'rm', b]);
      const again = containerdHolds();
      const still = [...blobs.filter((b) => again.content.has(b)), ...chain.filter((c) => again.snapshots.has(c))];
      if (still.length) throw new Error(`containerd still holds ${still.join(', ')} after RemoveImage and ctr rm`);
      return left;
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function benchPull(registry: Awaited<ReturnType<typeof startRegistry>>): Promise<void> {
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-bench-'));
  const dirs = await makeDirs();
  let skiff: SkiffProcess | undefined;
  const twoCore = new TwoCoreFloor();
  try {
    process.stdout.write(`building ${LAYERS} × ${LAYER_MIB} MiB random layers…\n`);
    const layers = [];
    for (let i = 0; i < LAYERS; i++) {
      layers.push({ raw: await tarOf([{ name: `blob${i}`, data: randomBytes(LAYER_MIB << 20) }]) });
    }
    const img = await buildImage({ layers });
    await new Pusher(registry.url).image('bench/big', 'v1', img);
    const files: string[] = [];
    for (const l of img.layers) {
      const f = path.join(work, l.digest.slice(7));
      await fsp.writeFile(f, l.data);
      files.push(f);
    }
    const bytes = img.layers.reduce((a, l) => a + l.data.length, 0);
    const mib = bytes / (1 << 20);

    // Logging at info to a file, as containerd does (see benchRuntime).
    skiff = await new SkiffProcess(dirs, ['--log-level', 'info'], undefined, path.join(dirs.base, 'skiff.log')).start();
    const ref = `${registry.host}/bench/big:v1`;
    const containerdUp = await fsp.stat(CONTAINERD_SOCKET).then((s) => s.isSocket(), () => false);
    const ctrd = containerdUp ? client(CONTAINERD_SOCKET) : undefined;
    const blobs = [img.manifest.digest, img.config.digest, ...img.layers.map((l) => l.digest)];
    const chain = chainIds(img.diffIds);
    let ctrdNote = containerdUp ? '' : `containerd is not running (${CONTAINERD_SOCKET}); start it with shared/conformance/containerd.sh to compare`;
    const forcedRemovals: string[] = [];
    const ctrdPid = containerdUp ? Number((await fsp.readFile('/tmp/steer-containerd/pid', 'utf8').catch(() => '')).trim()) : NaN;
    const ctrdCpu: number[] = [];
    // The registry runs on the same two cores: what it spends serving a pull is not the daemon's to use.
    const ctrdRegistryCpu: number[] = [];
    const skiffRegistryCpu: number[] = [];
    const containerdPull = async (): Promise<number | undefined> => {
      if (!ctrd || ctrdNote) return undefined;
      try {
        const c0 = cpuSeconds(ctrdPid);
        const r0 = cpuSeconds(registry.pid);
        const t0 = process.hrtime.bigint();
        const res = await ctrd.img.PullImage!({ image: { image: ref } });
        const secs = Number(process.hrtime.bigint() - t0) / 1e9;
        ctrdCpu.push(cpuSeconds(ctrdPid) - c0);
        ctrdRegistryCpu.push(cpuSeconds(registry.pid) - r0);
        forcedRemovals.push(...(await containerdForget(ctrd.img, res.imageRef as string, blobs, chain)));
        return secs;
      } catch (err) {
        ctrdNote = `containerd run failed, reporting skiff alone: ${err instanceof Error ? err.message : String(err)}`;
        return undefined;
      }
    };
    try {
      // One uncounted round first: the first pull also pays for JIT and connection set-up.
      await floorOnce(files);
      await twoCore.run(files);
      await skiff.images.PullImage({ image: { image: ref } });
      await skiff.images.RemoveImage({ image: { image: ref } });
      if (ctrd) {
        // A cold start for containerd too: nothing of the image may be there before its first pull.
        const held = containerdHolds();
        if (blobs.some((b) => held.content.has(b))) ctrdNote = 'containerd already holds the bench image\'s blobs before its first pull';
        await containerdPull();
      }
      const pulls: number[] = [];
      const floors: number[] = [];
      const floors2: number[] = [];
      const ctrdPulls: number[] = [];
      const skiffCpu: number[] = [];
      const skiffPid = skiff.child.pid!;
      const skiffPeaks: number[] = [];
      const ctrdPeaks: number[] = [];
      for (let r = 0; r < RUNS; r++) {
        floors.push(await floorOnce(files));
        floors2.push(await twoCore.run(files));
        const c0 = cpuSeconds(skiffPid);
        const r0 = cpuSeconds(registry.pid);
        const t0 = process.hrtime.bigint();
        skiffPeaks.push((await peakRss(skiffPid, () => skiff!.images.PullImage({ image: { image: ref } }))).peak);
        pulls.push(Number(process.hrtime.bigint() - t0) / 1e9);
        skiffCpu.push(cpuSeconds(skiffPid) - c0);
        skiffRegistryCpu.push(cpuSeconds(registry.pid) - r0);
        await skiff.images.RemoveImage({ image: { image: ref } });
        const c = await peakRss(ctrdPid, containerdPull);
        if (c.value !== undefined) {
          ctrdPulls.push(c.value);
          ctrdPeaks.push(c.peak);
        }
      }
      // What each daemon keeps once pulls stop (skiff's layer thread ends 10 s after its last layer).
      await new Promise((r) => setTimeout(r, 12_000));
      const skiffQuiet = rssMiB(skiffPid);
      const ctrdQuiet = rssMiB(ctrdPid);
      const pull = median(pulls);
      const floor = median(floors);
      const floor2 = median(floors2);
      const runs = (xs: number[]) => xs.map((p) => p.toFixed(2)).join(', ');
      const line = (label: string, secs: number) => `${label.padEnd(48)} ${secs.toFixed(2)} s  ${(mib / secs).toFixed(1).padStart(6)} MiB/s`;
      const out = [
        `cold pull of ${mib.toFixed(1)} MiB in ${LAYERS} layers, median of ${RUNS}`,
        line('skiff PullImage (registry → verify → unpack)', pull) + `  (runs: ${runs(pulls)} s)`,
      ];
      const containerd = ctrdPulls.length === RUNS ? median(ctrdPulls) : undefined;
      if (containerd !== undefined) out.push(line('containerd 1.6 PullImage (CRI, same registry)', containerd) + `  (runs: ${runs(ctrdPulls)} s)`);
      out.push(
        line('floor, two cores: sha256 + gunzip + sha256', floor2) + `  (runs: ${runs(floors2)} s)`,
        line('floor, one core, layer after layer (info)', floor),
      );
      out.push(`CPU per pull, median (user + system, the daemon's threads included): skiff ${median(skiffCpu).toFixed(2)} s${ctrdCpu.length ? `, containerd ${median(ctrdCpu).toFixed(2)} s` : ''}`);
      out.push(`the registry's CPU per pull, median: for skiff ${median(skiffRegistryCpu).toFixed(2)} s${ctrdRegistryCpu.length ? `, for containerd ${median(ctrdRegistryCpu).toFixed(2)} s` : ''}`);
      const asMiB = (x: number) => `${x.toFixed(0)} MiB`;
      out.push(`daemon RSS, highest during its pulls / 12 s after the last: skiff ${asMiB(Math.max(...skiffPeaks))} / ${asMiB(skiffQuiet)}${ctrdPeaks.length ? `, containerd ${asMiB(Math.max(...ctrdPeaks))} / ${asMiB(ctrdQuiet)}` : ''}`);
      if (containerd !== undefined) out.push(`ratio skiff/containerd: ${(pull / containerd).toFixed(2)}× (target ≤ 0.6×)`);
      else out.push(ctrdNote);
      out.push(`ratio skiff/two-core floor: ${(pull / floor2).toFixed(2)}× (target ≤ 1.5×)`);
      if (containerd !== undefined) {
        out.push(forcedRemovals.length
          ? `containerd kept ${forcedRemovals.length} blob(s)/snapshot(s) 5 s after RemoveImage; removed with ctr before the next pull`
          : 'containerd held none of the image\'s blobs or snapshots after each RemoveImage (checked with ctr): every pull was cold');
      }
      process.stdout.write(`${out.join('\n')}\n\n`);
    } finally {
      ctrd?.close();
    }
  } finally {
    await twoCore.close();
    await skiff?.stop();
    await fsp.rm(work, { recursive: true, force: true });
    await fsp.rm(dirs.base, { recursive: true, force: true });
  }
}

const CONTAINERD_SOCKET = '/run/steer-containerd/containerd.sock';

/** A busybox image in the bench registry, and a `skiff cri` (not started) in a network namespace of its own, so its bridge and rules stay off the host. */
async function benchRuntime(registry: Awaited<ReturnType<typeof startRegistry>>) {
  await new Pusher(registry.url).image('bench/busybox', 'v1', await busyboxImage());
  const image = `${registry.host}/bench/busybox:v1`;
  const dirs = await makeDirs();
  const ns = new TestNetns().create();
  await ns.bridgePort(Number(registry.host.split(':')[1]), dirs.base);
  await fsp.mkdir(path.join(dirs.base, 'net.d'));
  // Its log goes to a file, as containerd's does (shared/conformance/containerd.sh): through a pipe, every
  // line the daemon logs would cost the bench's own process, which is also the client being timed, a read.
  const skiff = new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d'), '--log-level', 'info'], (a) => ns.wrap(a), path.join(dirs.base, 'skiff.log'));
  return { image, dirs, ns, skiff };
}

/**
 * benchPods for one runtime in a fresh process (pods-child.ts): each runtime's client starts as cold as the
 * other's, whichever is measured first.
 */
async function podsInChild(spec: PodsChildSpec): Promise<PodResults> {
  const out = path.join(await fsp.mkdtemp(path.join(os.tmpdir(), 'bench-pods-')), 'result.json');
  try {
    const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(new URL('./pods-child.ts', import.meta.url)), JSON.stringify(spec), out], { stdio: 'inherit' });
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once('error', reject);
      child.once('exit', (c) => resolve(c));
    });
    if (code !== 0) throw new Error(`pods bench for ${spec.name} exited with ${code}`);
    return JSON.parse(await fsp.readFile(out, 'utf8')) as PodResults;
  } finally {
    await fsp.rm(path.dirname(out), { recursive: true, force: true });
  }
}

async function benchPodsAll(registry: Awaited<ReturnType<typeof startRegistry>>): Promise<void> {
  const { image, dirs, ns, skiff } = await benchRuntime(registry);
  const results: Array<[string, PodResults]> = [];
  let floor: FloorSamples | undefined;
  try {
    process.stdout.write('pod start floor: CNI bridge ADD and runc run -d…\n');
    floor = await measureFloor((a) => ns.wrap(a));
    await skiff.start();
    process.stdout.write('pod lifecycle: skiff…\n');
    results.push(['skiff', await podsInChild({
      name: 'skiff',
      socket: dirs.socket,
      pids: [skiff.child.pid!],
      monitors: `^(/usr/bin/)?conmon .*${dirs.state}`,
      image,
      logDir: path.join(dirs.base, 'logs'),
    })]);
  } finally {
    if (skiff.child) await skiff.stop();
    await ns.destroy();
    await fsp.rm(dirs.base, { recursive: true, force: true });
  }
  const containerdUp = await fsp.stat(CONTAINERD_SOCKET).then((s) => s.isSocket(), () => false);
  if (containerdUp) {
    process.stdout.write('pod lifecycle: containerd (shared/conformance/containerd.sh)…\n');
    const logs = await fsp.mkdtemp(path.join(os.tmpdir(), 'bench-containerd-logs-'));
    try {
      const cpid = Number((await fsp.readFile('/tmp/steer-containerd/pid', 'utf8')).trim());
      results.push(['containerd 1.6', await podsInChild({
        name: 'containerd',
        socket: CONTAINERD_SOCKET,
        pids: [cpid],
        monitors: 'containerd-shim-runc-v2 .*-namespace k8s\\.io',
        image,
        logDir: logs,
      })]);
    } catch (err) {
      process.stdout.write(`containerd run failed, reporting skiff alone: ${err instanceof Error ? err.message : String(err)}\n`);
    } finally {
      await fsp.rm(logs, { recursive: true, force: true });
    }
  } else {
    process.stdout.write(`containerd is not running (${CONTAINERD_SOCKET}); start it with shared/conformance/containerd.sh to compare\n`);
  }
  process.stdout.write(report(results, floor));
}

async function benchKubeletAll(registry: Awaited<ReturnType<typeof startRegistry>>): Promise<void> {
  const { image, dirs, ns, skiff } = await benchRuntime(registry);
  const results: Array<[string, KubeletResults]> = [];
  try {
    await skiff.start();
    await skiff.images.PullImage({ image: { image } });
    process.stdout.write('kubelet-lite over skiff…\n');
    results.push(['skiff', await benchKubelet({ name: 'skiff', endpoint: `unix://${dirs.socket}`, image, base: dirs.base, ns })]);
  } finally {
    if (skiff.child) await skiff.stop();
    await ns.destroy();
  }
  const containerdUp = await fsp.stat(CONTAINERD_SOCKET).then((s) => s.isSocket(), () => false);
  if (containerdUp) {
    process.stdout.write('kubelet-lite over containerd (shared/conformance/containerd.sh)…\n');
    try {
      results.push(['containerd 1.6', await benchKubelet({ name: 'containerd', endpoint: `unix://${CONTAINERD_SOCKET}`, image, base: dirs.base })]);
    } catch (err) {
      process.stdout.write(`containerd run failed, reporting skiff alone: ${err instanceof Error ? err.message : String(err)}\n`);
    }
  } else {
    process.stdout.write(`containerd is not running (${CONTAINERD_SOCKET}); start it with shared/conformance/containerd.sh to compare\n`);
  }
  await fsp.rm(dirs.base, { recursive: true, force: true });
  process.stdout.write(reportKubelet(results));
}

async function main(): Promise<void> {
  if (process.argv[2] === 'dns') return benchDns(); // no root needed: 127.0.0.x only
  if (process.getuid?.() !== 0) throw new Error('the benchmark runs skiff cri, which needs root');
  if (process.argv[2] === 'proxy') {
    const { sizes, modes } = proxyBenchArgs(process.argv.slice(3));
    return benchProxy(sizes, modes);
  }
  if (process.argv[2] === 'netpol') return benchNetpol(Number(process.argv[3]) || 20);
  if (process.argv[2] === 'api') return void process.stdout.write(reportApi(await benchApi())); // the node imports its images from archives: no registry
  const registry = await startRegistry();
  try {
    const which = process.argv[2] ?? 'all';
    if (which === 'all' || which === 'pull') await benchPull(registry);
    if (which === 'all' || which === 'pods') await benchPodsAll(registry);
    if (which === 'all' || which === 'kubelet') await benchKubeletAll(registry);
    if (which === 'all' || which === 'node') process.stdout.write(reportNode(await benchNode()));
    if (which === 'all') process.stdout.write(reportApi(await benchApi()));
  } finally {
    await registry.stop();
  }
}

main().catch((err) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
