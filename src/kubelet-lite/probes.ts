/**
 * One probe run, as the kubelet's prober does it: exec through the CRI's
 * ExecSync, an HTTP GET, a TCP connect, or a grpc.health.v1 Check. Each run
 * is bounded by the probe's timeout and leaves no socket or timer behind; it
 * never throws. A result of 'unknown' means the probe could not be run at
 * all (the container is gone, the port has no such name): the prober keeps
 * its previous result, as the kubelet throws away an errored probe.
 */
import * as grpc from '@grpc/grpc-js';
import http from 'node:http';
import http2 from 'node:http2';
import https from 'node:https';
import net from 'node:net';
import type { Container, EnvVar, HTTPHeader, Probe } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import { grpcCode, type CriEndpoint } from './cri-client.js';
import { healthCheckMethod } from './health-proto.js';
import type { ProbeOutcome, ProbeRunner, ProbeTarget } from './model.js';

/** The Kubernetes minor the agent behaves as; probes say `kube-probe/<this>`. */
export const KUBE_VERSION = '1.30';
/** How much of a probe's output (exec) or response body (HTTP) is read: the kubelet's 10 KiB. */
export const PROBE_OUTPUT_LIMIT = 10 * 1024;
/** Redirects to the same host an HTTP probe follows before it fails. */
export const MAX_REDIRECTS = 10;
/**
 * ExecSync tells the runtime the probe's timeout, and the runtime kills the
 * command when it passes; the gRPC call itself may take this much longer,
 * so the runtime's own answer ("timed out") arrives before ours.
 */
export const EXEC_GRACE_MS = 1_000;

export interface ProbeRunnerOptions {
  cri: CriEndpoint;
  /** Default `kube-probe/<KUBE_VERSION>`. */
  userAgent?: string;
  execGraceMs?: number;
}

const success = (message = ''): ProbeOutcome => ({ result: 'success', message });
const failure = (message: string): ProbeOutcome => ({ result: 'failure', message });
const unknown = (message: string): ProbeOutcome => ({ result: 'unknown', message });

export function createProbeRunner(o: ProbeRunnerOptions): ProbeRunner {
  const userAgent = o.userAgent ?? `kube-probe/${KUBE_VERSION}`;
  const grace = o.execGraceMs ?? EXEC_GRACE_MS;
  return {
    async probe(p: Probe, target: ProbeTarget, signal?: AbortSignal): Promise<ProbeOutcome> {
      const timeoutMs = probeTimeoutMs(p);
      try {
        if (signal?.aborted) return unknown('probe cancelled');
        if (p.exec) return await execProbe(o.cri, p.exec.command ?? [], target, timeoutMs, grace, signal);
        if (p.httpGet) {
          const port = resolvePort(p.httpGet.port, target.container);
          if (typeof port === 'string') return unknown(port);
          const host = p.httpGet.host || target.podIP;
          if (!host) return unknown('no pod IP to probe');
          const url = probeURL(p.httpGet.scheme ?? 'HTTP', host, port, p.httpGet.path ?? '/');
          if (typeof url === 'string') return unknown(url);
          return await httpProbe(url, p.httpGet.httpHeaders ?? [], userAgent, timeoutMs, signal);
        }
        if (p.tcpSocket) {
          const port = resolvePort(p.tcpSocket.port, target.container);
          if (typeof port === 'string') return unknown(port);
          const host = p.tcpSocket.host || target.podIP;
          if (!host) return unknown('no pod IP to probe');
          return await tcpProbe(host, port, timeoutMs, signal);
        }
        if (p.grpc) {
          if (!target.podIP) return unknown('no pod IP to probe');
          return await grpcProbe(target.podIP, p.grpc.port, p.grpc.service ?? '', userAgent, timeoutMs, signal);
        }
        return unknown(`missing probe handler for container "${target.container.name}"`);
      } catch (err) {
        return unknown(`probe errored: ${errorMessage(err)}`);
      }
    },
  };
}

