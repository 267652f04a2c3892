/**
 * The agent's read-only status API, on the kubelet's read-only port
 * (127.0.0.1:10255 by default): pods (listed, one at a time, or watched as
 * the API server's watch streams them), events, manifest problems, metrics,
 * the stats summary and container logs. Only GET and HEAD; nothing here
 * changes anything.
 *
 * Everyone on the host can reach it, so it is bounded: a cap on
 * connections, shared out by the uid that owns each peer's socket (a few per
 * non-root user, room kept for root), a deadline for request headers, and a
 * watch or log client that stops reading is dropped instead of buffered for.
 */
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Container, Event, Pod } from 'kubernetes-types/core/v1.js';
import { errorMessage, isErrno } from '../errors.js';
import { silentLogger, ThrottledWarning, type Logger } from '../log.js';
import { SockDiag } from '../sys/sock-diag.js';
import { budgetLimits, ConnectionBudget, UNKNOWN_UID } from './connection-budget.js';
import { streamCriLog } from './cri-log.js';
import { UnsafeLogError } from './log-files.js';
import type { AgentMetrics } from './metrics.js';
import type { AgentView, PodWatchType } from './model.js';
import type { Summary } from './stats-summary.js';
import { writeOrDrop } from '../slow-reader.js';

export const DEFAULT_STATUS_ADDRESS = '127.0.0.1:10255';
export const DEFAULT_MAX_CONNECTIONS = 128;
export const DEFAULT_HEADERS_TIMEOUT_MS = 10_000;
/**
 * What a watch client may leave unread (beyond the initial listing) before it
 * is dropped: with the connection cap, at most 128 MiB for all of them.
 */
export const DEFAULT_MAX_STREAM_BUFFER = 1024 * 1024;
/** How long a log client may leave the agent waiting to write before it is dropped. */
export const DEFAULT_STALL_TIMEOUT_MS = 60_000;

export interface StatusServerOptions {
  /** "host:port"; port 0 picks a free one. */
  address: string;
  view: AgentView;
  metrics?: AgentMetrics;
  summary?: { build(): Promise<Summary> };
  log?: Logger;
  maxConnections?: number;
  /** Connections one non-root uid may hold (16, at most what non-root uids share). */
  maxConnectionsPerUser?: number;
  /** Connections non-root uids together leave to root (a quarter of maxConnections). */
  reservedForRoot?: number;
  /** The uid that owns a peer's socket; undefined when unknown (never taken as root). A netlink lookup by default. */
  peerUid?: (socket: Socket) => number | undefined;
  /** At most one line per this interval about refused connections (10 s). */
  refusalLogIntervalMs?: number;
  headersTimeoutMs?: number;
  maxStreamBuffer?: number;
  stallTimeoutMs?: number;
  /** How often a followed log file is checked when no change notice comes. */
  logPollMs?: number;
  /** How long a followed log may be missing (mid-rotation) before the stream ends. */
  logGoneGraceMs?: number;
}

/** "127.0.0.1:10255", "[::1]:0", "localhost:8080". */
export function parseAddress(address: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:[\]]*)):(\d{1,5})$/.exec(address);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new Error(`status address must be host:port, not "${address}"`);
  return { host: m[1] ?? (m[2] || '127.0.0.1'), port };
}

