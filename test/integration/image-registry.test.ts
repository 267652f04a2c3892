import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, hostsToml, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { Front } from '../helpers/front.js';
import { buildImage, Pusher, type BuiltImage } from '../helpers/oci.js';
import { freePort } from '../helpers/registry.js';

describe.skipIf(!isRoot)('PullImage: registries, auth, mirrors and faults', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: string;
  let push: Pusher;
  let img: BuiltImage;
  const fronts: Front[] = [];

  async function front(opts: Omit<ConstructorParameters<typeof Front>[0], 'upstream'>): Promise<Front> {
    const f = await new Front({ upstream: `http://${reg}`, ...opts }).start();
    fronts.push(f);
    return f;
  }

  async function blobFiles(): Promise<string[]> {
    return (await fs.readdir(path.join(dirs.root, 'content', 'blobs', 'sha256'))).sort();
  }

  beforeAll(async () => {
    reg = inject('registryHost');
    push = new Pusher(`http://${reg}`);
    img = await buildImage({
      layers: [
        { entries: [{ name: 'one', data: Buffer.alloc(300_000, 1) }] },
        { entries: [{ name: 'two', data: Buffer.alloc(300_000, 2) }] },
        { entries: [{ name: 'three', data: 'three' }] },
      ],
    });
    await push.image('test/reg', 'v1', img);
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
  });
  afterEach(async () => {
    const imgs = await skiff.images.ListImages({});
    for (const i of imgs.images ?? []) await skiff.images.RemoveImage({ image: { image: i.id! } });
  });
  afterAll(async () => {
    await skiff?.stop();
    for (const f of fronts) await f.close();
    await fs.rm(dirs.base, { recursive: true, force: true });
  });

  it('follows the anonymous bearer-token flow', async () => {
    const f = await front({ auth: { kind: 'bearer' } });
    const res = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } });
    expect(res.imageRef).toBe(img.config.digest);
    expect(f.tokenRequests.length).toBeGreaterThan(0);
    expect(f.tokenRequests[0]).toMatchObject({ scope: 'repository:test/reg:pull', service: 'skiff-test', authorization: undefined });
  });

  it('sends the request\'s credentials to the token server, and reports a refusal', async () => {
    const f = await front({ auth: { kind: 'bearer', user: 'alice', pass: 's3cret' } });
    const denied = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } }));
    expect(denied.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(denied.details).toMatch(/bad username or password/);
    const wrong = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { username: 'alice', password: 'nope' } }));
    expect(wrong.code).toBe(grpc.status.UNAUTHENTICATED);
    const ok = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { username: 'alice', password: 's3cret' } });
    expect(ok.imageRef).toBe(img.config.digest);
    expect(f.tokenRequests.at(-1)?.authorization).toBe(`Basic ${Buffer.from('alice:s3cret').toString('base64')}`);
    // The base64 `auth` form works the same.
    await skiff.images.RemoveImage({ image: { image: ok.imageRef! } });
    const viaAuth = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { auth: Buffer.from('alice:s3cret').toString('base64') } });
    expect(viaAuth.imageRef).toBe(img.config.digest);
  });

  it('trades an identity token for an access token, and uses a registry token as it is', async () => {
    const f = await front({ auth: { kind: 'bearer', user: 'nobody-may-login', refreshToken: 'refresh-123', presetToken: 'preset-456' } });
    const viaIdentity = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { identityToken: 'refresh-123' } });
    expect(viaIdentity.imageRef).toBe(img.config.digest);
    expect(f.tokenRequests.at(-1)).toMatchObject({ authorization: 'refresh refresh-123', scope: 'repository:test/reg:pull' });
    await skiff.images.RemoveImage({ image: { image: viaIdentity.imageRef! } });
    const before = f.tokenRequests.length;
    const viaRegistryToken = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { registryToken: 'preset-456' } });
    expect(viaRegistryToken.imageRef).toBe(img.config.digest);
    expect(f.tokenRequests.length).toBe(before);
    const bad = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v2` }, auth: { identityToken: 'stale' } }));
    expect(bad.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(bad.details).toMatch(/invalid refresh token/);
  });

  it('uses basic auth when the registry asks for it', async () => {
    const f = await front({ auth: { kind: 'basic', user: 'bob', pass: 'pw' } });
    const denied = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } }));
    expect(denied.code).toBe(grpc.status.UNAUTHENTICATED);
    expect(denied.details).toMatch(/needs a username and password/);
    const ok = await skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` }, auth: { username: 'bob', password: 'pw' } });
    expect(ok.imageRef).toBe(img.config.digest);
  });

  it('pulls through a mirror from hosts.toml, with ?ns= naming the upstream', async () => {
    const f = await front({});
    const closed = await freePort();
    await hostsToml(dirs, 'mirrored.example', `server = "http://127.0.0.1:${closed}"\n[host."http://${f.host}"]\n  capabilities = ["pull", "resolve"]\n`);
    const res = await skiff.images.PullImage({ image: { image: 'mirrored.example/test/reg:v1' } });
    expect(res.imageRef).toBe(img.config.digest);
    expect(f.requests.some((r) => r.includes('/v2/test/reg/manifests/v1'))).toBe(true);
    const st = await skiff.images.ImageStatus({ image: { image: 'mirrored.example/test/reg:v1' } });
    expect(st.image?.repoTags).toEqual(['mirrored.example/test/reg:v1']);
  });

  it('falls back from a failing mirror to the server, and normalizes docker.io short names', async () => {
    const broken = await front({ failStatus: () => 503 });
    const good = await front({});
    await push.image('library/shortname', 'latest', img);
    await hostsToml(dirs, 'docker.io', `server = "http://${good.host}"\n[host."http://${broken.host}"]\n  capabilities = ["pull", "resolve"]\n`);
    const res = await skiff.images.PullImage({ image: { image: 'shortname' } });
    expect(res.imageRef).toBe(img.config.digest);
    expect(broken.requests.length).toBeGreaterThan(0);
    const st = await skiff.images.ImageStatus({ image: { image: 'docker.io/library/shortname:latest' } });
    expect(st.image?.repoTags).toEqual(['docker.io/library/shortname:latest']);
  });

  it('honours a pull-only mirror: tags resolve at the server, blobs come from the mirror', async () => {
    const mirror = await front({});
    const server = await front({});
    await hostsToml(dirs, 'pullonly.example', `server = "http://${server.host}"\n[host."http://${mirror.host}"]\n  capabilities = ["pull"]\n`);
    await skiff.images.PullImage({ image: { image: 'pullonly.example/test/reg:v1' } });
    expect(mirror.requests.some((r) => r.includes('/manifests/v1'))).toBe(false);
    expect(server.requests.some((r) => r.includes('/manifests/v1'))).toBe(true);
    expect(mirror.blobGets(img.layers[0]!.digest)).toBe(1);
  });

  it('trusts a registry\'s certificate through the hosts.toml ca file, and only then', async () => {
    const tlsDir = path.join(dirs.base, 'tls');
    await fs.mkdir(tlsDir, { recursive: true });
    const made = spawnSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
      '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(tlsDir, 'key.pem'), '-out', path.join(tlsDir, 'cert.pem')], { encoding: 'utf8' });
    expect(made.status, made.stderr).toBe(0);
    const tls = { key: await fs.readFile(path.join(tlsDir, 'key.pem'), 'utf8'), cert: await fs.readFile(path.join(tlsDir, 'cert.pem'), 'utf8') };
    const f = await front({ tls });
    // Not loopback-by-name defaults: the host is only reachable through the https server entry.
    await hostsToml(dirs, 'secure.example', `server = "https://${f.host}"\n`);
    const untrusted = await codeOf(skiff.images.PullImage({ image: { image: 'secure.example/test/reg:v1' } }));
    expect(untrusted.details).toMatch(/certificate/i);
    await hostsToml(dirs, 'secure.example', `server = "https://${f.host}"\nca = "${path.join(tlsDir, 'cert.pem')}"\n`);
    const ok = await skiff.images.PullImage({ image: { image: 'secure.example/test/reg:v1' } });
    expect(ok.imageRef).toBe(img.config.digest);
    await hostsToml(dirs, 'skipverify.example', `server = "https://${f.host}"\nskip_verify = true\n`);
    await skiff.images.RemoveImage({ image: { image: ok.imageRef! } });
    expect((await skiff.images.PullImage({ image: { image: 'skipverify.example/test/reg:v1' } })).imageRef).toBe(img.config.digest);
  });

  it('fails a pull whose blob does not match its digest, and keeps none of it', async () => {
    const before = await blobFiles();
    const f = await front({ corrupt: (p) => p.endsWith(img.layers[1]!.digest) });
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } }));
    expect(err.details).toMatch(/digest mismatch/);
    expect(await blobFiles()).toEqual(before);
    expect((await skiff.images.ListImages({})).images).toEqual([]);
  });

  it('answers UNAVAILABLE with the registry\'s words after retrying a 5xx', async () => {
    const f = await front({ failStatus: (p) => (p.includes('/manifests/') ? 503 : undefined) });
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } }));
    expect(err.code).toBe(grpc.status.UNAVAILABLE);
    expect(err.details).toMatch(/503.*injected failure 503/);
    expect(f.requests.filter((r) => r.includes('/manifests/')).length).toBe(3);
  });

  it('answers UNAVAILABLE when the registry is unreachable', async () => {
    const port = await freePort();
    const err = await codeOf(skiff.images.PullImage({ image: { image: `127.0.0.1:${port}/test/reg:v1` } }));
    expect(err.code).toBe(grpc.status.UNAVAILABLE);
    expect(err.details).toMatch(/unreachable.*ECONNREFUSED/);
  });

  it('shares one download between concurrent pulls of the same image', async () => {
    const f = await front({ delayMs: 300 });
    const ref = `${f.host}/test/reg:v1`;
    const results = await Promise.all([1, 2, 3].map(() => skiff.images.PullImage({ image: { image: ref } })));
    expect(new Set(results.map((r) => r.imageRef))).toEqual(new Set([img.config.digest]));
    for (const l of img.layers) expect(f.blobGets(l.digest)).toBe(1);
  });

  it('shares layer downloads between concurrent pulls of different images', async () => {
    const other = await buildImage({ layers: [{ entries: [{ name: 'one', data: Buffer.alloc(300_000, 1) }] }, { entries: [{ name: 'other', data: 'o' }] }] });
    await push.image('test/reg-other', 'v1', other);
    const f = await front({ delayMs: 300 });
    const [a, b] = await Promise.all([
      skiff.images.PullImage({ image: { image: `${f.host}/test/reg:v1` } }),
      skiff.images.PullImage({ image: { image: `${f.host}/test/reg-other:v1` } }),
    ]);
    expect(a.imageRef).toBe(img.config.digest);
    expect(b.imageRef).toBe(other.config.digest);
    const shared = img.layers[0]!.digest;
    expect(f.requests.filter((r) => r.startsWith('GET') && r.endsWith(shared)).length).toBe(1);
  });
});
