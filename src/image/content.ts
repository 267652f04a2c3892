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
  /**
   * A private ingest file for a blob that another writer (a layer thread)
   * fills and hashes; `commit` verifies what the writer reports and moves
   * the file into place, `abort` drops it.
   */
  ingestFile(expected: { digest: string; size?: number }): IngestFile;
  read(digest: string): Readable;
  readBytes(digest: string): Promise<Buffer>;
  path(digest: string): string;
  list(): Promise<BlobInfo[]>;
  delete(digest: string): Promise<void>;
}

export interface IngestFile {
  path: string;
  algorithm: DigestAlgorithm;
  commit(actual: { digest: string; size: number }): Promise<BlobInfo>;
  abort(): Promise<void>;
}

/** The digest algorithms blobs are verified with, and the hex length of each. */
const ALGORITHMS = { sha256: 64, sha512: 128 } as const;
export type DigestAlgorithm = keyof typeof ALGORITHMS;

/**
 * Splits a digest into an algorithm skiff can verify and its hex encoding,
 * or refuses it: a blob named by any other algorithm is never accepted
 * unverified.
 */
export function parseDigest(digest: string): { algorithm: DigestAlgorithm; hex: string } {
  const colon = digest.indexOf(':');
  const algorithm = digest.slice(0, colon);
  if (colon < 0 || !Object.hasOwn(ALGORITHMS, algorithm)) {
    throw new SkiffError('InvalidArgument', `unsupported digest algorithm in "${digest}" (only sha256 and sha512 can be verified)`);
  }
  const hex = digest.slice(colon + 1);
  const len = ALGORITHMS[algorithm as DigestAlgorithm];
  if (hex.length !== len || !/^[a-f0-9]+$/.test(hex)) {
    throw new SkiffError('InvalidArgument', `malformed ${algorithm} digest "${digest}" (want ${len} lowercase hex digits)`);
  }
  return { algorithm: algorithm as DigestAlgorithm, hex };
}

/** The hex part of a digest skiff can verify. */
export function checkDigest(digest: string): string {
  return parseDigest(digest).hex;
}

/** `data`'s digest in `algorithm`. */
export function digestOf(algorithm: DigestAlgorithm, data: Buffer | string): string {
  return `${algorithm}:${createHash(algorithm).update(data).digest('hex')}`;
}

export function sha256Digest(data: Buffer | string): string {
  return digestOf('sha256', data);
}

export class LocalContentStore implements ContentStore {
  /** Blobs live in blobs/<algorithm>/<hex>, as in an OCI layout. */
  private readonly blobs: string;
  private readonly ingestDir: string;
  /** Two ingests of one digest share a single write. */
  private readonly active = new Map<string, Promise<BlobInfo>>();

  constructor(root: string) {
    this.blobs = path.join(root, 'blobs');
    this.ingestDir = path.join(root, 'ingest');
  }

  async init(): Promise<void> {
    for (const alg of Object.keys(ALGORITHMS)) await fsp.mkdir(path.join(this.blobs, alg), { recursive: true });
    // Left-over ingests are from a process that died mid-write.
    await fsp.rm(this.ingestDir, { recursive: true, force: true });
    await fsp.mkdir(this.ingestDir, { recursive: true });
  }

  path(digest: string): string {
    const { algorithm, hex } = parseDigest(digest);
    return path.join(this.blobs, algorithm, hex);
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
    const { algorithm, hex } = parseDigest(expected.digest);
    const tmp = path.join(this.ingestDir, `${algorithm}-${hex}-${randomBytes(6).toString('hex')}`);
    const hash = createHash(algorithm);
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
      const actual = `${algorithm}:${hash.digest('hex')}`;
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

  ingestFile(expected: { digest: string; size?: number }): IngestFile {
    const target = this.path(expected.digest);
    const { algorithm, hex } = parseDigest(expected.digest);
    const tmp = path.join(this.ingestDir, `${algorithm}-${hex}-${randomBytes(6).toString('hex')}`);
    const abort = () => fsp.rm(tmp, { force: true });
    return {
      path: tmp,
      algorithm,
      abort,
      commit: async (actual) => {
        try {
          const limit = expected.size;
          if (limit !== undefined && actual.size !== limit) {
            throw new SkiffError('InvalidArgument', `blob ${expected.digest} is ${actual.size} bytes, its descriptor says ${limit}`);
          }
          if (actual.digest !== expected.digest) {
            throw new SkiffError('InvalidArgument', `digest mismatch: expected ${expected.digest}, got ${actual.digest}`);
          }
          // Another ingest of the same blob may have put it there first: the same verified bytes replace it.
          await fsp.rename(tmp, target);
          return { digest: expected.digest, size: actual.size };
        } catch (err) {
          await abort();
          throw noSpaceAt(err, `blob ${expected.digest} (writing ${tmp})`);
        }
      },
    };
  }

  read(digest: string): Readable {
    return fs.createReadStream(this.path(digest), { highWaterMark: 1 << 20 });
  }

  async readBytes(digest: string): Promise<Buffer> {
    return fsp.readFile(this.path(digest));
  }

  async list(): Promise<BlobInfo[]> {
    const out: BlobInfo[] = [];
    for (const alg of Object.keys(ALGORITHMS)) {
      const dir = path.join(this.blobs, alg);
      const names = await fsp.readdir(dir).catch((e) => (isErrno(e, 'ENOENT') ? [] : Promise.reject(e)));
      for (const n of names) {
        const st = await fsp.stat(path.join(dir, n)).catch(() => undefined);
        if (st) out.push({ digest: `${alg}:${n}`, size: st.size });
      }
    }
    return out;
  }

  async delete(digest: string): Promise<void> {
    await fsp.rm(this.path(digest), { force: true });
  }
}
