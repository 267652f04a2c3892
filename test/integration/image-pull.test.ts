import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { lgetxattr } from '../../src/sys/libc.js';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { buildImage, buildIndex, Pusher, sha256, tarOf, type Entry } from '../helpers/oci.js';

const cap = Buffer.from('0100000220000000000000000000000000000000', 'hex'); // cap_net_bind_service, effective
const mtime = new Date('2021-03-04T05:06:07Z');

const base: Entry[] = [
  { name: 'bin/', type: 'directory' },
  { name: 'bin/tool', data: '#!/bin/sh\necho tool\n', mode: 0o4755, uid: 0, gid: 0, mtime },
  { name: 'etc/', type: 'directory' },
  { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n' },
  { name: 'etc/owned', data: 'owned', uid: 1234, gid: 5678, mode: 0o640 },
  { name: 'etc/gone', data: 'to be whited out' },
  { name: 'opaque/', type: 'directory' },
  { name: 'opaque/old', data: 'hidden by an opaque dir above' },
  { name: 'data/', type: 'directory' },
  { name: 'data/original', data: 'linked' },
  { name: 'data/hard', type: 'link', linkname: 'data/original' },
  { name: 'data/sym', type: 'symlink', linkname: '../etc/passwd' },
  { name: 'data/abs-sym', type: 'symlink', linkname: '/etc/passwd' },
  { name: 'dev/', type: 'directory' },
  { name: 'dev/null', type: 'character-device', devmajor: 1, devminor: 3, mode: 0o666 },
  { name: 'dev/fifo', type: 'fifo', mode: 0o600 },
  { name: 'caps/', type: 'directory' },
  { name: 'caps/ping', data: 'binary', mode: 0o755, xattrs: { 'security.capability': cap, 'user.note': Buffer.from('hello') } },
];
const upper: Entry[] = [
  { name: 'etc/.wh.gone', data: '' },
  { name: 'opaque/', type: 'directory' },
  { name: 'opaque/.wh..wh..opq', data: '' },
  { name: 'opaque/new', data: 'new' },
  { name: 'data/hard-lower', type: 'link', linkname: 'data/original' },
];

describe.skipIf(!isRoot)('PullImage: what lands on disk', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: string;
  let push: Pusher;

  beforeAll(async () => {
    reg = inject('registryHost');
    push = new Pusher(`http://${reg}`);
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  async function snapshotDirs(imageId: string): Promise<string[]> {
    const res = await skiff.images.ImageStatus({ image: { image: imageId }, verbose: true });
    const info = JSON.parse(res.info!.info!) as { chainID: string };
    expect(info.chainID).toMatch(/^sha256:/);
    // Snapshot dirs are numbered in commit order under <root>/snapshots.
    const names = (await fs.readdir(path.join(dirs.root, 'snapshots'))).sort((a, b) => Number(a) - Number(b));
    return names.map((n) => path.join(dirs.root, 'snapshots', n, 'fs'));
  }

  it('unpacks an OCI image with whiteouts, opaque dirs, links, devices, owners, modes, xattrs and mtimes', async () => {
    const img = await buildImage({ layers: [{ entries: base }, { entries: upper }], config: { config: { User: 'app', Cmd: ['sh'] } } });
    await push.image('test/content', 'v1', img);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/content:v1` } });
    expect(res.imageRef).toBe(img.config.digest);

    const [lower, top] = await snapshotDirs(res.imageRef!);
    expect(lower).toBeDefined();
    expect(top).toBeDefined();
    // Layer 1: ordinary entries.
    const tool = await fs.lstat(path.join(lower!, 'bin/tool'));
    expect(tool.mode & 0o7777).toBe(0o4755);
    expect(tool.mtime.toISOString()).toBe(mtime.toISOString());
    const owned = await fs.lstat(path.join(lower!, 'etc/owned'));
    expect([owned.uid, owned.gid, owned.mode & 0o777]).toEqual([1234, 5678, 0o640]);
    const orig = await fs.lstat(path.join(lower!, 'data/original'));
    const hard = await fs.lstat(path.join(lower!, 'data/hard'));
    expect(hard.ino).toBe(orig.ino);
    expect(await fs.readlink(path.join(lower!, 'data/sym'))).toBe('../etc/passwd');
    expect(await fs.readlink(path.join(lower!, 'data/abs-sym'))).toBe('/etc/passwd');
    const devnull = await fs.lstat(path.join(lower!, 'dev/null'));
    expect(devnull.isCharacterDevice()).toBe(true);
    expect(devnull.rdev).toBe((1 << 8) | 3);
    expect((await fs.lstat(path.join(lower!, 'dev/fifo'))).isFIFO()).toBe(true);
    expect(lgetxattr(path.join(lower!, 'caps/ping'), 'security.capability')).toEqual(cap);
    expect(lgetxattr(path.join(lower!, 'caps/ping'), 'user.note')?.toString()).toBe('hello');
    // Layer 2: overlayfs forms of whiteouts and opaque dirs.
    const wh = await fs.lstat(path.join(top!, 'etc/gone'));
    expect(wh.isCharacterDevice()).toBe(true);
    expect(wh.rdev).toBe(0);
    expect(lgetxattr(path.join(top!, 'opaque'), 'trusted.overlay.opaque')?.toString()).toBe('y');
    expect(await fs.readFile(path.join(top!, 'opaque/new'), 'utf8')).toBe('new');
    // A hardlink to a lower layer's file is copied up, as overlayfs would.
    expect(await fs.readFile(path.join(top!, 'data/hard-lower'), 'utf8')).toBe('linked');
    await expect(fs.lstat(path.join(top!, 'etc/passwd'))).rejects.toThrow(/ENOENT/);
  });

  it('unpacks on a layer thread that is gone ten seconds after the pull, leaving the idle daemon none', async () => {
    const layerThreads = async () => {
      const pid = skiff.child.pid!;
      let n = 0;
      for (const t of await fs.readdir(`/proc/${pid}/task`)) {
        const comm = await fs.readFile(`/proc/${pid}/task/${t}/comm`, 'utf8').catch(() => '');
        if (comm.trim() === 'skiff-layers') n++;
      }
      return n;
    };
    // Earlier pulls' thread has had time to end.
    for (let i = 0; i < 150 && (await layerThreads()) > 0; i++) await new Promise((r) => setTimeout(r, 100));
    expect(await layerThreads()).toBe(0);
    const img = await buildImage({ layers: [{ entries: [{ name: 'a', data: 'a' }] }, { entries: [{ name: 'b', data: 'b' }] }] });
    await push.image('test/thread', 'v1', img);
    await skiff.images.PullImage({ image: { image: `${reg}/test/thread:v1` } });
    // Both layers ran on one thread, which waits a little for more work.
    expect(await layerThreads()).toBe(1);
    const t0 = Date.now();
    while ((await layerThreads()) > 0 && Date.now() - t0 < 15_000) await new Promise((r) => setTimeout(r, 100));
    expect(await layerThreads()).toBe(0);
    expect(Date.now() - t0).toBeGreaterThan(5000);
  });

  it('pulls Docker schema 2 images and reports user, size, tags and digests', async () => {
    const img = await buildImage({ format: 'docker', layers: [{ entries: [{ name: 'hello', data: 'docker' }] }], config: { config: { User: '1000:1000' } } });
    const digest = await push.image('test/docker', 'v2', img);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/docker:v2` } });
    expect(res.imageRef).toBe(img.config.digest);
    const st = await skiff.images.ImageStatus({ image: { image: `${reg}/test/docker:v2` } });
    expect(st.image?.id).toBe(img.config.digest);
    expect(st.image?.repoTags).toEqual([`${reg}/test/docker:v2`]);
    expect(st.image?.repoDigests).toEqual([`${reg}/test/docker@${digest}`]);
    expect(st.image?.uid?.value).toBe(1000);
    expect(st.image?.username).toBe('');
    expect(Number(st.image?.size)).toBe(img.manifest.data.length + img.config.data.length + img.layers[0]!.data.length);
  });

  it('handles gzip, zstd and uncompressed layers in one image', async () => {
    const img = await buildImage({
      layers: [
        { entries: [{ name: 'a', data: 'gzip' }], compression: 'gzip' },
        { entries: [{ name: 'b', data: 'zstd' }], compression: 'zstd' },
        { entries: [{ name: 'c', data: 'plain' }], compression: 'none' },
      ],
    });
    await push.image('test/compression', 'v1', img);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/compression:v1` } });
    expect(res.imageRef).toBe(img.config.digest);
    const st = await skiff.images.ImageStatus({ image: { image: res.imageRef! }, verbose: true });
    expect(JSON.parse(st.info!.info!).imageSpec.rootfs.diff_ids).toEqual(img.diffIds);
  });

  it('picks this machine\'s platform from an index and refuses an index without it', async () => {
    const amd = await buildImage({ architecture: 'amd64', layers: [{ entries: [{ name: 'arch', data: 'amd64' }] }] });
    const arm = await buildImage({ architecture: 'arm64', layers: [{ entries: [{ name: 'arch', data: 'arm64' }] }] });
    const s390 = await buildImage({ architecture: 's390x', layers: [{ entries: [{ name: 'arch', data: 's390x' }] }] });
    const index = buildIndex([
      { image: arm, platform: { os: 'linux', architecture: 'arm64', variant: 'v8' } },
      { image: amd, platform: { os: 'linux', architecture: 'amd64' } },
      { image: s390, platform: { os: 'linux', architecture: 's390x' } },
    ]);
    const indexDigest = await push.index('test/multi', 'v1', [amd, arm, s390], index);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/multi:v1` } });
    const want = process.arch === 'arm64' ? arm : amd;
    expect(res.imageRef).toBe(want.config.digest);
    const st = await skiff.images.ImageStatus({ image: { image: `${reg}/test/multi:v1` } });
    expect(st.image?.repoDigests).toEqual([`${reg}/test/multi@${indexDigest}`]);

    const only = buildIndex([{ image: s390, platform: { os: 'linux', architecture: 's390x' } }], 'docker');
    await push.index('test/multi-other', 'v1', [s390], only);
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/multi-other:v1` } }));
    expect(err.code).toBe(grpc.status.NOT_FOUND);
    expect(err.details).toMatch(/no image for platform linux\/(amd64|arm64).*linux\/s390x/);
  });

  it('pulls by digest and by tag@digest, and names the image by that digest', async () => {
    const img = await buildImage({ layers: [{ entries: [{ name: 'pinned', data: 'yes' }] }] });
    const digest = await push.image('test/pinned', 'v1', img);
    const byDigest = await skiff.images.PullImage({ image: { image: `${reg}/test/pinned@${digest}` } });
    expect(byDigest.imageRef).toBe(img.config.digest);
    const both = await skiff.images.PullImage({ image: { image: `${reg}/test/pinned:v1@${digest}` } });
    expect(both.imageRef).toBe(img.config.digest);
    const st = await skiff.images.ImageStatus({ image: { image: `${reg}/test/pinned@${digest}` } });
    expect(st.image?.repoDigests).toContain(`${reg}/test/pinned@${digest}`);
    const wrong = sha256('not this one');
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/pinned@${wrong}` } }));
    expect(err.code).toBe(grpc.status.NOT_FOUND);
  });

  it('refuses malformed references with INVALID_ARGUMENT and says why', async () => {
    for (const bad of ['', 'docker.io/library/UPPER', 'name:tag:extra!', 'x@sha256:short', 'a//b']) {
      const err = await codeOf(skiff.images.PullImage({ image: { image: bad } }));
      expect(err.code, bad).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details.length).toBeGreaterThan(10);
    }
  });

  it('answers NOT_FOUND for an image the registry does not have, with the registry\'s words', async () => {
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/nothing-here:v1` } }));
    expect(err.code).toBe(grpc.status.NOT_FOUND);
    expect(err.details).toMatch(/test\/nothing-here.*not found/);
  });

  it('fails the pull, and lives on, when a layer with a valid digest does not decompress', async () => {
    const good = await tarOf([{ name: 'big', data: Buffer.alloc(200_000, 5) }]);
    const gz = (await import('node:zlib')).gzipSync(good);
    const broken = Buffer.from(gz);
    broken.fill(0x55, 20, 200);
    const img = await buildImage({ layers: [{ raw: broken, compression: 'none' }] });
    await push.image('test/badgzip', 'v1', img);
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/badgzip:v1` } }));
    expect(err.details).toMatch(/did not decompress/);
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/did not decompress/);
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');
  });

  it('verifies layers against their diff ids', async () => {
    const raw = await tarOf([{ name: 'f', data: 'real' }]);
    const img = await buildImage({ layers: [{ raw }], config: { rootfs: { type: 'layers', diff_ids: [sha256('something else')] } } });
    await push.image('test/badiff', 'v1', img);
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/badiff:v1` } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/diff id/);
  });
});
