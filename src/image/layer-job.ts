/**
 * The work on one downloaded layer, as its compressed bytes arrive: each
 * chunk is hashed and written to the content store's ingest file, and the
 * same chunk is unpacked (applyLayer, with all its path-safety rules) into
 * the layer's snapshot directory. Runs on a layer thread (layer-worker.ts),
 * whose small heap makes the garbage collections that buffers of a few
 * hundred MiB cause cheap, or in place when the compiled worker is absent.
 */
import { createHash, type Hash } from 'node:crypto';
import fsp from 'node:fs/promises';
import { PassThrough, Readable } from 'node:stream';
import zlib from 'node:zlib';
import { SkiffError, type ErrorKind } from '../errors.js';
import { findInLowers } from './snapshot.js';
import { applyLayer, GUNZIP_CHUNK, isGzip, wrapDecompressError, type ApplyResult } from './unpack.js';

export interface LayerJob {
  /** The empty snapshot directory to unpack into. */
  dir: string;
  /** The ingest file to create for the compressed blob. */
  blobTmp: string;
  algorithm: 'sha256' | 'sha512';
  /**
   * The lower layers' directories, top first, for a hardlink whose target
   * is below this layer; 'later' when the parent is not unpacked yet (such a
   * hardlink then fails with NeedsLowerLayers); none for a first layer.
   */
  lower: string[] | 'later' | undefined;
}

export type Settled<T> = { ok: true; value: T } | { ok: false; error: unknown };

export interface LayerOutcome {
  unpacked: Settled<ApplyResult>;
  /** The blob's digest as written to `blobTmp`, and its size; the caller verifies and commits it. */
  stored: Settled<{ digest: string; size: number }>;
}

/** A hardlink into a lower layer that is not unpacked yet: the layer is done again once it is. */
export class NeedsLowerLayers extends Error {}

/**
 * The unpacker's side of the tee: a Readable that takes a chunk only when
 * its reader asks for more, so the chunks it holds are bounded by what the
 * feeder may have in flight.
 */
class Feed extends Readable {
  private waiting: Array<{ buf: Buffer; taken: () => void }> = [];
  private wanted = false;
  private ending = false;

  constructor() {
    super({ highWaterMark: 1 });
  }

  /** Resolves once the reader has taken `buf` (or the reader is gone). */
  offer(buf: Buffer): Promise<void> {
    if (this.destroyed) return Promise.resolve();
    return new Promise((taken) => {
      this.waiting.push({ buf, taken });
      if (this.wanted) this.give();
    });
  }

  override _read(): void {
    this.wanted = true;
    this.give();
  }

  /** No more chunks: the end comes after those still waiting. */
  finish(): void {
    this.ending = true;
    if (!this.waiting.length) this.push(null);
  }

  private give(): void {
    const next = this.waiting.shift();
    if (!next) return;
    this.wanted = false;
    this.push(next.buf);
    next.taken();
    if (this.ending && !this.waiting.length) this.push(null);
  }

  override _destroy(err: Error | null, cb: (e: Error | null) => void): void {
    for (const w of this.waiting.splice(0)) w.taken();
    cb(err);
  }
}

/**
 * One layer's job, fed chunk by chunk. A gzip blob (nearly all of them) is
 * inflated here rather than in applyLayer, so the job knows when zlib is
 * done with each chunk, and the chunk can go back to the feeder to be
 * filled again; any other blob goes to applyLayer as it is, which
 * decompresses it itself.
 */
export class LayerRun {
  readonly outcome: Promise<LayerOutcome>;
  private readonly feed = new Feed();
  private gunzip: zlib.Gunzip | undefined;
  /** Chunks written to gunzip and not yet consumed: each learns false if the stream goes away first. */
  private readonly inflating = new Set<(consumed: boolean) => void>();
  /** What applyLayer reads: the inflated tar, or the feed. */
  private source: Readable | undefined;
  private startUnpack!: (source: Readable, decompressed: boolean) => void;
  private readonly hash: Hash;
  private size = 0;
  private writing: Promise<void> = Promise.resolve();
  private storeError: unknown;
  private endedStore!: (err?: unknown) => void;

  private fh: fsp.FileHandle | undefined;

  constructor(job: LayerJob) {
    const hash = createHash(job.algorithm);
    this.hash = hash;
    // The consumers see the feed's errors through applyLayer; until then they must not crash the thread.
    this.feed.on('error', () => undefined);
    // Every write goes after the one before; the chain itself never rejects (a failure is kept in storeError).
    this.writing = fsp.open(job.blobTmp, 'wx').then(
      (fh) => {
        this.fh = fh;
      },
      (err) => this.failStore(err),
    );
    const storeEnd = new Promise<unknown>((resolve) => (this.endedStore = resolve));
    const stored = (async (): Promise<{ digest: string; size: number }> => {
      try {
        const err = await storeEnd;
        await this.writing;
        if (err) throw err;
        if (this.storeError) throw this.storeError;
        return { digest: `${job.algorithm}:${hash.digest('hex')}`, size: this.size };
      } finally {
        await this.fh?.close().catch(() => undefined);
      }
    })();
    // Started in the same tick as its source is made, so that applyLayer listens before a stop can come.
    const unpacked = new Promise<ApplyResult>((resolve, reject) => {
      this.startUnpack = (source, decompressed) => {
        applyLayer(job.dir, source, {
          decompressed,
          lookupLower: async (rel) => {
            if (job.lower === undefined) return undefined;
            if (job.lower === 'later') throw new NeedsLowerLayers();
            return findInLowers(job.lower, rel);
          },
        }).then(resolve, reject);
      };
    });
    this.outcome = Promise.all([settle(unpacked), settle(stored)]).then(([u, s]) => ({ unpacked: u, stored: s }));
  }

