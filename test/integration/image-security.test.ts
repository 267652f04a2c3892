import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { busyboxImage } from '../helpers/busybox.js';
import { buildImage, Pusher, tarOf, type Entry, type ImageSpec } from '../helpers/oci.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

async function listTree(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    for (const e of await fs.readdir(d, { withFileTypes: true }).catch(() => [])) {
      const p = path.join(d, e.name);
      out.push(p);
      if (e.isDirectory()) await walk(p);
    }
  };
  await walk(dir);
  return out.sort();
}

describe.skipIf(!isRoot)(`hostile layers are refused and leave nothing (${isRoot ? 'root' : rootSkipReason})`, () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: string;
  let push: Pusher;
  let outside: string;

  beforeAll(async () => {
    reg = inject('registryHost');
    push = new Pusher(`http://${reg}`);
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
    outside = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-outside-'));
    await fs.writeFile(path.join(outside, 'victim'), 'untouched');
    await fs.writeFile(path.join(outside, 'secret'), 'host secret');
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
    await fs.rm(outside, { recursive: true, force: true });
  });

  /** The outside dir's names, modes, owners and contents: what an escape would change. */
  async function outsideState(): Promise<string[]> {
    const out: string[] = [];
    for (const p of [outside, ...(await listTree(outside))]) {
      const st = await fs.lstat(p);
      out.push(`${path.relative(outside, p)} ${st.mode.toString(8)} ${st.uid}:${st.gid} ${st.mtimeMs} ${st.isFile() ? await fs.readFile(p, 'utf8') : ''}`);
    }
    return out;
  }

  /** Every file content in the image's snapshots: what a read of the host would leave there. */
  async function snapshotContents(): Promise<string[]> {
    const out: string[] = [];
    for (const p of await listTree(path.join(dirs.root, 'snapshots'))) {
      const st = await fs.lstat(p);
      if (st.isFile()) out.push(await fs.readFile(p, 'utf8'));
    }
    return out;
  }

  const relOut = () => `../../../../../../../../..${outside}`;
  type Layers = () => Promise<ImageSpec['layers']>;
  const one = (entries: () => Entry[]): Layers => async () => [{ entries: [{ name: 'ok', data: 'fine' }] }, { entries: entries() }];
  const cases: Array<[string, Layers, RegExp]> = [
    ['a ".." entry', one(() => [{ name: `${relOut()}/pwned`, data: 'x' }]), /refusing layer entry .*\.\./],
    ['an absolute entry', one(() => [{ name: `${outside}/pwned`, data: 'x' }]), /refusing layer entry .*absolute/],
    ['a file below a symlink to the outside', one(() => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/pwned', data: 'x' }]), /parent "link" is a symlink/],
    ['a file below a relative symlink that climbs out', one(() => [{ name: 'up', type: 'symlink', linkname: relOut() }, { name: 'up/pwned', data: 'x' }]), /parent "up" is a symlink/],
    ['a directory below a symlink', one(() => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/sub/', type: 'directory' }]), /symlink/],
    ['a whiteout below a symlink', one(() => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/.wh.victim', data: '' }]), /symlink/],
    ['an opaque marker below a symlink', one(() => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/.wh..wh..opq', data: '' }]), /symlink/],
    ['a hardlink that climbs out', one(() => [{ name: 'h', type: 'link', linkname: `${relOut()}/victim` }]), /refusing layer entry .*\.\./],
    ['a hardlink to an absolute path', one(() => [{ name: 'h', type: 'link', linkname: `${outside}/victim` }]), /absolute/],
    ['a hardlink through a symlinked parent', one(() => [{ name: 's', type: 'symlink', linkname: outside }, { name: 'h', type: 'link', linkname: 's/victim' }]), /parent "s" is a symlink/],
    // Defect 1: a directory the layer itself swaps for a symlink is checked again.
    [
      'a file below a directory the layer replaced by a symlink',
      one(() => [{ name: 'sw/', type: 'directory' }, { name: 'sw', type: 'symlink', linkname: outside }, { name: 'sw/x', data: 'x' }]),
      /parent "sw" is a symlink/,
    ],
    [
      'a directory entry that would chmod the outside through a swapped parent',
      one(() => [{ name: 'sw/', type: 'directory' }, { name: 'sw', type: 'symlink', linkname: path.dirname(outside) }, { name: `sw/${path.basename(outside)}/`, type: 'directory', mode: 0o777 }]),
      /parent "sw" is a symlink/,
    ],
    // Defect 2: a lower layer's symlink in the middle of a hardlink's target.
    [
      'a hardlink through a lower layer\'s symlink',
      async () => [{ entries: [{ name: 'lk', type: 'symlink', linkname: outside }] }, { entries: [{ name: 'stolen', type: 'link', linkname: 'lk/secret' }] }],
      /hardlink target "lk\/secret" is not in this layer or below/,
    ],
    [
      'a hardlink through a lower layer\'s relative symlink',
      async () => [{ entries: [{ name: 'a/', type: 'directory' }, { name: 'a/up', type: 'symlink', linkname: `../${relOut()}` }] }, { entries: [{ name: 'stolen', type: 'link', linkname: 'a/up/secret' }] }],
      /not in this layer or below/,
    ],
    // Defect 3: a whiteout through a swapped directory.
    [
      'a whiteout through a directory the layer replaced by a symlink',
      one(() => [{ name: 'w/', type: 'directory' }, { name: 'w', type: 'symlink', linkname: outside }, { name: 'w/.wh.victim', data: '' }]),
      /parent "w" is a symlink/,
    ],
    // Defect 4: entries after the end-of-archive marker, which Go's reader (and so scanners) never see.
    [
      'entries hidden after the end-of-archive marker',
      async () => [{ raw: Buffer.concat([await tarOf([{ name: 'seen', data: 'a' }]), await tarOf([{ name: 'hidden', data: 'b' }])]) }],
      /data after the end-of-archive marker/,
    ],
    // Defect 5: whiteout names are paths like any other.
    ['a whiteout of ".." at the layer root', one(() => [{ name: '.wh...', data: '' }]), /whiteout of no file/],
    ['a whiteout of ".." below a directory', one(() => [{ name: 'd/.wh...', data: '' }]), /whiteout of no file/],
  ];

  for (const [what, layers, message] of cases) {
    it(`refuses ${what}`, async () => {
      const before = await listTree(dirs.root);
      const outsideBefore = await outsideState();
      const img = await buildImage({ layers: await layers() });
      const name = `test/hostile-${what.replace(/[^a-z]+/g, '-').replace(/^-|-$/g, '')}`;
      await push.image(name, 'v1', img);
      const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/${name}:v1` } }));
      expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(message);
      // Nothing written outside, nothing kept inside.
      expect(await outsideState()).toEqual(outsideBefore);
      expect(await fs.readdir(outside)).toEqual(['secret', 'victim']);
      expect(await fs.readFile(path.join(outside, 'victim'), 'utf8')).toBe('untouched');
      expect(await listTree(dirs.root)).toEqual(before);
      const list = await skiff.images.ListImages({});
      expect(list.images).toEqual([]);
    });
  }

  it('keeps trailing zero padding after the end-of-archive marker, and unpacks nothing past it', async () => {
    const raw = Buffer.concat([await tarOf([{ name: 'seen', data: 'a' }]), Buffer.alloc(8192)]);
    const img = await buildImage({ layers: [{ raw }] });
    await push.image('test/padded', 'v1', img);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/padded:v1` } });
    expect(res.imageRef).toBe(img.config.digest);
    const snaps = await fs.readdir(path.join(dirs.root, 'snapshots'));
    expect(snaps.length).toBe(1);
    expect(await fs.readdir(path.join(dirs.root, 'snapshots', snaps[0]!, 'fs'))).toEqual(['seen']);
    await skiff.images.RemoveImage({ image: { image: res.imageRef! } });
  });

  it('never copies a host file into a snapshot through a lower layer\'s symlink', async () => {
    const img = await buildImage({ layers: [{ entries: [{ name: 'lk', type: 'symlink', linkname: outside }] }, { entries: [{ name: 'stolen', type: 'link', linkname: 'lk/secret' }] }] });
    await push.image('test/hostile-read', 'v1', img);
    await codeOf(skiff.images.PullImage({ image: { image: `${reg}/test/hostile-read:v1` } }));
    expect(await snapshotContents()).not.toContain('host secret');
  });

  it('replaces a symlink with a file instead of writing through it', async () => {
    const img = await buildImage({
      layers: [{ entries: [{ name: 'f', type: 'symlink', linkname: `${outside}/victim` }, { name: 'f', data: 'inside' }] }],
    });
    await push.image('test/hostile-overwrite', 'v1', img);
    const res = await skiff.images.PullImage({ image: { image: `${reg}/test/hostile-overwrite:v1` } });
    expect(res.imageRef).toBe(img.config.digest);
    expect(await fs.readFile(path.join(outside, 'victim'), 'utf8')).toBe('untouched');
    await skiff.images.RemoveImage({ image: { image: res.imageRef! } });
  });
});

const sha512 = (b: Buffer) => `sha512:${createHash('sha512').update(b).digest('hex')}`;

/** A registry that serves exactly the bytes it is given under each name, right or wrong. */
class StaticRegistry {
  readonly manifests = new Map<string, { type: string; data: Buffer }>();
  readonly blobs = new Map<string, Buffer>();
  private server!: http.Server;
  host = '';

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => {
      const m = /^\/v2\/(?:.+)\/(manifests|blobs)\/([^/]+)$/.exec(req.url ?? '');
      if (req.url === '/v2/') {
        res.writeHead(200).end('{}');
        return;
      }
      const found = m && (m[1] === 'manifests' ? this.manifests.get(m[2]!) : { type: 'application/octet-stream', data: this.blobs.get(m[2]!) });
      if (!found?.data) {
        res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ errors: [{ code: 'NOT_FOUND', message: 'not here' }] }));
        return;
      }
      res.writeHead(200, { 'content-type': found.type, 'content-length': found.data.length });
      res.end(req.method === 'HEAD' ? undefined : found.data);
    });
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    this.host = `127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }
}

describe.skipIf(!isRoot)(`sha512 digests are verified, other algorithms refused (${isRoot ? 'root' : rootSkipReason})`, () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let fake: StaticRegistry;
  const arch = process.arch === 'arm64' ? 'arm64' : 'amd64';

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  });
  afterEach(async () => {
    await fake?.close();
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  /** An index (tag v1) → manifest (by sha512) → config and one layer (by `layerDigest`). */
  async function serve(opts: { layerDigest?: (data: Buffer) => string; manifestAt?: (m: Buffer) => Buffer; layerBytes?: (data: Buffer) => Buffer } = {}) {
    const img = await buildImage({ layers: [{ entries: [{ name: 'f', data: 'verified with sha512' }] }], architecture: arch });
    const layer = img.layers[0]!;
    const layerDigest = (opts.layerDigest ?? sha512)(layer.data);
    const mdata = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: img.manifest.mediaType,
        config: { mediaType: img.config.mediaType, digest: img.config.digest, size: img.config.data.length },
        layers: [{ mediaType: layer.mediaType, digest: layerDigest, size: layer.data.length }],
      }),
    );
    const mdigest = sha512(mdata);
    const index = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: [{ mediaType: img.manifest.mediaType, digest: mdigest, size: mdata.length, platform: { os: 'linux', architecture: arch } }],
      }),
    );
    fake = await new StaticRegistry().start();
    fake.manifests.set('v1', { type: 'application/vnd.oci.image.index.v1+json', data: index });
    fake.manifests.set(mdigest, { type: img.manifest.mediaType, data: (opts.manifestAt ?? ((m) => m))(mdata) });
    fake.blobs.set(img.config.digest, img.config.data);
    fake.blobs.set(layerDigest, (opts.layerBytes ?? ((d) => d))(layer.data));
    return { img, mdigest, layerDigest, ref: `${fake.host}/test/sha512:v1` };
  }

  it('pulls an image whose manifest and layer are named by sha512 digests', async () => {
    const { img, layerDigest, mdigest } = await serve();
    const res = await skiff.images.PullImage({ image: { image: `${fake.host}/test/sha512:v1` } });
    expect(res.imageRef).toBe(img.config.digest);
    expect(await fs.readdir(path.join(dirs.root, 'content', 'blobs', 'sha512'))).toEqual(expect.arrayContaining([layerDigest.slice(7), mdigest.slice(7)]));
    await skiff.images.RemoveImage({ image: { image: res.imageRef! } });
  });

  it('refuses a manifest that does not match the sha512 digest the index names', async () => {
    const { ref } = await serve({ manifestAt: (m) => Buffer.from(m.toString().replace('"schemaVersion":2', '"schemaVersion": 2')) });
    const err = await codeOf(skiff.images.PullImage({ image: { image: ref } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/manifest digest mismatch: asked for sha512:/);
    expect((await skiff.images.ListImages({})).images).toEqual([]);
  });

  it('refuses a layer that does not match its sha512 digest', async () => {
    const { ref } = await serve({
      layerBytes: (d) => {
        const t = Buffer.from(d);
        t[t.length - 5]! ^= 0xff;
        return t;
      },
    });
    const err = await codeOf(skiff.images.PullImage({ image: { image: ref } }));
    expect(err.details).toMatch(/digest mismatch|did not decompress/);
    expect((await skiff.images.ListImages({})).images).toEqual([]);
    expect(await fs.readdir(path.join(dirs.root, 'content', 'blobs', 'sha512')).catch(() => [])).toEqual([]);
  });

  it('refuses a layer named by a digest algorithm it cannot verify', async () => {
    const { ref } = await serve({ layerDigest: (d) => `sha384:${createHash('sha384').update(d).digest('hex')}` });
    const err = await codeOf(skiff.images.PullImage({ image: { image: ref } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/unsupported digest algorithm.*sha384/);
    expect((await skiff.images.ListImages({})).images).toEqual([]);
  });
});

describe.skipIf(!isRoot)(`a container's user comes from its image, never the host (${isRoot ? 'root' : rootSkipReason})`, () => {
  let f: PodFixture;
  let reg: string;
  let hostEtc: string;
  let podId: string;
  const sandbox = () => ({ metadata: { name: 'users', namespace: 'test', uid: 'users-uid', attempt: 0 }, logDirectory: path.join(f.dirs.base, 'logs'), linux: {} });

  beforeAll(async () => {
    reg = inject('registryHost');
    f = await startPodFixture(reg, 'test/busybox-users');
    // What the host would give away: a user, its groups and home that no image has.
    hostEtc = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-host-etc-'));
    await fs.writeFile(path.join(hostEtc, 'passwd'), 'root:x:0:0::/root:/bin/sh\nhostuser:x:4321:4321::/home/hostuser:/bin/sh\n');
    await fs.writeFile(path.join(hostEtc, 'group'), 'hostgroup:x:4321:\nhostwheel:x:4444:hostuser,root\n');
    podId = (await f.skiff.runtime.RunPodSandbox({ config: sandbox() })).podSandboxId!;
  });
  afterAll(async () => {
    const leaks = await f?.cleanup();
    await fs.rm(hostEtc, { recursive: true, force: true });
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function imageWith(name: string, user: string, extra: Entry[]): Promise<string> {
    await new Pusher(`http://${reg}`).image(`test/${name}`, 'v1', await busyboxImage({ User: user }, extra));
    const image = `${reg}/test/${name}:v1`;
    await f.skiff.images.PullImage({ image: { image } });
    return image;
  }

  function create(image: string, name: string, linux: Record<string, unknown> = {}) {
    return f.skiff.runtime.CreateContainer({
      podSandboxId: podId,
      config: { metadata: { name }, image: { image }, command: ['sleep', '100000'], logPath: `${name}.log`, linux },
      sandboxConfig: sandbox(),
    });
  }

  it('does not take the user from the host when the image\'s /etc is a symlink to a host directory', async () => {
    const image = await imageWith('etc-to-host', 'hostuser', [{ name: 'etc', type: 'symlink', linkname: hostEtc }]);
    const err = await codeOf(create(image, 'etc-host'));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/image user "hostuser" is not in the image's \/etc\/passwd/);
    // By number, the user gets none of the host's gid, groups or home.
    const { containerId } = await create(image, 'etc-host-uid', { securityContext: { runAsUser: { value: 4321 } } });
    await f.skiff.runtime.StartContainer({ containerId: containerId! });
    const r = await f.skiff.runtime.ExecSync({ containerId: containerId!, cmd: ['sh', '-c', 'grep -E "^(Uid|Gid|Groups)" /proc/self/status; tr "\\0" "\\n" < /proc/self/environ | grep ^HOME='], timeout: 10 });
    const out = Buffer.from(r.stdout!).toString();
    expect(out).toMatch(/^Uid:\s+4321\s/m);
    expect(out).toMatch(/^Gid:\s+0\s/m);
    expect(out).not.toMatch(/4444/);
    expect(out).not.toContain('/home/hostuser');
  });

  it('does not take the user from the host through etc/passwd -> ../../..<host>/passwd', async () => {
    const climb = `${'../'.repeat(12)}${hostEtc.slice(1)}`;
    const image = await imageWith('passwd-to-host', 'hostuser', [
      { name: 'etc/passwd', type: 'symlink', linkname: `${climb}/passwd` },
      { name: 'etc/group', type: 'symlink', linkname: `${climb}/group` },
    ]);
    const err = await codeOf(create(image, 'passwd-host'));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/"hostuser" is not in the image's \/etc\/passwd/);
  });

  it('follows the image\'s own symlinks inside its rootfs, as the container would', async () => {
    const image = await imageWith('etc-inside', 'imguser', [
      { name: 'realetc/', type: 'directory' },
      { name: 'realetc/passwd', data: 'root:x:0:0::/root:/bin/sh\nimguser:x:2345:2346::/home/imguser:/bin/sh\n' },
      { name: 'realetc/group', data: 'imggroup:x:2347:imguser\n' },
      { name: 'etc', type: 'symlink', linkname: '/realetc' },
    ]);
    const { containerId } = await create(image, 'etc-inside');
    await f.skiff.runtime.StartContainer({ containerId: containerId! });
    const r = await f.skiff.runtime.ExecSync({ containerId: containerId!, cmd: ['sh', '-c', 'grep -E "^(Uid|Gid|Groups)" /proc/self/status'], timeout: 10 });
    const out = Buffer.from(r.stdout!).toString();
    expect(out).toMatch(/^Uid:\s+2345\s/m);
    expect(out).toMatch(/^Gid:\s+2346\s/m);
    expect(out).toMatch(/^Groups:.*2347/m);
  });
});
