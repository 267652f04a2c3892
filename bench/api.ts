/**
 * `npm run bench -- api`: the node's API, against a real `skiff node` in a
 * network namespace of its own (test/helpers/skiff-node.ts):
 *  - idle RSS of the node process with the API serving and no pods;
 *  - `kubectl apply -f` of a 3-replica Deployment → its 3 pods Ready, next
 *    to the same manifest written into the manifest directory, both read
 *    from the API with a watch (p50 of RUNS each, the two interleaved);
 *  - with 200 Pods stored (placed on another node, so this one runs none):
 *    GET /api/v1/pods over one keep-alive connection, and a ConfigMap
 *    write → its watch event, on one watch and on 50 at once.
 * The HTTPS client runs inside the namespace (api-child.ts), so nothing
 * relays between it and the server.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath } from 'node:url';
import { SkiffNode } from '../test/helpers/skiff-node.js';
import { waitFor } from '../test/helpers/registry.js';
import { rssKiB } from './pods.js';
import { percentile } from './stats.js';

const RUNS = 10;
const STORED_PODS = 200;
const LISTS = 200;
const WRITES = 50;
const WATCHERS = 50;
const IDLE_SETTLE_MS = 10_000;

/** The Deployment both ways; only the name differs, so a file's object and the API's never meet. */
export function webDeployment(name: string): string {
  return `apiVersion: apps/v1
kind: Deployment
metadata: {name: ${name}}
spec:
  replicas: 3
  selector:
    matchLabels: {app: ${name}}
  template:
    metadata:
      labels: {app: ${name}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        ports:
        - {name: http, containerPort: 8080}
        readinessProbe:
          httpGet: {path: /, port: http}
          periodSeconds: 2
`;
}

function storedPods(n: number): string {
  const items = Array.from({ length: n }, (_, i) => ({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: `stored-${i}`, labels: { bench: 'stored' } },
    spec: { nodeName: 'elsewhere', containers: [{ name: 'c', image: 'skiff.local/demo-web:1', imagePullPolicy: 'Never' }] },
  }));
  return JSON.stringify({ apiVersion: 'v1', kind: 'List', items });
}

/** api-child.ts inside the node's namespace: one command a line in, one answer a line out. */
class ApiClientChild {
  private readonly child: ChildProcess;
  private readonly answers: string[] = [];
  private waiting: { resolve: (line: string) => void; reject: (err: Error) => void } | undefined;
  private exited: Error | undefined;
  private stderr = '';

  constructor(node: SkiffNode) {
    const argv = node.ns.wrap([process.execPath, ...process.execArgv, fileURLToPath(new URL('./api-child.ts', import.meta.url)), node.dirs.kubeconfig]);
    this.child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stderr!.on('data', (b: Buffer) => (this.stderr = (this.stderr + b.toString()).slice(-4000)));
    readline.createInterface({ input: this.child.stdout! }).on('line', (l) => {
      const w = this.waiting;
      this.waiting = undefined;
      if (w) w.resolve(l);
      else this.answers.push(l);
    });
    this.child.once('exit', (c, sig) => {
      this.exited = new Error(`api bench client exited ${c ?? sig}: ${this.stderr}`);
      this.waiting?.reject(this.exited);
      this.waiting = undefined;
    });
  }

  send(cmd: Record<string, unknown>): void {
    this.child.stdin!.write(`${JSON.stringify(cmd)}\n`);
  }

  /** The next answer; an {error} answer or the child's exit is thrown. */
  async next<T = Record<string, unknown>>(): Promise<T> {
    const line = this.answers.shift() ?? (await new Promise<string>((resolve, reject) => {
      if (this.exited) reject(this.exited);
      else this.waiting = { resolve, reject };
    }));
    const a = JSON.parse(line) as T & { error?: string };
    if (a.error) throw new Error(`api bench client: ${a.error}`);
    return a;
  }

