/**
 * The young generation's size, set before anything else is loaded.
 *
 * V8 doubles the young generation's semi-spaces after busy spells, up to
 * 8 MiB each, and an idle daemon never collects again to give them back:
 * after a burst of calls they stay resident for good. Held at their initial
 * 1 MiB, the daemon's RSS after a burst of 3000 calls was 84 MiB instead of
 * 98 MiB. The flag is read by V8 each time it would grow the space, so
 * setting it here, once the process runs, takes effect.
 *
 * The flag is the whole process's, and V8 raises it back to 2 whenever it
 * sets up an isolate: each Worker (the layer thread of a pull, kubelet-lite's
 * manifest parser) undid it, and the main thread's young generation then grew
 * as before (4 MiB committed after one pull and 5 pods, 32 MiB after a busy
 * spell in a test). So it is set again once each Worker runs.
 *
 * A node started with its own semi-space flags keeps them.
 */
import process from 'node:process';
import v8 from 'node:v8';
import type { Worker } from 'node:worker_threads';

const own = process.execArgv.some((a) => /^--(max|min)-semi-space-size|^--semi-space-growth-factor/.test(a)) || /semi-space/.test(process.env.NODE_OPTIONS ?? '');

function holdYoungGeneration(): void {
  v8.setFlagsFromString('--semi-space-growth-factor=1');
}

if (!own) {
  holdYoungGeneration();
  // 'online' comes once the Worker's isolate is set up, and so after V8 raised the flag.
  process.on('worker', (w: Worker) => w.once('online', holdYoungGeneration));
}
