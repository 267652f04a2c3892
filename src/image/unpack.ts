/**
 * Applies one layer tar to an empty directory in the form overlayfs stacks:
 * `.wh.<name>` becomes a 0/0 character device, `.wh..wh..opq` sets
 * `trusted.overlay.opaque=y` on its directory. Nothing is ever written outside
 * the directory: absolute names, `..`, entries below a symlink and hardlinks
 * that leave the layer are refused, every path is resolved by the kernel
 * with openat2(2) beneath the root and through no symlink, and the archive
 * ends where Go's archive/tar says it does.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { PassThrough, Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import zlib from 'node:zlib';
import { spawn } from 'node:child_process';
import tar from 'tar-stream';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
// tar-stream does not export its header codec; load the very module its extractor uses.
export const tarHeaders = require(path.join(path.dirname(require.resolve('tar-stream')), 'headers.js')) as {
  decodePax: (buf: Buffer) => Record<string, string>;
  decode: (buf: Buffer, filenameEncoding: string, allowUnknownFormat: boolean) => unknown;
};
import { SkiffError, isErrno } from '../errors.js';
import {
  AT_FDCWD,
  closeFd,
  fsetxattr,
  lgetxattr,
  lsetxattr,
  mknod,
  O_CLOEXEC,
  O_PATH,
  openat2,
  RESOLVE_BENEATH,
  RESOLVE_NO_SYMLINKS,
  RESOLVE_NO_XDEV,
  S_IFBLK,
  S_IFCHR,
  S_IFIFO,
} from '../sys/libc.js';


export interface ApplyResult {
  /** sha256 of the uncompressed tar: the layer's diff id. */
  diffId: string;
  size: number;
  inodes: number;
}

export interface ApplyOptions {
  /**
   * Finds `relPath` in the layers below, for a hardlink whose target is not
   * in this layer. Returns the absolute path of a regular file, or undefined.
   */
  lookupLower?: (relPath: string) => Promise<string | undefined>;
  /** The source is the layer's tar already decompressed (by a caller that inflated its gzip): it is not decompressed again. */
  decompressed?: boolean;
}

/**
 * tar-stream decodes every pax value as UTF-8, which corrupts binary xattr
 * values such as security.capability. Its extractor looks the decoder up on
 * the module each time, so this one, which keeps xattr values byte for byte
 * (as latin1) and the rest as UTF-8, takes its place.
 */
tarHeaders.decodePax = function decodePax(buf: Buffer) {
  const out: Record<string, string> = {};
  while (buf.length) {
    const sp = buf.indexOf(0x20);
    const len = sp > 0 ? parseInt(buf.subarray(0, sp).toString('ascii'), 10) : NaN;
    if (!len || len > buf.length) break;
    const rec = buf.subarray(sp + 1, len - 1);
    const eq = rec.indexOf(0x3d);
    if (eq < 0) break;
    const key = rec.subarray(0, eq).toString('utf8');
    out[key] = rec.subarray(eq + 1).toString(key.startsWith('SCHILY.xattr.') ? 'latin1' : 'utf8');
    buf = buf.subarray(len);
  }
  return out;
};

const WHITEOUT_PREFIX = '.wh.';
const OPAQUE = '.wh..wh..opq';
const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;

function unsafe(name: string, why: string): SkiffError {
  return new SkiffError('InvalidArgument', `refusing layer entry "${name}": ${why}`);
}

/** Cleans an archive name into a relative path, or refuses it. */
export function cleanEntryName(name: string): string {
  if (name.includes('\0')) throw unsafe(name, 'name contains a NUL byte');
  if (name.startsWith('/')) throw unsafe(name, 'absolute path');
  const parts: string[] = [];
  for (const p of name.split('/')) {
    if (p === '' || p === '.') continue;
    if (p === '..') throw unsafe(name, 'path leaves the layer root ("..")');
    parts.push(p);
  }
  return parts.join('/');
}

/** The size of the pieces gunzip hands on: each goes through the tar guard, tar-stream and a file writer. */
export const GUNZIP_CHUNK = 1 << 20;

