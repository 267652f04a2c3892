/**
 * Go's gRPC clients dialing a Unix socket (crictl, the kubelet) send the
 * socket path as HTTP/2 `:authority`. Node's HTTP/2 layer treats that as a
 * malformed header and resets the stream before any handler sees it. skiff
 * therefore reads the public socket itself, rewrites such an `:authority` to
 * `localhost` in the client's header blocks, and hands every byte else
 * unchanged to the HTTP/2 server in the same process.
 */
import net from 'node:net';
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import type { Logger } from '../log.js';
import { socketPair } from '../sys/libc.js';
import { BoundedHpackDecoder, DEFAULT_MAX_HEADER_LIST, HpackError, type Header } from './hpack-decoder.js';

interface HpackHeader {
  name: string;
  value: string;
}

/** An HPACK integer with an `n`-bit prefix, the prefix's other bits set to `high`. */
function hpackInt(out: number[], v: number, n: number, high: number): void {
  const max = (1 << n) - 1;
  if (v < max) {
    out.push(high | v);
    return;
  }
  out.push(high | max);
  v -= max;
  while (v >= 128) {
    out.push((v % 128) + 128);
    v = Math.floor(v / 128);
  }
  out.push(v);
}

/**
 * A header block of literals that are never indexed, with new names and
 * plain (not Huffman) strings: the server's dynamic table is never touched,
 * so nothing about it needs to be known or kept.
 */
export function encodeLiterals(headers: readonly HpackHeader[]): Buffer {
  const parts: Buffer[] = [];
  for (const h of headers) {
    const name = Buffer.from(h.name, 'latin1');
    const value = Buffer.from(h.value, 'latin1');
    const head: number[] = [0x10];
    hpackInt(head, name.length, 7, 0);
    parts.push(Buffer.from(head), name);
    const vhead: number[] = [];
    hpackInt(vhead, value.length, 7, 0);
    parts.push(Buffer.from(vhead), value);
  }
  return Buffer.concat(parts);
}

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const EMPTY = Buffer.alloc(0);
const FRAME_HEADERS = 0x1;
const FRAME_SETTINGS = 0x4;
const FRAME_GOAWAY = 0x7;
const FRAME_CONTINUATION = 0x9;
const FLAG_END_STREAM = 0x1;
const FLAG_ACK = 0x1;
const FLAG_END_HEADERS = 0x4;
const FLAG_PADDED = 0x8;
const FLAG_PRIORITY = 0x20;
const SETTINGS_HEADER_TABLE_SIZE = 0x1;
const SETTINGS_MAX_FRAME_SIZE = 0x5;
/** Every peer accepts frames this large (the protocol's minimum max frame size). */
const MAX_FRAME = 16384;

export const H2_PROTOCOL_ERROR = 0x1;
export const H2_FRAME_SIZE_ERROR = 0x6;
export const H2_ENHANCE_YOUR_CALM = 0xb;

/** A client broke the protocol or a bound: its connection ends with a GOAWAY carrying `h2Code`. */
export class H2ConnectionError extends Error {
  constructor(
    message: string,
    readonly h2Code: number,
  ) {
    super(message);
    this.name = 'H2ConnectionError';
  }
}

export interface RewriterLimits {
  /** Decoded size of one header list (name + value + 32 per field), as SETTINGS_MAX_HEADER_LIST_SIZE counts it. */
  maxHeaderListSize: number;
  /** Encoded bytes of one header block, HEADERS and CONTINUATIONs together. */
  maxHeaderBlock: number;
  /** CONTINUATION frames in one header block (empty ones cost work too). */
  maxContinuations: number;
}

export const DEFAULT_LIMITS: RewriterLimits = {
  maxHeaderListSize: DEFAULT_MAX_HEADER_LIST,
  // An encoded block is never larger than the list it decodes to, unless it is padding for a flood.
  maxHeaderBlock: DEFAULT_MAX_HEADER_LIST,
  maxContinuations: 64,
};

const validAuthority = /^[A-Za-z0-9\-._~!$&'()*+,;=:@%[\]]*$/;

export function fixAuthority(headers: HpackHeader[]): boolean {
  let changed = false;
  for (const h of headers) {
    if (h.name === ':authority' && !validAuthority.test(h.value)) {
      h.value = 'localhost';
      changed = true;
    }
  }
  return changed;
}

function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const head = Buffer.alloc(9);
  head.writeUIntBE(payload.length, 0, 3);
  head[3] = type;
  head[4] = flags;
  head.writeUInt32BE(stream & 0x7fffffff, 5);
  return Buffer.concat([head, payload]);
}