/**
 * The longest delay a Node timer takes (about 24.8 days): a longer one fires
 * after 1 ms instead. Any timeout or period a manifest gives is cut to it.
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

export function timerMs(ms: number): number {
  return Math.min(Math.max(0, ms), MAX_TIMER_MS);
}

export function probeTimeoutMs(p: Probe): number {
  const s = p.timeoutSeconds ?? 1;
  return timerMs((s > 0 ? s : 1) * 1000);
}

// ---------------------------------------------------------------- exec

/**
 * `$(VAR)` in an exec probe's command, from the container's literal env
 * values only (no valueFrom: the probe runs without the pod's environment);
 * `$$` is a literal `$`, an unknown `$(VAR)` stays as written.
 */
export function expandCommand(cmd: string[], env: EnvVar[] | undefined): string[] {
  const vars = new Map<string, string>();
  for (const e of env ?? []) if (e.valueFrom === undefined) vars.set(e.name, e.value ?? '');
  return cmd.map((arg) => {
    let out = '';
    for (let i = 0; i < arg.length; i++) {
      const c = arg[i]!;
      if (c !== '$' || i + 1 >= arg.length) {
        out += c;
        continue;
      }
      const next = arg[i + 1]!;
      if (next === '$') {
        out += '$';
        i++;
      } else if (next === '(') {
        const close = arg.indexOf(')', i + 2);
        if (close < 0) {
          out += arg.slice(i);
          break;
        }
        const name = arg.slice(i + 2, close);
        out += vars.has(name) ? vars.get(name) : `$(${name})`;
        i = close;
      } else {
        out += c;
      }
    }
    return out;
  });
}

export type ExecRun =
  | { kind: 'exited'; exitCode: number; output: string }
  | { kind: 'timeout'; message: string }
  | { kind: 'error'; message: string; notFound: boolean };

/**
 * One ExecSync bounded by `timeoutMs` (+ grace for the runtime's answer).
 * A timeout is what each runtime says it is: skiff and containerd answer
 * DEADLINE_EXCEEDED, CRI-O exit code -1 with "command timed out".
 */
export async function runExec(
  cri: CriEndpoint,
  containerId: string,
  cmd: string[],
  timeoutMs: number,
  graceMs: number,
  signal?: AbortSignal,
): Promise<ExecRun> {
  const label = JSON.stringify(cmd.join(' '));
  const timedOut: ExecRun = { kind: 'timeout', message: `command ${label} timed out` };
  const started = Date.now();
  const bound = timeoutMs + graceMs;
  const call = cri.runtime.execSync({ containerId, cmd, timeout: Math.max(1, Math.ceil(timeoutMs / 1000)) }, bound);
  let res;
  try {
    res = await bounded(call, bound, signal);
  } catch (err) {
    if (err === TIMED_OUT) return timedOut;
    if (err === CANCELLED) return { kind: 'error', message: 'cancelled', notFound: false };
    const code = grpcCode(err);
    if (code === grpc.status.DEADLINE_EXCEEDED) return timedOut;
    const details = (err as { details?: string }).details || errorMessage(err);
    return { kind: 'error', message: details, notFound: code === grpc.status.NOT_FOUND };
  }
  const output = Buffer.concat([Buffer.from(res.stdout ?? []), Buffer.from(res.stderr ?? [])])
    .subarray(0, PROBE_OUTPUT_LIMIT)
    .toString();
  if (res.exitCode === -1 && (/timed out/i.test(output) || Date.now() - started >= timeoutMs)) return timedOut;
  return { kind: 'exited', exitCode: res.exitCode ?? 0, output };
}

async function execProbe(
  cri: CriEndpoint,
  command: string[],
  target: ProbeTarget,
  timeoutMs: number,
  graceMs: number,
  signal?: AbortSignal,
): Promise<ProbeOutcome> {
  const cmd = expandCommand(command, target.container.env);
  const r = await runExec(cri, target.containerId, cmd, timeoutMs, graceMs, signal);
  switch (r.kind) {
    case 'exited':
      return r.exitCode === 0 ? success(r.output) : failure(r.output);
    case 'timeout':
      return failure(r.message);
    case 'error':
      return unknown(r.notFound ? `container ${target.containerId} not found: ${r.message}` : `exec probe errored: ${r.message}`);
  }
}

// ---------------------------------------------------------------- ports and URLs

