/**
 * Writing a stream to a client that may stop reading: each chunk waits for
 * the client to drain what it has, and a client that reads nothing for
 * `stallMs` is cut off, so it can hold neither memory nor the stream.
 */
import type { Writable } from 'node:stream';

export function writeOrDrop(out: Writable, chunk: Buffer | string, stallMs: number, onStall: () => void): Promise<void> {
  if (out.destroyed) return Promise.resolve();
  if (out.write(chunk)) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const timer = setTimeout(() => {
      onStall();
      out.destroy();
    }, stallMs);
    timer.unref();
    const done = () => {
      clearTimeout(timer);
      out.off('drain', done);
      out.off('close', done);
      resolve();
    };
    out.on('drain', done);
    out.on('close', done);
  });
}
