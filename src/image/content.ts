/**
 * Content-addressed blob store. A blob is written to a private ingest file
 * while it is hashed, checked against the expected size and digest, and only
 * then renamed into place, so a reader never sees a partial or wrong blob.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SkiffError, isErrno, noSpaceAt } from '../errors.js';

export interface BlobInfo {
  digest: string;
  size: number;
}

export interface ContentStore {
  has(digest: string): Promise<boolean>;
  /** Streams `source` into the store; verifies size (when known) and digest. */
  ingest(expected: { digest: string; size?: number }, source: Readable): Promise<BlobInfo>;
  read(digest: string): Readable;
  readBytes(digest: string): Promise<Buffer>;
  path(digest: string): string;
  list(): Promise<BlobInfo[]>;
  delete(digest: string): Promise<void>;
}

const digestRe = /^sha256:([a-f0-9]{64})$/;

export function checkDigest(digest: string): string {
  const m = digestRe.exec(digest);
  if (!m) throw new SkiffError('InvalidArgument', `unsupported or malformed digest "${digest}" (only sha256 is supported)`);
  return m[1]!;
}

export function sha256Digest(data: Buffer | string): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

export class LocalContentStore implements ContentStore {
  private readonly blobs: string;
  private readonly ingestDir: string;
  /** Two ingests of one digest share a single write. */
  private readonly active = new Map<string, Promise<BlobInfo>>();

  constructor(root: string) {
    this.blobs = path.join(root, 'blobs', 'sha256');
    this.ingestDir = path.join(root, 'ingest');
  }

  async init(): Promise<void> {
    await fsp.mkdir(this.blobs, { recursive: true });
    // Left-over ingests are from a process that died mid-write.
    await fsp.rm(this.ingestDir, { recursive: true, force: true });
    await fsp.mkdir(this.ingestDir, { recursive: true });
  }

  path(digest: string): string {
    return path.join(this.blobs, checkDigest(digest));
  }

  async has(digest: string): Promise<boolean> {
    try {
      await fsp.access(this.path(digest));
      return true;
    } catch {
      return false;
    }
  }

  async ingest(expected: { digest: string; size?: number }, source: Readable): Promise<BlobInfo> {
    const target = this.path(expected.digest);
    const running = this.active.get(expected.digest);
    if (running) {
      source.destroy();
      return running;
    }
    const work = this.write(expected, source, target).finally(() => this.active.delete(expected.digest));
    this.active.set(expected.digest, work);
    return work;
  }

  private async write(expected: { digest: string; size?: number }, source: Readable, target: string): Promise<BlobInfo> {
    try {
      const st = await fsp.stat(target);
      source.destroy();
      return { digest: expected.digest, size: st.size };
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
    const tmp = path.join(this.ingestDir, `${checkDigest(expected.digest)}-${randomBytes(6).toString('hex')}`);
    const hash = createHash('sha256');
    let size = 0;
    const limit = expected.size;
    const meter = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        size += chunk.length;
        if (limit !== undefined && size > limit) {
          cb(new SkiffError('InvalidArgument', `blob ${expected.digest} is larger than the ${limit} bytes its descriptor says`));
          return;
        }
        hash.update(chunk);
        cb(null, chunk);
      },
    });
    try {
      await pipeline(source, meter, fs.createWriteStream(tmp, { flags: 'wx', highWaterMark: 1 << 20 }));
      if (limit !== undefined && size !== limit) {
        throw new SkiffError('InvalidArgument', `blob ${expected.digest} is ${size} bytes, its descriptor says ${limit}`);
      }
      const actual = `sha256:${hash.digest('hex')}`;
      if (actual !== expected.digest) {
        throw new SkiffError('InvalidArgument', `digest mismatch: expected ${expected.digest}, got ${actual}`);
      }
      await fsp.rename(tmp, target);
      return { digest: expected.digest, size };
    } catch (err) {
      await fsp.rm(tmp, { force: true });
      throw noSpaceAt(err, `blob ${expected.digest} (writing ${tmp})`);
    }
  }

  read(digest: string): Readable {
    return fs.createReadStream(this.path(digest), { highWaterMark: 1 << 20 });
  }

  async readBytes(digest: string): Promise<Buffer> {
    return fsp.readFile(this.path(digest));
  }

  async list(): Promise<BlobInfo[]> {
    const names = await fsp.readdir(this.blobs);
    const out: BlobInfo[] = [];
    for (const n of names) {
      const st = await fsp.stat(path.join(this.blobs, n)).catch(() => undefined);
      if (st) out.push({ digest: `sha256:${n}`, size: st.size });
    }
    return out;
  }

  async delete(digest: string): Promise<void> {
    await fsp.rm(this.path(digest), { force: true });
  }
}