/** Whether a layer's first bytes are gzip's magic number. */
export function isGzip(head: Buffer): boolean {
  return head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b;
}

/** Wraps a stream of layer bytes (gzip, zstd or plain tar) into plain tar bytes. */
export function decompress(source: Readable): Readable {
  const out = new PassThrough({ highWaterMark: 1 << 20 });
  let decided = false;
  const head: Buffer[] = [];
  let headLen = 0;
  const decide = () => {
    decided = true;
    const buf = Buffer.concat(head);
    let stage: zlib.Gunzip | undefined;
    if (isGzip(buf)) {
      stage = zlib.createGunzip({ chunkSize: GUNZIP_CHUNK });
    } else if (buf.length >= 4 && buf.readUInt32LE(0) === 0xfd2fb528) {
      const child = spawn('zstd', ['-d', '-c', '-q'], { stdio: ['pipe', 'pipe', 'pipe'] });
      let err = '';
      child.stderr.on('data', (d: Buffer) => (err += d.toString()).slice(0, 4096));
      child.on('error', (e) => out.destroy(new SkiffError('Internal', `cannot run zstd to decompress a layer: ${e.message}`)));
      child.on('close', (code) => {
        if (code !== 0) out.destroy(new SkiffError('InvalidArgument', `zstd layer did not decompress: ${err.trim() || `exit ${code}`}`));
      });
      source.unshift(buf);
      pipeline(source, child.stdin).catch((e) => out.destroy(e));
      pipeline(child.stdout, out).catch((e) => out.destroy(e));
      return;
    }
    source.unshift(buf);
    // Wired by hand (not with pipeline) so that `out` fails with the wrapped error, not the raw one.
    source.on('error', (e) => out.destroy(e));
    out.on('close', () => {
      stage?.destroy();
      source.destroy();
    });
    if (stage) {
      stage.on('error', (e) => out.destroy(wrapDecompressError(e)));
      source.pipe(stage).pipe(out);
    } else {
      source.pipe(out);
    }
  };
  const onData = (chunk: Buffer) => {
    head.push(chunk);
    headLen += chunk.length;
    if (headLen >= 4) {
      source.off('data', onData);
      source.off('end', onEnd);
      source.pause();
      decide();
    }
  };
  const onEnd = () => {
    if (!decided) {
      decided = true;
      out.end(Buffer.concat(head));
    }
  };
  source.on('data', onData);
  source.on('end', onEnd);
  source.on('error', (e) => out.destroy(e));
  return out;
}

export function wrapDecompressError(e: unknown): Error {
  if (e instanceof SkiffError) return e;
  return new SkiffError('InvalidArgument', `layer did not decompress: ${(e as Error).message}`);
}

type Header = tar.Header & { pax?: Record<string, string> };

function badTar(why: string): SkiffError {
  return new SkiffError('InvalidArgument', `layer is not a tar archive that can be read safely: ${why}`);
}

/** Types whose size field Go's archive/tar ignores: no data follows them. */
const HEADER_ONLY = new Set(['link', 'symlink', 'character-device', 'block-device', 'fifo']);
const LONG_HEADERS = new Set(['pax-header', 'pax-global-header', 'gnu-long-path', 'gnu-long-link-path']);
const MAX_LONG_HEADER = 1 << 20;

function allZero(b: Buffer, from = 0): boolean {
  for (let i = from; i < b.length; i++) if (b[i] !== 0) return false;
  return true;
}

/**
 * Passes a tar stream on up to its end-of-archive marker (two zero blocks)
 * and no further, reading the archive's framing as Go's archive/tar does
 * (containerd's applier and image scanners stop there): a zero block
 * followed by a non-zero one, non-zero bytes after the marker, a size on an
 * entry that carries no data, and global pax records that rename or resize
 * later entries are all refused, so that every entry skiff unpacks is one a
 * scanner sees too. Header blocks are decoded with tar-stream's own codec so
 * both readers agree on where each entry starts.
 */
