/**
 * Runs a real `skiff cri` process on a temporary socket and root, and talks
 * to it with a gRPC client over that socket, as crictl or the kubelet would.
 */
import * as grpc from '@grpc/grpc-js';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import { closeSync, openSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ImageServiceClient } from '../../src/gen/runtime/v1/ImageService.js';
import type { RuntimeServiceClient } from '../../src/gen/runtime/v1/RuntimeService.js';
import { loadCri } from '../../src/server/proto.js';
import { waitFor } from './registry.js';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const bin = path.join(repoRoot, 'bin', 'skiff.js');

export interface DaemonDirs {
  base: string;
  socket: string;
  root: string;
  state: string;
  certs: string;
}

export async function makeDirs(): Promise<DaemonDirs> {
  const base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-test-'));
  return {
    base,
    socket: path.join(base, 'run', 'skiff.sock'),
    root: path.join(base, 'root'),
    state: path.join(base, 'state'),
    certs: path.join(base, 'certs.d'),
  };
}

/** Writes `<certs>/<host>/hosts.toml`. */
/** Lazily unmounts whatever is still mounted under `base` (a daemon that died cannot undo its own mounts), deepest first. */
export async function unmountUnder(base: string): Promise<void> {
  const mounts = (await fs.readFile('/proc/self/mounts', 'utf8')).split('\n').map((l) => l.split(' ')[1] ?? '');
  for (const m of mounts.filter((m) => m.startsWith(base)).reverse()) spawnSync('umount', ['-l', m]);
}

/** Removes a test daemon's directories, unmounting what is left under them first. */
export async function removeDirs(dirs: DaemonDirs | undefined): Promise<void> {
  if (!dirs) return;
  await unmountUnder(dirs.base);
  await fs.rm(dirs.base, { recursive: true, force: true });
}

export async function hostsToml(dirs: DaemonDirs, host: string, text: string): Promise<void> {
  await fs.mkdir(path.join(dirs.certs, host), { recursive: true });
  await fs.writeFile(path.join(dirs.certs, host, 'hosts.toml'), text);
}

type Promisified<C> = {
  [K in keyof C as C[K] extends (req: infer _R, cb: infer _CB) => unknown ? K : never]: C[K] extends {
    (argument: infer Req, callback: grpc.requestCallback<infer Res>): grpc.ClientUnaryCall;
  }
    ? (req: Req) => Promise<Res>
    : never;
};

function promisify<C extends grpc.Client>(client: C): Promisified<C> {
  return new Proxy(client, {
    get(target, prop) {
      const fn = (target as unknown as Record<string | symbol, unknown>)[prop];
      if (typeof fn !== 'function') return fn;
      return (req: unknown) =>
        new Promise((resolve, reject) =>
          (fn as (r: unknown, m: grpc.Metadata, o: grpc.CallOptions, cb: (e: unknown, r: unknown) => void) => void).call(
            target,
            req,
            new grpc.Metadata(),
            { deadline: Date.now() + 120_000 },
            (err, res) => (err ? reject(err) : resolve(res)),
          ),
        );
    },
  }) as unknown as Promisified<C>;
}

export class SkiffProcess {
  child!: ChildProcess;
  log = '';
  exit!: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  images!: Promisified<ImageServiceClient>;
  runtime!: Promisified<RuntimeServiceClient>;
  private clients: grpc.Client[] = [];

  constructor(
    readonly dirs: DaemonDirs,
    readonly extraArgs: string[] = [],
    /** Prefixes the command line, e.g. to enter a test network namespace. */
    readonly wrap: (argv: string[]) => string[] = (a) => a,
    /**
     * Where the daemon writes its log, as a daemon's log goes to a file or a journal. Without it the log
     * comes through a pipe into `log`, which costs this process a read for every line the daemon writes.
     */
    readonly logFile?: string,
  ) {}

  async start(): Promise<this> {
    const args = [bin, 'cri', '--socket', this.dirs.socket, '--root', this.dirs.root, '--state', this.dirs.state, '--registry-config', this.dirs.certs, '--log-level', 'debug', ...this.extraArgs];
    this.log = '';
    const argv = this.wrap([process.execPath, ...args]);
    if (this.logFile) {
      const fd = openSync(this.logFile, 'a');
      this.child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', fd, fd] });
      closeSync(fd);
    } else {
      this.child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
      this.child.stdout!.on('data', (d: Buffer) => (this.log += d.toString()));
      this.child.stderr!.on('data', (d: Buffer) => (this.log += d.toString()));
    }
    this.exit = new Promise((resolve) => this.child.once('exit', (code, signal) => resolve({ code, signal })));
    // 'close' comes once stdout and stderr are drained: the reason for an early exit is then in the log.
    const closed = new Promise<void>((resolve) => this.child.once('close', () => resolve()));
    await waitFor(`skiff to serve ${this.dirs.socket}`, async () => {
      if (this.child.exitCode !== null) {
        await closed;
        if (this.logFile) this.log = readFileSync(this.logFile, 'utf8');
        throw new Error(`skiff exited (${this.child.exitCode}): ${this.log}`);
      }
      if (this.logFile) this.log = readFileSync(this.logFile, 'utf8');
      return this.log.includes('skiff cri serving');
    });
    const cri = loadCri();
    const target = `unix:${this.dirs.socket}`;
    const img = new cri.runtime.v1.ImageService(target, grpc.credentials.createInsecure());
    const rt = new cri.runtime.v1.RuntimeService(target, grpc.credentials.createInsecure());
    this.clients = [img, rt];
    this.images = promisify(img);
    this.runtime = promisify(rt);
    return this;
  }

  closeClients(): void {
    for (const c of this.clients) c.close();
    this.clients = [];
  }

  async stop(signal: NodeJS.Signals = 'SIGTERM'): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    this.closeClients();
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill(signal);
    return this.exit;
  }
}

/** The gRPC status code of a failed call. */
export async function codeOf(p: Promise<unknown>): Promise<{ code: grpc.status; details: string }> {
  try {
    await p;
  } catch (err) {
    const e = err as grpc.ServiceError;
    return { code: e.code, details: e.details };
  }
  throw new Error('expected the call to fail, but it succeeded');
}

export { grpc };
