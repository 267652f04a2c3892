/**
 * A whole `skiff node` for a test, as a user runs it: its own process in a
 * network namespace of the test's own (so its API on 127.0.0.1:6443, its
 * rules and its pods touch nothing outside), the demo images imported from
 * archives (no registry), and kubectl run inside the same namespace with
 * the node's admin kubeconfig. stop() removes every pod, mount and rule.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { buildDemoImages } from '../../scripts/build-demo-images.js';
import { loadCri } from '../../src/server/proto.js';
import { grpc, repoRoot } from './daemon.js';
import { TestNetns } from './netns.js';
import { mountsUnder, processesMentioning } from './pods.js';
import { waitFor } from './registry.js';

const bin = path.join(repoRoot, 'bin', 'skiff.js');
export const KUBECTL_135 = path.join(repoRoot, 'build', 'bin', 'kubectl');
export const KUBECTL_127 = '/usr/lib/google-cloud-sdk/bin/kubectl.1.27';

export interface KubectlResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Steps a test adds around the node's life, for what must be in place before its first start and gone before the leak check. */
export interface SkiffNodeHooks {
  /** Right after the base directory is made, before anything is written in it (such as mounting a small filesystem on it). */
  prepareBase?(base: string): Promise<void>;
  /** After the node and its pods are gone, before the check for leftover mounts (such as unmounting what prepareBase mounted). */
  releaseBase?(base: string): Promise<void>;
}

export class SkiffNode {
  base = '';
  ns!: TestNetns;
  child: ChildProcess | undefined;
  /** Everything the node process printed since its last start. */
  log = '';
  readonly nodeName = 'api-node';

  /** `extraArgs` go after the fixture's own flags; `env` into the node's environment. */
  constructor(
    readonly extraArgs: string[] = [],
    readonly env: Record<string, string> = {},
    readonly hooks: SkiffNodeHooks = {},
  ) {}

  /** The node process's pid while it runs (it is the one `ip netns exec` execs into). */
  get pid(): number | undefined {
    const c = this.child;
    return c && c.exitCode === null && c.signalCode === null ? c.pid : undefined;
  }

  get dirs() {
    const b = this.base;
    return {
      socket: path.join(b, 'skiff.sock'),
      root: path.join(b, 'root'),
      state: path.join(b, 'state'),
      kubelet: path.join(b, 'kubelet'),
      manifests: path.join(b, 'manifests'),
      images: path.join(b, 'images'),
      kubeconfig: path.join(b, 'kubelet', 'admin.kubeconfig'),
    };
  }

  /** Makes the directories, the images and the namespace, then starts the node. */
  async create(): Promise<void> {
    this.base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-apinode-'));
    await this.hooks.prepareBase?.(this.base);
    const d = this.dirs;
    await fs.mkdir(d.manifests, { recursive: true });
    await fs.mkdir(path.join(this.base, 'net.d'));
    await buildDemoImages(d.images);
    this.ns = new TestNetns().create();
    // The node's own address, as eth0 would carry it (a documentation address on a veth pair whose both ends stay inside).
    for (const args of [['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0-peer'], ['addr', 'add', '192.0.2.10/24', 'dev', 'eth0'], ['link', 'set', 'eth0-peer', 'up'], ['link', 'set', 'eth0', 'up']]) {
      const r = spawnSync('ip', ['-n', this.ns.name, ...args], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`ip ${args.join(' ')}: ${r.stderr}`);
    }
    await this.start();
    await waitFor('the demo images imported from the images dir', async () => this.log.includes('"images":["skiff.local/demo-web:1"]'), 60_000);
  }

