import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import YAML from 'yaml';
import { describe as describeCmd, get, logs, streamExec, type Io } from '../../src/cli/kubectl.js';
import { EventRecorder } from '../../src/kubelet-lite/events.js';
import { StatusServer } from '../../src/kubelet-lite/status-server.js';
import { FakeAgentView, testPod } from '../helpers/fake-agent-view.js';

const now = () => new Date('2026-11-30T06:05:00Z');

function capture(): Io & { stdout: string; stderr: string } {
  const c = {
    stdout: '',
    stderr: '',
    out: (s: string | Uint8Array) => (c.stdout += Buffer.from(s).toString()),
    err: (s: string | Uint8Array) => (c.stderr += Buffer.from(s).toString()),
  };
  return c;
}

/** An output that is full until released: counts what it was given, says `false` while held. */
function heldOutput(): Io & { bytes: number; release(): void } {
  let held = true;
  const waiters: (() => void)[] = [];
  const o = {
    bytes: 0,
    out: (s: string | Uint8Array) => ((o.bytes += s.length), !held),
    err: (s: string | Uint8Array) => ((o.bytes += s.length), !held),
    drained: () => (held ? new Promise<void>((r) => waiters.push(r)) : Promise.resolve()),
    release: () => {
      held = false;
      for (const w of waiters.splice(0)) w();
    },
  };
  return o;
}

async function until(what: string, fn: () => boolean): Promise<void> {
  const end = Date.now() + 10_000;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe('skiff get, describe and logs against the status API', () => {
  let view: FakeAgentView;
  let server: StatusServer;
  let dir: string;

  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'kubectl-cli-'));
    view = new FakeAgentView();
    view.set(testPod('default', 'web', { status: { phase: 'Running', containerStatuses: [{ name: 'main', ready: true, restartCount: 0, image: 'busybox', imageID: '', state: { running: {} } }] } }));
    view.set(testPod('kube-system', 'dns'));
    server = await StatusServer.listen({ address: '127.0.0.1:0', view, logPollMs: 50 });
  });

  afterEach(async () => {
    await server.close();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('lists one namespace, all of them, and prints json and yaml', async () => {
    const s = ['--server', server.url];
    let io = capture();
    expect(await get(['pods', ...s], io, now)).toBe(0);
    expect(io.stdout).toBe('NAME   READY   STATUS    RESTARTS   AGE\nweb    1/1     Running   0          5m\n');
    io = capture();
    await get(['po', '-A', ...s], io, now);
    expect(io.stdout.split('\n').map((l) => l.split(/ +/).slice(0, 2).join(' '))).toEqual(['NAMESPACE NAME', 'default web', 'kube-system dns', '']);
    io = capture();
    await get(['pods', '-n', 'empty', ...s], io, now);
    expect([io.stdout, io.stderr]).toEqual(['', 'No resources found in empty namespace.\n']);
    io = capture();
    await get(['pods', '-o', 'json', ...s], io, now);
    const list = JSON.parse(io.stdout) as { kind: string; items: { metadata: { name: string } }[] };
    expect(list.kind).toBe('List');
    expect(list.items.map((p) => p.metadata.name)).toEqual(['web']);
    io = capture();
    await get(['pod', 'web', '-o', 'yaml', ...s], io, now);
    expect(YAML.parse(io.stdout)).toMatchObject({ kind: 'Pod', metadata: { name: 'web', uid: 'uid-default-web' } });
    await expect(get(['pods', '-o', 'name', ...s], capture(), now)).rejects.toThrow(/--output must be/);
    await expect(get(['pod', 'ghost', ...s], capture(), now)).rejects.toThrow('Error from server (NotFound): pods "ghost" not found in namespace "default"');
  });

  it('follows the watch with -w: the current pods, then each change as a row', async () => {
    const io = capture();
    const done = get(['pods', '-w', '--server', server.url], io, now).catch(() => 0);
    await until('the first row', () => io.stdout.includes('web'));
    view.set(testPod('default', 'web', { status: { phase: 'Failed', reason: 'Evicted' } }));
    view.set(testPod('kube-system', 'elsewhere'));
    await until('the change', () => io.stdout.includes('Evicted'));
    await server.close();
    await done;
    const lines = io.stdout.trimEnd().split('\n');
    expect(lines.map((l) => l.split(/ +/).slice(0, 3).join(' '))).toEqual(['NAME READY STATUS', 'web 1/1 Running', 'web 0/1 Evicted']);
  });

  it('describes a pod with its own events only', async () => {
    const rec = new EventRecorder({ node: 'n', now });
    rec.record({ namespace: 'default', name: 'web', uid: 'uid-default-web' }, 'Normal', 'Started', 'Started container main', 'main');
    rec.record({ namespace: 'default', name: 'web', uid: 'an-older-web' }, 'Normal', 'Killing', 'Stopping container main', 'main');
    rec.record({ namespace: 'kube-system', name: 'dns', uid: 'uid-kube-system-dns' }, 'Warning', 'BackOff', 'Back-off', 'main');
    view.eventList = rec.list();
    const io = capture();
    expect(await describeCmd(['pod', 'web', '--server', server.url], io, now)).toBe(0);
    expect(io.stdout).toMatch(/^Name: +web$/m);
    expect(io.stdout).toMatch(/^ {2}Normal +Started +0s +kubelet +Started container main$/m);
    expect(io.stdout).not.toContain('Stopping');
    expect(io.stdout).not.toContain('Back-off');
  });

  it('logs -f streams until the log file is replaced', async () => {
    const file = path.join(dir, 'main.log');
    await fs.writeFile(file, '2026-11-30T06:00:00.1Z stdout F one\n');
    view.logs.set('default/web/main', file);
    const io = capture();
    const done = logs(['web', '-f', '--server', server.url], io);
    await until('the first line', () => io.stdout === 'one\n');
    await fs.appendFile(file, '2026-11-30T06:00:00.2Z stdout P tw\n2026-11-30T06:00:00.3Z stdout F o\n');
    await until('the second line', () => io.stdout === 'one\ntwo\n');
    await fs.rm(file);
    expect(await done).toBe(0);
  });

  it('logs reads no faster than its output takes it', async () => {
    const file = path.join(dir, 'main.log');
    const line = `2026-11-30T06:00:00.1Z stdout F ${'x'.repeat(1000)}\n`;
    await fs.writeFile(file, line.repeat(32 * 1024));
    view.logs.set('default/web/main', file);
    const io = heldOutput();
    const done = logs(['web', '--server', server.url], io);
    await new Promise((r) => setTimeout(r, 500));
    // A full output holds the stream: one chunk was taken, not the 32 MiB file.
    expect(io.bytes).toBeGreaterThan(0);
    expect(io.bytes).toBeLessThan(1024 * 1024);
    io.release();
    expect(await done).toBe(0);
    expect(io.bytes).toBe(1001 * 32 * 1024);
  });
});