  /** Picks the unpacker's source from the blob's first bytes (none: the feed, which then ends or fails). */
  private start(first: Buffer | undefined): Readable {
    if (this.source) return this.source;
    if (first && isGzip(first)) {
      const gunzip = zlib.createGunzip({ chunkSize: GUNZIP_CHUNK });
      const plain = new PassThrough({ highWaterMark: GUNZIP_CHUNK });
      // As applyLayer's own decompression says it: the layer is at fault, not the daemon.
      gunzip.on('error', (e) => plain.destroy(wrapDecompressError(e)));
      plain.on('error', () => undefined);
      plain.on('close', () => gunzip.destroy());
      gunzip.on('close', () => {
        for (const done of this.inflating) done(false);
        this.inflating.clear();
      });
      gunzip.pipe(plain);
      this.gunzip = gunzip;
      this.source = plain;
      this.startUnpack(plain, true);
    } else {
      this.source = this.feed;
      this.startUnpack(this.feed, false);
    }
    return this.source;
  }

  private failStore(err: unknown): void {
    this.storeError ??= err;
    // Without its blob the layer cannot be kept: the unpack stops too, and the outcome comes at once.
    this.start(undefined).destroy(err as Error);
    this.endedStore(err);
  }

  /**
   * Takes the next chunk; resolves when both the ingest file and the
   * unpacker have it, with whether nothing refers to `buf` any more (so its
   * memory may be filled again).
   */
  offer(buf: Buffer): Promise<boolean> {
    if (this.storeError) return Promise.resolve(false);
    this.start(buf);
    this.size += buf.length;
    this.hash.update(buf);
    this.writing = this.writing
      .then(async () => {
        if (this.storeError) return;
        let off = 0;
        while (off < buf.length) off += (await this.fh!.write(buf, off, buf.length - off)).bytesWritten;
      })
      .catch((err) => this.failStore(err));
    const taken = this.gunzip ? this.inflate(this.gunzip, buf) : this.feed.offer(buf).then(() => false);
    return Promise.all([this.writing, taken]).then(([, consumed]) => consumed && !this.storeError);
  }

  /**
   * Writes `buf` to `gunzip`; resolves true once zlib has consumed all of
   * it, false when the stream went away first (then `buf` is not reused:
   * zlib may still have been reading it).
   */
  private inflate(gunzip: zlib.Gunzip, buf: Buffer): Promise<boolean> {
    if (gunzip.destroyed || gunzip.writableEnded) return Promise.resolve(false);
    return new Promise((resolve) => {
      const done = (consumed: boolean) => {
        if (!this.inflating.delete(done)) return;
        resolve(consumed);
      };
      this.inflating.add(done);
      gunzip.write(buf, (err) => done(!err && !gunzip.destroyed));
    });
  }

  /** The last chunk was offered. */
  end(): void {
    this.start(undefined);
    if (this.gunzip) this.gunzip.end();
    else this.feed.finish();
    this.endedStore();
  }

  /** The download failed: both sides stop with `err`. */
  abort(err: unknown): void {
    this.start(undefined).destroy(err as Error);
    this.endedStore(err);
  }
}

function settle<T>(p: Promise<T>): Promise<Settled<T>> {
  return p.then(
    (value) => ({ ok: true as const, value }),
    (error: unknown) => ({ ok: false as const, error }),
  );
}

/** An error as it crosses to another thread: its kind, message and errno fields survive. */
export interface WireError {
  kind?: ErrorKind;
  needsLower?: boolean;
  message: string;
  code?: string;
  errno?: number;
  syscall?: string;
}

export function toWire(err: unknown): WireError {
  if (err instanceof NeedsLowerLayers) return { needsLower: true, message: 'needs lower layers' };
  if (err instanceof SkiffError) return { kind: err.kind, message: err.message };
  const e = err as { message?: unknown; code?: unknown; errno?: unknown; syscall?: unknown };
  return {
    message: typeof e?.message === 'string' ? e.message : String(err),
    ...(typeof e?.code === 'string' ? { code: e.code } : {}),
    ...(typeof e?.errno === 'number' ? { errno: e.errno } : {}),
    ...(typeof e?.syscall === 'string' ? { syscall: e.syscall } : {}),
  };
}

export function fromWire(w: WireError): Error {
  if (w.needsLower) return new NeedsLowerLayers();
  if (w.kind) return new SkiffError(w.kind, w.message);
  return Object.assign(new Error(w.message), {
    ...(w.code !== undefined ? { code: w.code } : {}),
    ...(w.errno !== undefined ? { errno: w.errno } : {}),
    ...(w.syscall !== undefined ? { syscall: w.syscall } : {}),
  });
}

export function settledToWire<T>(s: Settled<T>): Settled<T> {
  return s.ok ? s : { ok: false, error: toWire(s.error) };
}

export function settledFromWire<T>(s: Settled<T>): Settled<T> {
  return s.ok ? s : { ok: false, error: fromWire(s.error as WireError) };
}
