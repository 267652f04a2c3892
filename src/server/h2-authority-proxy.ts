/**
 * Go's gRPC clients dialing a Unix socket (crictl, the kubelet) send the
 * socket path as HTTP/2 `:authority`. Node's HTTP/2 layer treats that as a
 * malformed header and resets the stream before grpc-js sees it. skiff
 * therefore owns the public socket, rewrites such an `:authority` to
 * `localhost` in the client's header blocks, and forwards every byte else
 * unchanged to grpc-js listening on a private socket.
 */
import net from 'node:net';
import { createRequire } from 'node:module';
import { Transform, type TransformCallback } from 'node:stream';
import type { Logger } from '../log.js';

const require = createRequire(import.meta.url);
// hpack.js has no type declarations; these are the few calls used here.
interface HpackHeader {
  name: string;
  value: string;
  huffman?: boolean;
  neverIndex?: boolean;
}
interface HpackDecompressor {
  write(b: Buffer): void;
  execute(): void;
  read(): HpackHeader | null;
  on(ev: 'error', fn: (e: Error) => void): void;
}
interface HpackCompressor {
  write(h: HpackHeader[]): void;
  read(): Buffer | null;
}
const hpack = require('hpack.js') as {
  decompressor: { create(o: { table: { size: number } }): HpackDecompressor };
  compressor: { create(o: { table: { size: number } }): HpackCompressor };
};

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
const FRAME_HEADERS = 0x1;
const FRAME_CONTINUATION = 0x9;
const FLAG_END_STREAM = 0x1;
const FLAG_END_HEADERS = 0x4;
const FLAG_PADDED = 0x8;
const FLAG_PRIORITY = 0x20;
/** Every peer accepts frames this large (the protocol's minimum max frame size). */
const MAX_FRAME = 16384;
/** Header blocks larger than this are refused instead of buffered. */
const MAX_HEADER_BLOCK = 1 << 20;

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
export class AuthorityRewriter extends Transform {
  private buf: Buffer = Buffer.alloc(0);
  private decodeError: Error | undefined;
  private prefaceDone = false;
  private readonly decoder = hpack.decompressor.create({ table: { size: 4096 } });
  private readonly encoder = hpack.compressor.create({ table: { size: 4096 } });
  private block: Buffer[] = [];

  constructor() {
    super();
    this.decoder.on('error', (e) => (this.decodeError = e));
  }

  private blockLen = 0;
  private blockStream = 0;
  private blockFlags = 0;
  private blockPriority: Buffer | undefined;

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, chunk]) : chunk;
    try {
      this.drain();
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }

  private drain(): void {
    if (!this.prefaceDone) {
      if (this.buf.length < PREFACE.length) return;
      if (!this.buf.subarray(0, PREFACE.length).equals(PREFACE)) throw new Error('client did not start with the HTTP/2 preface');
      this.push(this.buf.subarray(0, PREFACE.length));
      this.buf = this.buf.subarray(PREFACE.length);
      this.prefaceDone = true;
    }
    const out: Buffer[] = [];
    let passStart = 0;
    let off = 0;
    while (this.buf.length - off >= 9) {
      const len = this.buf.readUIntBE(off, 3);
      const type = this.buf[off + 3]!;
      if (this.buf.length - off < 9 + len) break;
      if (type !== FRAME_HEADERS && type !== FRAME_CONTINUATION) {
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
    if (this.buf.length === 0) this.buf = Buffer.alloc(0);
    else this.buf = Buffer.from(this.buf);
    for (const b of out) this.push(b);
  }

  private headerFrame(type: number, flags: number, stream: number, payload: Buffer): Buffer[] | undefined {
    if (type === FRAME_HEADERS) {
      let p = payload;
      let pad = 0;
      if (flags & FLAG_PADDED) {
        pad = p[0]!;
        p = p.subarray(1);
      }
      if (flags & FLAG_PRIORITY) {
        this.blockPriority = Buffer.from(p.subarray(0, 5));
        p = p.subarray(5);
      } else {
        this.blockPriority = undefined;
      }
      if (pad > p.length) throw new Error('HEADERS padding longer than the frame');
      p = p.subarray(0, p.length - pad);
      this.block = [Buffer.from(p)];
      this.blockLen = p.length;
      this.blockStream = stream;
      this.blockFlags = flags;
    } else {
      if (stream !== this.blockStream || this.block.length === 0) throw new Error('CONTINUATION outside a header block');
      this.block.push(Buffer.from(payload));
      this.blockLen += payload.length;
    }
    if (this.blockLen > MAX_HEADER_BLOCK) throw new Error('header block too large');
    if (!(flags & FLAG_END_HEADERS)) return undefined;
    const headers = this.decode(Buffer.concat(this.block));
    this.block = [];
    fixAuthority(headers);
    return this.encode(headers);
  }

  private decode(block: Buffer): HpackHeader[] {
    this.decoder.write(block);
    this.decoder.execute();
    if (this.decodeError) throw this.decodeError;
    const out: HpackHeader[] = [];
    for (let h = this.decoder.read(); h !== null; h = this.decoder.read()) out.push({ name: h.name, value: h.value });
    return out;
  }

  private encode(headers: HpackHeader[]): Buffer[] {
    this.encoder.write(headers.map((h) => ({ name: h.name, value: h.value, huffman: false, neverIndex: true })));
    const parts: Buffer[] = [];
    for (let b = this.encoder.read(); b !== null; b = this.encoder.read()) parts.push(b);
    let block = Buffer.concat(parts);
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

export interface AuthorityProxy {
  server: net.Server;
  /** Closes every relayed connection (after the gRPC server has drained). */
  destroyConnections(): void;
}

/** Listens on `publicPath` and relays each connection to `privatePath`. */
export function startAuthorityProxy(publicPath: string, privatePath: string, log: Logger): AuthorityProxy {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect(privatePath);
    const rewriter = new AuthorityRewriter();
    sockets.add(client);
    const close = (err?: Error) => {
      if (err) log.debug('client connection closed with error', { error: err.message });
      client.destroy();
      upstream.destroy();
      sockets.delete(client);
    };
    client.on('error', close);
    upstream.on('error', close);
    rewriter.on('error', close);
    client.on('close', () => close());
    upstream.on('close', () => close());
    client.pipe(rewriter).pipe(upstream);
    upstream.pipe(client);
  });
  server.listen(publicPath);
  return {
    server,
    destroyConnections: () => {
      for (const s of sockets) s.destroy();
    },
  };
}
