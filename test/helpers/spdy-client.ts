/**
 * A SPDY/3.1 client for tests, speaking Kubernetes' streaming handshake: an
 * HTTP upgrade, then client-initiated streams named by their headers.
 */
import net from 'node:net';
import type { Duplex } from 'node:stream';
import zlib from 'node:zlib';
import { controlFrame, dataFrame, decodeHeaderBlock, encodeHeaderBlock, FLAG_FIN, FrameType } from '../../src/streaming/spdy.js';
import { SPDY3_DICTIONARY } from '../../src/streaming/spdy-dictionary.js';

const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/** Runs one header block through a zlib context of a session (sync-flushed, as SPDY does). */
export function zlibPass(z: zlib.Inflate | zlib.Deflate, data: Buffer): Promise<Buffer> {
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    const on = (d: Buffer) => out.push(d);
    z.on('data', on);
    z.write(data);
    z.flush(zlib.constants.Z_SYNC_FLUSH, () => {
      z.off('data', on);
      resolve(Buffer.concat(out));
    });
  });
}

export interface ClientStream {
  id: number;
  data: Buffer;
  fin: boolean;
  reset: boolean;
}

export class SpdyTestClient {
  private readonly deflate = zlib.createDeflate({ dictionary: SPDY3_DICTIONARY });
  private readonly inflate = zlib.createInflate({ dictionary: SPDY3_DICTIONARY });
  private buf = Buffer.alloc(0);
  private nextId = 1;
  private chain: Promise<void> = Promise.resolve();
  readonly streams = new Map<number, ClientStream>();
  closed = false;
  goaway = false;
  /** Bytes the server has sent us (counted while reading). */
  received = 0;
  /** PING replies seen. */
  pings = 0;

  private constructor(readonly sock: net.Socket) {}

  /** Upgrades `url` to SPDY/3.1 with `protocols`; rejects with the HTTP status line on refusal. */
  static async connect(url: string, protocols: string[], hostPort?: number): Promise<{ client: SpdyTestClient; protocol: string }> {
    const u = new URL(url);
    const sock = net.connect(hostPort ?? Number(u.port), '127.0.0.1');
    await new Promise((r, j) => sock.once('connect', r).once('error', j));
    return SpdyTestClient.over(sock, `${u.pathname}${u.search}`, u.host, protocols);
  }

  /** Upgrades on a connection already made (a TLS one to the node's API, say); `target` is the request's path and query. */
  static async over(sock: net.Socket, target: string, host: string, protocols: string[], method = 'GET'): Promise<{ client: SpdyTestClient; protocol: string }> {
    sock.write(`${method} ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${protocols.join(', ')}\r\n\r\n`);
    const head = await new Promise<{ text: string; rest: Buffer }>((resolve, reject) => {
      let acc = Buffer.alloc(0);
      const on = (d: Buffer) => {
        acc = Buffer.concat([acc, d]);
        const i = acc.indexOf('\r\n\r\n');
        if (i >= 0) {
          sock.off('data', on);
          resolve({ text: acc.subarray(0, i).toString(), rest: acc.subarray(i + 4) });
        }
      };
      sock.on('data', on);
      sock.once('close', () => reject(new Error(`closed before a reply: ${acc.toString()}`)));
    });
    if (!head.text.startsWith('HTTP/1.1 101')) {
      sock.destroy();
      throw new Error(head.text.split('\r\n')[0]);
    }
    const protocol = /x-stream-protocol-version: *(.*)/i.exec(head.text)?.[1]?.trim() ?? '';
    const client = new SpdyTestClient(sock);
    sock.on('data', (d: Buffer) => client.onBytes(d));
    sock.on('close', () => (client.closed = true));
    if (head.rest.length) client.onBytes(head.rest);
    return { client, protocol };
  }

  /** A client on a connection that already speaks SPDY (a WebSocket tunnel's stream, say). */
  static onUpgraded(sock: Duplex): SpdyTestClient {
    const client = new SpdyTestClient(sock as net.Socket);
    sock.on('data', (d: Buffer) => client.onBytes(d));
    sock.on('close', () => (client.closed = true));
    return client;
  }

