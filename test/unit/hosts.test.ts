import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isLoopbackHost, resolveEndpoints } from '../../src/image/hosts.js';

describe('resolveEndpoints (containerd hosts.toml)', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-hosts-'));
    const write = async (host: string, text: string) => {
      await fs.mkdir(path.join(dir, host), { recursive: true });
      await fs.writeFile(path.join(dir, host, 'hosts.toml'), text);
    };
    await write('docker.io', `server = "https://registry-1.docker.io"
[host."http://127.0.0.1:5000"]
  capabilities = ["pull", "resolve"]
[host."https://mirror.internal/prefix"]
  capabilities = ["pull"]
  skip_verify = true
  override_path = true
  ca = "mirror.pem"
  [host."https://mirror.internal/prefix".header]
    x-team = ["a", "b"]
`);
    await fs.writeFile(path.join(dir, 'docker.io', 'mirror.pem'), 'PEM');
    await write('myreg.io_5000_', 'server = "https://myreg.io:5000"\n');
    await write('_default', 'server = "http://fallback.local"\n');
    await write('broken.io', 'server = [unterminated\n');
  });
  afterAll(() => fs.rm(dir, { recursive: true, force: true }));

  it('uses defaults without a config directory', async () => {
    expect((await resolveEndpoints(undefined, 'docker.io')).map((e) => e.apiRoot)).toEqual(['https://registry-1.docker.io/v2']);
    expect((await resolveEndpoints(undefined, 'quay.io')).map((e) => e.apiRoot)).toEqual(['https://quay.io/v2']);
    expect((await resolveEndpoints(undefined, '127.0.0.1:5000')).map((e) => e.apiRoot)).toEqual(['http://127.0.0.1:5000/v2']);
    expect((await resolveEndpoints(path.join(dir, 'missing'), 'localhost:5000')).map((e) => e.apiRoot)).toEqual(['http://localhost:5000/v2']);
  });

  it('lists mirrors in order, then the server, with their settings', async () => {
    const eps = await resolveEndpoints(dir, 'docker.io');
    expect(eps.map((e) => [e.apiRoot, e.mirror, e.capabilities])).toEqual([
      ['http://127.0.0.1:5000/v2', true, ['pull', 'resolve']],
      ['https://mirror.internal/prefix', true, ['pull']],
      ['https://registry-1.docker.io/v2', false, ['pull', 'resolve', 'push']],
    ]);
    expect(eps[1]).toMatchObject({ skipVerify: true, ca: ['PEM'], headers: { 'x-team': ['a', 'b'] } });
  });

  it('finds host_port_ directories, then _default', async () => {
    expect((await resolveEndpoints(dir, 'myreg.io:5000')).map((e) => e.apiRoot)).toEqual(['https://myreg.io:5000/v2']);
    expect((await resolveEndpoints(dir, 'other.io')).map((e) => e.apiRoot)).toEqual(['http://fallback.local/v2']);
  });

  it('refuses a malformed hosts.toml with its path', async () => {
    await expect(resolveEndpoints(dir, 'broken.io')).rejects.toThrow(/invalid .*broken\.io\/hosts\.toml/);
  });
});

describe('isLoopbackHost', () => {
  it.each([
    'localhost',
    'localhost:5000',
    'LOCALHOST:80',
    '127.0.0.1',
    '127.0.0.1:5000',
    '127.1.2.3:443',
    '127.255.255.255',
    '::1',
    '[::1]',
    '[::1]:5000',
    '[0:0:0:0:0:0:0:1]:5000',
    '::ffff:127.0.0.1',
    '[::ffff:127.0.0.2]:80',
  ])('%s is loopback', (h) => expect(isLoopbackHost(h)).toBe(true));

  it.each([
    '127.evil.example.com',
    '127.evil.example.com:5000',
    '127.0.0.1.nip.io',
    '127.0.0.1.evil.com:5000',
    '127',
    '127.1',
    '1127.0.0.1',
    '128.0.0.1',
    '10.0.0.1:5000',
    'localhost.evil.com',
    'localhostx',
    '::2',
    '[::1]x',
    '[::1].evil.com',
    '::ffff:10.0.0.1',
    '0.0.0.0',
    'docker.io',
  ])('%s is not loopback', (h) => expect(isLoopbackHost(h)).toBe(false));

  it('decides the default scheme: only real loopback registries get plain http', async () => {
    expect((await resolveEndpoints(undefined, '127.evil.example.com')).map((e) => e.apiRoot)).toEqual(['https://127.evil.example.com/v2']);
    expect((await resolveEndpoints(undefined, '127.evil.example.com:5000')).map((e) => e.apiRoot)).toEqual(['https://127.evil.example.com:5000/v2']);
    expect((await resolveEndpoints(undefined, '127.0.0.2:5000')).map((e) => e.apiRoot)).toEqual(['http://127.0.0.2:5000/v2']);
    expect((await resolveEndpoints(undefined, '[::1]:5000')).map((e) => e.apiRoot)).toEqual(['http://[::1]:5000/v2']);
  });
});
