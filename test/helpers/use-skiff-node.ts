/** The suite-level fixture for a whole node (kept apart from skiff-node.ts, which the benchmarks import without vitest). */
import { afterAll, beforeAll, expect } from 'vitest';
import type { SkiffNode } from './skiff-node.js';

/** Creates `node` before a suite's tests and destroys it after them, checking that it left no mount or process behind. */
export function useSkiffNode(node: SkiffNode): void {
  beforeAll(() => node.create(), 180_000);
  afterAll(async () => {
    expect(await node.destroy()).toEqual({ mounts: [], processes: [] });
  }, 120_000);
}
