/**
 * The manifest parser's thread: YAML takes seconds and hundreds of MiB for
 * a few MiB of hostile input, so the agent parses off its event loop, under
 * a heap limit (see IsolatedParser in manifests.ts).
 */
import { parentPort } from 'node:worker_threads';
import { errorMessage } from '../errors.js';
import { parseManifest } from './manifests.js';

parentPort?.on('message', (m: { file: string; data: Uint8Array }) => {
  try {
    parentPort!.postMessage({ manifest: parseManifest(m.file, m.data) });
  } catch (err) {
    parentPort!.postMessage({ error: errorMessage(err) });
  }
});
