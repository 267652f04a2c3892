/**
 * SPDY/3.1 as Kubernetes' streaming clients speak it: a session of
 * bidirectional streams over one connection, with header blocks compressed by
 * zlib (one context per direction, primed with the SPDY/3 dictionary).
 *
 * Kubernetes' streams carry only their own headers (streamType, port,
 * requestID) and no :method or :path, which is why this is not an HTTP layer.
 *
 * Flow control: Kubernetes' Go library neither sends nor understands
 * WINDOW_UPDATE, so windows are honoured only for a peer that shows it uses
 * them (it sent a WINDOW_UPDATE), and only such a peer is sent any.
 *
 * Backpressure, whatever the peer does: data waits while the socket's write
 * buffer is above a mark, and the session stops reading the socket while
 * its replies (PING, RST_STREAM, ...) pile up unread, while frames wait to
 * be handled, or while a stream's input waits for its consumer. A client
 * that never reads therefore costs a bounded amount of memory.
 */
import { EventEmitter } from 'node:events';
import { Duplex } from 'node:stream';
import zlib from 'node:zlib';
import { SPDY3_DICTIONARY } from './spdy-dictionary.js';

export const SPDY_VERSION = 3;
export const FrameType = {
  SYN_STREAM: 1,
  SYN_REPLY: 2,
  RST_STREAM: 3,
  SETTINGS: 4,
  PING: 6,
  GOAWAY: 7,
  HEADERS: 8,
  WINDOW_UPDATE: 9,
} as const;
export const FLAG_FIN = 0x01;
export const FLAG_UNIDIRECTIONAL = 0x02;
export const RstStatus = { PROTOCOL_ERROR: 1, INVALID_STREAM: 2, REFUSED_STREAM: 3, CANCEL: 5, INTERNAL_ERROR: 6, STREAM_IN_USE: 8, STREAM_ALREADY_CLOSED: 9 } as const;
const SETTINGS_INITIAL_WINDOW_SIZE = 7;
const DEFAULT_WINDOW = 64 * 1024;
/** The largest frame payload accepted (24 bits would allow 16 MiB; Kubernetes' clients send 32 KiB at most). */
export const MAX_FRAME = 1 << 20;
const MAX_HEADER_BLOCK = 1 << 20;
const DATA_CHUNK = 32 * 1024;
/** Data frames wait while the socket holds more than this unsent. */
const SOCKET_HIGH_WATER = 256 * 1024;
/** Reading stops while the socket holds more than this unsent (a peer that sends but never reads). */
const SOCKET_READ_LIMIT = 1024 * 1024;
/** Reading stops while this much input waits to be handled. */
const UNHANDLED_INPUT_LIMIT = 256 * 1024;
/** Reading stops while one stream holds this much input its consumer has not taken. */
const STREAM_INPUT_LIMIT = 1024 * 1024;
/** Streams open at once in one session, unless the owner says otherwise. */
export const DEFAULT_MAX_STREAMS = 128;

/** Header names are lowercase; a value with several entries joins them with NUL. */
export type Headers = Record<string, string>;

export function encodeHeaderBlock(h: Headers): Buffer {
  const entries = Object.entries(h);
  const parts: Buffer[] = [u32(entries.length)];
  for (const [k, v] of entries) {
    const name = Buffer.from(k.toLowerCase(), 'utf8');
    const value = Buffer.from(v, 'utf8');
    parts.push(u32(name.length), name, u32(value.length), value);
  }
  return Buffer.concat(parts);
}

export function decodeHeaderBlock(b: Buffer): Headers {
  const out: Headers = {};
  if (b.length < 4) throw new Error('header block shorter than its count');
  const n = b.readUInt32BE(0);
  let off = 4;
  for (let i = 0; i < n; i++) {
    const name = readLenPrefixed(b, off);
    off = name.next;
    const value = readLenPrefixed(b, off);
    off = value.next;
    const key = name.data.toString('utf8');
    if (key === '' || key !== key.toLowerCase()) throw new Error(`invalid header name "${key}"`);
    out[key] = key in out ? `${out[key]}\0${value.data.toString('utf8')}` : value.data.toString('utf8');
  }
  return out;
}

