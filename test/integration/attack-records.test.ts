/**
 * Records answered from memory, changed by RPCs that race the container's
 * exit. An RPC that read the record, awaited the runtime, then saved its copy
 * must not put back a state the exit already replaced: such a lost update
 * leaves a dead container CONTAINER_RUNNING for good, since its exit has been
 * handled and nothing looks again (the kubelet never restarts it).
 *
 * The daemon's runc is a wrapper that takes half a second more over `update`
 * (a loaded node's runc), so the exit reliably lands while the update is
 * under way.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { spawnSync } from 'node:child_process';
import { leftBehind, podConfig } from '../helpers/pods.js';

/** Removes every pod, stops the daemon, and checks that nothing of it is left under `dirs`. */
async function teardown(skiff: SkiffProcess | undefined, ns: TestNetns | undefined, dirs: DaemonDirs | undefined, beforeCheck?: () => void): Promise<void> {
  if (skiff?.child) {
    const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
    for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
    await skiff.stop();
  }
  await ns?.destroy();
  beforeCheck?.();
  if (!dirs) return;
  const { mounts, processes: procs } = await leftBehind(dirs.base);
  await fs.rm(dirs.base, { recursive: true, force: true });
  expect(mounts, 'mounts left behind').toEqual([]);
  expect(procs, 'processes left behind').toEqual([]);
}

/** A pod with one container running `command`, started. */
async function podRunning(skiff: SkiffProcess, dirs: DaemonDirs, image: string, n: string, command: string[]): Promise<{ pod: string; id: string }> {
  const config = podConfig(dirs, n);
  const pod = (await skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
  const id = (
    await skiff.runtime.CreateContainer({
      podSandboxId: pod,
      config: { metadata: { name: 'short' }, image: { image }, command, logPath: 'short.log' },
      sandboxConfig: config,
    })
  ).containerId!;
  await skiff.runtime.StartContainer({ containerId: id });
  return { pod, id };
}

describe.skipIf(!isRoot)('container records against racing RPCs', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let image: string;

  beforeAll(async () => {
    const reg = inject('registryHost');
    await new Pusher(`http://${reg}`).image('test/records-busybox', 'v1', await busyboxImage());
    image = `${reg}/test/records-busybox:v1`;
    dirs = await makeDirs();
    const real = spawnSync('sh', ['-c', 'command -v runc'], { encoding: 'utf8' }).stdout.trim();
    if (!real) throw new Error('runc not found');
    const bin = path.join(dirs.base, 'slow-bin');
    await fs.mkdir(bin);
    await fs.writeFile(
      path.join(bin, 'runc'),
      `#!/bin/sh\nfor a in "$@"; do if [ "$a" = update ]; then ${real} "$@"; rc=$?; sleep 0.5; exit $rc; fi; done\nexec ${real} "$@"\n`,
      { mode: 0o755 },
    );
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns.wrap(['env', `PATH=${bin}:${process.env.PATH}`, ...a])).start();
    await skiff.images.PullImage({ image: { image } });
  });

  afterAll(() => teardown(skiff, ns, dirs));

  it('UpdateContainerResources racing the container\'s exit never brings back CONTAINER_RUNNING', async () => {
    const { pod, id } = await podRunning(skiff, dirs, image, 'records', ['sleep', '0.3']);
    // runc's update finds it running; it exits while runc's wrapper still takes its time.
    await skiff.runtime.UpdateContainerResources({ containerId: id, linux: { cpuShares: 512 } });
    const st = (await skiff.runtime.ContainerStatus({ containerId: id })).status!;
    expect(st.state).toBe('CONTAINER_EXITED');
    expect(st.exitCode).toBe(0);
    // What it was updated to is kept all the same.
    const verbose = JSON.parse((await skiff.runtime.ContainerStatus({ containerId: id, verbose: true })).info!.info!);
    expect(verbose.runtimeSpec.linux.resources.cpu.shares).toBe(512);
    expect(skiff.log).not.toContain('crash guard');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod });
  });

  it('a StartContainer or UpdateContainerResources that waited behind RemoveContainer answers NotFound, not a TypeError', async () => {
    const config = podConfig(dirs, 'records-gone');
    const pod = (await skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const create = async (name: string) =>
      (
        await skiff.runtime.CreateContainer({
          podSandboxId: pod,
          config: { metadata: { name }, image: { image }, command: ['sleep', '1000'], logPath: `${name}.log` },
          sandboxConfig: config,
        })
      ).containerId!;
    // A running container: the first update holds its lock for half a second (the slow runc).
    const running = await create('running');
    await skiff.runtime.StartContainer({ containerId: running });
    const created = await create('created');
    const results = await Promise.allSettled([
      skiff.runtime.UpdateContainerResources({ containerId: running, linux: { cpuShares: 300 } }),
      skiff.runtime.RemoveContainer({ containerId: running }),
      skiff.runtime.UpdateContainerResources({ containerId: running, linux: { cpuShares: 400 } }),
      skiff.runtime.RemoveContainer({ containerId: created }),
      skiff.runtime.StartContainer({ containerId: created }),
    ]);
    const failures = results.flatMap((r) => (r.status === 'rejected' ? [r.reason as { code: number; details: string }] : []));
    for (const e of failures) {
      expect(e.details).not.toMatch(/Cannot read properties|TypeError/);
      expect(e.code, e.details).toBe(grpc.status.NOT_FOUND);
    }
    // The update that came after the removal, at least, found nothing.
    expect(results[2]!.status).toBe('rejected');
    expect((await skiff.runtime.ListContainers({ filter: { podSandboxId: pod } })).containers ?? []).toEqual([]);
    expect(skiff.log).not.toContain('crash guard');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod });
  });
});

