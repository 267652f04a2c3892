/**
 * The streaming session code is loaded by the first session. A first load that fails for a
 * passing reason (the daemon out of descriptors for a moment) must not leave every later
 * session broken.
 */
import fs from 'node:fs/promises';
import http2 from 'node:http2';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { busyboxImage } from '../helpers/busybox.js';
import { makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { Pusher } from '../helpers/oci.js';
import { protoPath, serviceMethods } from '../../src/server/proto.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { cleanupUnguarded, fdCount, nofile, setNofile } from '../helpers/streaming-probe.js';

/** A pod named `name` with one running `sleep` container. */
async function sleeperPod(f: PodFixture, name: string): Promise<{ podId: string; ctr: string }> {
  const config = { metadata: { name, namespace: 'test', uid: `${name}-uid`, attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} };
  const podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
  const ctr = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name: 'sleeper' }, image: { image: f.image }, command: ['sleep', '100000'], logPath: 'sleeper.log', linux: {} }, sandboxConfig: config })).containerId!;
  await f.skiff.runtime.StartContainer({ containerId: ctr });
  return { podId, ctr };
}

describe.skipIf(!isRoot)('the first streaming session, while the daemon is out of descriptors', () => {
  let f: PodFixture;
  let ctr: string;
  let hostPort: number;
  let pid: number;
  const clients: Array<{ close(): void }> = [];

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-lazy');
    pid = f.skiff.child.pid!;
    ({ ctr } = await sleeperPod(f, 'lazy'));
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    hostPort = await f.ns.exposePort(Number(new URL(url).port), f.dirs.base);
  }, 120_000);

  afterAll(() => cleanupUnguarded(f, clients));

  async function echo(text: string): Promise<string> {
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['echo', text], stdout: true })).url!;
    const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], hostPort);
    clients.push(client);
    const err = await client.open({ streamtype: 'error', requestid: '0' });
    const out = await client.open({ streamtype: 'stdout', requestid: '0' });
    await client.until(() => err.fin);
    return out.data.toString();
  }

  it('serves sessions again once descriptors are back, when the first one came while there were none', async () => {
    const limits = nofile(pid);
    const url = (await f.skiff.runtime.Exec({ containerId: ctr, cmd: ['true'], stdout: true })).url!;
    // Room for the connection and nothing more: the session code cannot be read.
    setNofile(pid, fdCount(pid) + 1, limits.hard);
    let first: string;
    try {
      first = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], hostPort).then(
        ({ client }) => (clients.push(client), 'upgraded'),
        (e: Error) => e.message,
      );
    } finally {
      setNofile(pid, limits.soft, limits.hard);
    }
    console.info(`first session, out of descriptors: ${first}`);
    expect(first).not.toBe('upgraded');
    // Before: Node keeps a module that failed to load as failed, and every later session was closed at once.
    expect(await echo('again')).toBe('again\n');
    expect(await echo('and again')).toBe('and again\n');
  }, 60_000);
});

describe.skipIf(!isRoot)('the first pulls of a daemon, at once and cancelled', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  const images: string[] = [];

  beforeAll(async () => {
    const host = inject('registryHost');
    const img = await busyboxImage();
    const pusher = new Pusher(`http://${host}`);
    for (let i = 0; i < 4; i++) {
      await pusher.image(`test/busybox-lazy-pull-${i}`, 'v1', img);
      images.push(`${host}/test/busybox-lazy-pull-${i}:v1`);
    }
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  }, 120_000);

  afterAll(async () => {
    await skiff?.stop();
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('a first pull cancelled while its code loads, then first pulls at once: each lands', async () => {
    // The very first pull, cut by a 20 ms deadline: about when the layer code is being loaded.
    const pull = serviceMethods(protoPath, 'runtime.v1.ImageService').PullImage!;
    const body = pull.requestSerialize({ image: { image: images[0] } });
    const msg = Buffer.concat([Buffer.alloc(5), body]);
    msg.writeUInt32BE(body.length, 1);
    const s = http2.connect('http://localhost', { createConnection: () => net.connect(dirs.socket) });
    s.on('error', () => {});
    const status = await new Promise<string>((resolve) => {
      const req = s.request({ ':method': 'POST', ':path': pull.path, 'content-type': 'application/grpc', te: 'trailers', 'grpc-timeout': '20m' });
      req.on('response', (h) => h['grpc-status'] !== undefined && resolve(String(h['grpc-status'])));
      req.on('trailers', (h) => resolve(String(h['grpc-status'])));
      req.on('error', (e) => resolve(e.message));
      req.on('close', () => resolve('closed'));
      req.resume();
      req.end(msg);
    });
    s.destroy();
    console.info(`first pull with a 20 ms deadline: grpc-status ${status}`);
    const refs = await Promise.all([...images, ...images].map((image) => skiff.images.PullImage({ image: { image } }).then((r) => r.imageRef)));
    expect(refs.every((r) => typeof r === 'string' && r.startsWith('sha256:'))).toBe(true);
    const listed = (await skiff.images.ListImages({})).images ?? [];
    for (const image of images) expect(listed.some((i) => i.repoTags?.includes(image))).toBe(true);
    expect(skiff.child.exitCode).toBeNull();
  }, 120_000);
});

describe.skipIf(!isRoot)('the first streaming sessions of a daemon, all at once', () => {
  let f: PodFixture;
  let ctr: string;
  let podId: string;
  let hostPort: number;
  const clients: Array<{ close(): void }> = [];

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-lazy-many');
    ({ podId, ctr } = await sleeperPod(f, 'lazy-many'));
  }, 120_000);

  afterAll(() => cleanupUnguarded(f, clients));

  it('twelve exec and four port-forward sessions started together, before any was loaded, all work', async () => {
    const urls = await Promise.all(Array.from({ length: 12 }, (_, i) => f.skiff.runtime.Exec({ containerId: ctr, cmd: ['echo', `n${i}`], stdout: true }).then((r) => r.url!)));
    const pfUrls = await Promise.all(Array.from({ length: 4 }, () => f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] }).then((r) => r.url!)));
    hostPort = await f.ns.exposePort(Number(new URL(urls[0]!).port), f.dirs.base);
    const outs = await Promise.all(
      urls.map(async (url) => {
        const { client } = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], hostPort);
        clients.push(client);
        const err = await client.open({ streamtype: 'error', requestid: '0' });
        const out = await client.open({ streamtype: 'stdout', requestid: '0' });
        await client.until(() => err.fin);
        return out.data.toString();
      }),
    );
    expect(outs).toEqual(urls.map((_, i) => `n${i}\n`));
    const pfs = await Promise.all(
      pfUrls.map(async (url) => {
        const { client, protocol } = await SpdyTestClient.connect(url, ['portforward.k8s.io'], hostPort);
        clients.push(client);
        return protocol;
      }),
    );
    expect(pfs).toEqual(Array(4).fill('portforward.k8s.io'));
  }, 60_000);
});