/**
 * Rewrites the client-to-server half of an HTTP/2 connection. Header blocks
 * are decoded (keeping the client's HPACK state in step) and re-encoded as
 * literals that never touch the server's dynamic table; all other frames pass
 * through untouched.
 */
export class AuthorityRewriter extends EventEmitter {
  private buf: Buffer = EMPTY;
  private prefaceDone = false;
  private readonly limits: RewriterLimits;
  private readonly decoder: BoundedHpackDecoder;
  private block: Buffer[] = [];
  /** The largest frame the server accepts: a longer one is refused before it is buffered. */
  private maxFrameSize = MAX_FRAME;

  constructor(limits: Partial<RewriterLimits> = {}) {
    super();
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.decoder = new BoundedHpackDecoder(4096, this.limits.maxHeaderListSize);
  }

  /** What the server's SETTINGS said; the client's frames and header blocks are held to them. */
  serverSettings(id: number, value: number): void {
    if (id === SETTINGS_HEADER_TABLE_SIZE) this.decoder.setMaxTableSize(value);
    if (id === SETTINGS_MAX_FRAME_SIZE && value >= MAX_FRAME && value <= 0xffffff) this.maxFrameSize = value;
  }

  /** Streams other than the one whose header block is open. */
  private get inBlock(): boolean {
    return this.block.length > 0;
  }

  private continuations = 0;
  private blockLen = 0;
  private blockStream = 0;
  private blockFlags = 0;
  private blockPriority: Buffer | undefined;

  /**
   * What the server is to get for the next `chunk` of the client's bytes, in order; throws H2ConnectionError.
   */
  rewrite(chunk: Buffer): Buffer[] {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    const out: Buffer[] = [];
    if (!this.prefaceDone) {
      if (this.buf.length < PREFACE.length) return out;
      if (!this.buf.subarray(0, PREFACE.length).equals(PREFACE)) throw new H2ConnectionError('client did not start with the HTTP/2 preface', H2_PROTOCOL_ERROR);
      out.push(this.buf.subarray(0, PREFACE.length));
      this.buf = this.buf.subarray(PREFACE.length);
      this.prefaceDone = true;
      this.emit('preface');
    }
    this.drain(out);
    return out;
  }

  private drain(out: Buffer[]): void {
    let passStart = 0;
    let off = 0;
    while (this.buf.length - off >= 9) {
      const len = this.buf.readUIntBE(off, 3);
      const type = this.buf[off + 3]!;
      if (len > this.maxFrameSize) throw new H2ConnectionError(`frame of ${len} bytes, larger than the ${this.maxFrameSize} allowed`, H2_FRAME_SIZE_ERROR);
      if (this.buf.length - off < 9 + len) break;
      if (type !== FRAME_HEADERS && type !== FRAME_CONTINUATION) {
        if (this.inBlock) throw new H2ConnectionError(`frame of type ${type} inside a header block`, H2_PROTOCOL_ERROR);
        off += 9 + len;
        continue;
      }
      if (off > passStart) out.push(this.buf.subarray(passStart, off));
      const flags = this.buf[off + 4]!;
      const stream = this.buf.readUInt32BE(off + 5) & 0x7fffffff;
      const payload = this.buf.subarray(off + 9, off + 9 + len);
      off += 9 + len;
      passStart = off;
      const rewritten = this.headerFrame(type, flags, stream, payload);
      if (rewritten) out.push(...rewritten);
    }
    if (off > passStart) out.push(this.buf.subarray(passStart, off));
    this.buf = this.buf.subarray(off);
    if (this.buf.length === 0) this.buf = EMPTY;
    else this.buf = Buffer.from(this.buf);
  }

