/**
 * `npm run bench -- node`: the whole node (`skiff node`) in a network
 * namespace of its own, with the demo's images imported from archives:
 *  - idle RSS with no pods, next to containerd's (when it runs here);
 *  - cold start: the command → every demo pod Ready (images already there);
 *  - RSS with the demo running;
 *  - scale a Deployment from 0 to 50 replicas: the write → all 50 Ready.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { buildDemoImages } from '../scripts/build-demo-images.js';
import { repoRoot } from '../test/helpers/daemon.js';
import { TestNetns } from '../test/helpers/netns.js';
import { freePort, waitFor } from '../test/helpers/registry.js';
import { pidsMatching, rssKiB } from './pods.js';

const bin = path.join(repoRoot, 'bin', 'skiff.js');
const SCALE = 50;

export interface NodeResults {
  idleRssMiB: number;
  demoRssMiB: number;
  coldStartMs: number;
  scaleMs: number;
  containerdIdleRssMiB?: number;
}

export async function benchNode(): Promise<NodeResults> {
  const base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-bench-node-'));
  const d = { manifests: path.join(base, 'manifests'), images: path.join(base, 'images'), root: path.join(base, 'root'), state: path.join(base, 'state') };
  await fs.mkdir(d.manifests, { recursive: true });
  await fs.mkdir(path.join(base, 'net.d'));
  await buildDemoImages(d.images);
  // Old archives are imported at start, not waited on as files still being written.
  const old = new Date(Date.now() - 60_000);
  for (const f of await fs.readdir(d.images)) await fs.utimes(path.join(d.images, f), old, old);
  const ns = new TestNetns().create();
  const port = await freePort();
  let child: ChildProcess | undefined;
  let log = '';
  const start = () => {
    log = '';
    const argv = ns.wrap([
      process.execPath, bin, 'node', '--manifests', d.manifests, '--images-dir', d.images, '--socket', path.join(base, 'skiff.sock'),
      '--root', d.root, '--state', d.state, '--root-dir', path.join(base, 'kubelet'), '--cni-conf-dir', path.join(base, 'net.d'),
      '--registry-config', path.join(base, 'certs.d'), '--status-address', `127.0.0.1:${port}`, '--log-level', 'warn',
    ]);
    child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (b: Buffer) => (log += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (log += b.toString()));
  };
  const stop = async () => {
    if (!child || child.exitCode !== null) return;
    const exited = new Promise((r) => child!.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  };
  const nodePid = async () => (await pidsMatching(new RegExp(`skiff\\.js node .*${base}`)))[0]!;
  let status = '';
  const pods = async (): Promise<Pod[]> => ((await (await fetch(`${status}/pods`)).json()) as { items: Pod[] }).items;
  const ready = (p: Pod) => p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
  const write = async (name: string, text: string) => {
    await fs.writeFile(path.join(d.manifests, `.${name}`), text);
    await fs.rename(path.join(d.manifests, `.${name}`), path.join(d.manifests, name));
  };
  try {
    // 1. A node with nothing to run: its idle memory (after the images were imported once).
    start();
    await waitFor('skiff node to be up', async () => log.includes('skiff node is up') || undefined, 60_000);
    status = `http://127.0.0.1:${await ns.exposePort(port, base)}`;
    await new Promise((r) => setTimeout(r, 5000));
    const idleRss = await rssKiB([await nodePid()]);
    await stop();

    // 2. Cold start with the demo's manifests in place.
    for (const f of await fs.readdir(path.join(repoRoot, 'examples', 'demo'))) await fs.copyFile(path.join(repoRoot, 'examples', 'demo', f), path.join(d.manifests, f));
    const t0 = performance.now();
    start();
    await waitFor('every demo pod Ready', async () => {
      const ps = await pods().catch(() => [] as Pod[]);
      const web = ps.filter((p) => p.metadata?.labels?.app === 'web' && ready(p));
      const hello = ps.find((p) => p.metadata?.labels?.['job-name'] === 'hello');
      return web.length === 3 && hello && (hello.status?.phase === 'Running' || hello.status?.phase === 'Succeeded') ? true : undefined;
    }, 60_000);
    const coldStartMs = performance.now() - t0;
    await new Promise((r) => setTimeout(r, 5000));
    const demoRss = await rssKiB([await nodePid()]);

    // 3. Scale a Deployment from 0 to 50.
    const deployment = (n: number) => `apiVersion: apps/v1
kind: Deployment
metadata: {name: many}
spec:
  replicas: ${n}
  selector: {matchLabels: {app: many}}
  template:
    metadata: {labels: {app: many}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: c, image: skiff.local/demo-client:1, imagePullPolicy: IfNotPresent, command: [sleep, "3600"]}
`;
    await write('many.yaml', deployment(0));
    await new Promise((r) => setTimeout(r, 1000));
    const t1 = performance.now();
    await write('many.yaml', deployment(SCALE));
    await waitFor(`${SCALE} replicas Ready`, async () => ((await pods()).filter((p) => p.metadata?.labels?.app === 'many' && ready(p)).length === SCALE ? true : undefined), 180_000);
    const scaleMs = performance.now() - t1;

    // containerd's idle memory, measured in the same run when it is running here.
    const ctrd = await pidsMatching(/^(\/usr\/bin\/)?containerd( |$)/);
    const containerdIdle = ctrd.length ? (await rssKiB(ctrd)) / 1024 : undefined;

    for (const f of await fs.readdir(d.manifests)) await fs.rm(path.join(d.manifests, f));
    await waitFor('every pod gone', async () => ((await pods()).length === 0 ? true : undefined), 180_000);
    return { idleRssMiB: idleRss / 1024, demoRssMiB: demoRss / 1024, coldStartMs, scaleMs, containerdIdleRssMiB: containerdIdle };
  } finally {
    await stop();
    // Whatever the node left (it leaves pods running on purpose) goes with a bare runtime on its root.
    const argv = ns.wrap([process.execPath, bin, 'cri', '--socket', path.join(base, 'skiff.sock'), '--root', d.root, '--state', d.state, '--cni-conf-dir', path.join(base, 'net.d'), '--registry-config', path.join(base, 'certs.d')]);
    const cri = spawn(argv[0]!, argv.slice(1), { stdio: 'ignore' });
    await new Promise((r) => setTimeout(r, 3000));
    spawnSync('crictl', ['-r', `unix://${path.join(base, 'skiff.sock')}`, 'rmp', '-fa'], { stdio: 'ignore' });
    cri.kill('SIGTERM');
    await new Promise((r) => cri.once('exit', r));
    spawnSync('nsenter', [`--net=${ns.path}`, process.execPath, bin, 'proxy', '--cleanup'], { stdio: 'ignore' });
    await ns.destroy();
    await fs.rm(base, { recursive: true, force: true });
  }
}

export function reportNode(r: NodeResults): string {
  const f = (x: number) => x.toFixed(1);
  return [
    '',
    'skiff node (runtime + agent + proxy + DNS in one process):',
    `  idle RSS, no pods                ${f(r.idleRssMiB)} MiB${r.containerdIdleRssMiB !== undefined ? `   (containerd alone, idle, same run: ${f(r.containerdIdleRssMiB)} MiB; ratio ${(r.idleRssMiB / r.containerdIdleRssMiB).toFixed(2)}×)` : ''}   target ≤ 110 MiB`,
    `  RSS with the demo running        ${f(r.demoRssMiB)} MiB`,
    `  cold start → every demo pod Ready ${(r.coldStartMs / 1000).toFixed(2)} s   target ≤ 3 s`,
    `  scale 0 → ${SCALE} replicas Ready      ${(r.scaleMs / 1000).toFixed(2)} s   target ≤ 10 s`,
    '',
  ].join('\n');
}