export class TarEndGuard extends Transform {
  private readonly header = Buffer.alloc(512);
  private have = 0;
  /** Bytes of entry data and padding before the next header. */
  private skip = 0;
  /** Long-header data (pax, GNU long names) being collected. */
  private long?: { type: string; size: number; parts: Buffer[]; got: number };
  private nextSize?: number;
  private zeroBlocks = 0;
  private ended = false;

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    try {
      const pass = this.scan(chunk);
      if (pass > 0) this.push(pass === chunk.length ? chunk : chunk.subarray(0, pass));
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }

  /** Returns how many bytes of `chunk` belong to the archive. */
  private scan(chunk: Buffer): number {
    let i = 0;
    while (i < chunk.length) {
      if (this.ended) {
        if (!allZero(chunk, i)) throw badTar('data after the end-of-archive marker');
        return i;
      }
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i);
        if (this.long && this.long.got < this.long.size) {
          const take = Math.min(n, this.long.size - this.long.got);
          this.long.parts.push(Buffer.from(chunk.subarray(i, i + take)));
          this.long.got += take;
        }
        this.skip -= n;
        i += n;
        if (this.skip === 0 && this.long) this.endLong();
        continue;
      }
      const n = Math.min(512 - this.have, chunk.length - i);
      chunk.copy(this.header, this.have, i, i + n);
      this.have += n;
      i += n;
      if (this.have === 512) {
        this.have = 0;
        this.onHeader();
      }
    }
    return chunk.length;
  }

  private onHeader(): void {
    const h = this.header;
    if (allZero(h)) {
      this.zeroBlocks++;
      if (this.zeroBlocks === 2) this.ended = true;
      return;
    }
    if (this.zeroBlocks > 0) throw badTar('a zero block in the middle of the archive');
    let dec: Header | null;
    try {
      dec = tarHeaders.decode(h, 'utf-8', false) as Header | null;
    } catch (err) {
      throw badTar((err as Error).message);
    }
    if (!dec) throw badTar('a header block with only a checksum');
    // Old GNU sparse entries may carry extension header blocks that Go reads and tar-stream would take for entries.
    if (h[156] === 0x53) throw badTar(`GNU sparse entry "${dec.name}"`);
    const type = String(dec.type);
    if (LONG_HEADERS.has(type)) {
      const size = dec.size ?? 0;
      if (size > MAX_LONG_HEADER) throw badTar(`a ${type} of ${size} bytes`);
      this.long = { type, size, parts: [], got: 0 };
      this.skip = Math.ceil(size / 512) * 512;
      if (this.skip === 0) this.endLong();
      return;
    }
    const size = this.nextSize ?? dec.size ?? 0;
    this.nextSize = undefined;
    if (type === 'directory') return;
    if (HEADER_ONLY.has(type) && size > 0) throw badTar(`${type} entry "${dec.name}" claims ${size} bytes of data`);
    this.skip = Math.ceil(size / 512) * 512;
  }

  private endLong(): void {
    const long = this.long!;
    this.long = undefined;
    if (long.type !== 'pax-header' && long.type !== 'pax-global-header') return;
    const records = tarHeaders.decodePax(Buffer.concat(long.parts));
    if (long.type === 'pax-global-header') {
      for (const key of ['path', 'linkpath', 'size']) {
        if (key in records) throw badTar(`a global pax header sets "${key}"`);
      }
      return;
    }
    if (records.size !== undefined) {
      if (!/^\d{1,15}$/.test(records.size)) throw badTar(`pax size "${records.size}"`);
      this.nextSize = Number(records.size);
    }
  }

  override _flush(cb: (err?: Error | null) => void): void {
    if (!this.ended && (this.have !== 0 || this.skip !== 0)) cb(badTar('the archive ends in the middle of an entry'));
    else cb();
  }
}

const DIR_RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV;
const { O_RDONLY, O_DIRECTORY } = fs.constants;

