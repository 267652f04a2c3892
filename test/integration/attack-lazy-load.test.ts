/**
 * The streaming session code is loaded by the first session. A first load that fails for a
 * passing reason (the daemon out of descriptors for a moment) must not leave every later
 * session broken.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { cleanupUnguarded, fdCount, nofile, setNofile } from '../helpers/streaming-probe.js';

describe.skipIf(!isRoot)('the first streaming session, while the daemon is out of descriptors', () => {
  let f: PodFixture;
  let ctr: string;
  let hostPort: number;
  let pid: number;
  const clients: Array<{ close(): void }> = [];

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-lazy');
    pid = f.skiff.child.pid!;
    const config = { metadata: { name: 'lazy', namespace: 'test', uid: 'lazy-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} };
    const podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    ctr = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name: 'sleeper' }, image: { image: f.image }, command: ['sleep', '100000'], logPath: 'sleeper.log', linux: {} }, sandboxConfig: config })).containerId!;
    await f.skiff.runtime.StartContainer({ containerId: ctr });
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
