import { describe, expect, it } from 'vitest';
import { descriptorsToSpare, lazyCode } from '../../src/lazy-code.js';

describe('lazyCode', () => {
  it('loads once for callers at the same time, and again after a failure', async () => {
    let calls = 0;
    const load = lazyCode('test', async () => {
      calls++;
      if (calls === 1) throw new Error('EMFILE');
      return { n: calls };
    });
    const first = await Promise.allSettled([load(), load(), load()]);
    expect(first.map((r) => r.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect(calls).toBe(1);
    const [a, b] = await Promise.all([load(), load()]);
    expect(a).toBe(b);
    expect(a).toEqual({ n: 2 });
    expect(await load()).toBe(a);
    expect(calls).toBe(2);
  });

  it('sees descriptors to spare in a process far from its limit', () => {
    expect(descriptorsToSpare()).toBe(true);
  });
});
