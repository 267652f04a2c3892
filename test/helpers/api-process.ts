/**
 * The node's API alone in its own process (test/helpers/api-server.mjs, from
 * dist/), on a free port over a root directory of the test's, and a way to
 * run a kubectl binary against it.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import { repoRoot } from './daemon.js';
import { waitFor } from './registry.js';

export const KUBECTL_135 = path.join(repoRoot, 'build', 'bin', 'kubectl');
export const KUBECTL_127 = '/usr/lib/google-cloud-sdk/bin/kubectl.1.27';
const helper = path.join(repoRoot, 'test', 'helpers', 'api-server.mjs');

export interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `bin args` with only `env` (and PATH, HOME) in its environment; `wrap` goes before it (nsenter …). */
export function run(bin: string, args: string[], env: Record<string, string>, input?: string, wrap: string[] = []): Promise<Result> {
  return new Promise((resolve) => {
    const argv = [...wrap, bin, ...args];
    const p = spawn(argv[0]!, argv.slice(1), { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: env.HOME ?? os.tmpdir(), ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    p.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    p.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    p.stdin.end(input ?? '');
    const timer = setTimeout(() => p.kill('SIGKILL'), 60_000);
    p.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

export class ApiProcess {
  child?: ChildProcess;
  kubeconfig = '';
  address = '';
  constructor(
    readonly dir: string,
    readonly port: number,
    /** Extra environment for the API process (SKIFF_API_MAX_UNREAD…). */
    readonly env: Record<string, string> = {},
  ) {}

  async start(): Promise<void> {
    let out = '';
    this.child = spawn(process.execPath, [helper, this.dir, `127.0.0.1:${this.port}`], { stdio: ['ignore', 'pipe', 'pipe', 'ipc'], env: { ...process.env, ...this.env } });
    this.child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
    this.child.stderr!.on('data', (b: Buffer) => (out += b.toString()));
    const line = await waitFor('the API process', async () => {
      if (this.child!.exitCode !== null) throw new Error(`the API process exited: ${out}`);
      return /READY (\S+) (\S+)/.exec(out) ?? undefined;
    }, 30_000);
    this.address = line[1]!;
    this.kubeconfig = line[2]!;
  }

  /** What the API process holds now: bytes written to watches but unread by their clients, its watches, its RSS. */
  stats(): Promise<{ unreadWatchBytes: number; watches: number; rss: number }> {
    const c = this.child!;
    return new Promise((resolve) => {
      c.once('message', (m) => resolve(m as { unreadWatchBytes: number; watches: number; rss: number }));
      c.send('stats');
    });
  }

  stop(): Promise<void> {
    return this.kill('SIGTERM');
  }

  async kill(signal: NodeJS.Signals): Promise<void> {
    const c = this.child;
    if (!c || c.exitCode !== null || c.signalCode !== null) return;
    await new Promise<void>((r) => {
      c.once('exit', () => r());
      c.kill(signal);
    });
  }

  /** A raw request with the admin credential, for what kubectl cannot send (oversized bodies, a watch that never reads). */
  request(method: string, p: string, body?: Buffer | string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
    const pki = path.join(this.dir, 'pki');
    return new Promise((resolve, reject) => {
      const req = https.request(
        { host: '127.0.0.1', port: this.port, method, path: p, headers, ca: fs.readFileSync(path.join(pki, 'ca.crt')), cert: fs.readFileSync(path.join(pki, 'admin.crt')), key: fs.readFileSync(path.join(pki, 'admin.key')) },
        (res) => {
          let text = '';
          res.on('data', (b: Buffer) => (text += b.toString()));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
        },
      );
      req.on('error', reject);
      req.end(body);
    });
  }
}
