import fs from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import { EventRecorder } from '../../src/kubelet-lite/events.js';
import { AgentMetrics } from '../../src/kubelet-lite/metrics.js';
import { SummaryBuilder } from '../../src/kubelet-lite/stats-summary.js';
import { createLogger } from '../../src/log.js';
import { StatusServer, parseAddress, type StatusServerOptions } from '../../src/kubelet-lite/status-server.js';
import { FakeAgentView, testPod } from '../helpers/fake-agent-view.js';
import { mknod, S_IFIFO } from '../../src/sys/libc.js';

async function waitUntil(what: string, fn: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await fn())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A GET whose body is read as it comes; `lines` fills as newline-terminated text arrives. */
function stream(url: string) {
  const s = { status: 0, text: '', ended: false, req: undefined as unknown as http.ClientRequest, lines: () => s.text.split('\n').filter(Boolean) };
  const done = new Promise<void>((resolve, reject) => {
    s.req = http.get(url, (res) => {
      s.status = res.statusCode ?? 0;
      res.setEncoding('utf8');
      res.on('data', (d: string) => (s.text += d));
      res.on('end', () => ((s.ended = true), resolve()));
      res.on('error', () => ((s.ended = true), resolve()));
    });
    s.req.on('error', reject);
  });
  return Object.assign(s, { done });
}

function criLine(stream: 'stdout' | 'stderr', tag: 'P' | 'F', text: string): string {
  return `2026-11-30T06:00:00.000000001Z ${stream} ${tag} ${text}\n`;
}

describe('parseAddress', () => {
  it('takes host:port, [v6]:port and :port, and refuses the rest', () => {
    expect(parseAddress('127.0.0.1:10255')).toEqual({ host: '127.0.0.1', port: 10255 });
    expect(parseAddress('[::1]:0')).toEqual({ host: '::1', port: 0 });
    expect(parseAddress(':8080')).toEqual({ host: '127.0.0.1', port: 8080 });
    for (const bad of ['127.0.0.1', '1.2.3.4:99999', 'host:port', '::1:80']) expect(() => parseAddress(bad)).toThrow(/host:port/);
  });
});