  private headerFrame(type: number, flags: number, stream: number, payload: Buffer): Buffer[] | undefined {
    if (type === FRAME_HEADERS) {
      if (this.inBlock) throw new H2ConnectionError('HEADERS inside a header block', H2_PROTOCOL_ERROR);
      if (stream === 0) throw new H2ConnectionError('HEADERS on stream 0', H2_PROTOCOL_ERROR);
      let p = payload;
      let pad = 0;
      if (flags & FLAG_PADDED) {
        if (p.length < 1) throw new H2ConnectionError('padded HEADERS without a pad length', H2_FRAME_SIZE_ERROR);
        pad = p[0]!;
        p = p.subarray(1);
      }
      if (flags & FLAG_PRIORITY) {
        if (p.length < 5) throw new H2ConnectionError('HEADERS too short for its priority', H2_FRAME_SIZE_ERROR);
        this.blockPriority = Buffer.from(p.subarray(0, 5));
        p = p.subarray(5);
      } else {
        this.blockPriority = undefined;
      }
      if (pad > p.length) throw new H2ConnectionError('HEADERS padding longer than the frame', H2_PROTOCOL_ERROR);
      p = p.subarray(0, p.length - pad);
      this.block = [Buffer.from(p)];
      this.blockLen = p.length;
      this.blockStream = stream;
      this.blockFlags = flags;
      this.continuations = 0;
    } else {
      if (stream !== this.blockStream || !this.inBlock) throw new H2ConnectionError('CONTINUATION outside a header block', H2_PROTOCOL_ERROR);
      if (++this.continuations > this.limits.maxContinuations) {
        throw new H2ConnectionError(`more than ${this.limits.maxContinuations} CONTINUATION frames in one header block`, H2_ENHANCE_YOUR_CALM);
      }
      this.block.push(Buffer.from(payload));
      this.blockLen += payload.length;
    }
    if (this.blockLen > this.limits.maxHeaderBlock) {
      throw new H2ConnectionError(`header block larger than ${this.limits.maxHeaderBlock} bytes`, H2_ENHANCE_YOUR_CALM);
    }
    if (!(flags & FLAG_END_HEADERS)) return undefined;
    const block = Buffer.concat(this.block);
    this.block = [];
    const headers = this.decode(block);
    fixAuthority(headers);
    return this.encode(headers);
  }

  private decode(block: Buffer): Header[] {
    try {
      return this.decoder.decode(block);
    } catch (err) {
      if (err instanceof HpackError) throw new H2ConnectionError(err.message, err.h2Code);
      throw err;
    }
  }

  private encode(headers: HpackHeader[]): Buffer[] {
    let block = encodeLiterals(headers);
    const frames: Buffer[] = [];
    const prio = this.blockPriority;
    const firstRoom = MAX_FRAME - (prio ? 5 : 0);
    const first = block.subarray(0, firstRoom);
    block = block.subarray(first.length);
    const endStream = this.blockFlags & FLAG_END_STREAM;
    const firstFlags = endStream | (prio ? FLAG_PRIORITY : 0) | (block.length === 0 ? FLAG_END_HEADERS : 0);
    frames.push(frame(FRAME_HEADERS, firstFlags, this.blockStream, prio ? Buffer.concat([prio, first]) : first));
    while (block.length) {
      const part = block.subarray(0, MAX_FRAME);
      block = block.subarray(part.length);
      frames.push(frame(FRAME_CONTINUATION, block.length === 0 ? FLAG_END_HEADERS : 0, this.blockStream, part));
    }
    return frames;
  }
}

/**
 * Watches the server-to-client half: passes every byte on as it comes, and
 * reports the server's SETTINGS (which bound what the client may send) and
 * whether the bytes so far end on a frame boundary (where a GOAWAY may go).
 */
export class ServerFrameWatcher {
  /** The header of the frame being read, while it is cut short. */
  private readonly head = Buffer.alloc(9);
  private headLen = 0;
  private remaining = 0;
  /** The payload of a SETTINGS or GOAWAY frame being read, and which of them it is. */
  private collecting: { type: number; parts: Buffer[] } | undefined;

  constructor(
    private readonly onSetting: (id: number, value: number) => void,
    /** The server sent GOAWAY with this error code. */
    private readonly onGoaway: (code: number) => void = () => {},
  ) {}

  get atFrameBoundary(): boolean {
    return this.remaining === 0 && this.headLen === 0;
  }

  /**
   * Follows the frames in the server's next `chunk`. Only frame headers are read, and the payloads of
   * SETTINGS and GOAWAY; the relay calls this directly and writes the chunk on as it is.
   */
  scan(chunk: Buffer): void {
    let off = 0;
    while (off < chunk.length) {
      if (this.remaining === 0 && this.collecting === undefined) {
        let h: Buffer;
        let at: number;
        if (this.headLen === 0 && chunk.length - off >= 9) {
          h = chunk;
          at = off;
          off += 9;
        } else {
          const take = Math.min(9 - this.headLen, chunk.length - off);
          chunk.copy(this.head, this.headLen, off, off + take);
          this.headLen += take;
          off += take;
          if (this.headLen < 9) break;
          this.headLen = 0;
          h = this.head;
          at = 0;
        }
        this.remaining = h.readUIntBE(at, 3);
        const type = h[at + 3]!;
        if ((type === FRAME_SETTINGS && !(h[at + 4]! & FLAG_ACK)) || type === FRAME_GOAWAY) this.collecting = { type, parts: [] };
      }
      const take = Math.min(this.remaining, chunk.length - off);
      if (this.collecting) this.collecting.parts.push(chunk.subarray(off, off + take));
      off += take;
      this.remaining -= take;
      if (this.remaining === 0 && this.collecting) {
        const { type, parts } = this.collecting;
        const p = Buffer.concat(parts);
        this.collecting = undefined;
        if (type === FRAME_SETTINGS) {
          for (let i = 0; i + 6 <= p.length; i += 6) this.onSetting(p.readUInt16BE(i), p.readUInt32BE(i + 2));
        } else if (p.length >= 8) {
          this.onGoaway(p.readUInt32BE(4));
        }
      }
    }
  }
}

