import net from 'node:net';
import { Writable } from 'node:stream';
import zlib from 'node:zlib';
import { afterEach, describe, expect, it, vi } from 'vitest';
import { controlFrame, dataFrame, decodeHeaderBlock, encodeHeaderBlock, FLAG_FIN, FrameType, RstStatus, SpdySession, type SpdyStream } from '../../src/streaming/spdy.js';
import { SPDY3_DICTIONARY } from '../../src/streaming/spdy-dictionary.js';
import { zlibPass } from '../helpers/spdy-client.js';

const u32 = (n: number) => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};

/** A minimal SPDY client for tests, with its own zlib contexts. */
class TestClient {
  private readonly deflate = zlib.createDeflate({ dictionary: SPDY3_DICTIONARY });
  private readonly inflate = zlib.createInflate({ dictionary: SPDY3_DICTIONARY });
  private buf = Buffer.alloc(0);
  readonly frames: Array<{ control: boolean; type: number; flags: number; streamId: number; payload: Buffer; headers?: Record<string, string> }> = [];
  private waiters: Array<() => void> = [];
  ended = false;

  constructor(readonly sock: net.Socket) {
    sock.on('data', (d: Buffer) => void this.onData(d));
    sock.on('close', () => {
      this.ended = true;
      this.wake();
    });
  }

  private chain: Promise<void> = Promise.resolve();
  private onData(d: Buffer): void {
    this.buf = Buffer.concat([this.buf, d]);
    while (this.buf.length >= 8) {
      const len = this.buf.readUInt32BE(4) & 0xffffff;
      if (this.buf.length < 8 + len) break;
      const f = this.buf.subarray(0, 8 + len);
      this.buf = this.buf.subarray(8 + len);
      this.chain = this.chain.then(() => this.parse(Buffer.from(f)));
    }
  }

  private async parse(f: Buffer): Promise<void> {
    const control = (f[0]! & 0x80) !== 0;
    const type = control ? f.readUInt16BE(2) : 0;
    const payload = f.subarray(8);
    const streamId = control ? (payload.length >= 4 ? payload.readUInt32BE(0) & 0x7fffffff : 0) : f.readUInt32BE(0) & 0x7fffffff;
    const frame: (typeof this.frames)[0] = { control, type, flags: f[4]!, streamId, payload };
    if (control && (type === FrameType.SYN_REPLY || type === FrameType.HEADERS)) frame.headers = decodeHeaderBlock(await this.z(this.inflate, payload.subarray(4)));
    this.frames.push(frame);
    this.wake();
  }

