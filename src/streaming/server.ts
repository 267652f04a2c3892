/**
 * The streaming server: Exec and PortForward URLs as the kubelet serves them,
 * over SPDY/3.1 (what crictl and kubectl speak) and WebSocket. Each URL holds
 * a single-use, expiring token for the request it was issued for.
 *
 */
import { spawn, type ChildProcess, type ChildProcessWithoutNullStreams } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import { WebSocketServer, type WebSocket } from 'ws';
import { errorMessage } from '../errors.js';
import { closeFd, setWindowSize } from '../sys/libc.js';
import type { Logger } from '../log.js';
import { AttachConnection } from './attach.js';
import { SpdySession, type SpdyStream } from './spdy.js';
import { TokenStore } from './tokens.js';

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

export interface StreamingDeps {
  address: string;
  port: number;
  tokenTtlMs: number;
  log: Logger;
  startExec: (containerId: string, cmd: string[]) => Promise<ChildProcessWithoutNullStreams>;
  startExecTty: (containerId: string, cmd: string[]) => Promise<{ child: ChildProcess; master: number }>;
}

/** Terminal size messages arrive as concatenated JSON objects ({"Width":80,"Height":24}). */
export function parseResizes(text: string): Array<{ width: number; height: number }> {
  const out: Array<{ width: number; height: number }> = [];
  for (const m of text.matchAll(/\{[^{}]*\}/g)) {
    try {
      const j = JSON.parse(m[0]) as { Width?: number; Height?: number };
      if (typeof j.Width === 'number' && typeof j.Height === 'number') out.push({ width: j.Width, height: j.Height });
    } catch {
      // a malformed message is ignored, as the kubelet does
    }
  }
  return out;
}

/** A terminal's master side as streams: reads end when the terminal's last user is gone (EIO). */
function terminalStreams(master: number): { output: NodeJS.ReadableStream; write(d: Buffer): void; close(): void } {
  const output = fs.createReadStream('', { fd: master, autoClose: false, highWaterMark: 16 * 1024 });
  output.on('error', () => output.push(null));
  let closed = false;
  return {
    output,
    write: (d: Buffer) => {
      if (!closed) fs.write(master, d, () => undefined);
    },
    close: () => {
      if (closed) return;
      closed = true;
      output.destroy();
      closeFd(master);
    },
  };
}

const EXEC_PROTOCOLS = ['v4.channel.k8s.io', 'v3.channel.k8s.io', 'v2.channel.k8s.io', 'channel.k8s.io'];
const WS_EXEC_PROTOCOLS = ['v5.channel.k8s.io', 'v4.channel.k8s.io', 'v4.base64.channel.k8s.io', 'base64.channel.k8s.io', 'channel.k8s.io'];
const PORTFORWARD_PROTOCOL = 'portforward.k8s.io';
/** How long a client has to open the streams it asked for. */
const STREAM_WAIT_MS = 30_000;

/** A v4 status for a request that could not run at all. */
function failureStatus(message: string): string {
  return JSON.stringify({ metadata: {}, status: 'Failure', message, reason: 'InternalError' });
}

/** Reports a failure on the error stream (JSON for v4, text before) and ends the session. */
function failSession(errStream: Duplex, protocol: string, message: string, session: SpdySession): void {
  errStream.end(protocol === 'v4.channel.k8s.io' ? failureStatus(message) : message);
  setTimeout(() => session.close(), 100).unref();
}

