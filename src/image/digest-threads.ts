/**
 * sha256/sha512 of streamed blobs on worker threads. A pull hashes every
 * byte twice (the compressed blob, then the tar it unpacks to), about 1 GB/s
 * per core here: on the main thread that alone was a third of a pull of
 * large layers, and kept the one thread that also drives the sockets, the
 * decompression and the disk writes busy. Each digest lives on one thread;
 * bytes go there in 4 MiB batches (with 1 MiB ones, the messages and the
 * wake-ups they cost ate most of the gain on two cores), copied once into
 * memory the thread shares with the daemon (a fixed set of slots per
 * thread: nothing is allocated per batch, which would add garbage-collection
 * work on both sides), two batches in flight at most, so a slow thread slows
 * its stream rather than growing a queue.
 *
 * Small blobs (manifests, configs, small layers) never leave the main
 * thread: a digest whose expected size is under `minBytes` (or unknown) is
 * computed in place, so that an 8 MiB config does not start a thread (and
 * its memory) for a few milliseconds of hashing.
 */
import { createHash } from 'node:crypto';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { SkiffError } from '../errors.js';

/** Bytes gathered before they go to a thread. */
export const DIGEST_BATCH = 4 << 20;
/** Batches of one digest on their way to its thread before the stream waits. */
const WINDOW = 2;
/** Shared batch slots per thread. */
const SLOTS = 4;

