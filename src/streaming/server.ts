/**
 * The streaming server: Exec, Attach and PortForward URLs as the kubelet
 * serves them, over SPDY/3.1 (what crictl and kubectl speak) and WebSocket.
 * Each URL holds a single-use, expiring token for the request it was issued
 * for. This file only turns each transport into one set of session streams
 * (streams.ts); exec, attach and port-forward run once against those.
 *
 * Every session ends with its client: the end of the client's side of the
 * connection, an error, or the idle timeout ends the session and whatever it
 * started (the exec'd command, the port-forward helpers, the attach poller).
 */
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { WebSocket, WebSocketServer } from 'ws';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { ExecChild, ExecTty, Resizer } from './exec.js';
import type { SpdySession, SpdyStream } from './spdy.js';
import type { Outcome, SessionStreams } from './streams.js';
import { commandBytes, TokenStore } from './tokens.js';
import { lazyCode } from '../lazy-code.js';

type SessionCode = typeof import('./exec.js') & typeof import('./port-forward.js') & typeof import('./spdy.js') & typeof import('./streams.js');

/**
 * What sessions run on (the SPDY codec, WebSocket channels, exec, attach and port-forward) is
 * loaded for the first session: an idle daemon, and one whose clients only call ExecSync, needs
 * none of it.
 */
const sessionCode = lazyCode('streaming session', () =>
  Promise.all([import('./exec.js'), import('./port-forward.js'), import('./spdy.js'), import('./streams.js')]).then(
    ([exec, portForward, spdy, streams]): SessionCode => ({ ...exec, ...portForward, ...spdy, ...streams }),
  ),
);

const webSocketCode = lazyCode('WebSocket', () => import('ws'));

export interface ExecTarget {
  kind: 'exec';
  containerId: string;
  cmd: string[];
  tty: boolean;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
}
export interface PortForwardTarget {
  kind: 'portforward';
  sandboxId: string;
  /** The pod's network namespace file; undefined for host-network pods. */
  netns?: string;
  ports: number[];
}
export interface AttachTarget {
  kind: 'attach';
  containerId: string;
  /** The container's bundle: conmon's attach socket and control FIFO live there. */
  bundle: string;
  tty: boolean;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
}
export type StreamTarget = ExecTarget | PortForwardTarget | AttachTarget;

/** The kubelet's default: a session with no traffic either way for this long is closed. */
export const DEFAULT_IDLE_TIMEOUT_MS = 4 * 60 * 60 * 1000;

export interface StreamingDeps {
  address: string;
  port: number;
  tokenTtlMs: number;
  /** A session with no traffic either way for this long is closed (default 4 h). */
  idleTimeoutMs?: number;
  log: Logger;
  startExec: (containerId: string, cmd: string[]) => Promise<ExecChild>;
  startExecTty: (containerId: string, cmd: string[]) => Promise<ExecTty>;
}

const EXEC_PROTOCOLS = ['v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io', 'channel.k8s.io'];
const WS_EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io', 'v4.base64.channel.k8s.io', 'base64.channel.k8s.io', 'channel.k8s.io'];
const PORTFORWARD_PROTOCOL = 'portforward.k8s.io';
/** How long a client has to open the streams it asked for. */
const STREAM_WAIT_MS = 30_000;
/** How long a finished session waits for the client to close before closing itself. */
const LINGER_MS = 1000;
/**
 * Connections that have not yet asked for an upgrade: anyone on the host can
 * open them (no token is needed to connect), so they are bounded in number
 * and in time. Past the bound, new connections are closed at once.
 */
export const MAX_PENDING_CONNECTIONS = 256;
/**
 * Sessions open at once. Each holds its connection, two header-compression
 * contexts and whatever it runs (about 100 KiB in the daemon for an idle
 * port-forward session): past this, new sessions are refused (503) until
 * some end, rather than let clients grow the daemon without bound.
 */
export const MAX_SESSIONS = 512;
/** How long a connection has to send its upgrade request. */
export const UPGRADE_REQUEST_TIMEOUT_MS = 10_000;
/** The largest WebSocket message accepted (ws' default is 100 MiB). */
const WS_MAX_PAYLOAD = 1024 * 1024;

/** A v4 status for a request that could not run at all. */
function failureStatus(message: string): string {
  return JSON.stringify({ metadata: {}, status: 'Failure', message, reason: 'InternalError' });
}

