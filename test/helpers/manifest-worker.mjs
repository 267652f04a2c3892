// The manifest parser thread from its TypeScript source: unit tests run
// without the compiled worker, and a real thread is what times out and runs
// out of heap.
import { register } from 'tsx/esm/api';

register();
await import('../../src/kubelet-lite/manifest-worker.ts');
