/**
 * Importing image archives into a real content store and snapshotter (no
 * daemon): both archive formats, names, platforms, and every hostile archive
 * refused with nothing kept.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { openDb, type Db } from '../../src/db.js';
import { LocalContentStore } from '../../src/image/content.js';
import { createLogger } from '../../src/log.js';
import { RegistryClient } from '../../src/image/registry.js';
import { ImageService, MAX_INDEX_DEPTH } from '../../src/image/service.js';
import { OverlaySnapshotter } from '../../src/image/snapshot.js';
import { buildImage, buildIndex, compress, dockerSaveArchive, ociArchive, sha256, tarOf, type BuiltImage, type Entry } from '../helpers/oci.js';

const isRoot = process.getuid?.() === 0;
const log = createLogger('error');

interface World {
  dir: string;
  db: Db;
  content: LocalContentStore;
  snapshots: OverlaySnapshotter;
  images: ImageService;
  registry: RegistryClient;
}

async function world(): Promise<World> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-import-'));
  const db = openDb(path.join(dir, 'metadata.db'));
  const content = new LocalContentStore(path.join(dir, 'content'));
  await content.init();
  const snapshots = new OverlaySnapshotter(dir, db);
  await snapshots.init();
  const registry = new RegistryClient({ logger: log });
  const images = new ImageService({ db, content, snapshots, registry, log, platform: { os: 'linux', architecture: 'amd64' }, importTmpDir: path.join(dir, 'tmp') });
  return { dir, db, content, snapshots, images, registry };
}

function files(name: string, n = 2): Entry[] {
  return [{ name: 'etc/', type: 'directory' }, ...Array.from({ length: n }, (_, i) => ({ name: `etc/${name}-${i}`, data: `${name} ${i}\n` }))];
}

async function image(name: string, opts: { compression?: 'gzip' | 'none'; user?: string; architecture?: string } = {}): Promise<BuiltImage> {
  return buildImage({
    layers: [{ entries: files(`${name}-a`), compression: opts.compression }, { entries: files(`${name}-b`), compression: opts.compression }],
    architecture: opts.architecture,
    config: { config: { Cmd: ['sh'], User: opts.user ?? '' } },
  });
}

/** Everything the stores hold: an import that fails must leave this as it found it. */
async function inventory(w: World): Promise<{ images: number; blobs: string[]; snapshots: string[]; tmp: string[] }> {
  return {
    images: w.images.list().length,
    blobs: (await w.content.list()).map((b) => b.digest).sort(),
    snapshots: w.snapshots.list().map((s) => s.chainId).sort(),
    tmp: await fs.readdir(path.join(w.dir, 'tmp')).catch(() => []),
  };
}

