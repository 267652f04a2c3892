/**
 * One probe run of each kind against real servers on 127.0.0.1 (HTTP and
 * HTTPS, a TCP listener, a grpc-js health server) and a CRI double for
 * exec: results, the kubelet's messages, the timeout bound, and that no
 * socket outlives a probe.
 */
import * as grpc from '@grpc/grpc-js';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Container, Probe } from 'kubernetes-types/core/v1.js';
import { loadHealth } from '../../src/kubelet-lite/health-proto.js';
import type { ProbeTarget } from '../../src/kubelet-lite/model.js';
import { createProbeRunner, expandCommand, grpcProbe, KUBE_VERSION, PROBE_OUTPUT_LIMIT } from '../../src/kubelet-lite/probes.js';
import { runHook } from '../../src/kubelet-lite/hooks.js';
import { execDouble } from '../helpers/cri-double.js';

const defaults = { timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3 };
const container: Container = { name: 'app', ports: [{ name: 'web', containerPort: 0 }, { name: 'health', containerPort: 0 }] };

function target(extra: Partial<ProbeTarget> = {}): ProbeTarget {
  return { containerId: 'c1', podIP: '127.0.0.1', container, pod: { name: 'p', namespace: 'ns', uid: 'u1' }, ...extra };
}

function listen(server: net.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as net.AddressInfo).port)));
}

function close(server: net.Server): Promise<void> {
  return new Promise((resolve) => server.close(() => resolve()));
}

/** Accepts connections and never says a word (but sees the client hang up); `destroy` cuts what is left. */
function silentServer(): net.Server & { destroyAll(): void } {
  const socks = new Set<net.Socket>();
  const s = net.createServer((sock) => {
    socks.add(sock);
    sock.on('error', () => undefined);
    sock.on('close', () => socks.delete(sock));
    sock.resume();
  });
  return Object.assign(s, { destroyAll: () => socks.forEach((x) => x.destroy()) });
}

