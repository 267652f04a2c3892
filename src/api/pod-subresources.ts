/**
 * The Pod subresources kubectl streams through: pods/log (the container's
 * output as plain text) and pods/exec, pods/attach, pods/portforward (an
 * upgraded connection). The API checks the request against the Pod it
 * stores, as kube-apiserver does; the node's agent (a `PodStreams`) finds the
 * container and asks the runtime over CRI for a streaming URL, and the
 * client's connection is relayed to it byte for byte, as kube-apiserver
 * relays it to the kubelet and the kubelet to the runtime's streaming
 * server. That server speaks SPDY/3.1 and WebSocket (v5.channel.k8s.io and
 * older) for exec and attach, so both are relayed as they come; kubectl
 * 1.35's WebSocket tunnel for port-forward ("SPDY/3.1+portforward.k8s.io",
 * SPDY inside WebSocket messages) it does not speak, so the API ends the
 * WebSocket itself and speaks SPDY to it, carrying the bytes between.
 *
 * Everything a client can hold is bounded: relayed sessions and log streams
 * in number, the wait for the runtime's answer in time, and the bytes a
 * client leaves unread (piped with backpressure; a log reader that stalls is
 * dropped).
 */
import http from 'node:http';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Duplex } from 'node:stream';
import type { Logger } from '../log.js';
import { ApiError, badRequest, type Reason } from './errors.js';
import type { Subresource, SubresourceTarget } from './server.js';
import type { Store } from './store.js';
import type { Obj } from './types.js';
import { writeStatus } from './upgrade-status.js';
import { writeOrDrop } from '../slow-reader.js';

export interface PodRef {
  namespace: string;
  name: string;
  /** The API object's uid, when it has one. */
  uid?: string;
}

export interface PodLogRequest {
  container: string;
  follow: boolean;
  previous: boolean;
  timestamps: boolean;
  tailLines?: number;
  /** Only lines written at or after this time (milliseconds since the epoch). */
  since?: number;
  limitBytes?: number;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
  /** Writes output; resolves when the client can take more. */
  write(chunk: Buffer): Promise<void>;
}