describe('exec over WebSocket', () => {
  it('stops reading the session while stdout is full, so a container flooding it fills no memory here', async () => {
    const httpServer = http.createServer();
    const wss = new WebSocketServer({ server: httpServer, handleProtocols: () => 'v5.channel.k8s.io' });
    const frame = Buffer.concat([Buffer.from([1]), Buffer.alloc(64 * 1024, 0x61)]);
    const total = 512;
    let sent = 0;
    let serverBuffered = 0;
    wss.on('connection', (ws) => {
      // Sends at the pace the socket takes it, as a runtime does; stops at `total` frames.
      const pump = () => {
        while (sent < total && ws.bufferedAmount < 1024 * 1024) {
          ws.send(frame);
          sent++;
        }
        serverBuffered = ws.bufferedAmount;
        if (sent < total) setTimeout(pump, 5);
        else ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify({ status: 'Success' }))]), () => ws.close(1000));
      };
      pump();
    });
    await new Promise<void>((r) => httpServer.listen(0, '127.0.0.1', r));
    try {
      const io = heldOutput();
      const port = (httpServer.address() as { port: number }).port;
      const done = streamExec(`http://127.0.0.1:${port}/exec/t`, { stdin: false, tty: false }, io);
      await new Promise((r) => setTimeout(r, 700));
      // The client took a little and then left the rest in the kernel and the server's buffer.
      expect(io.bytes).toBeLessThan(8 * 1024 * 1024);
      expect(sent).toBeLessThan(total);
      expect(serverBuffered).toBeGreaterThan(0);
      io.release();
      expect(await done).toBe(0);
      expect(io.bytes).toBe(total * 64 * 1024);
    } finally {
      wss.close();
      await new Promise((r) => httpServer.close(r));
    }
  });

  it('falls back to v4 when the server does not speak v5, and takes the exit code from the status channel', async () => {
    const httpServer = http.createServer();
    const wss = new WebSocketServer({ server: httpServer, handleProtocols: (offered) => (offered.has('v4.channel.k8s.io') ? 'v4.channel.k8s.io' : false) });
    const received: Buffer[] = [];
    wss.on('connection', (ws) => {
      ws.on('message', (d: Buffer) => received.push(d));
      ws.send(Buffer.concat([Buffer.from([1]), Buffer.from('out\n')]));
      ws.send(Buffer.concat([Buffer.from([2]), Buffer.from('err\n')]));
      const status = { metadata: {}, status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '42' }] } };
      ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify(status))]), () => ws.close(1000));
    });
    await new Promise<void>((r) => httpServer.listen(0, '127.0.0.1', r));
    try {
      const io = capture();
      const port = (httpServer.address() as { port: number }).port;
      expect(await streamExec(`http://127.0.0.1:${port}/exec/token`, { stdin: false, tty: false }, io)).toBe(42);
      expect([io.stdout, io.stderr]).toEqual(['out\n', 'err\n']);
      expect(received).toEqual([]);
    } finally {
      wss.close();
      await new Promise((r) => httpServer.close(r));
    }
  });

  it('reports a failure status that is not an exit code, and exits 1', async () => {
    const httpServer = http.createServer();
    const wss = new WebSocketServer({ server: httpServer, handleProtocols: () => 'v5.channel.k8s.io' });
    wss.on('connection', (ws) => {
      ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(JSON.stringify({ status: 'Failure', message: 'container is not running' }))]), () => ws.close(1000));
    });
    await new Promise<void>((r) => httpServer.listen(0, '127.0.0.1', r));
    try {
      const io = capture();
      const port = (httpServer.address() as { port: number }).port;
      expect(await streamExec(`http://127.0.0.1:${port}/exec/t`, { stdin: false, tty: false }, io)).toBe(1);
      expect(io.stderr).toBe('error: container is not running\n');
      wss.removeAllListeners('connection');
      wss.on('connection', (ws) => ws.send(Buffer.concat([Buffer.from([1]), Buffer.from('partial')]), () => ws.terminate()));
      const lost = capture();
      expect(await streamExec(`http://127.0.0.1:${port}/exec/t`, { stdin: false, tty: false }, lost)).toBe(1);
      expect(lost.stdout).toBe('partial');
      expect(lost.stderr).toMatch(/ended without an exit status/);
    } finally {
      wss.close();
      await new Promise((r) => httpServer.close(r));
    }
  });
});