/** Reports how the command ended, then lets the client read the last frames before the session goes. */
function finishExec(errStream: Duplex, protocol: string, cmd: string[], code: number | null, signal: string | null, session: SpdySession): void {
  if (protocol === 'v4.channel.k8s.io') errStream.end(execStatus(cmd, code, signal));
  else errStream.end(code === 0 ? '' : `command terminated with non-zero exit code: exit code ${code ?? -1}`);
  setTimeout(() => session.close(), 1000).unref();
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

export class StreamingServer {
  private readonly tokens: TokenStore<StreamTarget>;
  private readonly server: http.Server;
  private readonly wss = new WebSocketServer({
    noServer: true,
    // The first protocol the client offers that skiff speaks; none means refusal.
    handleProtocols: (offered: Set<string>) => [...offered].find((p) => WS_EXEC_PROTOCOLS.includes(p)) ?? false,
  });
  private readonly sockets = new Set<Duplex>();
  private baseUrl = '';

  constructor(private readonly d: StreamingDeps) {
    this.tokens = new TokenStore(d.tokenTtlMs);
    this.server = http.createServer((req, res) => {
      res.writeHead(400, { 'content-type': 'text/plain' });
      res.end('this endpoint needs an upgrade to SPDY/3.1 or WebSocket\n');
    });
    this.server.on('upgrade', (req, socket: Duplex, head: Buffer) => this.onUpgrade(req, socket, head));
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.d.port, this.d.address, () => resolve());
    });
    const a = this.server.address() as net.AddressInfo;
    const host = a.family === 'IPv6' ? `[${a.address}]` : a.address;
    this.baseUrl = `http://${host}:${a.port}`;
  }

  get url(): string {
    return this.baseUrl;
  }

  /** A URL for `target`, good once and for the token lifetime. */
  issue(target: StreamTarget): string {
    return `${this.baseUrl}/${target.kind}/${this.tokens.issue(target)}`;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    this.wss.close();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private reject(socket: Duplex, status: number, text: string): void {
    socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n${text}\n`);
  }

  private onUpgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): void {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => undefined);
    const m = /^\/(exec|portforward|attach)\/([A-Za-z0-9_-]+)(?:\?.*)?$/.exec(req.url ?? '');
    const target = m ? this.tokens.take(m[2]!) : undefined;
    if (!m || !target || target.kind !== m[1]) {
      this.reject(socket, 404, 'unknown or expired streaming URL');
      return;
    }
    const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
    if (upgrade === 'websocket') {
      this.wss.handleUpgrade(req, socket, head, (ws) => this.onWebSocket(ws, target, new URL(req.url ?? '/', 'http://x').searchParams));
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
    const session = new SpdySession(socket);
    if (head.length) socket.unshift(head);
    session.on('protocol-error', (e: Error) => this.d.log.warn('SPDY protocol error', { error: e.message }));
    if (target.kind === 'exec') this.spdyExec(session, target, protocol);
    else if (target.kind === 'attach') this.spdyAttach(session, target, protocol);
    else this.spdyPortForward(session, target);
  }

  // --- exec over SPDY -------------------------------------------------------

  private spdyExec(session: SpdySession, t: ExecTarget, protocol: string): void {
    const want = ['error', ...(t.stdin ? ['stdin'] : []), ...(t.stdout ? ['stdout'] : []), ...(t.stderr ? ['stderr'] : []), ...(t.tty && protocol !== 'channel.k8s.io' && protocol !== 'v2.channel.k8s.io' ? ['resize'] : [])];
    const streams = new Map<string, SpdyStream>();
    const timer = setTimeout(() => {
      this.d.log.warn('exec client did not open its streams in time', { want, got: [...streams.keys()] });
      session.close();
    }, STREAM_WAIT_MS);
    timer.unref();
    session.on('stream', (s: SpdyStream) => {
      void s.reply({});
      const type = s.headers.streamtype ?? '';
      streams.set(type, s);
      if (want.every((w) => streams.has(w))) {
        clearTimeout(timer);
        void this.runExec(t, protocol, streams, session);
      }
    });
  }

  private async runExec(t: ExecTarget, protocol: string, streams: Map<string, SpdyStream>, session: SpdySession): Promise<void> {
    const errStream = streams.get('error')!;
    if (t.tty) return this.runExecTty(t, protocol, streams, session);
    let child: ChildProcessWithoutNullStreams;
    try {
      child = await this.d.startExec(t.containerId, t.cmd);
    } catch (err) {
      failSession(errStream, protocol, errorMessage(err), session);
      return;
    }
    const stdin = streams.get('stdin');
    if (stdin) stdin.pipe(child.stdin);
    else child.stdin.end();
    child.stdin.on('error', () => undefined);
    const outputs: Array<Promise<void>> = [];
    const pipeOut = (src: NodeJS.ReadableStream, name: string) => {
      const dst = streams.get(name);
      if (!dst) {
        src.resume();
        return;
      }
      outputs.push(new Promise((resolve) => {
        src.on('end', () => dst.end(() => resolve()));
        src.on('data', (d: Buffer) => dst.write(d));
      }));
    };
    pipeOut(child.stdout, 'stdout');
    pipeOut(child.stderr, 'stderr');
    const [code, signal] = await new Promise<[number | null, string | null]>((r) => child.on('close', (c, s) => r([c, s])));
    await Promise.all(outputs);
    finishExec(errStream, protocol, t.cmd, code, signal, session);
  }

  private async runExecTty(t: ExecTarget, protocol: string, streams: Map<string, SpdyStream>, session: SpdySession): Promise<void> {
    const errStream = streams.get('error')!;
    let started: { child: ChildProcess; master: number };
    try {
      started = await this.d.startExecTty(t.containerId, t.cmd);
    } catch (err) {
      failSession(errStream, protocol, errorMessage(err), session);
      return;
    }
    const term = terminalStreams(started.master);
    const resize = streams.get('resize');
    resize?.on('data', (d: Buffer) => {
      for (const r of parseResizes(d.toString())) {
        setWindowSize(started.master, r.width, r.height);
        started.child.kill('SIGWINCH');
      }
    });
    streams.get('stdin')?.on('data', (d: Buffer) => term.write(d));
    const stdout = streams.get('stdout');
    const outDone = new Promise<void>((resolve) => {
      term.output.on('data', (d: Buffer) => stdout?.write(d));
      term.output.on('end', () => resolve());
      term.output.on('close', () => resolve());
    });
    const [code, signal] = await new Promise<[number | null, string | null]>((r) => started.child.on('close', (c, s) => r([c, s])));
    await Promise.race([outDone, new Promise((r) => setTimeout(r, 500))]);
    term.close();
    stdout?.end();
    finishExec(errStream, protocol, t.cmd, code, signal, session);
  }

  // --- attach over SPDY ----------------------------------------------------

  private spdyAttach(session: SpdySession, t: AttachTarget, protocol: string): void {
    const want = ['error', ...(t.stdin ? ['stdin'] : []), ...(t.stdout ? ['stdout'] : []), ...(t.stderr && !t.tty ? ['stderr'] : []), ...(t.tty && protocol !== 'channel.k8s.io' && protocol !== 'v2.channel.k8s.io' ? ['resize'] : [])];
    const streams = new Map<string, SpdyStream>();
    const timer = setTimeout(() => session.close(), STREAM_WAIT_MS);
    timer.unref();
    session.on('stream', (s: SpdyStream) => {
      void s.reply({});
      streams.set(s.headers.streamtype ?? '', s);
      if (!want.every((w) => streams.has(w))) return;
      clearTimeout(timer);
      const errStream = streams.get('error')!;
      let conn: AttachConnection;
      try {
        conn = new AttachConnection(t.bundle);
      } catch (err) {
        failSession(errStream, protocol, `cannot attach to ${t.containerId}: ${errorMessage(err)}`, session);
        return;
      }
      const stdin = streams.get('stdin');
      stdin?.on('data', (d: Buffer) => conn.write(d));
      stdin?.on('end', () => conn.endInput());
      conn.on('stdout', (d: Buffer) => streams.get('stdout')?.write(d));
      conn.on('stderr', (d: Buffer) => streams.get('stderr')?.write(d));
      streams.get('resize')?.on('data', (d: Buffer) => {
        for (const r of parseResizes(d.toString())) resizeConmon(t.bundle, r.width, r.height);
      });
      session.on('close', () => conn.close());
      conn.on('close', () => {
        streams.get('stdout')?.end();
        streams.get('stderr')?.end();
        errStream.end(protocol === 'v4.channel.k8s.io' ? JSON.stringify({ metadata: {}, status: 'Success' }) : '');
        setTimeout(() => session.close(), 1000).unref();
      });
    });
  }

  // --- port-forward over SPDY ---------------------------------------------

  private spdyPortForward(session: SpdySession, t: PortForwardTarget): void {
    const pairs = new Map<string, { data?: SpdyStream; error?: SpdyStream; port: number }>();
    session.on('stream', (s: SpdyStream) => {
      void s.reply({});
      const port = Number(s.headers.port);
      const id = s.headers.requestid ?? '';
      if (!Number.isInteger(port) || port <= 0 || port > 65535) {
        s.reset();
        return;
      }
      const p = pairs.get(id) ?? { port };
      if (s.headers.streamtype === 'error') p.error = s;
      else if (s.headers.streamtype === 'data') p.data = s;
      else return s.reset();
      pairs.set(id, p);
      if (p.data && p.error) {
        pairs.delete(id);
        this.forward(t, p.port, p.data, p.error);
      }
    });
  }

  private forward(t: PortForwardTarget, port: number, data: Duplex, error: Duplex): void {
    const conn = connectInPod(t.netns, port);
    let gotData = false;
    conn.stdout.on('data', (d: Buffer) => {
      gotData = true;
      data.write(d);
    });
    data.on('data', (d: Buffer) => conn.stdin.write(d));
    data.on('end', () => conn.stdin.end());
    conn.stdin.on('error', () => undefined);
    let stderr = '';
    conn.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    conn.on('close', (code) => {
      if (code !== 0 && !gotData) {
        error.end(`error forwarding port ${port} to pod ${t.sandboxId}: ${stderr.trim().split('\n').pop() || `exit ${code}`}`);
      } else {
        error.end();
      }
      data.end();
    });
  }

  // --- WebSocket ---------------------------------------------------------

  private onWebSocket(ws: WebSocket, t: StreamTarget, query: URLSearchParams): void {
    if (t.kind === 'attach') return this.webSocketAttach(ws, t);
    if (t.kind === 'portforward') return this.webSocketPortForward(ws, t, query);
    const { send, decode } = wsChannels(ws);
    // Listen at once: ws drops messages that arrive while nobody listens, and
    // the client may send stdin before the process is up.
    const pending: Array<[number, Buffer]> = [];
    let deliver: ((channel: number, payload: Buffer) => void) | undefined;
    ws.on('message', (msg: Buffer, isBinary: boolean) => {
      const [channel, payload] = decode(msg, isBinary);
      if (deliver) deliver(channel, payload);
      else pending.push([channel, payload]);
    });
    if (t.tty) {
      void (async () => {
        let started: { child: ChildProcess; master: number };
        try {
          started = await this.d.startExecTty(t.containerId, t.cmd);
        } catch (err) {
          send(3, Buffer.from(failureStatus(errorMessage(err))));
          ws.close(1000);
          return;
        }
        const term = terminalStreams(started.master);
        deliver = (channel, payload) => {
          if (channel === 0) term.write(payload);
          else if (channel === 4) {
            for (const r of parseResizes(payload.toString())) {
              setWindowSize(started.master, r.width, r.height);
              started.child.kill('SIGWINCH');
            }
          }
        };
        for (const [c, p] of pending.splice(0)) deliver(c, p);
        ws.on('close', () => started.child.kill('SIGKILL'));
        term.output.on('data', (d: Buffer) => send(1, d));
        const [code, signal] = await new Promise<[number | null, string | null]>((r) => started.child.on('close', (c, s) => r([c, s])));
        await new Promise((r) => setTimeout(r, 100));
        term.close();
        send(3, Buffer.from(execStatus(t.cmd, code, signal)));
        ws.close(1000);
      })();
      return;
    }
    void (async () => {
      let child: ChildProcessWithoutNullStreams;
      try {
        child = await this.d.startExec(t.containerId, t.cmd);
      } catch (err) {
        send(3, Buffer.from(failureStatus(errorMessage(err))));
        ws.close(1000);
        return;
      }
      if (!t.stdin) child.stdin.end();
      child.stdin.on('error', () => undefined);
      deliver = (channel, payload) => {
        if (channel === 0 && t.stdin) child.stdin.write(payload);
        else if (channel === 255 && payload[0] === 0) child.stdin.end(); // v5: the client closed stdin
      };
      for (const [c, p] of pending.splice(0)) deliver(c, p);
      ws.on('close', () => child.kill('SIGKILL'));
      const outs = [
        new Promise<void>((r) => child.stdout.on('data', (d: Buffer) => t.stdout && send(1, d)).on('end', () => r())),
        new Promise<void>((r) => child.stderr.on('data', (d: Buffer) => t.stderr && send(2, d)).on('end', () => r())),
      ];
      const [code, signal] = await new Promise<[number | null, string | null]>((r) => child.on('close', (c, s) => r([c, s])));
      await Promise.all(outs);
      send(3, Buffer.from(execStatus(t.cmd, code, signal)));
      ws.close(1000);
    })();
  }

  /**
   * Port-forward over WebSocket, as the kubelet does it: ports from the
   * query (else the request), one connection each, on channels 2i (data)
   * and 2i+1 (error), each opened with the port as two little-endian bytes.
   */
  private webSocketPortForward(ws: WebSocket, t: PortForwardTarget, query: URLSearchParams): void {
    const { send, decode } = wsChannels(ws);
    const ports = query.getAll('port').map(Number);
    const list = ports.length ? ports : t.ports;
    if (!list.length || list.some((p) => !Number.isInteger(p) || p <= 0 || p > 65535)) {
      ws.close(1008, 'port-forward needs valid ports');
      return;
    }
    const conns = list.map((port, i) => {
      const portBytes = Buffer.alloc(2);
      portBytes.writeUInt16LE(port);
      send(2 * i, portBytes);
      send(2 * i + 1, portBytes);
      const conn = connectInPod(t.netns, port);
      let gotData = false;
      let stderr = '';
      conn.stdout.on('data', (d: Buffer) => {
        gotData = true;
        send(2 * i, d);
      });
      conn.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      conn.stdin.on('error', () => undefined);
      conn.on('close', (code) => {
        if (code !== 0 && !gotData) send(2 * i + 1, Buffer.from(`error forwarding port ${port} to pod ${t.sandboxId}: ${stderr.trim().split('\n').pop() || `exit ${code}`}`));
      });
      return conn;
    });
    ws.on('message', (msg: Buffer, isBinary: boolean) => {
      const [channel, payload] = decode(msg, isBinary);
      if (channel % 2 === 0) conns[channel / 2]?.stdin.write(payload);
    });
    ws.on('close', () => conns.forEach((c) => c.kill('SIGTERM')));
    void Promise.all(conns.map((c) => new Promise((r) => c.on('close', r)))).then(() => ws.close(1000));
  }

  private webSocketAttach(ws: WebSocket, t: AttachTarget): void {
    const { send, decode } = wsChannels(ws);
    let conn: AttachConnection;
    try {
      conn = new AttachConnection(t.bundle);
    } catch (err) {
      send(3, Buffer.from(failureStatus(errorMessage(err))));
      ws.close(1000);
      return;
    }
    ws.on('message', (msg: Buffer, isBinary: boolean) => {
      const [channel, payload] = decode(msg, isBinary);
      if (channel === 0 && t.stdin) conn.write(payload);
      else if (channel === 4 && t.tty) for (const r of parseResizes(payload.toString())) resizeConmon(t.bundle, r.width, r.height);
      else if (channel === 255 && payload[0] === 0) conn.endInput();
    });
    ws.on('close', () => conn.close());
    conn.on('stdout', (d: Buffer) => t.stdout && send(1, d));
    conn.on('stderr', (d: Buffer) => t.stderr && send(2, d));
    conn.on('close', () => {
      send(3, Buffer.from(JSON.stringify({ metadata: {}, status: 'Success' })));
      ws.close(1000);
    });
  }

  /** The subprotocols a WebSocket client may ask for. */
  static readonly webSocketProtocols = WS_EXEC_PROTOCOLS;
}

/**
 * Kubernetes' WebSocket channel framing: a first byte naming the channel,
 * or, for the base64 protocols, a text frame of the channel digit and base64.
 */
function wsChannels(ws: WebSocket): { send(channel: number, data: Buffer): void; decode(msg: Buffer, isBinary: boolean): [number, Buffer] } {
  const base64 = ws.protocol.includes('base64');
  return {
    send: (channel, data) => {
      if (ws.readyState !== ws.OPEN) return;
      if (base64) ws.send(`${channel}${data.toString('base64')}`);
      else ws.send(Buffer.concat([Buffer.from([channel]), data]));
    },
    decode: (msg, isBinary) => {
      if (!isBinary && base64) {
        const text = msg.toString();
        return [Number(text[0]), Buffer.from(text.slice(1), 'base64')];
      }
      return [msg[0]!, msg.subarray(1)];
    },
  };
}

/** conmon's control FIFO takes "<type> <height> <width>"; type 1 resizes the terminal. */
function resizeConmon(bundle: string, cols: number, rows: number): void {
  fs.open(path.join(bundle, 'ctl'), fs.constants.O_WRONLY | fs.constants.O_NONBLOCK, (err, fd) => {
    if (err) return;
    fs.write(fd, `1 ${rows} ${cols}\n`, () => fs.close(fd, () => undefined));
  });
}

/** A connection to localhost:`port` inside the pod's network namespace. */
function connectInPod(netns: string | undefined, port: number): ChildProcessWithoutNullStreams {
  const args = ['STDIO', `TCP:localhost:${port}`];
  return netns ? spawn('nsenter', [`--net=${netns}`, 'socat', ...args], { stdio: 'pipe' }) : spawn('socat', args, { stdio: 'pipe' });
}
