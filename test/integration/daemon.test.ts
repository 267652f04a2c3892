import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, repoRoot, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { Front } from '../helpers/front.js';
import { buildImage, Pusher } from '../helpers/oci.js';
import { waitFor } from '../helpers/registry.js';

/** A gRPC Version call over raw HTTP/2 with `:authority` set the way Go's CRI clients set it. */
function versionWithAuthority(socket: string, authority: string): Promise<{ status?: string; body: string; error?: string }> {
  return new Promise((resolve) => {
    const session = http2.connect('http://localhost', { createConnection: () => net.connect(socket) });
    session.on('error', (e) => resolve({ body: '', error: e.message }));
    const req = session.request({
      ':method': 'POST',
      ':path': '/runtime.v1.RuntimeService/Version',
      ':authority': authority,
      'content-type': 'application/grpc',
      te: 'trailers',
    });
    let body = Buffer.alloc(0);
    let status: string | undefined;
    req.on('data', (d: Buffer) => (body = Buffer.concat([body, d])));
    req.on('trailers', (t) => (status = String(t['grpc-status'])));
    req.on('end', () => {
      session.close();
      resolve({ status, body: body.subarray(5).toString('latin1') });
    });
    req.on('error', (e) => {
      session.close();
      resolve({ body: '', error: e.message });
    });
    req.end(Buffer.alloc(5));
  });
}

/** Listening TCP sockets by inode, with the address they are bound to. */
function listeningTcp(): Map<string, string> {
  const out = new Map<string, string>();
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    const text = spawnSync('cat', [f]).stdout.toString();
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols[3] === '0A') out.set(cols[9]!, cols[1]!);
    }
  }
  return out;
}

