/** JSON from registries and archives, parsed only when its size in values is bounded. */
import { SkiffError } from '../errors.js';

/**
 * The most JSON values (objects, arrays, strings, numbers...) skiff parses in
 * one manifest, index or image config. Parsed, each costs tens of bytes of
 * heap: the 8 MiB a config may weigh, written as "{},{},...", would be close
 * to three million objects (over 100 MiB). Real ones hold a few thousand.
 */
export const MAX_JSON_VALUES = 100_000;

/**
 * An upper bound on the JSON values in `buf`, counted without parsing it:
 * one plus every comma and every opening bracket outside strings (at most
 * twice the real count).
 */
export function countJsonValues(buf: Buffer): number {
  let n = 1;
  let inString = false;
  for (let i = 0; i < buf.length; i++) {
    const b = buf[i]!;
    if (inString) {
      if (b === 0x5c) i++; // a backslash escapes the next byte
      else if (b === 0x22) inString = false;
    } else if (b === 0x22) inString = true;
    else if (b === 0x2c || b === 0x5b || b === 0x7b) n++;
  }
  return n;
}

export function parseJson<T>(buf: Buffer, what: string): T {
  const values = countJsonValues(buf);
  if (values > MAX_JSON_VALUES) throw new SkiffError('InvalidArgument', `${what} holds about ${values} JSON values, more than the ${MAX_JSON_VALUES} skiff accepts`);
  try {
    return JSON.parse(buf.toString('utf8')) as T;
  } catch {
    throw new SkiffError('InvalidArgument', `${what} is not valid JSON`);
  }
}