function readLenPrefixed(b: Buffer, off: number): { data: Buffer; next: number } {
  if (off + 4 > b.length) throw new Error('header block truncated');
  const len = b.readUInt32BE(off);
  if (off + 4 + len > b.length) throw new Error('header block truncated');
  return { data: b.subarray(off + 4, off + 4 + len), next: off + 4 + len };
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
}

export function controlFrame(type: number, flags: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(8);
  h.writeUInt16BE(0x8000 | SPDY_VERSION, 0);
  h.writeUInt16BE(type, 2);
  h.writeUInt32BE((((flags & 0xff) << 24) | payload.length) >>> 0, 4);
  return Buffer.concat([h, payload]);
}

export function dataFrame(streamId: number, flags: number, data: Buffer): Buffer {
  const h = Buffer.alloc(8);
  h.writeUInt32BE(streamId & 0x7fffffff, 0);
  h.writeUInt32BE((((flags & 0xff) << 24) | data.length) >>> 0, 4);
  return Buffer.concat([h, data]);
}

/** One direction's zlib context: every header block is a sync-flushed piece of one stream. */
class HeaderCodec {
  private readonly z: zlib.Inflate | zlib.Deflate;
  private chain: Promise<unknown> = Promise.resolve();

  constructor(kind: 'inflate' | 'deflate') {
    // Every session holds two contexts for its whole life, so they are kept small. The peer's
    // compressor decides the inflate window (up to 32 KiB). Ours compresses a few short
    // replies: a 2 KiB window and the smallest hash table cost about 10 KiB instead of about
    // 256 KiB, and any inflater with the dictionary reads them. Header blocks are short, so
    // small output chunks (Node's default is 16 KiB per context) cost nothing.
    this.z =
      kind === 'inflate'
        ? zlib.createInflate({ dictionary: SPDY3_DICTIONARY, chunkSize: 1024 })
        : zlib.createDeflate({ dictionary: SPDY3_DICTIONARY, windowBits: 11, memLevel: 1, chunkSize: 1024 });
    this.z.on('error', () => undefined);
  }

  /** Runs `data` through the context; calls are serialized, as the zlib stream requires. */
  process(data: Buffer, limit = MAX_HEADER_BLOCK): Promise<Buffer> {
    const run = () =>
      new Promise<Buffer>((resolve, reject) => {
        const out: Buffer[] = [];
        let size = 0;
        const onData = (d: Buffer) => {
          size += d.length;
          if (size > limit) fail(new Error('header block too large'));
          else out.push(d);
        };
        const onError = (e: Error) => fail(e);
        const cleanup = () => {
          this.z.off('data', onData);
          this.z.off('error', onError);
        };
        const fail = (e: Error) => {
          cleanup();
          reject(e);
        };
        this.z.on('data', onData);
        this.z.once('error', onError);
        this.z.write(data);
        this.z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
          cleanup();
          resolve(Buffer.concat(out));
        });
      });
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }

  close(): void {
    this.z.destroy();
  }
}

export class SpdyStream extends Duplex {
  replied = false;
  private localFin = false;
  private remoteFin = false;
  private gone = false;
  /** How much the peer lets us send, when it uses flow control. */
  sendWindow: number;
  private waiting?: () => void;

  constructor(
    readonly session: SpdySession,
    readonly id: number,
    readonly headers: Headers,
    initialWindow: number,
  ) {
    super({ allowHalfOpen: true, highWaterMark: 64 * 1024 });
    this.sendWindow = initialWindow;
    // A stream's failures (the peer reset it, the session ended) end its
    // session's work through 'spdy-closed'; they never escape as unhandled.
    this.on('error', () => undefined);
  }

  /** True once the stream is reset or its session is gone. */
  get isGone(): boolean {
    return this.gone;
  }

