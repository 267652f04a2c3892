/**
 * The streaming server against clients that misbehave the way an attacker
 * (or a broken client) would: extra streams, bad frames, clients that never
 * read, floods, clients that vanish. Each test drives the real daemon and
 * checks what a user of the node would notice: the daemon keeps answering,
 * its memory stays bounded, nothing it started outlives the session, and its
 * crash guard never fires.
 */
import { spawn, spawnSync } from 'node:child_process';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { dataFrame } from '../../src/streaming/spdy.js';
import { isRoot } from '../helpers/env.js';
import { processesMentioning, startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';
import { SpdyTestClient, type ClientStream } from '../helpers/spdy-client.js';
import { childrenOf, cleanupUnguarded, closeWaitSockets, fdCount, fdFlags, GUARD, nofile, rssBytes, setNofile } from '../helpers/streaming-probe.js';
import { RawWsClient } from '../helpers/ws-raw.js';

const MiB = 1024 * 1024;
const dataFrameFor = (id: number, data: Buffer) => dataFrame(id, 0, data);
const hasCrictl = spawnSync('sh', ['-c', 'command -v crictl']).status === 0;

describe.skipIf(!isRoot)('streaming against hostile clients', () => {
  let f: PodFixture;
  let podId: string;
  let ctr: string;
  let shell: string;
  let hostPort: number;
  let streamPort: number;
  let pid: number;
  const clients: Array<{ close(): void }> = [];

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-hostile');
    pid = f.skiff.child.pid!;
    const config = { metadata: { name: 'hostile', namespace: 'test', uid: 'hostile-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} };
    podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const mk = async (name: string, command: string[], extra: Record<string, unknown> = {}) => {
      const id = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name }, image: { image: f.image }, command, logPath: `${name}.log`, linux: {}, ...extra }, sandboxConfig: config })).containerId!;
      await f.skiff.runtime.StartContainer({ containerId: id });
      return id;
    };
    ctr = await mk('sleeper', ['sleep', '100000']);
    await mk('web', ['sh', '-c', 'mkdir -p /www && echo hello > /www/index.html && httpd -f -p 80 -h /www']);
    // A server that streams zeros to whoever connects, for ever.
    await mk('zero', ['sh', '-c', 'printf "#!/bin/sh\\nexec cat /dev/zero\\n" > /zero.sh && chmod +x /zero.sh && exec nc -ll -p 8080 -e /zero.sh']);
    shell = await mk('shell', ['sh'], { stdin: true });
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    streamPort = Number(new URL(url).port);
    hostPort = await f.ns.exposePort(streamPort, f.dirs.base);
  });

  afterAll(() => cleanupUnguarded(f, clients));

  /** The daemon answers, and no input so far reached its crash guard. */
  async function stillServing(): Promise<void> {
    expect(f.skiff.child.exitCode).toBeNull();
    const v = await f.skiff.runtime.Version({});
    expect(v.runtimeName).toBeTruthy();
    expect(f.skiff.log).not.toContain(GUARD);
  }

  async function spdy(url: string, protocols = ['v4.channel.k8s.io']): Promise<SpdyTestClient> {
    const { client } = await SpdyTestClient.connect(url, protocols, hostPort);
    clients.push(client);
    return client;
  }

  async function execUrl(cmd: string[], o: { tty?: boolean; stdin?: boolean; stdout?: boolean; stderr?: boolean } = {}): Promise<string> {
    return (await f.skiff.runtime.Exec({ containerId: ctr, cmd, tty: o.tty ?? false, stdin: o.stdin ?? false, stdout: o.stdout ?? true, stderr: o.stderr ?? false })).url!;
  }

  async function ws(url: string, protocol = 'v5.channel.k8s.io', query = ''): Promise<RawWsClient> {
    const c = await RawWsClient.connect(hostPort, new URL(url).pathname + query, protocol);
    clients.push(c);
    return c;
  }

  /** Samples the daemon's RSS after a settling period and again `ms` later. */
  async function rssGrowth(settleMs: number, ms: number): Promise<{ before: number; after: number }> {
    await new Promise((r) => setTimeout(r, settleMs));
    const before = rssBytes(pid);
    let peak = before;
    const end = Date.now() + ms;
    while (Date.now() < end) {
      await new Promise((r) => setTimeout(r, 500));
      peak = Math.max(peak, rssBytes(pid));
    }
    console.info(`daemon RSS ${(before / MiB).toFixed(1)} MiB → peak ${(peak / MiB).toFixed(1)} MiB over ${ms} ms`);
    return { before, after: peak };
  }

  async function gone(text: string, ms = 15_000): Promise<void> {
    await waitFor(`no process running "${text}"`, async () => processesMentioning(text).length === 0, ms);
  }

  // --- crashes ---------------------------------------------------------------

  it('runs one command per SPDY exec session and refuses an extra stdout stream', async () => {
    const marker = `/tmp/runs-${Date.now()}`;
    const client = await spdy(await execUrl(['sh', '-c', `echo x >> ${marker}; echo done`], { stderr: true }));
    const error = await client.open({ streamtype: 'error', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    await client.open({ streamtype: 'stderr', requestid: '0' });
    const extra = await client.open({ streamtype: 'stdout', requestid: '0' });
    const unknown = await client.open({ streamtype: 'bogus', requestid: '0' });
    await client.until(() => error.fin);
    await client.until(() => extra.reset && unknown.reset);
    expect(stdout.data.toString()).toBe('done\n');
    expect(JSON.parse(error.data.toString())).toEqual({ metadata: {}, status: 'Success' });
    await new Promise((r) => setTimeout(r, 500));
    const runs = await f.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['cat', marker], timeout: 10 });
    expect(Buffer.from(runs.stdout!).toString()).toBe('x\n');
    client.close();
    await stillServing();
  });

  it('refuses duplicate streams on attach too, and the session still works', async () => {
    const url = (await f.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!;
    const client = await spdy(url);
    await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await client.open({ streamtype: 'stdin', requestid: '0' });
    const stdout = await client.open({ streamtype: 'stdout', requestid: '0' });
    await client.open({ streamtype: 'stderr', requestid: '0' });
    const again = await client.open({ streamtype: 'stdout', requestid: '0' });
    const stdin2 = await client.open({ streamtype: 'stdin', requestid: '0' });
    await client.until(() => again.reset && stdin2.reset);
    client.write(stdin, 'echo once-only\n');
    await client.until(() => stdout.data.toString().includes('once-only\n'));
    await new Promise((r) => setTimeout(r, 300));
    expect(stdout.data.toString()).toBe('once-only\n');
    client.close();
    await stillServing();
  });

  it('survives WebSocket frames with reserved bits, bad opcodes, no mask and oversized lengths', async () => {
    const bad = [
      RawWsClient.frame(2, Buffer.from([0, 1, 2]), { rsv: 4 }),
      RawWsClient.frame(2, Buffer.from([0, 1]), { rsv: 1 }),
      RawWsClient.frame(3, Buffer.from([0])),
      RawWsClient.frame(0xb, Buffer.alloc(0)),
      RawWsClient.frame(2, Buffer.from([0, 65]), { mask: false }),
      RawWsClient.frame(9, Buffer.alloc(200)), // a control frame longer than 125 bytes
      RawWsClient.frame(8, Buffer.from([0x03])), // a close frame with a one-byte code
      // a length of 2^62: far beyond any limit
      Buffer.from([0x82, 0xff, 0x40, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4]),
    ];
    for (const frame of bad) {
      const c = await ws(await execUrl(['cat'], { stdin: true }));
      await c.write(frame);
      await waitFor('the server to drop the connection', async () => c.closed, 10_000);
    }
    await stillServing();
  });

  it('survives a helper that cannot start (EMFILE) for port-forward and exec', async () => {
    const limits = nofile(pid);
    const pf = await spdy((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!, ['portforward.k8s.io']);
    const ex = await spdy(await execUrl(['echo', 'never'], { stdout: true }));
    let pfError: ClientStream;
    let exError: ClientStream;
    // Room for nothing more than what is open now, plus one: no pipes for a child.
    setNofile(pid, fdCount(pid) + 1, limits.hard);
    try {
      pfError = await pf.open({ streamtype: 'error', port: '80', requestid: '1' });
      await pf.open({ streamtype: 'data', port: '80', requestid: '1' });
      exError = await ex.open({ streamtype: 'error', requestid: '0' });
      await ex.open({ streamtype: 'stdout', requestid: '0' });
      await pf.until(() => pfError.fin);
      await ex.until(() => exError.fin);
    } finally {
      setNofile(pid, limits.soft, limits.hard);
    }
    expect(pfError.data.toString()).toMatch(/error forwarding port 80/);
    expect(JSON.parse(exError.data.toString())).toMatchObject({ status: 'Failure' });
    await stillServing();
  });

  // --- freeze ------------------------------------------------------------------

  it('keeps answering other RPCs in under a second while five tty exec sessions sit idle', async () => {
    const sessions: SpdyTestClient[] = [];
    for (let i = 0; i < 5; i++) {
      const c = await spdy(await execUrl(['sh'], { tty: true, stdin: true }));
      const stdin = await c.open({ streamtype: 'stdin', requestid: '0' });
      await c.open({ streamtype: 'error', requestid: '0' });
      const out = await c.open({ streamtype: 'stdout', requestid: '0' });
      await c.open({ streamtype: 'resize', requestid: '0' });
      c.write(stdin, 'echo ready\n');
      await c.until(() => out.data.toString().includes('ready'));
      sessions.push(c);
    }
    await new Promise((r) => setTimeout(r, 500));
    const timed = async (what: string, p: () => Promise<unknown>) => {
      const t0 = Date.now();
      await p();
      return [what, Date.now() - t0] as const;
    };
    const times = [
      await timed('ExecSync', () => f.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['true'], timeout: 5 })),
      await timed('ImageFsInfo', () => f.skiff.images.ImageFsInfo({})),
      await timed('ListContainers', () => f.skiff.runtime.ListContainers({})),
      await timed('PullImage', () => f.skiff.images.PullImage({ image: { image: f.image } })),
    ];
    console.info('RPC times with five idle tty execs (ms):', Object.fromEntries(times));
    for (const [what, ms] of times) expect(ms, `${what} took ${ms} ms`).toBeLessThan(1000);
    // The terminals' master sides: non-blocking (04000) and close-on-exec (02000000), so no child inherits them.
    const ptys = fdFlags(pid, /^\/dev\/ptmx$|^\/dev\/pts\/ptmx$/);
    expect(ptys.length).toBeGreaterThanOrEqual(5);
    for (const flags of ptys) {
      expect(parseInt(flags, 8) & 0o4000, `flags ${flags}`).not.toBe(0);
      expect(parseInt(flags, 8) & 0o2000000, `flags ${flags}`).not.toBe(0);
    }
    for (const c of sessions) c.close();
    await stillServing();
  });

  // --- backpressure --------------------------------------------------------------

  it('holds an unread `cat /dev/zero` back over SPDY: daemon RSS flat within 64 MiB', async () => {
    const client = await spdy(await execUrl(['cat', '/dev/zero']));
    await client.open({ streamtype: 'error', requestid: '0' });
    await client.open({ streamtype: 'stdout', requestid: '0' });
    client.stopReading();
    const { before, after } = await rssGrowth(2000, 10_000);
    expect(after - before, `RSS ${before} → ${after}`).toBeLessThan(64 * MiB);
    await stillServing();
    client.close();
    await gone('cat /dev/zero');
  });

  it('holds an unread `cat /dev/zero` back over WebSocket: daemon RSS flat within 64 MiB', async () => {
    const c = await ws(await execUrl(['cat', '/dev/zero']));
    c.stopReading();
    const { before, after } = await rssGrowth(2000, 10_000);
    expect(after - before, `RSS ${before} → ${after}`).toBeLessThan(64 * MiB);
    await stillServing();
    c.close();
    await gone('cat /dev/zero');
  });

  it('holds an endless pod server back through an unread port-forward: daemon RSS flat within 64 MiB', async () => {
    const client = await spdy((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [8080] })).url!, ['portforward.k8s.io']);
    await client.open({ streamtype: 'error', port: '8080', requestid: '0' });
    const data = await client.open({ streamtype: 'data', port: '8080', requestid: '0' });
    await client.until(() => data.data.length > 0);
    client.stopReading();
    const { before, after } = await rssGrowth(2000, 10_000);
    expect(after - before, `RSS ${before} → ${after}`).toBeLessThan(64 * MiB);
    await stillServing();
    client.close();
    await waitFor('no port-forward helper left', async () => childrenOf(pid).every((c) => !/socat|nsenter/.test(c)), 10_000);
  });

  it('stops reading a SPDY client that floods PINGs and never reads the replies: RSS within 64 MiB', async () => {
    const client = await spdy(await execUrl(['true']));
    client.stopReading();
    const chunk = Buffer.concat(Array.from({ length: 5000 }, (_, i) => SpdyTestClient.pingFrame(2 * i + 1)));
    const before = rssBytes(pid);
    let peak = before;
    let sent = 0;
    const end = Date.now() + 8000;
    // At most 100 MB, for at most 8 s: a write that does not complete means the daemon stopped reading.
    while (sent < 100 * 1e6 && Date.now() < end) {
      const ok = await Promise.race([client.raw(chunk), new Promise<'stuck'>((r) => setTimeout(() => r('stuck'), 1000))]);
      if (ok === false) break;
      if (ok === true) sent += chunk.length;
      peak = Math.max(peak, rssBytes(pid));
    }
    peak = Math.max(peak, rssBytes(pid));
    console.info(`PING flood: ${sent} bytes accepted; daemon RSS ${(before / MiB).toFixed(1)} MiB → peak ${(peak / MiB).toFixed(1)} MiB`);
    expect(peak - before, `RSS ${before} → ${peak} after ${sent} bytes of PINGs`).toBeLessThan(64 * MiB);
    client.close();
    await stillServing();
  });

  it('cuts off a WebSocket client that floods pings and never reads the pongs: RSS within 64 MiB', async () => {
    const c = await ws(await execUrl(['sleep', '1004']));
    c.stopReading();
    const ping = RawWsClient.frame(9, Buffer.alloc(125, 7));
    const chunk = Buffer.concat(Array.from({ length: 400 }, () => ping));
    const before = rssBytes(pid);
    let peak = before;
    let sent = 0;
    const end = Date.now() + 6000;
    while (Date.now() < end) {
      const ok = await Promise.race([c.write(chunk), new Promise<'stuck'>((r) => setTimeout(() => r('stuck'), 1000))]);
      if (ok === false) break;
      if (ok === true) sent += chunk.length;
      peak = Math.max(peak, rssBytes(pid));
    }
    console.info(`WebSocket ping flood: ${sent} bytes accepted; daemon RSS ${(before / MiB).toFixed(1)} MiB → peak ${(peak / MiB).toFixed(1)} MiB`);
    expect(peak - before).toBeLessThan(64 * MiB);
    c.close();
    await gone('sleep 1004');
    await stillServing();
  });

  it('bounds stdin a command does not read yet, over SPDY and WebSocket, and delivers it all later', async () => {
    // The commands read nothing for 6 s, then count what they get: nothing may be lost meanwhile.
    const reader = (tag: string) => ['sh', '-c', `sleep 6; wc -c > /tmp/${tag}.part && mv /tmp/${tag}.part /tmp/${tag}; : ${tag}`];
    const client = await spdy(await execUrl(reader('stdin-spdy'), { stdin: true }));
    await client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await client.open({ streamtype: 'stdin', requestid: '0' });
    await client.open({ streamtype: 'stdout', requestid: '0' });
    const w = await ws(await execUrl(reader('stdin-ws'), { stdin: true }));
    const before = rssBytes(pid);
    let peak = before;
    const block = Buffer.alloc(32 * 1024, 0x62);
    const spdyFrame = Buffer.concat(Array.from({ length: 8 }, () => dataFrameFor(stdin.id, block)));
    const wsFrame = Buffer.concat(Array.from({ length: 8 }, () => RawWsClient.channel(0, block)));
    let spdySent = 0;
    let wsSent = 0;
    const end = Date.now() + 4000;
    const pendingWrites: Array<Promise<boolean>> = [];
    while (Date.now() < end) {
      const a = client.raw(spdyFrame).then((ok) => ok && (spdySent += 8 * block.length) > 0);
      const b = w.write(wsFrame).then((ok) => ok && (wsSent += 8 * block.length) > 0);
      pendingWrites.push(a, b);
      await Promise.race([Promise.all([a, b]), new Promise((r) => setTimeout(r, 500))]);
      peak = Math.max(peak, rssBytes(pid));
    }
    console.info(`stdin held back: ${spdySent} bytes (SPDY) and ${wsSent} bytes (WebSocket) accepted; daemon RSS ${(before / MiB).toFixed(1)} MiB → peak ${(peak / MiB).toFixed(1)} MiB`);
    expect(peak - before).toBeLessThan(64 * MiB);
    await Promise.all(pendingWrites);
    // Then the readers start: every byte arrives, the stdin end included.
    client.write(stdin, '', true);
    await w.write(RawWsClient.channel(255, Buffer.from([0])));
    const count = async (tag: string) => {
      const r = await f.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['cat', `/tmp/${tag}`], timeout: 5 });
      return r.exitCode === 0 ? Number(Buffer.from(r.stdout!).toString().trim()) : undefined;
    };
    const spdyBytes = await waitFor('the SPDY reader to finish', () => count('stdin-spdy'), 60_000);
    const wsBytes = await waitFor('the WebSocket reader to finish', () => count('stdin-ws'), 60_000);
    expect(spdyBytes).toBe(spdySent);
    // WebSocket frames each carry one channel byte.
    expect(wsBytes).toBe(wsSent);
    client.close();
    w.close();
    await gone('stdin-spdy');
    await gone('stdin-ws');
    await stillServing();
  });

  it.skipIf(!hasCrictl)('holds back crictl (the Go SPDY client) when its output pipe is not read, and ends the exec when crictl dies', async () => {
    const crictl = ['nsenter', `--net=${f.ns.path}`, 'crictl', '--runtime-endpoint', `unix://${f.dirs.socket}`, '--timeout', '30s', 'exec'];
    const hello = spawnSync(crictl[0]!, [...crictl.slice(1), ctr, 'sh', '-c', 'echo from-crictl; echo err >&2; exit 0'], { encoding: 'utf8', timeout: 30_000 });
    expect(hello.stdout).toBe('from-crictl\n');
    const piped = spawnSync('sh', ['-c', `printf 'in\\n' | ${crictl.join(' ')} -i ${ctr} cat`], { encoding: 'utf8', timeout: 30_000 });
    expect(piped.stdout).toBe('in\n');
    // A terminal exec, with crictl itself on a terminal (script(1) gives it one).
    const tty = spawnSync('script', ['-qec', `${crictl.join(' ')} -it ${ctr} sh -c 'tty; exit 3'`, '/dev/null'], { encoding: 'utf8', timeout: 30_000, input: '' });
    expect(tty.stdout).toMatch(/\/dev\/pts\/\d+/);
    expect(tty.stdout).toMatch(/exit code 3/);
    // As in the report: `crictl exec <id> cat /dev/zero | sleep 15`, shortened.
    const unread = spawn('sh', ['-c', `${crictl.join(' ')} ${ctr} cat /dev/zero | sleep 12`], { stdio: 'ignore' });
    clients.push({ close: () => unread.kill('SIGKILL') });
    await waitFor('cat /dev/zero to run', async () => processesMentioning('cat /dev/zero').length > 0);
    const { before, after } = await rssGrowth(1000, 8000);
    expect(after - before, `RSS ${before} → ${after}`).toBeLessThan(64 * MiB);
    await gone('cat /dev/zero', 30_000);
    await stillServing();
  });

  // --- lifetime ------------------------------------------------------------------

  it('leaves no CLOSE-WAIT socket and no helper after 50 SPDY and 10 WebSocket port-forward connections are dropped', async () => {
    for (let i = 0; i < 50; i++) {
      const client = await spdy((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!, ['portforward.k8s.io']);
      await client.open({ streamtype: 'error', port: '80', requestid: '0' });
      await client.open({ streamtype: 'data', port: '80', requestid: '0' });
      if (i % 10 === 0) await new Promise((r) => setTimeout(r, 100));
      client.close();
    }
    for (let i = 0; i < 10; i++) {
      const c = await ws((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!, 'v4.channel.k8s.io', '?port=80');
      await waitFor('the WebSocket port-forward helper', async () => childrenOf(pid).some((p) => /socat|nsenter/.test(p)));
      c.close();
    }
    await waitFor('no CLOSE-WAIT socket on the streaming port', async () => closeWaitSockets(pid, streamPort).length === 0, 15_000);
    await waitFor('no port-forward helper left', async () => childrenOf(pid).every((c) => !/socat|nsenter/.test(c)), 15_000);
    await stillServing();
  });

  it('limits a port-forward session to 128 streams and 32 helpers at once', async () => {
    const client = await spdy((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!, ['portforward.k8s.io']);
    const held: ClientStream[] = [];
    for (let i = 0; i < 128; i++) held.push(await client.open({ streamtype: 'error', port: '80', requestid: `half-${i}` }));
    const refused = await client.open({ streamtype: 'error', port: '80', requestid: 'one-too-many' });
    await client.until(() => refused.reset);
    expect(held.filter((s) => s.reset)).toEqual([]);
    client.close();

    const c2 = await spdy((await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!, ['portforward.k8s.io']);
    const errors: ClientStream[] = [];
    for (let i = 0; i < 33; i++) {
      errors.push(await c2.open({ streamtype: 'error', port: '80', requestid: String(i) }));
      await c2.open({ streamtype: 'data', port: '80', requestid: String(i) });
    }
    await c2.until(() => errors.some((e) => /too many connections/.test(e.data.toString())));
    expect(childrenOf(pid).filter((c) => /socat|nsenter/.test(c)).length).toBeLessThanOrEqual(32);
    c2.close();
    await waitFor('no port-forward helper left', async () => childrenOf(pid).every((c) => !/socat|nsenter/.test(c)), 15_000);
    await stillServing();
  });

  it('stops the attach poller and closes the conmon socket when attach clients go away', async () => {
    const seqpackets = () => fdFlags(pid, /^socket:/).length;
    const baseline = seqpackets();
    const sessions: SpdyTestClient[] = [];
    for (let i = 0; i < 5; i++) {
      const c = await spdy((await f.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!);
      await c.open({ streamtype: 'error', requestid: '0' });
      await c.open({ streamtype: 'stdin', requestid: '0' });
      await c.open({ streamtype: 'stdout', requestid: '0' });
      await c.open({ streamtype: 'stderr', requestid: '0' });
      sessions.push(c);
    }
    // Each session: its TCP connection and its connection to conmon.
    await waitFor('the attach connections', async () => seqpackets() >= baseline + 10);
    for (const c of sessions) c.close();
    await waitFor('the attach connections to close', async () => seqpackets() <= baseline, 10_000);
    await stillServing();
  });

  it('kills the command inside the container when an exec client goes away (SPDY, SPDY tty, WebSocket)', async () => {
    const plain = await spdy(await execUrl(['sleep', '1001']));
    await plain.open({ streamtype: 'error', requestid: '0' });
    await plain.open({ streamtype: 'stdout', requestid: '0' });
    await waitFor('sleep 1001 to run', async () => processesMentioning('sleep 1001').length > 0);
    plain.close();
    await gone('sleep 1001');

    const tty = await spdy(await execUrl(['sh', '-c', 'sleep 1002; echo after'], { tty: true, stdin: true }));
    await tty.open({ streamtype: 'error', requestid: '0' });
    await tty.open({ streamtype: 'stdin', requestid: '0' });
    await tty.open({ streamtype: 'stdout', requestid: '0' });
    await tty.open({ streamtype: 'resize', requestid: '0' });
    await waitFor('sleep 1002 to run', async () => processesMentioning('sleep 1002').length > 0);
    tty.close();
    await gone('sleep 1002');

    const w = await ws(await execUrl(['sleep', '1003']));
    await waitFor('sleep 1003 to run', async () => processesMentioning('sleep 1003').length > 0);
    w.close();
    await gone('sleep 1003');
    await stillServing();
  });
});