  async call<T = Record<string, unknown>>(cmd: Record<string, unknown>): Promise<T> {
    this.send(cmd);
    return this.next<T>();
  }

  async close(): Promise<void> {
    if (this.child.exitCode !== null) return;
    const exited = new Promise((r) => this.child.once('exit', r));
    this.child.stdin!.end();
    await exited;
  }
}

export interface ApiResults {
  idleRssMiB: number;
  idleAfterRssMiB: number;
  applyMs: number[];
  fileMs: number[];
  list: { ms: number[]; bytes: number; items: number; sockets: number };
  watchOne: number[];
  watchMany: number[];
  podsRunElsewhere: number;
}

/** Pod sandboxes ready on the node's runtime. */
async function readySandboxes(node: SkiffNode): Promise<number> {
  return (await node.sandboxes()).filter((s) => s.state === 'SANDBOX_READY').length;
}

export async function benchApi(): Promise<ApiResults> {
  const node = new SkiffNode();
  let client: ApiClientChild | undefined;
  try {
    process.stdout.write('api: starting skiff node with the demo images…\n');
    await node.create();
    const pid = node.child!.pid!;
    const comm = (await fs.readFile(`/proc/${pid}/comm`, 'utf8')).trim();
    if (comm !== 'node') throw new Error(`the node's process ${pid} is ${comm}, not node`);

    // 3. Idle, API serving, no pods.
    await new Promise((r) => setTimeout(r, IDLE_SETTLE_MS));
    if ((await readySandboxes(node)) !== 0) throw new Error('the node runs pods before the bench made any');
    const idleRssMiB = (await rssKiB([pid])) / 1024;

    client = new ApiClientChild(node);

    // 1. kubectl apply → 3 Ready, next to the manifest directory → 3 Ready, interleaved.
    const apiFile = path.join(node.base, 'bench-api.yaml');
    await fs.writeFile(apiFile, webDeployment('bench-api'));
    const manifest = path.join(node.dirs.manifests, 'bench-file.yaml');
    const sandboxesGone = () => waitFor('every pod sandbox stopped', async () => (await readySandboxes(node)) === 0 || undefined, 60_000);
    const timeToReady = async (selector: string, act: () => Promise<void>): Promise<number> => {
      client!.send({ op: 'watchReady', selector, count: 3 });
      await client!.next();
      const t0 = process.hrtime.bigint();
      await act();
      const { readyAt } = await client!.next<{ readyAt: string }>();
      return Number(BigInt(readyAt) - t0) / 1e6;
    };
    const applyMs: number[] = [];
    const fileMs: number[] = [];
    // One uncounted round of each first: the first pods also pay for the image's first unpack and the JIT.
    for (let r = -1; r < RUNS; r++) {
      process.stdout.write(`api: deployment run ${r < 0 ? 'warm-up' : r + 1}/${RUNS}\n`);
      const a = await timeToReady('app=bench-api', async () => void (await node.kubectlOk(['apply', '-f', apiFile])));
      await node.kubectlOk(['delete', '-f', apiFile, '--wait=false']);
      await client.call({ op: 'gone', selector: 'app=bench-api' });
      await sandboxesGone();
      const f = await timeToReady('app=bench-file', async () => {
        await fs.writeFile(`${path.dirname(manifest)}/.bench-file.yaml`, webDeployment('bench-file'));
        await fs.rename(`${path.dirname(manifest)}/.bench-file.yaml`, manifest);
      });
      await fs.rm(manifest);
      await client.call({ op: 'gone', selector: 'app=bench-file' });
      await sandboxesGone();
      if (r >= 0) {
        applyMs.push(a);
        fileMs.push(f);
      }
    }

    // 2. 200 Pods stored for another node.
    process.stdout.write(`api: ${STORED_PODS} pods stored for node "elsewhere", list and watch latency…\n`);
    await node.kubectlOk(['apply', '-f', '-'], { input: storedPods(STORED_PODS), timeoutMs: 120_000 });
    await new Promise((r) => setTimeout(r, 3000));
    const podsRunElsewhere = (await node.sandboxes()).length;
    const list = await client.call<ApiResults['list']>({ op: 'list', path: '/api/v1/pods', requests: LISTS, warmup: 10 });
    if (list.items !== STORED_PODS) throw new Error(`GET /api/v1/pods gave ${list.items} pods, not ${STORED_PODS}`);
    const watchOne = (await client.call<{ ms: number[] }>({ op: 'watchDelay', watchers: 1, writes: WRITES, prefix: 'one' })).ms;
    const watchMany = (await client.call<{ ms: number[] }>({ op: 'watchDelay', watchers: WATCHERS, writes: WRITES, prefix: 'many' })).ms;

    // Idle again once everything the bench made is gone.
    await node.kubectlOk(['delete', 'pods', '-l', 'bench=stored', '--grace-period=0', '--force'], { timeoutMs: 120_000 });
    await node.kubectlOk(['delete', 'configmaps', '--all'], { timeoutMs: 120_000 });
    await client.close();
    client = undefined;
    await new Promise((r) => setTimeout(r, IDLE_SETTLE_MS));
    const idleAfterRssMiB = (await rssKiB([pid])) / 1024;
    return { idleRssMiB, idleAfterRssMiB, applyMs, fileMs, list, watchOne, watchMany, podsRunElsewhere };
  } catch (err) {
    process.stdout.write(`api: failed (${err instanceof Error ? err.stack : String(err)}); the node's log ends:\n${node.log.slice(-1500)}\n`);
    throw err;
  } finally {
    await client?.close().catch(() => undefined);
    const leaks = await node.destroy();
    if (leaks.mounts.length || leaks.processes.length) process.stdout.write(`api: the node left ${JSON.stringify(leaks)}\n`);
  }
}