/** A path naming `name` inside the directory open as `fd`, for calls that take paths. */
function at(fd: number, name: string): string {
  return `/proc/self/fd/${fd}/${name}`;
}

function lstatOrUndefined(p: string): Promise<fs.Stats | undefined> {
  return fsp.lstat(p).catch((e) => (isErrno(e, 'ENOENT') ? undefined : Promise.reject(e)));
}

/**
 * Writes the whole of `body` to `fh`, which stays open for the calls after
 * it. Chunks are gathered into writes of about 1 MiB, and one write is in
 * flight while the next is gathered, so decompression and the disk overlap.
 */
async function writeAll(fh: fsp.FileHandle, body: AsyncIterable<Buffer>): Promise<void> {
  const flush = async (bufs: Buffer[]) => {
    while (bufs.length) {
      let { bytesWritten } = await fh.writev(bufs);
      while (bufs.length && bytesWritten >= bufs[0]!.length) bytesWritten -= bufs.shift()!.length;
      if (bytesWritten > 0) bufs[0] = bufs[0]!.subarray(bytesWritten);
    }
  };
  let inFlight: Promise<void> | undefined;
  let batch: Buffer[] = [];
  let size = 0;
  try {
    for await (const chunk of body) {
      batch.push(chunk);
      size += chunk.length;
      if (size < 1 << 20) continue;
      await inFlight;
      inFlight = flush(batch);
      // Awaited before the next write or below; this only keeps it from counting as unhandled meanwhile.
      inFlight.catch(() => undefined);
      batch = [];
      size = 0;
    }
    await inFlight;
    await flush(batch);
  } finally {
    await inFlight?.catch(() => undefined);
  }
}

function parentOf(rel: string): { dir: string; base: string } {
  const slash = rel.lastIndexOf('/');
  return slash < 0 ? { dir: '', base: rel } : { dir: rel.slice(0, slash), base: rel.slice(slash + 1) };
}

/**
 * Writes the entries of one layer into `root`.
 *
 * Every operation first opens the entry's parent directory with openat2(2)
 * under RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: the kernel walks the path
 * from the layer root and fails if any component is a symlink, `..`
 * leaves the root, or a component is not a directory. The operation then
 * names only the last component, relative to that descriptor (through
 * /proc/self/fd/N/<name>, which resolves to the very directory held open),
 * and never follows it: files are created O_EXCL|O_NOFOLLOW and changed
 * through their own descriptor; symlinks and device nodes with l*-calls.
 * Nothing is remembered between entries, so a directory that a later entry
 * replaces with a symlink is never trusted again. The only writer in `root`
 * during the unpack is this writer, one entry at a time, so a name does not
 * change between the check and the call on it.
 */
class LayerWriter {
  size = 0;
  inodes = 0;
  private readonly rootFd: number;

  constructor(
    root: string,
    private readonly opts: ApplyOptions,
  ) {
    try {
      this.rootFd = openat2(AT_FDCWD, root, O_PATH | O_DIRECTORY | O_CLOEXEC, 0);
    } catch (err) {
      if (isErrno(err, 'ENOSYS')) throw new SkiffError('FailedPrecondition', 'unpacking layers safely needs openat2(2): Linux 5.6 or later');
      throw err;
    }
  }

  dispose(): void {
    closeFd(this.rootFd);
  }

