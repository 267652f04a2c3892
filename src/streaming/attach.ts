/**
 * A connection to a container's own stdio through conmon's attach socket.
 * Each packet from conmon starts with one byte naming the pipe (2 stdout,
 * 3 stderr); what skiff sends goes to the container's stdin. The socket is
 * non-blocking and drained on a short timer, so no thread waits on it; the
 * timer stops while the reader is paused (backpressure) and when closed.
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { closeFd, connectSeqpacket, recvPacket, sendPacket, shutdownWrite } from '../sys/libc.js';

const STDOUT_PIPE = 2;
const STDERR_PIPE = 3;
const POLL_MS = 10;
/** Input held for conmon before the writer is told to wait. */
const OUTBOX_LIMIT = 256 * 1024;

export class AttachConnection extends EventEmitter {
  private readonly fd: number;
  private timer?: NodeJS.Timeout;
  private readonly buf = Buffer.alloc(64 * 1024);
  private readonly outbox: Buffer[] = [];
  private outboxBytes = 0;
  private closed = false;
  private paused = false;

  /** Connects to `<bundle>/attach`, through the bundle directory's fd so long paths work. */
  constructor(bundle: string) {
    super();
    const dirFd = fs.openSync(bundle, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    try {
      this.fd = connectSeqpacket(path.join(`/proc/self/fd/${dirFd}`, 'attach'));
    } finally {
      fs.closeSync(dirFd);
    }
    this.schedule();
  }

  get isClosed(): boolean {
    return this.closed;
  }

  private schedule(): void {
    if (this.closed || this.timer) return;
    this.timer = setInterval(() => this.pump(), POLL_MS);
  }

  /** Stops reading conmon's socket until resume(). */
  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
  }

  /** Queues `data` for the container's stdin; false when the writer should wait for 'drained'. */
  write(data: Buffer): boolean {
    if (this.closed) return true;
    this.outbox.push(data);
    this.outboxBytes += data.length;
    this.flush();
    return this.outboxBytes < OUTBOX_LIMIT;
  }

  /** The client closed its stdin. */
  endInput(): void {
    if (this.closed) return;
    if (this.outbox.length === 0) shutdownWrite(this.fd);
    else this.once('drained', () => !this.closed && shutdownWrite(this.fd));
  }

  private flush(): void {
    while (this.outbox.length) {
      const r = sendPacket(this.fd, this.outbox[0]!);
      if (r === 'eof') return this.close();
      if (!r) return;
      this.outboxBytes -= this.outbox.shift()!.length;
    }
    this.emit('drained');
  }

  private pump(): void {
    if (this.closed) return;
    this.flush();
    for (let i = 0; i < 64 && !this.paused && !this.closed; i++) {
      const r = recvPacket(this.fd, this.buf);
      if (r === 'again') return;
      if (r === 'eof') return this.close();
      const pipe = this.buf[0];
      const data = Buffer.from(this.buf.subarray(1, r));
      if (pipe === STDOUT_PIPE) this.emit('stdout', data);
      else if (pipe === STDERR_PIPE) this.emit('stderr', data);
    }
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    this.timer = undefined;
    closeFd(this.fd);
    this.emit('drained');
    this.emit('close');
  }
}