/** Every connection a server accepted is closed again, within `ms`. */
async function noOpenConnections(server: net.Server, ms = 2000): Promise<number> {
  const end = Date.now() + ms;
  for (;;) {
    const n = await new Promise<number>((resolve) => server.getConnections((_e, c) => resolve(c)));
    if (n === 0 || Date.now() > end) return n;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Time a promise. */
async function timed<T>(p: Promise<T>): Promise<{ value: T; ms: number }> {
  const t0 = Date.now();
  const value = await p;
  return { value, ms: Date.now() - t0 };
}

describe('exec probes through CRI ExecSync', () => {
  it('exit 0 is success; non-zero is failure carrying the output; the runtime gets the probe timeout', async () => {
    const cri = execDouble((req) => (req.cmd![0] === 'ok' ? { exitCode: 0, stdout: 'fine\n' } : { exitCode: 3, stdout: 'out ', stderr: 'broken' }));
    const runner = createProbeRunner({ cri });
    expect(await runner.probe({ ...defaults, exec: { command: ['ok'] } }, target())).toEqual({ result: 'success', message: 'fine\n' });
    expect(await runner.probe({ ...defaults, timeoutSeconds: 4, exec: { command: ['bad'] } }, target())).toEqual({ result: 'failure', message: 'out broken' });
    expect(cri.calls[1]!.req).toEqual({ containerId: 'c1', cmd: ['bad'], timeout: 4 });
    // The gRPC deadline leaves the runtime time to answer "timed out" itself.
    expect(cri.calls[1]!.timeoutMs).toBeGreaterThan(4000);
  });

  it('keeps only 10 KiB of a probe command output', async () => {
    const cri = execDouble(() => ({ exitCode: 1, stdout: Buffer.alloc(1 << 20, 'x') }));
    const o = await createProbeRunner({ cri }).probe({ ...defaults, exec: { command: ['spam'] } }, target());
    expect(o.result).toBe('failure');
    expect(o.message.length).toBe(PROBE_OUTPUT_LIMIT);
  });

  it('DEADLINE_EXCEEDED (skiff, containerd) and exit -1 "command timed out" (CRI-O) are a timed-out failure', async () => {
    const skiffish = execDouble(() => ({ code: grpc.status.DEADLINE_EXCEEDED, details: 'exec timed out' }));
    expect(await createProbeRunner({ cri: skiffish }).probe({ ...defaults, exec: { command: ['sleep', '9'] } }, target())).toEqual({
      result: 'failure',
      message: 'command "sleep 9" timed out',
    });
    const crio = execDouble(() => ({ exitCode: -1, stderr: 'command timed out' }));
    expect((await createProbeRunner({ cri: crio }).probe({ ...defaults, exec: { command: ['sleep', '9'] } }, target())).message).toBe(
      'command "sleep 9" timed out',
    );
  });

  it('a runtime that never answers cannot hold the probe past its timeout (+ grace)', async () => {
    const cri = execDouble(() => ({ hang: true }));
    const { value, ms } = await timed(createProbeRunner({ cri, execGraceMs: 200 }).probe({ ...defaults, exec: { command: ['x'] } }, target()));
    expect(value).toEqual({ result: 'failure', message: 'command "x" timed out' });
    expect(ms).toBeGreaterThanOrEqual(1000);
    expect(ms).toBeLessThan(2500);
  });

  it('a container that is gone, or any other runtime error, is unknown (the kubelet throws the result away)', async () => {
    const gone = execDouble(() => ({ code: grpc.status.NOT_FOUND, details: 'container "c1" not found' }));
    const o = await createProbeRunner({ cri: gone }).probe({ ...defaults, exec: { command: ['x'] } }, target());
    expect(o.result).toBe('unknown');
    expect(o.message).toContain('not found');
    const broken = execDouble(() => ({ code: grpc.status.UNAVAILABLE, details: 'connection refused' }));
    expect((await createProbeRunner({ cri: broken }).probe({ ...defaults, exec: { command: ['x'] } }, target())).result).toBe('unknown');
  });

  it('expands $(VAR) from literal env values only', async () => {
    const env = [{ name: 'FILE', value: '/tmp/ok' }, { name: 'SECRET', valueFrom: { secretKeyRef: { name: 's', key: 'k' } } }];
    expect(expandCommand(['test', '-f', '$(FILE)', '$(SECRET)', '$$(FILE)', '$(NOPE', 'a$b'], env)).toEqual([
      'test', '-f', '/tmp/ok', '$(SECRET)', '$(FILE)', '$(NOPE', 'a$b',
    ]);
    const cri = execDouble(() => ({ exitCode: 0 }));
    await createProbeRunner({ cri }).probe({ ...defaults, exec: { command: ['test', '-f', '$(FILE)'] } }, target({ container: { name: 'app', env } }));
    expect(cri.calls[0]!.req.cmd).toEqual(['test', '-f', '/tmp/ok']);
  });

  it('a cancelled probe ends at once as unknown', async () => {
    const cri = execDouble(() => ({ hang: true }));
    const ac = new AbortController();
    const p = timed(createProbeRunner({ cri }).probe({ ...defaults, timeoutSeconds: 30, exec: { command: ['x'] } }, target(), ac.signal));
    setTimeout(() => ac.abort(), 50);
    const { value, ms } = await p;
    expect(value.result).toBe('unknown');
    expect(ms).toBeLessThan(1000);
  });
});

describe('httpGet probes against a real HTTP server', () => {
  let server: http.Server;
  let port: number;
  let seen: http.IncomingHttpHeaders[] = [];
  let hang: ReturnType<typeof silentServer>;
  let hangPort: number;
  let tls: https.Server | undefined;
  let tlsPort = 0;
  let tmp: string;

  beforeAll(async () => {
    server = http.createServer((req, res) => {
      seen.push(req.headers);
      const u = new URL(req.url!, 'http://x');
      switch (u.pathname) {
        case '/ok':
          return res.end('healthy');
        case '/':
          return res.end('root');
        case '/fail':
          res.statusCode = 500;
          return res.end('secret stack trace');
        case '/same':
          res.writeHead(302, { location: '/ok' });
          return res.end();
        case '/loop':
          res.writeHead(301, { location: '/loop' });
          return res.end();
        case '/away':
          res.writeHead(302, { location: `http://localhost:${port}/ok` });
          return res.end('moved');
        case '/to-fail':
          res.writeHead(307, { location: `/fail` });
          return res.end();
        case '/slow':
          setTimeout(() => res.end('late'), 3000).unref();
          return;
        case '/endless': {
          res.writeHead(200);
          const chunk = Buffer.alloc(64 << 10, 'y');
          const pump = () => {
            while (!res.destroyed && res.write(chunk));
            if (!res.destroyed) res.once('drain', pump);
          };
          return pump();
        }
        case '/stall-body':
          res.writeHead(200);
          return res.write('partial');
        case '/headers':
          return res.end(JSON.stringify(req.headers));
        case '/query':
          return res.end(u.search);
      }
      res.statusCode = 404;
      res.end();
    });
    port = await listen(server);
    container.ports![0]!.containerPort = port;
    hang = silentServer();
    hangPort = await listen(hang);
    container.ports![1]!.containerPort = hangPort;
    tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'kl-probes-'));
    const gen = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-subj', '/CN=probe-test', '-days', '1',
      '-keyout', path.join(tmp, 'key.pem'), '-out', path.join(tmp, 'cert.pem')]);
    if (gen.status === 0) {
      tls = https.createServer({ key: await fs.readFile(path.join(tmp, 'key.pem')), cert: await fs.readFile(path.join(tmp, 'cert.pem')) }, (req, res) => {
        res.statusCode = req.url === '/ok' ? 200 : 503;
        res.end();
      });
      tlsPort = await listen(tls);
    }
  });

  afterAll(async () => {
    server.closeAllConnections();
    await close(server);
    hang.destroyAll();
    await close(hang);
    if (tls) await close(tls);
    await fs.rm(tmp, { recursive: true, force: true });
  });

  const runner = createProbeRunner({ cri: execDouble(() => ({})) });
  const get = (httpGet: Probe['httpGet'], extra: Partial<Probe> = {}, t = target()) => runner.probe({ ...defaults, ...extra, httpGet }, t);

  it('2xx is success, 5xx failure with the status (never the body) in the message', async () => {
    expect(await get({ port, path: '/ok', scheme: 'HTTP' })).toEqual({ result: 'success', message: 'healthy' });
    expect(await get({ port, path: '/fail', scheme: 'HTTP' })).toEqual({ result: 'failure', message: 'HTTP probe failed with statuscode: 500' });
    expect(await get({ port, path: '/nope', scheme: 'HTTP' })).toEqual({ result: 'failure', message: 'HTTP probe failed with statuscode: 404' });
  });

  it('sends kube-probe User-Agent, Accept */* and the pod headers to pod IP:port; Host from the headers', async () => {
    seen = [];
    const o = await get({ port: 'web', path: '/headers?x=1', scheme: 'HTTP', httpHeaders: [{ name: 'X-Custom', value: 'v' }, { name: 'Host', value: 'example.test' }] });
    expect(o.result).toBe('success');
    const h = seen[0]!;
    expect(h['user-agent']).toBe(`kube-probe/${KUBE_VERSION}`);
    expect(h.accept).toBe('*/*');
    expect(h['x-custom']).toBe('v');
    expect(h.host).toBe('example.test');
    expect(await get({ port, path: '/query?a=b', scheme: 'HTTP' })).toEqual({ result: 'success', message: '?a=b' });
    // A User-Agent of the pod's own replaces the default.
    seen = [];
    await get({ port, path: '/ok', httpHeaders: [{ name: 'user-agent', value: 'mine' }] });
    expect(seen[0]!['user-agent']).toBe('mine');
  });

  it('resolves named ports from the container and fails (unknown) on a name it does not have', async () => {
    expect((await get({ port: 'web', path: '/ok' })).result).toBe('success');
    expect(await get({ port: 'nope', path: '/ok' })).toEqual({ result: 'unknown', message: 'port nope not found' });
    expect((await get({ port: String(port), path: '/ok' })).result).toBe('success');
  });

  it('follows redirects on the same host, stops after 10, and passes a redirect to another host with a warning', async () => {
    expect(await get({ port, path: '/same' })).toEqual({ result: 'success', message: 'healthy' });
    expect(await get({ port, path: '/to-fail' })).toEqual({ result: 'failure', message: 'HTTP probe failed with statuscode: 500' });
    const loop = await get({ port, path: '/loop' });
    expect(loop.result).toBe('failure');
    expect(loop.message).toBe(`Get "http://127.0.0.1:${port}/loop": stopped after 10 redirects`);
    seen = [];
    const away = await get({ port, path: '/away' });
    expect(away).toEqual({ result: 'success', message: 'Probe terminated redirects, Response body: moved', warning: true });
    // localhost was never asked.
    expect(seen).toHaveLength(1);
  });

  it('a slow server is a timeout failure within the probe timeout', async () => {
    const { value, ms } = await timed(get({ port, path: '/slow' }));
    expect(value.result).toBe('failure');
    expect(value.message).toBe(`Get "http://127.0.0.1:${port}/slow": context deadline exceeded (Client.Timeout exceeded while awaiting headers)`);
    expect(ms).toBeGreaterThanOrEqual(990);
    expect(ms).toBeLessThan(2500);
  });

  it('a server that accepts and never answers is a timeout failure, and the connection is closed', async () => {
    const { value, ms } = await timed(get({ port: 'health', path: '/' }));
    expect(value.result).toBe('failure');
    expect(value.message).toContain('Client.Timeout exceeded while awaiting headers');
    expect(ms).toBeLessThan(2500);
    expect(await noOpenConnections(hang)).toBe(0);
  });

  it('a body that stalls is bounded by the same timeout', async () => {
    const { value, ms } = await timed(get({ port, path: '/stall-body' }));
    expect(value.result).toBe('failure');
    expect(value.message).toContain('while reading body');
    expect(ms).toBeLessThan(2500);
  });

  it('reads at most 10 KiB of an endless body and hangs up', async () => {
    const { value, ms } = await timed(get({ port, path: '/endless' }, { timeoutSeconds: 5 }));
    expect(value.result).toBe('success');
    expect(value.message.length).toBe(PROBE_OUTPUT_LIMIT);
    expect(ms).toBeLessThan(2000);
    expect(await noOpenConnections(server)).toBe(0);
  });

  it('a closed port fails with connection refused', async () => {
    const s = net.createServer();
    const closed = await listen(s);
    await close(s);
    expect(await get({ port: closed, path: '/' })).toEqual({
      result: 'failure',
      message: `Get "http://127.0.0.1:${closed}/": dial tcp 127.0.0.1:${closed}: connect: connection refused`,
    });
  });

  it('HTTPS skips certificate verification', async (ctx) => {
    if (!tls) return ctx.skip();
    expect((await get({ port: tlsPort, path: '/ok', scheme: 'HTTPS' })).result).toBe('success');
    expect(await get({ port: tlsPort, path: '/down', scheme: 'HTTPS' })).toEqual({ result: 'failure', message: 'HTTP probe failed with statuscode: 503' });
  });

  it('leaves no connections open after many probes', async () => {
    await Promise.all(Array.from({ length: 20 }, (_, i) => get({ port, path: i % 2 ? '/ok' : '/fail' })));
    expect(await noOpenConnections(server)).toBe(0);
  });

  it('httpGet hooks: 2xx/3xx ok, anything else fails with the kubelet message', async () => {
    const cri = execDouble(() => ({}));
    expect(await runHook({ httpGet: { port, path: '/ok' } }, target(), cri, 2000)).toEqual({ ok: true, message: '' });
    const bad = await runHook({ httpGet: { port, path: '/fail' } }, target(), cri, 2000);
    expect(bad).toEqual({
      ok: false,
      message: 'HTTP lifecycle hook (/fail) for Container "app" in Pod "p_ns(u1)" failed - error: HTTP lifecycle hook failed with statuscode: 500',
    });
    seen = [];
    await runHook({ httpGet: { port, path: '/headers' } }, target(), cri, 2000);
    expect(seen[0]!['user-agent']).toBe(`kube-lifecycle/${KUBE_VERSION}`);
    const { value, ms } = await timed(runHook({ httpGet: { port: 'health', path: '/' } }, target(), cri, 500));
    expect(value.ok).toBe(false);
    expect(value.message).toContain('Client.Timeout exceeded');
    expect(ms).toBeLessThan(2000);
  });
});

