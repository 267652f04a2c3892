import http2 from 'node:http2';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import fs from 'node:fs/promises';
import zlib from 'node:zlib';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { RpcServer, encodeMessage, parseTimeout, type Route, type ServerStream, type UnaryCall } from '../../src/server/rpc.js';
import { Status } from '../../src/server/status.js';

/** Messages here are UTF-8 strings: enough to see what went where. */
function route(p: string, handler: Partial<Pick<Route, 'unary' | 'stream'>>): Route {
  return { path: p, responseStream: !!handler.stream, decode: (b) => b.toString('utf8'), encode: (m) => Buffer.from(String(m)), ...handler };
}

function framed(body: Buffer | string, compressed = 0): Buffer {
  const b = Buffer.from(body);
  const h = Buffer.alloc(5);
  h[0] = compressed;
  h.writeUInt32BE(b.length, 1);
  return Buffer.concat([h, b]);
}

interface Answer {
  httpStatus?: number;
  status?: string;
  message?: string;
  messages: string[];
  error?: string;
}

let dir: string;
let sock: string;
let listener: net.Server;
let server: RpcServer;
const routes = new Map<string, Route>();
const seen: { cancelled: string[]; answered: string[] } = { cancelled: [], answered: [] };
const limits = { maxReceive: 1024, maxSend: 2048, maxPending: 4096 };

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-rpc-'));
  sock = path.join(dir, 's.sock');
  const add = (r: Route) => routes.set(r.path, r);
  add(route('/t.S/Echo', { unary: (c) => c.respond(null, `echo:${String(c.request)}`) }));
  add(route('/t.S/Fail', { unary: (c) => c.respond({ code: Status.NOT_FOUND, details: 'no such thing: ünïcode 100%' }) }));
  add(route('/t.S/Big', { unary: (c) => c.respond(null, 'x'.repeat(Number(c.request))) }));
  add(
    route('/t.S/Hang', {
      unary: (c) => {
        c.on('cancelled', () => seen.cancelled.push(String(c.request)));
        c.whenAnswered(() => seen.answered.push(String(c.request)));
      },
    }),
  );
  add(
    route('/t.S/Late', {
      unary: (c) => {
        c.whenAnswered(() => seen.answered.push(`late:${String(c.request)}`));
        setTimeout(() => c.respond(null, 'late'), Number(c.request));
      },
    }),
  );
  add(
    route('/t.S/Stream', {
      stream: (c: ServerStream) => {
        const n = Number(c.request);
        if (n < 0) return c.fail({ code: Status.INVALID_ARGUMENT, details: 'negative' });
        for (let i = 0; i < Math.floor(n); i++) c.write(`m${i}`);
        if (String(c.request).endsWith('.5')) c.fail({ code: Status.ABORTED, details: 'half way' });
        else c.end();
      },
    }),
  );
  server = new RpcServer(routes, limits);
  listener = net.createServer((s) => server.attach(s));
  await new Promise<void>((r) => listener.listen(sock, r));
});

afterAll(async () => {
  await server.shutdown(100);
  listener.close();
  await fs.rm(dir, { recursive: true, force: true });
});

afterEach(() => {
  seen.cancelled.length = 0;
  seen.answered.length = 0;
});

function session(): http2.ClientHttp2Session {
  const s = http2.connect('http://localhost', { createConnection: () => net.connect(sock) });
  s.on('error', () => {});
  return s;
}

function call(p: string, body: Buffer | null, headers: Record<string, string> = {}, s = session()): Promise<Answer> {
  return new Promise((resolve) => {
    const req = s.request({ ':method': 'POST', ':path': p, 'content-type': 'application/grpc', te: 'trailers', ...headers });
    const a: Answer = { messages: [] };
    let data = Buffer.alloc(0);
    req.on('response', (h) => {
      a.httpStatus = Number(h[':status']);
      if (h['grpc-status'] !== undefined) {
        a.status = String(h['grpc-status']);
        a.message = h['grpc-message'] as string | undefined;
      }
    });
    req.on('trailers', (t) => {
      a.status = String(t['grpc-status']);
      a.message = t['grpc-message'] as string | undefined;
    });
    req.on('data', (d: Buffer) => (data = Buffer.concat([data, d])));
    const done = () => {
      for (let off = 0; off + 5 <= data.length; ) {
        const len = data.readUInt32BE(off + 1);
        a.messages.push(data.subarray(off + 5, off + 5 + len).toString('utf8'));
        off += 5 + len;
      }
      s.close();
      resolve(a);
    };
    req.on('end', done);
    req.on('error', (e) => {
      a.error = e.message;
      s.close();
      resolve(a);
    });
    if (body) req.end(body);
  });
}


