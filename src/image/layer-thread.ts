/**
 * Runs layer jobs (layer-job.ts) on threads of their own. The download
 * stays on the daemon's thread; its chunks are copied into 1 MiB buffers
 * that are handed over (transferred, not copied again) to a layer thread,
 * so the daemon's heap never carries the layer's bytes. V8 counts the
 * buffers a heap allocates against that heap's old-generation budget, and
 * on the daemon's heap (some 15 MiB of live code and modules) every 8 MiB
 * or so of them cost a full collection: two dozen per 168 MiB pull, a
 * quarter of its CPU. A layer thread's heap holds a few MiB, so its own
 * collections are few and short.
 *
 * Memory stays bounded whatever the registry sends: at most IN_FLIGHT
 * buffers of a layer are on their way to a thread before its download is
 * paused, and a thread takes a buffer only as fast as it writes and
 * unpacks it. The thread starts on demand, runs every layer's job, and
 * ends once it has had no job for IDLE_MS (10 s): an idle daemon holds
 * none.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Readable } from 'node:stream';
import { Worker } from 'node:worker_threads';
import { SkiffError } from '../errors.js';
import { mallocTrim } from '../sys/libc.js';
import { LayerRun, settledFromWire, toWire, type LayerJob, type LayerOutcome } from './layer-job.js';

const CHUNK = 1 << 20;
const IN_FLIGHT = 4;
/**
 * A thread with no job for this long ends. Starting one costs ~100 ms and
 * ~170 ms of CPU, and its code runs cold at first: a pull on a new thread
 * took 1.1-1.3 s CPU against 1.0-1.1 s on a warm one. Pulls that follow
 * each other within this (a pod's images, the bench's rounds) share it.
 */
const IDLE_MS = 10_000;
/** The bytes a layer thread handles live outside its heap; the heap itself holds little. */
const THREAD_HEAP_MB = 64;
/**
 * One thread for all layers. Two (one per core here) pulled the bench image
 * in 0.64 s instead of 0.70 s, but each thread's isolate and the gunzip
 * output its heap has not yet collected (V8 scavenges a heap after 32 MiB
 * of new buffers) added some 40 MiB to the daemon's RSS during a pull.
 */
const MAX_THREADS = 1;

const script = new URL('./layer-worker.js', import.meta.url);
const available = script.protocol === 'file:' && existsSync(fileURLToPath(script));

type Reply = { type: 'ack'; id: number; buf?: ArrayBuffer } | { type: 'done'; id: number; outcome: LayerOutcome };

interface JobSide {
  onAck(buf: ArrayBuffer | undefined): void;
  onDone(outcome: LayerOutcome): void;
  onCrash(why: string): void;
}

/** A thread and the jobs it runs. */
class LayerThread {
  readonly jobs = new Map<number, JobSide>();
  private readonly worker: Worker;
  private idleTimer: NodeJS.Timeout | undefined;
  dead = false;

  constructor(private readonly onGone: (t: LayerThread) => void) {
    this.worker = new Worker(script, { resourceLimits: { maxOldGenerationSizeMb: THREAD_HEAP_MB } });
    this.worker.unref();
    this.worker.on('message', (m: Reply) => {
      const job = this.jobs.get(m.id);
      if (!job) return;
      if (m.type === 'ack') return job.onAck(m.buf);
      this.jobs.delete(m.id);
      this.idleCheck();
      job.onDone({ unpacked: settledFromWire(m.outcome.unpacked), stored: settledFromWire(m.outcome.stored) });
    });
    const crashed = (why: string) => {
      if (this.dead) return;
      this.gone();
      for (const job of this.jobs.values()) job.onCrash(why);
      this.jobs.clear();
    };
    this.worker.on('error', (err) => crashed(err.message));
    this.worker.on('exit', (code) => {
      crashed(`exited with code ${code}`);
      // The last thread is gone: what malloc kept of the layers' buffers goes back to the system.
      if (!threads.length) mallocTrim();
    });
  }

  post(msg: unknown, transfer?: ArrayBuffer[]): void {
    if (!this.dead) this.worker.postMessage(msg, transfer);
  }

  add(id: number, side: JobSide): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
    this.jobs.set(id, side);
  }

  private gone(): void {
    this.dead = true;
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.onGone(this);
  }

  private idleCheck(): void {
    if (this.jobs.size || this.dead) return;
    this.idleTimer = setTimeout(() => {
      this.gone();
      void this.worker.terminate();
    }, IDLE_MS);
    this.idleTimer.unref();
  }
}

const threads: LayerThread[] = [];
let nextId = 0;