describe('tcpSocket probes', () => {
  it('a listener is success, a closed port failure, and each probe closes its connection', async () => {
    const s = net.createServer((sock) => sock.on('error', () => undefined));
    const port = await listen(s);
    const runner = createProbeRunner({ cri: execDouble(() => ({})) });
    for (let i = 0; i < 5; i++) expect(await runner.probe({ ...defaults, tcpSocket: { port } }, target())).toEqual({ result: 'success', message: '' });
    expect(await noOpenConnections(s)).toBe(0);
    await close(s);
    expect(await runner.probe({ ...defaults, tcpSocket: { port } }, target())).toEqual({
      result: 'failure',
      message: `dial tcp 127.0.0.1:${port}: connect: connection refused`,
    });
  });
});

describe('grpc probes against a grpc-js health server', () => {
  let server: grpc.Server;
  let port: number;
  let bare: grpc.Server;
  let barePort: number;
  let silent: ReturnType<typeof silentServer>;
  let silentPort: number;
  const agents: string[] = [];

  const statusFor: Record<string, string | number> = { '': 'SERVING', down: 'NOT_SERVING', unknown: 'UNKNOWN', 'svc-unknown': 'SERVICE_UNKNOWN', odd: 7 };

  function bind(s: grpc.Server): Promise<number> {
    return new Promise((resolve, reject) => s.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (e, p) => (e ? reject(e) : resolve(p))));
  }

  beforeAll(async () => {
    const { Health } = loadHealth();
    server = new grpc.Server();
    server.addService(Health.service, {
      Check: (call: grpc.ServerUnaryCall<{ service: string }, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        agents.push(String(call.metadata.get('user-agent')[0]));
        const svc = call.request.service;
        if (svc === 'hang') return;
        if (svc === 'missing') return cb({ code: grpc.status.NOT_FOUND, details: 'unknown service' });
        cb(null, { status: statusFor[svc] });
      },
    });
    port = await bind(server);
    // Serves gRPC, but not the health service.
    bare = new grpc.Server();
    barePort = await bind(bare);
    silent = silentServer();
    silentPort = await listen(silent);
  });

  afterAll(async () => {
    server.forceShutdown();
    bare.forceShutdown();
    silent.destroyAll();
    await close(silent);
  });

  const runner = createProbeRunner({ cri: execDouble(() => ({})) });
  const check = (p: number, service?: string) => runner.probe({ ...defaults, grpc: { port: p, service } }, target());

  it('SERVING is success; every other status a failure naming it', async () => {
    expect(await check(port)).toEqual({ result: 'success', message: 'service healthy' });
    expect(agents[0]).toMatch(new RegExp(`^kube-probe/${KUBE_VERSION}`));
    expect(await check(port, 'down')).toEqual({ result: 'failure', message: 'service unhealthy (responded with "NOT_SERVING")' });
    expect(await check(port, 'unknown')).toEqual({ result: 'failure', message: 'service unhealthy (responded with "UNKNOWN")' });
    expect(await check(port, 'svc-unknown')).toEqual({ result: 'failure', message: 'service unhealthy (responded with "SERVICE_UNKNOWN")' });
    expect(await check(port, 'odd')).toEqual({ result: 'failure', message: 'service unhealthy (responded with "7")' });
  });

  it('errors are failures with the kubelet messages', async () => {
    expect(await check(port, 'missing')).toEqual({ result: 'failure', message: 'error: health rpc probe failed: rpc error: code = NotFound desc = unknown service' });
    const unimpl = await check(barePort);
    expect(unimpl.result).toBe('failure');
    expect(unimpl.message).toMatch(/^error: this server does not implement the grpc health protocol \(grpc\.health\.v1\.Health\)/);
    const s = net.createServer();
    const closed = await listen(s);
    await close(s);
    const refused = await check(closed);
    expect(refused.result).toBe('failure');
    expect(refused.message).toMatch(/^error: health rpc probe failed: rpc error: code = Unavailable desc = /);
  });

  it('a server that never answers is a timeout failure within the timeout', async () => {
    for (const [p, svc] of [[port, 'hang'], [silentPort, '']] as const) {
      const { value, ms } = await timed(check(p, svc));
      expect(value).toEqual({ result: 'failure', message: 'timeout: health rpc did not complete within 1s' });
      expect(ms).toBeLessThan(2500);
    }
    expect(await noOpenConnections(silent)).toBe(0);
  });
});

