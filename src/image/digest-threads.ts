/**
 * sha256/sha512 of streamed blobs on worker threads. A pull hashes every
 * byte twice (the compressed blob, then the tar it unpacks to), about 1 GB/s
 * per core here: on the main thread that alone was a third of a pull of
 * large layers, and kept the one thread that also drives the sockets, the
 * decompression and the disk writes busy. Each digest lives on one thread;
 * bytes go there in 1 MiB batches (one copy, then handed over without
 * another), a few batches in flight at most, so a slow thread slows its
 * stream rather than growing a queue.
 *
 * Small blobs (manifests, configs, small layers) never leave the main
 * thread: a digest whose bytes end before the first batch fills is
 * computed in place.
 */
import { createHash, type Hash } from 'node:crypto';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { SkiffError } from '../errors.js';

/** Bytes gathered before they go to a thread. */
export const DIGEST_BATCH = 1 << 20;
/** Batches of one digest on their way to its thread before the stream waits. */
const WINDOW = 4;

const THREAD_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const jobs = new Map();
parentPort.on('message', (m) => {
  try {
    if (m.op === 'start') jobs.set(m.id, createHash(m.algorithm));
    else if (m.op === 'update') {
      const h = jobs.get(m.id);
      if (h) h.update(new Uint8Array(m.data, 0, m.length));
      parentPort.postMessage({ op: 'ack', id: m.id, data: m.data }, [m.data]);
    } else if (m.op === 'end') {
      const h = jobs.get(m.id);
      jobs.delete(m.id);
      parentPort.postMessage({ op: 'digest', id: m.id, hex: h ? h.digest('hex') : '' });
    } else if (m.op === 'drop') jobs.delete(m.id);
  } catch (err) {
    parentPort.postMessage({ op: 'error', id: m.id, message: String(err && err.message || err) });
  }
});
`;

type Reply = { op: 'ack' | 'digest' | 'error'; id: number; hex?: string; message?: string; data?: ArrayBuffer };

/** Batch buffers kept for reuse: a pull of large layers would otherwise allocate (and zero) one per MiB it hashes. */
const SPARE_BUFFERS = 16;

interface RemoteJob {
  inFlight: number;
  /** Resolves the writer waiting for the window to open. */
  wake?: () => void;
  done?: { resolve: (hex: string) => void; reject: (err: Error) => void };
  failed?: Error;
}

interface Thread {
  worker: Worker;
  jobs: Map<number, RemoteJob>;
}

/** A digest being computed: feed it with update, end it with digest (or abort). */
export interface StreamDigest {
  /** Takes `chunk` (not kept); a returned promise asks the caller to wait before the next one. */
  update(chunk: Buffer): Promise<void> | undefined;
  /** The digest, `<algorithm>:<hex>`. */
  digest(): Promise<string>;
  /** Forgets the digest; nothing more is sent for it. */
  abort(): void;
}

export interface Digester {
  create(algorithm: 'sha256' | 'sha512'): StreamDigest;
}

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
  private readonly spare: ArrayBuffer[] = [];
  private nextId = 1;
  private idleTimer?: NodeJS.Timeout;
  private closed = false;

  constructor(
    private readonly size = Math.max(1, Math.min(4, os.availableParallelism())),
    private readonly idleMs = 10_000,
  ) {}

  create(algorithm: 'sha256' | 'sha512'): StreamDigest {
    return new BatchedDigest(this, algorithm);
  }

  /** A batch buffer, reused when one has come back. */
  buffer(): ArrayBuffer {
    return this.spare.pop() ?? new ArrayBuffer(DIGEST_BATCH);
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
      this.idleTimer = setTimeout(() => {
        this.idleTimer = undefined;
        if (!this.threads.every((t) => t.jobs.size === 0)) return;
        for (const t of this.threads.splice(0)) void this.stop(t);
        this.spare.length = 0;
      }, this.idleMs);
      this.idleTimer.unref();
    }
  }

  private spawn(): Thread {
    const worker = new Worker(THREAD_SOURCE, { eval: true, name: 'skiff-digest' });
    const thread: Thread = { worker, jobs: new Map() };
    worker.on('message', (m: Reply) => {
      if (m.data && this.spare.length < SPARE_BUFFERS) this.spare.push(m.data);
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
    t.worker.removeAllListeners('exit');
    t.worker.on('exit', () => {});
    await t.worker.terminate();
  }
}

class BatchedDigest implements StreamDigest {
  private batch?: Uint8Array;
  private filled = 0;
  private inline?: Hash;
  private remote?: { id: number; thread: Thread; job: RemoteJob };
  private over = false;

  constructor(
    private readonly pool: DigestThreads,
    private readonly algorithm: 'sha256' | 'sha512',
  ) {}

  update(chunk: Buffer): Promise<void> | undefined {
    if (this.over) throw new SkiffError('Internal', 'digest updated after its end');
    let off = 0;
    while (off < chunk.length) {
      this.batch ??= new Uint8Array(this.pool.buffer());
      const n = Math.min(chunk.length - off, DIGEST_BATCH - this.filled);
      this.batch.set(chunk.subarray(off, off + n), this.filled);
      this.filled += n;
      off += n;
      if (this.filled === DIGEST_BATCH) this.send();
    }
    const job = this.remote?.job;
    if (!job) return undefined;
    if (job.failed) return Promise.reject(job.failed);
    if (job.inFlight < WINDOW) return undefined;
    return new Promise<void>((resolve, reject) => {
      job.wake = () => (job.failed ? reject(job.failed) : resolve());
    });
  }

  private send(): void {
    this.remote ??= this.pool.start(this.algorithm);
    const { id, thread, job } = this.remote;
    if (job.failed) return;
    const data = this.batch!.buffer as ArrayBuffer;
    job.inFlight++;
    thread.worker.postMessage({ op: 'update', id, data, length: this.filled }, [data]);
    this.batch = undefined;
    this.filled = 0;
  }

  async digest(): Promise<string> {
    if (this.over) throw new SkiffError('Internal', 'digest ended twice');
    this.over = true;
    if (!this.remote) {
      // Never filled a batch: not worth a thread.
      this.inline = createHash(this.algorithm);
      if (this.batch) this.inline.update(this.batch.subarray(0, this.filled));
      this.batch = undefined;
      return `${this.algorithm}:${this.inline.digest('hex')}`;
    }
    if (this.filled > 0) this.send();
    const { id, thread, job } = this.remote;
    if (job.failed) throw job.failed;
    const hex = await new Promise<string>((resolve, reject) => {
      job.done = { resolve, reject };
      thread.worker.postMessage({ op: 'end', id });
    });
    return `${this.algorithm}:${hex}`;
  }

  abort(): void {
    if (this.over) return;
    this.over = true;
    this.batch = undefined;
    if (!this.remote) return;
    const { id, thread, job } = this.remote;
    if (job.failed) return;
    thread.worker.postMessage({ op: 'drop', id });
    this.pool.finish(thread, id);
  }
}