/** A v1 Status, as the API server answers errors. */
export function statusObject(code: number, reason: string, message: string): Record<string, unknown> {
  return { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
}

const REASONS: Record<number, string> = { 400: 'BadRequest', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed', 500: 'InternalError', 503: 'ServiceUnavailable' };

class HttpError extends Error {
  constructor(
    readonly code: number,
    message: string,
  ) {
    super(message);
  }
}

function boolParam(q: URLSearchParams, name: string): boolean {
  const v = q.get(name);
  if (v === null) return false;
  if (['', 'true', '1', 't', 'T', 'TRUE', 'True'].includes(v)) return true;
  if (['false', '0', 'f', 'F', 'FALSE', 'False'].includes(v)) return false;
  throw new HttpError(400, `${name} must be true or false, not "${v}"`);
}

function withKind(pod: Pod): Pod {
  return { apiVersion: 'v1', kind: 'Pod', ...pod };
}

function allContainers(pod: Pod): Container[] {
  return [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? []), ...((pod.spec?.ephemeralContainers ?? []) as Container[])];
}

export class StatusServer {
  private readonly server: http.Server;
  private readonly sockets = new Set<Socket>();
  private readonly log: Logger;
  private readonly budget: ConnectionBudget<Socket>;
  private readonly diag = new SockDiag();
  private readonly peerUid: (socket: Socket) => number | undefined;
  private readonly refusals: ThrottledWarning;
  private streams = 0;

  private constructor(private readonly opts: StatusServerOptions) {
    this.log = opts.log ?? silentLogger;
    const headersTimeout = opts.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS;
    this.server = http.createServer(
      {
        headersTimeout,
        requestTimeout: Math.max(headersTimeout, 30_000),
        keepAliveTimeout: 5_000,
        // How often Node checks the two deadlines above (its default, 30 s, would let a slow client linger).
        connectionsCheckingInterval: Math.min(1_000, headersTimeout),
      },
      (req, res) => this.handle(req, res),
    );
    this.budget = new ConnectionBudget(budgetLimits(opts.maxConnections ?? DEFAULT_MAX_CONNECTIONS, opts.maxConnectionsPerUser, opts.reservedForRoot));
    this.peerUid =
      opts.peerUid ??
      ((s) => (s.remoteAddress && s.localAddress ? this.diag.peerUid({ address: s.remoteAddress, port: s.remotePort!, localAddress: s.localAddress, localPort: s.localPort! }) : undefined));
    this.refusals = new ThrottledWarning(this.log, 'status API connections refused or shed: too many connections', opts.refusalLogIntervalMs ?? 10_000);
    // Before the HTTP parser is attached: a refused connection costs nothing more.
    this.server.prependListener('connection', (s: Socket) => this.admit(s));
    this.server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
      // A connection answering a request is shed after those that wait for one.
      const s = req.socket;
      this.budget.setBusy(s, true);
      res.once('close', () => this.budget.setBusy(s, false));
    });
    this.server.on('clientError', (err, socket) => {
      const timedOut = (err as { code?: string }).code === 'ERR_HTTP_REQUEST_TIMEOUT';
      if (socket.writable) socket.end(`HTTP/1.1 ${timedOut ? '408 Request Timeout' : '400 Bad Request'}\r\nConnection: close\r\n\r\n`);
      socket.destroy();
    });
  }

  static async listen(opts: StatusServerOptions): Promise<StatusServer> {
    const s = new StatusServer(opts);
    const { host, port } = parseAddress(opts.address);
    await new Promise<void>((resolve, reject) => {
      s.server.once('error', reject);
      s.server.listen(port, host, () => {
        s.server.off('error', reject);
        resolve();
      });
    });
    s.server.on('error', (err) => s.log.error('status API server error', { error: errorMessage(err) }));
    return s;
  }

  get port(): number {
    return (this.server.address() as { port: number }).port;
  }

  get url(): string {
    const a = this.server.address() as { address: string; port: number };
    return `http://${a.address.includes(':') ? `[${a.address}]` : a.address}:${a.port}`;
  }

  /** Open watch and log streams. */
  get activeStreams(): number {
    return this.streams;
  }

  get connections(): number {
    return this.sockets.size;
  }

  /** Connections held by one uid (-1: peers whose owner is not known). */
  connectionsOf(uid: number): number {
    return this.budget.held(uid);
  }

  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    await closed;
    this.refusals.flush();
    this.diag.close();
  }

  private admit(s: Socket): void {
    s.on('error', () => undefined);
    const uid = this.peerUid(s) ?? UNKNOWN_UID;
    const a = this.budget.admit(s, uid);
    if (!a.admit) {
      this.refusals.note({ reason: a.reason, uid, ...this.budget.limits });
      s.destroy();
      return;
    }
    this.sockets.add(s);
    s.once('close', () => {
      this.sockets.delete(s);
      this.budget.remove(s);
    });
    if (a.shed) {
      this.refusals.note({ reason: 'shed for a newcomer', uid: a.shed.uid, ...this.budget.limits });
      a.shed.conn.destroy();
    }
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    res.on('error', () => undefined);
    this.route(req, res).catch((err: unknown) => {
      const code = err instanceof HttpError ? err.code : 500;
      if (code === 500) this.log.warn('status API request failed', { url: req.url, error: errorMessage(err) });
      if (res.headersSent) {
        res.destroy();
        return;
      }
      this.json(res, code, statusObject(code, REASONS[code] ?? 'InternalError', errorMessage(err)));
    });
  }

  private async route(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.setHeader('Allow', 'GET, HEAD');
      throw new HttpError(405, `the status API is read-only: ${req.method} is not allowed`);
    }
    const url = new URL(req.url ?? '/', 'http://status.invalid');
    let parts: string[];
    try {
      parts = url.pathname.split('/').filter(Boolean).map(decodeURIComponent);
    } catch {
      throw new HttpError(400, 'malformed path');
    }
    const q = url.searchParams;
    const v = this.opts.view;
    const [first, ...rest] = parts;
    switch (first) {
      case 'healthz':
        if (rest.length) break;
        res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' });
        res.end('ok');
        return;
      case 'pods': {
        if (rest.length > 2) break;
        const [ns, name] = rest;
        if (boolParam(q, 'watch')) return this.watchPods(req, res, ns, name);
        if (name !== undefined) {
          const pod = v.pod(ns!, name);
          if (!pod) throw new HttpError(404, `pods "${name}" not found in namespace "${ns}"`);
          return this.json(res, 200, withKind(pod));
        }
        const items = v.pods().filter((p) => ns === undefined || (p.metadata?.namespace ?? 'default') === ns);
        return this.json(res, 200, { kind: 'PodList', apiVersion: 'v1', metadata: {}, items: items.map(withKind) });
      }
      case 'events': {
        if (rest.length !== 0 && rest.length !== 2) break;
        const [ns, name] = rest;
        const items = v.events().filter((e: Event) => ns === undefined || (e.involvedObject.namespace === ns && e.involvedObject.name === name));
        return this.json(res, 200, { kind: 'EventList', apiVersion: 'v1', metadata: {}, items });
      }
      case 'services': {
        if (rest.length > 2 || !v.services) break;
        const [ns, name] = rest;
        const items = v.services().filter((x) => (ns === undefined || x.metadata?.namespace === ns) && (name === undefined || x.metadata?.name === name));
        if (name !== undefined) {
          if (!items.length) throw new HttpError(404, `services "${name}" not found in namespace "${ns}"`);
          return this.json(res, 200, items[0]);
        }
        return this.json(res, 200, { kind: 'ServiceList', apiVersion: 'v1', metadata: {}, items });
      }
      case 'workloads': {
        // Deployments, DaemonSets, Jobs and CronJobs as their controllers see them; /workloads/<kind> narrows.
        if (rest.length > 1 || !v.workloads) break;
        const kind = rest[0]?.toLowerCase();
        const items = v.workloads().filter((w) => kind === undefined || w.kind.toLowerCase() === kind || `${w.kind.toLowerCase()}s` === kind);
        return this.json(res, 200, { kind: 'WorkloadList', items });
      }
      case 'manifests':
        if (rest.length) break;
        return this.json(res, 200, { kind: 'ManifestProblemList', items: v.problems() });
      case 'metrics': {
        if (rest.length || !this.opts.metrics) break;
        const text = await this.opts.metrics.text();
        res.writeHead(200, { 'Content-Type': this.opts.metrics.contentType });
        res.end(text);
        return;
      }
      case 'stats':
        if (rest.length !== 1 || rest[0] !== 'summary' || !this.opts.summary) break;
        return this.json(res, 200, await this.opts.summary.build());
      case 'containerLogs':
        if (rest.length !== 3) break;
        return this.containerLogs(req, res, rest[0]!, rest[1]!, rest[2]!, q);
    }
    throw new HttpError(404, `the server could not find the requested resource (${url.pathname})`);
  }

  private json(res: http.ServerResponse, code: number, body: unknown): void {
    const text = JSON.stringify(body);
    res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  }

  /**
   * Newline-delimited watch events, as the API server streams them: the
   * pods there are now as ADDED, then every change. A client whose unread
   * output passes the bound is dropped.
   */
  private watchPods(req: http.IncomingMessage, res: http.ServerResponse, ns: string | undefined, name: string | undefined): void {
    const matches = (p: Pod) => (ns === undefined || (p.metadata?.namespace ?? 'default') === ns) && (name === undefined || p.metadata?.name === name);
    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' });
    if (req.method === 'HEAD') {
      res.end();
      return;
    }
    let limit = this.opts.maxStreamBuffer ?? DEFAULT_MAX_STREAM_BUFFER;
    const send = (type: PodWatchType, pod: Pod) => res.write(`${JSON.stringify({ type, object: withKind(pod) })}\n`);
    let stop: (() => void) | undefined;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      this.streams--;
      stop?.();
    };
    this.streams++;
    res.once('close', finish);
    // Subscribe before listing, both synchronously: no change can fall between the two.
    stop = this.opts.view.watchPods((type, pod) => {
      // Called from the agent's own code: nothing here may throw into it.
      try {
        if (done || !matches(pod)) return;
        if (res.writableLength > limit) {
          this.log.warn('dropping a pod watch client that is not reading', { buffered: res.writableLength });
          finish();
          res.destroy();
          return;
        }
        send(type, pod);
      } catch (err) {
        this.log.warn('pod watch client failed', { error: errorMessage(err) });
        finish();
        res.destroy();
      }
    });
    for (const p of this.opts.view.pods()) if (matches(p)) send('ADDED', p);
    // A big node's first listing may itself be more than the bound: the client gets time to read it.
    limit += res.writableLength;
  }

  /** The kubelet's /containerLogs/<namespace>/<pod>/<container>: the container's output, from its CRI log file. */
  private async containerLogs(req: http.IncomingMessage, res: http.ServerResponse, ns: string, podName: string, container: string, q: URLSearchParams): Promise<void> {
    const follow = boolParam(q, 'follow');
    const previous = boolParam(q, 'previous');
    const timestamps = boolParam(q, 'timestamps');
    const tailText = q.get('tailLines');
    let tailLines: number | undefined;
    if (tailText !== null) {
      tailLines = Number(tailText);
      if (!/^\d{1,9}$/.test(tailText)) throw new HttpError(400, `tailLines must be a non-negative integer, not "${tailText}"`);
    }
    const pod = this.opts.view.pod(ns, podName);
    if (!pod) throw new HttpError(404, `pods "${podName}" not found in namespace "${ns}"`);
    if (!allContainers(pod).some((c) => c.name === container)) throw new HttpError(400, `container ${container} is not valid for pod ${podName}`);
    const ref = await this.opts.view.logPath(ns, podName, container, previous);
    if (!ref) {
      throw new HttpError(
        previous ? 400 : 404,
        previous ? `previous terminated container "${container}" in pod "${podName}" not found` : `container "${container}" in pod "${podName}" has no log yet`,
      );
    }
    const ac = new AbortController();
    const stall = this.opts.stallTimeoutMs ?? DEFAULT_STALL_TIMEOUT_MS;
    let started = false;
    const start = () => {
      if (started) return;
      started = true;
      res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8', 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' });
    };
    res.once('close', () => ac.abort());
    if (req.method === 'HEAD') {
      start();
      res.end();
      return;
    }
    this.streams++;
    try {
      await streamCriLog(ref, {
        tailLines,
        onUnsafe: (err) => this.log.warn('stopped following a container log replaced by something unsafe to read', { pod: `${ns}/${podName}`, container, error: err.message }),
        follow,
        timestamps,
        signal: ac.signal,
        pollMs: this.opts.logPollMs,
        goneGraceMs: this.opts.logGoneGraceMs,
        write: (chunk) => {
          start();
          return writeOrDrop(res, chunk, stall, () => this.log.warn('dropping a log client that is not reading', { pod: `${ns}/${podName}`, container }));
        },
      });
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new HttpError(404, `the log of container "${container}" in pod "${podName}" is gone`);
      if (err instanceof UnsafeLogError) {
        // The pod has been at its own log directory (a hostPath reaching it): say so to the operator, serve nothing.
        this.log.warn('refusing to serve a container log that is not a plain file', { pod: `${ns}/${podName}`, container, error: err.message });
        throw new HttpError(403, `the log of container "${container}" in pod "${podName}" is not a regular file of its own (${err.why}); not serving it`);
      }
      throw err;
    } finally {
      this.streams--;
    }
    start();
    res.end();
  }
}