export function goaway(code: number, lastStream = 0): Buffer {
  const payload = Buffer.alloc(8);
  payload.writeUInt32BE(lastStream & 0x7fffffff, 0);
  payload.writeUInt32BE(code, 4);
  return frame(FRAME_GOAWAY, 0, 0, payload);
}

export interface AuthorityProxy {
  server: net.Server;
  /**
   * Closes every client connection, once the gRPC server has drained: what the server wrote last is
   * passed on first (for at most `graceMs`), since it still has the socket pair to cross.
   */
  destroyConnections(graceMs?: number): Promise<void>;
}

/**
 * Client connections served at once; more are closed as they come. A kubelet keeps one or two, but
 * clients that open a connection per call and keep it (critest opens one per spec) need hundreds:
 * critest failed 17 specs with 128. Node builds ~4 KiB of objects for each stream a connection opens
 * before any limit of skiff's can refuse it, so a burst of 1000 connections opening 100 streams each
 * costs the daemon ~115 MiB at this bound.
 */
export const MAX_CRI_CONNECTIONS = 1024;
/** How long a client has to send the HTTP/2 preface. */
export const PREFACE_TIMEOUT_MS = 10_000;

/** Listens on `publicPath` and hands each connection, rewritten, to `serve`. */
export function startAuthorityProxy(publicPath: string, serve: (conn: Duplex) => void, log: Logger, limits: Partial<RewriterLimits> = {}): AuthorityProxy {
  /** Per open client: resolves once the client has what the server wrote and is closed. */
  const finishers = new Map<net.Socket, () => Promise<void>>();
  let dropped = 0;
  /** Clients refused since the last socket pair that could be made. */
  let unpaired = 0;
  const server = net.createServer((client) => {
    if (dropped) {
      log.info('CRI connections accepted again', { refused: dropped });
      dropped = 0;
    }
    const rewriter = new AuthorityRewriter(limits);
    // After a GOAWAY for an error, Node's HTTP/2 session neither reads the connection nor closes it: a client
    // that kept sending until it was paused, then left, was never noticed, and its descriptor and connection
    // slot stayed taken for good. The connection is ended here once that GOAWAY has gone out.
    let serverGaveUp = false;
    const watcher = new ServerFrameWatcher(
      (id, value) => rewriter.serverSettings(id, value),
      (code) => {
        if (code !== 0) serverGaveUp = true;
      },
    );
    let closed = false;
    // A client that never starts speaking HTTP/2 is not held for ever.
    const prefaceTimer = setTimeout(() => {
      log.debug('CRI client sent no HTTP/2 preface in time; closing its connection', { ms: PREFACE_TIMEOUT_MS });
      close();
    }, PREFACE_TIMEOUT_MS);
    prefaceTimer.unref();
    // The HTTP/2 server gets a socket of its own, the other end of a socket pair, so Node's HTTP/2 does its
    // reads and writes natively. Handed a JS Duplex instead, every read and write went through Node's JS stream
    // adapter: a 25 KB answer (ListContainers with 50 pods) took 0.37-0.43 ms warm and 0.97 ms in the first
    // calls, against 0.30-0.35 and 0.66 through the pair, and 0.22-0.28 and 0.57 with no relay at all.
    // The pair (two more descriptors) is made once the client has sent the HTTP/2 preface: a connection that
    // never speaks HTTP/2 costs one descriptor until its timeout.
    let inner: net.Socket | undefined;
    let conn: net.Socket | undefined;
    rewriter.once('preface', () => {
      clearTimeout(prefaceTimer);
      if (closed) return;
      let pair: [number, number];
      try {
        pair = socketPair();
      } catch (err) {
        // One warning per burst, as for connections past MAX_CRI_CONNECTIONS: out of descriptors, every client
        // that connects is refused here, and a line for each would let any client write the log as fast as it connects.
        if (unpaired++ === 0) log.warn('cannot serve CRI connections: no socket pair for them (out of file descriptors?); refusing them until one can be made', { error: (err as Error).message });
        close();
        return;
      }
      if (unpaired) {
        log.info('CRI connections served again', { refused: unpaired });
        unpaired = 0;
      }
      inner = new net.Socket({ fd: pair[0], readable: true, writable: true });
      conn = new net.Socket({ fd: pair[1], readable: true, writable: true });
      inner.on('error', close);
      conn.on('error', close);
      // What the server writes goes out to the client as it comes, the watcher only looking at it.
      const pairEnd = inner;
      pairEnd.on('data', (chunk: Buffer) => fromServer(pairEnd, chunk));
      // The server closed its end: what it wrote before has all gone to the client by now.
      pairEnd.on('end', () => {
        if (closed) return;
        closed = true;
        clearTimeout(prefaceTimer);
        client.end();
        setTimeout(() => {
          inner?.destroy();
          client.destroy();
        }, 1000).unref();
      });
      serve(conn);
    });
    // What the server reads is the rewritten client. The rewriter and the watcher are plain calls, not
    // streams: as two Transforms in pipes, each call's bytes took Node's stream machinery four times more.
    const toServer = (chunk: Buffer) => {
      let out: Buffer[];
      try {
        out = rewriter.rewrite(chunk);
      } catch (err) {
        close(err as Error);
        return;
      }
      // Before the preface is complete nothing is passed on; the pair is made as it completes.
      if (!inner || closed || out.length === 0) return;
      let more = true;
      for (const b of out) more = inner.write(b);
      if (!more) {
        client.pause();
        inner.once('drain', () => client.resume());
      }
    };
    /** Set once nothing more of the server's is to reach the client (a GOAWAY of the relay's own follows). */
    let stopped = false;
    // The frames of one answer (headers, data, trailers) leave in one write where they come in one turn.
    let corked = false;
    const fromServer = (pairEnd: net.Socket, chunk: Buffer) => {
      if (stopped) return;
      watcher.scan(chunk);
      if (!corked) {
        corked = true;
        client.cork();
        process.nextTick(() => {
          corked = false;
          client.uncork();
        });
      }
      if (!client.write(chunk)) {
        pairEnd.pause();
        client.once('drain', () => pairEnd.resume());
      }
      if (serverGaveUp && !closed) {
        closed = true;
        clearTimeout(prefaceTimer);
        log.debug('HTTP/2 server ended a client connection for an error; closing it');
        client.end();
        setTimeout(() => {
          conn?.destroy();
          inner?.destroy();
          client.destroy();
        }, 1000).unref();
      }
    };
    const close = (err?: Error) => {
      if (closed) return;
      closed = true;
      clearTimeout(prefaceTimer);
      conn?.destroy();
      inner?.destroy();
      client.off('data', toServer);
      client.pause();
      if (err instanceof H2ConnectionError) {
        log.warn('HTTP/2 client broke the protocol; closing its connection', { error: err.message });
        // Tell the client why, when that can be said between two frames; then close whatever it does.
        stopped = true;
        if (watcher.atFrameBoundary && client.writable) {
          client.end(goaway(err.h2Code));
          setTimeout(() => client.destroy(), 1000).unref();
          return;
        }
      } else if (err) {
        log.debug('client connection closed with error', { error: err.message });
      }
      client.destroy();
    };
    client.on('error', close);
    client.on('close', () => close());
    client.on('data', toServer);
    // The client's half-close reaches the server, as through a pipe.
    client.on('end', () => {
      if (!closed) inner?.end();
    });
    finishers.set(client, () => {
      if (client.destroyed) return Promise.resolve();
      // The server's end closing (the session was destroyed) ends the pair, which ends the client.
      conn?.end();
      if (!conn) client.destroy();
      return new Promise((resolve) => client.once('close', () => resolve()));
    });
    client.once('close', () => finishers.delete(client));
  });
  server.maxConnections = MAX_CRI_CONNECTIONS;
  server.on('drop', () => {
    // One warning per burst, not one per refused connection.
    if (dropped++ === 0) log.warn('too many CRI connections at once; refusing new ones', { max: MAX_CRI_CONNECTIONS });
  });
  server.listen(publicPath);
  return {
    server,
    destroyConnections: async (graceMs = 1000) => {
      const all = [...finishers.values()].map((f) => f());
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([Promise.all(all), new Promise((r) => (timer = setTimeout(r, graceMs)))]);
      clearTimeout(timer);
      for (const c of finishers.keys()) c.destroy();
    },
  };
}
