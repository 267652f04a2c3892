/**
 * An HTTP server in front of the real registry that adds what the registry
 * alone cannot: bearer-token or basic auth with a token endpoint, request
 * counting, and injected faults (corrupt blobs, 5xx answers, slow bodies).
 */
import http from 'node:http';
import https from 'node:https';
import { randomBytes } from 'node:crypto';
import type { AddressInfo } from 'node:net';

export interface FrontOptions {
  upstream: string;
  /** bearer: anonymous tokens unless `user` is set; basic: user and password required. */
  auth?: {
    kind: 'bearer' | 'basic';
    user?: string;
    pass?: string;
    /** Accepted as an OAuth2 refresh token (POST /token, grant_type=refresh_token). */
    refreshToken?: string;
    /** A bearer token the registry accepts without a token request. */
    presetToken?: string;
  };
  corrupt?: (path: string) => boolean;
  failStatus?: (path: string) => number | undefined;
  delayMs?: number;
  /** Serve https with this key and certificate. */
  tls?: { key: string; cert: string };
}

export class Front {
  readonly requests: string[] = [];
  readonly tokenRequests: Array<{ authorization?: string; scope?: string; service?: string }> = [];
  private readonly tokens = new Set<string>();
  private server!: http.Server | https.Server;
  host = '';
  url = '';

  constructor(private readonly opts: FrontOptions) {
    if (opts.auth?.presetToken) this.tokens.add(opts.auth.presetToken);
  }

  async start(): Promise<this> {
    const handler = (req: http.IncomingMessage, res: http.ServerResponse) => void this.handle(req, res);
    this.server = this.opts.tls ? https.createServer(this.opts.tls, handler) : http.createServer(handler);
    await new Promise<void>((r) => this.server.listen(0, '127.0.0.1', () => r()));
    this.host = `127.0.0.1:${(this.server.address() as AddressInfo).port}`;
    this.url = `${this.opts.tls ? 'https' : 'http'}://${this.host}`;
    return this;
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  blobGets(digest: string): number {
    return this.requests.filter((r) => r.startsWith('GET ') && r.includes(`/blobs/${digest}`)).length;
  }

  private basicOk(header: string | undefined): boolean {
    const { user, pass } = this.opts.auth ?? {};
    if (!user) return true;
    return header === `Basic ${Buffer.from(`${user}:${pass}`).toString('base64')}`;
  }

  private async handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', this.url);
    if (url.pathname === '/token' && req.method === 'POST') {
      let body = '';
      for await (const c of req) body += String(c);
      const form = new URLSearchParams(body);
      this.tokenRequests.push({ scope: form.get('scope') ?? undefined, service: form.get('service') ?? undefined, authorization: `refresh ${form.get('refresh_token')}` });
      if (form.get('grant_type') !== 'refresh_token' || form.get('refresh_token') !== this.opts.auth?.refreshToken) {
        res.writeHead(401, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ errors: [{ code: 'UNAUTHORIZED', message: 'invalid refresh token' }] }));
        return;
      }
      const token = randomBytes(12).toString('hex');
      this.tokens.add(token);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ access_token: token }));
      return;
    }
    if (url.pathname === '/token') {
      this.tokenRequests.push({
        authorization: req.headers.authorization,
        scope: url.searchParams.get('scope') ?? undefined,
        service: url.searchParams.get('service') ?? undefined,
      });
      if (!this.basicOk(req.headers.authorization)) {
        res.writeHead(401, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ errors: [{ code: 'UNAUTHORIZED', message: 'bad username or password' }] }));
        return;
      }
      const token = randomBytes(12).toString('hex');
      this.tokens.add(token);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ token }));
      return;
    }
    this.requests.push(`${req.method} ${url.pathname}`);
    const auth = this.opts.auth;
    if (auth?.kind === 'bearer') {
      const tok = req.headers.authorization?.replace(/^Bearer /, '');
      if (!tok || !this.tokens.has(tok)) {
        const repo = /^\/v2\/(.+?)\/(manifests|blobs)\//.exec(url.pathname)?.[1] ?? '';
        res.writeHead(401, {
          'www-authenticate': `Bearer realm="${this.url}/token",service="skiff-test",scope="repository:${repo}:pull"`,
          'content-type': 'application/json',
        });
        res.end(JSON.stringify({ errors: [{ code: 'UNAUTHORIZED', message: 'authentication required' }] }));
        return;
      }
    } else if (auth?.kind === 'basic' && !this.basicOk(req.headers.authorization)) {
      res.writeHead(401, { 'www-authenticate': 'Basic realm="skiff-test"' });
      res.end();
      return;
    }
    const fail = this.opts.failStatus?.(url.pathname);
    if (fail) {
      res.writeHead(fail, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ errors: [{ code: 'UNAVAILABLE', message: `injected failure ${fail}` }] }));
      return;
    }
    const up = await fetch(`${this.opts.upstream}${url.pathname}${url.search}`, {
      method: req.method,
      headers: req.headers.accept ? { accept: req.headers.accept } : {},
    });
    const headers: Record<string, string> = {};
    for (const h of ['content-type', 'docker-content-digest', 'content-length']) {
      const v = up.headers.get(h);
      if (v) headers[h] = v;
    }
    let body = Buffer.from(await up.arrayBuffer());
    if (this.opts.corrupt?.(url.pathname) && body.length) {
      body = Buffer.from(body);
      body[body.length >> 1] ^= 0xff;
    }
    res.writeHead(up.status, headers);
    if (this.opts.delayMs && url.pathname.includes('/blobs/')) {
      res.write(body.subarray(0, 1));
      await new Promise((r) => setTimeout(r, this.opts.delayMs));
      res.end(body.subarray(1));
    } else {
      res.end(body);
    }
  }
}
