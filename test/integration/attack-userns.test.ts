/**
 * Pods in a user namespace, attacked from the host's other users, from the
 * pod itself and by a confused client, through the real daemon, runc and
 * kernel:
 * - the state dir is open to others (o+x) so that runc, inside the pod's user
 *   namespace, reaches the pod's rootfs: no other host user may follow it to
 *   a pod's rootfs, its idmapped volume clones or any pod's /dev/shm (the
 *   paths are all in /proc/self/mountinfo, readable by anyone);
 * - a pod's writable layer is counted in ContainerStats (the kubelet evicts
 *   on it), though its rootfs is mounted away from its upper dir;
 * - a read-only volume stays read-only for the pod's root even with
 *   CAP_SYS_ADMIN in its user namespace (it cannot remount it read-write);
 * - mappings onto the host's own users and groups (ids below 65536), or onto
 *   another running pod's host ids, are refused.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

const HOST_ID = 300000;
const range = (hostId = HOST_ID, length = 65536) => ({ hostId, containerId: 0, length });
const userns = (uids = range(), gids = range()) => ({ mode: 'POD' as const, uids: [uids], gids: [gids] });
/** An unprivileged host user: nobody. */
const NOBODY = 65534;

/** Runs `sh -c script` as the host's nobody; its exit code and output. */
function asNobody(script: string): { status: number | null; out: string } {
  const r = spawnSync('sh', ['-c', script], { uid: NOBODY, gid: NOBODY, encoding: 'utf8', timeout: 10_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

describe.skipIf(!isRoot)('pods with a user namespace, attacked', () => {
  let fx: PodFixture;
  let secretParent: string;
  let vol: string;
  let roVol: string;
  let pod: string;
  let podConfig: Record<string, unknown>;
  let plainPod: string;
  let ctr: string;

  function config(name: string, nsOpts: Record<string, unknown>) {
    return { metadata: { name, namespace: 'attack', uid: `uid-${name}`, attempt: 0 }, hostname: name, logDirectory: path.join(fx.dirs.base, 'logs', name), linux: { securityContext: { namespaceOptions: nsOpts } } };
  }

  async function exec(id: string, script: string): Promise<string> {
    const r = await fx.skiff.runtime.ExecSync({ containerId: id, cmd: ['sh', '-c', script], timeout: 20 });
    return Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString();
  }

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-attack-userns');
    // As the daemon would make it on a fresh node (and as user namespaces need): o+x all the way.
    for (const d of [fx.dirs.base, fx.dirs.state]) await fs.chmod(d, 0o711);
    await fx.skiff.stop();
    await fx.skiff.start();
    // A secret-like volume: its files are 0644, but the host keeps it below a 0700 directory
    // (as the kubelet keeps its pods' volumes under /var/lib/kubelet).
    secretParent = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-attack-userns-'));
    await fs.chmod(secretParent, 0o700);
    vol = path.join(secretParent, 'secret');
    await fs.mkdir(vol, { mode: 0o755 });
    await fs.writeFile(path.join(vol, 'token'), 'top-secret\n', { mode: 0o644 });
    roVol = path.join(secretParent, 'ro');
    await fs.mkdir(path.join(roVol, 'sub'), { recursive: true, mode: 0o755 });
    expect(spawnSync('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'sub', path.join(roVol, 'sub')]).status).toBe(0);
    podConfig = config('upod', { usernsOptions: userns() });
    pod = (await fx.skiff.runtime.RunPodSandbox({ config: podConfig })).podSandboxId!;
    ctr = (
      await fx.skiff.runtime.CreateContainer({
        podSandboxId: pod,
        config: { metadata: { name: 'c' }, image: { image: fx.image }, command: ['sh', '-c', 'echo in-rootfs > /etc/written-by-pod; exec sleep 100000'], logPath: 'c.log', mounts: [{ containerPath: '/secret', hostPath: vol, readonly: true }] },
        sandboxConfig: podConfig,
      })
    ).containerId!;
    await fx.skiff.runtime.StartContainer({ containerId: ctr });
    plainPod = (await fx.skiff.runtime.RunPodSandbox({ config: config('plain', {}) })).podSandboxId!;
  }, 120_000);

  afterAll(async () => {
    const leaks = fx ? await fx.cleanup() : { mounts: [], processes: [] };
    if (roVol) spawnSync('umount', [path.join(roVol, 'sub')]);
    if (secretParent) await fs.rm(secretParent, { recursive: true, force: true });
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  it("keeps other host users out of a pod's rootfs, idmapped volumes and /dev/shm", async () => {
    expect(await exec(ctr, 'cat /secret/token /etc/written-by-pod && touch /dev/shm/mine && echo shm-ok')).toBe('top-secret\nin-rootfs\nshm-ok\n');
    const root = path.join(fx.dirs.state, 'userns', ctr);
    // What any user learns from /proc/self/mountinfo: where the clone of the volume and the rootfs are.
    const seen = asNobody('cat /proc/self/mountinfo').out;
    expect(seen).toContain(`${root}/idmapped/0`);
    for (const p of [path.join(root, 'idmapped', '0', 'token'), path.join(root, 'rootfs', 'etc', 'written-by-pod'), path.join(root, 'rootfs', 'etc', 'passwd')]) {
      const r = asNobody(`cat '${p}'`);
      expect(r.out, p).not.toMatch(/top-secret|in-rootfs|root:x:0/);
      expect(r.status, p).not.toBe(0);
    }
    // Neither this pod's /dev/shm (1777, its root's) nor a pod's without a user namespace.
    for (const id of [pod, plainPod]) {
      const shm = path.join(fx.dirs.state, 'sandboxes', id, 'shm');
      const r = asNobody(`ls '${shm}' || true; touch '${shm}/planted-by-host-user' && echo planted`);
      expect(r.out, id).not.toMatch(/mine|planted$/m);
      await expect(fs.stat(path.join(shm, 'planted-by-host-user'))).rejects.toThrow(/ENOENT/);
      expect(asNobody(`cat '${path.join(fx.dirs.state, 'sandboxes', id, 'hosts')}'`).status, id).not.toBe(0);
    }
    // The pod's root still passes (a second container starts), and the host's root owns the way.
    const second = (
      await fx.skiff.runtime.CreateContainer({
        podSandboxId: pod,
        config: { metadata: { name: 'second' }, image: { image: fx.image }, command: ['sleep', '100000'], logPath: 'second.log', mounts: [{ containerPath: '/secret', hostPath: vol, readonly: true }] },
        sandboxConfig: podConfig,
      })
    ).containerId!;
    await fx.skiff.runtime.StartContainer({ containerId: second });
    expect(await exec(second, 'cat /secret/token; id -u')).toBe('top-secret\n0\n');
    for (const d of [root, path.join(fx.dirs.state, 'userns', second), path.join(fx.dirs.state, 'sandboxes', pod)]) {
      const st = await fs.stat(d);
      expect([st.uid, st.gid, st.mode & 0o777], d).toEqual([0, HOST_ID, 0o710]);
    }
    expect((await fs.stat(path.join(fx.dirs.state, 'sandboxes', plainPod))).mode & 0o777).toBe(0o700);
    // A pod without a user namespace still gets its files and /dev/shm through its 0700 dir.
    const plainConfig = config('plain', {});
    const plain = (
      await fx.skiff.runtime.CreateContainer({
        podSandboxId: plainPod,
        config: { metadata: { name: 'p' }, image: { image: fx.image }, command: ['sleep', '100000'], logPath: 'p.log' },
        sandboxConfig: plainConfig,
      })
    ).containerId!;
    await fx.skiff.runtime.StartContainer({ containerId: plain });
    expect(await exec(plain, 'cat /etc/hostname && touch /dev/shm/p && id -u')).toBe('plain\n0\n');
    await fx.skiff.runtime.StopContainer({ containerId: second, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: second });
  });

  it("keeps a read-only volume read-only for the pod's root, CAP_SYS_ADMIN and all", async () => {
    // A host directory the host's root owns, with a file only it may read and write, and a
    // submount (a plain read-only mount leaves submounts as they are; only `recursive_read_only` does not).
    await fs.writeFile(path.join(roVol, 'shadow'), 'host-owned\n', { mode: 0o600 });
    const id = (
      await fx.skiff.runtime.CreateContainer({
        podSandboxId: pod,
        config: {
          metadata: { name: 'admin' },
          image: { image: fx.image },
          command: ['sleep', '100000'],
          logPath: 'admin.log',
          mounts: [
            { containerPath: '/hostro', hostPath: roVol, readonly: true },
            // A file volume too, as the kubelet gives a configMap key.
            { containerPath: '/ro-file', hostPath: path.join(roVol, 'shadow'), readonly: true },
          ],
          // What a pod may be given in its own user namespace: CAP_SYS_ADMIN there, no seccomp.
          linux: { securityContext: { capabilities: { addCapabilities: ['SYS_ADMIN'] }, seccomp: { profileType: 'Unconfined' } } },
        },
        sandboxConfig: podConfig,
      })
    ).containerId!;
    await fx.skiff.runtime.StartContainer({ containerId: id });
    const out = await exec(id, 'cat /hostro/shadow; echo a > /hostro/shadow || echo refused; mount -o remount,bind,rw /hostro || echo no-remount; mount -o remount,rw /hostro || echo no-remount; echo pwned > /hostro/shadow || echo refused; cat /hostro/shadow; echo fine > /hostro/sub/f && cat /hostro/sub/f');
    expect(out, out).toMatch(/^host-owned\n/);
    expect(out).not.toMatch(/pwned/);
    expect(out.match(/no-remount/g)).toHaveLength(2);
    expect(out, out).toMatch(/\nhost-owned\nfine\n/);
    expect(await fs.readFile(path.join(roVol, 'shadow'), 'utf8')).toBe('host-owned\n');
    const file = await exec(id, 'mount -o remount,bind,rw /ro-file || echo no-remount; echo pwned > /ro-file || echo refused; cat /ro-file');
    expect(file, file).toMatch(/^no-remount\nrefused\nhost-owned\n/);
    expect(await fs.readFile(path.join(roVol, 'shadow'), 'utf8')).toBe('host-owned\n');
    await fx.skiff.runtime.StopContainer({ containerId: id, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: id });
  });

  it("counts a user-namespaced container's writable layer in its stats", async () => {
    await exec(ctr, 'dd if=/dev/zero of=/fill bs=1M count=6 2>/dev/null; sync');
    const st = await fx.skiff.runtime.ContainerStats({ containerId: ctr });
    const layer = st.stats?.writableLayer;
    expect(layer?.fsId?.mountpoint).toBe(path.join(fx.dirs.root, 'containers', ctr, 'upper'));
    expect(Number(layer?.usedBytes?.value ?? 0)).toBeGreaterThanOrEqual(6 << 20);
    const pods = await fx.skiff.runtime.PodSandboxStats({ podSandboxId: pod });
    expect(Number(pods.stats?.linux?.containers?.[0]?.writableLayer?.usedBytes?.value ?? 0)).toBeGreaterThanOrEqual(6 << 20);
  });

  it("refuses mappings onto the host's own users and groups, or another running pod's", async () => {
    const cases: Array<[string, Record<string, unknown>, RegExp]> = [
      ['daemon', userns(range(1)), /uid mapping's host ids start at 1, among the host's own users/],
      ['login', userns(range(1000)), /uid mapping's host ids start at 1000,/],
      ['disk', userns(range(), range(6)), /gid mapping's host ids start at 6,/],
      ['nobody', userns(range(65534, 2), range(65534, 2)), /start at 65534,/],
    ];
    for (const [name, u, message] of cases) {
      const r = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: config(`low-${name}`, { usernsOptions: u }) }));
      expect(r.code, name).toBe(grpc.status.INVALID_ARGUMENT);
      expect(r.details, name).toMatch(message);
    }
    const ids = ((await fx.skiff.runtime.ListPodSandbox({})).items ?? []).map((p) => p.id).sort();
    expect(ids).toEqual([pod, plainPod].sort());
    // Nor the host ids of another running pod (one kernel user for two pods), uid or gid.
    for (const [name, u, kind] of [
      ['same', userns(), 'uid'],
      ['inside', userns(range(HOST_ID + 1000, 10), range(900000)), 'uid'],
      ['gids', userns(range(900000), range(HOST_ID - 10, 11)), 'gid'],
    ] as const) {
      const r = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: config(`overlap-${name}`, { usernsOptions: u }) }));
      expect(r.code, name).toBe(grpc.status.INVALID_ARGUMENT);
      expect(r.details, name).toMatch(new RegExp(`the ${kind} mapping shares host ids with the user namespace of running pod sandbox ${pod}`));
    }
    // The same pod's next sandbox may have them (the kubelet keeps a pod's ids), and so may
    // another pod once this one is stopped.
    const again = (await fx.skiff.runtime.RunPodSandbox({ config: { ...podConfig, metadata: { ...(podConfig.metadata as object), attempt: 1 } } })).podSandboxId!;
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: again });
    const parked = (await fx.skiff.runtime.RunPodSandbox({ config: config('parked', { usernsOptions: userns(range(900000), range(900000)) }) })).podSandboxId!;
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: parked });
    const next = (await fx.skiff.runtime.RunPodSandbox({ config: config('next', { usernsOptions: userns(range(900000), range(900000)) }) })).podSandboxId!;
    // Two creates at once with the same new ids: one wins.
    const raced = await Promise.allSettled(['race-a', 'race-b'].map((n) => fx.skiff.runtime.RunPodSandbox({ config: config(n, { usernsOptions: userns(range(1_200_000), range(1_200_000)) }) })));
    expect(raced.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
    const winner = (raced.find((r) => r.status === 'fulfilled') as PromiseFulfilledResult<{ podSandboxId?: string }>).value.podSandboxId!;
    for (const id of [again, parked, next, winner]) await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: id });
    // The first block the kubelet would give is fine.
    const ok = (await fx.skiff.runtime.RunPodSandbox({ config: config('first-block', { usernsOptions: userns(range(65536), range(65536)) }) })).podSandboxId!;
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: ok });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: ok });
  });
});
