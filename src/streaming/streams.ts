/**
 * One set of streams per session, whatever the transport. SPDY and WebSocket
 * are each turned into these first (stdin, stdout, stderr, resize, and a way
 * to report the outcome; or a data/error pair per forwarded port); exec,
 * attach and port-forward then run once against them. Backpressure lives in
 * the streams themselves: an output's write() returns false while the client
 * has not read what it was sent, and the operations pipe with pause/resume.
 */
import { Duplex, type Readable, type Writable } from 'node:stream';
import type { WebSocket } from 'ws';

export type Outcome =
  | { kind: 'exit'; code: number | null; signal: string | null }
  | { kind: 'failure'; message: string }
  | { kind: 'ended' };

export interface SessionStreams {
  stdin?: Readable;
  stdout?: Writable;
  stderr?: Writable;
  resize?: Readable;
  /** Aborted when the client goes away or the session ends for any reason. */
  signal: AbortSignal;
  /** Reports the outcome once the outputs are flushed, then ends the session. Idempotent. */
  finish(outcome: Outcome): void;
}

/** Resolves when `w` has flushed everything (or failed, or `signal` aborted). */
export function flushed(w: Writable | undefined, signal: AbortSignal): Promise<void> {
  if (!w || w.writableFinished || w.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      w.off('finish', done);
      w.off('close', done);
      w.off('error', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    w.once('finish', done);
    w.once('close', done);
    w.once('error', done);
    signal.addEventListener('abort', done, { once: true });
    if (!w.writableEnded) w.end();
  });
}

/** Copies `src` into `dst` with backpressure, leaving `dst` open; resolves when `src` has ended. */
export function copy(src: Readable, dst: Writable | undefined): Promise<void> {
  src.on('error', () => undefined);
  return new Promise((resolve) => {
    if (src.readableEnded || src.destroyed) return resolve();
    src.once('end', () => resolve());
    src.once('close', () => resolve());
    if (dst) src.pipe(dst, { end: false });
    else src.resume();
  });
}

/** Bytes the WebSocket may hold unsent before a channel's writer waits. */
const WS_HIGH_WATER = 256 * 1024;
/** Bytes unsent (pongs, frames) above which the connection stops being read. */
const WS_READ_LIMIT = 1024 * 1024;

/**
 * Kubernetes' channel framing over one WebSocket: a first byte naming the
 * channel, or, for the base64 protocols, a text frame of the channel digit
 * and base64. Each channel is a Duplex: writes wait while the socket holds
 * more than a high-water mark unsent; input waits (the connection stops
 * being read) while a channel's reader is behind.
 */
export class WsChannels {
  private readonly channels = new Map<number, WsChannel>();
  private readonly base64: boolean;
  private paused = new Set<'output' | 'input'>();
  private drainWaiters: Array<() => void> = [];
  private closed = false;

  constructor(
    readonly ws: WebSocket,
    private readonly socket: Duplex,
    /** Channels the client may send on; input for any other channel is dropped. */
    private readonly inputs: Set<number>,
  ) {
    this.base64 = ws.protocol.includes('base64');
    ws.on('message', (msg: Buffer, isBinary: boolean) => this.onMessage(msg, isBinary));
    ws.on('ping', () => this.checkOutput());
    ws.on('close', () => this.shutdown());
    socket.on('drain', () => {
      this.setPaused('output', false);
      for (const w of this.drainWaiters.splice(0)) w();
    });
  }

  channel(n: number): WsChannel {
    let c = this.channels.get(n);
    if (!c) {
      c = new WsChannel(this, n);
      this.channels.set(n, c);
    }
    return c;
  }

  /** Sends one frame now, whatever the backpressure (for the few small frames a protocol requires). */
  sendNow(channel: number, data: Buffer, cb?: (err?: Error) => void): void {
    if (this.closed || this.ws.readyState !== this.ws.OPEN) {
      cb?.(new Error('WebSocket closed'));
      return;
    }
    if (this.base64) this.ws.send(`${channel}${data.toString('base64')}`, cb);
    else this.ws.send(Buffer.concat([Buffer.from([channel]), data]), cb);
    this.checkOutput();
  }

  /** @internal: resolves when the socket can take more; rejects once closed. */
  writable(): Promise<void> {
    if (this.closed) return Promise.reject(new Error('WebSocket closed'));
    if (this.ws.bufferedAmount < WS_HIGH_WATER) return Promise.resolve();
    return new Promise((resolve, reject) => this.drainWaiters.push(() => (this.closed ? reject(new Error('WebSocket closed')) : resolve())));
  }

  private checkOutput(): void {
    if (this.ws.bufferedAmount > WS_READ_LIMIT) this.setPaused('output', true);
  }

  private setPaused(reason: 'output' | 'input', on: boolean): void {
    if (on) this.paused.add(reason);
    else this.paused.delete(reason);
    if (this.closed) return;
    if (this.paused.size) this.ws.pause();
    else this.ws.resume();
  }

  /**
   * @internal A channel's reader wants more. Reading resumes at once: a
   * channel still full pauses it again with its next input. (Checking the
   * channels' buffers here would deadlock: a Readable calls _read before it
   * takes the chunk it is reading out of its buffer.)
   */
  inputTaken(): void {
    if (this.paused.has('input')) this.setPaused('input', false);
  }

  private onMessage(msg: Buffer, isBinary: boolean): void {
    let channel: number;
    let payload: Buffer;
    if (!isBinary && this.base64) {
      const text = msg.toString();
      channel = Number(text[0]);
      payload = Buffer.from(text.slice(1), 'base64');
    } else {
      if (msg.length === 0) return;
      channel = msg[0]!;
      payload = msg.subarray(1);
    }
    // v5: channel 255 closes the input channel named by the payload's first byte.
    if (channel === 255) {
      const which = payload[0];
      if (which !== undefined && this.inputs.has(which)) this.channel(which).endInput();
      return;
    }
    if (!this.inputs.has(channel) || !payload.length) return;
    if (!this.channel(channel).pushInput(payload)) this.setPaused('input', true);
  }

  /** Closes the WebSocket once what was sent has gone out. */
  close(code = 1000): void {
    if (this.closed) return;
    if (this.ws.readyState === this.ws.OPEN) this.ws.close(code);
    else this.ws.terminate();
  }

  private shutdown(): void {
    if (this.closed) return;
    this.closed = true;
    for (const w of this.drainWaiters.splice(0)) w();
    for (const c of this.channels.values()) c.endInput();
  }
}

export class WsChannel extends Duplex {
  private inputEnded = false;

  constructor(
    private readonly owner: WsChannels,
    readonly channel: number,
  ) {
    super({ allowHalfOpen: true, highWaterMark: 64 * 1024 });
    this.on('error', () => undefined);
  }

  /** @internal */
  pushInput(data: Buffer): boolean {
    if (this.inputEnded) return true;
    return this.push(data);
  }

  /** @internal */
  endInput(): void {
    if (this.inputEnded) return;
    this.inputEnded = true;
    this.push(null);
  }

  override _read(): void {
    this.owner.inputTaken();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    if (!chunk.length) return cb();
    this.owner.writable().then(
      () => {
        this.owner.sendNow(this.channel, chunk, (err) => err && this.destroy(err));
        cb();
      },
      (err: Error) => cb(err),
    );
  }
}
