/**
 * The unpacker against hostile layers, called directly on tars built in
 * memory: each case is one of the ways a layer was seen to reach outside its
 * directory, and the outside tree must come out of it unchanged.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { findInLowers } from '../../src/image/snapshot.js';
import { applyLayer } from '../../src/image/unpack.js';
import { lgetxattr } from '../../src/sys/libc.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { tarOf, type Entry } from '../helpers/oci.js';

/** Every path below `dir` with its kind, mode, owner, size and content (or link target). */
export async function fingerprint(dir: string): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    for (const name of (await fs.readdir(d)).sort()) {
      const p = path.join(d, name);
      const st = await fs.lstat(p);
      let what = '';
      if (st.isSymbolicLink()) what = `-> ${await fs.readlink(p)}`;
      else if (st.isFile()) what = (await fs.readFile(p)).toString('base64');
      out.push(`${path.relative(dir, p)} ${st.mode.toString(8)} ${st.uid}:${st.gid} ${st.rdev} ${st.nlink} ${what}`);
      if (st.isDirectory()) await walk(p);
    }
  };
  await walk(dir);
  return out;
}

describe.skipIf(!isRoot)(`applyLayer keeps every write inside the layer (${isRoot ? 'root' : rootSkipReason})`, () => {
  let base: string;
  let host: string;
  let layers: string[];
  let before: string[];
  let made = 0;

  beforeEach(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-unpack-'));
    host = path.join(base, 'host');
    await fs.mkdir(path.join(host, 'dir'), { recursive: true });
    await fs.writeFile(path.join(host, 'dir/secret'), 'host secret');
    await fs.writeFile(path.join(host, 'victim'), 'untouched');
    layers = [];
    before = await fingerprint(host);
  });
  afterEach(async () => {
    expect(await fingerprint(host)).toEqual(before);
    await fs.rm(base, { recursive: true, force: true });
  });

  /** Applies `entries` as the next layer up; lower layers are found as the image service finds them. */
  async function apply(entries: Entry[] | Buffer) {
    const dir = path.join(base, `layer${made++}`);
    await fs.mkdir(dir);
    const lowers = [...layers].reverse();
    const tar = Buffer.isBuffer(entries) ? entries : await tarOf(entries);
    const res = await applyLayer(dir, Readable.from([tar]), { lookupLower: (rel) => findInLowers(lowers, rel) });
    layers.push(dir);
    return { dir, res };
  }

  it('refuses a file written through a directory the layer replaced by a symlink (defect 1)', async () => {
    await expect(
      apply([
        { name: 'sw/', type: 'directory' },
        { name: 'sw', type: 'symlink', linkname: path.join(host, 'dir') },
        { name: 'sw/x', data: 'escaped' },
      ]),
    ).rejects.toThrow(/parent "sw" is a symlink/);
    await expect(
      apply([
        { name: 'a/b/', type: 'directory' },
        { name: 'a/b/c', data: '1' },
        { name: 'a', type: 'symlink', linkname: host },
        { name: 'a/b/c', data: 'escaped' },
      ]),
    ).rejects.toThrow(/parent "a" is a symlink/);
  });

  it('does not chmod, chown or date a host directory through a swapped parent (defect 1)', async () => {
    await expect(
      apply([
        { name: 'd/', type: 'directory' },
        { name: 'd/sub/', type: 'directory' },
        { name: 'd', type: 'symlink', linkname: host },
        { name: 'd/dir/', type: 'directory', mode: 0o777, uid: 4242 },
      ]),
    ).rejects.toThrow(/symlink/);
    // Directory times are set at the end: a directory later replaced by a symlink is skipped, not followed.
    const { dir } = await apply([
      { name: 't/', type: 'directory', mtime: new Date(0) },
      { name: 't', type: 'symlink', linkname: path.join(host, 'dir') },
    ]);
    expect(await fs.readlink(path.join(dir, 't'))).toBe(path.join(host, 'dir'));
  });

  it('does not take a hardlink target through a symlink in a lower layer (defect 2)', async () => {
    await apply([{ name: 'lk', type: 'symlink', linkname: path.join(host, 'dir') }]);
    await expect(apply([{ name: 'stolen', type: 'link', linkname: 'lk/secret' }])).rejects.toThrow(/not in this layer or below/);
    // A relative symlink that climbs out is refused the same way.
    await apply([{ name: 'up', type: 'symlink', linkname: '../host/dir' }]);
    await expect(apply([{ name: 'stolen', type: 'link', linkname: 'up/secret' }])).rejects.toThrow(/not in this layer or below/);
  });

  it('refuses a hardlink whose own path holds its target, rather than failing midway', async () => {
    await expect(apply([{ name: 'f', data: 'x' }, { name: 'f', type: 'link', linkname: 'f' }])).rejects.toThrow(/hardlink to itself/);
    await expect(apply([{ name: 'd/f', data: 'x' }, { name: 'd', type: 'link', linkname: 'd/f' }])).rejects.toThrow(/hardlink to itself or to something below it/);
  });

  it('copies a lower file up for a hardlink, but not one hidden by a whiteout or an opaque dir', async () => {
    await apply([{ name: 'd/f', data: 'lower' }, { name: 'e/g', data: 'gone' }, { name: 'o/h', data: 'hidden' }]);
    await apply([{ name: 'e/.wh.g', data: '' }, { name: 'o/.wh..wh..opq', data: '' }]);
    const { dir } = await apply([{ name: 'l', type: 'link', linkname: 'd/f' }]);
    expect(await fs.readFile(path.join(dir, 'l'), 'utf8')).toBe('lower');
    expect((await fs.lstat(path.join(dir, 'l'))).ino).toBe((await fs.lstat(path.join(dir, 'd/f'))).ino);
    await expect(apply([{ name: 'l2', type: 'link', linkname: 'e/g' }])).rejects.toThrow(/not in this layer or below/);
    await expect(apply([{ name: 'l3', type: 'link', linkname: 'o/h' }])).rejects.toThrow(/not in this layer or below/);
  });

  it('refuses a whiteout through a directory the layer swapped for a symlink (defect 3)', async () => {
    await expect(
      apply([
        { name: 'w/', type: 'directory' },
        { name: 'w', type: 'symlink', linkname: host },
        { name: 'w/.wh.victim', data: '' },
      ]),
    ).rejects.toThrow(/parent "w" is a symlink/);
    await expect(
      apply([
        { name: 'w/', type: 'directory' },
        { name: 'w', type: 'symlink', linkname: host },
        { name: 'w/.wh..wh..opq', data: '' },
      ]),
    ).rejects.toThrow(/parent "w" is a symlink/);
    expect(lgetxattr(host, 'trusted.overlay.opaque')).toBeUndefined();
  });

  it('stops at the end-of-archive marker and refuses data after it (defect 4)', async () => {
    const visible = await tarOf([{ name: 'seen', data: 'a' }]);
    const hidden = await tarOf([{ name: 'hidden', data: 'b' }]);
    await expect(apply(Buffer.concat([visible, hidden]))).rejects.toThrow(/data after the end-of-archive marker/);
    // One zero block and then an entry: Go's reader calls that a broken header.
    await expect(apply(Buffer.concat([visible.subarray(0, visible.length - 512), hidden]))).rejects.toThrow(/zero block/);
    // Zero padding after the marker (tar's 10 KiB records) is fine, and nothing past the marker is read.
    const { dir } = await apply(Buffer.concat([visible, Buffer.alloc(9216)]));
    expect(await fs.readdir(dir)).toEqual(['seen']);
  });

  it('refuses entries that Go would frame differently', async () => {
    const t = await tarOf([{ name: 's', type: 'symlink', linkname: 'x' }]);
    // A symlink header that claims a data size: tar-stream would skip the bytes, Go reads them as entries.
    const h = Buffer.from(t.subarray(0, 512));
    h.write('00000001000\0', 124, 'ascii');
    h.write('        ', 148, 'ascii');
    let sum = 0;
    for (const b of h) sum += b;
    h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'ascii');
    await expect(apply(Buffer.concat([h, await tarOf([{ name: 'inner', data: 'z' }])]))).rejects.toThrow(/claims 512 bytes/);
    // An old GNU sparse entry, whose extension blocks Go would read as part of it.
    const sparse = Buffer.from(t.subarray(0, 512));
    sparse.write('S', 156, 'ascii');
    sparse.write('        ', 148, 'ascii');
    sum = 0;
    for (const b of sparse) sum += b;
    sparse.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'ascii');
    await expect(apply(Buffer.concat([sparse, Buffer.alloc(1024)]))).rejects.toThrow(/GNU sparse entry/);
  });

  it('frames pax-sized entries as Go does, and refuses pax records Go would read differently', async () => {
    const paxRecord = (k: string, v: string) => {
      const body = ` ${k}=${v}\n`;
      let len = body.length + 1;
      while (String(len).length + body.length !== len) len = String(len).length + body.length;
      return Buffer.from(`${len}${body}`);
    };
    /** A ustar header block with typeflag `flag` and a right checksum. */
    const block = (name: string, flag: string, size: number) => {
      const h = Buffer.alloc(512);
      h.write(name, 0, 'utf8');
      h.write('0000644\0', 100, 'ascii');
      h.write('0000000\0', 108, 'ascii');
      h.write('0000000\0', 116, 'ascii');
      h.write(size.toString(8).padStart(11, '0') + '\0', 124, 'ascii');
      h.write('00000000000\0', 136, 'ascii');
      h.write('        ', 148, 'ascii');
      h.write(flag, 156, 'ascii');
      h.write('ustar\u000000', 257, 'binary');
      let sum = 0;
      for (const b of h) sum += b;
      h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'ascii');
      return h;
    };
    const pad = (b: Buffer) => Buffer.concat([b, Buffer.alloc((512 - (b.length % 512)) % 512)]);
    const pax = (flag: string, records: Buffer) => Buffer.concat([block('pax', flag, records.length), pad(records)]);
    const end = Buffer.alloc(1024);
    // The pax size (600) wins over the header's (0), for both readers.
    const data = Buffer.alloc(600, 0x61);
    const { dir } = await apply(Buffer.concat([pax('x', paxRecord('size', '600')), block('big', '0', 0), pad(data), end]));
    expect((await fs.readFile(path.join(dir, 'big'))).equals(data)).toBe(true);
    await expect(apply(Buffer.concat([pax('x', paxRecord('size', '12abc')), block('f', '0', 0), end]))).rejects.toThrow(/pax size/);
    await expect(apply(Buffer.concat([pax('g', paxRecord('path', 'renamed')), block('f', '0', 0), end]))).rejects.toThrow(/global pax header sets "path"/);
  });

  it('validates whiteout names like every other path (defect 5)', async () => {
    for (const name of ['.wh...', '.wh..', '.wh.', 'sub/.wh...']) {
      await expect(apply([{ name, data: '' }]), name).rejects.toThrow(/whiteout of no file/);
    }
    // aufs bookkeeping names are not whiteouts.
    const { dir } = await apply([{ name: '.wh..wh.plnk', data: '' }, { name: 'f', data: 'x' }]);
    expect(await fs.readdir(dir)).toEqual(['f']);
  });

  it('writes large files byte for byte, from a gzip stream in small chunks', async () => {
    const { randomBytes } = await import('node:crypto');
    const zlib = await import('node:zlib');
    const big = randomBytes((3 << 20) + 17);
    const tar = await tarOf([{ name: 'big', data: big }, { name: 'after', data: 'tail' }]);
    const gz = zlib.gzipSync(tar);
    const chunks = Array.from({ length: Math.ceil(gz.length / 7000) }, (_, i) => gz.subarray(i * 7000, (i + 1) * 7000));
    const dir = path.join(base, 'big');
    await fs.mkdir(dir);
    const res = await applyLayer(dir, Readable.from(chunks));
    expect((await fs.readFile(path.join(dir, 'big'))).equals(big)).toBe(true);
    expect(await fs.readFile(path.join(dir, 'after'), 'utf8')).toBe('tail');
    expect(res.size).toBe(big.length + 4);
  });

  it('still unpacks the ordinary forms: whiteouts, opaque dirs, links, devices, modes and xattrs', async () => {
    const mtime = new Date('2020-01-02T03:04:05Z');
    const { dir } = await apply([
      { name: 'd/', type: 'directory', mode: 0o750, uid: 7, gid: 8, mtime },
      { name: 'd/f', data: 'file', mode: 0o4755, mtime, xattrs: { 'user.k': Buffer.from('v') } },
      { name: 'd/h', type: 'link', linkname: 'd/f' },
      { name: 'd/s', type: 'symlink', linkname: '/etc/passwd' },
      { name: 'd/null', type: 'character-device', devmajor: 1, devminor: 3, mode: 0o666 },
      { name: 'd/.wh.gone', data: '' },
      { name: 'o/.wh..wh..opq', data: '' },
      { name: 'd/s', data: 'replaced the symlink' },
    ]);
    const d = await fs.lstat(path.join(dir, 'd'));
    expect([d.mode & 0o7777, d.uid, d.gid, d.mtime.toISOString()]).toEqual([0o750, 7, 8, mtime.toISOString()]);
    const f = await fs.lstat(path.join(dir, 'd/f'));
    expect([f.mode & 0o7777, f.nlink, f.mtime.toISOString()]).toEqual([0o4755, 2, mtime.toISOString()]);
    expect(lgetxattr(path.join(dir, 'd/f'), 'user.k')?.toString()).toBe('v');
    expect(await fs.readFile(path.join(dir, 'd/s'), 'utf8')).toBe('replaced the symlink');
    const nul = await fs.lstat(path.join(dir, 'd/null'));
    expect([nul.isCharacterDevice(), nul.rdev, nul.mode & 0o777]).toEqual([true, (1 << 8) | 3, 0o666]);
    const wh = await fs.lstat(path.join(dir, 'd/gone'));
    expect([wh.isCharacterDevice(), wh.rdev]).toEqual([true, 0]);
    expect(lgetxattr(path.join(dir, 'o'), 'trusted.overlay.opaque')?.toString()).toBe('y');
  });
});
