/**
 * Random access to the files of an image archive (a tar, optionally gzip or
 * zstd compressed) without reading any file's data into memory: one pass
 * over the tar headers records where each file's bytes lie, and each blob is
 * later streamed from its own range of the file. A compressed archive is
 * first decompressed into an unlinked temporary file.
 *
 * An image archive holds only regular files and directories. Symlinks,
 * hardlinks, devices, names that climb out of the archive (`..`, absolute
 * paths) and names given twice are refused: skiff never has to decide which
 * of two files an image meant.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { Readable, Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SkiffError, isErrno, noSpaceAt } from '../errors.js';
import { decompress, tarHeaders } from './unpack.js';

export interface ArchiveLimits {
  /** The largest archive file (and decompressed tar) accepted. */
  maxBytes: number;
  /** The most entries read from one archive. */
  maxEntries: number;
}

export const DEFAULT_ARCHIVE_LIMITS: ArchiveLimits = {
  maxBytes: 64 * 2 ** 30,
  maxEntries: 100_000,
};

export interface ArchiveFile {
  name: string;
  /** Where the file's data starts in the (decompressed) tar. */
  offset: number;
  size: number;
}

const MAX_LONG_HEADER = 1 << 20;

function bad(archive: string, why: string): SkiffError {
  return new SkiffError('InvalidArgument', `archive ${archive}: ${why}`);
}

/**
 * The name an archive member stands for, relative to the archive's root:
 * `./blobs//sha256/x` is `blobs/sha256/x`. A name that is absolute or that
 * climbs with `..` is refused, whatever it would resolve to.
 */
export function archiveName(raw: string): string | undefined {
  if (raw.startsWith('/')) return undefined;
  const parts: string[] = [];
  for (const p of raw.split('/')) {
    if (p === '' || p === '.') continue;
    if (p === '..') return undefined;
    parts.push(p);
  }
  return parts.join('/');
}

export class ImageArchive {
  private constructor(
    /** The path the caller named, for messages. */
    readonly label: string,
    private readonly fh: fsp.FileHandle,
    readonly files: ReadonlyMap<string, ArchiveFile>,
    /** The archive file's own size (compressed, if it was). */
    readonly fileSize: number,
    readonly compressed: boolean,
  ) {}

  /**
   * Opens `file` (never following a symlink at its last component) and reads
   * its table of contents. `tmpDir` takes the decompressed copy of a
   * compressed archive; the copy is unlinked at once and freed on close.
   */
  static async open(file: string, tmpDir: string, limits: ArchiveLimits = DEFAULT_ARCHIVE_LIMITS): Promise<ImageArchive> {
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(file, fs.constants.O_RDONLY | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK);
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new SkiffError('NotFound', `archive ${file} does not exist`);
      if (isErrno(err, 'ELOOP')) throw bad(file, 'is a symlink; name the file itself');
      throw new SkiffError('InvalidArgument', `cannot open archive ${file}: ${(err as Error).message}`, { cause: err });
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw bad(file, 'is not a regular file');
      if (st.size > limits.maxBytes) throw bad(file, `is ${st.size} bytes, more than the ${limits.maxBytes} skiff imports`);
      const head = Buffer.alloc(4);
      await fh.read(head, 0, 4, 0);
      const compressed = (head[0] === 0x1f && head[1] === 0x8b) || head.readUInt32LE(0) === 0xfd2fb528;
      let tar = fh;
      if (compressed) {
        tar = await decompressToTemp(fh, file, tmpDir, limits.maxBytes);
        await fh.close();
      }
      try {
        const files = await readToc(tar, file, limits);
        return new ImageArchive(file, tar, files, st.size, compressed);
      } catch (err) {
        if (tar !== fh) await tar.close();
        throw err;
      }
    } catch (err) {
      await fh.close().catch(() => undefined);
      throw err;
    }
  }

  has(name: string): boolean {
    return this.files.has(name);
  }

  file(name: string): ArchiveFile {
    const f = this.files.get(name);
    if (!f) throw bad(this.label, `has no file ${name}`);
    return f;
  }

  /** A file's bytes, refused without reading when it is larger than `max`. */
  async read(name: string, max: number, what = name): Promise<Buffer> {
    const f = this.file(name);
    if (f.size > max) throw bad(this.label, `${what} is ${f.size} bytes, more than the ${max} skiff accepts`);
    const buf = Buffer.alloc(f.size);
    let got = 0;
    while (got < f.size) {
      const { bytesRead } = await this.fh.read(buf, got, f.size - got, f.offset + got);
      if (bytesRead === 0) throw bad(this.label, `${name} is cut short`);
      got += bytesRead;
    }
    return buf;
  }

  /** Streams a file's bytes from its range of the archive. */
  open(name: string): Readable {
    const f = this.file(name);
    if (f.size === 0) return Readable.from([]);
    return rangeStream(this.fh, f.offset, f.size, this.label);
  }

  async close(): Promise<void> {
    await this.fh.close().catch(() => undefined);
  }
}

