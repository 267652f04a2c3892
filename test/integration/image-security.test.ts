import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { buildImage, Pusher, type Entry } from '../helpers/oci.js';

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
  });
  afterAll(async () => {
    await skiff?.stop();
    await fs.rm(dirs.base, { recursive: true, force: true });
    await fs.rm(outside, { recursive: true, force: true });
  });

  const relOut = () => `../../../../../../../../..${outside}`;
  const cases: Array<[string, () => Entry[], RegExp]> = [
    ['a ".." entry', () => [{ name: `${relOut()}/pwned`, data: 'x' }], /refusing layer entry .*\.\./],
    ['an absolute entry', () => [{ name: `${outside}/pwned`, data: 'x' }], /refusing layer entry .*absolute/],
    ['a file below a symlink to the outside', () => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/pwned', data: 'x' }], /parent "link" is a symlink/],
    ['a file below a relative symlink that climbs out', () => [{ name: 'up', type: 'symlink', linkname: relOut() }, { name: 'up/pwned', data: 'x' }], /parent "up" is a symlink/],
    ['a directory below a symlink', () => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/sub/', type: 'directory' }], /symlink/],
    ['a whiteout below a symlink', () => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/.wh.victim', data: '' }], /symlink/],
    ['an opaque marker below a symlink', () => [{ name: 'link', type: 'symlink', linkname: outside }, { name: 'link/.wh..wh..opq', data: '' }], /symlink/],
    ['a hardlink that climbs out', () => [{ name: 'h', type: 'link', linkname: `${relOut()}/victim` }], /refusing layer entry .*\.\./],
    ['a hardlink to an absolute path', () => [{ name: 'h', type: 'link', linkname: `${outside}/victim` }], /absolute/],
    ['a hardlink through a symlinked parent', () => [{ name: 's', type: 'symlink', linkname: outside }, { name: 'h', type: 'link', linkname: 's/victim' }], /parent "s" is a symlink/],
  ];

  for (const [what, entries, message] of cases) {
    it(`refuses ${what}`, async () => {
      const before = await listTree(dirs.root);
      const img = await buildImage({ layers: [{ entries: [{ name: 'ok', data: 'fine' }] }, { entries: entries() }] });
      const name = `test/hostile-${what.replace(/[^a-z]+/g, '-').replace(/^-|-$/g, '')}`;
      await push.image(name, 'v1', img);
      const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg}/${name}:v1` } }));
      expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
      expect(err.details).toMatch(message);
      // Nothing written outside, nothing kept inside.
      expect(await fs.readdir(outside)).toEqual(['victim']);
      expect(await fs.readFile(path.join(outside, 'victim'), 'utf8')).toBe('untouched');
      expect(await listTree(dirs.root)).toEqual(before);
      const list = await skiff.images.ListImages({});
      expect(list.images).toEqual([]);
    });
  }

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
