/**
 * AppArmor through a real agent and runtime on a host without it: a pod
 * that asks for a profile (pod or container securityContext, or the
 * deprecated annotation) is never started without it; it stays Pending with
 * the kubelet's reason AppArmor, its containers Blocked. Unconfined runs.
 */
import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';

const hostHasAppArmor = existsSync('/sys/kernel/security/apparmor');

describe.skipIf(!isRoot || hostHasAppArmor)('kubelet-lite: AppArmor on a host without it', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-apparmor');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const pod = (name: string, podSc: string, cSc: string, meta = '') =>
    podYaml(name, node.image, `  terminationGracePeriodSeconds: 1
${podSc}  containers:
  - name: main
    image: IMAGE
    command: [sleep, "3600"]
${cSc}`, meta);

  const cases: Array<[string, string, string, string]> = [
    ['podlevel', '  securityContext:\n    appArmorProfile:\n      type: RuntimeDefault\n', '', ''],
    ['ctrlevel', '', '    securityContext:\n      appArmorProfile:\n        type: Localhost\n        localhostProfile: k8s-deny-write\n', ''],
    ['annotated', '', '', '  annotations:\n    container.apparmor.security.beta.kubernetes.io/main: runtime/default\n'],
  ];

  it.each(cases)('%s: Pending with reason AppArmor and its container Blocked, never started', async (name, podSc, cSc, meta) => {
    await node.write(`${name}.yaml`, pod(name, podSc, cSc, meta));
    const p = await node.waitPod(name, (x) => x.status?.reason === 'AppArmor', 'refused for AppArmor');
    expect(p.status).toMatchObject({ phase: 'Pending', reason: 'AppArmor', message: 'Cannot enforce AppArmor: AppArmor is not enabled on the host' });
    expect(containerStatus(p, 'main')?.state).toEqual({ waiting: { reason: 'Blocked' } });
    // It stays so: nothing of it reaches the runtime.
    await new Promise((r) => setTimeout(r, 1500));
    expect((await node.pod(name))?.status?.reason).toBe('AppArmor');
    const sandboxes = await node.pods.skiff.runtime.ListPodSandbox({});
    expect((sandboxes.items ?? []).filter((s) => s.metadata?.name === name)).toEqual([]);
    await node.remove(`${name}.yaml`);
    await node.waitGone(name);
  });

  it('runs a pod that asks for Unconfined', async () => {
    await node.write('free.yaml', pod('free', '  securityContext:\n    appArmorProfile:\n      type: Unconfined\n', '', '  annotations:\n    container.apparmor.security.beta.kubernetes.io/main: unconfined\n'));
    await node.waitPod('free', ready, 'ready');
    await node.remove('free.yaml');
    await node.waitGone('free');
  });
});
