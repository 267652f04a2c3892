/**
 * skiff's gRPC server: unary and server-streaming calls over node:http2, in
 * the daemon's own process. It replaces grpc-js on the serving side, which
 * cost a second socket hop per call (grpc-js could not take the Go clients'
 * `:authority`, see h2-authority-proxy.ts) and about 12 MiB of idle memory.
 *
 * What a client can make it hold is bounded: one request message is at most
 * `maxReceive` bytes, and request bytes not yet handed to a handler, across
 * all calls, at most `maxPending`. A call with a `grpc-timeout` ends with
 * DEADLINE_EXCEEDED when it passes, and its handler sees it cancelled.
 */
import http2 from 'node:http2';
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import zlib from 'node:zlib';
import { Status, type ServiceError } from './status.js';

export interface Route {
  /** The full path, /package.Service/Method. */
  path: string;
  responseStream: boolean;
  decode(buf: Buffer): unknown;
  /** Encodes an answer; an answer that is already a Buffer is sent as it is (see EncodedList). */
  encode(msg: unknown): Buffer;
  unary?: (call: UnaryCall) => void;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  stream?: (call: ServerStream<any>) => void;
}

export interface RpcLimits {
  /** Bytes of one request message. */
  maxReceive: number;
  /** Bytes of one answer message. */
  maxSend: number;
  /** Request bytes buffered and not yet handed to a handler, over all calls at once. */
  maxPending: number;
  /** Milliseconds a client has to take a unary answer once it is sent (its deadline, if sooner); then the stream is reset. */
  answerTakeMs?: number;
  /** Streams open at once on one connection (SETTINGS_MAX_CONCURRENT_STREAMS); past it nghttp2 refuses them. */
  maxStreamsPerConnection?: number;
  /** Streams open at once over all connections; a connection opening one more is ended (GOAWAY ENHANCE_YOUR_CALM). */
  maxStreams?: number;
}

/** An open stream costs ~4.5 KiB of Node's and nghttp2's memory before any request byte: 4096 of them ~18 MiB. */
export const DEFAULT_RPC_LIMITS: RpcLimits = { maxReceive: 16 << 20, maxSend: 16 << 20, maxPending: 64 << 20, maxStreamsPerConnection: 128, maxStreams: 4096, answerTakeMs: 60_000 };

/** What a handler sees of a call. 'cancelled' fires once if the client goes away or the deadline passes first. */
export class CallBase<Req = unknown> extends EventEmitter {
  cancelled = false;
  /** Set by the server once the call is over, whichever way. */
  protected finished = false;
  private readonly answered: Array<() => void> = [];
  private closed = false;

  constructor(
    readonly path: string,
    readonly request: Req,
    /** Milliseconds since the epoch, or Infinity. */
    readonly deadline: number,
  ) {
    super();
  }

  /** Runs `fn` once the call's answer has been taken by the client, or the call ended otherwise. */
  whenAnswered(fn: () => void): void {
    if (this.closed) fn();
    else this.answered.push(fn);
  }

  /** True once the call has been answered or cancelled. */
  get ended(): boolean {
    return this.finished || this.cancelled;
  }

  /** @internal */
  cancel(): void {
    if (this.cancelled || this.finished) return;
    this.cancelled = true;
    this.emit('cancelled');
  }

  /** @internal */
  closeCall(): void {
    if (this.closed) return;
    this.closed = true;
    for (const fn of this.answered.splice(0)) fn();
    this.emit('close');
  }
}

export class UnaryCall extends CallBase {
  constructor(
    path: string,
    request: unknown,
    deadline: number,
    private readonly reply: (err: ServiceError | null, res?: unknown) => void,
  ) {
    super(path, request, deadline);
  }

  /** Answers the call; later answers, and answers after a cancel, are dropped. */
  respond(err: ServiceError | null, res?: unknown): void {
    if (this.finished) return;
    this.finished = true;
    if (!this.cancelled) this.reply(err, res);
  }
}

