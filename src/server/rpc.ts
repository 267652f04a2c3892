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
  /**
   * Milliseconds a client has to take a unary answer once it is sent (its deadline, if sooner); then the stream is reset.
   * A request with no deadline must also be sent whole within it.
   */
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

  /** HTTP/2 streams open over every connection (what maxStreams bounds). */
  get streams(): number {
    return this.openStreams;
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

  private readonly streamClosed = (): void => {
    this.openStreams--;
  };

  private onStream(stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders): void {
    stream.on('error', ignore);
    const path = String(headers[HTTP2_HEADER_PATH] ?? '');
    this.onActivity(path);
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
    // A refused stream is answered at once; a client that then never ends its side would keep the stream
    // (and its place under both stream limits) for ever: it is reset once the answer is out (NO_ERROR, RFC 9113 8.1).
    const refuse = (): void => {
      stream.once('close', this.streamClosed);
      if (!stream.endAfterHeaders) stopReading(stream);
    };
    if (headers[HTTP2_HEADER_METHOD] !== 'POST') return (this.plain(stream, 405), refuse());
    const ct = headers[HTTP2_HEADER_CONTENT_TYPE];
    if (typeof ct !== 'string' || !ct.startsWith('application/grpc')) return (this.plain(stream, 415), refuse());
    const route = this.routes.get(path);
    if (!route) return (this.trailersOnly(stream, grpcError(Status.UNIMPLEMENTED, `unknown method ${path}`)), refuse());
    if (this.draining) return (this.trailersOnly(stream, grpcError(Status.UNAVAILABLE, 'skiff is shutting down')), refuse());
    const encoding = headers['grpc-encoding'];
    const enc = typeof encoding === 'string' ? encoding : 'identity';
    if (enc !== 'identity' && enc !== 'gzip' && enc !== 'deflate') {
      return (this.trailersOnly(stream, grpcError(Status.UNIMPLEMENTED, `request compression "${enc}" is not supported`)), refuse());
    }
    const timeoutMs = parseTimeout(headers['grpc-timeout'] as string | undefined);
    // Node fires a timer set past 2^31-1 ms (~24.8 days) after 1 ms: a deadline that far off is taken as none.
    const deadline = timeoutMs === undefined || timeoutMs > MAX_TIMER_MS ? Infinity : Date.now() + timeoutMs;
    new Exchange(this, stream, route, enc, deadline);
  }

  /** @internal Request bytes held and not yet handed to a handler: `delta` more (or fewer); false past the budget. */
  holdPending(delta: number): boolean {
    if (delta > 0 && this.pendingBytes + delta > this.limits.maxPending) return false;
    this.pendingBytes += delta;
    return true;
  }

  /** @internal */
  get rpcLimits(): RpcLimits {
    return this.limits;
  }

  /** @internal A call has started: it counts until it is over. */
  callStarted(call: CallBase): void {
    this.calls.add(call);
  }

  /** @internal The stream of a call or a request being read has closed. */
  exchangeClosed(call: CallBase | undefined, path: string): void {
    this.openStreams--;
    if (!call || !this.calls.delete(call)) return;
    this.onActivity(path);
    call.cancel();
    call.closeCall();
    if (this.calls.size === 0) this.idle.emit('idle');
  }

  /**
   * Inflates one request at a time, off the event loop: a 16 KiB request that inflates to 16 MiB takes
   * ~60 ms of CPU, and done in line a client sending a few of them a second kept every other call waiting.
   */
  /** @internal */
  inflate(body: Buffer, enc: string, wanted: () => boolean, done: (err: ServiceError | null, out?: Buffer) => void): void {
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
  /** @internal */
  oneMessage(buf: Buffer, enc: string): { body: Buffer; compressed: boolean } {
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

  private plain(stream: http2.ServerHttp2Stream, status: number): void {
    if (stream.destroyed || stream.headersSent) return;
    stream.respond({ [HTTP2_HEADER_STATUS]: status }, { endStream: true });
  }

  /** @internal */
  trailersOnly(stream: http2.ServerHttp2Stream, err: ServiceError): void {
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

function sendOkTrailers(this: http2.ServerHttp2Stream): void {
  this.sendTrailers({ 'grpc-status': '0' });
}

function sendOne(stream: http2.ServerHttp2Stream, body: Buffer): void {
  if (stream.destroyed || stream.closed) return;
  stream.respond(RESPONSE_HEADERS, { waitForTrailers: true });
  stream.once('wantTrailers', sendOkTrailers);
  // Small answers go out as one DATA frame.
  if (body.length < 16 << 10) stream.end(Buffer.concat([frameHeader(body.length), body]));
  else {
    // Both parts in one write to the session, not two.
    stream.cork();
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


function ignore(): void {}

/**
 * The answer is out but the client has not ended its request: it is told to stop sending (RST_STREAM
 * NO_ERROR, after the answer), so the stream does not stay open, counted under the stream limits, for
 * as long as the client likes.
 */
function stopReading(stream: http2.ServerHttp2Stream): void {
  if (!stream.destroyed && !stream.closed && !stream.readableEnded) stream.close(http2.constants.NGHTTP2_NO_ERROR);
}

const EMPTY = Buffer.alloc(0);

/** Where an exchange is: what its one timer does when it fires depends on it. */
const READING = 0;
/** The request is read and waits to be inflated: the deadline is looked at once it is handed over. */
const INFLATING = 1;
const HANDLING = 2;
/** A unary answer was sent: the client has until its deadline, or `answerTakeMs`, to take it. */
const ANSWERED = 3;
const OVER = 4;

/**
 * One stream from its request's first byte until it closes. It keeps one timer, not one per phase:
 * the request's deadline while it is read, the call's while the handler runs, and the time the client
 * has to take the answer. Armed once for whichever could come first, it is moved on only when it fires
 * before what is due (a call running longer than `answerTakeMs`); three timers per call, each with a
 * delay of its own, cost ~10 µs of every warm call and several times that on the first ones.
 */
class Exchange {
  private phase = READING;
  private buf = EMPTY;
  private used = 0;
  /** The request's buffer is released, and nothing more is read into it. */
  private done = false;
  private timer: NodeJS.Timeout | undefined;
  /** When the timer fires, ms since the epoch. */
  private due = 0;
  private sentAt = 0;
  private call: CallBase | undefined;

  constructor(
    private readonly server: RpcServer,
    private readonly stream: http2.ServerHttp2Stream,
    private readonly route: Route,
    private readonly enc: string,
    /** Milliseconds since the epoch, or Infinity. */
    private readonly deadline: number,
  ) {
    stream.on('data', this.onData);
    stream.on('end', this.onEnd);
    stream.on('close', this.onClose);
    // A client that never finishes its request is not waited on past its deadline, nor, without one,
    // past `answerTakeMs`.
    this.arm(Date.now());
  }

  private get take(): number {
    return this.server.rpcLimits.answerTakeMs ?? DEFAULT_RPC_LIMITS.answerTakeMs!;
  }

  /**
   * Sets the timer for what could be due first from `now` on: the deadline, unless the time to take an
   * answer sent now would end sooner (then it fires early, and is moved on if nothing is due yet).
   */
  private arm(now: number): void {
    const window = now + this.take;
    this.due = this.deadline <= window ? this.deadline : window;
    this.timer = setTimeout(this.onTimer, Math.max(0, this.due - now));
  }

  private readonly onTimer = (): void => {
    this.timer = undefined;
    const atDeadline = this.due === this.deadline;
    switch (this.phase) {
      case READING:
        if (atDeadline) this.fail(grpcError(Status.DEADLINE_EXCEEDED, 'deadline passed before the request was read'));
        else if (this.deadline === Infinity) this.fail(grpcError(Status.CANCELLED, `the request was not sent within ${this.take} ms`));
        else this.arm(Date.now());
        return;
      case INFLATING:
        // Still waiting its turn (or being inflated): the client hears at its deadline, and the
        // inflation is skipped if it has not started. What is held stays counted until the turn is over.
        if (!atDeadline) this.arm(Date.now());
        else if (!this.done) {
          this.done = true;
          this.server.trailersOnly(this.stream, grpcError(Status.DEADLINE_EXCEEDED, 'deadline passed before the request was inflated'));
        }
        return;
      case HANDLING: {
        const call = this.call!;
        if (!atDeadline) {
          this.arm(Date.now());
          return;
        }
        if (call.ended) return;
        // The handler learns first, then the client gets its status; whatever the handler answers later is dropped.
        call.cancel();
        this.server.trailersOnly(this.stream, grpcError(Status.DEADLINE_EXCEEDED, 'deadline exceeded'));
        return;
      }
      case ANSWERED: {
        // An answer the client does not take is not held for ever: what it holds (the daemon's memory, and
        // budgets released only once it is taken, like ExecSync's output) comes back at the client's
        // deadline, or `answerTakeMs` after the answer was sent if that comes first.
        const by = Math.min(this.deadline, this.sentAt + this.take);
        if (atDeadline || by === this.due || Date.now() >= by) {
          this.stream.close(http2.constants.NGHTTP2_CANCEL);
          return;
        }
        this.due = by;
        this.timer = setTimeout(this.onTimer, Math.max(0, by - Date.now()));
        return;
      }
      default:
        return;
    }
  };

  private release(): void {
    this.server.holdPending(-this.buf.length);
    this.buf = EMPTY;
  }

  private fail(err: ServiceError): void {
    if (this.done) return;
    this.done = true;
    this.release();
    this.server.trailersOnly(this.stream, err);
    stopReading(this.stream);
  }

  // The request is copied into one buffer of its own as it comes: HTTP/2 hands each DATA frame over as a
  // view of the whole read it came in, so keeping the chunks would keep ~100 bytes of objects per frame and
  // every read a one-byte frame arrived in, far more than the bytes counted.
  private readonly onData = (c: Buffer): void => {
    if (this.done) return;
    const limits = this.server.rpcLimits;
    const need = this.used + c.length;
    if (need > limits.maxReceive + 5) {
      this.fail(grpcError(Status.RESOURCE_EXHAUSTED, `received message larger than max (more than ${limits.maxReceive} bytes)`));
      return;
    }
    if (need > this.buf.length) {
      // Doubling: what is held is at most twice what came, and each byte is copied a bounded number of times.
      const size = Math.min(Math.max(need, 2 * this.buf.length, 256), limits.maxReceive + 5);
      if (!this.server.holdPending(size - this.buf.length)) {
        this.fail(grpcError(Status.RESOURCE_EXHAUSTED, 'too many request bytes in flight; try again'));
        return;
      }
      const grown = Buffer.allocUnsafeSlow(size);
      this.buf.copy(grown, 0, 0, this.used);
      this.buf = grown;
    }
    c.copy(this.buf, this.used);
    this.used = need;
  };

  private readonly onEnd = (): void => {
    if (this.done) return;
    let msg: { body: Buffer; compressed: boolean };
    try {
      msg = this.server.oneMessage(this.buf.subarray(0, this.used), this.enc);
    } catch (err) {
      this.fail(err as ServiceError);
      return;
    }
    if (!msg.compressed) return this.deliver(msg.body);
    // What is held stays counted until it is inflated; the timer stays: a deadline passing while the
    // request waits for its turn ends the call then (see onTimer).
    this.phase = INFLATING;
    this.server.inflate(msg.body, this.enc, () => !this.done && !this.stream.destroyed, (err, out) => {
      if (this.done) this.release();
      else if (err) this.fail(err);
      else this.deliver(out!);
    });
  };

  private deliver(msg: Buffer): void {
    if (this.done) return;
    const route = this.route;
    let request: unknown;
    try {
      request = route.decode(msg);
    } catch (err) {
      this.fail(grpcError(Status.INTERNAL, `cannot parse the request to ${route.path}: ${(err as Error).message}`));
      return;
    }
    this.done = true;
    this.release();
    if (this.stream.destroyed) return;
    this.dispatch(request);
  }

  private dispatch(request: unknown): void {
    const { route, stream, deadline } = this;
    let call: CallBase;
    if (route.responseStream) {
      call = new ServerStream(route.path, request, deadline, new ServerStreamWriter(stream, route, this.server.rpcLimits));
    } else {
      call = new UnaryCall(route.path, request, deadline, this.reply);
    }
    this.call = call;
    this.phase = HANDLING;
    this.server.callStarted(call);
    try {
      if (route.responseStream) route.stream!(call as ServerStream);
      else route.unary!(call as UnaryCall);
    } catch (err) {
      const e = grpcError(Status.UNKNOWN, (err as Error).message);
      if (route.responseStream) (call as ServerStream).fail(e);
      else (call as UnaryCall).respond(e);
    }
  }

  private readonly reply = (err: ServiceError | null, res?: unknown): void => {
    const { stream, route, server } = this;
    if (err) return server.trailersOnly(stream, err);
    let body: Buffer;
    try {
      body = Buffer.isBuffer(res) ? res : route.encode(res);
    } catch (e) {
      return server.trailersOnly(stream, grpcError(Status.INTERNAL, `cannot encode the answer: ${(e as Error).message}`));
    }
    const maxSend = server.rpcLimits.maxSend;
    if (body.length > maxSend) {
      return server.trailersOnly(stream, grpcError(Status.RESOURCE_EXHAUSTED, `answer of ${body.length} bytes is larger than the ${maxSend} bytes skiff sends`));
    }
    sendOne(stream, body);
    if (stream.closed || stream.destroyed) return;
    this.phase = ANSWERED;
    this.sentAt = Date.now();
    if (this.timer === undefined) this.arm(this.sentAt);
  };

  private readonly onClose = (): void => {
    clearTimeout(this.timer);
    this.timer = undefined;
    if (!this.done) {
      this.done = true;
      // A request waiting to be inflated stays counted until its turn is over.
      if (this.phase !== INFLATING) this.release();
    }
    this.phase = OVER;
    this.server.exchangeClosed(this.call, this.route.path);
  };
}