describe('status API', () => {
  let view: FakeAgentView;
  let server: StatusServer;
  let dir: string;
  const servers: StatusServer[] = [];
  const sockets: net.Socket[] = [];

  async function start(opts: Partial<StatusServerOptions> = {}): Promise<StatusServer> {
    const s = await StatusServer.listen({ address: '127.0.0.1:0', view, logPollMs: 50, logGoneGraceMs: 500, ...opts });
    servers.push(s);
    return s;
  }

  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'status-api-'));
    view = new FakeAgentView();
    view.set(testPod('default', 'web'));
    view.set(testPod('kube-system', 'dns'));
    server = await start();
  });

  afterEach(async () => {
    for (const s of sockets.splice(0)) s.destroy();
    for (const s of servers.splice(0)) await s.close();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('serves /healthz, the pod list, one pod, and a v1 Status 404 for a missing pod or path', async () => {
    const h = await fetch(`${server.url}/healthz`);
    expect(h.status).toBe(200);
    expect(await h.text()).toBe('ok');

    const list = (await (await fetch(`${server.url}/pods`)).json()) as { kind: string; apiVersion: string; metadata: object; items: { metadata: { name: string } }[] };
    expect(list.kind).toBe('PodList');
    expect(list.apiVersion).toBe('v1');
    expect(list.metadata).toEqual({});
    expect(list.items.map((p) => p.metadata.name).sort()).toEqual(['dns', 'web']);

    const ns = (await (await fetch(`${server.url}/pods/kube-system`)).json()) as { items: { metadata: { name: string } }[] };
    expect(ns.items.map((p) => p.metadata.name)).toEqual(['dns']);

    const one = await fetch(`${server.url}/pods/default/web`);
    expect(one.status).toBe(200);
    expect(((await one.json()) as { kind: string; metadata: { uid: string } }).metadata.uid).toBe('uid-default-web');

    const missing = await fetch(`${server.url}/pods/default/nope`);
    expect(missing.status).toBe(404);
    expect(await missing.json()).toMatchObject({ kind: 'Status', apiVersion: 'v1', status: 'Failure', reason: 'NotFound', code: 404, message: 'pods "nope" not found in namespace "default"' });

    for (const p of ['/nothing', '/pods/a/b/c', '/stats', '/healthz/x', '/metrics', '/stats/summary']) {
      const r = await fetch(`${server.url}${p}`);
      expect(r.status, p).toBe(404);
      expect(((await r.json()) as { kind: string }).kind).toBe('Status');
    }
  });

  it('is read-only: every method but GET and HEAD gets 405, and HEAD gets no body', async () => {
    for (const method of ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS']) {
      const r = await fetch(`${server.url}/pods`, { method });
      expect(r.status, method).toBe(405);
      expect(r.headers.get('allow')).toBe('GET, HEAD');
      expect(await r.json()).toMatchObject({ kind: 'Status', code: 405 });
    }
    const head = await fetch(`${server.url}/pods`, { method: 'HEAD' });
    expect(head.status).toBe(200);
    expect(Number(head.headers.get('content-length'))).toBeGreaterThan(0);
    expect(await head.text()).toBe('');
    expect(view.byKey.size).toBe(2);
  });

  it('serves events, manifest problems, metrics and the stats summary', async () => {
    const rec = new EventRecorder({ node: 'node-a' });
    rec.record({ namespace: 'default', name: 'web', uid: 'uid-default-web' }, 'Normal', 'Pulled', 'Container image "busybox" already present on machine', 'main');
    view.eventList = rec.list();
    view.problemList = [{ file: '/etc/kubelet.d/bad.yaml', line: 3, reason: 'spec.containers: Required value' }];
    const metrics = new AgentMetrics();
    metrics.setRunning(2, { running: 3 });
    metrics.observePodStart(1.5);
    await fs.mkdir(path.join(dir, 'proc'));
    await fs.writeFile(path.join(dir, 'proc/stat'), 'cpu  100 0 50 1000 0 0 0 0 0 0\ncpu0 100 0 50 1000 0 0 0 0 0 0\n');
    await fs.writeFile(path.join(dir, 'proc/meminfo'), 'MemTotal:       1000 kB\nMemFree:         200 kB\nMemAvailable:    500 kB\nInactive(file):  100 kB\n');
    const u = (value: number) => ({ value });
    const cri = {
      runtime: {
        ListPodSandbox: async () => ({ items: [{ id: 'sb1' }] }),
        ListPodSandboxStats: async () => ({
          stats: [
            {
              attributes: { id: 'sb1', metadata: { name: 'web', namespace: 'default', uid: 'uid-default-web', attempt: 0 } },
              linux: {
                cpu: { timestamp: 1_800_000_000_000_000_000, usageCoreNanoSeconds: u(5000), usageNanoCores: u(7) },
                memory: { timestamp: 1_800_000_000_000_000_000, workingSetBytes: u(4096), usageBytes: u(8192) },
                containers: [{ attributes: { metadata: { name: 'main' } }, cpu: { timestamp: 1, usageCoreNanoSeconds: u(4000) }, memory: { timestamp: 1, workingSetBytes: u(2048) } }],
              },
            },
            // A sandbox that is not ready, and one of a pod the agent does not know: neither is reported.
            { attributes: { id: 'old', metadata: { name: 'web', namespace: 'default', uid: 'uid-default-web', attempt: 0 } }, linux: {} },
            { attributes: { id: 'sb1x', metadata: { name: 'stranger', namespace: 'default', uid: 'x', attempt: 0 } }, linux: {} },
          ],
        }),
      },
    } as unknown as CriEndpoint;
    const summary = new SummaryBuilder({ nodeName: 'node-a', cri, pods: () => view.pods(), procRoot: path.join(dir, 'proc'), firstSampleGapMs: 1 });
    const s = await start({ metrics, summary });

    const events = (await (await fetch(`${s.url}/events`)).json()) as { kind: string; items: { reason: string; involvedObject: { fieldPath: string } }[] };
    expect(events.kind).toBe('EventList');
    expect(events.items).toHaveLength(1);
    expect(events.items[0]).toMatchObject({ reason: 'Pulled', involvedObject: { fieldPath: 'spec.containers{main}' } });
    expect(((await (await fetch(`${s.url}/events/default/web`)).json()) as { items: unknown[] }).items).toHaveLength(1);
    expect(((await (await fetch(`${s.url}/events/default/other`)).json()) as { items: unknown[] }).items).toHaveLength(0);

    expect(await (await fetch(`${s.url}/manifests`)).json()).toMatchObject({ items: [{ file: '/etc/kubelet.d/bad.yaml', line: 3, reason: 'spec.containers: Required value' }] });

    const m = await fetch(`${s.url}/metrics`);
    expect(m.headers.get('content-type')).toMatch(/^text\/plain/);
    const text = await m.text();
    expect(text).toMatch(/^kubelet_running_pods 2$/m);
    expect(text).toMatch(/^kubelet_running_containers\{container_state="running"\} 3$/m);
    expect(text).toMatch(/^kubelet_pod_start_duration_seconds_bucket\{le="2"\} 1$/m);
    expect(text).toMatch(/^kubelet_pod_start_duration_seconds_bucket\{le="1"\} 0$/m);
    expect(text).toMatch(/^process_cpu_user_seconds_total /m);

    const sum = (await (await fetch(`${s.url}/stats/summary`)).json()) as {
      node: { nodeName: string; cpu: { usageCoreNanoSeconds: number }; memory: { workingSetBytes: number; usageBytes: number; availableBytes: number } };
      pods: { podRef: object; cpu: { usageNanoCores: number }; memory: { workingSetBytes: number }; containers: { name: string; cpu: { usageCoreNanoSeconds: number } }[] }[];
    };
    expect(sum.node.nodeName).toBe('node-a');
    expect(sum.node.cpu.usageCoreNanoSeconds).toBe(150 * 10_000_000);
    expect(sum.node.memory).toMatchObject({ usageBytes: 800 * 1024, workingSetBytes: 700 * 1024, availableBytes: 300 * 1024 });
    expect(sum.pods).toHaveLength(1);
    expect(sum.pods[0]).toMatchObject({ podRef: { name: 'web', namespace: 'default', uid: 'uid-default-web' }, cpu: { usageNanoCores: 7 }, memory: { workingSetBytes: 4096 } });
    expect(sum.pods[0]!.containers).toEqual([expect.objectContaining({ name: 'main', cpu: expect.objectContaining({ usageCoreNanoSeconds: 4000 }) })]);
  });

  it('streams a watch as the API server does: the current pods as ADDED, then every change in order', async () => {
    const w = stream(`${server.url}/pods?watch=true`);
    await waitUntil('the initial ADDED events', () => w.lines().length === 2);
    const one = stream(`${server.url}/pods/default/web?watch=1`);
    await waitUntil('the single pod watch', () => one.lines().length === 1);
    const web = view.pod('default', 'web')!;
    view.set({ ...web, status: { phase: 'Succeeded' } });
    view.set(testPod('default', 'new'));
    view.delete('kube-system', 'dns');
    await waitUntil('three changes', () => w.lines().length === 5);
    const events = w.lines().map((l) => JSON.parse(l) as { type: string; object: { kind: string; metadata: { name: string }; status: { phase: string } } });
    expect(events.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual(['ADDED web', 'ADDED dns', 'MODIFIED web', 'ADDED new', 'DELETED dns']);
    expect(events[2]!.object.status.phase).toBe('Succeeded');
    expect(events.every((e) => e.object.kind === 'Pod')).toBe(true);
    await waitUntil('the single pod change', () => one.lines().length === 2);
    expect(one.lines().map((l) => (JSON.parse(l) as { type: string }).type)).toEqual(['ADDED', 'MODIFIED']);
    expect(server.activeStreams).toBe(2);
    w.req.destroy();
    one.req.destroy();
    await waitUntil('the watches to be unsubscribed', () => view.watchers === 0 && server.activeStreams === 0);
  });

  it('serves a container log with partial lines joined, tailLines, previous, and 400/404 for bad requests', async () => {
    const file = path.join(dir, 'main.log');
    await fs.writeFile(
      file,
      criLine('stdout', 'F', 'one') + criLine('stdout', 'P', 'two-') + criLine('stdout', 'P', 'and-') + criLine('stderr', 'F', 'more') + criLine('stdout', 'F', 'three') + '2026-11-30T06:00:00Z stdout P unfinis',
    );
    await fs.writeFile(path.join(dir, 'prev.log'), criLine('stdout', 'F', 'before the restart'));
    view.logs.set('default/web/main', file);
    view.logs.set('default/web/main#previous', path.join(dir, 'prev.log'));
    const get = async (q: string) => {
      const r = await fetch(`${server.url}/containerLogs/default/web/main${q}`);
      return { status: r.status, text: await r.text() };
    };
    expect(await get('')).toEqual({ status: 200, text: 'one\ntwo-and-more\nthree\n' });
    expect(await get('?tailLines=2')).toEqual({ status: 200, text: 'two-and-more\nthree\n' });
    expect(await get('?tailLines=1')).toEqual({ status: 200, text: 'three\n' });
    expect(await get('?tailLines=0')).toEqual({ status: 200, text: '' });
    expect(await get('?tailLines=10')).toEqual({ status: 200, text: 'one\ntwo-and-more\nthree\n' });
    expect((await get('?tailLines=1&timestamps=true')).text).toBe('2026-11-30T06:00:00.000000001Z three\n');
    expect(await get('?previous=true')).toEqual({ status: 200, text: 'before the restart\n' });
    expect((await get('?tailLines=-1')).status).toBe(400);
    expect((await get('?follow=maybe')).status).toBe(400);
    expect((await fetch(`${server.url}/containerLogs/default/web/sidecar`)).status).toBe(400);
    expect((await fetch(`${server.url}/containerLogs/default/ghost/main`)).status).toBe(404);
    expect((await fetch(`${server.url}/containerLogs/kube-system/dns/main`)).status).toBe(404);
    await fs.rm(path.join(dir, 'prev.log'));
    expect((await get('?previous=true')).status).toBe(404);
  });

  it('refuses a log that is a symlink, a FIFO or a hard link, at once and without serving what it reaches', async () => {
    const secret = path.join(dir, 'secret');
    await fs.writeFile(secret, criLine('stdout', 'F', 'the-secret'));
    const get = async () => {
      const r = await fetch(`${server.url}/containerLogs/default/web/main?follow=true`, { signal: AbortSignal.timeout(5_000) });
      return { status: r.status, text: await r.text() };
    };
    await fs.mkdir(path.join(dir, 'c'));
    view.logs.set('default/web/main', path.join(dir, 'c', '0.log'));
    await fs.symlink(secret, path.join(dir, 'c', '0.log'));
    let r = await get();
    expect(r.status).toBe(403);
    expect(r.text).not.toContain('the-secret');
    expect(JSON.parse(r.text)).toMatchObject({ kind: 'Status', reason: 'Forbidden' });
    await fs.rm(path.join(dir, 'c', '0.log'));
    mknod(path.join(dir, 'c', '0.log'), S_IFIFO | 0o600);
    expect((await get()).status).toBe(403);
    await fs.rm(path.join(dir, 'c', '0.log'));
    await fs.link(secret, path.join(dir, 'c', '0.log'));
    r = await get();
    expect(r.status).toBe(403);
    expect(r.text).not.toContain('the-secret');
    // A symlinked directory on the way is refused as well.
    await fs.rm(path.join(dir, 'c'), { recursive: true });
    await fs.mkdir(path.join(dir, 'elsewhere'));
    await fs.writeFile(path.join(dir, 'elsewhere', '0.log'), criLine('stdout', 'F', 'the-secret'));
    await fs.symlink(path.join(dir, 'elsewhere'), path.join(dir, 'c'));
    view.logs.set('default/web/main', path.join(dir, 'c', '0.log'));
    // (The fake view's root is the file's own directory: point it one level up so `c` is a component.)
    view.roots.set('default/web/main', dir);
    r = await get();
    expect(r.status).toBe(403);
    expect(r.text).not.toContain('the-secret');
  });

  it('tails across rotated files, oldest first, and serves them all without tailLines', async () => {
    const file = path.join(dir, '0.log');
    await fs.writeFile(`${file}.20261201-100000.000`, criLine('stdout', 'F', 'a') + criLine('stdout', 'F', 'b'));
    await fs.writeFile(`${file}.20261201-100010.000`, criLine('stdout', 'F', 'c'));
    await fs.writeFile(file, criLine('stdout', 'F', 'd') + criLine('stdout', 'F', 'e'));
    view.logs.set('default/web/main', file);
    const get = async (q: string) => (await fetch(`${server.url}/containerLogs/default/web/main${q}`)).text();
    expect(await get('')).toBe('a\nb\nc\nd\ne\n');
    expect(await get('?tailLines=2')).toBe('d\ne\n');
    expect(await get('?tailLines=4')).toBe('b\nc\nd\ne\n');
    expect(await get('?tailLines=100')).toBe('a\nb\nc\nd\ne\n');
  });

  it('tails a huge file by reading only its end', async () => {
    // 64 GiB, sparse: reading it whole would take minutes; the tail must come back at once.
    const file = path.join(dir, 'huge.log');
    const fh = await fs.open(file, 'w');
    await fh.truncate(64 * 1024 ** 3);
    const tail = criLine('stdout', 'F', 'a') + criLine('stdout', 'P', 'b1 ') + criLine('stdout', 'F', 'b2') + criLine('stdout', 'F', 'c');
    await fh.write(tail, 64 * 1024 ** 3);
    await fh.close();
    view.logs.set('default/web/main', file);
    const started = Date.now();
    const r = await fetch(`${server.url}/containerLogs/default/web/main?tailLines=2`);
    expect(await r.text()).toBe('b1 b2\nc\n');
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('follows a log as lines are appended, joins partial lines, and goes on into the file that replaces it', async () => {
    const file = path.join(dir, 'follow.log');
    await fs.writeFile(file, criLine('stdout', 'F', 'first'));
    view.logs.set('default/web/main', file);
    const f = stream(`${server.url}/containerLogs/default/web/main?follow=true`);
    await waitUntil('the first line', () => f.text === 'first\n');
    await fs.appendFile(file, criLine('stdout', 'P', 'half '));
    await waitUntil('the partial line', () => f.text === 'first\nhalf ');
    await fs.appendFile(file, criLine('stdout', 'F', 'whole'));
    await fs.appendFile(file, criLine('stderr', 'F', 'second'));
    await waitUntil('the joined line', () => f.text === 'first\nhalf whole\nsecond\n');
    // A line split across two writes in the middle of its raw text.
    const raw = criLine('stdout', 'F', 'split across writes');
    await fs.appendFile(file, raw.slice(0, 20));
    await new Promise((r) => setTimeout(r, 150));
    await fs.appendFile(file, raw.slice(20));
    await waitUntil('the split line', () => f.text.endsWith('second\nsplit across writes\n'));
    expect(f.ended).toBe(false);
    // Rotation: the old file's last words are sent, then the new file's lines.
    await fs.appendFile(file, criLine('stdout', 'F', 'last words'));
    await fs.rename(file, `${file}.20261201-100000.000`);
    await fs.writeFile(file, criLine('stdout', 'F', 'new file'));
    await waitUntil('the new file', () => f.text.endsWith('last words\nnew file\n'));
    expect(f.text).toBe('first\nhalf whole\nsecond\nsplit across writes\nlast words\nnew file\n');
    // Removed for good (the container is gone): the stream ends once the grace has passed.
    await fs.rm(file);
    await f.done;
    await waitUntil('no streams', () => server.activeStreams === 0);
  });

  it('keeps following a log truncated in place, from its new start', async () => {
    const file = path.join(dir, 'trunc.log');
    await fs.writeFile(file, criLine('stdout', 'F', 'a long first line before truncation'));
    view.logs.set('default/web/main', file);
    const f = stream(`${server.url}/containerLogs/default/web/main?follow=true`);
    await waitUntil('the first line', () => f.text === 'a long first line before truncation\n');
    await fs.truncate(file, 0);
    await new Promise((r) => setTimeout(r, 200));
    await fs.appendFile(file, criLine('stdout', 'F', 'after'));
    await waitUntil('the line after truncation', () => f.text.endsWith('truncation\nafter\n'));
    f.req.destroy();
  });

  it('stops following when the client goes away', async () => {
    const file = path.join(dir, 'follow.log');
    await fs.writeFile(file, criLine('stdout', 'F', 'x'));
    view.logs.set('default/web/main', file);
    const f = stream(`${server.url}/containerLogs/default/web/main?follow=true`);
    await waitUntil('the line', () => f.text === 'x\n');
    expect(server.activeStreams).toBe(1);
    f.req.destroy();
    await waitUntil('the stream to end', () => server.activeStreams === 0);
  });

  it('drops a watch client that stops reading instead of buffering for it', async () => {
    const s = await start({ maxStreamBuffer: 256 * 1024 });
    const sock = net.connect(s.port, '127.0.0.1');
    sockets.push(sock);
    await new Promise((r) => sock.once('connect', r));
    sock.write('GET /pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n');
    // Never read: let the kernel buffers fill.
    sock.pause();
    await waitUntil('the watch', () => s.activeStreams === 1);
    const big = 'x'.repeat(64 * 1024);
    let pushed = 0;
    while (s.activeStreams > 0 && pushed < 2000) {
      view.set(testPod('default', 'web', { metadata: { name: 'web', namespace: 'default', annotations: { big, n: String(pushed) } } }));
      pushed++;
      if (pushed % 20 === 0) await new Promise((r) => setTimeout(r, 10));
    }
    expect(s.activeStreams).toBe(0);
    // The kernel's socket buffers plus the bound: far less than what was offered (2000 × 64 KiB).
    expect(pushed).toBeLessThan(1000);
    await waitUntil('the unsubscribe', () => view.watchers === 0);
    // The server keeps serving others.
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
  });

  it('waits for a log client that stops reading (never buffering the file), then drops it', async () => {
    const s = await start({ stallTimeoutMs: 500 });
    const file = path.join(dir, 'big.log');
    await fs.writeFile(file, criLine('stdout', 'F', 'y'.repeat(1000)).repeat(32 * 1024));
    view.logs.set('default/web/main', file);
    const sock = net.connect(s.port, '127.0.0.1');
    sockets.push(sock);
    sock.on('error', () => undefined);
    await new Promise((r) => sock.once('connect', r));
    sock.write('GET /containerLogs/default/web/main?follow=true HTTP/1.1\r\nHost: x\r\n\r\n');
    sock.pause();
    await waitUntil('the stream', () => s.activeStreams === 1);
    await waitUntil('the stalled client to be dropped', () => s.activeStreams === 0, 10_000);
    expect(s.connections).toBe(0);
  });

  it('shares connections out by peer uid: an unknown owner is never root, and a connect loop costs a line per interval', async () => {
    // Peers from 127.0.0.2 stand for a user whose socket's owner could not be found.
    const lines: string[] = [];
    const s = await start({
      maxConnections: 8,
      maxConnectionsPerUser: 2,
      reservedForRoot: 4,
      peerUid: (sock) => (sock.remoteAddress === '127.0.0.2' ? undefined : 0),
      refusalLogIntervalMs: 60_000,
      log: createLogger('info', (l) => lines.push(l)),
    });
    const open = async (localAddress: string) => {
      const c = net.connect({ port: s.port, host: '127.0.0.1', localAddress });
      sockets.push(c);
      c.on('error', () => undefined);
      const closed = new Promise<void>((r) => c.once('close', () => r()));
      await new Promise((r) => c.once('connect', r));
      return { c, closed };
    };
    await open('127.0.0.2');
    await open('127.0.0.2');
    await waitUntil('two unknown peers', () => s.connectionsOf(-1) === 2);
    expect(s.connectionsOf(0)).toBe(0);
    // A connect loop of the unknown peer: each refused, one line for all of them.
    for (let i = 0; i < 50; i++) await (await open('127.0.0.2')).closed;
    expect(s.connectionsOf(-1)).toBe(2);
    // Root fills the rest, then displaces the unknown peers rather than being refused.
    const roots = [];
    for (let i = 0; i < 8; i++) roots.push(await open('127.0.0.1'));
    await waitUntil('root holding all', () => s.connectionsOf(0) === 8 && s.connectionsOf(-1) === 0);
    expect((await fetch(`${s.url}/healthz`).catch((e: Error) => e)) instanceof Error).toBe(true);
    for (const r of roots) r.c.destroy();
    await waitUntil('the connections to go', () => s.connections === 0);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);
    const refusals = lines.filter((l) => l.includes('refused or shed'));
    expect(refusals).toHaveLength(1);
    expect(JSON.parse(refusals[0]!)).toMatchObject({ level: 'warn', reason: 'per-user', uid: -1, count: 1, perUser: 2 });
    await s.close();
    // The rest are counted and written when the server stops: 49 more refused, 2 shed, root's one refused.
    const all = lines.filter((l) => l.includes('refused or shed')).map((l) => JSON.parse(l) as { count: number });
    expect(all).toHaveLength(2);
    expect(all[1]!.count).toBe(52);
  });

  it('caps concurrent connections and closes a connection that never finishes its headers', async () => {
    const s = await start({ maxConnections: 3, headersTimeoutMs: 60_000 });
    const open = async () => {
      const c = net.connect(s.port, '127.0.0.1');
      sockets.push(c);
      c.on('error', () => undefined);
      const closed = new Promise<void>((r) => c.once('close', () => r()));
      await new Promise((r) => c.once('connect', r));
      return { c, closed };
    };
    const held = [await open(), await open(), await open()];
    await waitUntil('three connections', () => s.connections === 3);
    const fourth = await open();
    await fourth.closed;
    expect(s.connections).toBe(3);
    for (const h of held) h.c.destroy();
    await waitUntil('the connections to go', () => s.connections === 0);
    expect((await fetch(`${s.url}/healthz`)).status).toBe(200);

    const slow = await start({ headersTimeoutMs: 500 });
    const c = net.connect(slow.port, '127.0.0.1');
    sockets.push(c);
    c.on('error', () => undefined);
    let reply = '';
    c.on('data', (d) => (reply += d.toString()));
    const closed = new Promise<void>((r) => c.once('close', () => r()));
    c.write('GET /pods HTTP/1.1\r\nHost: x\r\n');
    const t0 = Date.now();
    await closed;
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(reply).toMatch(/^HTTP\/1.1 408|^$/);
  });
});