/** A server-streaming call: write messages, then end() or fail(). */
export class ServerStream<Req = unknown> extends CallBase<Req> {
  private pending = 0;

  constructor(
    path: string,
    request: Req,
    deadline: number,
    private readonly out: { write(msg: unknown, done: () => void): boolean; finish(err: ServiceError | null): void },
  ) {
    super(path, request, deadline);
  }

  /** Messages written and not yet handed to the connection. */
  get writableLength(): number {
    return this.pending;
  }

  /** False when the client is not keeping up (the message is still queued). */
  write(msg: unknown): boolean {
    if (this.finished || this.cancelled) return false;
    this.pending++;
    return this.out.write(msg, () => this.pending--);
  }

  end(): void {
    if (this.finished) return;
    this.finished = true;
    if (!this.cancelled) this.out.finish(null);
  }

  fail(err: ServiceError): void {
    if (this.finished) return;
    this.finished = true;
    if (!this.cancelled) this.out.finish(err);
  }
}

const { HTTP2_HEADER_PATH, HTTP2_HEADER_METHOD, HTTP2_HEADER_CONTENT_TYPE, HTTP2_HEADER_STATUS } = http2.constants;

/** grpc-timeout: at most 8 digits and a unit (hours down to nanoseconds). */
const TIMEOUT = /^(\d{1,8})([HMSmun])$/;
const UNIT_MS: Record<string, number> = { H: 3_600_000, M: 60_000, S: 1000, m: 1, u: 1e-3, n: 1e-6 };

/** The longest delay setTimeout takes as it is. */
const MAX_TIMER_MS = 2 ** 31 - 1;

export function parseTimeout(v: string | undefined): number | undefined {
  if (v === undefined) return undefined;
  const m = TIMEOUT.exec(v);
  if (!m) return undefined;
  return Number(m[1]) * UNIT_MS[m[2]!]!;
}

/** grpc-message is percent-encoded: everything outside printable ASCII, and '%' itself. */
export function encodeMessage(s: string): string {
  let out = '';
  for (const b of Buffer.from(s, 'utf8')) out += b >= 0x20 && b <= 0x7e && b !== 0x25 ? String.fromCharCode(b) : `%${b.toString(16).toUpperCase().padStart(2, '0')}`;
  return out;
}

function grpcError(code: Status, details: string): ServiceError {
  return { code, details };
}

export class RpcServer {
  private readonly h2: http2.Http2Server;
  private readonly sessions = new Set<http2.ServerHttp2Session>();
  private readonly calls = new Set<CallBase>();
  private pendingBytes = 0;
  private openStreams = 0;
  /** Inflations waiting, the running one first. */
  private readonly inflateQueue: Array<(next: () => void) => void> = [];
  private draining = false;
  private readonly idle = new EventEmitter();
  /** Told of every call's start and end, with its path (the daemon's idle-memory release watches for quiet). */
  onActivity: (path: string) => void = () => {};

  constructor(
    private readonly routes: Map<string, Route>,
    private readonly limits: RpcLimits = DEFAULT_RPC_LIMITS,
    private readonly onError: (what: string, err: Error) => void = () => {},
  ) {
    // Node's own per-session cap on queued data behaves badly when reached; bounds are kept here instead.
    this.h2 = http2.createServer({
      maxSessionMemory: Number.MAX_SAFE_INTEGER,
      // Node's default is no limit: one client could open streams until the daemon ran out of memory.
      settings: { maxConcurrentStreams: limits.maxStreamsPerConnection ?? DEFAULT_RPC_LIMITS.maxStreamsPerConnection! },
    });
    this.h2.on('session', (s) => {
      this.sessions.add(s);
      s.on('close', () => this.sessions.delete(s));
      s.on('error', (err) => this.onError('session', err));
      if (this.draining) s.close();
    });
    this.h2.on('stream', (stream, headers) => this.onStream(stream, headers));
    this.h2.on('sessionError', (err) => this.onError('session', err));
  }

