/**
 * The fake CRI runtime the agent's unit tests use keeps the contract a real
 * runtime keeps (test/helpers/cri-contract.ts), and its own controls do
 * what they say: timestamps from the injected clock, exits, faults, holds.
 */
import * as grpc from '@grpc/grpc-js';
import { describe, expect, it } from 'vitest';
import { grpcCode } from '../../src/kubelet-lite/cri-client.js';
import { CRI_CONTRACT } from '../helpers/cri-contract.js';
import { FakeCri } from '../helpers/fake-cri.js';

function fake(now = () => Date.UTC(2030, 0, 1)) {
  const cri = new FakeCri({ now });
  cri.registry.set('example.test/app:1', {});
  return cri;
}

describe('FakeCri keeps the CRI contract', () => {
  for (const check of CRI_CONTRACT) {
    it(check.name, async () => {
      await check.run({ cri: fake(), image: 'example.test/app:1', command: ['sleep', '3600'], logDirectory: '/tmp/contract-logs' });
    });
  }
});

describe('FakeCri controls', () => {
  it('stamps times in ns from the injected clock, and exits a container when told', async () => {
    let t = Date.UTC(2030, 0, 1);
    const cri = fake(() => t);
    const config = { metadata: { name: 'p', namespace: 'n', uid: 'u' }, labels: { 'io.kubernetes.pod.uid': 'u' } };
    const { podSandboxId } = await cri.runtime.runPodSandbox({ config });
    const { imageRef } = await cri.images.pullImage({ image: { image: 'example.test/app:1' } });
    const { containerId } = await cri.runtime.createContainer({ podSandboxId, config: { metadata: { name: 'c' }, image: { image: imageRef } } });
    t += 1_000;
    await cri.runtime.startContainer({ containerId });
    t += 2_500;
    cri.exit(containerId, 7);
    const st = (await cri.runtime.containerStatus({ containerId })).status!;
    expect([st.createdAt, st.startedAt, st.finishedAt].map((n) => Math.floor(n / 1e6) - Date.UTC(2030, 0, 1))).toEqual([0, 1_000, 3_500]);
    expect(st).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 7, reason: 'Error' });
  });

  it('fails the next matching call with the status asked for, and holds a call until released', async () => {
    const cri = fake();
    cri.fail('listPodSandbox', grpc.status.UNAVAILABLE, 'runtime restarting');
    expect(grpcCode(await cri.runtime.listPodSandbox({}).catch((e) => e))).toBe(grpc.status.UNAVAILABLE);
    expect((await cri.runtime.listPodSandbox({})).items).toEqual([]);

    const gate = cri.hold('runPodSandbox');
    let done = false;
    const call = cri.runtime.runPodSandbox({ config: { metadata: { name: 'p', namespace: 'n', uid: 'u' } } }).then((r) => ((done = true), r));
    await gate.reached;
    await new Promise((r) => setImmediate(r));
    expect(done).toBe(false);
    expect(cri.sandboxes.size).toBe(0);
    gate.release();
    const { podSandboxId } = await call;
    expect(cri.sandboxes.has(podSandboxId)).toBe(true);
    expect(cri.callsOf('runPodSandbox')).toHaveLength(1);
  });

  it('sends container events to subscribers, and ends the stream as UNIMPLEMENTED when told it has none', async () => {
    const cri = fake();
    const seen: string[] = [];
    cri.containerEvents((e) => seen.push(e.containerEventType), () => undefined);
    const { podSandboxId } = await cri.runtime.runPodSandbox({ config: { metadata: { name: 'p', namespace: 'n', uid: 'u' } } });
    const { imageRef } = await cri.images.pullImage({ image: { image: 'example.test/app:1' } });
    const { containerId } = await cri.runtime.createContainer({ podSandboxId, config: { metadata: { name: 'c' }, image: { image: imageRef } } });
    await cri.runtime.startContainer({ containerId });
    await cri.runtime.removeContainer({ containerId });
    await new Promise((r) => setImmediate(r));
    expect(seen).toEqual(['CONTAINER_CREATED_EVENT', 'CONTAINER_STARTED_EVENT', 'CONTAINER_STOPPED_EVENT', 'CONTAINER_DELETED_EVENT']);

    const old = new FakeCri({ now: Date.now, events: false });
    const ended = await new Promise<Error | undefined>((resolve) => old.containerEvents(() => undefined, resolve));
    expect(grpcCode(ended)).toBe(grpc.status.UNIMPLEMENTED);
  });
});