/** An httpGet/tcpSocket port: a number, a named port of the container, or a number written as a string; else the reason. */
export function resolvePort(port: number | string | undefined, container: Container): number | string {
  let n: number;
  if (typeof port === 'number') n = port;
  else if (typeof port === 'string') {
    const named = container.ports?.find((p) => p.name === port);
    if (named) n = named.containerPort;
    else if (/^\d+$/.test(port)) n = Number(port);
    else return `port ${port} not found`;
  } else return 'no port given';
  return Number.isInteger(n) && n > 0 && n < 65536 ? n : `invalid port number: ${n}`;
}

export function hostPort(host: string, port: number): string {
  return net.isIPv6(host) ? `[${host}]:${port}` : `${host}:${port}`;
}

export function probeURL(scheme: string, host: string, port: number, path: string): URL | string {
  const s = scheme.toLowerCase();
  if (s !== 'http' && s !== 'https') return `unsupported scheme ${scheme}`;
  try {
    return new URL(`${s}://${hostPort(host, port)}${path.startsWith('/') ? path : `/${path}`}`);
  } catch {
    return `invalid URL for host ${host}, port ${port}, path ${path}`;
  }
}

// ---------------------------------------------------------------- http

const TIMED_OUT = Symbol('timed out');
const CANCELLED = Symbol('cancelled');

/** `p`, or a rejection with TIMED_OUT after `ms` / CANCELLED on abort; the timer and listener go either way. */
function bounded<T>(p: Promise<T>, ms: number, signal?: AbortSignal): Promise<T> {
  p.catch(() => undefined);
  return new Promise<T>((resolve, reject) => {
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const onAbort = () => {
      done();
      reject(CANCELLED);
    };
    const timer = setTimeout(() => {
      done();
      reject(TIMED_OUT);
    }, ms);
    timer.unref();
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        done();
        resolve(v);
      },
      (e) => {
        done();
        reject(e);
      },
    );
  });
}

export interface HttpAnswer {
  status: number;
  /** At most PROBE_OUTPUT_LIMIT bytes of it. */
  body: string;
  url: URL;
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);

/** Go's words for the socket errors a probe meets, so messages read as the kubelet's. */
function dialReason(err: NodeJS.ErrnoException): string {
  switch (err.code) {
    case 'ECONNREFUSED':
      return 'connect: connection refused';
    case 'EHOSTUNREACH':
      return 'connect: no route to host';
    case 'ENETUNREACH':
      return 'connect: network is unreachable';
    case 'ECONNRESET':
      return 'read: connection reset by peer';
    case 'ENOTFOUND':
    case 'EAI_AGAIN':
      return `lookup ${(err as { hostname?: string }).hostname ?? ''}: no such host`;
    default:
      return err.message;
  }
}

/**
 * The header list a probe or hook sends: the pod's headers (a Host header
 * becomes the request's Host), then User-Agent and Accept unless given.
 */
export function requestHeaders(list: HTTPHeader[], userAgent: string): http.OutgoingHttpHeaders {
  const out: Record<string, string | string[]> = {};
  const names = new Map<string, string>();
  for (const h of list) {
    if (!h.name) continue;
    const key = names.get(h.name.toLowerCase()) ?? h.name;
    names.set(h.name.toLowerCase(), key);
    const prev = out[key];
    out[key] = prev === undefined ? h.value : ([] as string[]).concat(prev, h.value);
  }
  if (!names.has('user-agent')) out['User-Agent'] = userAgent;
  if (!names.has('accept')) out['Accept'] = '*/*';
  // A single connection per probe, as the kubelet disables keep-alives.
  if (!names.has('connection')) out['Connection'] = 'close';
  return out;
}

/**
 * A GET that follows redirects only while they stay on the first URL's host
 * (a redirect elsewhere is returned as the answer), reads at most
 * PROBE_OUTPUT_LIMIT of the body, and is bounded as a whole by `timeoutMs`:
 * connect, headers, body and every redirect. Throws an Error whose message
 * reads like Go's client error (`Get "url": ...`).
 */
