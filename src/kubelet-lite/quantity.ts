/**
 * Kubernetes resource quantities ("100m", "1.5", "64Mi", "1G", "2e3"). The
 * grammar is the API machinery's: a signed decimal number and one suffix,
 * binary-SI (Ki..Ei), decimal-SI (n, u, m, "", k, M..E) or a decimal
 * exponent (e3, E-2). Parsed exactly, as a fraction (quantities are fixed
 * point: nothing is rounded on the way in), then read as the caller needs.
 */
import { invalidArgument } from '../errors.js';

/** An exact quantity. */
export interface Fraction {
  num: bigint;
  den: bigint;
}

const QUANTITY = /^([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$/;
const DECIMAL: Record<string, number> = { n: -9, u: -6, m: -3, '': 0, k: 3, M: 6, G: 9, T: 12, P: 15, E: 18 };
const BINARY: Record<string, bigint> = { Ki: 1n << 10n, Mi: 1n << 20n, Gi: 1n << 30n, Ti: 1n << 40n, Pi: 1n << 50n, Ei: 1n << 60n };
/** No quantity the API accepts needs more (its values fit in 63 bits); a larger exponent would only cost CPU. */
const MAX_EXPONENT = 30;
const MAX_LENGTH = 64;

/** The exact quantity, or undefined when `q` is not one (or is absurdly large or long). */
export function tryParseExact(q: unknown): Fraction | undefined {
  if (typeof q === 'number') {
    if (!Number.isFinite(q) || Math.abs(q) > 1e30) return undefined;
    q = String(q);
  }
  if (typeof q !== 'string' || q.length > MAX_LENGTH) return undefined;
  const m = QUANTITY.exec(q.trim());
  if (!m) return undefined;
  const [, sign, digits, suffix = ''] = m;
  const [int, frac = ''] = digits!.split('.');
  let num = BigInt((int || '0') + frac) * (sign === '-' ? -1n : 1n);
  let den = 10n ** BigInt(frac.length);
  let exp = 0;
  if (suffix in BINARY) num *= BINARY[suffix]!;
  else if (suffix in DECIMAL) exp = DECIMAL[suffix]!;
  else exp = Number(suffix.slice(1));
  if (Math.abs(exp) > MAX_EXPONENT) return undefined;
  if (exp >= 0) num *= 10n ** BigInt(exp);
  else den *= 10n ** BigInt(-exp);
  return { num, den };
}

const GRAMMAR = `must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'`;

/** The exact quantity; anything else is an InvalidArgument error. */
export function parseExact(q: string | number): Fraction {
  const f = tryParseExact(q);
  if (!f) throw invalidArgument(`quantity ${JSON.stringify(q)} ${GRAMMAR}`);
  return f;
}

export function ceilDiv(a: bigint, b: bigint): bigint {
  const d = a / b;
  return a % b !== 0n && a > 0n === b > 0n ? d + 1n : d;
}

/** The quantity as a number (cores for cpu, bytes for memory), or undefined if it does not parse. */
export function tryParseQuantity(q: unknown): number | undefined {
  const f = tryParseExact(q);
  return f && Number(f.num) / Number(f.den);
}

/** The quantity as a number; a string that is not a quantity is an InvalidArgument error. */
export function parseQuantity(q: string | number): number {
  const f = parseExact(q);
  return Number(f.num) / Number(f.den);
}

/** The quantity in whole units, rounded up as Quantity.Value() does. */
export function quantityValue(q: string | number): number {
  const f = parseExact(q);
  return Number(ceilDiv(f.num, f.den));
}

/** Thousandths of the quantity, rounded up as the API's MilliValue() does: "100m" → 100, "1.5" → 1500. */
export function parseMilliQuantity(q: string | number): number {
  const f = parseExact(q);
  return Number(ceilDiv(f.num * 1000n, f.den));
}
