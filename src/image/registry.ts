/**
 * A client for the OCI distribution API: resolves a reference to a manifest
 * and streams blobs, trying each configured endpoint (mirrors, then the
 * server) and handling anonymous bearer tokens, basic auth and identity or
 * registry tokens.
 */
import type { Agent, Dispatcher } from 'undici';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { SkiffError, errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { resolveEndpoints, type RegistryEndpoint } from './hosts.js';
import { loadAgent } from './http-agent.js';
import type { Reference } from './reference.js';
import { digestOf, parseDigest, sha256Digest } from './content.js';
import { cancelledError } from './shared-work.js';

export const MediaType = {
  OciIndex: 'application/vnd.oci.image.index.v1+json',
  OciManifest: 'application/vnd.oci.image.manifest.v1+json',
  DockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  DockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  DockerSchema1: 'application/vnd.docker.distribution.manifest.v1+prettyjws',
} as const;

const ACCEPT = [MediaType.OciIndex, MediaType.OciManifest, MediaType.DockerList, MediaType.DockerManifest].join(', ');

/**
 * How much skiff reads from a registry before it gives up, enforced while
 * the bytes arrive: nothing beyond a limit is ever buffered.
 */
export const Limits = {
  /** Manifests and indexes, as containerd's fetcher. */
  manifest: 4 << 20,
  /** An image config blob, read whole into memory. */
  config: 8 << 20,
  /** A token server's JSON answer. */
  token: 1 << 20,
  /** What is kept of an error answer's body for the message; the rest is never read. */
  errorBody: 4 << 10,
  /** Redirects followed for one request. */
  redirects: 10,
  /** Layers in one image (overlayfs stacks cannot mount many more, and Docker stops at 127). */
  layers: 128,
} as const;

/** Ingests no progress for this long fail (containerd 1.7's image_pull_progress_timeout). */
export const DEFAULT_PROGRESS_TIMEOUT_MS = 5 * 60_000;

export interface Credentials {
  username?: string;
  password?: string;
  identityToken?: string;
  registryToken?: string;
}

export interface FetchedManifest {
  digest: string;
  mediaType: string;
  body: Buffer;
}

export interface RegistryOptions {
  configRoot?: string;
  logger: Logger;
  /** Attempts for a request that fails with a network error or a 5xx/429. */
  attempts?: number;
  retryDelayMs?: number;
  /** A request or download that receives nothing for this long fails. */
  progressTimeoutMs?: number;
}

interface Challenge {
  scheme: string;
  params: Record<string, string>;
}

export function parseChallenge(header: string | undefined): Challenge | undefined {
  if (!header) return undefined;
  const m = /^\s*(\w+)\s*(.*)$/.exec(header);
  if (!m) return undefined;
  const params: Record<string, string> = {};
  const re = /(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))/g;
  let p: RegExpExecArray | null;
  while ((p = re.exec(m[2]!))) params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!;
  return { scheme: m[1]!.toLowerCase(), params };
}

function headerValue(h: Dispatcher.ResponseData['headers'][string]): string | undefined {
  return Array.isArray(h) ? h[0] : h;
}

/**
 * Stops a body without reading it; undici then closes its connection. (A
 * destroyed body reports the abort as an error, which is expected here.)
 */
function discard(body: Readable): void {
  body.on('error', () => {});
  body.destroy();
}

function contentLength(res: Dispatcher.ResponseData): number | undefined {
  const v = headerValue(res.headers['content-length']);
  if (v === undefined || !/^\d+$/.test(v.trim())) return undefined;
  return Number(v);
}

/**
 * Reads a whole body of at most `limit` bytes. A declared length over the
 * limit is refused before reading; a body that grows past it is destroyed
 * (which closes its connection) the moment it does.
 */