describe.skipIf(!isRoot)('skiff cri: the daemon', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('answers Version as skiff speaking CRI v1', async () => {
    const v = await skiff.runtime.Version({ version: 'v1' });
    expect(v).toMatchObject({ runtimeName: 'skiff', runtimeApiVersion: 'v1', version: '0.1.0' });
    expect(v.runtimeVersion).toMatch(/^\d+\.\d+\.\d+/);
  });

  it('reports runtime and network readiness truthfully, with verbose info', async () => {
    const st = await skiff.runtime.Status({ verbose: true });
    const conds = Object.fromEntries(st.status!.conditions!.map((c) => [c.type, c]));
    expect(conds.RuntimeReady?.status).toBe(true);
    expect(conds.NetworkReady?.status).toBe(true);
    expect(st.runtimeHandlers?.map((h) => h.name)).toContain('runc');
    const info = JSON.parse(st.info!.config!);
    expect(info).toMatchObject({ root: dirs.root, state: dirs.state, cgroupDriver: 'cgroupfs' });
    expect(info.runtimeHandlers.runc.available).toBe(true);
    // crun is offered only where it works; where it is not, the reason is given.
    if (!info.runtimeHandlers.crun.available) expect(info.runtimeHandlers.crun.reason).toMatch(/crun/);
  });

  it('reports the network as not ready, naming the missing plugin, when CNI plugins are absent', async () => {
    const other = await makeDirs();
    const d = await new SkiffProcess(other, ['--cni-bin-dir', path.join(other.base, 'no-plugins')]).start();
    try {
      const st = await d.runtime.Status({});
      const net = st.status!.conditions!.find((c) => c.type === 'NetworkReady')!;
      expect(net.status).toBe(false);
      expect(net.reason).toBe('NetworkPluginNotReady');
      expect(net.message).toMatch(/CNI plugin "bridge"/);
    } finally {
      await d.stop();
      await fs.rm(other.base, { recursive: true, force: true });
    }
  });

  it('answers RPCs it does not implement yet with UNIMPLEMENTED and a message', async () => {
    const err = await codeOf(skiff.runtime.CheckpointContainer({ containerId: 'x' }));
    expect(err.code).toBe(grpc.status.UNIMPLEMENTED);
    expect(err.details).toMatch(/CheckpointContainer is not implemented/);
  });

  it('answers a streaming RPC it does not implement with UNIMPLEMENTED', async () => {
    const { loadCri } = await import('../../src/server/proto.js');
    const cri = loadCri();
    const client = new cri.runtime.v1.RuntimeService(`unix:${dirs.socket}`, grpc.credentials.createInsecure());
    const code = await new Promise<number>((resolve) => {
      const call = client.StreamContainers({});
      call.on('error', (e: grpc.ServiceError) => resolve(e.code));
      call.on('data', () => undefined);
    });
    client.close();
    expect(code).toBe(grpc.status.UNIMPLEMENTED);
  });

  it('serves CRI on a root-only 0660 socket, and TCP only for streaming on 127.0.0.1', async () => {
    const st = await fs.stat(dirs.socket);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);
    expect(st.uid).toBe(0);
    const listening = listeningTcp();
    const mine: string[] = [];
    for (const fd of await fs.readdir(`/proc/${skiff.child.pid}/fd`)) {
      const target = await fs.readlink(`/proc/${skiff.child.pid}/fd/${fd}`).catch(() => '');
      const inode = /^socket:\[(\d+)\]$/.exec(target)?.[1];
      if (inode && listening.has(inode)) mine.push(listening.get(inode)!);
    }
    // One listener, the streaming server, on 127.0.0.1 (0100007F in /proc's little-endian hex).
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatch(/^0100007F:/);
  });

  it('accepts the socket path as :authority, as Go clients (crictl, kubelet) send it', async () => {
    // Served in process: there is no second, private socket behind the public one any more.
    await expect(fs.stat(path.join(dirs.state, 'grpc.sock'))).rejects.toThrow(/ENOENT/);
    const viaSkiff = await versionWithAuthority(dirs.socket, dirs.socket);
    expect(viaSkiff.error).toBeUndefined();
    expect(viaSkiff.status).toBe('0');
    expect(viaSkiff.body).toContain('skiff');
  });

  it.skipIf(spawnSync('sh', ['-c', 'command -v crictl']).status !== 0)('works with crictl (when crictl is installed)', () => {
    const r = spawnSync('crictl', ['--runtime-endpoint', `unix://${dirs.socket}`, '--image-endpoint', `unix://${dirs.socket}`, 'version'], { encoding: 'utf8' });
    expect(r.stderr).toBe('');
    expect(r.stdout).toMatch(/RuntimeName:\s+skiff/);
  });

  it('logs one structured line per RPC with method, duration and code: polled calls at debug, changes and failures at info', async () => {
    await skiff.runtime.Version({});
    await skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: {} });
    await skiff.runtime.ContainerStatus({ containerId: 'no-such-container' }).catch(() => undefined);
    // The answer can come before the log line has crossed the daemon's stdout pipe.
    const rpcLines = () => skiff.log.split('\n').filter((l) => l.includes('"msg":"rpc"')).map((l) => JSON.parse(l) as Record<string, unknown>);
    await waitFor('the ContainerStatus log line', async () => rpcLines().some((l) => l.method === 'runtime.v1.RuntimeService/ContainerStatus'));
    const lines = rpcLines();
    const last = (m: string) => lines.filter((l) => l.method === `runtime.v1.RuntimeService/${m}`).at(-1);
    expect(last('Version')).toMatchObject({ code: 'OK', level: 'debug' });
    expect(typeof last('Version')?.ms).toBe('number');
    expect(last('UpdateRuntimeConfig')).toMatchObject({ code: 'OK', level: 'info' });
    expect(last('ContainerStatus')).toMatchObject({ code: 'NOT_FOUND', level: 'info' });
  });

  it('refuses to start a second daemon on a socket in use', async () => {
    const child = spawn(process.execPath, [path.join(repoRoot, 'bin/skiff.js'), 'cri', '--socket', dirs.socket, '--root', `${dirs.base}/root2`, '--state', `${dirs.base}/state2`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
    expect(code).not.toBe(0);
    expect(err).toMatch(/another process is serving/);
    // The first daemon is unharmed.
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');
  });

  it('refuses a second daemon on the same root, even on another socket, naming the first one\'s pid', async () => {
    const other = `${dirs.base}/other.sock`;
    const child = spawn(process.execPath, [path.join(repoRoot, 'bin/skiff.js'), 'cri', '--socket', other, '--root', dirs.root, '--state', `${dirs.base}/state3`, '--registry-config', dirs.certs], { stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
    expect(code).not.toBe(0);
    expect(err).toContain(`another skiff (pid ${skiff.child.pid}) is using --root ${dirs.root}`);
    expect(existsSync(other)).toBe(false);
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');
  });
});

describe.skipIf(!isRoot)('skiff cri: shutdown', () => {
  it('on SIGTERM finishes the in-flight pull, then exits 0 and removes its socket', async () => {
    const reg = inject('registryHost');
    const img = await buildImage({ layers: [{ entries: [{ name: 'slow', data: Buffer.alloc(50_000, 3) }] }] });
    await new Pusher(`http://${reg}`).image('test/shutdown', 'v1', img);
    const slow = await new Front({ upstream: `http://${reg}`, delayMs: 1_500 }).start();
    const dirs = await makeDirs();
    const skiff = await new SkiffProcess(dirs).start();
    try {
      const pull = skiff.images.PullImage({ image: { image: `${slow.host}/test/shutdown:v1` } });
      await waitFor('the layer download to begin', async () => slow.requests.some((r) => r.endsWith(img.layers[0]!.digest)));
      skiff.child.kill('SIGTERM');
      const res = await pull;
      expect(res.imageRef).toBe(img.config.digest);
      const exit = await skiff.exit;
      expect(exit.code).toBe(0);
      await expect(fs.stat(dirs.socket)).rejects.toThrow(/ENOENT/);
    } finally {
      await skiff.stop();
      await slow.close();
      await fs.rm(dirs.base, { recursive: true, force: true });
    }
  });
});

describe.skipIf(!isRoot)('skiff cri: a --root that others can read', () => {
  let dirs: DaemonDirs;
  afterAll(async () => {
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('tightens a 0755 root and 0644 database files left from before to 0700 and 0600', async () => {
    dirs = await makeDirs();
    await fs.mkdir(dirs.root, { recursive: true, mode: 0o755 });
    await fs.chmod(dirs.root, 0o755);
    let skiff = await new SkiffProcess(dirs).start();
    // A pod record makes the WAL hold something; then the files are opened up, as an old version or umask left them.
    await skiff.stop();
    await fs.chmod(dirs.root, 0o755);
    const dbFiles = ['metadata.db', 'metadata.db-wal', 'metadata.db-shm'].map((f) => path.join(dirs.root, f));
    for (const f of dbFiles) {
      await fs.writeFile(f, '', { flag: 'a' });
      await fs.chmod(f, 0o644);
    }
    skiff = await new SkiffProcess(dirs).start();
    try {
      expect((await fs.stat(dirs.root)).mode & 0o777).toBe(0o700);
      for (const f of dbFiles) expect((await fs.stat(f)).mode & 0o777, f).toBe(0o600);
      expect(skiff.log).toMatch(/--root was open to other users; its mode is now 0700.*"was":"0755"/);
      // What a user other than root could reach before: nothing below the root now.
      const probe = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'cat', dbFiles[0]!], { encoding: 'utf8' });
      expect(probe.status).not.toBe(0);
      expect(probe.stderr).toMatch(/Permission denied/);
    } finally {
      await skiff.stop();
    }
  });

  it("refuses a root that another user owns, saying so, and starts nothing", async () => {
    const other = await makeDirs();
    try {
      await fs.mkdir(other.root, { recursive: true, mode: 0o700 });
      await fs.chown(other.root, 65534, 65534);
      await expect(new SkiffProcess(other).start()).rejects.toThrow(/--root .* belongs to uid 65534, not to this daemon's uid 0/);
      expect(existsSync(path.join(other.root, 'metadata.db'))).toBe(false);
    } finally {
      await fs.rm(other.base, { recursive: true, force: true });
    }
  });
});