  /** Answers the peer's SYN_STREAM. Never rejects: a failure ends the session. */
  reply(headers: Headers = {}, fin = false): Promise<void> {
    this.replied = true;
    if (fin) this.localFin = true;
    return this.session.sendHeaders(FrameType.SYN_REPLY, this.id, headers, fin ? FLAG_FIN : 0);
  }

  reset(status: number = RstStatus.CANCEL): void {
    if (this.gone) return;
    this.session.sendRst(this.id, status);
    this.onReset();
  }

  override _read(): void {
    this.session.inputTaken();
  }

  override _write(chunk: Buffer, _enc: BufferEncoding, cb: (err?: Error | null) => void): void {
    this.sendData(chunk).then(() => cb(), cb);
  }

  override _final(cb: (err?: Error | null) => void): void {
    if (this.gone) return cb();
    this.localFin = true;
    this.session.writeRaw(dataFrame(this.id, FLAG_FIN, Buffer.alloc(0)));
    if (this.remoteFin) this.finish();
    cb();
  }

  override _destroy(err: Error | null, cb: (err?: Error | null) => void): void {
    this.wakeWriter();
    cb(err);
  }

  private async sendData(chunk: Buffer): Promise<void> {
    let off = 0;
    while (off < chunk.length) {
      if (this.gone || this.localFin) throw new Error(`SPDY stream ${this.id} is closed`);
      await this.session.writable();
      let n = Math.min(DATA_CHUNK, chunk.length - off);
      if (this.session.peerFlowControl) {
        if (this.sendWindow <= 0) {
          await new Promise<void>((r) => (this.waiting = r));
          continue;
        }
        n = Math.min(n, this.sendWindow);
        this.sendWindow -= n;
      }
      if (this.gone) throw new Error(`SPDY stream ${this.id} is closed`);
      this.session.writeRaw(dataFrame(this.id, 0, chunk.subarray(off, off + n)));
      off += n;
    }
  }

  private wakeWriter(): void {
    const w = this.waiting;
    this.waiting = undefined;
    w?.();
  }

  /** @internal */
  onWindowUpdate(delta: number): void {
    this.sendWindow = Math.min(this.sendWindow + delta, 0x7fffffff);
    this.wakeWriter();
  }

  /** @internal */
  onData(data: Buffer, fin: boolean): void {
    if (this.remoteFin) {
      this.session.sendRst(this.id, RstStatus.STREAM_ALREADY_CLOSED);
      return;
    }
    if (data.length) {
      this.push(data);
      if (this.session.peerFlowControl) this.session.sendWindowUpdate(this.id, data.length);
      if (this.readableLength > STREAM_INPUT_LIMIT) this.session.inputWaiting();
    }
    if (fin) {
      this.remoteFin = true;
      this.push(null);
      if (this.localFin) this.finish();
    }
  }

  /** @internal */
  onReset(): void {
    if (this.gone) return;
    this.remoteFin = true;
    this.localFin = true;
    this.push(null);
    this.finish();
    this.wakeWriter();
    this.emit('reset');
  }

  private finish(): void {
    if (this.gone) return;
    this.gone = true;
    this.session.forget(this.id);
    this.emit('spdy-closed');
  }
}

export interface SessionEvents {
  stream: (s: SpdyStream) => void;
  error: (e: Error) => void;
  close: () => void;
}

export interface SessionOptions {
  /** Streams open at once; more are refused with RST_STREAM (REFUSED_STREAM). */
  maxStreams?: number;
}

/**
 * The server side of a SPDY/3.1 session on an upgraded connection: accepts
 * the client's streams (odd ids), answers PINGs, honours GOAWAY. The end of
 * the client's side of the connection (FIN, reset, error) ends the session.
 */
