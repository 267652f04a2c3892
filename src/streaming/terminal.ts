/**
 * A terminal's master side on the event loop. Reads go through a tty handle
 * (epoll, readStop when the reader is full); writes are single non-blocking
 * write(2) calls retried on a short timer when the terminal is full, so a
 * process that stops reading its input never blocks the daemon and no
 * thread-pool worker ever waits on the terminal.
 */
import tty from 'node:tty';
import { Writable } from 'node:stream';
import { setNonBlocking, setWindowSize, writeNonBlocking, closeFd } from '../sys/libc.js';

const RETRY_MS = 10;

export class Terminal {
  /** What the program on the terminal writes; ends when its last user is gone. */
  readonly output: tty.ReadStream;
  /** What the program reads; a full terminal holds writes back (backpressure). */
  readonly input: Writable;
  private closed = false;

  constructor(private readonly fd: number) {
    try {
      setNonBlocking(fd);
      this.output = new tty.ReadStream(fd);
    } catch (err) {
      closeFd(fd);
      throw err;
    }
    // EIO once the other side is closed is the end of the output, not a failure.
    this.output.on('error', () => this.output.destroy());
    this.input = new Writable({
      highWaterMark: 16 * 1024,
      write: (chunk: Buffer, _enc, cb) => this.writeAll(chunk, cb),
    });
    this.input.on('error', () => undefined);
  }

  private writeAll(chunk: Buffer, cb: (err?: Error | null) => void): void {
    let off = 0;
    const step = () => {
      // The descriptor is the tty handle's: once closed its number may belong to someone else.
      if (this.closed) return cb();
      while (off < chunk.length) {
        const r = writeNonBlocking(this.fd, chunk.subarray(off));
        if (r === 'again') {
          setTimeout(step, RETRY_MS).unref();
          return;
        }
        if (r === 'eof') return cb();
        off += r;
      }
      cb();
    };
    step();
  }

  resize(cols: number, rows: number): void {
    if (!this.closed) setWindowSize(this.fd, cols, rows);
  }

  /** Closes the master side (the tty handle owns the descriptor and closes it). */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.input.destroy();
    this.output.destroy();
  }
}