  async start(): Promise<void> {
    const d = this.dirs;
    this.log = '';
    const argv = this.ns.wrap([
      process.execPath, bin, 'node',
      '--manifests', d.manifests, '--images-dir', d.images,
      '--socket', d.socket, '--root', d.root, '--state', d.state, '--root-dir', d.kubelet,
      '--cni-conf-dir', path.join(this.base, 'net.d'), '--registry-config', path.join(this.base, 'certs.d'),
      '--status-address', '127.0.0.1:10255', '--node-name', this.nodeName, '--log-level', 'info',
      ...this.extraArgs,
    ]);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...this.env } });
    this.child = child;
    child.stdout!.on('data', (b: Buffer) => (this.log += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (this.log += b.toString()));
    await waitFor('skiff node to be ready', async () => {
      if (child.exitCode !== null) throw new Error(`skiff node exited ${child.exitCode}: ${this.log}`);
      return this.log.includes('skiff node ready');
    }, 60_000);
  }

  /** SIGTERM (pods keep running) or SIGKILL; resolves with the exit code or signal. */
  async stopProcess(signal: NodeJS.Signals = 'SIGTERM'): Promise<number | string | null> {
    const child = this.child;
    if (!child || child.exitCode !== null || child.signalCode !== null) return child?.exitCode ?? child?.signalCode ?? null;
    const exited = new Promise<number | string | null>((r) => child.once('exit', (c, s) => r(c ?? s)));
    child.kill(signal);
    return exited;
  }

  /** kubectl (1.35 unless given) inside the node's namespace, with the admin kubeconfig. */
  kubectl(args: string[], opts: { bin?: string; input?: string; timeoutMs?: number; env?: Record<string, string> } = {}): Promise<KubectlResult> {
    const argv = this.ns.wrap([opts.bin ?? KUBECTL_135, '--kubeconfig', this.dirs.kubeconfig, ...args]);
    return new Promise((resolve) => {
      const c = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'], env: { ...process.env, ...opts.env } });
      let stdout = '';
      let stderr = '';
      c.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
      c.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      const timer = setTimeout(() => c.kill('SIGKILL'), opts.timeoutMs ?? 60_000);
      c.on('close', (status) => {
        clearTimeout(timer);
        resolve({ status, stdout, stderr });
      });
      c.stdin.end(opts.input ?? '');
    });
  }

  /** kubectl that must succeed: its stdout. */
  async kubectlOk(args: string[], opts: { bin?: string; input?: string; timeoutMs?: number; env?: Record<string, string> } = {}): Promise<string> {
    const r = await this.kubectl(args, opts);
    if (r.status !== 0) throw new Error(`kubectl ${args.join(' ')} exited ${r.status}: ${r.stderr}${r.stdout}`);
    return r.stdout;
  }

  /** kubectl get -o json, parsed. */
  async getJson<T = Record<string, unknown>>(args: string[]): Promise<T> {
    return JSON.parse(await this.kubectlOk(['get', ...args, '-o', 'json'])) as T;
  }

  /** The pod sandboxes the node's runtime holds (CRI ListPodSandbox on its socket, a file: no namespace to cross). */
  async sandboxes(): Promise<Array<{ id: string; state: string; metadata: { name: string; namespace: string } }>> {
    return (await this.criCall<{ items: Array<{ id: string; state: string; metadata: { name: string; namespace: string } }> }>('RuntimeService', 'ListPodSandbox', {})).items;
  }

  /** The images the node's runtime holds (CRI ListImages on its socket, as `crictl images` asks). */
  async images(): Promise<Array<{ id: string; repoTags: string[]; size: string }>> {
    return (await this.criCall<{ images: Array<{ id: string; repoTags: string[]; size: string }> }>('ImageService', 'ListImages', {})).images;
  }

  private async criCall<T>(service: 'RuntimeService' | 'ImageService', method: string, req: unknown): Promise<T> {
    const proto = loadCri();
    const client = new proto.runtime.v1[service](`unix:${this.dirs.socket}`, grpc.credentials.createInsecure());
    try {
      return await new Promise<T>((resolve, reject) =>
        (client as unknown as Record<string, (r: unknown, cb: (e: unknown, v: T) => void) => void>)[method]!.call(client, req, (e, v) => (e ? reject(e) : resolve(v))),
      );
    } finally {
      client.close();
    }
  }

  /** Stops the node, removes its pods through a bare runtime on the same root, its rules and namespace; checks nothing leaked. */
  async destroy(): Promise<{ mounts: string[]; processes: string[] }> {
    if (!this.base) return { mounts: [], processes: [] };
    if (!this.ns) {
      // create() failed before the namespace: only what prepareBase did is there to undo.
      await this.hooks.releaseBase?.(this.base);
      return { mounts: [], processes: [] };
    }
    await this.stopProcess();
    const d = this.dirs;
    const release = this.hooks.releaseBase;
    return removeNode(this.base, this.ns, d, release ? () => release(this.base) : undefined);
  }
}

/**
 * What a stopped node leaves on purpose (its pods keep running for the next
 * one to adopt) removed: every sandbox through a bare runtime on the same
 * root, the proxy's rules, the namespace, then the base directory. Returns
 * the mounts and processes still naming `base` (none, when all went).
 */
export async function removeNode(
  base: string,
  ns: TestNetns,
  d: { socket: string; root: string; state: string },
  beforeLeakCheck?: () => Promise<void>,
): Promise<{ mounts: string[]; processes: string[] }> {
  const argv = ns.wrap([process.execPath, bin, 'cri', '--socket', d.socket, '--root', d.root, '--state', d.state, '--cni-conf-dir', path.join(base, 'net.d'), '--registry-config', path.join(base, 'certs.d')]);
  const cri = spawn(argv[0]!, argv.slice(1), { stdio: 'ignore' });
  await waitFor('the runtime for cleanup', async () => spawnSync('test', ['-S', d.socket]).status === 0, 30_000).catch(() => undefined);
  const proto = loadCri();
  const rt = new proto.runtime.v1.RuntimeService(`unix:${d.socket}`, grpc.credentials.createInsecure());
  const call = <T>(m: string, req: unknown) =>
    new Promise<T>((resolve, reject) => (rt as unknown as Record<string, (r: unknown, cb: (e: unknown, v: T) => void) => void>)[m]!.call(rt, req, (e, v) => (e ? reject(e) : resolve(v))));
  // The node's socket file outlives it: until the new runtime answers, a call is refused, and a listing taken
  // as empty would leave every pod (and its mounts) behind.
  const list = await waitFor('the runtime to answer for cleanup', () => call<{ items: Array<{ id: string }> }>('ListPodSandbox', {}).catch(() => undefined), 30_000).catch(() => ({ items: [] }));
  for (const sb of list.items) await call('RemovePodSandbox', { podSandboxId: sb.id }).catch(() => undefined);
  rt.close();
  await new Promise<void>((r) => {
    cri.once('exit', () => r());
    cri.kill('SIGTERM');
  });
  spawnSync('nsenter', [`--net=${ns.path}`, process.execPath, bin, 'proxy', '--cleanup']);
  await ns.destroy();
  await new Promise((r) => setTimeout(r, 300));
  await beforeLeakCheck?.();
  const leaks = { mounts: mountsUnder(base), processes: processesMentioning(base) };
  await fs.rm(base, { recursive: true, force: true });
  return leaks;
}
