/**
 * A layer thread: runs LayerRuns for the daemon (layer-thread.ts), any number
 * at once, each named by the id the daemon gave it.
 * Messages in: start (the job), data (a transferred chunk), end, abort.
 * Messages out: ack (a chunk is written and taken by the unpacker, with the
 * chunk's memory when nothing here refers to it any more), done.
 */
import { parentPort } from 'node:worker_threads';
import { setThreadName } from '../sys/libc.js';
import { fromWire, LayerRun, settledToWire, type LayerJob, type WireError } from './layer-job.js';

type In =
  | { type: 'start'; id: number; job: LayerJob }
  | { type: 'data'; id: number; buf: ArrayBuffer }
  | { type: 'end'; id: number }
  | { type: 'abort'; id: number; error: WireError };

// What ps -L and /proc/<pid>/task/<tid>/comm call this thread (image-pull.test counts it by that name).
setThreadName('skiff-layers');

const port = parentPort!;
const runs = new Map<number, LayerRun>();

port.on('message', (m: In) => {
  if (m.type === 'start') {
    const run = new LayerRun(m.job);
    runs.set(m.id, run);
    void run.outcome.then((o) => {
      runs.delete(m.id);
      port.postMessage({ type: 'done', id: m.id, outcome: { unpacked: settledToWire(o.unpacked), stored: settledToWire(o.stored) } });
    });
    return;
  }
  // A message for a job that settled early (its blob could not be written) is dropped.
  const run = runs.get(m.id);
  if (!run) return;
  if (m.type === 'data') {
    // A chunk nothing refers to any more goes back to be filled again: the feeder allocates no new one.
    void run.offer(Buffer.from(m.buf)).then((reuse) =>
      reuse ? port.postMessage({ type: 'ack', id: m.id, buf: m.buf }, [m.buf]) : port.postMessage({ type: 'ack', id: m.id }),
    );
  } else if (m.type === 'end') run.end();
  else run.abort(fromWire(m.error));
});
