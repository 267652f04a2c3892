/**
 * A pod that holds CAP_NET_ADMIN in its own network namespace renames (or
 * deletes) its eth0. The bridge plugin's DEL then finds no interface, and so
 * no address, and leaves the pod's masquerade chain and its POSTROUTING jump
 * in the node's nat table: one set per such pod, without bound. That is
 * the plugin's per-pod masquerade (ipMasq), so the pods here run on an
 * operator's network list that asks for it; skiff's own network masquerades
 * the whole pod CIDR and has no rule per pod to leave. The daemon runs in a
 * network namespace of the test's own, with the real plugins.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { DaemonDirs, SkiffProcess } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import type { TestNetns } from '../helpers/netns.js';
import { mountsUnder, podConfig, startPodFixture, type PodFixture } from '../helpers/pods.js';

let seq = 0;
const nextPod = (dirs: DaemonDirs) => podConfig(dirs, `cnipod${++seq}`);

describe.skipIf(!isRoot)('a pod with CAP_NET_ADMIN against the node\'s nat table', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let image: string;

  let fx: PodFixture | undefined;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/cni-busybox', ['--cni-bin-dir', '/usr/lib/cni']);
    ({ dirs, skiff, ns, image } = fx);
    // Read at every RunPodSandbox: from here on the pods use it.
    await fs.writeFile(
      path.join(dirs.base, 'net.d', '10-masq.conflist'),
      JSON.stringify({
        cniVersion: '1.0.0',
        name: 'masq',
        plugins: [{ type: 'bridge', bridge: 'skmasq0', isGateway: true, ipMasq: true, ipam: { type: 'host-local', ranges: [[{ subnet: '10.66.0.0/24' }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: path.join(dirs.base, 'ipam') } }],
      }),
    );
  });

  afterAll(async () => {
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  function natTable(): string {
    const r = spawnSync('nsenter', [`--net=${ns.path}`, 'iptables-save', '-t', 'nat'], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`iptables-save: ${r.stderr}`);
    return r.stdout;
  }

  /** The lines of the nat table about a pod: its POSTROUTING jump, its chain's declaration and rules. */
  function podLines(id: string, chains: string[] = []): string[] {
    return natTable()
      .split('\n')
      .filter((l) => l.includes(id) || chains.some((c) => l.startsWith(`:${c} `) || l.startsWith(`-A ${c} `)));
  }

  /** The chains a pod's POSTROUTING rules jump to. */
  function podChains(id: string): string[] {
    return podLines(id)
      .filter((l) => l.startsWith('-A POSTROUTING '))
      .map((l) => / -j (\S+)/.exec(l)?.[1])
      .filter((c): c is string => !!c);
  }

  async function runPodWithNetAdmin() {
    const config = nextPod(dirs);
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId,
      config: {
        metadata: { name: 'netadmin' },
        image: { image },
        command: ['sleep', '1000'],
        linux: { securityContext: { capabilities: { addCapabilities: ['NET_ADMIN'] } } },
      },
      sandboxConfig: config,
    });
    await skiff.runtime.StartContainer({ containerId });
    return { id: podSandboxId!, containerId: containerId! };
  }

  async function exec(containerId: string, script: string): Promise<string> {
    const out = await skiff.runtime.ExecSync({ containerId, cmd: ['sh', '-c', script], timeout: 10 });
    expect(out.exitCode, Buffer.from(out.stderr ?? []).toString()).toBe(0);
    return Buffer.from(out.stdout ?? []).toString();
  }

  it('a pod that renames its eth0 leaves no nat rule or chain behind, and other pods keep theirs until they stop', async () => {
    const normal = await skiff.runtime.RunPodSandbox({ config: nextPod(dirs) });
    const normalId = normal.podSandboxId!;
    const normalChains = podChains(normalId);
    expect(normalChains, 'the normal pod has a masquerade chain').toHaveLength(1);
    const normalBefore = podLines(normalId, normalChains).sort();

    const hostile = await runPodWithNetAdmin();
    const hostileChains = podChains(hostile.id);
    expect(hostileChains, 'the hostile pod has a masquerade chain').toHaveLength(1);
    expect(podLines(hostile.id, hostileChains).length).toBeGreaterThanOrEqual(3);
    await exec(hostile.containerId, 'ip link set eth0 down && ip link set eth0 name foo0 && ip link show foo0 >/dev/null');

    await skiff.runtime.StopPodSandbox({ podSandboxId: hostile.id });
    expect(podLines(hostile.id, hostileChains), 'nat lines of the stopped pod').toEqual([]);
    // Nothing of the other pod went with it.
    expect(podLines(normalId, normalChains).sort()).toEqual(normalBefore);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: hostile.id });
    expect(podLines(hostile.id, hostileChains)).toEqual([]);
    expect(podLines(normalId, normalChains).sort()).toEqual(normalBefore);

    await skiff.runtime.StopPodSandbox({ podSandboxId: normalId });
    expect(podLines(normalId, normalChains), 'nat lines of the stopped normal pod').toEqual([]);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: normalId });
  });

  it('a pod that deletes its eth0 leaves nothing behind either', async () => {
    const hostile = await runPodWithNetAdmin();
    const chains = podChains(hostile.id);
    expect(chains).toHaveLength(1);
    await exec(hostile.containerId, 'ip link del eth0 && ! ip link show eth0 2>/dev/null');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: hostile.id });
    expect(podLines(hostile.id, chains)).toEqual([]);
  });

  it('the DEL of an orphaned pod at start removes the rules its renamed eth0 kept', async () => {
    const hostile = await runPodWithNetAdmin();
    const chains = podChains(hostile.id);
    expect(chains).toHaveLength(1);
    await exec(hostile.containerId, 'ip link set eth0 down && ip link set eth0 name foo0');
    // The container goes (the rename stays with the pinned namespace); then the daemon dies with the pod's record lost.
    await skiff.runtime.RemoveContainer({ containerId: hostile.containerId });
    await skiff.stop('SIGKILL');
    const Database = (await import('better-sqlite3')).default;
    const db = new Database(path.join(dirs.root, 'metadata.db'));
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(hostile.id);
    db.close();
    await skiff.start();
    expect(skiff.log).toMatch(/removing the remains of a pod sandbox with no record/);
    expect(podLines(hostile.id, chains)).toEqual([]);
    expect(mountsUnder(path.join(dirs.state, 'sandboxes', hostile.id))).toEqual([]);
  });

  it('a pod whose namespace pin is gone at stop leaves no rules either (DEL without a namespace)', async () => {
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config: nextPod(dirs) });
    const id = podSandboxId!;
    const chains = podChains(id);
    expect(chains).toHaveLength(1);
    const pin = path.join(dirs.state, 'sandboxes', id, 'ns', 'net');
    expect(spawnSync('umount', [pin]).status).toBe(0);
    await skiff.runtime.StopPodSandbox({ podSandboxId: id });
    expect(podLines(id, chains)).toEqual([]);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: id });
  });
});