/** The status the kubelet sends on the error stream (v4): clients read the exit code from it. */
export function execStatus(cmd: string[], code: number | null, signal: string | null): string {
  if (code === 0) return JSON.stringify({ metadata: {}, status: 'Success' });
  const exit = code ?? 128 + (signal ? 9 : 0);
  return JSON.stringify({
    metadata: {},
    status: 'Failure',
    message: `command terminated with non-zero exit code: error executing command [${cmd.join(' ')}], exit code ${exit}`,
    reason: 'NonZeroExitCode',
    details: { causes: [{ reason: 'ExitCode', message: String(exit) }] },
  });
}

/** What the error stream carries for `outcome`: v4 (and every WebSocket protocol) speaks JSON, older SPDY protocols text. */
function statusText(outcome: Outcome, cmd: string[], json: boolean): string {
  switch (outcome.kind) {
    case 'exit':
      if (json) return execStatus(cmd, outcome.code, outcome.signal);
      return outcome.code === 0 ? '' : `command terminated with non-zero exit code: exit code ${outcome.code ?? -1}`;
    case 'failure':
      return json ? failureStatus(outcome.message) : outcome.message;
    case 'ended':
      return json ? JSON.stringify({ metadata: {}, status: 'Success' }) : '';
  }
}

export class StreamingServer {
  private readonly tokens: TokenStore<StreamTarget>;
  private readonly server: http.Server;
  /** ws is imported for the first WebSocket session: crictl and kubectl speak SPDY, and an idle daemon needs neither. */
  private wss?: Promise<WebSocketServer>;
  private readonly sockets = new Set<Duplex>();
  /** Connections without an upgrade yet, each with the timer that closes it. */
  private readonly pending = new Map<net.Socket, NodeJS.Timeout>();
  private refusedSince = 0;
  private sessionsRefused = 0;
  private baseUrl = '';
  private readonly idleTimeoutMs: number;

  /** The session code, set once it has loaded: every session runs after that. */
  private code!: SessionCode;

  constructor(private readonly d: StreamingDeps) {
    this.tokens = new TokenStore(d.tokenTtlMs);
    this.idleTimeoutMs = d.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS;
    this.server = http.createServer((req, res) => {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.end('this endpoint needs an upgrade to SPDY/3.1 or WebSocket\n');
    });
    this.server.on('connection', (socket: net.Socket) => this.onConnection(socket));
    this.server.on('upgrade', (req, socket: Duplex, head: Buffer) => {
      this.settled(socket);
      try {
        this.onUpgrade(req, socket, head);
      } catch (err) {
        this.d.log.warn('streaming upgrade failed', { error: errorMessage(err) });
        socket.destroy();
      }
    });
    this.server.on('clientError', (_err, socket: Duplex) => socket.destroy());
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.d.port, this.d.address, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
    // After listening, a failing accept (EMFILE) is logged, not fatal.
    this.server.on('error', (err) => this.d.log.warn('streaming server error', { error: errorMessage(err) }));
    const a = this.server.address() as net.AddressInfo;
    const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
    this.baseUrl = `http://${host}:${a.port}`;
  }

  get url(): string {
    return this.baseUrl;
  }

  /** A URL for `target`, good once and for the token lifetime; refused (ResourceExhausted) while too many wait. */
  issue(target: StreamTarget): string {
    const weight = 256 + (target.kind === 'exec' ? commandBytes(target.cmd) : 0);
    return `${this.baseUrl}/${target.kind}/${this.tokens.issue(target, weight)}`;
  }