/** `local` listening on a socket of its own, with one client connection to it; `close` ends all three. */
async function ownServer(local: RpcServer, name: string) {
  const lsock = path.join(dir, `${name}.sock`);
  const listener = net.createServer((c) => local.attach(c));
  await new Promise<void>((r) => listener.listen(lsock, r));
  const s = http2.connect('http://localhost', { createConnection: () => net.connect(lsock) });
  s.on('error', () => {});
  const close = async () => {
    s.destroy();
    await local.shutdown(100);
    listener.close();
  };
  return { s, lsock, listener, close };
}

describe('RpcServer', () => {
  it('answers a unary call with one message and status 0', async () => {
    const a = await call('/t.S/Echo', framed('hi'));
    expect(a).toMatchObject({ httpStatus: 200, status: '0', messages: ['echo:hi'] });
  });

  it('sends an error as a trailers-only answer, its message percent-encoded', async () => {
    const a = await call('/t.S/Fail', framed(''));
    expect(a.status).toBe(String(Status.NOT_FOUND));
    expect(a.messages).toEqual([]);
    expect(a.message).toBe(encodeMessage('no such thing: ünïcode 100%'));
    expect(decodeURIComponent(a.message!)).toBe('no such thing: ünïcode 100%');
  });

  it('answers UNIMPLEMENTED for an unknown method, 405 for a GET and 415 for another content type', async () => {
    expect((await call('/t.S/Nope', framed(''))).status).toBe(String(Status.UNIMPLEMENTED));
    const get = await new Promise<number>((resolve) => {
      const s = session();
      const req = s.request({ ':method': 'GET', ':path': '/t.S/Echo' });
      req.on('response', (h) => {
        resolve(Number(h[':status']));
        s.close();
      });
      req.end();
    });
    expect(get).toBe(405);
    expect((await call('/t.S/Echo', framed('x'), { 'content-type': 'text/plain' })).httpStatus).toBe(415);
  });

  it('refuses requests with no message, two messages, a cut-short message or a wrong compression flag', async () => {
    for (const body of [Buffer.alloc(0), Buffer.concat([framed('a'), framed('b')]), framed('abc').subarray(0, 6), framed('abc', 1)]) {
      const a = await call('/t.S/Echo', body);
      expect(a.status).toBe(String(Status.INTERNAL));
      expect(a.messages).toEqual([]);
    }
  });

  it('takes a gzip-compressed request, and refuses one that inflates past the limit or an unknown encoding', async () => {
    const ok = await call('/t.S/Echo', framed(zlib.gzipSync('packed'), 1), { 'grpc-encoding': 'gzip' });
    expect(ok).toMatchObject({ status: '0', messages: ['echo:packed'] });
    const bomb = await call('/t.S/Echo', framed(zlib.gzipSync(Buffer.alloc(10 << 20)), 1), { 'grpc-encoding': 'gzip' });
    expect(bomb.status).toBe(String(Status.RESOURCE_EXHAUSTED));
    const other = await call('/t.S/Echo', framed('x', 1), { 'grpc-encoding': 'snappy' });
    expect(other.status).toBe(String(Status.UNIMPLEMENTED));
  });

  it('refuses a message over the receive limit as soon as it is seen, without reading it all', async () => {
    const s = session();
    const big = Buffer.alloc(5 + 64 * 1024);
    big.writeUInt32BE(64 * 1024, 1);
    const a = await new Promise<Answer>((resolve) => {
      const req = s.request({ ':method': 'POST', ':path': '/t.S/Echo', 'content-type': 'application/grpc' });
      const out: Answer = { messages: [] };
      req.on('response', (h) => {
        out.status = String(h['grpc-status']);
        resolve(out);
      });
      req.on('error', () => resolve(out));
      // The stream is never ended: the answer must not wait for the rest.
      req.write(big);
    });
    s.destroy();
    expect(a.status).toBe(String(Status.RESOURCE_EXHAUSTED));
  });

  it('bounds request bytes held across calls: past the limit a call is refused, and the budget comes back', async () => {
    const s = session();
    const open: http2.ClientHttp2Stream[] = [];
    const statuses: string[] = [];
    // Each stream sends 900 of the 1000 bytes it announces and waits: five of them pass the 4096-byte budget.
    for (let i = 0; i < 5; i++) {
      const req = s.request({ ':method': 'POST', ':path': '/t.S/Echo', 'content-type': 'application/grpc' });
      req.on('response', (h) => statuses.push(String(h['grpc-status'])));
      req.on('error', () => {});
      const part = Buffer.alloc(905);
      part.writeUInt32BE(1000, 1);
      req.write(part);
      open.push(req);
    }
    await vi.waitFor(() => expect(statuses).toContain(String(Status.RESOURCE_EXHAUSTED)), { timeout: 5000, interval: 20 });
    for (const r of open) r.close(http2.constants.NGHTTP2_CANCEL);
    s.destroy();
    // Everything held was given back (once the server has seen the resets): a call near the single-message limit passes again.
    await vi.waitFor(async () => expect((await call('/t.S/Echo', framed('y'.repeat(1000)))).status).toBe('0'), { timeout: 5000, interval: 20 });
  });

  it('ends a call at its grpc-timeout with DEADLINE_EXCEEDED, and its handler sees it cancelled', async () => {
    const t0 = Date.now();
    const a = await call('/t.S/Hang', framed('d1'), { 'grpc-timeout': '150m' });
    expect(a.status).toBe(String(Status.DEADLINE_EXCEEDED));
    expect(Date.now() - t0).toBeGreaterThanOrEqual(140);
    expect(Date.now() - t0).toBeLessThan(2000);
    expect(seen.cancelled).toEqual(['d1']);
    await vi.waitFor(() => expect(seen.answered).toEqual(['d1']), { timeout: 5000, interval: 10 });
  });

  it('takes a grpc-timeout longer than a Node timer can wait (~24.8 days) as no deadline, not as one passing at once', async () => {
    for (const t of ['99999999H', '2160000S']) {
      const s = session();
      const req = s.request({ ':method': 'POST', ':path': '/t.S/Late', 'content-type': 'application/grpc', 'grpc-timeout': t });
      const got = new Promise<string>((resolve) => {
        let status = '';
        req.on('response', (h) => (status = String(h['grpc-status'] ?? status)));
        req.on('trailers', (tr) => (status = String(tr['grpc-status'])));
        req.on('error', (e) => (status = e.message));
        req.on('close', () => resolve(status));
        req.resume();
      });
      // The request and the answer each take a while: a timer clamped to 1 ms would have fired.
      await new Promise((r) => setTimeout(r, 50));
      req.end(framed('50'));
      expect(await got, t).toBe('0');
      s.close();
    }
  });

  it('tells the handler when the client cancels, and drops the answer that comes later', async () => {
    const s = session();
    const req = s.request({ ':method': 'POST', ':path': '/t.S/Hang', 'content-type': 'application/grpc' });
    req.on('error', () => {});
    req.end(framed('c1'));
    // The handler holds the call before the client cancels it.
    await vi.waitFor(() => expect(server.active).toBe(1), { timeout: 5000, interval: 10 });
    req.close(http2.constants.NGHTTP2_CANCEL);
    await vi.waitFor(() => expect(seen.answered).toEqual(['c1']), { timeout: 5000, interval: 10 });
    s.destroy();
    expect(seen.cancelled).toEqual(['c1']);
    expect(server.active).toBe(0);
  });

  it('calls an answer answered only once the client has taken it all', async () => {
    const huge = new Map<string, Route>([
      [
        '/t.S/Huge',
        route('/t.S/Huge', {
          unary: (c) => {
            c.whenAnswered(() => seen.answered.push('huge'));
            c.respond(null, 'h'.repeat(1 << 20));
          },
        }),
      ],
    ]);
    const local = new RpcServer(huge, { maxReceive: 1024, maxSend: 2 << 20, maxPending: 4096 });
    const { s, close } = await ownServer(local, 'huge');
    const req = s.request({ ':method': 'POST', ':path': '/t.S/Huge', 'content-type': 'application/grpc' });
    req.pause();
    req.end(framed(''));
    await new Promise((r) => setTimeout(r, 300));
    // The client reads nothing: most of the megabyte is still the server's, so the answer is not yet taken.
    expect(seen.answered).toEqual([]);
    let got = 0;
    req.on('data', (d: Buffer) => (got += d.length));
    req.resume();
    await new Promise<void>((r) => req.on('close', () => r()));
    expect(got).toBe(5 + (1 << 20));
    await vi.waitFor(() => expect(seen.answered).toEqual(['huge']), { timeout: 5000, interval: 10 });
    await close();
  });

  it('resets an answer its client does not take, at its deadline or after answerTakeMs, and calls it answered', async () => {
    const huge = new Map<string, Route>([
      [
        '/t.S/Huge',
        route('/t.S/Huge', {
          unary: (c) => {
            c.whenAnswered(() => seen.answered.push(`huge:${String(c.request)}`));
            c.respond(null, 'h'.repeat(1 << 20));
          },
        }),
      ],
    ]);
    const local = new RpcServer(huge, { maxReceive: 1024, maxSend: 2 << 20, maxPending: 4096, answerTakeMs: 400 });
    const { s, close } = await ownServer(local, 'untaken');
    const t0 = Date.now();
    const closedAt = (name: string, headers: Record<string, string>) => {
      const req = s.request({ ':method': 'POST', ':path': '/t.S/Huge', 'content-type': 'application/grpc', ...headers });
      req.on('error', () => {});
      // Never read: the client's window fills and the rest of the megabyte stays with the server.
      req.pause();
      req.end(framed(name));
      return new Promise<number>((r) => req.on('close', () => r(Date.now() - t0)));
    };
    const [byDeadline, byTake] = await Promise.all([closedAt('deadline', { 'grpc-timeout': '150m' }), closedAt('take', {})]);
    // Before: both waited for ever, and whatever waited on their being answered with them.
    expect(byDeadline).toBeGreaterThanOrEqual(140);
    expect(byDeadline).toBeLessThan(380);
    expect(byTake).toBeGreaterThanOrEqual(390);
    expect(byTake).toBeLessThan(2000);
    await vi.waitFor(() => expect([...seen.answered].sort()).toEqual(['huge:deadline', 'huge:take']), { timeout: 5000, interval: 10 });
    await close();
  });

  it('holds each phase to its own time with one timer: reading and handling to the deadline, an answer to answerTakeMs from when it was sent', async () => {
    const local = new RpcServer(
      new Map<string, Route>([
        ['/t.S/Hang', route('/t.S/Hang', { unary: (c) => c.on('cancelled', () => seen.cancelled.push(String(c.request))) })],
        [
          '/t.S/HugeLate',
          route('/t.S/HugeLate', {
            unary: (c) => {
              c.whenAnswered(() => seen.answered.push('late'));
              setTimeout(() => c.respond(null, 'h'.repeat(1 << 20)), Number(c.request));
            },
          }),
        ],
      ]),
      { maxReceive: 1024, maxSend: 2 << 20, maxPending: 4096, answerTakeMs: 150 },
    );
    const { s, close } = await ownServer(local, 'phases');
    try {
      const t0 = Date.now();
      const open = (p: string, headers: Record<string, string>) => {
        const req = s.request({ ':method': 'POST', ':path': p, 'content-type': 'application/grpc', ...headers });
        req.on('error', () => {});
        const result = new Promise<{ ms: number; status: string; message: string }>((resolve) => {
          let status = '';
          let message = '';
          const note = (h: http2.IncomingHttpHeaders) => {
            if (h['grpc-status'] !== undefined) status = String(h['grpc-status']);
            if (h['grpc-message'] !== undefined) message = String(h['grpc-message']);
          };
          req.on('response', note);
          req.on('trailers', note);
          const over = () => resolve({ ms: Date.now() - t0, status, message });
          // A trailers-only answer ends the server's side while the client's may still be open.
          req.on('end', over);
          req.on('close', over);
        });
        return { req, result };
      };
      // A request never finished: cut at its deadline, past the first answerTakeMs.
      const reading = open('/t.S/Hang', { 'grpc-timeout': '400m' });
      reading.req.resume();
      reading.req.write(framed('r').subarray(0, 3));
      // A handler that never answers: cut at its deadline, not at answerTakeMs.
      const handling = open('/t.S/Hang', { 'grpc-timeout': '400m' });
      handling.req.resume();
      handling.req.end(framed('h'));
      // An answer sent after 250 ms that the client never reads: reset answerTakeMs after it was sent.
      const late = open('/t.S/HugeLate', {});
      late.req.pause();
      late.req.end(framed('250'));
      const [r, h, a] = await Promise.all([reading.result, handling.result, late.result]);
      expect(r.status).toBe(String(Status.DEADLINE_EXCEEDED));
      expect(r.message).toBe('deadline passed before the request was read');
      expect(r.ms).toBeGreaterThanOrEqual(390);
      expect(h.status).toBe(String(Status.DEADLINE_EXCEEDED));
      expect(h.message).toBe('deadline exceeded');
      expect(h.ms).toBeGreaterThanOrEqual(390);
      expect(seen.cancelled).toEqual(['h']);
      expect(a.ms).toBeGreaterThanOrEqual(390);
      expect(a.ms).toBeLessThan(2000);
      await new Promise((res) => setTimeout(res, 50));
      expect(seen.answered).toEqual(['late']);
      expect(local.active).toBe(0);
    } finally {
      await close();
    }
  });

  it('refuses to send an answer over the send limit', async () => {
    expect((await call('/t.S/Big', framed('2000'))).messages).toEqual(['x'.repeat(2000)]);
    const a = await call('/t.S/Big', framed('3000'));
    expect(a.status).toBe(String(Status.RESOURCE_EXHAUSTED));
    expect(a.messages).toEqual([]);
  });

  it('streams messages, then a status; an error before any message is trailers-only, after some in the trailers', async () => {
    expect(await call('/t.S/Stream', framed('3'))).toMatchObject({ status: '0', messages: ['m0', 'm1', 'm2'] });
    expect(await call('/t.S/Stream', framed('-1'))).toMatchObject({ status: String(Status.INVALID_ARGUMENT), messages: [] });
    expect(await call('/t.S/Stream', framed('2.5'))).toMatchObject({ status: String(Status.ABORTED), message: 'half way', messages: ['m0', 'm1'] });
  });

  it('parses grpc-timeout in every unit and ignores malformed ones', () => {
    expect(parseTimeout('2H')).toBe(7_200_000);
    expect(parseTimeout('3M')).toBe(180_000);
    expect(parseTimeout('4S')).toBe(4000);
    expect(parseTimeout('5m')).toBe(5);
    expect(parseTimeout('6000u')).toBe(6);
    expect(parseTimeout('7000000n')).toBe(7);
    for (const bad of ['', '1', 'S', '123456789S', '-1S', '1.5S', '1s']) expect(parseTimeout(bad)).toBeUndefined();
  });
});

