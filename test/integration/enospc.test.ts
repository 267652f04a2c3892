/**
 * A full disk: the daemon's --root is a small tmpfs. A pull whose blob does
 * not fit, a layer that does not fit once unpacked, and a CreateContainer on
 * a disk with no blocks or inodes left each fail with RESOURCE_EXHAUSTED
 * naming the path, leave no partial blob, snapshot or record, and the same
 * call succeeds once there is room again.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { buildImage, Pusher, type BuiltImage } from '../helpers/oci.js';
import { mountsUnder, processesMentioning } from '../helpers/pods.js';

const ls = (d: string) => (fs.existsSync(d) ? fs.readdirSync(d) : []);

function sh(cmd: string, args: string[]): void {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
}

describe.skipIf(!isRoot)('a full disk under --root', () => {
  let dirs: DaemonDirs;
  let ns: TestNetns;
  let skiff: SkiffProcess;
  let reg: string;
  let busybox: string;
  /** One 12 MiB layer of random bytes: its blob alone does not fit in 8 MiB. */
  let bigBlob: BuiltImage;
  /** One layer of 12 MiB of zeros: a tiny blob that does not fit once unpacked. */
  let bigUnpacked: BuiltImage;
  let mounted = false;

  const remount = (size: string) => sh('mount', ['-o', `remount,size=${size}`, dirs.root]);

  beforeAll(async () => {
    reg = inject('registryHost');
    const push = new Pusher(`http://${reg}`);
    await push.image('test/nospace-busybox', 'v1', await busyboxImage());
    busybox = `${reg}/test/nospace-busybox:v1`;
    bigBlob = await buildImage({ layers: [{ entries: [{ name: 'random', data: randomBytes(12 << 20) }] }] });
    await push.image('test/nospace-bigblob', 'v1', bigBlob);
    bigUnpacked = await buildImage({ layers: [{ entries: [{ name: 'zeros', data: Buffer.alloc(12 << 20) }] }] });
    await push.image('test/nospace-bigunpack', 'v1', bigUnpacked);
    dirs = await makeDirs();
    await fsp.mkdir(dirs.root, { recursive: true });
    sh('mount', ['-t', 'tmpfs', '-o', 'size=8m,nr_inodes=4000,mode=0700', 'tmpfs', dirs.root]);
    mounted = true;
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fsp.mkdir(path.join(dirs.base, 'net.d'));
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns.wrap(a)).start();
    await skiff.images.PullImage({ image: { image: busybox } });
  });

  afterAll(async () => {
    if (skiff?.child) {
      await fsp.rm(path.join(dirs.root, 'filler'), { recursive: true, force: true }).catch(() => undefined);
      const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await skiff.stop();
    }
    await ns?.destroy();
    if (mounted) spawnSync('umount', ['-l', dirs.root]);
    const mounts = dirs ? mountsUnder(dirs.base) : [];
    const procs = dirs ? processesMentioning(dirs.base) : [];
    if (dirs) await fsp.rm(dirs.base, { recursive: true, force: true });
    expect(mounts, 'mounts left behind').toEqual([]);
    expect(procs, 'processes left behind').toEqual([]);
  });

  /** What is on disk: blobs, snapshot dirs, and nothing half-written. */
  function store() {
    return {
      blobs: ls(path.join(dirs.root, 'content', 'blobs', 'sha256')).sort(),
      snapshots: ls(path.join(dirs.root, 'snapshots')).sort(),
      ingest: ls(path.join(dirs.root, 'content', 'ingest')),
      work: ls(path.join(dirs.root, 'snapshots-work')),
    };
  }

  async function imageIds(): Promise<string[]> {
    return ((await skiff.images.ListImages({})).images ?? []).map((i) => i.id!);
  }

  async function expectFullThenRoom(image: BuiltImage, ref: string, what: RegExp): Promise<void> {
    const before = store();
    const err = await codeOf(skiff.images.PullImage({ image: { image: ref } }));
    console.log(`full disk: ${err.details}`);
    expect(err.code, err.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(err.details).toMatch(/no space left on device/);
    expect(err.details).toMatch(what);
    expect(err.details, 'names the path').toContain(dirs.root);
    // Nothing partial: the store is as it was, and the image is not listed.
    expect(store()).toEqual(before);
    expect(await imageIds()).not.toContain(image.config.digest);
    // The daemon keeps serving, and the same pull works once there is room.
    remount('64m');
    try {
      await skiff.images.PullImage({ image: { image: ref } });
      expect(await imageIds()).toContain(image.config.digest);
      await skiff.images.RemoveImage({ image: { image: ref } });
      expect(store()).toEqual(before);
    } finally {
      remount('8m');
    }
  }

  it('a pull whose blob does not fit fails RESOURCE_EXHAUSTED, leaves nothing, and works with room', async () => {
    await expectFullThenRoom(bigBlob, `${reg}/test/nospace-bigblob:v1`, new RegExp(bigBlob.layers[0]!.digest));
  });

  it('an unpack that does not fit fails RESOURCE_EXHAUSTED, leaves nothing, and works with room', async () => {
    await expectFullThenRoom(bigUnpacked, `${reg}/test/nospace-bigunpack:v1`, /unpack/);
  });

  it('a CreateContainer on a full disk fails RESOURCE_EXHAUSTED, leaves nothing, and works once space is freed', async () => {
    const config = {
      metadata: { name: 'nospace', namespace: 'test', uid: 'uid-nospace', attempt: 0 },
      hostname: 'nospace',
      logDirectory: path.join(dirs.base, 'logs'),
      linux: {},
    };
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    const cconf = { metadata: { name: 'c' }, image: { image: busybox }, command: ['sleep', '1000'], linux: {} };
    // Fill the blocks, then the inodes.
    const filler = path.join(dirs.root, 'filler');
    await fsp.mkdir(filler);
    spawnSync('dd', ['if=/dev/zero', `of=${path.join(filler, 'blocks')}`, 'bs=64k'], { encoding: 'utf8' });
    for (let i = 0; ; i++) {
      try {
        fs.writeFileSync(path.join(filler, `i${i}`), '');
      } catch {
        break;
      }
    }
    const containersDir = path.join(dirs.root, 'containers');
    const err = await codeOf(skiff.runtime.CreateContainer({ podSandboxId, config: cconf, sandboxConfig: config }));
    console.log(`full disk: ${err.details}`);
    expect(err.code, err.details).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(err.details).toMatch(/no space left on device/);
    expect(err.details, 'names the path').toContain(dirs.root);
    expect((await skiff.runtime.ListContainers({})).containers ?? []).toEqual([]);
    expect(ls(containersDir)).toEqual([]);
    expect(mountsUnder(containersDir)).toEqual([]);
    await fsp.rm(filler, { recursive: true, force: true });
    const { containerId } = await skiff.runtime.CreateContainer({ podSandboxId, config: cconf, sandboxConfig: config });
    await skiff.runtime.StartContainer({ containerId: containerId! });
    await skiff.runtime.RemovePodSandbox({ podSandboxId: podSandboxId! });
    expect(ls(containersDir)).toEqual([]);
  });
});