  async close(): Promise<void> {
    for (const s of this.pending.keys()) s.destroy();
    for (const s of this.sockets) s.destroy();
    void this.wss?.then((w) => w.close(), () => undefined);
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  /**
   * A new connection: closed at once past the bound on connections waiting
   * for their upgrade, and closed if its upgrade request has not come in
   * time (slow headers, plain requests on a kept-alive connection, silence).
   */
  private onConnection(socket: net.Socket): void {
    if (this.pending.size >= MAX_PENDING_CONNECTIONS) {
      // One warning per burst, not one per refused connection.
      if (this.refusedSince === 0) this.d.log.warn('too many streaming connections waiting for their upgrade; refusing new ones', { max: MAX_PENDING_CONNECTIONS });
      this.refusedSince++;
      socket.destroy();
      return;
    }
    if (this.refusedSince) {
      this.d.log.info('streaming connections accepted again', { refused: this.refusedSince });
      this.refusedSince = 0;
    }
    const timer = setTimeout(() => socket.destroy(), UPGRADE_REQUEST_TIMEOUT_MS);
    timer.unref();
    this.pending.set(socket, timer);
    socket.once('close', () => this.settled(socket));
  }

  /** The connection asked for its upgrade (or closed): it no longer counts as waiting. */
  private settled(socket: Duplex): void {
    const timer = this.pending.get(socket as net.Socket);
    if (timer === undefined) return;
    clearTimeout(timer);
    this.pending.delete(socket as net.Socket);
  }

  private reject(socket: Duplex, status: number, text: string): void {
    socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n${text}\n`);
    setTimeout(() => socket.destroy(), 5000).unref();
  }

  private onUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): void {
    if (this.sockets.size >= MAX_SESSIONS) {
      // The token is left unused: the client may try again once sessions have ended.
      if (this.sessionsRefused++ === 0) this.d.log.warn('too many streaming sessions open; refusing new ones', { max: MAX_SESSIONS });
      socket.on('error', () => socket.destroy());
      this.reject(socket, 503, `too many streaming sessions open (at most ${MAX_SESSIONS}); try again later`);
      return;
    }
    if (this.sessionsRefused) {
      this.d.log.info('streaming sessions accepted again', { refused: this.sessionsRefused });
      this.sessionsRefused = 0;
    }
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    const m = /^\/(exec|portforward|attach)\/([A-Za-z0-9_-]+)(?:\?.*)?$/.exec(req.url ?? '');
    const target = m ? this.tokens.take(m[2]!) : undefined;
    if (!m || !target || target.kind !== m[1]) {
      this.reject(socket, 404, 'unknown or expired streaming URL');
      return;
    }
    const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
    // Until the session code is loaded nobody reads the socket: what the client sends meanwhile waits in it.
    sessionCode()
      .then((code) => {
        this.code = code;
        if (!socket.destroyed) this.onSession(req, socket, head, target, upgrade);
      })
      .catch((err: unknown) => {
        this.d.log.warn('streaming upgrade failed', { error: errorMessage(err) });
        socket.destroy();
      });
  }

  /** An upgrade with a valid token, once the session code is loaded. */
  private onSession(req: http.IncomingMessage, socket: Duplex, head: Buffer, target: StreamTarget, upgrade: string): void {
    if (upgrade === 'websocket') {
      // Until the upgrade is handled nobody reads the socket: what the client sends meanwhile waits in it.
      this.webSockets().then(
        (wss) => {
          if (socket.destroyed) return;
          wss.handleUpgrade(req, socket, head, (ws) => this.onWebSocket(ws, socket, target, new URL(req.url ?? '/', 'http://x').searchParams));
        },
      ).catch((err: unknown) => {
        this.d.log.warn('streaming upgrade failed', { error: errorMessage(err) });
        socket.destroy();
      });
      return;
    }
    if (upgrade !== 'spdy/3.1') {
      this.reject(socket, 400, `unsupported upgrade "${req.headers.upgrade ?? ''}"`);
      return;
    }
    const offered = String(req.headers['x-stream-protocol-version'] ?? '')
      .split(',')
      .map((p) => p.trim())
      .filter(Boolean);
    const supported = target.kind === 'portforward' ? [PORTFORWARD_PROTOCOL] : EXEC_PROTOCOLS;
    const protocol = offered.find((p) => supported.includes(p));
    if (!protocol) {
      this.reject(socket, 403, `none of the offered stream protocols (${offered.join(', ') || 'none'}) is supported; supported: ${supported.join(', ')}`);
      return;
    }
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: ${protocol}\r\n\r\n`);
    const session = new this.code.SpdySession(socket, { maxStreams: target.kind === 'portforward' ? this.code.MAX_PORTFORWARD_STREAMS : 8 });
    session.on('protocol-error', (e: Error) => this.d.log.warn('SPDY protocol error', { error: e.message }));
    this.idle(socket, () => session.destroy());
    if (head.length) socket.unshift(head);
    if (target.kind === 'portforward') this.spdyPortForward(session, target);
    else this.spdyExecOrAttach(session, target, protocol);
  }

  private webSockets(): Promise<WebSocketServer> {
    this.wss ??= webSocketCode().then(({ WebSocketServer }) => {
      const wss = new WebSocketServer({
        noServer: true,
        maxPayload: WS_MAX_PAYLOAD,
        // The first protocol the client offers that skiff speaks; none means refusal.
        handleProtocols: (offered: Set<string>) => [...offered].find((p) => WS_EXEC_PROTOCOLS.includes(p)) ?? false,
      });
      wss.on('error', (err) => this.d.log.warn('WebSocket server error', { error: errorMessage(err) }));
      return wss;
    });
    // Not loaded this time (out of descriptors): the next upgrade tries again.
    const loading = this.wss;
    loading.catch(() => {
      if (this.wss === loading) this.wss = undefined;
    });
    return loading;
  }

