/**
 * A layer thread: runs one LayerRun at a time for the daemon (layer-thread.ts).
 * Messages in: start (the job), data (a transferred chunk), end, abort.
 * Messages out: ack (a chunk is written and taken by the unpacker), done.
 */
import { parentPort } from 'node:worker_threads';
import { fromWire, LayerRun, settledToWire, type LayerJob, type WireError } from './layer-job.js';

type In =
  | { type: 'start'; job: LayerJob }
  | { type: 'data'; buf: ArrayBuffer }
  | { type: 'end' }
  | { type: 'abort'; error: WireError };

const port = parentPort!;
let run: LayerRun | undefined;

port.on('message', (m: In) => {
  switch (m.type) {
    case 'start': {
      const mine = new LayerRun(m.job);
      run = mine;
      void mine.outcome.then((o) => {
        if (run === mine) run = undefined;
        port.postMessage({ type: 'done', outcome: { unpacked: settledToWire(o.unpacked), stored: settledToWire(o.stored) } });
      });
      return;
    }
    case 'data':
      // A chunk sent after the job settled early (its blob could not be written) is dropped.
      if (run) void run.offer(Buffer.from(m.buf)).then(() => port.postMessage({ type: 'ack' }));
      return;
    case 'end':
      run?.end();
      return;
    case 'abort':
      run?.abort(fromWire(m.error));
      return;
  }
});