  /**
   * Opens directory `rel` (every component a real directory below the root)
   * and returns its descriptor; missing components are made when `create`.
   */
  async openDir(rel: string, original: string, create: boolean, flags = O_PATH): Promise<number> {
    try {
      return openat2(this.rootFd, rel === '' ? '.' : rel, flags | O_DIRECTORY | O_CLOEXEC, DIR_RESOLVE);
    } catch (err) {
      if (!isErrno(err, 'ENOENT') && !isErrno(err, 'ELOOP') && !isErrno(err, 'ENOTDIR') && !isErrno(err, 'EXDEV')) throw err;
    }
    // Slow path, one component at a time: make what is missing and say what is wrong.
    let fd = openat2(this.rootFd, '.', O_PATH | O_DIRECTORY | O_CLOEXEC, DIR_RESOLVE);
    let cur = '';
    try {
      for (const p of rel.split('/')) {
        cur = cur ? `${cur}/${p}` : p;
        let st = await lstatOrUndefined(at(fd, p));
        if (!st && create) {
          await this.keepingTimes(fd, () => fsp.mkdir(at(fd, p), { mode: 0o755 }));
          this.inodes++;
          st = await fsp.lstat(at(fd, p));
        }
        if (!st) throw unsafe(original, `parent "${cur}" does not exist`);
        if (st.isSymbolicLink()) throw unsafe(original, `parent "${cur}" is a symlink`);
        if (!st.isDirectory()) throw unsafe(original, `parent "${cur}" is not a directory`);
        const next = openat2(fd, p, O_PATH | O_DIRECTORY | O_CLOEXEC, DIR_RESOLVE);
        closeFd(fd);
        fd = next;
      }
      if (flags === O_PATH) return fd;
      const opened = openat2(fd, '.', flags | O_DIRECTORY | O_CLOEXEC, DIR_RESOLVE);
      closeFd(fd);
      return opened;
    } catch (err) {
      closeFd(fd);
      throw err;
    }
  }

  /** Clears the way for a new entry `name` in the directory `dirFd`; an existing directory stays when `keepDir`. */
  async clear(dirFd: number, name: string, keepDir: boolean): Promise<boolean> {
    const p = at(dirFd, name);
    const st = await lstatOrUndefined(p);
    if (!st) return false;
    if (st.isDirectory()) {
      if (keepDir) return true;
      // rm neither follows symlinks it meets inside nor re-resolves `p` through anything but dirFd.
      await fsp.rm(p, { recursive: true, force: true });
    } else {
      await fsp.unlink(p);
    }
    return false;
  }

  private xattrs(h: Header): Array<[string, Buffer]> {
    const out: Array<[string, Buffer]> = [];
    for (const [key, value] of Object.entries(h.pax ?? {}) as Array<[string, string]>) {
      if (key.startsWith('SCHILY.xattr.')) out.push([key.slice('SCHILY.xattr.'.length), Buffer.from(value, 'latin1')]);
    }
    return out;
  }

  /** Owner, xattrs, mode and times of a file or directory, all through its own descriptor. */
  async finishOpen(fh: fsp.FileHandle, h: Header): Promise<void> {
    await fh.chown(h.uid ?? 0, h.gid ?? 0);
    for (const [name, value] of this.xattrs(h)) fsetxattr(fh.fd, name, value);
    await fh.chmod((h.mode ?? 0o644) & 0o7777);
    const mtime = h.mtime ?? new Date(0);
    await fh.utimes(mtime, mtime);
  }

  /**
   * Runs `change`, which adds or removes names in the directory open as
   * `dirFd`, and gives the directory back the times it had before: a
   * directory keeps the time its own entry gave it, whatever comes after.
   * (Nothing is remembered per directory: a layer of a million directories
   * costs no memory.)
   */
  async keepingTimes<T>(dirFd: number, change: () => Promise<T>): Promise<T> {
    const self = at(dirFd, '.');
    const before = await fsp.stat(self);
    try {
      return await change();
    } finally {
      await fsp.utimes(self, before.atime, before.mtime);
    }
  }

  /** Whether this layer made directory `rel` opaque (its own marker, or the xattr on its entry). */
  private isOpaque(rel: string): boolean {
    let fd: number;
    try {
      fd = openat2(this.rootFd, rel === '' ? '.' : rel, O_PATH | O_DIRECTORY | O_CLOEXEC, DIR_RESOLVE);
    } catch {
      return false;
    }
    try {
      return lgetxattr(at(fd, '.'), 'trusted.overlay.opaque')?.toString() === 'y';
    } finally {
      closeFd(fd);
    }
  }