  /** Closes a connection with no traffic either way for the idle timeout. */
  private idle(socket: Duplex, close: () => void): void {
    if (!(socket instanceof net.Socket)) return;
    socket.setTimeout(this.idleTimeoutMs);
    socket.on('timeout', () => {
      this.d.log.info('streaming session idle for too long; closing it', { idleTimeoutMs: this.idleTimeoutMs });
      close();
      socket.destroy();
    });
  }

  /** Runs the operation a session's target names against its streams. */
  private run(t: ExecTarget | AttachTarget, io: SessionStreams): void {
    if (t.kind === 'exec') {
      this.code.runExec(this.d, t.containerId, t.cmd, t.tty, io).catch((err) => io.finish({ kind: 'failure', message: errorMessage(err) }));
    } else {
      this.code.runAttach(t.bundle, t.containerId, conmonResizer(t.bundle), io);
    }
  }

  // --- SPDY -------------------------------------------------------------------

  /**
   * Exec and attach over SPDY: the streams the request asked for, each once;
   * any other stream, a second stream of a type, or any stream after the
   * command started is refused. One command per session.
   */
  private spdyExecOrAttach(session: SpdySession, t: ExecTarget | AttachTarget, protocol: string): void {
    const resize = t.tty && protocol !== 'channel.k8s.io' && protocol !== 'v2.channel.k8s.io';
    const stderr = t.stderr && !(t.kind === 'attach' && t.tty);
    const want = ['error', ...(t.stdin ? ['stdin'] : []), ...(t.stdout ? ['stdout'] : []), ...(stderr ? ['stderr'] : []), ...(resize ? ['resize'] : [])];
    const streams = new Map<string, SpdyStream>();
    const ac = new AbortController();
    session.on('close', () => ac.abort());
    let started = false;
    const timer = setTimeout(() => {
      this.d.log.warn('streaming client did not open its streams in time', { want, got: [...streams.keys()] });
      session.close();
    }, STREAM_WAIT_MS);
    timer.unref();
    session.on('close', () => clearTimeout(timer));
    session.on('stream', (s: SpdyStream) => {
      const type = s.headers.streamtype ?? '';
      if (started || !want.includes(type) || streams.has(type)) {
        s.reset(this.code.RstStatus.REFUSED_STREAM);
        return;
      }
      void s.reply({});
      // Nothing reads what a client sends on the error stream: discard it rather than hold it.
      if (type === 'error') s.resume();
      streams.set(type, s);
      if (!want.every((w) => streams.has(w))) return;
      started = true;
      clearTimeout(timer);
      const errStream = streams.get('error')!;
      const json = protocol === 'v4.channel.k8s.io';
      const cmd = t.kind === 'exec' ? t.cmd : [];
      let finished = false;
      const io: SessionStreams = {
        stdin: streams.get('stdin'),
        stdout: streams.get('stdout'),
        stderr: streams.get('stderr'),
        resize: streams.get('resize'),
        signal: ac.signal,
        finish: (outcome) => {
          if (finished) return;
          finished = true;
          void (async () => {
            await Promise.all([this.code.flushed(io.stdout, ac.signal), this.code.flushed(io.stderr, ac.signal)]);
            if (!errStream.writableEnded && !errStream.isGone) errStream.end(statusText(outcome, cmd, json));
            await this.code.flushed(errStream, ac.signal);
            // The client closes once it has read the status; a client that does not is closed.
            setTimeout(() => session.close(), LINGER_MS).unref();
          })();
        },
      };
      this.run(t, io);
    });
  }

  /** Port-forward over SPDY: a data and an error stream per connection, paired by request id. */
  private spdyPortForward(session: SpdySession, t: PortForwardTarget): void {
    const pairs = new Map<string, { data?: SpdyStream; error?: SpdyStream; port: number }>();
    const limit = new this.code.HelperLimit();
    const ac = new AbortController();
    session.on('close', () => ac.abort());
    session.on('stream', (s: SpdyStream) => {
      const port = Number(s.headers.port);
      const id = s.headers.requestid ?? '';
      const type = s.headers.streamtype;
      if (!Number.isInteger(port) || port <= 0 || port > 65535 || (type !== 'error' && type !== 'data')) {
        s.reset(this.code.RstStatus.REFUSED_STREAM);
        return;
      }
      const p = pairs.get(id) ?? { port };
      if (p.port !== port || p[type]) {
        s.reset(this.code.RstStatus.REFUSED_STREAM);
        return;
      }
      void s.reply({});
      if (type === 'error') s.resume();
      p[type] = s;
      pairs.set(id, p);
      // A half pair whose other half never comes holds only its stream (bounded by the session's stream limit).
      s.once('spdy-closed', () => {
        if (pairs.get(id) === p) pairs.delete(id);
      });
      if (p.data && p.error) {
        pairs.delete(id);
        void this.code.forwardPort(t, p.port, p.data, p.error, limit, ac.signal);
      }
    });
  }