/**
 * A container exits while the disk under --root is full (a pod can fill it
 * itself: its writable layer lives there). Recording the exit cannot write
 * the metadata database; that failure reached the crash guard, and the
 * container stayed CONTAINER_RUNNING for good, even once there was room.
 */
describe.skipIf(!isRoot)('a container exit on a full disk', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let image: string;
  let mounted = false;
  const filler = () => path.join(dirs.root, 'filler');

  beforeAll(async () => {
    const reg = inject('registryHost');
    await new Pusher(`http://${reg}`).image('test/records-full-busybox', 'v1', await busyboxImage());
    image = `${reg}/test/records-full-busybox:v1`;
    dirs = await makeDirs();
    await fs.mkdir(dirs.root, { recursive: true });
    const m = spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=8m,mode=0700', 'tmpfs', dirs.root], { encoding: 'utf8' });
    if (m.status !== 0) throw new Error(`mount tmpfs: ${m.stderr}`);
    mounted = true;
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns.wrap(a)).start();
    await skiff.images.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (dirs) await fs.rm(filler(), { force: true }).catch(() => undefined);
    await teardown(skiff, ns, dirs, () => {
      if (mounted) spawnSync('umount', ['-l', dirs.root]);
    });
  });

  it('is recorded once there is room again, and never reaches the crash guard', async () => {
    const { pod, id } = await podRunning(skiff, dirs, image, 'fullexit', ['sleep', '1']);
    // Fill every block left under --root; the container exits meanwhile.
    spawnSync('dd', ['if=/dev/zero', `of=${filler()}`, 'bs=64k']);
    await new Promise((r) => setTimeout(r, 2_000));
    // No room: still running as far as the record goes (it cannot be written), but nothing escaped.
    expect(skiff.log).toContain('could not record a container exit');
    await fs.rm(filler(), { force: true });
    const deadline = Date.now() + 5_000;
    let state = '';
    while (Date.now() < deadline) {
      state = String((await skiff.runtime.ContainerStatus({ containerId: id })).status!.state);
      if (state === 'CONTAINER_EXITED') break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(state).toBe('CONTAINER_EXITED');
    expect((await skiff.runtime.ContainerStatus({ containerId: id })).status!.exitCode).toBe(0);
    expect(skiff.log).not.toContain('crash guard');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod });
  });
});