/** The thread with the fewest jobs, or a new one while every thread is busy and there are fewer than MAX_THREADS. */
function pickThread(): LayerThread {
  const least = threads.reduce<LayerThread | undefined>((a, t) => (!a || t.jobs.size < a.jobs.size ? t : a), undefined);
  if (least && (least.jobs.size === 0 || threads.length >= MAX_THREADS)) return least;
  const t = new LayerThread((gone) => {
    const i = threads.indexOf(gone);
    if (i >= 0) threads.splice(i, 1);
  });
  threads.push(t);
  return t;
}

/** How many layer threads run now (for tests: an idle daemon holds none). */
export function layerThreadCount(): number {
  return threads.length;
}

/**
 * Stores (into `job.blobTmp`) and unpacks (into `job.dir`) the blob `body`
 * streams. Settles when both sides have; a body that fails fails both.
 */
export function storeAndUnpack(job: LayerJob, body: Readable): Promise<LayerOutcome> {
  return available ? onThread(job, body) : inPlace(job, body);
}

/** Without the compiled worker (tests running the TypeScript sources): the same job on this thread. */
async function inPlace(job: LayerJob, body: Readable): Promise<LayerOutcome> {
  const run = new LayerRun(job);
  let settled = false;
  void run.outcome.then(() => (settled = true));
  try {
    for await (const chunk of body as AsyncIterable<Buffer>) {
      if (settled) break;
      await run.offer(chunk);
    }
    run.end();
  } catch (err) {
    run.abort(err);
  }
  if (!body.readableEnded) body.destroy();
  return run.outcome;
}

function onThread(job: LayerJob, body: Readable): Promise<LayerOutcome> {
  return new Promise((resolve) => {
    const thread = pickThread();
    const id = ++nextId;
    let acc: Buffer | undefined;
    let filled = 0;
    let inFlight = 0;
    let finished = false;
    let over = false;
    let bodyError: Error | undefined;
    /** Chunks the thread gave back, filled again instead of new ones: a layer allocates about IN_FLIGHT of them. */
    const spare: Buffer[] = [];
    const send = () => {
      if (!acc || filled === 0) return;
      const buf = acc.buffer as ArrayBuffer;
      const whole = filled === acc.length ? buf : buf.slice(0, filled);
      acc = undefined;
      filled = 0;
      inFlight++;
      thread.post({ type: 'data', id, buf: whole }, [whole]);
    };
    const onData = (chunk: Buffer) => {
      let off = 0;
      while (off < chunk.length) {
        // Not zero-filled (every byte sent is first written), and a buffer of its own, which a transfer may take.
        acc ??= spare.pop() ?? Buffer.allocUnsafeSlow(CHUNK);
        const n = Math.min(acc.length - filled, chunk.length - off);
        acc.set(chunk.subarray(off, off + n), filled);
        filled += n;
        off += n;
        if (filled === acc.length) send();
      }
      if (inFlight >= IN_FLIGHT) body.pause();
    };
    const onEnd = () => {
      over = true;
      send();
      thread.post({ type: 'end', id });
    };
    const onError = (err: Error) => {
      if (over) return;
      over = true;
      bodyError ??= err;
      thread.post({ type: 'abort', id, error: toWire(err) });
    };
    // A download stopped without an error (the pull was cancelled) ends neither way: it is a failed one.
    const onClose = () => {
      if (!over) onError(Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' }));
    };
    const finish = (outcome: LayerOutcome) => {
      if (finished) return;
      finished = true;
      body.off('data', onData);
      body.off('end', onEnd);
      body.off('error', onError);
      body.off('close', onClose);
      // The job settled before the blob's end (its blob could not be written): the rest is not read.
      if (!body.readableEnded) {
        body.on('error', () => undefined);
        body.destroy();
      }
      // The download's own error, not its copy from the thread, says why the blob is missing.
      resolve(bodyError && !outcome.stored.ok ? { ...outcome, stored: { ok: false, error: bodyError } } : outcome);
    };
    thread.add(id, {
      onAck: (buf) => {
        if (buf?.byteLength === CHUNK) spare.push(Buffer.from(buf));
        inFlight--;
        if (inFlight < IN_FLIGHT && body.isPaused() && !finished) body.resume();
      },
      onDone: finish,
      onCrash: (why) => {
        const error = new SkiffError('Internal', `layer thread failed: ${why}`);
        finish({ unpacked: { ok: false, error }, stored: { ok: false, error } });
      },
    });
    thread.post({ type: 'start', id, job });
    body.on('data', onData);
    body.on('end', onEnd);
    body.on('error', onError);
    body.on('close', onClose);
  });
}
