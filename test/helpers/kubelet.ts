/**
 * A whole node for tests: a real `skiff cri` in its own network namespace
 * with a busybox image pulled, and a real `skiff kubelet` process beside it
 * on a temporary manifest directory. Assertions go through the agent's
 * status API, as a user's `skiff get pods` would.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Event, Pod } from 'kubernetes-types/core/v1.js';
import { repoRoot } from './daemon.js';
import { startPodFixture, type PodFixture } from './pods.js';
import { freePort, waitFor } from './registry.js';

const bin = path.join(repoRoot, 'bin', 'skiff.js');

export class AgentProcess {
  child!: ChildProcess;
  log = '';
  exit!: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(
    readonly args: string[],
    readonly wrap: (argv: string[]) => string[],
    readonly env: Record<string, string> = {},
  ) {}

  async start(): Promise<this> {
    this.log = '';
    const argv = this.wrap([process.execPath, bin, 'kubelet', ...this.args]);
    this.child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...this.env } });
    this.child.stdout!.on('data', (d: Buffer) => (this.log += d.toString()));
    this.child.stderr!.on('data', (d: Buffer) => (this.log += d.toString()));
    this.exit = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
    try {
      await waitFor('skiff kubelet to serve its status API', async () => {
        if (this.child.exitCode !== null) throw new Error(`skiff kubelet exited (${this.child.exitCode}): ${this.log}`);
        return this.log.includes('kubelet-lite serving');
      }, 30_000);
    } catch (err) {
      // An agent that never came up is not left behind.
      await this.stop('SIGKILL');
      throw err;
    }
    return this;
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exit;
  }
}

export interface NodeFixture {
  pods: PodFixture;
  manifests: string;
  rootDir: string;
  agent: AgentProcess;
  /** The status API as the test process reaches it. */
  status: string;
  /** The busybox image in the test registry. */
  image: string;
  write(file: string, text: string): Promise<void>;
  remove(file: string): Promise<void>;
  get<T = unknown>(urlPath: string): Promise<{ status: number; body: T }>;
  pod(name: string, namespace?: string): Promise<Pod | undefined>;
  events(name?: string): Promise<Event[]>;
  /** Polls the pod until `pred` holds; the error shows the last status and the agent's log tail. */
  waitPod(name: string, pred: (p: Pod) => boolean, what: string, timeoutMs?: number, namespace?: string): Promise<Pod>;
  /** Polls until the pod is gone from the status API. */
  waitGone(name: string, timeoutMs?: number, namespace?: string): Promise<void>;
  restartAgent(signal?: NodeJS.Signals): Promise<void>;
  cleanup(): Promise<{ mounts: string[]; processes: string[] }>;
}

export async function startNode(registryHost: string, repo: string, agentArgs: string[] = [], opts: { daemonArgs?: string[]; env?: Record<string, string> } = {}): Promise<NodeFixture> {
  const pods = await startPodFixture(registryHost, repo, opts.daemonArgs);
  const manifests = path.join(pods.dirs.base, 'manifests');
  const rootDir = path.join(pods.dirs.base, 'kubelet');
  await fs.mkdir(manifests, { recursive: true });
  const port = await freePort();
  const args = [
    '--manifests', manifests,
    '--runtime-endpoint', `unix://${pods.dirs.socket}`,
    '--status-address', `127.0.0.1:${port}`,
    '--root-dir', rootDir,
    '--node-name', 'test-node',
    '--log-level', 'debug',
    ...agentArgs,
  ];
  const agent = await new AgentProcess(args, (a) => pods.ns.wrap(a), opts.env).start();
  const hostPort = await pods.ns.exposePort(port, pods.dirs.base);
  const status = `http://127.0.0.1:${hostPort}`;

  const get = async <T>(urlPath: string) => {
    const r = await fetch(status + urlPath);
    const text = await r.text();
    let body: unknown = text;
    try {
      body = JSON.parse(text);
    } catch {
      // not JSON (metrics, healthz)
    }
    return { status: r.status, body: body as T };
  };
  const pod = async (name: string, namespace = 'default') => {
    const r = await get<Pod>(`/pods/${namespace}/${name}`);
    return r.status === 200 ? r.body : undefined;
  };
  const fixture: NodeFixture = {
    pods,
    manifests,
    rootDir,
    agent,
    status,
    image: pods.image,
    write: async (file, text) => {
      // Written beside and renamed in, as editors and kubectl do: the agent never reads half a file.
      const tmp = path.join(manifests, `.${file}.tmp`);
      await fs.writeFile(tmp, text);
      await fs.rename(tmp, path.join(manifests, file));
    },
    remove: (file) => fs.rm(path.join(manifests, file), { force: true }),
    get,
    pod,
    events: async (name) => {
      const r = await get<{ items: Event[] }>('/events');
      return r.body.items.filter((e) => !name || e.involvedObject.name === name);
    },
    waitPod: async (name, pred, what, timeoutMs = 60_000, namespace = 'default') => {
      let last: Pod | undefined;
      try {
        return await waitFor(
          `pod ${name}: ${what}`,
          async () => {
            last = await pod(name, namespace);
            return last && pred(last) ? last : undefined;
          },
          timeoutMs,
        );
      } catch (err) {
        throw new Error(`${(err as Error).message}\nlast status: ${JSON.stringify(last?.status, null, 1)}\nagent log tail:\n${agent.log.split('\n').slice(process.env.SKIFF_TEST_FULL_LOG ? 0 : -40).join('\n')}`);
      }
    },
    waitGone: async (name, timeoutMs = 60_000, namespace = 'default') => {
      let last: Pod | undefined;
      try {
        await waitFor(`pod ${name} to be gone`, async () => {
          last = await pod(name, namespace);
          return last ? undefined : true;
        }, timeoutMs);
      } catch (err) {
        throw new Error(`${(err as Error).message}\nlast status: ${JSON.stringify(last?.status, null, 1)}\nagent log:\n${agent.log.split('\n').slice(process.env.SKIFF_TEST_FULL_LOG ? 0 : -40).join('\n')}\nruntime log tail:\n${pods.skiff.log.split('\n').slice(-30).join('\n')}`);
      }
    },
    restartAgent: async (signal = 'SIGTERM') => {
      await agent.stop(signal);
      await agent.start();
    },
    cleanup: async () => {
      // Pods go the way a user removes them, so the agent tears their volumes down too; whatever
      // is left after that (the agent leaves pods running when it stops) goes through CRI.
      if (agent.child.exitCode === null && agent.child.signalCode === null) {
        for (const f of await fs.readdir(manifests).catch(() => [] as string[])) await fs.rm(path.join(manifests, f), { force: true });
        await waitFor('every pod to be gone', async () => {
          const r = await get<{ items?: Pod[] }>('/pods').catch(() => undefined);
          return r && (r.body.items ?? []).length === 0 ? true : undefined;
        }, 60_000).catch(() => undefined);
      }
      await agent.stop('SIGTERM');
      return pods.cleanup();
    },
  };
  return fixture;
}

/** A pod manifest in YAML with the busybox image. */
export function podYaml(name: string, image: string, spec: string, extraMeta = ''): string {
  return `apiVersion: v1
kind: Pod
metadata:
  name: ${name}
${extraMeta}spec:
${spec.replace(/IMAGE/g, image)}`;
}

export const ready = (p: Pod) => p.status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True';
export const containerStatus = (p: Pod, name: string) => [...(p.status?.initContainerStatuses ?? []), ...(p.status?.containerStatuses ?? [])].find((c) => c.name === name);