export class SpdySession extends EventEmitter {
  private buf: Buffer = Buffer.alloc(0);
  /** Bytes read after `buf`, not yet joined to it. */
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private readonly streams = new Map<number, SpdyStream>();
  private readonly inflate = new HeaderCodec('inflate');
  private readonly deflate = new HeaderCodec('deflate');
  /** Frames waiting to go out in one write: many small replies cost one socket write, not one each. */
  private outbox: Buffer[] = [];
  private outboxBytes = 0;
  private flushScheduled = false;
  private handling = false;
  private initialWindow = DEFAULT_WINDOW;
  private lastStreamId = 0;
  private closed = false;
  private readonly pauses = new Set<'output' | 'queue' | 'input'>();
  private drainWaiters: Array<() => void> = [];
  private readonly maxStreams: number;
  peerFlowControl = false;

  constructor(
    private readonly socket: Duplex,
    opts: SessionOptions = {},
  ) {
    super();
    this.maxStreams = opts.maxStreams ?? DEFAULT_MAX_STREAMS;
    socket.on('data', (d: Buffer) => this.onBytes(d));
    socket.on('drain', () => this.onDrain());
    socket.on('end', () => this.clientEnded());
    socket.on('close', () => this.shutdown());
    socket.on('error', () => this.shutdown());
  }

