/**
 * Nanosecond timestamps on the wire. Records keep them as JS numbers, which
 * hold integers exactly only up to 2^53 (about 104 days in nanoseconds): a
 * time like 1.7e18 ns comes out of `ms * 1e6` rounded to a multiple of 256,
 * and a client shows that noise (….123000064). Rounded to the microsecond and
 * widened with integer arithmetic, the value is exact; protobuf takes an
 * int64 as a decimal string.
 */

/** `ns` (a float that may carry rounding noise) as the exact integer, to the microsecond. */
export function wireNs(ns: number): string {
  if (!Number.isFinite(ns) || ns <= 0) return '0';
  return (BigInt(Math.round(ns / 1000)) * 1000n).toString();
}

/** Now, in exact nanoseconds (millisecond resolution), for the wire. */
export function nowWireNs(now: () => number = Date.now): string {
  return (BigInt(now()) * 1_000_000n).toString();
}