const THREAD_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const { shared, batch } = workerData;
const jobs = new Map();
parentPort.on('message', (m) => {
  try {
    if (m.op === 'start') jobs.set(m.id, createHash(m.algorithm));
    else if (m.op === 'update') {
      const h = jobs.get(m.id);
      const bytes = m.slot >= 0 ? new Uint8Array(shared, m.slot * batch, m.length) : new Uint8Array(m.data, 0, m.length);
      if (h) h.update(bytes);
      parentPort.postMessage({ op: 'ack', id: m.id, slot: m.slot });
    } else if (m.op === 'end') {
      const h = jobs.get(m.id);
      jobs.delete(m.id);
      parentPort.postMessage({ op: 'digest', id: m.id, hex: h ? h.digest('hex') : '' });
    } else if (m.op === 'drop') jobs.delete(m.id);
  } catch (err) {
    parentPort.postMessage({ op: 'error', id: m.id, slot: m.slot, message: String(err && err.message || err) });
  }
});
`;

type Reply = { op: 'ack' | 'digest' | 'error'; id: number; slot?: number; hex?: string; message?: string };

interface RemoteJob {
  inFlight: number;
  /** Wakes the writer waiting for its window to open. */
  wake?: () => void;
  done?: { resolve: (hex: string) => void; reject: (err: Error) => void };
  failed?: Error;
}

interface Thread {
  worker: Worker;
  jobs: Map<number, RemoteJob>;
  /** SLOTS batches of DIGEST_BATCH bytes, shared with the thread. */
  slots: Uint8Array[];
  free: number[];
  /** Writers waiting for a free slot. */
  waiting: Array<() => void>;
}

/** A digest being computed: feed it with update, end it with digest (or abort). */
export interface StreamDigest {
  /**
   * Takes `chunk`, which must not change until the returned promise (if
   * any) settles; the caller waits for it before the next update.
   */
  update(chunk: Buffer): Promise<void> | undefined;
  /** The digest, `<algorithm>:<hex>`. */
  digest(): Promise<string>;
  /** Forgets the digest; nothing more is sent for it. */
  abort(): void;
}

export interface Digester {
  /** `sizeHint`: about how many bytes will be hashed, when known. */
  create(algorithm: 'sha256' | 'sha512', sizeHint?: number): StreamDigest;
}

/** Blobs from this size on are hashed on a thread. */
export const THREAD_MIN_BYTES = 16 << 20;

/** Hashing on the calling thread, as before there were threads: for tests and small tools. */
export const inlineDigester: Digester = {
  create(algorithm) {
    const h = createHash(algorithm);
    return {
      update: (chunk) => {
        h.update(chunk);
        return undefined;
      },
      digest: async () => `${algorithm}:${h.digest('hex')}`,
      abort: () => {},
    };
  },
};

/**
 * A pool of hashing threads, started on first use and stopped after
 * `idleMs` without work, so an idle daemon carries none.
 */
export class DigestThreads implements Digester {
  private readonly threads: Thread[] = [];
  private nextId = 1;
  private idleTimer?: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly size = Math.max(1, Math.min(4, os.availableParallelism())),
    private readonly idleMs = 10_000,
    private readonly minBytes = THREAD_MIN_BYTES,
  ) {}

  create(algorithm: 'sha256' | 'sha512', sizeHint?: number): StreamDigest {
    if (sizeHint === undefined || sizeHint < this.minBytes) return inlineDigester.create(algorithm);
    return new BatchedDigest(this, algorithm);
  }

  /** Threads running now (for tests: an idle pool has none). */
  get running(): number {
    return this.threads.length;
  }

  /** Stops every thread; digests still running fail. */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.idleTimer);
    await Promise.all(this.threads.splice(0).map((t) => this.stop(t, new SkiffError('Unavailable', 'hashing threads stopped'))));
  }

  /** Registers a job on the least busy thread. */
  start(algorithm: string): { id: number; thread: Thread; job: RemoteJob } {
    if (this.closed) throw new SkiffError('Unavailable', 'hashing threads stopped');
    clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
    let thread = this.threads.find((t) => t.jobs.size === 0);
    if (!thread && this.threads.length < this.size) thread = this.spawn();
    thread ??= this.threads.reduce((a, b) => (b.jobs.size < a.jobs.size ? b : a));
    const id = this.nextId++;
    const job: RemoteJob = { inFlight: 0 };
    thread.jobs.set(id, job);
    thread.worker.ref();
    thread.worker.postMessage({ op: 'start', id, algorithm });
    return { id, thread, job };
  }

  /** The job is over (digest received, failed or aborted). */
  finish(thread: Thread, id: number): void {
    thread.jobs.delete(id);
    if (thread.jobs.size === 0) thread.worker.unref();
    if (this.threads.every((t) => t.jobs.size === 0) && this.threads.length) {
      clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => {
        this.idleTimer = undefined;
        if (!this.threads.every((t) => t.jobs.size === 0)) return;
        for (const t of this.threads.splice(0)) void this.stop(t);
      }, this.idleMs);
      this.idleTimer.unref();
    }
  }

  private spawn(): Thread {
    const shared = new SharedArrayBuffer(SLOTS * DIGEST_BATCH);
    const worker = new Worker(THREAD_SOURCE, { eval: true, name: 'skiff-digest', workerData: { shared, batch: DIGEST_BATCH } });
    const thread: Thread = {
      worker,
      jobs: new Map(),
      slots: Array.from({ length: SLOTS }, (_, i) => new Uint8Array(shared, i * DIGEST_BATCH, DIGEST_BATCH)),
      free: Array.from({ length: SLOTS }, (_, i) => i),
      waiting: [],
    };
    worker.on('message', (m: Reply) => {
      if (m.slot !== undefined && m.slot >= 0) thread.free.push(m.slot);
      // Every answer may free a slot or end a writer's last batch in flight: waiting writers look again.
      for (const w of thread.waiting.splice(0)) w();
      const job = thread.jobs.get(m.id);
      if (!job) return;
      if (m.op === 'ack') {
        job.inFlight--;
        const wake = job.wake;
        job.wake = undefined;
        wake?.();
      } else if (m.op === 'digest') {
        this.finish(thread, m.id);
        job.done?.resolve(m.hex!);
      } else {
        this.fail(thread, m.id, job, new SkiffError('Internal', `hashing failed: ${m.message}`));
      }
    });
    const died = (err: Error) => {
      const i = this.threads.indexOf(thread);
      if (i >= 0) this.threads.splice(i, 1);
      for (const [id, job] of thread.jobs) this.fail(thread, id, job, err);
      for (const w of thread.waiting.splice(0)) w();
    };
    worker.on('error', (err) => died(new SkiffError('Internal', `hashing thread failed: ${err.message}`, { cause: err })));
    worker.on('exit', (code) => died(new SkiffError('Internal', `hashing thread exited (${code})`)));
    worker.unref();
    this.threads.push(thread);
    return thread;
  }

  private fail(thread: Thread, id: number, job: RemoteJob, err: Error): void {
    job.failed = err;
    this.finish(thread, id);
    const wake = job.wake;
    job.wake = undefined;
    wake?.();
    job.done?.reject(err);
  }

  private async stop(t: Thread, err?: Error): Promise<void> {
    if (err) for (const [id, job] of t.jobs) this.fail(t, id, job, err);
    for (const w of t.waiting.splice(0)) w();
    t.worker.removeAllListeners('exit');
    t.worker.on('exit', () => {});
    await t.worker.terminate();
  }
}

/**
 * One digest on a thread. Each batch is copied into a free slot of the
 * digest's thread; when none is free, the digest waits for one of its own
 * batches to come back, or, with none in flight, uses a batch of its own (so
 * digests sharing a thread can never wait on each other in a circle).
 */
class BatchedDigest implements StreamDigest {
  private remote?: { id: number; thread: Thread; job: RemoteJob };
  private cur?: { bytes: Uint8Array; slot: number };
  private filled = 0;
  private over = false;

  constructor(
    private readonly pool: DigestThreads,
    private readonly algorithm: 'sha256' | 'sha512',
  ) {}

  /** Never throws: it runs inside stream callbacks, where a throw would not reach the stream. */
  update(chunk: Buffer): Promise<void> | undefined {
    if (this.over) return Promise.reject(new SkiffError('Internal', 'digest updated after its end'));
    if (!this.remote) {
      try {
        this.remote = this.pool.start(this.algorithm);
      } catch (err) {
        return Promise.reject(err);
      }
    }
    return this.copy([chunk], 0);
  }
  /** Copies `chunks` (from `off` in the first) into batches, sending each one full. */
  private copy(chunks: Buffer[], off: number): Promise<void> | undefined {
    const { thread, job } = this.remote!;
    for (let i = 0; i < chunks.length; i++, off = 0) {
      const c = chunks[i]!;
      while (off < c.length) {
        if (job.failed) return Promise.reject(job.failed);
        if (!this.cur) {
          const slot = thread.free.pop();
          if (slot !== undefined) this.cur = { bytes: thread.slots[slot]!, slot };
          else if (job.inFlight > 0) {
            const rest = [c, ...chunks.slice(i + 1)];
            const at = off;
            return new Promise<void>((resolve) => thread.waiting.push(resolve)).then(() => (this.over ? undefined : this.copy(rest, at)));
          } else this.cur = { bytes: new Uint8Array(DIGEST_BATCH), slot: -1 };
        }
        const n = Math.min(c.length - off, DIGEST_BATCH - this.filled);
        this.cur.bytes.set(c.subarray(off, off + n), this.filled);
        this.filled += n;
        off += n;
        if (this.filled === DIGEST_BATCH) this.send();
      }
    }
    if (job.failed) return Promise.reject(job.failed);
    if (job.inFlight < WINDOW) return undefined;
    return new Promise<void>((resolve, reject) => {
      job.wake = () => (job.failed ? reject(job.failed) : resolve());
    });
  }

  private send(): void {
    const { id, thread, job } = this.remote!;
    const { bytes, slot } = this.cur!;
    job.inFlight++;
    if (slot >= 0) thread.worker.postMessage({ op: 'update', id, slot, length: this.filled });
    else thread.worker.postMessage({ op: 'update', id, slot, data: bytes.buffer, length: this.filled }, [bytes.buffer as ArrayBuffer]);
    this.cur = undefined;
    this.filled = 0;
  }

  async digest(): Promise<string> {
    if (this.over) throw new SkiffError('Internal', 'digest ended twice');
    this.over = true;
    // Nothing was hashed.
    if (!this.remote) return `${this.algorithm}:${createHash(this.algorithm).digest('hex')}`;
    const { id, thread, job } = this.remote;
    if (job.failed) throw job.failed;
    if (this.filled > 0) this.send();
    const hex = await new Promise<string>((resolve, reject) => {
      job.done = { resolve, reject };
      thread.worker.postMessage({ op: 'end', id });
    });
    return `${this.algorithm}:${hex}`;
  }

  abort(): void {
    if (this.over) return;
    this.over = true;
    if (!this.remote) return;
    const { id, thread, job } = this.remote;
    if (this.cur && this.cur.slot >= 0) {
      thread.free.push(this.cur.slot);
      for (const w of thread.waiting.splice(0)) w();
    }
    this.cur = undefined;
    if (job.failed) return;
    thread.worker.postMessage({ op: 'drop', id });
    this.pool.finish(thread, id);
  }
}
