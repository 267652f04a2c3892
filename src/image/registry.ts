/**
 * A client for the OCI distribution API: resolves a reference to a manifest
 * and streams blobs, trying each configured endpoint (mirrors, then the
 * server) and handling anonymous bearer tokens, basic auth and identity or
 * registry tokens.
 */
import { Agent, type Dispatcher } from 'undici';
import type { Readable } from 'node:stream';
import { SkiffError, errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { resolveEndpoints, type RegistryEndpoint } from './hosts.js';
import type { Reference } from './reference.js';
import { digestOf, parseDigest, sha256Digest } from './content.js';

export const MediaType = {
  OciIndex: 'application/vnd.oci.image.index.v1+json',
  OciManifest: 'application/vnd.oci.image.manifest.v1+json',
  DockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  DockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  DockerSchema1: 'application/vnd.docker.distribution.manifest.v1+prettyjws',
} as const;

const ACCEPT = [MediaType.OciIndex, MediaType.OciManifest, MediaType.DockerList, MediaType.DockerManifest].join(', ');

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

async function bodyText(res: Dispatcher.ResponseData, max = 4096): Promise<string> {
  try {
    const t = await res.body.text();
    return t.length > max ? `${t.slice(0, max)}…` : t;
  } catch {
    return '';
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

export class RegistryClient {
  private readonly agents = new Map<string, Agent>();
  private readonly attempts: number;
  private readonly retryDelayMs: number;

  constructor(private readonly opts: RegistryOptions) {
    this.attempts = opts.attempts ?? 3;
    this.retryDelayMs = opts.retryDelayMs ?? 250;
  }

  async close(): Promise<void> {
    await Promise.all([...this.agents.values()].map((a) => a.close()));
  }

  async session(ref: Reference, creds: Credentials): Promise<RegistrySession> {
    const endpoints = await resolveEndpoints(this.opts.configRoot, ref.domain);
    return new RegistrySession(this, ref, endpoints, creds, this.opts.logger);
  }

  agentFor(ep: RegistryEndpoint): Agent {
    const key = `${ep.skipVerify}|${ep.ca.join('')}`;
    let a = this.agents.get(key);
    if (!a) {
      a = new Agent({
        connections: 16,
        keepAliveTimeout: 30_000,
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

export class RegistrySession {
  private readonly tokens = new Map<string, string>();
  constructor(
    private readonly client: RegistryClient,
    readonly ref: Reference,
    private readonly endpoints: RegistryEndpoint[],
    private readonly creds: Credentials,
    private readonly log: Logger,
  ) {}

  private get name(): string {
    return `${this.ref.domain}/${this.ref.path}`;
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
        const body = Buffer.from(await res.body.arrayBuffer());
        if (body.length > 4 << 20) throw new SkiffError('InvalidArgument', `manifest for ${this.name} is larger than 4 MiB`);
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
        errors.push(err);
        this.log.debug('registry endpoint failed', { host: ep.host, ref: this.name, error: errorMessage(err) });
      }
    }
    throw combine(errors);
  }

  /** Streams a blob; the caller verifies its digest while storing it. */
  async blob(digest: string): Promise<Readable> {
    // In configured order, mirrors first, as containerd does; a miss falls through to the next.
    const eps = this.endpoints.filter((e) => e.capabilities.includes('pull'));
    const errors: unknown[] = [];
    for (const ep of eps) {
      try {
        const res = await this.request(ep, `/${this.ref.path}/blobs/${digest}`, {});
        return res.body;
      } catch (err) {
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
        lastErr = err;
        const retriable = err instanceof SkiffError ? err.kind === 'Unavailable' : true;
        if (!retriable || attempt === attempts) break;
        await new Promise((r) => setTimeout(r, delayMs * 2 ** (attempt - 1)).unref());
      }
    }
    throw lastErr;
  }

  private async requestOnce(ep: RegistryEndpoint, p: string, headers: Record<string, string>): Promise<Dispatcher.ResponseData> {
    const agent = this.client.agentFor(ep);
    const extra: Record<string, string> = { 'user-agent': 'skiff/0.1', ...headers };
    for (const [k, v] of Object.entries(ep.headers)) extra[k] = v.join(', ');
    let url = this.url(ep, p);
    let auth = this.authHeader(ep);
    let challenged = false;
    for (let hop = 0; hop < 6; hop++) {
      const u = new URL(url);
      let res: Dispatcher.ResponseData;
      try {
        res = await agent.request({
          origin: u.origin,
          path: `${u.pathname}${u.search}`,
          method: 'GET',
          headers: { ...extra, ...(auth && u.host === ep.host ? { authorization: auth } : {}) },
          headersTimeout: 30_000,
          bodyTimeout: 60_000,
        });
      } catch (err) {
        throw new SkiffError('Unavailable', `registry ${u.host} unreachable: ${errorMessage(err)}`, { cause: err });
      }
      const status = res.statusCode;
      if (status >= 200 && status < 300) return res;
      if (status >= 300 && status < 400 && res.headers.location) {
        await res.body.dump();
        url = new URL(headerValue(res.headers.location)!, url).toString();
        continue;
      }
      if (status === 401 && !challenged) {
        const challenge = parseChallenge(headerValue(res.headers['www-authenticate']));
        await res.body.dump();
        challenged = true;
        auth = await this.authorize(ep, challenge);
        continue;
      }
      const words = registryWords(await bodyText(res));
      const what = `${this.name} (${p.split('/').slice(-2).join(' ')}) from ${ep.host}`;
      if (status === 401) throw new SkiffError('Unauthenticated', `registry ${ep.host} refused credentials for ${this.name}: ${words || 'unauthorized'}`);
      if (status === 403) throw new SkiffError('PermissionDenied', `registry ${ep.host} denied access to ${this.name}: ${words || 'forbidden'}`);
      if (status === 404) throw new SkiffError('NotFound', `${what}: not found${words ? `: ${words}` : ''}`);
      if (status === 429 || status >= 500) throw new SkiffError('Unavailable', `registry ${ep.host} answered ${status} for ${what}${words ? `: ${words}` : ''}`);
      throw new SkiffError('Internal', `registry ${ep.host} answered ${status} for ${what}${words ? `: ${words}` : ''}`);
    }
    throw new SkiffError('Unavailable', `too many redirects fetching ${this.name} from ${ep.host}`);
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
    const realmUrl = new URL(realm);
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
        });
      }
    } catch (err) {
      throw new SkiffError('Unavailable', `token server ${realmUrl.host} unreachable: ${errorMessage(err)}`);
    }
    const text = await bodyText(res, 1 << 20);
    if (res.statusCode !== 200) {
      throw new SkiffError('Unauthenticated', `token server ${realmUrl.host} refused ${this.name} (${res.statusCode}): ${registryWords(text) || 'no reason given'}`);
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
