/** Order statistics for the benches' samples. */

/**
 * The nearest-rank percentile `p` (0 < p ≤ 100) of `xs`: the smallest sample
 * with at least p% of the samples at or below it. NaN for no samples.
 */
export function percentile(xs: readonly number[], p: number): number {
  if (!(p > 0 && p <= 100)) throw new RangeError(`percentile ${p} is not in (0, 100]`);
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.ceil((p / 100) * s.length) - 1]!;
}
