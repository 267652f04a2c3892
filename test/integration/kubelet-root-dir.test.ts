/**
 * The agent's --root-dir holds every pod's volumes (Secrets among them), logs
 * and termination messages: one left open to other users is tightened at
 * start, one another user owns is refused, as the runtime's --root is.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { freePort, waitFor } from '../helpers/registry.js';

const bin = path.join(repoRoot, 'bin', 'skiff.js');

describe.skipIf(!isRoot)('skiff kubelet: a --root-dir others can read', () => {
  const bases: string[] = [];
  afterAll(async () => {
    for (const b of bases) await fs.rm(b, { recursive: true, force: true });
  });

  async function agent(rootDir: string, base: string) {
    const port = await freePort();
    const child = spawn(process.execPath, [bin, 'kubelet', '--root-dir', rootDir, '--manifests', path.join(base, 'manifests'), '--runtime-endpoint', `unix://${path.join(base, 'none.sock')}`, '--status-address', `127.0.0.1:${port}`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let log = '';
    child.stdout!.on('data', (d: Buffer) => (log += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (log += d.toString()));
    const exit = new Promise<number | null>((r) => child.once('exit', (c) => r(c)));
    return { child, exit, log: () => log };
  }

  it('tightens a 0755 root dir to 0700, with a warning', async () => {
    const base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-rootdir-'));
    bases.push(base);
    const rootDir = path.join(base, 'kubelet');
    await fs.mkdir(rootDir, { mode: 0o755 });
    await fs.chmod(rootDir, 0o755);
    const a = await agent(rootDir, base);
    try {
      await waitFor('the root dir tightened', async () => (((await fs.stat(rootDir)).mode & 0o777) === 0o700 ? true : undefined), 15_000);
      await waitFor('the warning', async () => (a.log().includes('--root-dir was open to other users; its mode is now 0700') ? true : undefined), 15_000);
    } finally {
      a.child.kill('SIGKILL');
      await a.exit;
    }
  });

  it('refuses a root dir another user owns, naming the uid', async () => {
    const base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-rootdir-'));
    bases.push(base);
    const rootDir = path.join(base, 'kubelet');
    await fs.mkdir(rootDir, { mode: 0o700 });
    await fs.chown(rootDir, 65534, 65534);
    const a = await agent(rootDir, base);
    expect(await a.exit).not.toBe(0);
    expect(a.log()).toMatch(/--root-dir .* belongs to uid 65534, not to this agent's uid 0/);
  });
});