describe('RpcServer shutdown', () => {
  it('lets a running call finish, refuses new ones, then resolves', async () => {
    const local = new RpcServer(routes, limits);
    const { s, lsock, listener: l } = await ownServer(local, 'shut');
    const running = call('/t.S/Late', framed('200'), {}, s);
    await new Promise((r) => setTimeout(r, 50));
    const t0 = Date.now();
    const shut = local.shutdown(5000);
    const later = http2.connect('http://localhost', { createConnection: () => net.connect(lsock) });
    later.on('error', () => {});
    const refused = await call('/t.S/Echo', framed('no'), {}, later);
    // Refused by GOAWAY (the client's library fails the call) or, for a stream already on its way, UNAVAILABLE.
    expect(refused.messages).toEqual([]);
    expect(refused.error !== undefined || refused.status === String(Status.UNAVAILABLE)).toBe(true);
    expect((await running).messages).toEqual(['late']);
    await shut;
    expect(Date.now() - t0).toBeLessThan(2000);
    l.close();
  });
});

describe('RpcServer stream limits', () => {
  it('advertises a per-connection stream limit, and ends a connection that opens one past the limit over all of them', async () => {
    const local = new RpcServer(routes, { ...limits, maxStreamsPerConnection: 3, maxStreams: 4 });
    const lsock = path.join(dir, 'streams.sock');
    const l = net.createServer((c) => local.attach(c));
    await new Promise<void>((r) => l.listen(lsock, r));
    const connect = () => {
      const s = http2.connect('http://localhost', { createConnection: () => net.connect(lsock) });
      s.on('error', () => {});
      return s;
    };
    const hang = (s: http2.ClientHttp2Session, n: number) => {
      for (let i = 0; i < n; i++) {
        const req = s.request({ ':method': 'POST', ':path': '/t.S/Hang', 'content-type': 'application/grpc' });
        req.on('error', () => {});
        // Headers only: the request is never finished.
        req.write(Buffer.alloc(1));
      }
    };
    const a = connect();
    await new Promise<void>((r) => a.once('remoteSettings', () => r()));
    // Node's default is no limit at all.
    expect(a.remoteSettings.maxConcurrentStreams).toBe(3);
    hang(a, 3);
    const b = connect();
    hang(b, 1);
    await vi.waitFor(() => expect(local.streams).toBe(4), { timeout: 5000, interval: 10 });
    // Four streams are open over two connections: a third connection asking for one more is ended.
    const c = connect();
    const goaway = new Promise<number>((r) => c.once('goaway', (code: number) => r(code)));
    hang(c, 1);
    expect(await goaway).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(a.destroyed || a.closed).toBe(false);
    expect(b.destroyed || b.closed).toBe(false);
    for (const s of [a, b, c]) s.destroy();
    // Their streams are given back: a new call is answered.
    await vi.waitFor(() => expect(local.streams).toBe(0), { timeout: 5000, interval: 10 });
    const answered = await call('/t.S/Echo', framed('again'), {}, connect());
    expect(answered.messages).toEqual(['echo:again']);
    await local.shutdown(100);
    l.close();
  });
});

