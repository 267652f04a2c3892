/**
 * Random and mutated SPDY and WebSocket frames (seeded, fixed count) thrown
 * at the real streaming server over many connections, and sessions left
 * idle past a short --stream-idle-timeout. The daemon must stay up and
 * answering, its crash guard silent, and nothing a session started may
 * outlive it.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { controlFrame, dataFrame, FrameType } from '../../src/streaming/spdy.js';
import { isRoot } from '../helpers/env.js';
import { processesMentioning, startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { prng } from '../helpers/prng.js';
import { childrenOf, cleanupUnguarded, GUARD } from '../helpers/streaming-probe.js';
import { RawWsClient } from '../helpers/ws-raw.js';

const IDLE_TIMEOUT_S = 3;
const CONNECTIONS = 100;
const FRAMES_PER_CONNECTION = 20;
const MARKER = 'fuzz-marker';

describe.skipIf(!isRoot)('streaming: fuzzed frames and idle sessions', () => {
  let f: PodFixture;
  let podId: string;
  let ctr: string;
  let hostPort: number;
  let pid: number;

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-fuzz', ['--stream-idle-timeout', `${IDLE_TIMEOUT_S}s`]);
    pid = f.skiff.child.pid!;
    const config = { metadata: { name: 'fuzz', namespace: 'test', uid: 'fuzz-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} };
    podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const mk = async (name: string, command: string[]) => {
      const id = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name }, image: { image: f.image }, command, logPath: `${name}.log`, linux: {} }, sandboxConfig: config })).containerId!;
      await f.skiff.runtime.StartContainer({ containerId: id });
      return id;
    };
    ctr = await mk('sleeper', ['sleep', '100000']);
    await mk('web', ['sh', '-c', 'mkdir -p /www && echo hello > /www/index.html && httpd -f -p 80 -h /www']);
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    hostPort = await f.ns.exposePort(Number(new URL(url).port), f.dirs.base);
  });

  afterAll(() => cleanupUnguarded(f));

  async function stillServing(): Promise<void> {
    expect(f.skiff.child.exitCode).toBeNull();
    expect((await f.skiff.runtime.Version({})).runtimeName).toBeTruthy();
    const out = await f.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['echo', 'alive'], timeout: 10 });
    expect(Buffer.from(out.stdout!).toString()).toBe('alive\n');
    expect(f.skiff.log).not.toContain(GUARD);
  }

  const execCmd = ['sh', '-c', `cat; : ${MARKER}`];

  it('closes sessions idle for --stream-idle-timeout and ends what they started', async () => {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sleep', '1010'], stdout: true })).url!;
    const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], hostPort);
    await client.open({ streamtype: 'error', requestid: '0' });
    await client.open({ streamtype: 'stdout', requestid: '0' });
    await waitFor('sleep 1010 to run', async () => processesMentioning('sleep 1010').length > 0);
    const pf = (await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!;
    const { client: pfClient } = await SpdyTestClient.connect(pf, ['portforward.k8s.io'], hostPort);
    await pfClient.open({ streamtype: 'error', port: '80', requestid: '0' });
    await pfClient.open({ streamtype: 'data', port: '80', requestid: '0' });
    const wsUrl = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['sleep', '1011'], stdout: true })).url!;
    const ws = await RawWsClient.connect(hostPort, new URL(wsUrl).pathname, 'v5.channel.k8s.io');
    await waitFor('sleep 1011 to run', async () => processesMentioning('sleep 1011').length > 0);
    const t0 = Date.now();
    await waitFor('the idle sessions to be closed', async () => client.closed && pfClient.closed && ws.closed, 20_000);
    expect(Date.now() - t0).toBeGreaterThan((IDLE_TIMEOUT_S - 1) * 1000);
    await waitFor('the idle execs to be killed', async () => processesMentioning('sleep 1010').length + processesMentioning('sleep 1011').length === 0);
    await waitFor('no port-forward helper left', async () => childrenOf(pid).every((c) => !/socat|nsenter/.test(c)));
    await stillServing();
  });

  it(`survives ${CONNECTIONS * FRAMES_PER_CONNECTION} random and mutated SPDY and WebSocket frames`, async () => {
    const rand = prng(0x5eed);
    const int = (n: number) => Math.floor(rand() * n);
    const bytes = (n: number) => Buffer.from(Array.from({ length: n }, () => int(256)));
    const pick = <T>(xs: T[]) => xs[int(xs.length)]!;
    const u32 = (n: number) => {
      const b = Buffer.alloc(4);
      b.writeUInt32BE(n >>> 0);
      return b;
    };
    const mutate = (b: Buffer): Buffer => {
      const m = Buffer.from(b);
      switch (int(4)) {
        case 0:
          for (let i = 0; i < 1 + int(4) && m.length; i++) m[int(m.length)] = int(256);
          return m;
        case 1:
          return m.subarray(0, int(m.length + 1));
        case 2:
          if (m.length >= 8) m.writeUIntBE(int(1 << 24), 5, 3);
          return m;
        default:
          return Buffer.concat([m, bytes(int(64))]);
      }
    };
    const deadline = Date.now() + 120_000;
    let frames = 0;
    let started = 0;
    let c = 0;
    for (; frames < CONNECTIONS * FRAMES_PER_CONNECTION && Date.now() < deadline; c++) {
      const kind = pick(['spdy-exec', 'spdy-exec', 'spdy-pf', 'ws-exec', 'ws-exec', 'ws-pf'] as const);
      const url = kind.endsWith('pf')
        ? (await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!
        : (await f.skiff.runtime.Exec({ containerId: ctr, cmd: execCmd, stdin: true, stdout: true, stderr: true })).url!;
      if (kind.startsWith('spdy')) {
        let client: SpdyTestClient;
        try {
          ({ client } = await SpdyTestClient.connect(url, [kind === 'spdy-pf' ? 'portforward.k8s.io' : 'v4.channel.k8s.io'], hostPort));
        } catch {
          continue;
        }
        client.sock.on('error', () => undefined);
        let nextId = 1;
        // A third of the sessions start properly, so the noise also reaches a running command or helper.
        if (rand() < 0.34) {
          const types = kind === 'spdy-pf' ? ['error', 'data'] : ['error', 'stdin', 'stdout', 'stderr'];
          for (const streamtype of types) {
            await client.raw(await client.synStreamFrame(nextId, { streamtype, port: '80', requestid: '0' }));
            nextId += 2;
          }
          await client.raw(dataFrame(3, 0, Buffer.from(kind === 'spdy-pf' ? 'GET / HTTP/1.0\r\n' : 'typed\n')));
          started++;
        }
        for (let i = 0; i < FRAMES_PER_CONNECTION; i++, frames++) {
          let frame: Buffer;
          switch (int(10)) {
            case 0:
            case 1:
            case 2: {
              const id = rand() < 0.9 ? nextId : int(2 ** 31);
              nextId += 2;
              frame = await client.synStreamFrame(id, { streamtype: pick(['error', 'stdin', 'stdout', 'stderr', 'resize', 'data', 'bogus']), port: pick(['80', '0', '99999', 'x']), requestid: String(int(4)) }, int(4));
              break;
            }
            case 3:
              frame = dataFrame(1 + 2 * int(Math.max(1, nextId / 2)), int(2), bytes(int(200)));
              break;
            case 4:
              frame = SpdyTestClient.pingFrame(int(2 ** 32));
              break;
            case 5:
              frame = controlFrame(FrameType.SETTINGS, int(2), Buffer.concat([u32(int(4)), bytes(8 * int(4))]));
              break;
            case 6:
              frame = controlFrame(FrameType.WINDOW_UPDATE, 0, Buffer.concat([u32(int(nextId + 2)), u32(int(2 ** 32))]));
              break;
            case 7:
              frame = controlFrame(pick([FrameType.RST_STREAM, FrameType.GOAWAY, FrameType.HEADERS, 5, 10, 0xffff]), int(256), bytes(int(24)));
              break;
            case 8:
              frame = bytes(int(40));
              break;
            default:
              frame = dataFrame(int(2 ** 31), 0, Buffer.from(JSON.stringify({ Width: int(500), Height: int(500) })));
          }
          if (rand() < 0.3) frame = mutate(frame);
          if (!(await Promise.race([client.raw(frame), new Promise<boolean>((r) => setTimeout(() => r(false), 500))]))) break;
        }
        await new Promise((r) => setTimeout(r, int(40)));
        client.close();
      } else {
        let ws: RawWsClient;
        try {
          ws = await RawWsClient.connect(hostPort, new URL(url).pathname + (kind === 'ws-pf' ? '?port=80' : ''), pick(['v5.channel.k8s.io', 'v4.channel.k8s.io', 'v4.base64.channel.k8s.io']));
        } catch {
          continue;
        }
        for (let i = 0; i < FRAMES_PER_CONNECTION; i++, frames++) {
          let frame: Buffer;
          switch (int(6)) {
            case 0:
              frame = RawWsClient.channel(pick([0, 0, 1, 2, 3, 4, 255]), bytes(int(100)));
              break;
            case 1:
              frame = RawWsClient.channel(4, JSON.stringify({ Width: int(1000), Height: int(1000) }));
              break;
            case 2:
              frame = RawWsClient.frame(pick([1, 1, 2, 8, 9, 10]), Buffer.from(`${int(10)}${bytes(int(60)).toString('base64')}`));
              break;
            case 3:
              frame = RawWsClient.frame(int(16), bytes(int(300)), { fin: rand() < 0.8, rsv: rand() < 0.2 ? int(8) : 0, mask: rand() < 0.9 });
              break;
            case 4:
              frame = RawWsClient.channel(255, Buffer.from([int(5)]));
              break;
            default:
              frame = bytes(int(30));
          }
          if (rand() < 0.3) frame = mutate(frame);
          if (!(await Promise.race([ws.write(frame), new Promise<boolean>((r) => setTimeout(() => r(false), 500))]))) break;
        }
        await new Promise((r) => setTimeout(r, int(40)));
        ws.close();
      }
      if (c % 20 === 19) expect(f.skiff.child.exitCode).toBeNull();
    }
    console.info(`fuzz: ${frames} frames over ${c} connections, ${started} SPDY sessions started properly first`);
    expect(frames).toBeGreaterThanOrEqual(CONNECTIONS * FRAMES_PER_CONNECTION);
    await stillServing();
    // Every session ended with its client: no exec'd command or helper outlives it.
    await waitFor('no fuzzed exec left running', async () => processesMentioning(MARKER).length === 0, 20_000);
    await waitFor('no port-forward helper left', async () => childrenOf(pid).every((c) => !/socat|nsenter/.test(c)), 20_000);
    expect(f.skiff.log).not.toContain(GUARD);
  }, 240_000);
});