  private onBytes(d: Buffer): void {
    this.received += d.length;
    this.buf = Buffer.concat([this.buf, d]);
    while (this.buf.length >= 8) {
      const len = this.buf.readUInt32BE(4) & 0xffffff;
      if (this.buf.length < 8 + len) break;
      const f = Buffer.from(this.buf.subarray(0, 8 + len));
      this.buf = this.buf.subarray(8 + len);
      this.chain = this.chain.then(() => this.onFrame(f));
    }
  }

  private async onFrame(f: Buffer): Promise<void> {
    const payload = f.subarray(8);
    const fin = (f[4]! & FLAG_FIN) !== 0;
    if (!(f[0]! & 0x80)) {
      const s = this.streams.get(f.readUInt32BE(0) & 0x7fffffff);
      if (s) {
        s.data = Buffer.concat([s.data, payload]);
        if (fin) s.fin = true;
      }
      return;
    }
    const type = f.readUInt16BE(2);
    if (type === FrameType.SYN_REPLY || type === FrameType.HEADERS) {
      decodeHeaderBlock(await this.z(this.inflate, payload.subarray(4)));
      const s = this.streams.get(payload.readUInt32BE(0) & 0x7fffffff);
      if (s && fin) s.fin = true;
    } else if (type === FrameType.RST_STREAM) {
      const s = this.streams.get(payload.readUInt32BE(0) & 0x7fffffff);
      if (s) s.reset = true;
    } else if (type === FrameType.GOAWAY) {
      this.goaway = true;
    } else if (type === FrameType.PING) {
      this.pings++;
    }
  }

  private z(z: zlib.Inflate | zlib.Deflate, data: Buffer): Promise<Buffer> {
    return zlibPass(z, data);
  }

  async open(headers: Record<string, string>): Promise<ClientStream> {
    const id = this.nextId;
    this.nextId += 2;
    const s: ClientStream = { id, data: Buffer.alloc(0), fin: false, reset: false };
    this.streams.set(id, s);
    const block = await this.z(this.deflate, encodeHeaderBlock(headers));
    this.sock.write(controlFrame(FrameType.SYN_STREAM, 0, Buffer.concat([u32(id), u32(0), Buffer.from([0, 0]), block])));
    return s;
  }

  write(s: ClientStream, data: Buffer | string, fin = false): void {
    this.sock.write(dataFrame(s.id, fin ? FLAG_FIN : 0, Buffer.from(data)));
  }

  async until<T>(pred: () => T | undefined | false, ms = 10_000): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = pred();
      if (v !== undefined && v !== false) return v;
      if (Date.now() > deadline) throw new Error('timed out waiting on the SPDY session');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  close(): void {
    this.sock.destroy();
  }

  // --- What an attacker does: raw frames, and never reading. ---

  /** Stops reading the connection: the server's writes pile up on its side. */
  stopReading(): void {
    this.sock.pause();
  }

  /** Writes bytes as they are, framed or not; resolves when the socket takes them (false: it closed). */
  raw(b: Buffer): Promise<boolean> {
    if (this.sock.destroyed) return Promise.resolve(false);
    return new Promise((resolve) => {
      if (this.sock.write(b)) resolve(true);
      else {
        const done = (ok: boolean) => {
          this.sock.off('drain', onDrain);
          this.sock.off('close', onClose);
          resolve(ok);
        };
        const onDrain = () => done(true);
        const onClose = () => done(false);
        this.sock.once('drain', onDrain);
        this.sock.once('close', onClose);
      }
    });
  }

  /** A SYN_STREAM with any id and flags, its headers compressed with this session's context. */
  async synStreamFrame(id: number, headers: Record<string, string>, flags = 0): Promise<Buffer> {
    const block = await this.z(this.deflate, encodeHeaderBlock(headers));
    return controlFrame(FrameType.SYN_STREAM, flags, Buffer.concat([u32(id), u32(0), Buffer.from([0, 0]), block]));
  }

  /** Opens a stream whose id this client tracks, the way `open` does, but lets the caller pick flags. */
  async openWith(headers: Record<string, string>, flags = 0): Promise<ClientStream> {
    const id = this.nextId;
    this.nextId += 2;
    const s: ClientStream = { id, data: Buffer.alloc(0), fin: false, reset: false };
    this.streams.set(id, s);
    this.sock.write(await this.synStreamFrame(id, headers, flags));
    return s;
  }

  static pingFrame(id: number): Buffer {
    return controlFrame(FrameType.PING, 0, u32(id));
  }
}
