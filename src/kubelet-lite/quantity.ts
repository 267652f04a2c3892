/**
 * Kubernetes resource quantities ("100m", "1.5", "64Mi", "1G", "2e3") as
 * numbers. The grammar is the API machinery's: a signed decimal number and
 * one suffix, binary-SI (Ki..Ei), decimal-SI (n, u, m, "", k, M..E) or a
 * decimal exponent (e3, E-2).
 */
import { invalidArgument } from '../errors.js';

const QUANTITY = /^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$/;

const DECIMAL: Record<string, number> = { n: -9, u: -6, m: -3, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const BINARY: Record<string, number> = { Ki: 10, Mi: 20, Gi: 30, Ti: 40, Pi: 50, Ei: 60 };

/** The quantity's value scaled by 10^`shift`, or undefined if it is not a quantity. */
function scaled(q: unknown, shift: number): number | undefined {
  if (typeof q === 'number') return Number.isFinite(q) ? q * 10 ** shift : undefined;
  if (typeof q !== 'string' || q.length > 64) return undefined;
  const m = QUANTITY.exec(q.trim());
  if (!m) return undefined;
  const [, mantissa, suffix = ''] = m;
  let exp10 = shift;
  let exp2 = 0;
  if (suffix in BINARY) exp2 = BINARY[suffix]!;
  else if (suffix in DECIMAL) exp10 += DECIMAL[suffix]!;
  else if (suffix !== '') exp10 += Number(suffix.slice(1));
  // Letting Number() apply the decimal exponent keeps "0.3" * 1000 exactly 300.
  const v = Number(`${mantissa}e${exp10}`) * 2 ** exp2;
  return Number.isFinite(v) ? v : undefined;
}

/** The quantity as a number (cores for cpu, bytes for memory), or undefined if it does not parse. */
export function tryParseQuantity(q: unknown): number | undefined {
  return scaled(q, 0);
}

/** The quantity as a number; a string that is not a quantity is an InvalidArgument error. */
export function parseQuantity(q: string | number): number {
  const v = scaled(q, 0);
  if (v === undefined) throw invalidArgument(`quantity ${JSON.stringify(q)} must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'`);
  return v;
}

/** Thousandths of the quantity, rounded up as the API's MilliValue() does: "100m" → 100, "1.5" → 1500. */
export function parseMilliQuantity(q: string | number): number {
  const v = scaled(q, 3);
  if (v === undefined) throw invalidArgument(`quantity ${JSON.stringify(q)} is not a valid quantity`);
  return Math.ceil(v);
}