  // --- WebSocket --------------------------------------------------------------

  private onWebSocket(ws: WebSocket, socket: Duplex, t: StreamTarget, query: URLSearchParams): void {
    ws.on('error', (err) => {
      this.d.log.debug('WebSocket session error', { error: errorMessage(err) });
      ws.terminate();
    });
    this.idle(socket, () => ws.terminate());
    if (t.kind === 'portforward') return this.webSocketPortForward(ws, socket, t, query);
    const inputs = new Set<number>([...(t.stdin ? [0] : []), ...(t.tty ? [4] : [])]);
    const ch = new this.code.WsChannels(ws, socket, inputs);
    const ac = new AbortController();
    ws.on('close', () => ac.abort());
    const stderr = t.stderr && !(t.kind === 'attach' && t.tty);
    const cmd = t.kind === 'exec' ? t.cmd : [];
    let finished = false;
    const io: SessionStreams = {
      stdin: t.stdin ? ch.channel(0) : undefined,
      stdout: t.stdout ? ch.channel(1) : undefined,
      stderr: stderr ? ch.channel(2) : undefined,
      resize: t.tty ? ch.channel(4) : undefined,
      signal: ac.signal,
      finish: (outcome) => {
        if (finished) return;
        finished = true;
        void (async () => {
          await Promise.all([this.code.flushed(io.stdout, ac.signal), this.code.flushed(io.stderr, ac.signal)]);
          ch.sendNow(3, Buffer.from(statusText(outcome, cmd, true)), () => ch.close(1000));
        })();
      },
    };
    this.run(t, io);
  }

  /**
   * Port-forward over WebSocket, as the kubelet does it: ports from the
   * query (else the request), one connection each, on channels 2i (data)
   * and 2i+1 (error), each opened with the port as two little-endian bytes.
   */
  private webSocketPortForward(ws: WebSocket, socket: Duplex, t: PortForwardTarget, query: URLSearchParams): void {
    const ports = query.getAll('port').map(Number);
    const list = ports.length ? ports : t.ports;
    if (!list.length || list.length > 64 || list.some((p) => !Number.isInteger(p) || p <= 0 || p > 65535)) {
      ws.close(1008, 'port-forward needs valid ports');
      return;
    }
    const ch = new this.code.WsChannels(ws, socket, new Set(list.map((_, i) => 2 * i)));
    const ac = new AbortController();
    ws.on('close', () => ac.abort());
    const limit = new this.code.HelperLimit();
    const conns = list.map((port, i) => {
      const portBytes = Buffer.alloc(2);
      portBytes.writeUInt16LE(port);
      ch.sendNow(2 * i, portBytes);
      ch.sendNow(2 * i + 1, portBytes);
      return this.code.forwardPort(t, port, ch.channel(2 * i), ch.channel(2 * i + 1), limit, ac.signal);
    });
    void Promise.all(conns).then(async () => {
      await Promise.all(list.map((_, i) => this.code.flushed(ch.channel(2 * i), ac.signal)));
      ch.close(1000);
    });
  }

  /** The subprotocols a WebSocket client may ask for. */
  static readonly webSocketProtocols = WS_EXEC_PROTOCOLS;
}

/**
 * Resizes a container's terminal through conmon's control FIFO, which takes
 * "<type> <height> <width>" (type 1 resizes). One write at a time per
 * session: a size that arrives meanwhile replaces any waiting one, so a
 * flood of resizes never holds more than one open descriptor.
 */
function conmonResizer(bundle: string): Resizer {
  let busy = false;
  let waiting: [number, number] | undefined;
  const done = () => {
    busy = false;
    const next = waiting;
    waiting = undefined;
    if (next) resize(...next);
  };
  const resize = (cols: number, rows: number): void => {
    if (busy) {
      waiting = [cols, rows];
      return;
    }
    busy = true;
    fs.open(path.join(bundle, 'ctl'), fs.constants.O_WRONLY | fs.constants.O_NONBLOCK, (err, fd) => {
      if (err) return done();
      fs.write(fd, `1 ${rows} ${cols}\n`, () => fs.close(fd, done));
    });
  };
  return resize;
}
