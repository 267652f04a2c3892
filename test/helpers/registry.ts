/** Debian's docker-registry on a free 127.0.0.1 port with its own storage, for one test run. */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

export async function waitFor<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastErr: unknown;
  while (Date.now() < deadline) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      lastErr = err;
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}${lastErr ? `: ${String(lastErr)}` : ''}`);
}

export interface RunningRegistry {
  url: string;
  host: string;
  /** The registry's process, for benchmarks that count its CPU. */
  pid: number;
  stop(): Promise<void>;
}

export async function startRegistry(): Promise<RunningRegistry> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-registry-'));
  const port = await freePort();
  const host = `127.0.0.1:${port}`;
  const config = path.join(dir, 'config.yml');
  await fs.writeFile(
    config,
    `version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: ${dir}/data\n  delete:\n    enabled: true\nhttp:\n  addr: ${host}\n`,
  );
  const child: ChildProcess = spawn('docker-registry', ['serve', config], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.once('error', (e) => (stderr += String(e)));
  const url = `http://${host}`;
  await waitFor(`docker-registry on ${host} (${stderr})`, async () => (await fetch(`${url}/v2/`)).ok);
  return {
    url,
    host,
    pid: child.pid!,
    stop: async () => {
      child.kill('SIGTERM');
      await exited;
      await fs.rm(dir, { recursive: true, force: true });
    },
  };
}
