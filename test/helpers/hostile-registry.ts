/**
 * A registry written for fault injection: it serves one good image from
 * memory over the distribution API, and a test swaps in a handler that
 * misbehaves (endless bodies, lies about lengths, stalls, redirects). Every
 * request is recorded with what was sent and when its connection closed, so a
 * test can see whether skiff hung up.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { BuiltImage } from './oci.js';

export interface SeenRequest {
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  at: number;
  /** Bytes of response body written so far. */
  sent: number;
  /** When the connection carrying this request closed. */
  closedAt?: number;
  closed: Promise<number>;
}

/** Return true when the request was handled; false lets the good image answer. */
export type Handler = (req: http.IncomingMessage, res: http.ServerResponse, seen: SeenRequest) => boolean;

export class HostileRegistry {
  readonly requests: SeenRequest[] = [];
  handler: Handler = () => false;
  host = '';
  private server!: http.Server;
  private readonly images = new Map<string, BuiltImage>();

  constructor(private readonly address = '127.0.0.1') {}

  async start(): Promise<this> {
    this.server = http.createServer((req, res) => this.handle(req, res));
    await new Promise<void>((r) => this.server.listen(0, this.address, () => r()));
    this.host = `${this.address}:${(this.server.address() as AddressInfo).port}`;
    return this;
  }

  /** Serves `img` as `<repo>:<tag>` (and its blobs) when no handler takes the request. */
  serve(repo: string, tag: string, img: BuiltImage): void {
    this.images.set(`${repo}:${tag}`, img);
    this.images.set(`${repo}:${img.manifest.digest}`, img);
  }

  async close(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((r) => this.server.close(() => r()));
  }

  private handle(req: http.IncomingMessage, res: http.ServerResponse): void {
    let resolveClosed!: (t: number) => void;
    const seen: SeenRequest = {
      method: req.method ?? '',
      path: req.url ?? '',
      headers: req.headers,
      at: Date.now(),
      sent: 0,
      closed: new Promise((r) => (resolveClosed = r)),
    };
    this.requests.push(seen);
    req.socket.once('close', () => {
      seen.closedAt = Date.now();
      resolveClosed(seen.closedAt);
    });
    if (this.handler(req, res, seen)) return;
    const url = new URL(req.url ?? '/', 'http://x');
    if (url.pathname === '/v2/') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      return;
    }
    const m = /^\/v2\/(.+)\/(manifests|blobs)\/([^/]+)$/.exec(url.pathname);
    const img = m && m[2] === 'manifests' ? this.images.get(`${m[1]}:${m[3]}`) : undefined;
    if (img) {
      res.writeHead(200, { 'content-type': img.manifest.mediaType, 'content-length': img.manifest.data.length, 'docker-content-digest': img.manifest.digest });
      res.end(img.manifest.data);
      return;
    }
    if (m && m[2] === 'blobs') {
      for (const i of this.images.values()) {
        const blob = [i.config, ...i.layers].find((b) => b.digest === m[3]);
        if (blob) {
          res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': blob.data.length });
          res.end(blob.data);
          return;
        }
      }
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ errors: [{ code: 'NOT_FOUND', message: 'no such thing' }] }));
  }
}

/**
 * Writes `chunk` again and again, as fast as the peer reads, until the
 * connection closes or `cap` bytes went out (a safety stop for a broken test).
 */
export function flood(res: http.ServerResponse, seen: SeenRequest, chunk: Buffer = Buffer.alloc(64 << 10, 0x61), cap = 4 * 1024 ** 3): void {
  const pump = () => {
    while (!res.destroyed && seen.sent < cap) {
      seen.sent += chunk.length;
      if (!res.write(chunk)) return;
    }
    if (seen.sent >= cap) res.end();
  };
  res.on('drain', pump);
  pump();
}

/** VmRSS of a process, in bytes. */
export async function rssOf(pid: number): Promise<number> {
  const { readFile } = await import('node:fs/promises');
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = /VmRSS:\s+(\d+) kB/.exec(status)?.[1];
  if (!kb) throw new Error(`no VmRSS for ${pid}`);
  return Number(kb) * 1024;
}

/** Samples a process's RSS every 50 ms while `work` runs; returns the work's outcome and the peak. */
export async function peakRss<T>(pid: number, work: () => Promise<T>): Promise<{ result: PromiseSettledResult<T>; peak: number }> {
  let peak = await rssOf(pid);
  let running = true;
  const sampler = (async () => {
    while (running) {
      peak = Math.max(peak, await rssOf(pid).catch(() => 0));
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  const [result] = await Promise.allSettled([work()]);
  running = false;
  await sampler;
  return { result: result!, peak };
}