  get streamCount(): number {
    return this.streams.size;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** The client closed its side: nobody will read what the session would still send. */
  private clientEnded(): void {
    this.shutdown();
    if (!this.socket.destroyed) this.socket.destroy();
  }

  private setPaused(reason: 'output' | 'queue' | 'input', on: boolean): void {
    if (on) this.pauses.add(reason);
    else this.pauses.delete(reason);
    if (this.closed) return;
    if (this.pauses.size) this.socket.pause();
    else this.socket.resume();
  }

  private onDrain(): void {
    this.setPaused('output', false);
    for (const w of this.drainWaiters.splice(0)) w();
  }

  /** Resolves when the socket can take more data; rejects once the session is gone. */
  writable(): Promise<void> {
    if (this.closed || this.socket.destroyed) return Promise.reject(new Error('SPDY session closed'));
    if (this.unsent < SOCKET_HIGH_WATER) return Promise.resolve();
    return new Promise<void>((resolve, reject) => this.drainWaiters.push(() => (this.closed ? reject(new Error('SPDY session closed')) : resolve())));
  }

  /** @internal: a stream holds too much unread input. */
  inputWaiting(): void {
    this.setPaused('input', true);
  }

  /** @internal: a stream's consumer wants more. */
  inputTaken(): void {
    // Resumed at once: a stream still full pauses reading again with its next frame.
    // (A Readable calls _read before it takes the chunk being read out of its buffer,
    // so checking the buffers here could wait for ever.)
    if (this.pauses.has('input')) this.setPaused('input', false);
  }

  private onBytes(d: Buffer): void {
    if (this.closed) return;
    // Chunks wait in a list until a whole frame is in: each byte is copied once, not once per chunk.
    this.pending.push(d);
    this.pendingBytes += d.length;
    if (this.buffered > UNHANDLED_INPUT_LIMIT) this.setPaused('queue', true);
    void this.handleFrames();
  }

  private get buffered(): number {
    return this.buf.length + this.pendingBytes;
  }

  /** Makes the first `n` buffered bytes contiguous in `buf`; false while fewer have come. */
  private gather(n: number): boolean {
    if (this.buf.length >= n) return true;
    if (this.buffered < n) return false;
    this.buf = Buffer.concat([this.buf, ...this.pending]);
    this.pending = [];
    this.pendingBytes = 0;
    return true;
  }

  /** Frames are handled one after another: header blocks share one zlib context. */
  private async handleFrames(): Promise<void> {
    if (this.handling) return;
    this.handling = true;
    try {
      while (!this.closed && this.gather(8)) {
        const len = this.buf.readUInt32BE(4) & 0xffffff;
        if (len > MAX_FRAME) return this.protocolError('frame too large');
        if (!this.gather(8 + len)) break;
        const f = this.buf.subarray(0, 8 + len);
        this.buf = this.buf.subarray(8 + len);
        try {
          await this.handle(f);
        } catch (e) {
          this.protocolError((e as Error).message);
        }
      }
      if (this.closed) return;
      // What is left is less than a frame: keep a copy, not a view into a large chunk.
      if (this.buf.length && this.buf.byteOffset) this.buf = Buffer.from(this.buf);
      // Reading goes on while less than a whole frame is buffered, however large
      // (up to MAX_FRAME): stopping then would wait for ever for the frame's end.
      const frameEnd = this.gather(8) ? 8 + (this.buf.readUInt32BE(4) & 0xffffff) : 8;
      if (this.buffered <= UNHANDLED_INPUT_LIMIT || this.buffered < frameEnd) this.setPaused('queue', false);
    } finally {
      this.handling = false;
    }
  }

  private async handle(f: Buffer): Promise<void> {
    if (this.closed) return;
    const flags = f[4]!;
    const payload = f.subarray(8);
    if (!(f[0]! & 0x80)) {
      const id = f.readUInt32BE(0) & 0x7fffffff;
      const s = this.streams.get(id);
      if (!s) return this.sendRst(id, RstStatus.INVALID_STREAM);
      s.onData(payload, (flags & FLAG_FIN) !== 0);
      return;
    }
    const version = f.readUInt16BE(0) & 0x7fff;
    if (version !== SPDY_VERSION) return this.protocolError(`unsupported SPDY version ${version}`);
    const type = f.readUInt16BE(2);
    switch (type) {
      case FrameType.SYN_STREAM: {
        if (payload.length < 10) return this.protocolError('short SYN_STREAM');
        const id = payload.readUInt32BE(0) & 0x7fffffff;
        // Inflated even for a stream about to be refused: the zlib context is the session's.
        const block = await this.inflate.process(payload.subarray(10));
        const headers = decodeHeaderBlock(block);
        if (this.closed) return;
        if (id === 0 || id % 2 === 0 || id <= this.lastStreamId) return this.protocolError(`bad stream id ${id}`);
        this.lastStreamId = id;
        if (this.streams.size >= this.maxStreams) return this.sendRst(id, RstStatus.REFUSED_STREAM);
        const s = new SpdyStream(this, id, headers, this.initialWindow);
        this.streams.set(id, s);
        this.emit('stream', s);
        if (flags & FLAG_FIN) s.onData(Buffer.alloc(0), true);
        return;
      }
      case FrameType.SYN_REPLY:
      case FrameType.HEADERS: {
        if (payload.length < 4) return this.protocolError('short HEADERS');
        const id = payload.readUInt32BE(0) & 0x7fffffff;
        const headers = decodeHeaderBlock(await this.inflate.process(payload.subarray(4)));
        const s = this.streams.get(id);
        if (!s || this.closed) return;
        s.emit('headers', headers);
        if (flags & FLAG_FIN) s.onData(Buffer.alloc(0), true);
        return;
      }
      case FrameType.RST_STREAM: {
        if (payload.length < 8) return this.protocolError('short RST_STREAM');
        this.streams.get(payload.readUInt32BE(0) & 0x7fffffff)?.onReset();
        return;
      }
      case FrameType.SETTINGS: {
        if (payload.length < 4) return this.protocolError('short SETTINGS');
        const n = payload.readUInt32BE(0);
        if (payload.length < 4 + n * 8) return this.protocolError('short SETTINGS');
        for (let i = 0; i < n; i++) {
          const id = payload.readUInt32BE(4 + i * 8) & 0xffffff;
          const value = payload.readUInt32BE(8 + i * 8);
          if (id === SETTINGS_INITIAL_WINDOW_SIZE) this.initialWindow = Math.min(value, 0x7fffffff);
        }
        return;
      }
      case FrameType.PING: {
        if (payload.length < 4) return this.protocolError('short PING');
        // The client's pings have odd ids; answer them with the same id.
        if (payload.readUInt32BE(0) % 2 === 1) this.writeRaw(controlFrame(FrameType.PING, 0, payload.subarray(0, 4)));
        return;
      }
      case FrameType.GOAWAY:
        this.emit('goaway');
        return;
      case FrameType.WINDOW_UPDATE: {
        if (payload.length < 8) return this.protocolError('short WINDOW_UPDATE');
        this.peerFlowControl = true;
        const id = payload.readUInt32BE(0) & 0x7fffffff;
        const delta = payload.readUInt32BE(4) & 0x7fffffff;
        if (id === 0) return;
        this.streams.get(id)?.onWindowUpdate(delta);
        return;
      }
      default:
        // Unknown control frames are ignored, as the protocol asks.
        return;
    }
  }

  /** @internal */
  async sendHeaders(type: number, id: number, headers: Headers, flags: number): Promise<void> {
    try {
      const block = await this.deflate.process(encodeHeaderBlock(headers), Number.MAX_SAFE_INTEGER);
      this.writeRaw(controlFrame(type, flags, Buffer.concat([u32(id & 0x7fffffff), block])));
    } catch (e) {
      this.protocolError(`cannot send headers: ${(e as Error).message}`);
    }
  }

  /** @internal */
  sendRst(id: number, status: number): void {
    this.writeRaw(controlFrame(FrameType.RST_STREAM, 0, Buffer.concat([u32(id), u32(status)])));
  }

  /** @internal */
  sendWindowUpdate(id: number, delta: number): void {
    this.writeRaw(controlFrame(FrameType.WINDOW_UPDATE, 0, Buffer.concat([u32(id), u32(delta)])));
  }

  /** @internal: every frame goes out here; a peer that leaves them unread stops being read. */
  writeRaw(b: Buffer): void {
    if (this.closed || this.socket.destroyed || this.socket.writableEnded) return;
    this.outbox.push(b);
    this.outboxBytes += b.length;
    if (this.outboxBytes >= DATA_CHUNK) this.flush();
    else if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => this.flush());
    }
    if (this.unsent > SOCKET_READ_LIMIT) this.setPaused('output', true);
  }

  /** Bytes queued but not yet on the wire: ours and the socket's. */
  private get unsent(): number {
    return this.outboxBytes + this.socket.writableLength;
  }

  private flush(): void {
    this.flushScheduled = false;
    if (!this.outbox.length) return;
    const out = this.outbox.length === 1 ? this.outbox[0]! : Buffer.concat(this.outbox);
    this.outbox = [];
    this.outboxBytes = 0;
    if (this.socket.destroyed || this.socket.writableEnded) return;
    this.socket.write(out);
  }

  /** @internal */
  forget(id: number): void {
    this.streams.delete(id);
  }

  /** Ends the session politely: GOAWAY, then close. */
  close(): void {
    if (this.closed) return;
    this.writeRaw(controlFrame(FrameType.GOAWAY, 0, Buffer.concat([u32(this.lastStreamId), u32(0)])));
    this.flush();
    this.socket.end();
    this.shutdown();
    this.destroySoon();
  }

  /** Cuts the connection at once. */
  destroy(): void {
    this.shutdown();
    this.socket.destroy();
  }

  private protocolError(msg: string): void {
    if (this.closed) return;
    this.emit('protocol-error', new Error(`SPDY protocol error: ${msg}`));
    this.writeRaw(controlFrame(FrameType.GOAWAY, 0, Buffer.concat([u32(this.lastStreamId), u32(RstStatus.PROTOCOL_ERROR)])));
    this.flush();
    this.socket.end();
    this.shutdown();
    this.destroySoon();
  }

  /** A peer that neither reads our last frames nor closes its side is cut off. */
  private destroySoon(): void {
    setTimeout(() => this.socket.destroy(), 2000).unref();
  }

  private shutdown(): void {
    if (this.closed) return;
    this.closed = true;
    this.buf = Buffer.alloc(0);
    this.pending = [];
    this.pendingBytes = 0;
    this.outbox = [];
    this.outboxBytes = 0;
    for (const s of [...this.streams.values()]) s.onReset();
    this.streams.clear();
    for (const w of this.drainWaiters.splice(0)) w();
    this.inflate.close();
    this.deflate.close();
    // Keep reading (and discarding) so the peer's close is seen.
    this.socket.resume();
    this.emit('close');
  }
}
