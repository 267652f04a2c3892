/** Raw HTTP/2 for tests that must send what a well-behaved client never would. */
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
// hpack.js has no types; the tests use its encoder and decoder directly.
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export const hpack = require('hpack.js') as any;

export const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');

/** One frame: 9-byte header (length, type, flags, stream id) and the payload. */
export function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream >>> 0, 5);
  return Buffer.concat([h, payload]);
}
