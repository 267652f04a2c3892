/**
 * What the node agent relies on from any CRI runtime, as checks that take
 * the endpoint: state transitions, labels and attempts kept, list filters,
 * and the codes of calls on what is not there. The fake runtime runs them
 * in test/unit/kubelet-fake-cri.test.ts; a real runtime passes them too.
 */
import * as grpc from '@grpc/grpc-js';
import { expect } from 'vitest';
import type { CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import { grpcCode } from '../../src/kubelet-lite/cri-client.js';

export interface ContractTarget {
  cri: CriEndpoint;
  /** An image the runtime has (or pulls). */
  image: string;
  /** A command that keeps the container running until it is stopped. */
  command: string[];
  /** Where the sandbox's logs go (a directory the runtime may write). */
  logDirectory: string;
}

const codeOf = async (p: Promise<unknown>) => p.then(() => 'ok' as const, (err) => grpc.status[grpcCode(err) ?? grpc.status.UNKNOWN]);

export interface ContractCheck {
  name: string;
  run(t: ContractTarget): Promise<void>;
}

function sandboxConfig(t: ContractTarget, uid: string, attempt = 0) {
  return {
    metadata: { name: `contract-${uid}`, namespace: 'contract', uid, attempt },
    logDirectory: t.logDirectory,
    labels: { 'io.kubernetes.pod.uid': uid, 'test.skiff/contract': 'yes' },
    annotations: { 'test.skiff/note': 'kept' },
    linux: {},
  };
}

async function sandboxAndContainer(t: ContractTarget, uid: string) {
  const config = sandboxConfig(t, uid);
  const { podSandboxId } = await t.cri.runtime.runPodSandbox({ config });
  const { imageRef } = await t.cri.images.pullImage({ image: { image: t.image }, sandboxConfig: config });
  const { containerId } = await t.cri.runtime.createContainer({
    podSandboxId,
    config: {
      metadata: { name: 'c', attempt: 2 },
      image: { image: imageRef },
      command: t.command,
      labels: { 'io.kubernetes.pod.uid': uid, 'io.kubernetes.container.name': 'c' },
      annotations: { 'io.kubernetes.container.restartCount': '2' },
      logPath: 'c/2.log',
    },
    sandboxConfig: config,
  });
  return { podSandboxId, containerId };
}

export const CRI_CONTRACT: ContractCheck[] = [
  {
    name: 'a sandbox is READY with its metadata, labels and annotations, found by label selector, and a second one of the same name and attempt is refused',
    async run(t) {
      const config = sandboxConfig(t, 'u-sb');
      const { podSandboxId } = await t.cri.runtime.runPodSandbox({ config });
      const st = (await t.cri.runtime.podSandboxStatus({ podSandboxId })).status!;
      expect(st.state).toBe('SANDBOX_READY');
      expect(st.metadata).toMatchObject({ name: 'contract-u-sb', namespace: 'contract', uid: 'u-sb', attempt: 0 });
      expect(st.labels).toMatchObject(config.labels);
      expect(st.annotations).toMatchObject(config.annotations);
      expect(st.createdAt).toBeGreaterThan(0);
      const found = await t.cri.runtime.listPodSandbox({ filter: { labelSelector: { 'io.kubernetes.pod.uid': 'u-sb' } } });
      expect(found.items.map((s) => s.id)).toEqual([podSandboxId]);
      const none = await t.cri.runtime.listPodSandbox({ filter: { labelSelector: { 'io.kubernetes.pod.uid': 'u-sb', 'test.skiff/contract': 'no' } } });
      expect(none.items).toEqual([]);
      expect(await codeOf(t.cri.runtime.runPodSandbox({ config }))).not.toBe('ok');
      const again = await t.cri.runtime.runPodSandbox({ config: sandboxConfig(t, 'u-sb', 1) });
      expect(again.podSandboxId).not.toBe(podSandboxId);
      await t.cri.runtime.stopPodSandbox({ podSandboxId });
      expect((await t.cri.runtime.podSandboxStatus({ podSandboxId })).status?.state).toBe('SANDBOX_NOTREADY');
      for (const id of [podSandboxId, again.podSandboxId]) await t.cri.runtime.removePodSandbox({ podSandboxId: id });
    },
  },
  {
    name: 'a container goes CREATED → RUNNING → EXITED with its timestamps, keeping attempt, labels and annotations',
    async run(t) {
      const { podSandboxId, containerId } = await sandboxAndContainer(t, 'u-ct');
      const created = (await t.cri.runtime.containerStatus({ containerId })).status!;
      expect(created).toMatchObject({ state: 'CONTAINER_CREATED', metadata: { name: 'c', attempt: 2 }, startedAt: 0, finishedAt: 0 });
      expect(created.labels).toMatchObject({ 'io.kubernetes.pod.uid': 'u-ct' });
      expect(created.annotations).toMatchObject({ 'io.kubernetes.container.restartCount': '2' });
      await t.cri.runtime.startContainer({ containerId });
      const running = (await t.cri.runtime.containerStatus({ containerId })).status!;
      expect(running.state).toBe('CONTAINER_RUNNING');
      expect(running.startedAt).toBeGreaterThanOrEqual(created.createdAt);
      expect(await codeOf(t.cri.runtime.startContainer({ containerId }))).not.toBe('ok');
      await t.cri.runtime.stopContainer({ containerId, timeout: 1 });
      const exited = (await t.cri.runtime.containerStatus({ containerId })).status!;
      expect(exited.state).toBe('CONTAINER_EXITED');
      expect(exited.finishedAt).toBeGreaterThanOrEqual(running.startedAt);
      expect(exited.exitCode).not.toBe(0);
      // Stopping what has stopped is success.
      expect(await codeOf(t.cri.runtime.stopContainer({ containerId, timeout: 1 }))).toBe('ok');
      await t.cri.runtime.removePodSandbox({ podSandboxId });
    },
  },
  {
    name: 'containers are listed by sandbox id, label selector and state',
    async run(t) {
      const { podSandboxId, containerId } = await sandboxAndContainer(t, 'u-list');
      const ids = async (filter: Record<string, unknown>) => (await t.cri.runtime.listContainers({ filter })).containers.map((c) => c.id);
      expect(await ids({ podSandboxId })).toEqual([containerId]);
      expect(await ids({ labelSelector: { 'io.kubernetes.pod.uid': 'u-list' } })).toEqual([containerId]);
      expect(await ids({ labelSelector: { 'io.kubernetes.pod.uid': 'u-none' } })).toEqual([]);
      expect(await ids({ podSandboxId, state: { state: 'CONTAINER_RUNNING' } })).toEqual([]);
      expect(await ids({ podSandboxId, state: { state: 'CONTAINER_CREATED' } })).toEqual([containerId]);
      const [c] = (await t.cri.runtime.listContainers({ filter: { id: containerId } })).containers;
      expect(c).toMatchObject({ podSandboxId, metadata: { name: 'c', attempt: 2 } });
      expect(c?.annotations).toMatchObject({ 'io.kubernetes.container.restartCount': '2' });
      // Removing the sandbox removes its containers.
      await t.cri.runtime.removePodSandbox({ podSandboxId });
      expect(await ids({ labelSelector: { 'io.kubernetes.pod.uid': 'u-list' } })).toEqual([]);
    },
  },
  {
    name: 'status of what is not there is NotFound; stop and remove of it are success',
    async run(t) {
      const gone = 'f'.repeat(64);
      expect(await codeOf(t.cri.runtime.containerStatus({ containerId: gone }))).toBe('NOT_FOUND');
      expect(await codeOf(t.cri.runtime.podSandboxStatus({ podSandboxId: gone }))).toBe('NOT_FOUND');
      expect(await codeOf(t.cri.runtime.removeContainer({ containerId: gone }))).toBe('ok');
      expect(await codeOf(t.cri.runtime.stopPodSandbox({ podSandboxId: gone }))).toBe('ok');
      expect(await codeOf(t.cri.runtime.removePodSandbox({ podSandboxId: gone }))).toBe('ok');
      expect((await t.cri.images.imageStatus({ image: { image: 'example.test/never-pulled:0' } })).image).toBeNull();
    },
  },
];