  private z(z: zlib.Inflate | zlib.Deflate, data: Buffer): Promise<Buffer> {
    return zlibPass(z, data);
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  async until<T>(pred: () => T | undefined, ms = 3000): Promise<T> {
    const deadline = Date.now() + ms;
    for (;;) {
      const v = pred();
      if (v !== undefined && v !== false) return v;
      if (Date.now() > deadline) throw new Error('timed out');
      await new Promise<void>((r) => {
        this.waiters.push(r);
        setTimeout(r, 50);
      });
    }
  }

  async synStream(id: number, headers: Record<string, string>, flags = 0): Promise<Buffer> {
    const block = await this.z(this.deflate, encodeHeaderBlock(headers));
    return controlFrame(FrameType.SYN_STREAM, flags, Buffer.concat([u32(id), u32(0), Buffer.from([0, 0]), block]));
  }

  data(id: number, streamId = 0): Buffer {
    return Buffer.concat(this.frames.filter((f) => !f.control && f.streamId === id).map((f) => f.payload)).subarray(streamId);
  }
}

const servers: net.Server[] = [];
afterEach(() => {
  for (const s of servers.splice(0)) s.close();
});

async function pair(onStream: (s: SpdyStream, session: SpdySession) => void): Promise<{ client: TestClient; errors: Error[] }> {
  const errors: Error[] = [];
  const server = net.createServer((sock) => {
    const session = new SpdySession(sock);
    session.on('stream', (s: SpdyStream) => onStream(s, session));
    session.on('protocol-error', (e: Error) => errors.push(e));
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  const sock = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
  await new Promise((r) => sock.once('connect', r));
  return { client: new TestClient(sock), errors };
}

describe('SPDY/3 header blocks', () => {
  it('decodes a block laid out by hand, and round-trips', () => {
    const hand = Buffer.concat([u32(2), u32(10), Buffer.from('streamtype'), u32(6), Buffer.from('stdout'), u32(9), Buffer.from('requestid'), u32(1), Buffer.from('0')]);
    expect(decodeHeaderBlock(hand)).toEqual({ streamtype: 'stdout', requestid: '0' });
    expect(encodeHeaderBlock({ streamtype: 'stdout', requestid: '0' })).toEqual(hand);
  });
  it('refuses truncated blocks and uppercase names', () => {
    expect(() => decodeHeaderBlock(Buffer.concat([u32(1), u32(50), Buffer.from('x')]))).toThrow(/truncated/);
    expect(() => decodeHeaderBlock(Buffer.concat([u32(1), u32(1), Buffer.from('X'), u32(0)]))).toThrow(/invalid header name/);
  });
  it('primes zlib with the 1423-byte SPDY/3 dictionary', () => {
    expect(SPDY3_DICTIONARY.length).toBe(1423);
    expect(SPDY3_DICTIONARY.subarray(0, 11)).toEqual(Buffer.from([0, 0, 0, 7, ...Buffer.from('options')]));
  });
});

describe('SpdySession', () => {
  it('accepts streams, replies, and carries data both ways with FIN', async () => {
    const got: Array<{ headers: Record<string, string>; body: string }> = [];
    const { client } = await pair((s) => {
      let body = '';
      s.on('data', (d: Buffer) => (body += d.toString()));
      s.on('end', () => {
        got.push({ headers: s.headers, body });
        s.end(`echo:${body}`);
      });
      void s.reply({ ok: 'yes' });
    });
    client.sock.write(await client.synStream(1, { streamtype: 'stdin', requestid: '7' }));
    client.sock.write(dataFrame(1, 0, Buffer.from('hel')));
    client.sock.write(dataFrame(1, FLAG_FIN, Buffer.from('lo')));
    const reply = await client.until(() => client.frames.find((f) => f.type === FrameType.SYN_REPLY));
    expect(reply.headers).toEqual({ ok: 'yes' });
    await client.until(() => client.frames.find((f) => !f.control && f.streamId === 1 && f.flags & FLAG_FIN));
    expect(client.data(1).toString()).toBe('echo:hello');
    expect(got).toEqual([{ headers: { streamtype: 'stdin', requestid: '7' }, body: 'hello' }]);
  });

  it('answers PINGs, and parses frames however the bytes are split', async () => {
    const seen: string[] = [];
    const { client } = await pair((s) => {
      seen.push(s.headers.port!);
      void s.reply({});
    });
    const bytes = Buffer.concat([
      await client.synStream(1, { port: '80' }),
      await client.synStream(3, { port: '81' }),
      controlFrame(FrameType.PING, 0, u32(5)),
      await client.synStream(5, { port: '82' }),
    ]);
    for (const b of bytes) client.sock.write(Buffer.from([b]));
    await client.until(() => client.frames.find((f) => f.type === FrameType.PING));
    await client.until(() => seen.length === 3 || undefined);
    expect(seen).toEqual(['80', '81', '82']);
    expect(client.frames.find((f) => f.type === FrameType.PING)!.payload.readUInt32BE(0)).toBe(5);
  });

  it('refuses data for unknown streams with RST_STREAM, and a wrong version with GOAWAY', async () => {
    const { client, errors } = await pair(() => undefined);
    client.sock.write(dataFrame(9, 0, Buffer.from('x')));
    const rst = await client.until(() => client.frames.find((f) => f.type === FrameType.RST_STREAM));
    expect(rst.payload.readUInt32BE(4)).toBe(RstStatus.INVALID_STREAM);
    const bad = controlFrame(FrameType.PING, 0, u32(1));
    bad.writeUInt16BE(0x8000 | 2, 0);
    client.sock.write(bad);
    const goaway = await client.until(() => client.frames.find((f) => f.type === FrameType.GOAWAY));
    expect(goaway.payload.readUInt32BE(4)).toBe(RstStatus.PROTOCOL_ERROR);
    await client.until(() => client.ended || undefined);
    expect(errors[0]?.message).toMatch(/unsupported SPDY version 2/);
  });

  it('survives garbage: broken sessions end with GOAWAY, and the next session works', async () => {
    let seed = 99;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) & 0xff;
    let protocolErrors = 0;
    for (let i = 0; i < 40; i++) {
      const { client, errors } = await pair(() => undefined);
      const junk = Buffer.from(Array.from({ length: 200 }, rand));
      // Half of them look like control frames of our version, so the parser goes deeper.
      if (i % 2) {
        junk.writeUInt16BE(0x8003, 0);
        junk.writeUInt16BE(1 + (i % 9), 2);
        junk.writeUInt32BE(192, 4);
      }
      client.sock.write(junk);
      await client.until(() => client.ended || client.frames.some((f) => f.type === FrameType.GOAWAY) || errors.length > 0 || undefined, 500).catch(() => undefined);
      protocolErrors += errors.length;
      client.sock.destroy();
    }
    expect(protocolErrors).toBeGreaterThan(5);
    const { client } = await pair((st) => void st.reply({ alive: 'yes' }));
    client.sock.write(await client.synStream(1, {}));
    expect((await client.until(() => client.frames.find((f) => f.type === FrameType.SYN_REPLY))).headers).toEqual({ alive: 'yes' });
  });

  it('honours windows for a peer that uses flow control', async () => {
    const { client } = await pair((s) => {
      void s.reply({}).then(() => s.end(Buffer.alloc(100, 7)));
    });
    const settings = controlFrame(FrameType.SETTINGS, 0, Buffer.concat([u32(1), u32(7), u32(10)]));
    client.sock.write(settings);
    client.sock.write(controlFrame(FrameType.WINDOW_UPDATE, 0, Buffer.concat([u32(0), u32(1000)])));
    client.sock.write(await client.synStream(1, {}));
    await client.until(() => client.data(1).length >= 10 || undefined);
    await new Promise((r) => setTimeout(r, 200));
    expect(client.data(1).length).toBe(10);
    client.sock.write(controlFrame(FrameType.WINDOW_UPDATE, 0, Buffer.concat([u32(1), u32(90)])));
    await client.until(() => client.data(1).length === 100 || undefined);
  });

  it('sends freely to a peer that never uses flow control (as Kubernetes clients do)', async () => {
    const { client } = await pair((s) => {
      void s.reply({}).then(() => s.end(Buffer.alloc(200_000, 1)));
    });
    client.sock.write(await client.synStream(1, {}));
    await client.until(() => client.data(1).length === 200_000 || undefined);
    expect(client.frames.some((f) => f.type === FrameType.WINDOW_UPDATE)).toBe(false);
  });

  it('stops reading a peer that floods PINGs and never reads the replies', async () => {
    let serverSock: net.Socket | undefined;
    const server = net.createServer((sock) => {
      serverSock = sock;
      new SpdySession(sock);
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const sock = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    sock.pause();
    const ping = controlFrame(FrameType.PING, 0, u32(1));
    const chunk = Buffer.concat(Array.from({ length: 4096 }, () => ping));
    const deadline = Date.now() + 3000;
    while (Date.now() < deadline) {
      if (!sock.write(chunk)) await Promise.race([new Promise((r) => sock.once('drain', r)), new Promise((r) => setTimeout(r, 200))]);
    }
    // The session holds about its read limit unsent, then stops reading: the peer's writes back up.
    expect(serverSock!.writableLength).toBeLessThan(2 * 1024 * 1024);
    expect(serverSock!.isPaused()).toBe(true);
    const readBefore = serverSock!.bytesRead;
    await new Promise((r) => setTimeout(r, 300));
    expect(serverSock!.bytesRead - readBefore).toBeLessThan(256 * 1024);
    // Once the peer reads, the session answers again and reads on.
    sock.resume();
    await vi.waitFor(() => expect(serverSock!.bytesRead).toBeGreaterThan(readBefore), { timeout: 5000, interval: 20 });
    sock.destroy();
  });

  it('holds data back while the peer does not read: the writer sees backpressure', async () => {
    let streamRef: SpdyStream | undefined;
    let serverSock: net.Socket | undefined;
    const server = net.createServer((sock) => {
      serverSock = sock;
      const session = new SpdySession(sock);
      session.on('stream', (s: SpdyStream) => {
        streamRef = s;
        void s.reply({});
      });
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const sock = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    const client = new TestClient(sock);
    sock.write(await client.synStream(1, {}));
    await client.until(() => streamRef);
    sock.pause();
    let accepted = 0;
    const block = Buffer.alloc(64 * 1024, 1);
    for (let i = 0; i < 2000; i++) {
      accepted += block.length;
      if (!streamRef!.write(block)) break;
    }
    // 128 MiB offered; the stream refused more long before.
    expect(accepted).toBeLessThan(8 * 1024 * 1024);
    await new Promise((r) => setTimeout(r, 300));
    expect(serverSock!.writableLength).toBeLessThan(1024 * 1024);
    sock.destroy();
  });

  it('refuses streams beyond the session limit with REFUSED_STREAM', async () => {
    const server = net.createServer((sock) => {
      const session = new SpdySession(sock, { maxStreams: 3 });
      session.on('stream', (s: SpdyStream) => void s.reply({}));
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const sock = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    const client = new TestClient(sock);
    for (const id of [1, 3, 5, 7]) sock.write(await client.synStream(id, { n: String(id) }));
    const rst = await client.until(() => client.frames.find((f) => f.type === FrameType.RST_STREAM));
    expect(rst.streamId).toBe(7);
    expect(rst.payload.readUInt32BE(4)).toBe(RstStatus.REFUSED_STREAM);
    await client.until(() => client.frames.filter((f) => f.type === FrameType.SYN_REPLY).length === 3 || undefined);
    expect(client.frames.filter((f) => f.type === FrameType.SYN_REPLY).map((f) => f.streamId)).toEqual([1, 3, 5]);
    expect(client.frames.filter((f) => f.type === FrameType.RST_STREAM).map((f) => f.streamId)).toEqual([7]);
    sock.destroy();
  });

  it('ends the session when the peer closes its side (no CLOSE-WAIT)', async () => {
    let closed = false;
    let serverSock: net.Socket | undefined;
    // Half-open allowed, as the HTTP server's upgraded sockets are.
    const server = net.createServer({ allowHalfOpen: true }, (sock) => {
      serverSock = sock;
      const session = new SpdySession(sock);
      session.on('close', () => (closed = true));
    });
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    const sock = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    await new Promise((r) => sock.once('connect', r));
    const client = new TestClient(sock);
    sock.end();
    await client.until(() => (closed && serverSock!.destroyed) || undefined);
  });

  it('holds input back while the reader of a stream is slow, then delivers every byte (no deadlock)', async () => {
    let received = 0;
    let gate: (() => void) | undefined;
    let open = false;
    const sink = new Writable({
      highWaterMark: 16 * 1024,
      write(chunk: Buffer, _enc, cb) {
        received += chunk.length;
        if (open) cb();
        else gate = cb;
      },
    });
    const { client } = await pair((st) => {
      void st.reply({});
      st.pipe(sink);
    });
    client.sock.write(await client.synStream(1, {}));
    const frame = dataFrame(1, 0, Buffer.alloc(256 * 1024, 3));
    const total = 24;
    for (let i = 0; i < total; i++) client.sock.write(frame);
    await new Promise((r) => setTimeout(r, 500));
    expect(received).toBeLessThan(512 * 1024);
    open = true;
    gate?.();
    await client.until(() => received === total * 256 * 1024 || undefined, 10_000);
  });
});


describe('SpdySession reading large frames', () => {
  it('reads a data frame larger than its input mark, arriving in small pieces, to its end', async () => {
    let got = 0;
    let ended = false;
    const { client } = await pair((s) => {
      s.on('data', (d: Buffer) => (got += d.length));
      s.on('end', () => (ended = true));
      void s.reply({});
    });
    client.sock.write(await client.synStream(1, { streamtype: 'stdin' }));
    const frame = dataFrame(1, FLAG_FIN, Buffer.alloc(900 * 1024, 1));
    for (let at = 0; at < frame.length; at += 16 * 1024) {
      client.sock.write(frame.subarray(at, at + 16 * 1024));
      await new Promise((r) => setImmediate(r));
    }
    await client.until(() => ended || undefined, 5000);
    expect(got).toBe(900 * 1024);
  });
});