export async function boundedGet(url: URL, headers: http.OutgoingHttpHeaders, timeoutMs: number, signal?: AbortSignal): Promise<HttpAnswer> {
  const deadline = new AbortController();
  const timer = setTimeout(() => deadline.abort(TIMED_OUT), timeoutMs);
  timer.unref();
  const onAbort = () => deadline.abort(CANCELLED);
  if (signal?.aborted) onAbort();
  signal?.addEventListener('abort', onAbort, { once: true });
  try {
    const first = url;
    let current = url;
    for (let hops = 0; ; hops++) {
      const answer = await getOnce(current, headers, deadline.signal, (loc) => {
        try {
          // Only a redirect the loop will follow leaves its body unread.
          return new URL(loc, current).hostname === first.hostname;
        } catch {
          return true;
        }
      });
      const location = answer.location;
      if (!REDIRECTS.has(answer.status) || location === undefined) return answer;
      let next: URL;
      try {
        next = new URL(location, current);
      } catch {
        throw new Error(`Get ${JSON.stringify(current.href)}: failed to parse Location header ${JSON.stringify(location)}`);
      }
      if (next.protocol !== 'http:' && next.protocol !== 'https:') {
        throw new Error(`Get ${JSON.stringify(next.href)}: unsupported protocol scheme ${JSON.stringify(next.protocol.slice(0, -1))}`);
      }
      // Another host: stop here and let the caller judge the redirect itself.
      if (next.hostname !== first.hostname) return answer;
      if (hops + 1 >= MAX_REDIRECTS) throw new Error(`Get ${JSON.stringify(next.href)}: stopped after ${MAX_REDIRECTS} redirects`);
      current = next;
    }
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

function getOnce(
  url: URL,
  headers: http.OutgoingHttpHeaders,
  deadline: AbortSignal,
  followed: (location: string) => boolean,
): Promise<HttpAnswer & { location?: string }> {
  const where = `Get ${JSON.stringify(url.href)}`;
  const lib = url.protocol === 'https:' ? https : http;
  return new Promise((resolve, reject) => {
    let phase: 'headers' | 'body' = 'headers';
    let settled = false;
    const fail = (reason: string) => {
      if (settled) return;
      settled = true;
      cleanup();
      reject(new Error(`${where}: ${reason}`));
    };
    const abortReason = () =>
      deadline.reason === CANCELLED
        ? 'context canceled'
        : phase === 'headers'
          ? 'context deadline exceeded (Client.Timeout exceeded while awaiting headers)'
          : 'context deadline exceeded (Client.Timeout or context cancellation while reading body)';
    const onDeadline = () => {
      fail(abortReason());
      req.destroy();
    };
    const cleanup = () => deadline.removeEventListener('abort', onDeadline);
    if (deadline.aborted) return reject(new Error(`${where}: ${abortReason()}`));
    const req = lib.request(url, {
      method: 'GET',
      headers,
      agent: false,
      // Probes do not verify certificates, as the kubelet's do not.
      rejectUnauthorized: false,
    });
    deadline.addEventListener('abort', onDeadline, { once: true });
    req.on('error', (err: NodeJS.ErrnoException) => {
      if (deadline.aborted) return fail(abortReason());
      fail(phase === 'headers' && err.syscall === 'connect' ? `dial tcp ${url.host}: ${dialReason(err)}` : dialReason(err));
    });
    req.on('response', (res) => {
      phase = 'body';
      const status = res.statusCode ?? 0;
      const location = typeof res.headers.location === 'string' ? res.headers.location : undefined;
      if (REDIRECTS.has(status) && location !== undefined && followed(location)) {
        // Followed: its body is not wanted.
        settled = true;
        cleanup();
        res.destroy();
        req.destroy();
        return resolve({ status, body: '', url, location });
      }
      const chunks: Buffer[] = [];
      let size = 0;
      const finish = () => {
        if (settled) return;
        settled = true;
        cleanup();
        req.destroy();
        resolve({ status, body: Buffer.concat(chunks).toString(), url, ...(location !== undefined ? { location } : {}) });
      };
      res.on('data', (d: Buffer) => {
        if (settled) return;
        const room = PROBE_OUTPUT_LIMIT - size;
        chunks.push(room < d.length ? d.subarray(0, room) : d);
        size += Math.min(room, d.length);
        // Enough: the rest, however long, is never read.
        if (size >= PROBE_OUTPUT_LIMIT) {
          finish();
          res.destroy();
        }
      });
      res.on('end', finish);
      res.on('error', (err: NodeJS.ErrnoException) => (deadline.aborted ? fail(abortReason()) : fail(dialReason(err))));
      res.on('close', () => {
        if (!settled && !res.complete) fail(deadline.aborted ? abortReason() : 'unexpected EOF');
      });
    });
    req.end();
  });
}

async function httpProbe(url: URL, list: HTTPHeader[], userAgent: string, timeoutMs: number, signal?: AbortSignal): Promise<ProbeOutcome> {
  let answer: HttpAnswer;
  try {
    answer = await boundedGet(url, requestHeaders(list, userAgent), timeoutMs, signal);
  } catch (err) {
    if (signal?.aborted) return unknown('probe cancelled');
    return failure(errorMessage(err));
  }
  if (answer.status >= 200 && answer.status < 400) {
    // A redirect the probe did not follow (another host) passes, with a warning.
    if (answer.status >= 300) return { result: 'success', message: `Probe terminated redirects, Response body: ${answer.body}`, warning: true };
    return success(answer.body);
  }
  // Not the body: it may hold anything, and events are readable by many.
  return failure(`HTTP probe failed with statuscode: ${answer.status}`);
}

// ---------------------------------------------------------------- tcp

export function tcpProbe(host: string, port: number, timeoutMs: number, signal?: AbortSignal): Promise<ProbeOutcome> {
  const addr = hostPort(host, port);
  return new Promise((resolve) => {
    const sock = net.connect({ host, port });
    const finish = (o: ProbeOutcome) => {
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(o);
    };
    const onAbort = () => {
      sock.destroy();
      finish(unknown('probe cancelled'));
    };
    const timer = setTimeout(() => {
      sock.destroy();
      finish(failure(`dial tcp ${addr}: i/o timeout`));
    }, timeoutMs);
    timer.unref();
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });
    sock.once('connect', () => {
      // A reset, not a FIN: no TIME_WAIT left behind per probe (the kubelet sets SO_LINGER 0).
      sock.resetAndDestroy();
      finish(success());
    });
    sock.on('error', (err: NodeJS.ErrnoException) => finish(failure(`dial tcp ${addr}: ${dialReason(err)}`)));
  });
}