async function readBounded(res: Dispatcher.ResponseData, limit: number, what: string): Promise<Buffer> {
  const declared = contentLength(res);
  if (declared !== undefined && declared > limit) {
    discard(res.body);
    throw new SkiffError('InvalidArgument', `${what} is ${declared} bytes, more than the ${limit} skiff accepts`);
  }
  const chunks: Buffer[] = [];
  let n = 0;
  for await (const c of res.body as AsyncIterable<Buffer>) {
    n += c.length;
    if (n > limit) {
      discard(res.body);
      throw new SkiffError('InvalidArgument', `${what} is larger than the ${limit} bytes skiff accepts`);
    }
    chunks.push(c);
  }
  return Buffer.concat(chunks, n);
}

/**
 * The first `max` bytes of a body that only feeds a message or is thrown
 * away. When more is coming, the body is destroyed rather than read.
 */
async function bodyText(res: Dispatcher.ResponseData, max: number = Limits.errorBody): Promise<string> {
  const chunks: Buffer[] = [];
  let n = 0;
  try {
    const declared = contentLength(res);
    if (declared !== undefined && declared > max) {
      discard(res.body);
      return '';
    }
    for await (const c of res.body as AsyncIterable<Buffer>) {
      chunks.push(c);
      n += c.length;
      if (n > max) {
        discard(res.body);
        break;
      }
    }
  } catch {
    // a broken error body is no reason to hide the status
  }
  const t = Buffer.concat(chunks).subarray(0, max).toString('utf8');
  return n > max ? `${t}…` : t;
}

/**
 * Passes exactly `size` bytes of a blob through: one byte more fails at once,
 * an early end fails at the end. Destroying it destroys the download.
 */
class BlobGuard extends Transform {
  private received = 0;
  constructor(
    private readonly source: Readable,
    private readonly size: number,
    private readonly what: string,
  ) {
    super({ highWaterMark: 1 << 20 });
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.received += chunk.length;
    if (this.received > this.size) {
      cb(new SkiffError('InvalidArgument', `${this.what} is larger than the ${this.size} bytes its descriptor says`));
      return;
    }
    cb(null, chunk);
  }

  override _flush(cb: TransformCallback): void {
    if (this.received !== this.size) {
      cb(new SkiffError('InvalidArgument', `${this.what} ended after ${this.received} of the ${this.size} bytes its descriptor says`));
      return;
    }
    cb();
  }

  override _destroy(err: Error | null, cb: (e: Error | null) => void): void {
    discard(this.source);
    cb(err);
  }
}

/** The registry's own words from an error body, when it speaks the distribution error format. */
function registryWords(text: string): string {
  try {
    const j = JSON.parse(text) as { errors?: Array<{ code?: string; message?: string }> };
    if (Array.isArray(j.errors) && j.errors.length) {
      return j.errors.map((e) => [e.code, e.message].filter(Boolean).join(': ')).join('; ');
    }
  } catch {
    // not JSON
  }
  return text.trim().slice(0, 300);
}

/**
 * When every endpoint failed, the error names what each one said; its kind is
 * the last endpoint's (the server, after the mirrors).
 */
function combine(errors: unknown[]): unknown {
  if (errors.length === 1) return errors[0];
  const last = errors[errors.length - 1];
  const kind = last instanceof SkiffError ? last.kind : 'Internal';
  return new SkiffError(kind, errors.map(errorMessage).join('; then '), { cause: last });
}

/** undici's Agent, imported at the first pull: a daemon that pulls nothing never holds the HTTP client. */
let UndiciAgent: typeof Agent | undefined;

export class RegistryClient {
  private readonly agents = new Map<string, Agent>();
  private readonly attempts: number;
  private readonly retryDelayMs: number;
  readonly progressTimeoutMs: number;

  constructor(private readonly opts: RegistryOptions) {
    this.attempts = opts.attempts ?? 3;
    this.retryDelayMs = opts.retryDelayMs ?? 250;
    this.progressTimeoutMs = opts.progressTimeoutMs ?? DEFAULT_PROGRESS_TIMEOUT_MS;
  }

  async close(): Promise<void> {
    await Promise.all([...this.agents.values()].map((a) => a.close()));
  }

