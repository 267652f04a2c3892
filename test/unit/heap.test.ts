import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

/**
 * src/heap.ts holds the main thread's young generation at its initial size. It runs in a node of
 * its own (the flag is the whole process's), from the build as bin/skiff.js loads it.
 */
function youngGenerationAfter(setup: string): { mib: number; out: string } {
  const heap = path.resolve('dist/heap.js');
  const script = `
    import v8 from 'node:v8';
    import { Worker } from 'node:worker_threads';
    ${setup.replace('HEAP', JSON.stringify(heap))}
    // Calls' worth of short-lived objects with survivors: what makes V8 grow the space.
    const burst = () => { let keep = []; for (let r = 0; r < 10; r++) { for (let i = 0; i < 3e5; i++) keep.push({ a: i, b: 'x' + i }); keep = keep.slice(-1e5); } };
    burst();
    const w = new Worker('setTimeout(() => {}, 300)', { eval: true, resourceLimits: { maxOldGenerationSizeMb: 64 } });
    await new Promise((r) => w.once('online', r));
    await new Promise((r) => setImmediate(r));
    burst();
    await new Promise((r) => w.once('exit', r));
    burst();
    console.log(v8.getHeapSpaceStatistics().find((s) => s.space_name === 'new_space').space_size);
  `;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 60_000 });
  return { mib: Number(r.stdout.trim()) / (1 << 20), out: `${r.stdout}${r.stderr}` };
}

describe('the young generation (src/heap.ts)', () => {
  it('stays near its initial 1 MiB semi-spaces through busy spells, after a Worker started too', () => {
    const held = youngGenerationAfter(`await import(HEAP);`);
    // Two 1 MiB semi-spaces; one doubling can slip in while the Worker's isolate is set up, before 'online'.
    expect(held.mib, held.out).toBeLessThanOrEqual(4);
  });

  it('grows without it: the burst is one that V8 grows the space for (so the test above can fail)', () => {
    const free = youngGenerationAfter('');
    expect(free.mib, free.out).toBeGreaterThanOrEqual(16);
  });
});