/**
 * `size` bytes of `fh` from `start`, read with positioned reads. Node's file
 * streams close a descriptor they are given when destroyed; this one leaves
 * the handle to its owner, so many streams can share it.
 */
function rangeStream(fh: fsp.FileHandle, start: number, size: number, label: string): Readable {
  let pos = start;
  const end = start + size;
  return new Readable({
    highWaterMark: 1 << 20,
    read(want) {
      const n = Math.min(Math.max(want, 64 << 10), 1 << 20, end - pos);
      if (n <= 0) {
        this.push(null);
        return;
      }
      fh.read(Buffer.allocUnsafe(n), 0, n, pos).then(
        ({ bytesRead, buffer }) => {
          if (bytesRead === 0) {
            this.destroy(bad(label, 'changed or was cut short while being read'));
            return;
          }
          pos += bytesRead;
          this.push(bytesRead === n ? buffer : buffer.subarray(0, bytesRead));
          if (pos >= end) this.push(null);
        },
        (err: Error) => this.destroy(err),
      );
    },
  });
}

async function decompressToTemp(fh: fsp.FileHandle, label: string, tmpDir: string, maxBytes: number): Promise<fsp.FileHandle> {
  await fsp.mkdir(tmpDir, { recursive: true, mode: 0o700 });
  const tmp = path.join(tmpDir, `archive-${randomBytes(8).toString('hex')}.tar`);
  const out = await fsp.open(tmp, 'wx+', 0o600);
  // Unlinked at once: the copy lives as long as the handle, and nothing is left behind by a crash.
  await fsp.rm(tmp, { force: true });
  let written = 0;
  const limit = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      written += chunk.length;
      if (written > maxBytes) cb(bad(label, `decompresses to more than ${maxBytes} bytes`));
      else cb(null, chunk);
    },
  });
  try {
    await pipeline(
      decompress(rangeStream(fh, 0, (await fh.stat()).size, label)),
      limit,
      new Writable({
        highWaterMark: 1 << 20,
        write(chunk: Buffer, _enc, cb) {
          out.write(chunk).then(() => cb(), cb);
        },
      }),
    );
    return out;
  } catch (err) {
    await out.close().catch(() => undefined);
    const e = noSpaceAt(err, `the decompressed copy of ${label} in ${tmpDir}`);
    if (e instanceof SkiffError) throw e;
    throw new SkiffError('InvalidArgument', `archive ${label} did not decompress: ${(e as Error).message}`, { cause: e });
  }
}

type Decoded = { name: string; type: string | null; size: number | null; linkname?: string | null };

