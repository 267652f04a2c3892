/**
 * A registry that misbehaves on purpose, against a real `skiff cri`: every
 * read is bounded while it streams, a client that goes away stops the
 * downloads, and a stalled download fails on its own. After each fault, the
 * daemon's memory stayed flat and a normal pull still works.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, unmountUnder, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { flood, HostileRegistry, peakRss, rssOf, type Handler, type SeenRequest } from '../helpers/hostile-registry.js';
import { buildImage, type BuiltImage } from '../helpers/oci.js';
import { loadCri } from '../../src/server/proto.js';
import type { ImageServiceClient } from '../../src/gen/runtime/v1/ImageService.js';

const MiB = 1 << 20;
/** The daemon's progress timeout in this suite: long enough that a client's 2 s deadline always comes first. */
const PROGRESS_S = 6;
const layerOneData = randomBytes(300_000);

describe.skipIf(!isRoot)('PullImage from a hostile registry', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: HostileRegistry;
  let img: BuiltImage;
  let raw: ImageServiceClient;
  const extra: HostileRegistry[] = [];

  const manifestPath = (tag = 'v1') => `/v2/test/hostile/manifests/${tag}`;
  const image = (tag = 'bad') => `${reg.host}/test/hostile:${tag}`;

  /** One route answers with `fn`; everything else is the good image. */
  function on(pred: (path: string) => boolean, fn: (req: Parameters<Handler>[0], res: Parameters<Handler>[1], seen: SeenRequest) => void): void {
    reg.handler = (req, res, seen) => {
      if (!pred(new URL(req.url ?? '/', 'http://x').pathname)) return false;
      fn(req, res, seen);
      return true;
    };
  }

  function pullWithDeadline(ref: string, ms: number): Promise<unknown> {
    return new Promise((resolve, reject) =>
      raw.PullImage({ image: { image: ref } }, new grpc.Metadata(), { deadline: Date.now() + ms }, (err, res) => (err ? reject(err) : resolve(res))),
    );
  }

  /** Runs a pull against a flood, and checks the daemon's memory and that it hung up on the flood. */
  async function underFlood(ref: string, floodPath: string): Promise<{ code: grpc.status; details: string }> {
    const pid = skiff.child.pid!;
    const before = await rssOf(pid);
    const { result, peak } = await peakRss(pid, () => codeOf(skiff.images.PullImage({ image: { image: ref } })));
    expect(result.status).toBe('fulfilled');
    const flooded = reg.requests.filter((r) => r.path.startsWith(floodPath));
    expect(flooded.length).toBeGreaterThan(0);
    for (const r of flooded) {
      // skiff closed the connection itself, soon, after reading little.
      const closedAt = await Promise.race([r.closed, new Promise<number>((res) => setTimeout(() => res(-1), 5000))]);
      expect(closedAt, `connection for ${r.path} still open`).toBeGreaterThan(0);
      expect(r.sent).toBeLessThan(64 * MiB);
    }
    expect(peak - before, `RSS grew from ${before} to ${peak}`).toBeLessThan(64 * MiB);
    console.info(`${floodPath}: daemon RSS ${(before / MiB).toFixed(1)} MiB -> peak ${(peak / MiB).toFixed(1)} MiB; flood sent ${flooded.map((r) => (r.sent / MiB).toFixed(1)).join(', ')} MiB`);
    return (result as PromiseFulfilledResult<{ code: grpc.status; details: string }>).value;
  }

  beforeAll(async () => {
    img = await buildImage({
      layers: [
        // Incompressible, so that a download can stall half-way.
        { entries: [{ name: 'one', data: layerOneData }] },
        { entries: [{ name: 'two', data: 'two' }] },
      ],
    });
    reg = await new HostileRegistry().start();
    reg.serve('test/hostile', 'good', img);
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs, ['--image-pull-progress-timeout', `${PROGRESS_S}s`]).start();
    const cri = loadCri();
    raw = new cri.runtime.v1.ImageService(`unix:${dirs.socket}`, grpc.credentials.createInsecure()) as unknown as ImageServiceClient;
  });

  afterEach(async () => {
    reg.handler = () => false;
    // A normal pull works after every fault, and leaves nothing behind for the next test.
    if (skiff?.child.exitCode === null) {
      const ok = await skiff.images.PullImage({ image: { image: image('good') } });
      expect(ok.imageRef).toBe(img.config.digest);
      const imgs = await skiff.images.ListImages({});
      for (const i of imgs.images ?? []) await skiff.images.RemoveImage({ image: { image: i.id! } });
    }
    reg.requests.length = 0;
  });

  afterAll(async () => {
    raw?.close();
    await skiff?.stop();
    // A daemon that died cannot undo its own mounts: do it, so the directory can go.
    if (dirs) await unmountUnder(dirs.base);
    await reg?.close();
    for (const r of extra) await r.close();
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('stops reading an endless manifest at 4 MiB and closes the connection', async () => {
    on(
      (p) => p === manifestPath('bad'),
      (_req, res, seen) => {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' });
        flood(res, seen);
      },
    );
    const err = await underFlood(image(), manifestPath('bad'));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/manifest .* larger than the 4194304 bytes/);
  });

  it('reads only the start of an endless 404 error body', async () => {
    on(
      (p) => p === manifestPath('bad'),
      (_req, res, seen) => {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.write('{"errors":[{"code":"MANIFEST_UNKNOWN","message":"');
        flood(res, seen);
      },
    );
    const err = await underFlood(image(), manifestPath('bad'));
    expect(err.code).toBe(grpc.status.NOT_FOUND);
    expect(err.details).toMatch(/not found/);
    expect(err.details.length).toBeLessThan(16 << 10);
  });

  it('stops reading an endless token answer at 1 MiB', async () => {
    on(
      (p) => p === manifestPath('bad') || p === '/token',
      (req, res, seen) => {
        if (req.url!.startsWith('/token')) {
          res.writeHead(200, { 'content-type': 'application/json' });
          res.write('{"token":"');
          flood(res, seen);
          return;
        }
        res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${reg.host}/token",service="hostile"` });
        res.end();
      },
    );
    const err = await underFlood(image(), '/token');
    expect(err.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(err.details).toMatch(/token answer .* larger than the 1048576 bytes/);
  });

  it('stops reading an endless error answer from the token server', async () => {
    on(
      (p) => p === manifestPath('bad') || p === '/token',
      (req, res, seen) => {
        if (req.url!.startsWith('/token')) {
          res.writeHead(403, { 'content-type': 'text/plain' });
          flood(res, seen);
          return;
        }
        res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${reg.host}/token",service="hostile"` });
        res.end();
      },
    );
    const err = await underFlood(image(), '/token');
    expect(err.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(err.details).toMatch(/refused .*\(403\)/);
  });

  it('refuses a manifest whose Content-Length is over the limit without reading it', async () => {
    on(
      (p) => p === manifestPath('bad'),
      (_req, res, seen) => {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json', 'content-length': String(10 * 1024 * MiB) });
        flood(res, seen);
      },
    );
    const err = await underFlood(image(), manifestPath('bad'));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/is 10737418240 bytes, more than the 4194304/);
  });

  it('refuses a blob whose Content-Length differs from its descriptor', async () => {
    reg.serve('test/hostile', 'bad', img);
    const layer = img.layers[0]!;
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res, seen) => {
        res.writeHead(200, { 'content-length': String(layer.data.length + 1) });
        flood(res, seen);
      },
    );
    const err = await underFlood(image(), `/v2/test/hostile/blobs/${layer.digest}`);
    expect(err.details).toMatch(new RegExp(`is ${layer.data.length + 1} bytes, its descriptor says ${layer.data.length}`));
  });

  it('fails a blob with one byte too many the moment it arrives', async () => {
    reg.serve('test/hostile', 'bad', img);
    const layer = img.layers[0]!;
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res, seen) => {
        // Chunked, so only counting can tell; then an endless tail.
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        res.write(layer.data);
        seen.sent += layer.data.length;
        flood(res, seen, Buffer.from([0x42]));
      },
    );
    const err = await underFlood(image(), `/v2/test/hostile/blobs/${layer.digest}`);
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/larger than the \d+ bytes its descriptor says/);
    expect(await fs.readdir(`${dirs.root}/content/blobs/sha256`)).not.toContain(layer.digest.slice(7));
  });

  it('fails a blob with one byte too few', async () => {
    reg.serve('test/hostile', 'bad', img);
    const layer = img.layers[0]!;
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/octet-stream' });
        res.end(layer.data.subarray(0, layer.data.length - 1));
      },
    );
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(new RegExp(`ended after ${layer.data.length - 1} of the ${layer.data.length} bytes`));
  });

  it('refuses an image with more layers than it accepts, before fetching any', async () => {
    const many = {
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: img.config.digest, size: img.config.data.length },
      layers: Array.from({ length: 129 }, () => ({ mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', digest: img.layers[1]!.digest, size: img.layers[1]!.data.length })),
    };
    on(
      (p) => p === manifestPath('bad'),
      (_req, res) => {
        res.writeHead(200, { 'content-type': many.mediaType }).end(JSON.stringify(many));
      },
    );
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/129 layers, more than the 128/);
    expect(reg.requests.filter((r) => r.path.includes('/blobs/')).length).toBe(0);
  });

  it('refuses an index nested in an index instead of following it', async () => {
    const inner = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [] }));
    const innerDigest = `sha256:${createHash('sha256').update(inner).digest('hex')}`;
    const outer = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: [{ mediaType: 'application/vnd.oci.image.index.v1+json', digest: innerDigest, size: inner.length, platform: { os: 'linux', architecture: process.arch === 'arm64' ? 'arm64' : 'amd64' } }],
      }),
    );
    on(
      (p) => p === manifestPath('bad') || p === manifestPath(innerDigest),
      (req, res) => {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.index.v1+json' }).end(req.url!.includes(innerDigest) ? inner : outer);
      },
    );
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/unsupported manifest media type "application\/vnd.oci.image.index.v1\+json"/);
    expect(reg.requests.filter((r) => r.path.includes('/manifests/')).length).toBe(2);
  });

  it('refuses an image config larger than 8 MiB by its descriptor', async () => {
    const big = {
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: img.config.digest, size: 64 * MiB },
      layers: [],
    };
    on(
      (p) => p === manifestPath('bad'),
      (_req, res) => {
        res.writeHead(200, { 'content-type': big.mediaType }).end(JSON.stringify(big));
      },
    );
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(err.details).toMatch(/image config .* is 67108864 bytes, more than the 8388608/);
  });

  it('follows at most 10 redirects', async () => {
    on(
      (p) => p === manifestPath('bad'),
      (_req, res) => {
        res.writeHead(307, { location: manifestPath('bad') }).end();
      },
    );
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    expect(err.details).toMatch(/more than 10 redirects/);
    // 11 per attempt (the first and ten redirects), and a redirect loop is retried like any unavailable registry.
    expect(reg.requests.length % 11).toBe(0);
  });

  it('stops a pull whose registry stalls after the headers once the client deadline passes', async () => {
    on(
      (p) => p === manifestPath('bad'),
      (_req, res) => {
        res.writeHead(200, { 'content-type': 'application/vnd.oci.image.manifest.v1+json' });
        res.write('{');
      },
    );
    const started = Date.now();
    const err = await codeOf(pullWithDeadline(image(), 2000));
    expect([grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]).toContain(err.code);
    const stalled = reg.requests.filter((r) => r.path.startsWith(manifestPath('bad')));
    expect(stalled.length).toBe(1);
    const closedAt = await Promise.race([stalled[0]!.closed, new Promise<number>((r) => setTimeout(() => r(-1), 10_000))]);
    expect(closedAt, 'skiff kept the stalled request open').toBeGreaterThan(0);
    // Closed by the cancellation (at ~2 s), well before the daemon's own progress timeout.
    expect(closedAt - started).toBeLessThan(2000 + 1500);
    await waitForLog(/PullImage.*DEADLINE_EXCEEDED|PullImage.*CANCELLED/);
  });

  it('stops a blob download that stalls mid-body once the client deadline passes', async () => {
    reg.serve('test/hostile', 'bad', img);
    const layer = img.layers[0]!;
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res) => {
        res.writeHead(200, { 'content-length': String(layer.data.length) });
        res.write(layer.data.subarray(0, 1000));
      },
    );
    const started = Date.now();
    const err = await codeOf(pullWithDeadline(image(), 2000));
    expect([grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]).toContain(err.code);
    const stalled = reg.requests.filter((r) => r.path.endsWith(layer.digest));
    expect(stalled.length).toBe(1);
    const closedAt = await Promise.race([stalled[0]!.closed, new Promise<number>((r) => setTimeout(() => r(-1), 10_000))]);
    expect(closedAt, 'skiff kept the stalled download open').toBeGreaterThan(0);
    expect(closedAt - started).toBeLessThan(2000 + 1500);
  });

  it('drops only the cancelling caller of a shared pull', async () => {
    reg.serve('test/hostile', 'shared', img);
    const layer = img.layers[0]!;
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res) => {
        res.writeHead(200, { 'content-length': String(layer.data.length) });
        res.write(layer.data.subarray(0, 1000));
        void released.then(() => res.end(layer.data.subarray(1000)));
      },
    );
    const patient = skiff.images.PullImage({ image: { image: image('shared') } });
    const hasty = await codeOf(pullWithDeadline(image('shared'), 1500));
    expect([grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]).toContain(hasty.code);
    release();
    expect((await patient).imageRef).toBe(img.config.digest);
    expect(reg.requests.filter((r) => r.path.endsWith(layer.digest)).length).toBe(1);
  });

  it('finishes a layer for another image when the pull that started it is cancelled', async () => {
    // Same first layer, different second: two images, two pulls, one shared layer download.
    const other = await buildImage({ layers: [{ entries: [{ name: 'one', data: layerOneData }] }, { entries: [{ name: 'other', data: 'o' }] }] });
    expect(other.layers[0]!.digest).toBe(img.layers[0]!.digest);
    reg.serve('test/hostile', 'first', img);
    reg.serve('test/hostile-other', 'v1', other);
    const layer = img.layers[0]!;
    let release!: () => void;
    const released = new Promise<void>((r) => (release = r));
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res) => {
        res.writeHead(200, { 'content-length': String(layer.data.length) });
        res.write(layer.data.subarray(0, 1000));
        void released.then(() => res.end(layer.data.subarray(1000)));
      },
    );
    const hasty = codeOf(pullWithDeadline(image('first'), 1500));
    // Let the hasty pull start the shared layer before the patient one asks for it.
    await waitUntil(() => reg.requests.some((r) => r.path.endsWith(layer.digest)));
    const patient = skiff.images.PullImage({ image: { image: `${reg.host}/test/hostile-other:v1` } });
    expect([grpc.status.DEADLINE_EXCEEDED, grpc.status.CANCELLED]).toContain((await hasty).code);
    release();
    expect((await patient).imageRef).toBe(other.config.digest);
  });

  it(`fails a download that makes no progress for --image-pull-progress-timeout (${PROGRESS_S}s)`, async () => {
    reg.serve('test/hostile', 'bad', img);
    const layer = img.layers[0]!;
    on(
      (p) => p.endsWith(layer.digest),
      (_req, res) => {
        res.writeHead(200, { 'content-length': String(layer.data.length) });
        res.write(layer.data.subarray(0, 1000));
      },
    );
    const started = Date.now();
    const err = await codeOf(skiff.images.PullImage({ image: { image: image() } }));
    const took = Date.now() - started;
    expect(err.code).toBe(grpc.status.DEADLINE_EXCEEDED);
    expect(err.details).toMatch(new RegExp(`no progress for ${PROGRESS_S}s fetching blob ${layer.digest} from ${reg.host}`));
    expect(took).toBeGreaterThanOrEqual(PROGRESS_S * 1000 - 200);
    expect(took).toBeLessThan(PROGRESS_S * 1000 + 5000);
  });

  it('never sends credentials to the host a blob is redirected to', async () => {
    // Blob storage on another loopback address: a different host to skiff.
    const storage = await new HostileRegistry('127.0.0.2').start();
    extra.push(storage);
    storage.serve('test/hostile', 'v1', img);
    const user = 'alice';
    const pass = 's3cret';
    const basic = `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
    reg.handler = (req, res) => {
      if (req.headers.authorization !== basic) {
        res.writeHead(401, { 'www-authenticate': 'Basic realm="hostile"' }).end();
        return true;
      }
      const p = new URL(req.url!, 'http://x').pathname;
      if (p.includes('/blobs/')) {
        res.writeHead(307, { location: `http://${storage.host}${p}?signed=1` }).end();
        return true;
      }
      return false;
    };
    const ok = await skiff.images.PullImage({ image: { image: `${reg.host}/test/hostile:good` }, auth: { username: user, password: pass } });
    expect(ok.imageRef).toBe(img.config.digest);
    const atStorage = storage.requests.filter((r) => r.path.includes('/blobs/'));
    expect(atStorage.length).toBe(1 + img.layers.length);
    for (const r of atStorage) {
      expect(r.headers.authorization).toBeUndefined();
      expect(JSON.stringify(r.headers)).not.toContain(Buffer.from(`${user}:${pass}`).toString('base64'));
    }
    // The registry itself did get them.
    expect(reg.requests.some((r) => r.headers.authorization === basic)).toBe(true);
    await skiff.images.RemoveImage({ image: { image: ok.imageRef! } });

    // Storage that asks for credentials itself gets none, and its token realm is never contacted.
    storage.handler = (req, res) => {
      if (req.url!.startsWith('/token')) {
        res.writeHead(200, { 'content-type': 'application/json' }).end('{"token":"t"}');
        return true;
      }
      res.writeHead(401, { 'www-authenticate': `Bearer realm="http://${storage.host}/token",service="storage"` }).end();
      return true;
    };
    storage.requests.length = 0;
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg.host}/test/hostile:good` }, auth: { username: user, password: pass } }));
    expect(err.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(err.details).toMatch(/asked for credentials; skiff sends them only to/);
    expect(storage.requests.some((r) => r.path.startsWith('/token'))).toBe(false);
    expect(storage.requests.every((r) => r.headers.authorization === undefined)).toBe(true);
  });

  async function waitUntil(fn: () => boolean): Promise<void> {
    const deadline = Date.now() + 5000;
    while (!fn()) {
      if (Date.now() > deadline) throw new Error('timed out waiting');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  async function waitForLog(re: RegExp): Promise<void> {
    const deadline = Date.now() + 5000;
    while (!re.test(skiff.log)) {
      if (Date.now() > deadline) throw new Error(`no log line matching ${re}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }
});
