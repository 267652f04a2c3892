/**
 * Directory times without a list of directories: each directory keeps the
 * time its own entry gave it, whatever entries come before or after it, and
 * a layer of very many directories with long names costs the unpacker no
 * memory per directory (it used to remember every directory's path).
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import v8 from 'node:v8';
import vm from 'node:vm';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { findInLowers } from '../../src/image/snapshot.js';
import { applyLayer } from '../../src/image/unpack.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { tarOf, type Entry } from '../helpers/oci.js';

v8.setFlagsFromString('--expose-gc');
const gc = vm.runInNewContext('gc') as () => void;

describe.skipIf(!isRoot)(`directory times (${isRoot ? 'root' : rootSkipReason})`, () => {
  let base: string;
  beforeEach(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-dirtimes-'));
  });
  afterEach(async () => {
    await fs.rm(base, { recursive: true, force: true });
  });

  async function apply(entries: Entry[], lowers: string[] = []): Promise<string> {
    const dir = path.join(base, `l${lowers.length}`);
    await fs.mkdir(dir);
    await applyLayer(dir, Readable.from([await tarOf(entries)]), { lookupLower: async (rel) => findInLowers(lowers, rel) });
    return dir;
  }

  const t1 = new Date('2001-01-01T00:00:00Z');
  const t2 = new Date('2002-02-02T00:00:00Z');
  const t3 = new Date('2003-03-03T00:00:00Z');
  const mtime = async (p: string) => (await fs.lstat(p)).mtime.toISOString();

  it('keeps each directory\'s own time, whether its children come after it, before it, or implicitly', async () => {
    const dir = await apply([
      { name: 'a/', type: 'directory', mtime: t1 },
      { name: 'a/f', data: 'x', mtime: t2 },
      { name: 'a/sub/', type: 'directory', mtime: t2 },
      { name: 'a/sub/deep/implicit/file', data: 'y', mtime: t3 },
      { name: 'b/child', data: 'z', mtime: t3 },
      { name: 'b/', type: 'directory', mtime: t2 },
      { name: 'b/later', type: 'symlink', linkname: 'child', mtime: t3 },
      { name: 'a/.wh.gone', data: '' },
      { name: 'a/sub/.wh..wh..opq', data: '' },
      { name: 'a/h', type: 'link', linkname: 'a/f' },
    ]);
    expect(await mtime(path.join(dir, 'a'))).toBe(t1.toISOString());
    expect(await mtime(path.join(dir, 'a/sub'))).toBe(t2.toISOString());
    expect(await mtime(path.join(dir, 'a/f'))).toBe(t2.toISOString());
    expect(await mtime(path.join(dir, 'b'))).toBe(t2.toISOString());
    expect(await mtime(path.join(dir, 'a/sub/deep/implicit/file'))).toBe(t3.toISOString());
  });

  it('still copies up a hardlinked lower file unless an opaque directory of this layer hides it', async () => {
    const lower = await apply([{ name: 'o/', type: 'directory' }, { name: 'o/f', data: 'lower' }, { name: 'p/', type: 'directory' }, { name: 'p/f', data: 'lower too' }]);
    const upper = await apply(
      [
        { name: 'o/', type: 'directory', mtime: t1, xattrs: { 'trusted.overlay.opaque': Buffer.from('y') } },
        { name: 'p/', type: 'directory', mtime: t1 },
        { name: 'p/h', type: 'link', linkname: 'p/f' },
      ],
      [lower],
    );
    expect(await fs.readFile(path.join(upper, 'p/h'), 'utf8')).toBe('lower too');
    expect(await mtime(path.join(upper, 'p'))).toBe(t1.toISOString());
    await expect(apply([{ name: 'o/.wh..wh..opq', data: '' }, { name: 'o/h', type: 'link', linkname: 'o/f' }], [lower, upper])).rejects.toThrow(/not in this layer or below/);
    const hiddenByXattr = path.join(base, 'x');
    await fs.mkdir(hiddenByXattr);
    const tar = await tarOf([{ name: 'o/', type: 'directory', xattrs: { 'trusted.overlay.opaque': Buffer.from('y') } }, { name: 'o/h', type: 'link', linkname: 'o/f' }]);
    await expect(applyLayer(hiddenByXattr, Readable.from([tar]), { lookupLower: async (rel) => findInLowers([lower], rel) })).rejects.toThrow(/not in this layer or below/);
  });

  it('unpacks thousands of directories with 3.7 KiB paths without holding their paths', async () => {
    const prefix = Array.from({ length: 14 }, (_, i) => `${'d'.repeat(250)}${i}`).join('/');
    const entries: Entry[] = [{ name: `${prefix}/`, type: 'directory', mtime: t1 }];
    const n = 4000;
    for (let i = 0; i < n; i++) entries.push({ name: `${prefix}/${'e'.repeat(200)}${i}/`, type: 'directory', mtime: t2 });
    const tar = await tarOf(entries);
    const dir = path.join(base, 'many');
    await fs.mkdir(dir);
    // What stays reachable while it runs: a collection before each sample leaves no garbage in it.
    gc();
    const before = process.memoryUsage().heapUsed;
    let peak = before;
    const sampler = setInterval(() => {
      gc();
      peak = Math.max(peak, process.memoryUsage().heapUsed);
    }, 100);
    try {
      await applyLayer(dir, Readable.from([tar]));
    } finally {
      clearInterval(sampler);
    }
    expect(await mtime(path.join(dir, prefix))).toBe(t1.toISOString());
    // Their paths alone are 15 MB: remembered, they were all reachable by the end.
    expect(peak - before).toBeLessThan(6 << 20);
  });
});
