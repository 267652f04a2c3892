/**
 * A connection to a container's own stdio through conmon's attach socket.
 * Each packet from conmon starts with one byte naming the pipe (2 stdout,
 * 3 stderr); what skiff sends goes to the container's stdin. The socket is
 * non-blocking and drained on a short timer, so no thread waits on it.
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import path from 'node:path';
import { closeFd, connectSeqpacket, recvPacket, sendPacket, shutdownWrite } from '../sys/libc.js';

const STDOUT_PIPE = 2;
const STDERR_PIPE = 3;
const POLL_MS = 10;

export class AttachConnection extends EventEmitter {
  private readonly fd: number;
  private readonly timer: NodeJS.Timeout;
  private readonly buf = Buffer.alloc(64 * 1024);
  private readonly outbox: Buffer[] = [];
  private closed = false;

  /** Connects to `<bundle>/attach`, through the bundle directory's fd so long paths work. */
  constructor(bundle: string) {
    super();
    const dirFd = fs.openSync(bundle, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY);
    try {
      this.fd = connectSeqpacket(path.join(`/proc/self/fd/${dirFd}`, 'attach'));
    } finally {
      fs.closeSync(dirFd);
    }
    this.timer = setInterval(() => this.pump(), POLL_MS);
  }

  write(data: Buffer): void {
    if (this.closed) return;
    this.outbox.push(data);
    this.flush();
  }

  /** The client closed its stdin. */
  endInput(): void {
    if (!this.closed && this.outbox.length === 0) shutdownWrite(this.fd);
    else this.once('drained', () => !this.closed && shutdownWrite(this.fd));
  }

  private flush(): void {
    while (this.outbox.length) {
      const r = sendPacket(this.fd, this.outbox[0]!);
      if (r === 'eof') return this.close();
      if (!r) return;
      this.outbox.shift();
    }
    this.emit('drained');
  }

  private pump(): void {
    if (this.closed) return;
    this.flush();
    for (let i = 0; i < 64; i++) {
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
    closeFd(this.fd);
    this.emit('close');
  }
}