describe('grpc probes against hostile HTTP/2 servers', () => {
  it('an endless answer is cut at 64 KiB, and a non-gRPC answer is a failure; the connection is closed either way', async () => {
    const sessions = new Set<http2.ServerHttp2Session>();
    const server = http2.createServer();
    server.on('session', (s) => {
      sessions.add(s);
      s.on('close', () => sessions.delete(s));
    });
    server.on('stream', (stream, headers) => {
      stream.on('error', () => undefined);
      if (headers[':path'] !== '/grpc.health.v1.Health/Check') {
        stream.respond({ ':status': 404 });
        return stream.end();
      }
      if (headers['user-agent'] === 'html') {
        stream.respond({ ':status': 200, 'content-type': 'text/html' });
        return stream.end('<html>');
      }
      stream.respond({ ':status': 200, 'content-type': 'application/grpc' });
      const chunk = Buffer.alloc(16 << 10, 1);
      const pump = () => {
        while (!stream.destroyed && stream.write(chunk));
        if (!stream.destroyed) stream.once('drain', pump);
      };
      pump();
    });
    const port = await listen(server);
    try {
      const { value, ms } = await timed(grpcProbe('127.0.0.1', port, '', 'kube-probe/test', 5000));
      expect(value.result).toBe('failure');
      expect(value.message).toBe('error: health rpc probe failed: rpc error: code = ResourceExhausted desc = answer larger than 65536 bytes');
      expect(ms).toBeLessThan(2000);
      const html = await grpcProbe('127.0.0.1', port, '', 'html', 5000);
      expect(html.result).toBe('failure');
      expect(html.message).toContain('unexpected content-type "text/html"');
      const end = Date.now() + 2000;
      while (sessions.size > 0 && Date.now() < end) await new Promise((r) => setTimeout(r, 20));
      expect(sessions.size).toBe(0);
    } finally {
      for (const s of sessions) s.destroy();
      await close(server);
    }
  });
});