  /**
   * The same for a symlink or device node `p` (= /proc/self/fd/N/name), which
   * must not be opened: the l*-calls act on the last component itself.
   */
  async finishNode(p: string, h: Header, isLink: boolean): Promise<void> {
    await fsp.lchown(p, h.uid ?? 0, h.gid ?? 0);
    for (const [name, value] of this.xattrs(h)) lsetxattr(p, name, value);
    // A node this writer has just made with mknod; chmod resolves `p` to it, and mknod's mode was cut by the umask.
    if (!isLink) await fsp.chmod(p, (h.mode ?? 0o644) & 0o7777);
    const mtime = h.mtime ?? new Date(0);
    await fsp.lutimes(p, mtime, mtime);
  }

  async entry(h: Header, body: Readable): Promise<void> {
    const rel = cleanEntryName(h.name);
    if (rel === '') {
      body.resume();
      return;
    }
    const { dir, base } = parentOf(rel);
    if (base === OPAQUE) {
      body.resume();
      const fd = await this.openDir(dir, h.name, true, O_RDONLY);
      try {
        fsetxattr(fd, 'trusted.overlay.opaque', Buffer.from('y'));
      } finally {
        closeFd(fd);
      }
      return;
    }
    if (base.startsWith(WHITEOUT_PREFIX)) {
      body.resume();
      // Other `.wh..wh.` names are aufs bookkeeping, not whiteouts.
      if (base.startsWith(`${WHITEOUT_PREFIX}${WHITEOUT_PREFIX}`)) return;
      const hidden = base.slice(WHITEOUT_PREFIX.length);
      if (hidden === '' || hidden === '.' || hidden === '..') throw unsafe(h.name, 'whiteout of no file');
      const fd = await this.openDir(dir, h.name, true);
      try {
        await this.keepingTimes(fd, async () => {
          await this.clear(fd, hidden, false);
          mknod(at(fd, hidden), S_IFCHR | 0o000, 0, 0);
        });
      } finally {
        closeFd(fd);
      }
      this.inodes++;
      return;
    }
    const fd = await this.openDir(dir, h.name, true);
    try {
      await this.keepingTimes(fd, () => this.write(h, rel, fd, base, body));
    } finally {
      closeFd(fd);
    }
  }