  /** A session for one pull; aborting `signal` stops its requests and downloads at once. */
  async session(ref: Reference, creds: Credentials, signal?: AbortSignal): Promise<RegistrySession> {
    const endpoints = await resolveEndpoints(this.opts.configRoot, ref.domain);
    UndiciAgent ??= await loadAgent();
    return new RegistrySession(this, ref, endpoints, creds, this.opts.logger, signal);
  }

  agentFor(ep: RegistryEndpoint): Agent {
    const key = `${ep.skipVerify}|${ep.ca.join('')}`;
    let a = this.agents.get(key);
    if (!a) {
      if (!UndiciAgent) throw new Error('registry: agentFor called before a session loaded the HTTP client');
      a = new UndiciAgent({
        connections: 16,
        keepAliveTimeout: 30_000,
        // Progress, not duration: these fire only when nothing arrives for this long.
        headersTimeout: this.progressTimeoutMs,
        bodyTimeout: this.progressTimeoutMs,
        connect: {
          rejectUnauthorized: !ep.skipVerify,
          ...(ep.ca.length ? { ca: ep.ca } : {}),
          timeout: 30_000,
        },
      });
      this.agents.set(key, a);
    }
    return a;
  }

  get retry(): { attempts: number; delayMs: number } {
    return { attempts: this.attempts, delayMs: this.retryDelayMs };
  }
}

/** Headers that carry credentials: never sent to a host the request was redirected to. */
const SENSITIVE = new Set(['authorization', 'proxy-authorization', 'cookie']);

function formatMs(ms: number): string {
  return ms % 60_000 === 0 ? `${ms / 60_000}m` : ms % 1000 === 0 ? `${ms / 1000}s` : `${ms}ms`;
}

export class RegistrySession {
  private readonly tokens = new Map<string, string>();
  constructor(
    private readonly client: RegistryClient,
    readonly ref: Reference,
    private readonly endpoints: RegistryEndpoint[],
    private readonly creds: Credentials,
    private readonly log: Logger,
    private readonly signal?: AbortSignal,
  ) {}

  private get name(): string {
    return `${this.ref.domain}/${this.ref.path}`;
  }

  /** The pull's own end (the client went away) beats whatever error the abort caused. */
  private cancelled(): SkiffError | undefined {
    if (!this.signal?.aborted) return undefined;
    return cancelledError(this.signal.reason, `pull of ${this.name}`);
  }

  /** The pull this session serves was abandoned by every caller. */
  get aborted(): boolean {
    return this.signal?.aborted ?? false;
  }

