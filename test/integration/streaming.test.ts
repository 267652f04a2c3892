import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import WebSocket from 'ws';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { waitFor } from '../helpers/registry.js';

describe.skipIf(!isRoot)('streaming: Exec, Attach and PortForward over SPDY and WebSocket', () => {
  let f: PodFixture;
  let podId: string;
  let ctr: string;
  let web: string;
  let shell: string;
  /** Host port that reaches the streaming server inside the test namespace. */
  let streamHostPort: number;

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-stream');
    const config = { metadata: { name: 'stream', namespace: 'test', uid: 'stream-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} };
    podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const mk = async (name: string, command: string[], extra: Record<string, unknown> = {}) => {
      const id = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name }, image: { image: f.image }, command, logPath: `${name}.log`, linux: {}, ...extra }, sandboxConfig: config })).containerId!;
      await f.skiff.runtime.StartContainer({ containerId: id });
      return id;
    };
    ctr = await mk('sleeper', ['sleep', '100000']);
    web = await mk('web', ['sh', '-c', 'mkdir -p /www && echo hello-from-pod > /www/index.html && httpd -f -p 80 -h /www']);
    shell = await mk('shell', ['sh'], { stdin: true });
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    streamHostPort = await f.ns.exposePort(Number(new URL(url).port), f.dirs.base);
  });

  afterAll(async () => {
    const leaks = await f?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function spdyExec(cmd: string[], opts: { stdin?: string; stderr?: boolean } = {}) {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd, stdout: true, stderr: opts.stderr ?? true, stdin: opts.stdin !== undefined })).url!;
    const { client, protocol } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io', 'v3.channel.k8s.io'], streamHostPort);
    const error = await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = opts.stdin !== undefined ? await client.open({ streamtype: 'stdin', requestid: '0' }) : undefined;
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    const stderr = opts.stderr === false ? undefined : await client.open({ streamtype: 'stderr', requestid: '0' });
    if (stdin) client.write(stdin, opts.stdin!, true);
    await client.until(() => error.fin);
    client.close();
    return { protocol, status: error.data.toString(), stdout: stdout.data.toString(), stderr: stderr?.data.toString() ?? '' };
  }

  it('runs a command over SPDY (v4) with stdout, stderr and a success status', async () => {
    const r = await spdyExec(['sh', '-c', 'echo out; echo err >&2']);
    expect(r.protocol).toBe('v4.channel.k8s.io');
    expect([r.stdout, r.stderr]).toEqual(['out\n', 'err\n']);
    expect(JSON.parse(r.status)).toEqual({ metadata: {}, status: 'Success' });
  });

  it('delivers a non-zero exit code in the v4 status, as clients read it', async () => {
    const r = await spdyExec(['sh', '-c', 'exit 3']);
    const st = JSON.parse(r.status);
    expect(st).toMatchObject({ status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '3' }] } });
  });

  it('passes stdin and its end to the process', async () => {
    const r = await spdyExec(['sh', '-c', 'cat; echo after-eof'], { stdin: 'line one\nline two\n' });
    expect(r.stdout).toBe('line one\nline two\nafter-eof\n');
  });

  it('makes each URL single-use, and refuses unknown tokens and unsupported protocols', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    const first = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], streamHostPort);
    first.client.close();
    await expect(SpdyTestClient.connect(url, ['v4.channel.k8s.io'], streamHostPort)).rejects.toThrow(/404/);
    await expect(SpdyTestClient.connect(url.replace(/[^/]+$/, 'bogus-token'), ['v4.channel.k8s.io'], streamHostPort)).rejects.toThrow(/404/);
    const other = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    await expect(SpdyTestClient.connect(other, ['v99.channel.k8s.io'], streamHostPort)).rejects.toThrow(/403/);
  });

  it('answers bad Exec and PortForward requests with the right gRPC codes', async () => {
    expect((await codeOf(f.skiff.runtime.Exec({ containerId: 'nope', cmd: ['true'], stdout: true }))).code).toBe(grpc.status.NOT_FOUND);
    expect((await codeOf(f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'] }))).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await codeOf(f.skiff.runtime.Exec({ containerId: ctr, cmd: [], stdout: true }))).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await codeOf(f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sh'], tty: true, stdout: true, stderr: true }))).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await codeOf(f.skiff.runtime.PortForward({ podSandboxId: 'nope', port: [80] }))).code).toBe(grpc.status.NOT_FOUND);
    expect((await codeOf(f.skiff.runtime.PortForward({ podSandboxId: podId, port: [70000] }))).code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it('runs a command over WebSocket (v5) with channels, stdin close and the status channel', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sh', '-c', 'cat; echo err >&2; exit 4'], stdin: true, stdout: true, stderr: true })).url!;
    const u = new URL(url);
    const ws = new WebSocket(`ws://127.0.0.1:${streamHostPort}${u.pathname}`, ['v5.channel.k8s.io']);
    const got: Record<number, string> = {};
    await new Promise<void>((resolve, reject) => {
      ws.on('open', () => {
        expect(ws.protocol).toBe('v5.channel.k8s.io');
        ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('typed input\n')]));
        ws.send(Buffer.from([255, 0]));
      });
      ws.on('message', (m: Buffer) => (got[m[0]!] = (got[m[0]!] ?? '') + m.subarray(1).toString()));
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(got[1]).toBe('typed input\n');
    expect(got[2]).toBe('err\n');
    expect(JSON.parse(got[3]!).details.causes[0].message).toBe('4');
  });

  it('forwards several concurrent connections to a pod port over SPDY, and reports a closed port on the error stream', async () => {
    const url = (await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!;
    const { client, protocol } = await SpdyTestClient.connect(url, ['portforward.k8s.io'], streamHostPort);
    expect(protocol).toBe('portforward.k8s.io');
    const conns = [];
    for (let i = 0; i < 3; i++) {
      const error = await client.open({ streamtype: 'error', port: '80', requestid: String(i) });
      const data = await client.open({ streamtype: 'data', port: '80', requestid: String(i) });
      client.write(data, `GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n`, true);
      conns.push({ error, data });
    }
    for (const c of conns) {
      await client.until(() => c.data.fin);
      expect(c.data.data.toString()).toMatch(/^HTTP\/1\.[01] 200[\s\S]*hello-from-pod/);
    }
    const error = await client.open({ streamtype: 'error', port: '81', requestid: '9' });
    const data = await client.open({ streamtype: 'data', port: '81', requestid: '9' });
    client.write(data, 'x', true);
    await client.until(() => error.fin);
    expect(error.data.toString()).toMatch(/error forwarding port 81/);
    // The failed port ends its own streams only: the session still forwards.
    const e2 = await client.open({ streamtype: 'error', port: '80', requestid: '10' });
    const d2 = await client.open({ streamtype: 'data', port: '80', requestid: '10' });
    client.write(d2, 'GET / HTTP/1.0\r\n\r\n', true);
    await client.until(() => d2.fin);
    expect(d2.data.toString()).toContain('hello-from-pod');
    expect(e2.reset).toBe(false);
    client.close();
    await waitFor('web to still serve', async () => (await f.skiff.runtime.ContainerStatus({ containerId: web })).status?.state === 'CONTAINER_RUNNING');
  });

  it('runs a command on a terminal over SPDY, with resize and the exit code', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sh'], tty: true, stdin: true, stdout: true })).url!;
    const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], streamHostPort);
    const error = await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await client.open({ streamtype: 'stdin', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    const resize = await client.open({ streamtype: 'resize', requestid: '0' });
    client.write(resize, JSON.stringify({ Width: 77, Height: 22 }));
    await new Promise((r) => setTimeout(r, 300));
    client.write(stdin, 'tty; stty size; exit 6\n');
    await client.until(() => error.fin);
    client.close();
    const out = stdout.data.toString();
    expect(out).toMatch(/\/dev\/pts\/\d+/);
    expect(out).toContain('22 77');
    expect(JSON.parse(error.data.toString()).details.causes[0].message).toBe('6');
  });

  it('runs a command on a terminal over WebSocket, resized on channel 4', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sh'], tty: true, stdin: true, stdout: true })).url!;
    const ws = new WebSocket(`ws://127.0.0.1:${streamHostPort}${new URL(url).pathname}`, ['v5.channel.k8s.io']);
    const got: Record<number, string> = {};
    await new Promise<void>((resolve, reject) => {
      ws.on('open', () => {
        ws.send(Buffer.concat([Buffer.from([4]), Buffer.from(JSON.stringify({ Width: 91, Height: 33 }))]));
        setTimeout(() => ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('stty size; exit 0\n')])), 300);
      });
      ws.on('message', (m: Buffer) => (got[m[0]!] = (got[m[0]!] ?? '') + m.subarray(1).toString()));
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(got[1]).toContain('33 91');
    expect(JSON.parse(got[3]!)).toEqual({ metadata: {}, status: 'Success' });
  });

  it('attaches to a container\'s own stdio over SPDY and over WebSocket', async () => {
    const url = (await f.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!;
    const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], streamHostPort);
    await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await client.open({ streamtype: 'stdin', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    const stderr = await client.open({ streamtype: 'stderr', requestid: '0' });
    client.write(stdin, 'echo hello-attach; echo to-stderr >&2\n');
    await client.until(() => stdout.data.toString() === 'hello-attach\n' && stderr.data.toString() === 'to-stderr\n');
    client.close();

    const again = (await f.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!;
    const ws = new WebSocket(`ws://127.0.0.1:${streamHostPort}${new URL(again).pathname}`, ['v4.channel.k8s.io']);
    let out = '';
    await new Promise<void>((resolve, reject) => {
      ws.on('open', () => ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('echo via-websocket\n')])));
      ws.on('message', (m: Buffer) => {
        if (m[0] === 1) out += m.subarray(1).toString();
        if (out.includes('via-websocket\n')) resolve();
      });
      ws.on('error', reject);
    });
    ws.close();
    expect(out).toBe('via-websocket\n');
    expect((await codeOf(f.skiff.runtime.Attach({ containerId: ctr, stdin: true, stdout: true }))).code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it('still attaches after ExecSync in the same container: an exec leaves the container\'s attach socket alone', async () => {
    // Given the container's bundle, conmon 2.1 sets up an exec's own attach socket in it, in place of the container's.
    const execs = await Promise.all(Array.from({ length: 8 }, () => f.skiff.runtime.ExecSync({ containerId: shell, cmd: ['true'], timeout: 10 })));
    expect(execs.map((r) => r.exitCode)).toEqual(Array(8).fill(0));
    const url = (await f.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!;
    const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], streamHostPort);
    const error = await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await client.open({ streamtype: 'stdin', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    await client.open({ streamtype: 'stderr', requestid: '0' });
    client.write(stdin, 'echo after-exec\n');
    await client.until(() => stdout.data.toString().includes('after-exec\n') || error.fin);
    client.close();
    expect(error.data.toString()).toBe('');
    expect(stdout.data.toString()).toBe('after-exec\n');
  });

  it('forwards a port over WebSocket, with the port announced on both channels', async () => {
    const url = (await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!;
    const ws = new WebSocket(`ws://127.0.0.1:${streamHostPort}${new URL(url).pathname}?port=80`, ['v4.channel.k8s.io']);
    const frames: Buffer[] = [];
    let data = '';
    await new Promise<void>((resolve, reject) => {
      ws.on('message', (m: Buffer) => {
        frames.push(m);
        if (frames.length === 2) ws.send(Buffer.concat([Buffer.from([0]), Buffer.from('GET / HTTP/1.0\r\n\r\n')]));
        if (frames.length > 2 && m[0] === 0) data += m.subarray(1).toString();
      });
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(frames[0]).toEqual(Buffer.from([0, 80, 0]));
    expect(frames[1]).toEqual(Buffer.from([1, 80, 0]));
    expect(data).toMatch(/200[\s\S]*hello-from-pod/);
  });

  it('speaks the base64 WebSocket variant and the older SPDY protocol versions', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['echo', 'b64'], stdout: true })).url!;
    const ws = new WebSocket(`ws://127.0.0.1:${streamHostPort}${new URL(url).pathname}`, ['v4.base64.channel.k8s.io']);
    const texts: string[] = [];
    await new Promise<void>((resolve, reject) => {
      ws.on('message', (m: Buffer) => texts.push(m.toString()));
      ws.on('close', () => resolve());
      ws.on('error', reject);
    });
    expect(texts.find((t) => t[0] === '1')).toBe(`1${Buffer.from('b64\n').toString('base64')}`);
    const old = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sh', '-c', 'echo v2; exit 2'], stdout: true })).url!;
    const { client, protocol } = await SpdyTestClient.connect(old, ['v2.channel.k8s.io'], streamHostPort);
    expect(protocol).toBe('v2.channel.k8s.io');
    const error = await client.open({ streamtype: 'error', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    await client.until(() => error.fin);
    client.close();
    expect(stdout.data.toString()).toBe('v2\n');
    expect(error.data.toString()).toMatch(/non-zero exit code.*2/);
  });

  it('refuses to exec or attach in a container that is not running', async () => {
    const config = { metadata: { name: 'stopped', namespace: 'test', uid: 'stopped-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs2'), linux: {} };
    const pod = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const c = (await f.skiff.runtime.CreateContainer({ podSandboxId: pod, config: { metadata: { name: 'done' }, image: { image: f.image }, command: ['true'], linux: {} }, sandboxConfig: config })).containerId!;
    expect((await codeOf(f.skiff.runtime.Exec({ containerId: c, cmd: ['true'], stdout: true }))).code).toBe(grpc.status.FAILED_PRECONDITION);
    expect((await codeOf(f.skiff.runtime.Attach({ containerId: c, stdout: true }))).code).toBe(grpc.status.FAILED_PRECONDITION);
    await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod });
    expect((await codeOf(f.skiff.runtime.PortForward({ podSandboxId: pod, port: [80] }))).code).toBe(grpc.status.NOT_FOUND);
  });
});