describe('probes over IPv6 loopback', () => {
  it('httpGet and tcpSocket reach [::1]', async (ctx) => {
    const server = http.createServer((_req, res) => res.end('v6'));
    const ok = await new Promise<boolean>((resolve) => {
      server.once('error', () => resolve(false));
      server.listen(0, '::1', () => resolve(true));
    });
    if (!ok) return ctx.skip();
    const port = (server.address() as net.AddressInfo).port;
    try {
      const runner = createProbeRunner({ cri: execDouble(() => ({})) });
      expect(await runner.probe({ ...defaults, httpGet: { port, path: '/' } }, target({ podIP: '::1' }))).toEqual({ result: 'success', message: 'v6' });
      expect(await runner.probe({ ...defaults, tcpSocket: { port } }, target({ podIP: '::1' }))).toEqual({ result: 'success', message: '' });
    } finally {
      server.closeAllConnections();
      await close(server);
    }
  });
});

describe('exec and sleep hooks', () => {
  it('exec: exit 0 ok; non-zero fails with the kubelet message', async () => {
    const cri = execDouble((req) => (req.cmd![0] === 'ok' ? { exitCode: 0 } : { exitCode: 2, stdout: 'o', stderr: 'e' }));
    expect(await runHook({ exec: { command: ['ok'] } }, target(), cri, 5000)).toEqual({ ok: true, message: '' });
    expect(await runHook({ exec: { command: ['sh', '-c', 'exit 2'] } }, target(), cri, 5000)).toEqual({
      ok: false,
      message: `Exec lifecycle hook ([sh -c exit 2]) for Container "app" in Pod "p_ns(u1)" failed - error: command 'sh -c exit 2' exited with 2: oe, message: "oe"`,
    });
  });

  it('exec: a hook that cannot finish is a failure within its timeout, however the runtime behaves', async () => {
    for (const a of [{ hang: true }, { code: grpc.status.DEADLINE_EXCEEDED }, { delayMs: 5000, exitCode: 0 }]) {
      const cri = execDouble(() => a);
      const { value, ms } = await timed(runHook({ exec: { command: ['sleep', '100'] } }, target(), cri, 800));
      expect(value.ok).toBe(false);
      expect(value.message).toContain('failed - error: ');
      expect(ms).toBeLessThan(2500);
    }
  });

  it('sleep: ok after the time; cut short by the signal or the timeout', async () => {
    const cri = execDouble(() => ({}));
    const done = await timed(runHook({ sleep: { seconds: 1 } }, target(), cri, 5000));
    expect(done.value).toEqual({ ok: true, message: '' });
    expect(done.ms).toBeGreaterThanOrEqual(990);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    const cut = await timed(runHook({ sleep: { seconds: 30 } }, target(), cri, 60_000, ac.signal));
    expect(cut.value).toEqual({
      ok: false,
      message: 'Sleep lifecycle hook (30) for Container "app" in Pod "p_ns(u1)" failed - error: container terminated before sleep hook finished',
    });
    expect(cut.ms).toBeLessThan(1000);
    expect((await timed(runHook({ sleep: { seconds: 30 } }, target(), cri, 100))).value.ok).toBe(false);
  });

  it('a handler with nothing runnable fails, never throws', async () => {
    const o = await runHook({ tcpSocket: { port: 80 } }, target(), execDouble(() => ({})), 1000);
    expect(o.ok).toBe(false);
    expect(o.message).toMatch(/^Cannot run handler: invalid handler/);
  });
});
