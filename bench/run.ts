/**
 * `npm run bench`: cold pull throughput against this machine's floor.
 *
 * Builds an image of three 56 MiB layers of random bytes (gzip barely shrinks
 * them), serves it from a local docker-registry, and pulls it cold with a real
 * `skiff cri` several times. The floor is the least work any runtime must do
 * for those bytes, measured in the same run: read each blob, sha256 it,
 * gunzip it and sha256 the tar.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import zlib from 'node:zlib';
import { makeDirs, SkiffProcess } from '../test/helpers/daemon.js';
import { buildImage, Pusher, tarOf } from '../test/helpers/oci.js';
import { startRegistry } from '../test/helpers/registry.js';
import { busyboxImage } from '../test/helpers/busybox.js';
import { TestNetns } from '../test/helpers/netns.js';
import { benchKubelet, reportKubelet, type KubeletResults } from './kubelet.js';
import { benchNode, reportNode } from './node.js';
import { benchProxy } from './proxy.js';
import { measureFloor, type FloorSamples } from './floor.js';
import { benchPods, pidsMatching, report, type PodResults } from './pods.js';

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

async function benchPull(registry: Awaited<ReturnType<typeof startRegistry>>): Promise<void> {
  const work = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-bench-'));
  const dirs = await makeDirs();
  let skiff: SkiffProcess | undefined;
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

    skiff = await new SkiffProcess(dirs).start();
    const ref = `${registry.host}/bench/big:v1`;
    // One uncounted round first: the daemon's first pull also pays for JIT and connection set-up.
    await floorOnce(files);
    await skiff.images.PullImage({ image: { image: ref } });
    await skiff.images.RemoveImage({ image: { image: ref } });
    const pulls: number[] = [];
    const floors: number[] = [];
    for (let r = 0; r < RUNS; r++) {
      floors.push(await floorOnce(files));
      const t0 = process.hrtime.bigint();
      await skiff.images.PullImage({ image: { image: ref } });
      pulls.push(Number(process.hrtime.bigint() - t0) / 1e9);
      await skiff.images.RemoveImage({ image: { image: ref } });
    }
    const pull = median(pulls);
    const floor = median(floors);
    const line = (label: string, secs: number) => `${label.padEnd(48)} ${secs.toFixed(2)} s  ${(mib / secs).toFixed(1).padStart(6)} MiB/s`;
    process.stdout.write(
      [
        `cold pull of ${mib.toFixed(1)} MiB in ${LAYERS} layers, median of ${RUNS} (runs: ${pulls.map((p) => p.toFixed(2)).join(', ')} s)`,
        line('skiff PullImage (registry → verify → unpack)', pull),
        line('floor: read + sha256 + gunzip + sha256', floor),
        `ratio pull/floor: ${(pull / floor).toFixed(2)}× (target ≤ 2×)`,
        '',
      ].join('\n'),
    );
  } finally {
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
  const skiff = new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d'), '--log-level', 'info'], (a) => ns.wrap(a));
  return { image, dirs, ns, skiff };
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
    results.push(['skiff', await benchPods({
      name: 'skiff',
      socket: dirs.socket,
      processes: async () => [skiff.child.pid!, ...(await pidsMatching(new RegExp(`^(/usr/bin/)?conmon .*${dirs.state}`)))],
    }, image, path.join(dirs.base, 'logs'))]);
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
      results.push(['containerd 1.6', await benchPods({
        name: 'containerd',
        socket: CONTAINERD_SOCKET,
        processes: async () => [cpid, ...(await pidsMatching(/containerd-shim-runc-v2 .*-namespace k8s\.io/))],
      }, image, logs)]);
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
  if (process.getuid?.() !== 0) throw new Error('the benchmark runs skiff cri, which needs root');
  if (process.argv[2] === 'proxy') return benchProxy();
  const registry = await startRegistry();
  try {
    const which = process.argv[2] ?? 'all';
    if (which === 'all' || which === 'pull') await benchPull(registry);
    if (which === 'all' || which === 'pods') await benchPodsAll(registry);
    if (which === 'all' || which === 'kubelet') await benchKubeletAll(registry);
    if (which === 'all' || which === 'node') process.stdout.write(reportNode(await benchNode()));
  } finally {
    await registry.stop();
  }
}

main().catch((err) => {
  process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