export function reportApi(r: ApiResults): string {
  const ms = (x: number) => `${x.toFixed(x < 100 ? 2 : 0)} ms`;
  const p50 = (xs: number[]) => percentile(xs, 50);
  const p99 = (xs: number[]) => percentile(xs, 99);
  const apply = p50(r.applyMs);
  const file = p50(r.fileMs);
  const runs = (xs: number[]) => xs.map((x) => (x / 1000).toFixed(2)).join(', ');
  return [
    '',
    'skiff node API (HTTPS, admin client certificate, client inside the node\'s namespace):',
    `  idle RSS, API serving, no pods         ${r.idleRssMiB.toFixed(1)} MiB   target ≤ 110 MiB   (${(IDLE_SETTLE_MS / 1000).toFixed(0)} s after start; ${r.idleAfterRssMiB.toFixed(1)} MiB idle again after the runs)`,
    `  kubectl apply → 3 pods Ready, p50      ${ms(apply)}   (runs: ${runs(r.applyMs)} s)`,
    `  manifest file → 3 pods Ready, p50      ${ms(file)}   (runs: ${runs(r.fileMs)} s)`,
    `  ratio API/file                         ${(apply / file).toFixed(2)}×   target ≤ 1.2×`,
    `  with ${STORED_PODS} pods stored (node "elsewhere"; sandboxes this node runs: ${r.podsRunElsewhere}):`,
    `  GET /api/v1/pods p50 / p99             ${ms(p50(r.list.ms))} / ${ms(p99(r.list.ms))}   target p50 ≤ 10 ms   (${LISTS} requests, ${r.list.sockets} connection(s), ${(r.list.bytes / 1024).toFixed(0)} KiB each)`,
    `  write → watch event, 1 watch, p50/p99  ${ms(p50(r.watchOne))} / ${ms(p99(r.watchOne))}   target ≤ 5 ms   (${WRITES} ConfigMap creates)`,
    `  write → watch event, ${WATCHERS} watches p50/p99 ${ms(p50(r.watchMany))} / ${ms(p99(r.watchMany))}   (${r.watchMany.length} events)`,
    '',
  ].join('\n');
}
