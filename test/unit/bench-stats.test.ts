import { describe, expect, it } from 'vitest';
import { percentile } from '../../bench/stats.js';

describe('percentile (nearest rank)', () => {
  it('takes the sample at or above the rank, whatever the order given', () => {
    const xs = [5, 1, 4, 2, 3];
    expect(percentile(xs, 50)).toBe(3);
    expect(percentile(xs, 100)).toBe(5);
    expect(percentile(xs, 1)).toBe(1);
    expect(percentile(xs, 20)).toBe(1);
    expect(percentile(xs, 21)).toBe(2);
    expect(xs).toEqual([5, 1, 4, 2, 3]);
  });

  it('gives the lower middle of an even count as p50, and the one slowest of 100 as p99 only when it is the 100th', () => {
    expect(percentile([1, 2, 3, 4], 50)).toBe(2);
    const hundred = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(percentile(hundred, 99)).toBe(99);
    expect(percentile([...hundred, 1000], 99)).toBe(100);
    expect(percentile(Array.from({ length: 200 }, (_, i) => i + 1), 99)).toBe(198);
  });

  it('sorts numerically, not as text', () => {
    expect(percentile([10, 9, 100], 50)).toBe(10);
  });

  it('is NaN for no samples and refuses a percentile out of range', () => {
    expect(percentile([], 50)).toBeNaN();
    expect(() => percentile([1], 0)).toThrow(RangeError);
    expect(() => percentile([1], 101)).toThrow(RangeError);
  });
});