describe('RpcServer streams a client never finishes', () => {
  it('gives a stream back once it is answered, whether or not its client ends its request: deadline, no deadline, refused', async () => {
    // Before: a stream answered DEADLINE_EXCEEDED (or refused) before its client ended it stayed open
    // for as long as the client liked, held under both stream limits: 4096 of them locked every client out.
    const local = new RpcServer(routes, { ...limits, maxStreamsPerConnection: 4, maxStreams: 8, answerTakeMs: 300 });
    const { s, close } = await ownServer(local, 'unfinished');
    try {
      const t0 = Date.now();
      const unfinished = (p: string, headers: Record<string, string>) =>
        new Promise<{ status: string; ms: number; closed: number }>((resolve) => {
          const req = s.request({ ':method': 'POST', ':path': p, 'content-type': 'application/grpc', ...headers });
          req.on('error', () => {});
          let status = '';
          let ms = 0;
          req.on('response', (h) => {
            status = String(h['grpc-status']);
            ms = Date.now() - t0;
          });
          req.on('close', () => resolve({ status, ms, closed: Date.now() - t0 }));
          req.resume();
          // Part of a message, and the request is never ended.
          req.write(framed('abcdef').subarray(0, 7));
        });
      const got = await Promise.all([
        unfinished('/t.S/Echo', { 'grpc-timeout': '100m' }),
        unfinished('/t.S/Echo', {}),
        unfinished('/t.S/Nothing', {}),
        unfinished('/t.S/Echo', { 'grpc-encoding': 'snappy' }),
      ]);
      expect(got.map((g) => g.status)).toEqual([String(Status.DEADLINE_EXCEEDED), String(Status.CANCELLED), String(Status.UNIMPLEMENTED), String(Status.UNIMPLEMENTED)]);
      expect(got[0]!.ms).toBeGreaterThanOrEqual(90);
      // No deadline: the request has answerTakeMs to come whole.
      expect(got[1]!.ms).toBeGreaterThanOrEqual(290);
      for (const g of got) expect(g.closed).toBeLessThan(1500);
      // All four places on the connection are free again: four more calls on it are answered.
      const again = await Promise.all([0, 1, 2, 3].map((i) => call('/t.S/Echo', framed(`a${i}`), {}, s)));
      expect(again.map((a) => a.messages)).toEqual([['echo:a0'], ['echo:a1'], ['echo:a2'], ['echo:a3']]);
      expect(local.active).toBe(0);
    } finally {
      await close();
    }
  });

  it('ends a compressed request still waiting for its turn to be inflated at its deadline, and skips inflating it', async () => {
    const local = new RpcServer(routes, { maxReceive: 16 << 20, maxSend: 1024, maxPending: 64 << 20 });
    const { s, close } = await ownServer(local, 'inflate-deadline');
    try {
      // Each inflates to 16 MiB of zeros, tens of ms of CPU: twenty of them queue for a second or more.
      const bomb = framed(zlib.gzipSync(Buffer.alloc((16 << 20) - 16)), 1);
      const slow = Array.from({ length: 20 }, () => call('/t.S/Big', bomb, { 'grpc-encoding': 'gzip' }, s));
      const t0 = Date.now();
      const late = await call('/t.S/Echo', framed(zlib.gzipSync('x'), 1), { 'grpc-encoding': 'gzip', 'grpc-timeout': '100m' }, s);
      const ms = Date.now() - t0;
      expect(late.status).toBe(String(Status.DEADLINE_EXCEEDED));
      expect(late.message).toBe('deadline passed before the request was inflated');
      // Before: it was answered only once its turn came, after every inflation queued ahead of it.
      expect(ms).toBeLessThan(400);
      await Promise.all(slow);
    } finally {
      await close();
    }
  }, 30_000);
});