describe.skipIf(!isRoot)('image archive import', () => {
  let w: World;
  let n = 0;
  beforeEach(async () => {
    w = await world();
  });
  afterEach(async () => {
    w.db.close();
    await w.registry.close();
    await fs.rm(w.dir, { recursive: true, force: true });
  });

  async function write(data: Buffer, name = `a${n++}.tar`): Promise<string> {
    const p = path.join(w.dir, name);
    await fs.writeFile(p, data);
    return p;
  }

  it('imports an OCI archive as a pull would: names, repo digests, size, user and unpacked layers', async () => {
    const img = await image('web', { user: '1000' });
    const file = await write(await ociArchive([{ name: 'skiff.local/demo-web:1', image: img }, { name: 'busybox', image: await image('other') }]));
    const progress: number[] = [];
    const got = await w.images.importArchive(file, { onProgress: (p) => progress.push(p.bytesDone) });
    expect(got.map((i) => i.repoTags)).toEqual([['skiff.local/demo-web:1'], ['docker.io/library/busybox:latest']]);
    const rec = w.images.find('skiff.local/demo-web:1')!;
    expect(rec.id).toBe(img.config.digest);
    expect(rec.repoDigests).toEqual([`skiff.local/demo-web@${img.manifest.digest}`]);
    expect(rec.user).toBe('1000');
    expect(rec.size).toBe(img.manifest.data.length + img.config.data.length + img.layers.reduce((a, l) => a + l.data.length, 0));
    expect(w.images.find('busybox')).toBeDefined();
    const top = w.snapshots.lowerDirs(rec.chainIds.at(-1)!);
    expect(await fs.readFile(path.join(top[0]!, 'etc/web-b-1'), 'utf8')).toBe('web-b 1\n');
    expect(progress.at(-1)).toBeGreaterThan(0);
    // Importing again changes nothing and fails nothing.
    const before = await inventory(w);
    await w.images.importArchive(file);
    expect(await inventory(w)).toEqual(before);
  });

  it('imports a classic docker save archive with uncompressed layers stored as they are', async () => {
    const img = await image('dock', { compression: 'none', user: 'app' });
    const file = await write(await dockerSaveArchive([{ tags: ['example.com/team/dock:v2', 'dock:latest'], image: img }]));
    const [got] = await w.images.importArchive(file);
    expect(got!.id).toBe(img.config.digest);
    expect(got!.repoTags).toEqual(['docker.io/library/dock:latest', 'example.com/team/dock:v2']);
    expect(got!.repoDigests).toEqual([]);
    const rec = w.images.find('example.com/team/dock:v2')!;
    expect(rec.user).toBe('app');
    // The layer blobs are the layer tars themselves: their digests are the diff ids.
    for (const d of img.diffIds) expect(await w.content.has(d)).toBe(true);
    expect(rec.chainIds[0]).toBe(img.diffIds[0]);
  });

  it('imports a gzip-compressed archive, and a docker save archive whose layers are gzipped', async () => {
    const img = await image('gz');
    const file = await write(zlib.gzipSync(await dockerSaveArchive([{ tags: ['gz:1'], image: img }])), 'gz.tar.gz');
    const [got] = await w.images.importArchive(file);
    expect(got!.repoTags).toEqual(['docker.io/library/gz:1']);
    expect(await w.content.has(img.layers[0]!.digest)).toBe(true);
    expect((await inventory(w)).tmp).toEqual([]);
  });

  it('names images of a Docker 25+ save (an OCI layout with manifest.json) from its RepoTags when the index names none', async () => {
    const img = await image('d25', { compression: 'none' });
    const hex = (d: string) => d.slice(7);
    const tar = await tarOf([
      { name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
      { name: 'index.json', data: JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: img.manifest.mediaType, digest: img.manifest.digest, size: img.manifest.data.length, annotations: { 'org.opencontainers.image.ref.name': 'v3' } }] }) },
      { name: 'manifest.json', data: JSON.stringify([{ Config: `blobs/sha256/${hex(img.config.digest)}`, RepoTags: ['registry.example:5000/team/d25:v3'], Layers: img.layers.map((l) => `blobs/sha256/${hex(l.digest)}`) }]) },
      ...[img.manifest, img.config, ...img.layers].map((b) => ({ name: `blobs/sha256/${hex(b.digest)}`, data: b.data })),
    ]);
    const [got] = await w.images.importArchive(await write(tar));
    // "v3" alone names nothing; manifest.json's RepoTags do.
    expect(got!.repoTags).toEqual(['registry.example:5000/team/d25:v3']);
    // The manifest is a real one: its digest names the image as a registry would serve it.
    expect(got!.repoDigests).toEqual([`registry.example:5000/team/d25@${img.manifest.digest}`]);
    expect(w.images.find('registry.example:5000/team/d25:v3')?.id).toBe(img.config.digest);
  });

  it("picks this machine's platform from a multi-platform index", async () => {
    const amd = await image('amd', { architecture: 'amd64' });
    const arm = await image('arm', { architecture: 'arm64' });
    const index = buildIndex([
      { image: arm, platform: { os: 'linux', architecture: 'arm64', variant: 'v8' } },
      { image: amd, platform: { os: 'linux', architecture: 'amd64' } },
    ]);
    const file = await write(await ociArchive([{ name: 'multi:1', index, images: [arm, amd] }]));
    const [got] = await w.images.importArchive(file);
    expect(got!.id).toBe(amd.config.digest);
    expect(got!.repoDigests).toEqual([`docker.io/library/multi@${index.digest}`]);
    // The other platform's blobs are not kept.
    expect(await w.content.has(arm.layers[0]!.digest)).toBe(false);
    expect(await w.content.has(arm.config.digest)).toBe(false);
  });

  describe('refuses hostile or broken archives and keeps nothing', () => {
    /** An OCI layout with one image; `mutate` changes its entries before they are written. */
    async function layout(mutate: (entries: Entry[], img: BuiltImage) => Entry[] | void): Promise<Buffer> {
      const img = await image('bad');
      const good = await ociArchive([{ name: 'bad:1', image: img }]);
      // Rebuild the same layout from entries so that a test can change one of them.
      const entries: Entry[] = [
        { name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
        { name: 'index.json', data: JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: img.manifest.mediaType, digest: img.manifest.digest, size: img.manifest.data.length, annotations: { 'io.containerd.image.name': 'bad:1' } }] }) },
        ...[img.manifest, img.config, ...img.layers].map((b) => ({ name: `blobs/sha256/${b.digest.slice(7)}`, data: b.data })),
      ];
      expect(good.length).toBeGreaterThan(0);
      return tarOf(mutate(entries, img) ?? entries);
    }

    const cases: Array<[string, () => Promise<Buffer>, RegExp]> = [
      [
        'a layer whose bytes do not match its digest',
        () =>
          layout((e, img) => {
            const l = e.find((x) => x.name.endsWith(img.layers[1]!.digest.slice(7)))!;
            const data = Buffer.from(l.data as Buffer);
            data[data.length - 30] ^= 0xff;
            l.data = data;
          }),
        /digest mismatch|did not decompress|not a tar/,
      ],
      ['a missing layer blob', () => layout((e, img) => e.filter((x) => !x.name.endsWith(img.layers[1]!.digest.slice(7)))), /blob sha256:[a-f0-9]+ is missing/],
      ['a path escaping the archive', () => layout((e) => [...e, { name: '../../etc/evil', data: 'x' }]), /points outside the archive/],
      ['an absolute path', () => layout((e) => [...e, { name: '/etc/evil', data: 'x' }]), /points outside the archive/],
      ['a symlink entry', () => layout((e) => [...e, { name: 'blobs/sha256/link', type: 'symlink', linkname: '/etc/shadow' }]), /is a symlink/],
      [
        'a hardlink entry standing for a blob',
        () =>
          layout((e, img) => {
            const i = e.findIndex((x) => x.name.endsWith(img.layers[1]!.digest.slice(7)));
            e[i] = { name: e[i]!.name, type: 'link', linkname: '/etc/passwd' };
          }),
        /is a hardlink/,
      ],
      ['a name given twice', () => layout((e) => [...e, { name: 'index.json', data: '{}' }]), /twice/],
      [
        'a giant manifest',
        async () => {
          const body = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', pad: 'x'.repeat(5 << 20) }));
          const digest = sha256(body);
          return tarOf([
            { name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
            { name: 'index.json', data: JSON.stringify({ manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', digest, size: body.length }] }) },
            { name: `blobs/sha256/${digest.slice(7)}`, data: body },
          ]);
        },
        /more than the 4194304/,
      ],
      [
        'indexes nested too deep',
        async () => {
          const img = await image('deep');
          let top = buildIndex([{ image: img, platform: { os: 'linux', architecture: 'amd64' } }]);
          const blobs = [top, img.manifest, img.config, ...img.layers];
          for (let i = 0; i < MAX_INDEX_DEPTH + 1; i++) {
            const data = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [{ mediaType: top.mediaType, digest: top.digest, size: top.data.length, platform: { os: 'linux', architecture: 'amd64' } }] }));
            top = { digest: sha256(data), mediaType: top.mediaType, data };
            blobs.push(top);
          }
          return tarOf([
            { name: 'index.json', data: JSON.stringify({ manifests: [{ mediaType: top.mediaType, digest: top.digest, size: top.data.length }] }) },
            ...blobs.map((b) => ({ name: `blobs/sha256/${b.digest.slice(7)}`, data: b.data })),
          ]);
        },
        /inside an index \(indexes nest at most 1 deep\)/,
      ],
      [
        'a docker save layer that is not its diff id',
        async () => {
          const img = await image('dock', { compression: 'none' });
          const forged = { ...img, layers: [img.layers[0]!, { ...img.layers[1]!, data: await tarOf(files('forged')) }] };
          return dockerSaveArchive([{ tags: ['forged:1'], image: forged }]);
        },
        /digest mismatch/,
      ],
      [
        'a docker save layer path escaping the archive',
        async () => {
          const img = await image('dock', { compression: 'none' });
          const tar = await tarOf([
            { name: `${img.config.digest.slice(7)}.json`, data: img.config.data },
            { name: 'manifest.json', data: JSON.stringify([{ Config: `${img.config.digest.slice(7)}.json`, RepoTags: ['x:1'], Layers: ['../../../etc/passwd', 'b/layer.tar'] }]) },
          ]);
          return tar;
        },
        /points outside the archive/,
      ],
      ['not a tar at all', async () => Buffer.from('hello, this is not an archive'.repeat(40)), /not a tar archive|ends in the middle/],
      ['a truncated archive', async () => (await layout(() => undefined)).subarray(0, 3000), /ends in the middle/],
      ['a corrupt gzip archive', async () => Buffer.concat([zlib.gzipSync(await layout(() => undefined)).subarray(0, 500)]), /did not decompress|unexpected end/i],
    ];

    for (const [what, make, message] of cases) {
      it(what, async () => {
        // Something already stored must survive the failed import.
        const kept = await image('kept');
        await w.images.importArchive(await write(await ociArchive([{ name: 'kept:1', image: kept }])));
        const before = await inventory(w);
        await expect(w.images.importArchive(await write(await make()))).rejects.toThrow(message);
        expect(await inventory(w)).toEqual(before);
      });
    }

    it('a good image and a bad one in one archive: neither is kept', async () => {
      const good = await image('good');
      const bad = await image('bad2');
      const before = await inventory(w);
      const tar = await ociArchive([{ name: 'good:1', image: good }, { name: 'bad:2', image: bad }]);
      // Cut the bad image's last layer off by replacing the blob with garbage of the same size.
      const hex = bad.layers[1]!.digest.slice(7);
      const at = tar.indexOf(Buffer.from(`blobs/sha256/${hex}`));
      const data = at + 512;
      tar.fill(0x41, data, data + bad.layers[1]!.data.length);
      await expect(w.images.importArchive(await write(tar))).rejects.toThrow(/failed to import/);
      expect(await inventory(w)).toEqual(before);
      expect(w.images.find('good:1')).toBeUndefined();
    });

    it('refuses what is not a regular file, and a symlink to an archive', async () => {
      await expect(w.images.importArchive(w.dir)).rejects.toThrow(/not a regular file/);
      const real = await write(await ociArchive([{ name: 'l:1', image: await image('l') }]));
      const link = path.join(w.dir, 'link.tar');
      await fs.symlink(real, link);
      await expect(w.images.importArchive(link)).rejects.toThrow(/symlink/);
      await expect(w.images.importArchive(path.join(w.dir, 'nope.tar'))).rejects.toThrow(/does not exist/);
    });

    it('refuses an archive larger than the limit before reading it', async () => {
      const file = await write(await ociArchive([{ name: 'big:1', image: await image('big') }]));
      await expect(w.images.importArchive(file, { limits: { maxBytes: 1000, maxEntries: 100 } })).rejects.toThrow(/more than the 1000/);
    });
  });

  it('zstd archives import too', async () => {
    const img = await image('zst');
    const file = await write(compress(await ociArchive([{ name: 'zst:1', image: img }]), 'zstd'), 'z.tar.zst');
    const [got] = await w.images.importArchive(file);
    expect(got!.repoTags).toEqual(['docker.io/library/zst:1']);
  });
});
