import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { Front } from '../helpers/front.js';
import { buildImage, Pusher, type BuiltImage } from '../helpers/oci.js';
import { waitFor } from '../helpers/registry.js';

describe.skipIf(!isRoot)('images: list, status, remove, fs info, persistence', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: string;
  let push: Pusher;
  let a: BuiltImage;
  let b: BuiltImage;

  beforeAll(async () => {
    reg = inject('registryHost');
    push = new Pusher(`http://${reg}`);
    a = await buildImage({ layers: [{ entries: [{ name: 'shared', data: Buffer.alloc(100_000, 7) }] }, { entries: [{ name: 'a', data: 'a' }] }], config: { config: { User: 'nobody' } } });
    b = await buildImage({ layers: [{ entries: [{ name: 'shared', data: Buffer.alloc(100_000, 7) }] }, { entries: [{ name: 'b', data: 'b' }] }] });
    await push.image('test/life-a', 'v1', a);
    await push.image('test/life-a', 'v2', a);
    await push.image('test/life-b', 'v1', b);
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs, ['--pinned-image', `${reg}/test/life-b:v1`]).start();
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('lists images, filters by reference, and reports pinned images and usernames', async () => {
    await skiff.images.PullImage({ image: { image: `${reg}/test/life-a:v1` } });
    await skiff.images.PullImage({ image: { image: `${reg}/test/life-a:v2` } });
    await skiff.images.PullImage({ image: { image: `${reg}/test/life-b:v1` } });
    const all = await skiff.images.ListImages({});
    expect(all.images?.map((i) => i.id).sort()).toEqual([a.config.digest, b.config.digest].sort());
    const ia = all.images!.find((i) => i.id === a.config.digest)!;
    expect(ia.repoTags).toEqual([`${reg}/test/life-a:v1`, `${reg}/test/life-a:v2`]);
    expect(ia.username).toBe('nobody');
    expect(ia.uid).toBeNull();
    expect(ia.pinned).toBe(false);
    expect(all.images!.find((i) => i.id === b.config.digest)!.pinned).toBe(true);
    const filtered = await skiff.images.ListImages({ filter: { image: { image: `${reg}/test/life-b:v1` } } });
    expect(filtered.images?.map((i) => i.id)).toEqual([b.config.digest]);
    const none = await skiff.images.ListImages({ filter: { image: { image: `${reg}/test/absent:v1` } } });
    expect(none.images).toEqual([]);
  });

  it('finds an image by tag, digest, full id, bare hex id and unique id prefix', async () => {
    const hex = a.config.digest.slice('sha256:'.length);
    for (const ref of [`${reg}/test/life-a:v1`, `${reg}/test/life-a@${a.manifest.digest}`, a.config.digest, hex, hex.slice(0, 12)]) {
      const st = await skiff.images.ImageStatus({ image: { image: ref } });
      expect(st.image?.id, ref).toBe(a.config.digest);
    }
  });

  it('answers ImageStatus for a missing image with no image, not an error', async () => {
    const st = await skiff.images.ImageStatus({ image: { image: `${reg}/test/absent:v1` } });
    expect(st.image).toBeNull();
    const err = await codeOf(skiff.images.ImageStatus({ image: { image: '' } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it('reports the image filesystem\'s usage', async () => {
    const info = await skiff.images.ImageFsInfo({});
    const fsu = info.imageFilesystems![0]!;
    expect(fsu.fsId?.mountpoint).toBe(path.join(dirs.root, 'snapshots'));
    expect(Number(fsu.usedBytes?.value)).toBeGreaterThan(100_000);
    expect(Number(fsu.inodesUsed?.value)).toBeGreaterThan(3);
    expect(Number(fsu.timestamp)).toBeGreaterThan(0);
  });

  it('removes an image with all its tags, keeps what another image shares, and is idempotent', async () => {
    const usageBefore = Number((await skiff.images.ImageFsInfo({})).imageFilesystems![0]!.usedBytes!.value);
    await skiff.images.RemoveImage({ image: { image: `${reg}/test/life-a:v2` } });
    expect((await skiff.images.ImageStatus({ image: { image: `${reg}/test/life-a:v1` } })).image).toBeNull();
    expect((await skiff.images.ImageStatus({ image: { image: a.config.digest } })).image).toBeNull();
    const left = await skiff.images.ListImages({});
    expect(left.images?.map((i) => i.id)).toEqual([b.config.digest]);
    // b still reads its shared bottom layer.
    const blobs = await fs.readdir(path.join(dirs.root, 'content', 'blobs', 'sha256'));
    expect(blobs).toContain(b.layers[0]!.digest.slice(7));
    expect(blobs).not.toContain(a.layers[1]!.digest.slice(7));
    expect(blobs).not.toContain(a.config.digest.slice(7));
    const usageAfter = Number((await skiff.images.ImageFsInfo({})).imageFilesystems![0]!.usedBytes!.value);
    expect(usageAfter).toBeLessThan(usageBefore);
    // Again, and by id: still success.
    await skiff.images.RemoveImage({ image: { image: `${reg}/test/life-a:v2` } });
    await skiff.images.RemoveImage({ image: { image: a.config.digest } });
  });

  it('keeps its images across a restart and across kill -9', async () => {
    await skiff.images.PullImage({ image: { image: `${reg}/test/life-a:v1` } });
    const before = (await skiff.images.ListImages({})).images!.map((i) => [i.id, i.repoTags, i.repoDigests]);
    expect((await skiff.stop()).code).toBe(0);
    await skiff.start();
    expect((await skiff.images.ListImages({})).images!.map((i) => [i.id, i.repoTags, i.repoDigests])).toEqual(before);
    await skiff.stop('SIGKILL');
    await skiff.start();
    expect((await skiff.images.ListImages({})).images!.map((i) => [i.id, i.repoTags, i.repoDigests])).toEqual(before);
  });

  it('leaves no half-pulled image after kill -9 during a pull, and pulls again cleanly', async () => {
    const big = await buildImage({
      layers: Array.from({ length: 4 }, (_, i) => ({ entries: [{ name: `f${i}`, data: Buffer.alloc(200_000, i + 1) }] })),
    });
    await push.image('test/life-killed', 'v1', big);
    const slow = await new Front({ upstream: `http://${reg}`, delayMs: 2_000 }).start();
    try {
      const pull = skiff.images.PullImage({ image: { image: `${slow.host}/test/life-killed:v1` } }).catch(() => undefined);
      await waitFor('a blob download to begin', async () => slow.requests.some((r) => r.includes('/blobs/sha256') && !r.endsWith(big.config.digest)));
      await skiff.stop('SIGKILL');
      await pull;
      await skiff.start();
      expect((await skiff.images.ImageStatus({ image: { image: `${slow.host}/test/life-killed:v1` } })).image).toBeNull();
      // Nothing left in the ingest or unpack areas after start-up.
      expect(await fs.readdir(path.join(dirs.root, 'content', 'ingest'))).toEqual([]);
      expect(await fs.readdir(path.join(dirs.root, 'snapshots-work'))).toEqual([]);
      const res = await skiff.images.PullImage({ image: { image: `${reg}/test/life-killed:v1` } });
      expect(res.imageRef).toBe(big.config.digest);
    } finally {
      await slow.close();
    }
  });
});