  /** Turns undici's failures into errors that say what stalled or broke, and where. */
  private failure(err: unknown, what: string, host: string): unknown {
    const c = this.cancelled();
    if (c) return c;
    if (err instanceof SkiffError) return err;
    const code = (err as { code?: unknown })?.code;
    if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
      return new SkiffError(
        'DeadlineExceeded',
        `no progress for ${formatMs(this.client.progressTimeoutMs)} fetching ${what} from ${host} (see --image-pull-progress-timeout)`,
        { cause: err },
      );
    }
    return new SkiffError('Unavailable', `registry ${host} failed while sending ${what}: ${errorMessage(err)}`, { cause: err });
  }

  /** Fetches the manifest (or index) for a tag or digest; the digest is checked when pinned. */
  async manifest(tagOrDigest: string): Promise<FetchedManifest> {
    const byDigest = tagOrDigest.includes(':');
    // A pinned digest in an algorithm skiff cannot verify is refused before anything is fetched.
    const algorithm = byDigest ? parseDigest(tagOrDigest).algorithm : 'sha256';
    const eps = this.endpoints.filter((e) => e.capabilities.includes(byDigest ? 'pull' : 'resolve'));
    if (!eps.length) throw new SkiffError('FailedPrecondition', `no registry host for ${this.ref.domain} may ${byDigest ? 'pull' : 'resolve'}`);
    const errors: unknown[] = [];
    for (const ep of eps) {
      try {
        const res = await this.request(ep, `/${this.ref.path}/manifests/${tagOrDigest}`, { accept: ACCEPT });
        const what = `manifest ${this.name}:${tagOrDigest}`;
        let body: Buffer;
        try {
          body = await readBounded(res, Limits.manifest, what);
        } catch (err) {
          throw this.failure(err, what, ep.host);
        }
        const digest = byDigest ? digestOf(algorithm, body) : sha256Digest(body);
        if (byDigest && digest !== tagOrDigest) {
          throw new SkiffError('InvalidArgument', `manifest digest mismatch: asked for ${tagOrDigest}, got ${digest}`);
        }
        let mediaType = (headerValue(res.headers['content-type']) ?? '').split(';')[0]!.trim();
        try {
          const parsed = JSON.parse(body.toString('utf8')) as { mediaType?: string; schemaVersion?: number; manifests?: unknown };
          if (parsed.mediaType) mediaType = parsed.mediaType;
          else if (parsed.schemaVersion === 1) mediaType = MediaType.DockerSchema1;
          else if (Array.isArray(parsed.manifests) && !mediaType.includes('index') && !mediaType.includes('list')) mediaType = MediaType.OciIndex;
        } catch {
          throw new SkiffError('InvalidArgument', `manifest for ${this.name}:${tagOrDigest} is not valid JSON`);
        }
        return { digest, mediaType, body };
      } catch (err) {
        const c = this.cancelled();
        if (c) throw c;
        errors.push(err);
        this.log.debug('registry endpoint failed', { host: ep.host, ref: this.name, error: errorMessage(err) });
      }
    }
    throw combine(errors);
  }

  /**
   * Streams a blob of exactly `desc.size` bytes; the caller verifies its
   * digest while storing it. A declared length other than the descriptor's
   * is refused without reading.
   */
  async blob(desc: { digest: string; size: number }): Promise<Readable> {
    const { digest, size } = desc;
    if (!Number.isSafeInteger(size) || size < 0) throw new SkiffError('InvalidArgument', `blob ${digest} has an invalid size ${String(size)} in its descriptor`);
    // In configured order, mirrors first, as containerd does; a miss falls through to the next.
    const eps = this.endpoints.filter((e) => e.capabilities.includes('pull'));
    const errors: unknown[] = [];
    for (const ep of eps) {
      try {
        const res = await this.request(ep, `/${this.ref.path}/blobs/${digest}`, {});
        const what = `blob ${digest} from ${ep.host}`;
        const declared = contentLength(res);
        if (declared !== undefined && declared !== size) {
          discard(res.body);
          throw new SkiffError('InvalidArgument', `${what} is ${declared} bytes, its descriptor says ${size}`);
        }
        const guard = new BlobGuard(res.body, size, what);
        res.body.on('error', (err) => guard.destroy(this.failure(err, `blob ${digest}`, ep.host) as Error));
        res.body.pipe(guard);
        // Whoever consumes the guard sees its error (pipeline and iteration check it); until then it must not crash the process.
        guard.on('error', () => {});
        return guard;
      } catch (err) {
        const c = this.cancelled();
        if (c) throw c;
        errors.push(err);
      }
    }
    if (!errors.length) throw new SkiffError('FailedPrecondition', `no registry host for ${this.ref.domain} may pull`);
    throw combine(errors);
  }

  private url(ep: RegistryEndpoint, p: string): string {
    return `${ep.apiRoot}${p}${ep.mirror ? `?ns=${encodeURIComponent(this.ref.domain)}` : ''}`;
  }

  private async request(ep: RegistryEndpoint, p: string, headers: Record<string, string>): Promise<Dispatcher.ResponseData> {
    const { attempts, delayMs } = this.client.retry;
    let lastErr: unknown;
    for (let attempt = 1; attempt <= attempts; attempt++) {
      try {
        return await this.requestOnce(ep, p, headers);
      } catch (err) {
        lastErr = this.failure(err, p, ep.host);
        const retriable = lastErr instanceof SkiffError && lastErr.kind === 'Unavailable';
        if (!retriable || attempt === attempts || this.signal?.aborted) break;
        await this.sleep(delayMs * 2 ** (attempt - 1));
      }
    }
    throw this.cancelled() ?? lastErr;
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(done, ms);
      this.signal?.addEventListener('abort', done, { once: true });
      function done() {
        clearTimeout(t);
        resolve();
      }
    });
  }

  private async requestOnce(ep: RegistryEndpoint, p: string, headers: Record<string, string>): Promise<Dispatcher.ResponseData> {
    const agent = this.client.agentFor(ep);
    const extra: Record<string, string> = { 'user-agent': 'skiff/0.1', ...headers };
    for (const [k, v] of Object.entries(ep.headers)) extra[k] = v.join(', ');
    const home = new URL(ep.apiRoot).origin;
    let url = this.url(ep, p);
    let auth = this.authHeader(ep);
    let challenged = false;
    for (let hop = 0; hop <= Limits.redirects; hop++) {
      const u = new URL(url);
      // Credentials go to the registry that asked for them, never to where it redirects (blob storage, say).
      const atHome = u.origin === home;
      const sent: Record<string, string> = {};
      for (const [k, v] of Object.entries(extra)) if (atHome || !SENSITIVE.has(k)) sent[k] = v;
      if (auth && atHome) sent.authorization = auth;
      let res: Dispatcher.ResponseData;
      try {
        res = await agent.request({
          origin: u.origin,
          path: `${u.pathname}${u.search}`,
          method: 'GET',
          headers: sent,
          ...(this.signal ? { signal: this.signal } : {}),
        });
      } catch (err) {
        const f = this.failure(err, p, u.host);
        if (f instanceof SkiffError && f.kind === 'Unavailable') {
          throw new SkiffError('Unavailable', `registry ${u.host} unreachable: ${errorMessage(err)}`, { cause: err });
        }
        throw f;
      }
      const status = res.statusCode;
      if (status >= 200 && status < 300) return res;
      if (status >= 300 && status < 400 && res.headers.location) {
        await bodyText(res);
        const next = new URL(headerValue(res.headers.location)!, url);
        if (next.protocol !== 'http:' && next.protocol !== 'https:') {
          throw new SkiffError('InvalidArgument', `registry ${u.host} redirected ${this.name} to a ${next.protocol} URL`);
        }
        url = next.toString();
        continue;
      }
      if (status === 401 && !challenged && atHome) {
        const challenge = parseChallenge(headerValue(res.headers['www-authenticate']));
        await bodyText(res);
        challenged = true;
        auth = await this.authorize(ep, challenge);
        continue;
      }
      const words = registryWords(await bodyText(res));
      const what = `${this.name} (${p.split('/').slice(-2).join(' ')}) from ${ep.host}`;
      if (status === 401 && !atHome) {
        throw new SkiffError('Unauthenticated', `${u.host}, where ${ep.host} redirected ${this.name}, asked for credentials; skiff sends them only to ${ep.host}`);
      }
      if (status === 401) throw new SkiffError('Unauthenticated', `registry ${ep.host} refused credentials for ${this.name}: ${words || 'unauthorized'}`);
      if (status === 403) throw new SkiffError('PermissionDenied', `registry ${ep.host} denied access to ${this.name}: ${words || 'forbidden'}`);
      if (status === 404) throw new SkiffError('NotFound', `${what}: not found${words ? `: ${words}` : ''}`);
      if (status === 429 || status >= 500) throw new SkiffError('Unavailable', `registry ${ep.host} answered ${status} for ${what}${words ? `: ${words}` : ''}`);
      throw new SkiffError('Internal', `registry ${ep.host} answered ${status} for ${what}${words ? `: ${words}` : ''}`);
    }
    throw new SkiffError('Unavailable', `more than ${Limits.redirects} redirects fetching ${this.name} from ${ep.host}`);
  }

  private authHeader(ep: RegistryEndpoint): string | undefined {
    if (this.creds.registryToken) return `Bearer ${this.creds.registryToken}`;
    return this.tokens.get(ep.host);
  }

  private basic(): string | undefined {
    const { username, password } = this.creds;
    if (username === undefined || username === '') return undefined;
    return `Basic ${Buffer.from(`${username}:${password ?? ''}`).toString('base64')}`;
  }

  private async authorize(ep: RegistryEndpoint, challenge: Challenge | undefined): Promise<string> {
    if (!challenge) throw new SkiffError('Unauthenticated', `registry ${ep.host} asked for authentication without a challenge`);
    if (challenge.scheme === 'basic') {
      const b = this.basic();
      if (!b) throw new SkiffError('Unauthenticated', `registry ${ep.host} needs a username and password for ${this.name}`);
      this.tokens.set(ep.host, b);
      return b;
    }
    if (challenge.scheme !== 'bearer') throw new SkiffError('Unauthenticated', `registry ${ep.host} asked for unsupported auth scheme "${challenge.scheme}"`);
    const realm = challenge.params.realm;
    if (!realm) throw new SkiffError('Unauthenticated', `registry ${ep.host} sent a bearer challenge without a realm`);
    const scope = challenge.params.scope ?? `repository:${this.ref.path}:pull`;
    const service = challenge.params.service;
    const agent = this.client.agentFor(ep);
    let res: Dispatcher.ResponseData;
    let realmUrl: URL;
    try {
      realmUrl = new URL(realm);
    } catch {
      throw new SkiffError('Unauthenticated', `registry ${ep.host} sent an invalid token realm "${realm.slice(0, 200)}"`);
    }
    if (realmUrl.protocol !== 'http:' && realmUrl.protocol !== 'https:') {
      throw new SkiffError('Unauthenticated', `registry ${ep.host} sent a token realm that is not http or https`);
    }
    try {
      if (this.creds.identityToken) {
        const form = new URLSearchParams({ grant_type: 'refresh_token', refresh_token: this.creds.identityToken, scope, client_id: 'skiff' });
        if (service) form.set('service', service);
        res = await agent.request({
          origin: realmUrl.origin,
          path: realmUrl.pathname,
          method: 'POST',
          headers: { 'content-type': 'application/x-www-form-urlencoded' },
          body: form.toString(),
          ...(this.signal ? { signal: this.signal } : {}),
        });
      } else {
        const q = new URLSearchParams(realmUrl.search);
        if (service) q.set('service', service);
        q.set('scope', scope);
        const b = this.basic();
        res = await agent.request({
          origin: realmUrl.origin,
          path: `${realmUrl.pathname}?${q}`,
          method: 'GET',
          headers: b ? { authorization: b } : {},
          ...(this.signal ? { signal: this.signal } : {}),
        });
      }
    } catch (err) {
      const f = this.failure(err, 'a token', realmUrl.host);
      if (f instanceof SkiffError && f.kind !== 'Unavailable') throw f;
      throw new SkiffError('Unavailable', `token server ${realmUrl.host} unreachable: ${errorMessage(err)}`);
    }
    if (res.statusCode !== 200) {
      const words = registryWords(await bodyText(res));
      throw new SkiffError('Unauthenticated', `token server ${realmUrl.host} refused ${this.name} (${res.statusCode}): ${words || 'no reason given'}`);
    }
    let text: string;
    try {
      text = (await readBounded(res, Limits.token, `token answer from ${realmUrl.host}`)).toString('utf8');
    } catch (err) {
      const f = this.failure(err, 'a token', realmUrl.host);
      throw f instanceof SkiffError && f.kind === 'InvalidArgument' ? new SkiffError('Unauthenticated', f.message, { cause: f }) : f;
    }
    let token: string | undefined;
    try {
      const j = JSON.parse(text) as { token?: string; access_token?: string };
      token = j.token ?? j.access_token;
    } catch {
      // handled below
    }
    if (!token) throw new SkiffError('Unauthenticated', `token server ${realmUrl.host} answered without a token`);
    const header = `Bearer ${token}`;
    this.tokens.set(ep.host, header);
    return header;
  }
}
