import { describe, expect, it } from 'vitest';
import { parseExact, parseMilliQuantity, quantityValue, tryParseQuantity } from '../../src/kubelet-lite/quantity.js';

describe('quantities', () => {
  it.each([
    ['100m', 0.1, 100, 1],
    ['1.5', 1.5, 1500, 2],
    ['64Mi', 64 * 2 ** 20, 64 * 2 ** 20 * 1000, 64 * 2 ** 20],
    ['2e3', 2000, 2_000_000, 2000],
    ['1G', 1e9, 1e12, 1e9],
    ['0.3', 0.3, 300, 1],
  ])('%s is %d, %d thousandths, %d whole units rounded up', (q, value, milli, whole) => {
    expect(tryParseQuantity(q)).toBeCloseTo(value, 9);
    expect(parseMilliQuantity(q)).toBe(milli);
    expect(quantityValue(q)).toBe(whole);
  });

  it('refuses huge exponents at once instead of computing them', () => {
    const t0 = performance.now();
    for (const q of ['1e99999999', '1E-99999999', '9e31']) expect(tryParseQuantity(q)).toBeUndefined();
    expect(performance.now() - t0).toBeLessThan(50);
    expect(() => parseExact('1e99999999')).toThrow(/quantity/);
    expect(tryParseQuantity('1'.repeat(65))).toBeUndefined();
    expect(tryParseQuantity(Number.POSITIVE_INFINITY)).toBeUndefined();
  });
});
