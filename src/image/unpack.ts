/**
 * Applies one layer tar to an empty directory in the form overlayfs stacks:
 * `.wh.<name>` becomes a 0/0 character device, `.wh..wh..opq` sets
 * `trusted.overlay.opaque=y` on its directory. Nothing is ever written outside
 * the directory: absolute names, `..`, entries below a symlink and hardlinks
 * that leave the layer are refused, and no path is opened through a symlink.
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
const tarHeaders = require(path.join(path.dirname(require.resolve('tar-stream')), 'headers.js')) as {
  decodePax: (buf: Buffer) => Record<string, string>;
};
import { SkiffError, isErrno } from '../errors.js';
import { lsetxattr, mknod, S_IFBLK, S_IFCHR, S_IFIFO } from '../sys/libc.js';

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
    if (buf.length >= 2 && buf[0] === 0x1f && buf[1] === 0x8b) {
      stage = zlib.createGunzip({ chunkSize: 1 << 18 });
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

function wrapDecompressError(e: unknown): Error {
  if (e instanceof SkiffError) return e;
  return new SkiffError('InvalidArgument', `layer did not decompress: ${(e as Error).message}`);
}

type Header = tar.Header & { pax?: Record<string, string> };

class LayerWriter {
  size = 0;
  inodes = 0;
  private readonly dirTimes: Array<[string, Date]> = [];
  private readonly knownDirs = new Set<string>(['']);

  constructor(
    private readonly root: string,
    private readonly opts: ApplyOptions,
  ) {}

  abs(rel: string): string {
    return rel === '' ? this.root : path.join(this.root, rel);
  }

  /** Makes sure every parent of `rel` is a real directory inside the root. */
  async ensureParents(rel: string, original: string): Promise<void> {
    const parts = rel.split('/');
    parts.pop();
    let cur = '';
    for (const p of parts) {
      cur = cur ? `${cur}/${p}` : p;
      if (this.knownDirs.has(cur)) continue;
      const full = this.abs(cur);
      const st = await fsp.lstat(full).catch((e) => (isErrno(e, 'ENOENT') ? undefined : Promise.reject(e)));
      if (!st) {
        await fsp.mkdir(full, { mode: 0o755 });
        this.inodes++;
      } else if (st.isSymbolicLink()) {
        throw unsafe(original, `parent "${cur}" is a symlink`);
      } else if (!st.isDirectory()) {
        throw unsafe(original, `parent "${cur}" is not a directory`);
      }
      this.knownDirs.add(cur);
    }
  }

  /** Clears the way for a new entry at `full`; an existing directory stays when `keepDir`. */
  async clear(full: string, keepDir: boolean): Promise<boolean> {
    const st = await fsp.lstat(full).catch((e) => (isErrno(e, 'ENOENT') ? undefined : Promise.reject(e)));
    if (!st) return false;
    if (st.isDirectory()) {
      if (keepDir) return true;
      await fsp.rm(full, { recursive: true, force: true });
    } else {
      await fsp.unlink(full);
    }
    return false;
  }

  async finish(full: string, h: Header, isLink: boolean): Promise<void> {
    await fsp.lchown(full, h.uid ?? 0, h.gid ?? 0);
    const pax = h.pax ?? {};
    for (const [key, value] of Object.entries(pax) as Array<[string, string]>) {
      if (!key.startsWith('SCHILY.xattr.')) continue;
      const name = key.slice('SCHILY.xattr.'.length);
      lsetxattr(full, name, Buffer.from(value, 'latin1'));
    }
    if (!isLink) await fsp.chmod(full, (h.mode ?? 0o644) & 0o7777);
    const mtime = h.mtime ?? new Date(0);
    if (h.type === 'directory') this.dirTimes.push([full, mtime]);
    else await fsp.lutimes(full, mtime, mtime);
  }

  async entry(h: Header, body: Readable): Promise<void> {
    const rel = cleanEntryName(h.name);
    if (rel === '') {
      body.resume();
      return;
    }
    await this.ensureParents(rel, h.name);
    const base = path.posix.basename(rel);
    const dir = path.posix.dirname(rel) === '.' ? '' : path.posix.dirname(rel);
    const full = this.abs(rel);
    if (base === OPAQUE) {
      body.resume();
      lsetxattr(this.abs(dir), 'trusted.overlay.opaque', Buffer.from('y'));
      return;
    }
    if (base.startsWith(WHITEOUT_PREFIX)) {
      body.resume();
      const hidden = path.join(this.abs(dir), base.slice(WHITEOUT_PREFIX.length));
      await this.clear(hidden, false);
      mknod(hidden, S_IFCHR | 0o000, 0, 0);
      this.inodes++;
      return;
    }
    switch (h.type) {
      case 'file':
      case 'contiguous-file': {
        await this.clear(full, false);
        const fh = await fsp.open(full, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
        try {
          await pipeline(body, fh.createWriteStream({ highWaterMark: 1 << 20 }));
        } finally {
          await fh.close().catch(() => undefined);
        }
        this.size += h.size ?? 0;
        break;
      }
      case 'directory': {
        const existed = await this.clear(full, true);
        if (!existed) await fsp.mkdir(full, { mode: 0o700 });
        this.knownDirs.add(rel);
        body.resume();
        break;
      }
      case 'symlink': {
        body.resume();
        if (!h.linkname) throw unsafe(h.name, 'symlink without a target');
        await this.clear(full, false);
        await fsp.symlink(h.linkname, full);
        await this.finish(full, h, true);
        this.inodes++;
        return;
      }
      case 'link': {
        body.resume();
        await this.hardlink(h, rel, full);
        this.inodes++;
        return;
      }
      case 'character-device':
      case 'block-device':
      case 'fifo': {
        body.resume();
        await this.clear(full, false);
        const kind = h.type === 'fifo' ? S_IFIFO : h.type === 'block-device' ? S_IFBLK : S_IFCHR;
        mknod(full, kind | ((h.mode ?? 0o600) & 0o7777), h.devmajor ?? 0, h.devminor ?? 0);
        break;
      }
      default:
        // pax/gnu extension records are folded into headers by the parser; anything else is ignored
        body.resume();
        return;
    }
    this.inodes++;
    await this.finish(full, h, false);
  }

  private async hardlink(h: Header, rel: string, full: string): Promise<void> {
    if (!h.linkname) throw unsafe(h.name, 'hardlink without a target');
    const targetRel = cleanEntryName(h.linkname);
    if (targetRel === '') throw unsafe(h.name, 'hardlink to the layer root');
    await this.ensureParents(targetRel, h.name);
    const target = this.abs(targetRel);
    const st = await fsp.lstat(target).catch((e) => (isErrno(e, 'ENOENT') ? undefined : Promise.reject(e)));
    if (st?.isDirectory()) throw unsafe(h.name, 'hardlink to a directory');
    await this.clear(full, false);
    if (st) {
      await fsp.link(target, full);
      return;
    }
    // The target lives in a lower layer: overlayfs would copy it up, so do that here.
    const lower = this.opts.lookupLower ? await this.opts.lookupLower(targetRel) : undefined;
    if (!lower) throw unsafe(h.name, `hardlink target "${h.linkname}" is not in this layer or below`);
    const lst = await fsp.lstat(lower);
    await fsp.copyFile(lower, target, fs.constants.COPYFILE_EXCL);
    await fsp.lchown(target, lst.uid, lst.gid);
    await fsp.chmod(target, lst.mode & 0o7777);
    await fsp.utimes(target, lst.atime, lst.mtime);
    this.size += lst.size;
    this.inodes++;
    await fsp.link(target, full);
  }

  async close(): Promise<void> {
    // Directory times last: creating children changes them.
    for (const [dir, t] of this.dirTimes.reverse()) await fsp.lutimes(dir, t, t);
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
  extract.on('entry', (header, stream, next) => {
    // The extractor reports a broken archive itself; this keeps the entry's copy of that error from going unhandled.
    stream.on('error', () => undefined);
    writer.entry(header as Header, stream as unknown as Readable).then(
      () => next(),
      (err) => {
        stream.resume();
        extract.destroy(err);
      },
    );
  });
  await pipeline(decompress(source), hasher, extract);
  await writer.close();
  return { diffId: `sha256:${hash.digest('hex')}`, size: writer.size, inodes: writer.inodes };
}