  private async write(h: Header, rel: string, dirFd: number, base: string, body: Readable): Promise<void> {
    const p = at(dirFd, base);
    switch (h.type) {
      case 'file':
      case 'contiguous-file': {
        await this.clear(dirFd, base, false);
        const fh = await fsp.open(p, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
        try {
          await writeAll(fh, body);
          await this.finishOpen(fh, h);
        } finally {
          await fh.close().catch(() => undefined);
        }
        this.size += h.size ?? 0;
        this.inodes++;
        return;
      }
      case 'directory': {
        body.resume();
        const existed = await this.clear(dirFd, base, true);
        if (!existed) {
          await fsp.mkdir(p, { mode: 0o700 });
          this.inodes++;
        }
        const fh = await fsp.open(p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
        try {
          await this.finishOpen(fh, h);
        } finally {
          await fh.close().catch(() => undefined);
        }
        return;
      }
      case 'symlink': {
        body.resume();
        if (!h.linkname) throw unsafe(h.name, 'symlink without a target');
        await this.clear(dirFd, base, false);
        await fsp.symlink(h.linkname, p);
        await this.finishNode(p, h, true);
        this.inodes++;
        return;
      }
      case 'link': {
        body.resume();
        await this.hardlink(h, rel, dirFd, base);
        this.inodes++;
        return;
      }
      case 'character-device':
      case 'block-device':
      case 'fifo': {
        body.resume();
        await this.clear(dirFd, base, false);
        const kind = h.type === 'fifo' ? S_IFIFO : h.type === 'block-device' ? S_IFBLK : S_IFCHR;
        mknod(p, kind | ((h.mode ?? 0o600) & 0o7777), h.devmajor ?? 0, h.devminor ?? 0);
        await this.finishNode(p, h, false);
        this.inodes++;
        return;
      }
      default:
        // pax/gnu extension records are folded into headers by the parser; anything else is ignored
        body.resume();
    }
  }

  private async hardlink(h: Header, rel: string, dirFd: number, base: string): Promise<void> {
    if (!h.linkname) throw unsafe(h.name, 'hardlink without a target');
    const targetRel = cleanEntryName(h.linkname);
    if (targetRel === '') throw unsafe(h.name, 'hardlink to the layer root');
    // Clearing the way for the link would remove its own target.
    if (targetRel === rel || targetRel.startsWith(`${rel}/`)) throw unsafe(h.name, 'hardlink to itself or to something below it');
    const t = parentOf(targetRel);
    const tFd = await this.openDir(t.dir, h.name, true);
    try {
      const target = at(tFd, t.base);
      const st = await lstatOrUndefined(target);
      if (st?.isDirectory()) throw unsafe(h.name, 'hardlink to a directory');
      if (st?.isCharacterDevice() && st.rdev === 0) throw unsafe(h.name, `hardlink target "${h.linkname}" is deleted in this layer`);
      if (!st) await this.keepingTimes(tFd, () => this.copyUp(h, targetRel, target));
      await this.clear(dirFd, base, false);
      // link(2) does not follow a symlink in its last component: the new name is a link to the target itself.
      await fsp.link(target, at(dirFd, base));
    } finally {
      closeFd(tFd);
    }
  }

  /** The target lives in a lower layer: overlayfs would copy it up, so do that here. */
  private async copyUp(h: Header, targetRel: string, target: string): Promise<void> {
    const parts = targetRel.split('/');
    const hidden = this.isOpaque('') || parts.slice(0, -1).some((_, i) => this.isOpaque(parts.slice(0, i + 1).join('/')));
    const lower = !hidden && this.opts.lookupLower ? await this.opts.lookupLower(targetRel) : undefined;
    if (!lower) throw unsafe(h.name, `hardlink target "${h.linkname}" is not in this layer or below`);
    const src = await fsp.open(lower, O_RDONLY | O_NOFOLLOW);
    try {
      const lst = await src.stat();
      if (!lst.isFile()) throw unsafe(h.name, `hardlink target "${h.linkname}" is not a regular file`);
      const dst = await fsp.open(target, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
      try {
        await writeAll(dst, src.createReadStream({ autoClose: false, start: 0, highWaterMark: 1 << 20 }));
        await dst.chown(lst.uid, lst.gid);
        await dst.chmod(lst.mode & 0o7777);
        await dst.utimes(lst.atime, lst.mtime);
      } finally {
        await dst.close().catch(() => undefined);
      }
      this.size += lst.size;
      this.inodes++;
    } finally {
      await src.close().catch(() => undefined);
    }
  }
}

/** Applies the (possibly compressed) layer in `source` to the empty directory `root`. */
export async function applyLayer(root: string, source: Readable, opts: ApplyOptions = {}): Promise<ApplyResult> {
  const hash = createHash('sha256');
  const hasher = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      hash.update(chunk);
      cb(null, chunk);
    },
  });
  const extract = tar.extract();
  const writer = new LayerWriter(root, opts);
  // A write that fails (ENOSPC, a refused entry) stops reading its entry, which the
  // extractor reports as a "Premature close" first: the writer's own error is the cause.
  let current: Promise<void> | undefined;
  let writeError: unknown;
  try {
    extract.on('entry', (header, stream, next) => {
      // The extractor reports a broken archive itself; this keeps the entry's copy of that error from going unhandled.
      stream.on('error', () => undefined);
      current = writer.entry(header as Header, stream as unknown as Readable).then(
        () => next(),
        (err) => {
          writeError ??= err;
          stream.resume();
          extract.destroy(err);
        },
      );
    });
    try {
      await pipeline(opts.decompressed ? source : decompress(source), hasher, new TarEndGuard(), extract);
    } catch (err) {
      await current;
      throw writeError ?? err;
    }
  } finally {
    writer.dispose();
  }
  return { diffId: `sha256:${hash.digest('hex')}`, size: writer.size, inodes: writer.inodes };
}