export interface StreamRequest {
  container: string;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

/** What the node's agent does for the streaming subresources. */
export interface PodStreams {
  /** Streams the container's log through `req.write` until it ends (or, following, until the signal aborts). */
  log(pod: PodRef, req: PodLogRequest): Promise<void>;
  /** A streaming URL (http://…) for running `command` in the container. */
  exec(pod: PodRef, req: StreamRequest & { command: string[] }): Promise<string>;
  attach(pod: PodRef, req: StreamRequest): Promise<string>;
  portForward(pod: PodRef, ports: number[]): Promise<string>;
}

/**
 * How a PodStreams method refuses a request (an Error with these fields):
 * answered with that reason's status and the message as it is.
 */
export interface StreamRefusal {
  streamRefusal: true;
  reason: 'BadRequest' | 'NotFound' | 'Forbidden' | 'TooManyRequests' | 'InternalError';
  message: string;
}

function isRefusal(err: unknown): err is StreamRefusal {
  return typeof err === 'object' && err !== null && (err as StreamRefusal).streamRefusal === true;
}

function apiErrorOf(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (isRefusal(err)) return new ApiError(err.reason as Reason, err.message);
  return new ApiError('InternalError', `Internal error occurred: ${(err as Error)?.message ?? String(err)}`);
}

export interface PodSubresourceOptions {
  store: Store;
  /** The agent's side; undefined until the agent is up (answered 503-like InternalError meanwhile). */
  streams: () => PodStreams | undefined;
  log: Logger;
  /** Relayed sessions and log streams open at once (each); more are refused with 429. */
  maxSessions?: number;
  /** How long a log client may leave the server waiting to write before it is dropped. */
  stallTimeoutMs?: number;
  /** How long the runtime's streaming server has to answer the upgrade. */
  upgradeTimeoutMs?: number;
}

export const DEFAULT_MAX_POD_SESSIONS = 128;

/** The handlers for pods/log, pods/exec, pods/attach and pods/portforward, and a close() for what they hold. */
export function podSubresources(opts: PodSubresourceOptions): { subresources: Record<string, Subresource>; close(): void } {
  const maxSessions = opts.maxSessions ?? DEFAULT_MAX_POD_SESSIONS;
  const stallMs = opts.stallTimeoutMs ?? 60_000;
  const upgradeMs = opts.upgradeTimeoutMs ?? 10_000;
  const relays = new Set<Duplex>();
  const logs = new Set<ServerResponse>();

  const streams = (): PodStreams => {
    const s = opts.streams();
    if (!s) throw new ApiError('InternalError', 'the node agent is not running yet; try again shortly');
    return s;
  };
  const podOf = (t: SubresourceTarget): { pod: Obj; ref: PodRef } => {
    const pod = opts.store.get(t.kind, t.namespace, t.name) as unknown as Obj;
    const meta = (pod.metadata ?? {}) as { uid?: string };
    return { pod, ref: { namespace: t.namespace, name: t.name, uid: meta.uid } };
  };

  const log: Subresource = {
    kind: 'Pod',
    verbs: ['get'],
    async handle(req, res, t) {
      req.resume();
      if (req.method !== 'GET' && req.method !== 'HEAD') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
      const { pod, ref } = podOf(t);
      const q = t.query;
      const container = containerOf(pod, t.name, q.get('container') ?? '');
      const o = logOptionsOf(q, t.name, Date.now());
      if (logs.size >= maxSessions) throw new ApiError('TooManyRequests', `too many log streams open (at most ${maxSessions}); try again later`);
      const ac = new AbortController();
      res.once('close', () => ac.abort());
      let started = false;
      const start = () => {
        if (started) return;
        started = true;
        res.writeHead(200, { 'Content-Type': 'text/plain', 'Cache-Control': 'no-cache, private', 'Transfer-Encoding': 'chunked' });
      };
      if (req.method === 'HEAD') {
        start();
        res.end();
        return;
      }
      logs.add(res);
      try {
        await streams().log(ref, {
          container,
          ...o,
          signal: ac.signal,
          write: (chunk) => {
            start();
            return writeOrDrop(res, chunk, stallMs, () => opts.log.warn('dropping a pod log client that is not reading', { pod: `${t.namespace}/${t.name}`, container }));
          },
        });
      } catch (err) {
        // Once output has begun the status line is gone: the connection ends instead.
        if (started) {
          res.destroy();
          return;
        }
        throw apiErrorOf(err);
      } finally {
        logs.delete(res);
      }
      start();
      res.end();
    },
  };

  const streaming = (name: 'exec' | 'attach' | 'portforward'): Subresource => ({
    kind: name === 'portforward' ? 'PodPortForwardOptions' : name === 'exec' ? 'PodExecOptions' : 'PodAttachOptions',
    verbs: ['create', 'get'],
    async handle(req) {
      req.resume();
      // As kube-apiserver answers a connect request without one: the streams need an upgraded connection.
      throw badRequest('Upgrade request required');
    },
    async upgrade(req, socket, head, t) {
      if (req.method !== 'GET' && req.method !== 'POST') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
      const upgrade = String(req.headers.upgrade ?? '').toLowerCase();
      if (upgrade !== 'websocket' && upgrade !== 'spdy/3.1') throw badRequest(`unsupported upgrade "${req.headers.upgrade ?? ''}": SPDY/3.1 or websocket`);
      const tunnelled = name === 'portforward' && upgrade === 'websocket';
      if (tunnelled && !offers(req, SPDY_TUNNEL_PROTOCOL)) {
        // Refused before any work; a client that can falls back to SPDY on a handshake that is not a 101.
        throw badRequest(`port-forward over WebSocket needs the subprotocol ${SPDY_TUNNEL_PROTOCOL}; or use SPDY/3.1`);
      }
      if (relays.size >= maxSessions) throw new ApiError('TooManyRequests', `too many streaming sessions open (at most ${maxSessions}); try again later`);
      relays.add(socket);
      socket.once('close', () => relays.delete(socket));
      const { pod, ref } = podOf(t);
      const q = t.query;
      let url: string;
      if (name === 'portforward') {
        const ports = q.getAll('port').map((p) => {
          const n = Number(p);
          if (!/^\d{1,5}$/.test(p) || n < 1 || n > 65535) throw badRequest(`invalid port "${p}": must be 1-65535`);
          return n;
        });
        if (ports.length > 64) throw badRequest('at most 64 ports may be forwarded at once');
        url = await streams().portForward(ref, ports).catch((err: unknown) => Promise.reject(apiErrorOf(err)));
      } else {
        const phase = ((pod.status ?? {}) as { phase?: string }).phase;
        if (phase === 'Succeeded' || phase === 'Failed') throw badRequest(`cannot ${name} into a container in a completed pod; current phase is ${phase}`);
        const container = containerOf(pod, t.name, q.get('container') ?? '');
        const flags = { container, stdin: flag(q, 'stdin', 'input'), stdout: flag(q, 'stdout', 'output'), stderr: flag(q, 'stderr', 'error'), tty: flag(q, 'tty', 'tty') };
        if (!flags.stdin && !flags.stdout && !flags.stderr) throw badRequest('you must specify at least 1 of stdin, stdout, stderr');
        if (name === 'exec') {
          const command = q.getAll('command');
          if (command.length === 0) throw badRequest('you must specify at least one command for the container');
          url = await streams().exec(ref, { ...flags, command }).catch((err: unknown) => Promise.reject(apiErrorOf(err)));
        } else {
          url = await streams().attach(ref, flags).catch((err: unknown) => Promise.reject(apiErrorOf(err)));
        }
      }
      if (socket.destroyed) return;
      await (tunnelled ? tunnel : relay)(req, socket, head, url, upgradeMs, opts.log);
    },
  });

  return {
    subresources: { 'pods/log': log, 'pods/exec': streaming('exec'), 'pods/attach': streaming('attach'), 'pods/portforward': streaming('portforward') },
    close() {
      for (const s of relays) s.destroy();
      for (const r of logs) r.destroy();
    },
  };
}

function offers(req: IncomingMessage, protocol: string): boolean {
  return String(req.headers['sec-websocket-protocol'] ?? '')
    .split(',')
    .some((p) => p.trim() === protocol);
}

/** kube-apiserver's query flags: `stdin=true` (what kubectl sends) or the kubelet's `input=1`. */
function flag(q: URLSearchParams, name: string, alias: string): boolean {
  const v = q.get(name) ?? q.get(alias);
  return v === 'true' || v === '1';
}

/** The container a request names, or the pod's only one; the API server's words when it cannot tell. */
export function containerOf(pod: Obj, podName: string, named: string): string {
  const spec = (pod.spec ?? {}) as { containers?: Array<{ name: string }>; initContainers?: Array<{ name: string }>; ephemeralContainers?: Array<{ name: string }> };
  const containers = spec.containers ?? [];
  const all = [...(spec.initContainers ?? []), ...containers, ...(spec.ephemeralContainers ?? [])].map((c) => c.name);
  if (named === '') {
    if (containers.length === 1) return containers[0]!.name;
    if (containers.length === 0) throw badRequest(`a container name must be specified for pod ${podName}`);
    throw badRequest(`a container name must be specified for pod ${podName}, choose one of: [${all.join(' ')}]`);
  }
  if (!all.includes(named)) throw badRequest(`container ${named} is not valid for pod ${podName}`);
  return named;
}

type LogQuery = Omit<PodLogRequest, 'container' | 'signal' | 'write'>;

/** PodLogOptions from the query, validated as the API server does (422 Invalid, naming the field). */
export function logOptionsOf(q: URLSearchParams, podName: string, now: number): LogQuery {
  const bool = (k: string): boolean => {
    const v = q.get(k);
    if (v === null || v === '' || v === 'false' || v === '0') return false;
    if (v === 'true' || v === '1') return true;
    throw badRequest(`invalid value for ${k}: "${v}" is not a boolean`);
  };
  const causes: Array<{ field: string; message: string }> = [];
  const int = (k: string, min: number): number | undefined => {
    const v = q.get(k);
    if (v === null || v === '') return undefined;
    if (!/^-?\d{1,18}$/.test(v)) throw badRequest(`invalid value for ${k}: "${v}" is not an integer`);
    const n = Number(v);
    if (n < min) causes.push({ field: k, message: `Invalid value: ${n}: must be greater than ${min === 0 ? 'or equal to 0' : '0'}` });
    return n;
  };
  const tailLines = int('tailLines', 0);
  const sinceSeconds = int('sinceSeconds', 1);
  const limitBytes = int('limitBytes', 1);
  const sinceTime = q.get('sinceTime');
  let since: number | undefined;
  if (sinceTime !== null && sinceTime !== '') {
    since = Date.parse(sinceTime);
    if (!/^\d{4}-\d\d-\d\dT/.test(sinceTime) || Number.isNaN(since)) throw badRequest(`invalid value for sinceTime: "${sinceTime}" is not an RFC 3339 time`);
  }
  if (sinceSeconds !== undefined && since !== undefined) causes.push({ field: '', message: 'at most one of `sinceTime` or `sinceSeconds` may be specified' });
  if (causes.length > 0) {
    const text = causes.map((c) => (c.field ? `${c.field}: ${c.message}` : c.message)).join(', ');
    throw new ApiError('Invalid', `PodLogOptions "${podName}" is invalid: ${causes.length > 1 ? `[${text}]` : text}`, {
      name: podName,
      kind: 'PodLogOptions',
      causes: causes.map((c) => ({ reason: 'FieldValueInvalid', message: c.message, field: c.field })),
    });
  }
  if (sinceSeconds !== undefined) since = now - sinceSeconds * 1000;
  return { follow: bool('follow'), previous: bool('previous'), timestamps: bool('timestamps'), tailLines, since, limitBytes };
}

/** The headers of an upgrade that the streaming server needs to answer it (nothing about the client's credentials). */
const FORWARDED = ['connection', 'upgrade', 'sec-websocket-key', 'sec-websocket-version', 'sec-websocket-protocol', 'sec-websocket-extensions', 'x-stream-protocol-version'];

/** kubectl 1.35's port-forward: SPDY carried in WebSocket binary messages, under this subprotocol. */
export const SPDY_TUNNEL_PROTOCOL = 'SPDY/3.1+portforward.k8s.io';

/** What ws is shown in place of SPDY_TUNNEL_PROTOCOL, which is not a token it accepts. */
const TUNNEL_STAND_IN = 'spdy-portforward-tunnel';

/** The largest WebSocket message a tunnel takes (kubectl writes at most 32 KiB at a time). */
const TUNNEL_MAX_MESSAGE = 1024 * 1024;

type Dialed = { upgraded: true; res: IncomingMessage; socket: Duplex; head: Buffer } | { upgraded: false; res: IncomingMessage };

/**
 * Sends an upgrade request to the streaming URL; resolves with its 101 and
 * the connection, or with the refusal it answered; rejects if it does not
 * answer in time or cannot be reached. Ends early if `client` goes away.
 */
function dial(url: string, method: string, headers: Record<string, string>, timeoutMs: number, client: Duplex): Promise<Dialed> {
  const target = new URL(url);
  if (target.protocol !== 'http:') return Promise.reject(new Error(`the runtime's streaming URL is not http: ${target.protocol}`));
  return new Promise((resolve, reject) => {
    const up = http.request({ agent: false, host: target.hostname.replace(/^\[|\]$/g, ''), port: target.port, path: `${target.pathname}${target.search}`, method, headers, timeout: timeoutMs });
    const gone = () => up.destroy(new Error('the client went away'));
    client.once('close', gone);
    const done = () => client.off('close', gone);
    up.on('timeout', () => up.destroy(new Error(`no answer in ${timeoutMs} ms`)));
    up.on('error', (err) => {
      done();
      reject(err);
    });
    up.on('response', (res) => {
      done();
      resolve({ upgraded: false, res });
    });
    up.on('upgrade', (res, socket, head) => {
      done();
      socket.setTimeout(0);
      resolve({ upgraded: true, res, socket, head });
    });
    up.end();
  });
}

/** Joins two connections until either ends (pipe: each side read only as fast as the other takes it). */
function join(a: Duplex, b: Duplex): void {
  const end = () => {
    a.destroy();
    b.destroy();
  };
  for (const s of [a, b]) {
    s.on('error', end);
    s.on('close', end);
  }
  a.pipe(b);
  b.pipe(a);
}

/** The streaming server's refusal (404 for a stale URL, 403 for no common protocol), passed on as it said it, at most 64 KiB. */
function passRefusal(socket: Duplex, res: IncomingMessage): void {
  const lines = [`HTTP/1.1 ${res.statusCode} ${res.statusMessage ?? ''}`, 'Connection: close', `Content-Type: ${res.headers['content-type'] ?? 'text/plain'}`];
  socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  let size = 0;
  res.on('data', (d: Buffer) => {
    size += d.length;
    if (size <= 64 * 1024) socket.write(d);
  });
  res.on('end', () => socket.end());
  res.on('error', () => socket.destroy());
}

/**
 * Sends the client's upgrade on to the streaming URL and, once it answers
 * 101, passes that answer back and joins the two connections; any other
 * answer goes back to the client as it came.
 */
async function relay(req: IncomingMessage, socket: Duplex, head: Buffer, url: string, timeoutMs: number, log: Logger): Promise<void> {
  const headers: Record<string, string> = {};
  for (const h of FORWARDED) {
    const v = req.headers[h];
    if (v !== undefined) headers[h] = Array.isArray(v) ? v.join(', ') : v;
  }
  const d = await dialed(url, req.method ?? 'GET', headers, timeoutMs, socket, log);
  if (!d) return;
  const lines = [`HTTP/1.1 101 ${d.res.statusMessage || 'Switching Protocols'}`];
  for (let i = 0; i + 1 < d.res.rawHeaders.length; i += 2) lines.push(`${d.res.rawHeaders[i]}: ${d.res.rawHeaders[i + 1]}`);
  socket.write(`${lines.join('\r\n')}\r\n\r\n`);
  if (d.head.length) socket.write(d.head);
  if (head.length) d.socket.write(head);
  join(socket, d.socket);
}

/**
 * kubectl 1.35's port-forward: the API takes the WebSocket itself and opens
 * SPDY to the streaming server, then carries the SPDY bytes between the two
 * (each binary message's payload out, each read in as a message), as
 * kube-apiserver's tunneling handler does.
 */
async function tunnel(req: IncomingMessage, socket: Duplex, head: Buffer, url: string, timeoutMs: number, log: Logger): Promise<void> {
  const d = await dialed(url, 'POST', { connection: 'Upgrade', upgrade: 'SPDY/3.1', 'x-stream-protocol-version': 'portforward.k8s.io' }, timeoutMs, socket, log);
  if (!d) return;
  // A handshake ws refuses (a bad key) closes the client without calling back: the SPDY side goes with it.
  socket.once('close', () => d.socket.destroy());
  const { wss, createWebSocketStream } = await tunnelServer();
  if (socket.destroyed) return;
  // ws takes only RFC 6455 tokens as subprotocols, and kubectl's has a "/": ws sees a stand-in, and its
  // answer is given the real name back (tunnelServer's 'headers' hook).
  req.headers['sec-websocket-protocol'] = TUNNEL_STAND_IN;
  wss.handleUpgrade(req, socket, head, (ws) => {
    if (d.head.length) ws.send(d.head);
    join(createWebSocketStream(ws), d.socket);
  });
}

let tunnels: Promise<{ wss: import('ws').WebSocketServer; createWebSocketStream: typeof import('ws').createWebSocketStream }> | undefined;

/** ws is loaded for the first tunnel: a node whose clients never port-forward with kubectl 1.35 needs none of it. */
function tunnelServer(): NonNullable<typeof tunnels> {
  tunnels ??= import('ws').then(({ WebSocketServer, createWebSocketStream }) => {
    const wss = new WebSocketServer({ noServer: true, maxPayload: TUNNEL_MAX_MESSAGE, perMessageDeflate: false, handleProtocols: (offered) => (offered.has(TUNNEL_STAND_IN) ? TUNNEL_STAND_IN : false) });
    wss.on('headers', (headers) => {
      for (let i = 0; i < headers.length; i++) if (headers[i] === `Sec-WebSocket-Protocol: ${TUNNEL_STAND_IN}`) headers[i] = `Sec-WebSocket-Protocol: ${SPDY_TUNNEL_PROTOCOL}`;
    });
    return { wss, createWebSocketStream };
  });
  const loading = tunnels;
  loading.catch(() => {
    if (tunnels === loading) tunnels = undefined;
  });
  return loading;
}

/** dial, with its failures answered to the client: undefined when there is nothing left to relay. */
async function dialed(url: string, method: string, headers: Record<string, string>, timeoutMs: number, socket: Duplex, log: Logger): Promise<Extract<Dialed, { upgraded: true }> | undefined> {
  let d: Dialed;
  try {
    d = await dial(url, method, headers, timeoutMs, socket);
  } catch (err) {
    log.warn('pod streaming relay failed', { error: (err as Error).message });
    writeStatus(socket, new ApiError('InternalError', `error dialing the container runtime's streaming server: ${(err as Error).message}`));
    return undefined;
  }
  if (!d.upgraded) {
    passRefusal(socket, d.res);
    return undefined;
  }
  if (socket.destroyed) {
    d.socket.destroy();
    return undefined;
  }
  return d;
}