// ---------------------------------------------------------------- grpc

/** Go's time.Duration formatting of whole seconds (1s, 1m30s), as the kubelet's messages print timeouts. */
export function goDuration(ms: number): string {
  let s = Math.round(ms / 1000);
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  if (h > 0) return `${h}h${m}m${s}s`;
  if (m > 0) return `${m}m${s}s`;
  return `${s}s`;
}

function goCodeName(code: grpc.status): string {
  const name = grpc.status[code] ?? String(code);
  return name
    .toLowerCase()
    .split('_')
    .map((w) => (w === 'ok' ? 'OK' : w.charAt(0).toUpperCase() + w.slice(1)))
    .join('');
}

/** The gRPC status an HTTP status stands for when a server answers without one (gRPC's HTTP mapping). */
function codeForHttpStatus(status: number): grpc.status {
  switch (status) {
    case 400:
      return grpc.status.INTERNAL;
    case 401:
      return grpc.status.UNAUTHENTICATED;
    case 403:
      return grpc.status.PERMISSION_DENIED;
    case 404:
      return grpc.status.UNIMPLEMENTED;
    case 429:
    case 502:
    case 503:
    case 504:
      return grpc.status.UNAVAILABLE;
    default:
      return grpc.status.UNKNOWN;
  }
}

/** The most of an answer a health check reads: the real one is a few bytes. */
const GRPC_ANSWER_LIMIT = 64 << 10;

/**
 * A grpc.health.v1 Check, plaintext, on a connection of its own that is
 * destroyed when the probe ends, however it ends. The messages are encoded
 * with the codecs proto-loader builds from proto/health.proto; the HTTP/2
 * call is made here rather than through a grpc-js channel, whose pending
 * connection to a server that never finishes the handshake would outlive
 * the probe by its 20 s connect timeout.
 */