/** Walks the tar headers of `fh`; returns every regular file with where its data lies. */
async function readToc(fh: fsp.FileHandle, label: string, limits: ArchiveLimits): Promise<Map<string, ArchiveFile>> {
  const { size: total } = await fh.stat();
  const files = new Map<string, ArchiveFile>();
  const header = Buffer.alloc(512);
  let offset = 0;
  let entries = 0;
  let longName: string | undefined;
  let paxPath: string | undefined;
  let paxSize: number | undefined;
  const readAt = async (buf: Buffer, at: number, what: string) => {
    let got = 0;
    while (got < buf.length) {
      const { bytesRead } = await fh.read(buf, got, buf.length - got, at + got);
      if (bytesRead === 0) throw bad(label, `ends in the middle of ${what}`);
      got += bytesRead;
    }
  };
  for (;;) {
    if (offset + 512 > total) {
      // Some writers leave out the end-of-archive blocks: ending on an entry boundary is accepted.
      if (offset === total && longName === undefined && paxPath === undefined && paxSize === undefined) break;
      throw bad(label, 'ends in the middle of a header (is it a tar archive?)');
    }
    await readAt(header, offset, 'a header');
    if (header.every((b) => b === 0)) break;
    if (++entries > limits.maxEntries) throw bad(label, `has more than ${limits.maxEntries} entries`);
    let dec: Decoded | null;
    try {
      dec = tarHeaders.decode(header, 'utf-8', false) as Decoded | null;
    } catch (err) {
      throw bad(label, `is not a tar archive (${(err as Error).message} at byte ${offset})`);
    }
    if (!dec) throw bad(label, `is not a tar archive (a header with only a checksum at byte ${offset})`);
    const type = String(dec.type);
    const size = type === 'file' || type === 'contiguous-file' ? (paxSize ?? dec.size ?? 0) : (dec.size ?? 0);
    if (!Number.isSafeInteger(size) || size < 0) throw bad(label, `an entry at byte ${offset} has an invalid size`);
    const dataAt = offset + 512;
    const next = dataAt + Math.ceil(size / 512) * 512;
    if (dataAt + size > total) throw bad(label, `ends in the middle of entry "${dec.name}"`);
    if (type === 'pax-header' || type === 'pax-global-header' || type === 'gnu-long-path' || type === 'gnu-long-link-path') {
      if (size > MAX_LONG_HEADER) throw bad(label, `has a ${type} of ${size} bytes`);
      const data = Buffer.alloc(size);
      await readAt(data, dataAt, `a ${type}`);
      if (type === 'gnu-long-path') longName = data.toString('utf8').replace(/\0.*$/s, '');
      else if (type === 'pax-header' || type === 'pax-global-header') {
        const records = tarHeaders.decodePax(data);
        if (type === 'pax-global-header') {
          if ('path' in records || 'size' in records) throw bad(label, 'a global pax header renames or resizes later entries');
        } else {
          if (records.path !== undefined) paxPath = records.path;
          if (records.size !== undefined) {
            if (!/^\d{1,15}$/.test(records.size)) throw bad(label, `a pax size "${records.size}"`);
            paxSize = Number(records.size);
          }
        }
      }
      offset = next;
      continue;
    }
    const rawName = paxPath ?? longName ?? dec.name;
    longName = paxPath = paxSize = undefined;
    const name = archiveName(rawName);
    if (name === undefined) throw bad(label, `entry "${rawName}" points outside the archive`);
    switch (type) {
      case 'directory':
        break;
      case 'file':
      case 'contiguous-file':
        if (name === '') throw bad(label, `a file entry "${rawName}" has no name`);
        if (files.has(name)) throw bad(label, `holds "${name}" twice`);
        files.set(name, { name, offset: dataAt, size });
        break;
      case 'symlink':
      case 'link':
        throw bad(label, `entry "${rawName}" is a ${type === 'link' ? 'hardlink' : 'symlink'} (to "${dec.linkname ?? ''}"); an image archive holds only files and directories`);
      default:
        throw bad(label, `entry "${rawName}" is a ${type}; an image archive holds only files and directories`);
    }
    offset = next;
  }
  return files;
}