  /** Serves HTTP/2 on a connection (a socket, or the authority rewriter's duplex). */
  attach(conn: Duplex): void {
    this.h2.emit('connection', conn);
  }

  /** Calls not yet ended. */
  get active(): number {
    return this.calls.size;
  }

  /**
   * New calls are refused (UNAVAILABLE); resolves once the running ones are answered and their answers
   * taken, or after `graceMs` with them cut off. An answer its client does not take (it stopped reading)
   * is waited for at most `flushMs` once every handler is done: such a client cannot hold the daemon's
   * exit for the whole grace period.
   */
  async shutdown(graceMs: number, flushMs = 1000): Promise<void> {
    this.draining = true;
    for (const s of this.sessions) s.close();
    const until = Date.now() + graceMs;
    let flushUntil = Infinity;
    while (this.calls.size > 0 && Date.now() < Math.min(until, flushUntil)) {
      if (flushUntil === Infinity && [...this.calls].every((c) => c.ended)) flushUntil = Date.now() + flushMs;
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, 50);
        this.idle.once('idle', () => {
          clearTimeout(t);
          resolve();
        });
      });
      this.idle.removeAllListeners('idle');
    }
    for (const s of this.sessions) s.destroy();
  }

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', () => {});
    this.onActivity(String(headers[':path'] ?? ''));
    // Many connections each at their own limit still add up: over all of them, streams are bounded too.
    if (this.openStreams >= (this.limits.maxStreams ?? DEFAULT_RPC_LIMITS.maxStreams!)) {
      // Refused one by one, each stream would still cost what Node builds for it (~5 KiB) for as long as
      // the client keeps sending: the connection asking for more at the limit is ended instead
      // (ENHANCE_YOUR_CALM), which frees its streams and stops reading what else it sent.
      const session = stream.session;
      stream.close(http2.constants.NGHTTP2_REFUSED_STREAM);
      if (session && !session.destroyed) {
        session.goaway(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
        session.destroy();
      }
      return;
    }
    this.openStreams++;
    stream.once('close', () => this.openStreams--);
    const path = String(headers[HTTP2_HEADER_PATH] ?? '');
    if (headers[HTTP2_HEADER_METHOD] !== 'POST') return this.plain(stream, 405);
    const ct = headers[HTTP2_HEADER_CONTENT_TYPE];
    if (typeof ct !== 'string' || !ct.startsWith('application/grpc')) return this.plain(stream, 415);
    const route = this.routes.get(path);
    if (!route) return this.trailersOnly(stream, grpcError(Status.UNIMPLEMENTED, `unknown method ${path}`));
    if (this.draining) return this.trailersOnly(stream, grpcError(Status.UNAVAILABLE, 'skiff is shutting down'));
    const encoding = headers['grpc-encoding'];
    const enc = typeof encoding === 'string' ? encoding : 'identity';
    if (enc !== 'identity' && enc !== 'gzip' && enc !== 'deflate') {
      return this.trailersOnly(stream, grpcError(Status.UNIMPLEMENTED, `request compression "${enc}" is not supported`));
    }
    const timeoutMs = parseTimeout(headers['grpc-timeout'] as string | undefined);
    // Node fires a timer set past 2^31-1 ms (~24.8 days) after 1 ms: a deadline that far off is taken as none.
    const deadline = timeoutMs === undefined || timeoutMs > MAX_TIMER_MS ? Infinity : Date.now() + timeoutMs;
    this.readRequest(stream, route, enc, deadline);
  }

  private readRequest(stream: http2.ServerHttp2Stream, route: Route, enc: string, deadline: number): void {
    // The request is copied into one buffer of its own as it comes: HTTP/2 hands each DATA frame over as a
    // view of the whole read it came in, so keeping the chunks would keep ~100 bytes of objects per frame and
    // every read a one-byte frame arrived in, far more than the bytes counted.
    let buf = Buffer.alloc(0);
    let used = 0;
    let failed = false;
    const release = () => {
      this.pendingBytes -= buf.length;
      buf = Buffer.alloc(0);
    };
    const fail = (err: ServiceError) => {
      if (failed) return;
      failed = true;
      release();
      this.trailersOnly(stream, err);
    };
    // A client that never finishes its request is not waited on past its deadline.
    let timer: NodeJS.Timeout | undefined;
    if (deadline !== Infinity) {
      timer = setTimeout(() => fail(grpcError(Status.DEADLINE_EXCEEDED, 'deadline passed before the request was read')), Math.max(0, deadline - Date.now()));
    }
    stream.on('data', (c: Buffer) => {
      if (failed) return;
      const need = used + c.length;
      if (need > this.limits.maxReceive + 5) {
        fail(grpcError(Status.RESOURCE_EXHAUSTED, `received message larger than max (more than ${this.limits.maxReceive} bytes)`));
        return;
      }
      if (need > buf.length) {
        // Doubling: what is held is at most twice what came, and each byte is copied a bounded number of times.
        const size = Math.min(Math.max(need, 2 * buf.length, 256), this.limits.maxReceive + 5);
        if (this.pendingBytes + size - buf.length > this.limits.maxPending) {
          fail(grpcError(Status.RESOURCE_EXHAUSTED, 'too many request bytes in flight; try again'));
          return;
        }
        const grown = Buffer.allocUnsafeSlow(size);
        buf.copy(grown, 0, 0, used);
        this.pendingBytes += size - buf.length;
        buf = grown;
      }
      c.copy(buf, used);
      used = need;
    });
    let inflating = false;
    stream.on('close', () => {
      clearTimeout(timer);
      if (!failed) {
        failed = true;
        // A request waiting to be inflated stays counted until its turn is over.
        if (!inflating) release();
      }
    });
    stream.on('end', () => {
      clearTimeout(timer);
      if (failed) return;
      const deliver = (msg: Buffer) => {
        if (failed) return;
        let request: unknown;
        try {
          request = route.decode(msg);
        } catch (err) {
          fail(grpcError(Status.INTERNAL, `cannot parse the request to ${route.path}: ${(err as Error).message}`));
          return;
        }
        failed = true;
        release();
        if (stream.destroyed) return;
        this.dispatch(stream, route, request, deadline);
      };
      let msg: { body: Buffer; compressed: boolean };
      try {
        msg = this.oneMessage(buf.subarray(0, used), enc);
      } catch (err) {
        fail(err as ServiceError);
        return;
      }
      if (!msg.compressed) return deliver(msg.body);
      // What is held stays counted until it is inflated.
      inflating = true;
      this.inflate(msg.body, enc, () => !stream.destroyed, (err, out) => {
        inflating = false;
        if (failed) release();
        else if (err) fail(err);
        else deliver(out!);
      });
    });
  }

  /**
   * Inflates one request at a time, off the event loop: a 16 KiB request that inflates to 16 MiB takes
   * ~60 ms of CPU, and done in line a client sending a few of them a second kept every other call waiting.
   */
  private inflate(body: Buffer, enc: string, wanted: () => boolean, done: (err: ServiceError | null, out?: Buffer) => void): void {
    const run = (next: () => void) => {
      if (!wanted()) {
        next();
        return done(grpcError(Status.CANCELLED, 'the client went away'));
      }
      const opts = { maxOutputLength: this.limits.maxReceive };
      const cb = (err: Error | null, out: Buffer) => {
        next();
        if (!err) return done(null, out);
        const big = (err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE' || err instanceof RangeError;
        done(grpcError(big ? Status.RESOURCE_EXHAUSTED : Status.INTERNAL, big ? `received message larger than max once inflated (more than ${this.limits.maxReceive} bytes)` : `cannot decompress the request: ${err.message}`));
      };
      if (enc === 'gzip') zlib.gunzip(body, opts, cb);
      else zlib.inflate(body, opts, cb);
    };
    this.inflateQueue.push(run);
    if (this.inflateQueue.length === 1) this.inflateNext();
  }

  private inflateNext(): void {
    const run = this.inflateQueue[0];
    if (!run) return;
    run(() => {
      this.inflateQueue.shift();
      this.inflateNext();
    });
  }

  /** The one length-prefixed message a unary or server-streaming request carries, not yet inflated. */
  private oneMessage(buf: Buffer, enc: string): { body: Buffer; compressed: boolean } {
    if (buf.length < 5) throw grpcError(Status.INTERNAL, 'the request carries no message');
    const compressed = buf[0]!;
    const len = buf.readUInt32BE(1);
    if (len > this.limits.maxReceive) throw grpcError(Status.RESOURCE_EXHAUSTED, `received message larger than max (${len} vs. ${this.limits.maxReceive})`);
    if (buf.length !== 5 + len) throw grpcError(Status.INTERNAL, buf.length < 5 + len ? 'the request message is cut short' : 'expected one request message, got more');
    const body = buf.subarray(5);
    if (compressed === 0) return { body, compressed: false };
    if (compressed !== 1 || enc === 'identity') throw grpcError(Status.INTERNAL, 'compressed message without a compression encoding');
    return { body, compressed: true };
  }

  private dispatch(stream: http2.ServerHttp2Stream, route: Route, request: unknown, deadline: number): void {
    let takeTimer: NodeJS.Timeout | undefined;
    let call: CallBase;
    let answerError: (err: ServiceError) => void;
    if (route.responseStream) {
      const s = new ServerStreamWriter(stream, route, this.limits);
      const sc = new ServerStream(route.path, request, deadline, s);
      call = sc;
      answerError = (err) => sc.fail(err);
    } else {
      call = new UnaryCall(route.path, request, deadline, (err, res) => {
        if (err) return this.trailersOnly(stream, err);
        let body: Buffer;
        try {
          body = Buffer.isBuffer(res) ? res : route.encode(res);
        } catch (e) {
          return this.trailersOnly(stream, grpcError(Status.INTERNAL, `cannot encode the answer: ${(e as Error).message}`));
        }
        if (body.length > this.limits.maxSend) {
          return this.trailersOnly(stream, grpcError(Status.RESOURCE_EXHAUSTED, `answer of ${body.length} bytes is larger than the ${this.limits.maxSend} bytes skiff sends`));
        }
        sendOne(stream, body);
        // An answer the client does not take is not held for ever: what it holds (the daemon's memory, and
        // budgets released only once it is taken, like ExecSync's output) comes back at the client's
        // deadline, or `answerTakeMs` after the answer was sent if that comes first.
        if (!stream.closed && !stream.destroyed) {
          const by = Math.min(deadline, Date.now() + (this.limits.answerTakeMs ?? DEFAULT_RPC_LIMITS.answerTakeMs!));
          takeTimer = setTimeout(() => stream.close(http2.constants.NGHTTP2_CANCEL), Math.max(0, by - Date.now()));
        }
      });
      answerError = (err) => (call as UnaryCall).respond(err);
    }
    this.calls.add(call);
    let timer: NodeJS.Timeout | undefined;
    const ended = () => {
      clearTimeout(timer);
      clearTimeout(takeTimer);
      if (!this.calls.delete(call)) return;
      this.onActivity(route.path);
      call.cancel();
      call.closeCall();
      if (this.calls.size === 0) this.idle.emit('idle');
    };
    stream.on('close', ended);
    if (deadline !== Infinity) {
      timer = setTimeout(() => {
        if (call.ended) return;
        // The handler learns first, then the client gets its status; whatever the handler answers later is dropped.
        call.cancel();
        this.trailersOnly(stream, grpcError(Status.DEADLINE_EXCEEDED, 'deadline exceeded'));
      }, Math.max(0, deadline - Date.now()));
    }
    try {
      if (route.responseStream) route.stream!(call as ServerStream);
      else route.unary!(call as UnaryCall);
    } catch (err) {
      answerError(grpcError(Status.UNKNOWN, (err as Error).message));
    }
  }

  private plain(stream: http2.ServerHttp2Stream, status: number): void {
    if (stream.destroyed || stream.headersSent) return;
    stream.respond({ [HTTP2_HEADER_STATUS]: status }, { endStream: true });
  }

  private trailersOnly(stream: http2.ServerHttp2Stream, err: ServiceError): void {
    if (stream.destroyed || stream.closed) return;
    if (stream.headersSent) {
      // Headers went out already: the status goes in trailers after what was written.
      endWithStatus(stream, err);
      return;
    }
    stream.respond(
      { [HTTP2_HEADER_STATUS]: 200, [HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc', 'grpc-status': String(err.code), 'grpc-message': encodeMessage(err.details) },
      { endStream: true },
    );
    // Whatever the client still sends is not wanted.
    stream.resume();
  }
}

const RESPONSE_HEADERS = { [HTTP2_HEADER_STATUS]: 200, [HTTP2_HEADER_CONTENT_TYPE]: 'application/grpc', 'grpc-accept-encoding': 'identity,gzip,deflate' };

function frameHeader(len: number): Buffer {
  const h = Buffer.allocUnsafe(5);
  h[0] = 0;
  h.writeUInt32BE(len, 1);
  return h;
}

function sendOne(stream: http2.ServerHttp2Stream, body: Buffer): void {
  if (stream.destroyed || stream.closed) return;
  stream.respond(RESPONSE_HEADERS, { waitForTrailers: true });
  stream.once('wantTrailers', () => stream.sendTrailers({ 'grpc-status': '0' }));
  // Small answers go out as one DATA frame.
  if (body.length < 16 << 10) stream.end(Buffer.concat([frameHeader(body.length), body]));
  else {
    stream.write(frameHeader(body.length));
    stream.end(body);
  }
}

function endWithStatus(stream: http2.ServerHttp2Stream, err: ServiceError | null): void {
  if (stream.destroyed || stream.closed || stream.writableEnded) return;
  const trailers = err ? { 'grpc-status': String(err.code), 'grpc-message': encodeMessage(err.details) } : { 'grpc-status': '0' };
  stream.once('wantTrailers', () => stream.sendTrailers(trailers));
  stream.end();
}

class ServerStreamWriter {
  private started = false;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly route: Route,
    private readonly limits: RpcLimits,
  ) {}

  write(msg: unknown, done: () => void): boolean {
    const s = this.stream;
    if (s.destroyed || s.closed) {
      done();
      return false;
    }
    const body = Buffer.isBuffer(msg) ? msg : this.route.encode(msg);
    if (body.length > this.limits.maxSend) {
      done();
      this.finish(grpcError(Status.RESOURCE_EXHAUSTED, `message of ${body.length} bytes is larger than the ${this.limits.maxSend} bytes skiff sends`));
      return false;
    }
    if (!this.started) {
      this.started = true;
      s.respond(RESPONSE_HEADERS, { waitForTrailers: true });
    }
    return s.write(Buffer.concat([frameHeader(body.length), body]), () => done());
  }

  finish(err: ServiceError | null): void {
    const s = this.stream;
    if (s.destroyed || s.closed || s.writableEnded) return;
    if (!this.started) {
      this.started = true;
      if (err) {
        s.respond({ ...RESPONSE_HEADERS, 'grpc-status': String(err.code), 'grpc-message': encodeMessage(err.details) }, { endStream: true });
        return;
      }
      s.respond(RESPONSE_HEADERS, { waitForTrailers: true });
    }
    endWithStatus(s, err);
  }
}