export function grpcProbe(host: string, port: number, service: string, userAgent: string, timeoutMs: number, signal?: AbortSignal): Promise<ProbeOutcome> {
  const addr = hostPort(host, port);
  const method = healthCheckMethod();
  return new Promise<ProbeOutcome>((resolve) => {
    let done = false;
    const finish = (o: ProbeOutcome) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      session.destroy();
      resolve(o);
    };
    const rpcFailed = (code: grpc.status, desc: string) => {
      if (code === grpc.status.UNIMPLEMENTED) return finish(failure(`error: this server does not implement the grpc health protocol (grpc.health.v1.Health): ${desc}`));
      if (code === grpc.status.DEADLINE_EXCEEDED) return finish(failure(`timeout: health rpc did not complete within ${goDuration(timeoutMs)}`));
      finish(failure(`error: health rpc probe failed: rpc error: code = ${goCodeName(code)} desc = ${desc}`));
    };
    const onAbort = () => finish(unknown('probe cancelled'));
    const timer = setTimeout(() => finish(failure(`timeout: health rpc did not complete within ${goDuration(timeoutMs)}`)), timeoutMs);
    timer.unref();

    const session = http2.connect(`http://${addr}`);
    session.on('error', (err: NodeJS.ErrnoException) => {
      const why = err.syscall === 'connect' ? `dial tcp ${addr}: ${dialReason(err)}` : dialReason(err);
      rpcFailed(grpc.status.UNAVAILABLE, `connection error: desc = "transport: Error while dialing: ${why}"`);
    });
    if (signal?.aborted) return onAbort();
    signal?.addEventListener('abort', onAbort, { once: true });

    const req = session.request({
      ':method': 'POST',
      ':path': method.path,
      'content-type': 'application/grpc',
      te: 'trailers',
      'user-agent': userAgent,
      'grpc-timeout': `${Math.max(1, timeoutMs)}m`,
    });
    req.on('error', () => undefined);
    const msg = method.serialize({ service });
    const frame = Buffer.alloc(5 + msg.length);
    frame.writeUInt32BE(msg.length, 1);
    msg.copy(frame, 5);
    req.end(frame);

    let httpStatus = 0;
    let contentType = '';
    const chunks: Buffer[] = [];
    let size = 0;
    const grpcStatusOf = (h: http2.IncomingHttpHeaders | http2.IncomingHttpHeaders) => {
      const v = h['grpc-status'];
      return v === undefined ? undefined : Number(v);
    };
    const grpcMessageOf = (h: http2.IncomingHttpHeaders) => {
      const v = h['grpc-message'];
      if (typeof v !== 'string') return '';
      try {
        return decodeURIComponent(v);
      } catch {
        return v;
      }
    };
    const conclude = (trailers: http2.IncomingHttpHeaders) => {
      const code = grpcStatusOf(trailers);
      if (code === undefined) return rpcFailed(grpc.status.INTERNAL, 'server closed the stream without sending trailers');
      if (code !== grpc.status.OK) return rpcFailed(code, grpcMessageOf(trailers));
      const body = Buffer.concat(chunks);
      if (body.length < 5 || body[0] !== 0 || body.readUInt32BE(1) !== body.length - 5) {
        return rpcFailed(grpc.status.INTERNAL, 'the answer is not one uncompressed gRPC message');
      }
      let answer: { status: string | number };
      try {
        answer = method.deserialize(body.subarray(5));
      } catch (err) {
        return rpcFailed(grpc.status.INTERNAL, `cannot decode the answer: ${errorMessage(err)}`);
      }
      const status = answer.status ?? 'UNKNOWN';
      if (status !== 'SERVING') return finish(failure(`service unhealthy (responded with ${JSON.stringify(String(status))})`));
      finish(success('service healthy'));
    };
    req.on('response', (headers) => {
      httpStatus = Number(headers[':status']);
      contentType = String(headers['content-type'] ?? '');
      if (httpStatus !== 200) return rpcFailed(codeForHttpStatus(httpStatus), `unexpected HTTP status code received from server: ${httpStatus}`);
      if (!contentType.startsWith('application/grpc')) return rpcFailed(grpc.status.UNKNOWN, `unexpected content-type "${contentType}"`);
      // Trailers-only: the status came with the headers.
      if (grpcStatusOf(headers) !== undefined) conclude(headers);
    });
    req.on('data', (d: Buffer) => {
      size += d.length;
      if (size > GRPC_ANSWER_LIMIT) return rpcFailed(grpc.status.RESOURCE_EXHAUSTED, `answer larger than ${GRPC_ANSWER_LIMIT} bytes`);
      chunks.push(d);
    });
    req.on('trailers', (trailers) => conclude(trailers));
    req.on('close', () => {
      if (done) return;
      rpcFailed(grpc.status.UNAVAILABLE, `the stream closed (code ${req.rstCode ?? 0}) before an answer`);
    });
  });
}
