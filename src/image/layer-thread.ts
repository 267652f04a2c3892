/**
 * Runs layer jobs (layer-job.ts) on threads of their own. The download
 * stays on the daemon's thread; its chunks are copied into 1 MiB buffers
 * that are handed over (transferred, not copied again) to the layer's
 * thread, so the daemon's heap never carries the layer's bytes: V8 counts
 * every buffer against a heap's external-memory budget, and on the
 * daemon's heap each 64 MiB of them cost a full garbage collection.
 *
 * Memory stays bounded whatever the registry sends: at most IN_FLIGHT
 * buffers are on their way to a thread before the download is paused, and
 * a thread takes a buffer only as fast as it writes and unpacks it.
 * Threads are started on demand, one job each at a time, and end when idle.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { Readable } from 'node:stream';
import { Worker } from 'node:worker_threads';
import { SkiffError } from '../errors.js';
import { LayerRun, settledFromWire, toWire, type LayerJob, type LayerOutcome } from './layer-job.js';

const CHUNK = 1 << 20;
const IN_FLIGHT = 4;
const IDLE_MS = 10_000;
/** The bytes a layer thread handles live outside its heap; the heap itself holds little. */
const THREAD_HEAP_MB = 64;

const script = new URL('./layer-worker.js', import.meta.url);
const available = script.protocol === 'file:' && existsSync(fileURLToPath(script));

const idle: Worker[] = [];
let idleTimer: NodeJS.Timeout | undefined;

function takeWorker(): Worker {
  const w = idle.pop();
  if (w) return w;
  const fresh = new Worker(script, { resourceLimits: { maxOldGenerationSizeMb: THREAD_HEAP_MB } });
  fresh.unref();
  // A job's own listeners report a failure during it; an idle thread that fails is only dropped.
  fresh.on('error', () => undefined);
  fresh.on('exit', () => {
    const i = idle.indexOf(fresh);
    if (i >= 0) idle.splice(i, 1);
  });
  return fresh;
}

function giveBack(w: Worker): void {
  idle.push(w);
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = setTimeout(() => {
    for (const x of idle.splice(0)) void x.terminate();
  }, IDLE_MS);
  idleTimer.unref();
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
    const w = takeWorker();
    let acc: Buffer | undefined;
    let filled = 0;
    let inFlight = 0;
    let finished = false;
    let bodyError: Error | undefined;
    const send = () => {
      if (!acc || filled === 0) return;
      const buf = acc.buffer;
      const whole = filled === acc.length ? buf : buf.slice(0, filled);
      acc = undefined;
      filled = 0;
      inFlight++;
      w.postMessage({ type: 'data', buf: whole }, [whole as ArrayBuffer]);
    };
    const onData = (chunk: Buffer) => {
      let off = 0;
      while (off < chunk.length) {
        // Not zero-filled (every byte sent is first written), and a buffer of its own, which a transfer may take.
        acc ??= Buffer.allocUnsafeSlow(CHUNK);
        const n = Math.min(acc.length - filled, chunk.length - off);
        acc.set(chunk.subarray(off, off + n), filled);
        filled += n;
        off += n;
        if (filled === acc.length) send();
      }
      if (inFlight >= IN_FLIGHT) body.pause();
    };
    const onEnd = () => {
      send();
      w.postMessage({ type: 'end' });
    };
    const onError = (err: Error) => {
      bodyError ??= err;
      w.postMessage({ type: 'abort', error: toWire(err) });
    };
    const finish = (outcome: LayerOutcome, healthy: boolean) => {
      if (finished) return;
      finished = true;
      body.off('data', onData);
      body.off('end', onEnd);
      body.off('error', onError);
      // The job settled before the blob's end (its blob could not be written): the rest is not read.
      if (!body.readableEnded) {
        body.on('error', () => undefined);
        body.destroy();
      }
      w.off('message', onMessage);
      w.off('error', onCrash);
      w.off('exit', onExit);
      if (healthy) giveBack(w);
      else void w.terminate();
      // The download's own error, not its copy from the thread, says why the blob is missing.
      resolve(bodyError && !outcome.stored.ok ? { ...outcome, stored: { ok: false, error: bodyError } } : outcome);
    };
    const onMessage = (m: { type: 'ack' } | { type: 'done'; outcome: LayerOutcome }) => {
      if (m.type === 'ack') {
        inFlight--;
        if (inFlight < IN_FLIGHT && body.isPaused() && !finished) body.resume();
        return;
      }
      finish({ unpacked: settledFromWire(m.outcome.unpacked), stored: settledFromWire(m.outcome.stored) }, true);
    };
    const crashed = (why: string) => {
      const error = new SkiffError('Internal', `layer thread failed: ${why}`);
      finish({ unpacked: { ok: false, error }, stored: { ok: false, error } }, false);
    };
    const onCrash = (err: Error) => crashed(err.message);
    const onExit = (code: number) => crashed(`exited with code ${code}`);
    w.on('message', onMessage);
    w.on('error', onCrash);
    w.on('exit', onExit);
    w.postMessage({ type: 'start', job });
    body.on('data', onData);
    body.on('end', onEnd);
    body.on('error', onError);
  });
}
