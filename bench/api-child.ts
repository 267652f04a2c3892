/**
 * The HTTPS client of `npm run bench -- api`, run inside the node's network
 * namespace (where the API listens on 127.0.0.1:6443) so that no relay sits
 * between the client being timed and the server. The parent drives it with
 * one JSON command per line on stdin and reads one JSON answer per line on
 * stdout. Times it reports are process.hrtime (CLOCK_MONOTONIC), the same
 * clock in both processes, so the parent can time across the two.
 *
 *   tsx bench/api-child.ts KUBECONFIG
 *
 * Commands: {op: 'watchReady', selector, count} answers {watching: true} once
 * its watch is open, then {readyAt} when `count` pods of the selector are
 * Ready; {op: 'gone', selector} answers once no such pod is left;
 * {op: 'list', path, requests, warmup} answers {ms: [...]} of GETs over one
 * keep-alive connection; {op: 'watchDelay', watchers, writes} answers
 * {ms: [...]}, the write → event delay on every watcher for every write.
 */
import fs from 'node:fs';
import https from 'node:https';
import readline from 'node:readline';

interface Creds {
  ca: Buffer;
  cert: Buffer;
  key: Buffer;
  host: string;
  port: number;
}

function readKubeconfig(file: string): Creds {
  const text = fs.readFileSync(file, 'utf8');
  const field = (name: string) => {
    const m = new RegExp(`^\\s*${name}:\\s*(\\S+)\\s*$`, 'm').exec(text);
    if (!m) throw new Error(`${file} has no ${name}`);
    return m[1]!;
  };
  const data = (name: string) => Buffer.from(field(name), 'base64');
  const server = new URL(field('server'));
  return { ca: data('certificate-authority-data'), cert: data('client-certificate-data'), key: data('client-key-data'), host: server.hostname, port: Number(server.port || 443) };
}

const now = () => process.hrtime.bigint();
const msSince = (t0: bigint) => Number(now() - t0) / 1e6;

class Api {
  /** One connection for requests (keep-alive, one socket), others made per watch. */
  readonly agent: https.Agent;
  /** Every socket the requests on `agent` used: one, if keep-alive held. */
  readonly sockets = new Set<unknown>();

  constructor(readonly creds: Creds) {
    this.agent = this.newAgent(1);
  }

  newAgent(maxSockets: number): https.Agent {
    const { ca, cert, key } = this.creds;
    return new https.Agent({ keepAlive: true, maxSockets, ca, cert, key });
  }

  request(method: string, path: string, body?: unknown, agent = this.agent): Promise<{ status: number; text: string }> {
    const data = body === undefined ? undefined : JSON.stringify(body);
    return new Promise((resolve, reject) => {
      const req = https.request(
        { host: this.creds.host, port: this.creds.port, method, path, agent, headers: { Accept: 'application/json', ...(data ? { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } : {}) } },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() }));
          res.on('error', reject);
        },
      );
      if (agent === this.agent) req.on('socket', (s) => this.sockets.add(s));
      req.on('error', reject);
      req.end(data);
    });
  }

  /** A watch on its own connection; resolves once the server answered (its watch is registered by then). */
  watch(path: string, onEvent: (type: string, object: Record<string, any>) => void): Promise<{ stop(): void }> {
    const agent = this.newAgent(1);
    return new Promise((resolve, reject) => {
      const req = https.request({ host: this.creds.host, port: this.creds.port, method: 'GET', path, agent, headers: { Accept: 'application/json' } }, (res) => {
        if (res.statusCode !== 200) {
          reject(new Error(`watch ${path}: HTTP ${res.statusCode}`));
          res.resume();
          return;
        }
        let rest = '';
        res.setEncoding('utf8');
        res.on('data', (s: string) => {
          rest += s;
          for (let i = rest.indexOf('\n'); i >= 0; i = rest.indexOf('\n')) {
            const line = rest.slice(0, i);
            rest = rest.slice(i + 1);
            if (!line.trim()) continue;
            const e = JSON.parse(line) as { type: string; object: Record<string, any> };
            onEvent(e.type, e.object);
          }
        });
        res.on('error', () => undefined);
        resolve({
          stop: () => {
            req.destroy();
            agent.destroy();
          },
        });
      });
      req.on('error', reject);
      req.end();
    });
  }
}

const isReady = (p: Record<string, any>) => (p.status?.conditions ?? []).some((c: { type: string; status: string }) => c.type === 'Ready' && c.status === 'True');

async function watchReady(api: Api, selector: string, count: number, say: (o: unknown) => void): Promise<void> {
  const ready = new Set<string>();
  let done: (t: bigint) => void = () => undefined;
  const seen = new Promise<bigint>((r) => (done = r));
  const w = await api.watch(`/api/v1/namespaces/default/pods?watch=1&labelSelector=${encodeURIComponent(selector)}`, (type, p) => {
    const name = String(p.metadata?.name);
    if (type !== 'DELETED' && isReady(p) && !p.metadata?.deletionTimestamp) ready.add(name);
    else ready.delete(name);
    if (ready.size >= count) done(now());
  });
  say({ watching: true });
  const t = await seen;
  w.stop();
  say({ readyAt: t.toString() });
}

async function gone(api: Api, selector: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const r = await api.request('GET', `/api/v1/namespaces/default/pods?labelSelector=${encodeURIComponent(selector)}`);
    if (r.status === 200 && (JSON.parse(r.text) as { items: unknown[] }).items.length === 0) return;
    if (Date.now() > deadline) throw new Error(`pods ${selector} still there after ${timeoutMs} ms`);
    await new Promise((res) => setTimeout(res, 100));
  }
}

async function list(api: Api, path: string, requests: number, warmup: number): Promise<{ ms: number[]; bytes: number; items: number; sockets: number }> {
  const ms: number[] = [];
  api.sockets.clear();
  let bytes = 0;
  let items = 0;
  for (let i = 0; i < warmup + requests; i++) {
    const t0 = now();
    const r = await api.request('GET', path);
    const t = msSince(t0);
    if (r.status !== 200) throw new Error(`GET ${path}: HTTP ${r.status}: ${r.text.slice(0, 200)}`);
    if (i >= warmup) ms.push(t);
    bytes = r.text.length;
    if (i === 0) items = (JSON.parse(r.text) as { items: unknown[] }).items.length;
  }
  return { ms, bytes, items, sockets: api.sockets.size };
}

async function watchDelay(api: Api, watchers: number, writes: number, prefix: string): Promise<{ ms: number[] }> {
  const pending = new Map<string, { t0: bigint; left: number; done: () => void }>();
  const ms: number[] = [];
  const stops: Array<{ stop(): void }> = [];
  try {
    for (let i = 0; i < watchers; i++) {
      stops.push(
        await api.watch('/api/v1/namespaces/default/configmaps?watch=1', (type, o) => {
          const p = type === 'ADDED' ? pending.get(String(o.metadata?.name)) : undefined;
          if (!p) return;
          ms.push(msSince(p.t0));
          if (--p.left === 0) p.done();
        }),
      );
    }
    for (let i = 0; i < writes; i++) {
      const name = `${prefix}-${i}`;
      const arrived = new Promise<void>((done) => pending.set(name, { t0: now(), left: watchers, done }));
      const r = await api.request('POST', '/api/v1/namespaces/default/configmaps', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name }, data: { n: String(i) } });
      if (r.status !== 201) throw new Error(`create configmap ${name}: HTTP ${r.status}: ${r.text.slice(0, 200)}`);
      await arrived;
      pending.delete(name);
      // A quiet moment between writes, so each is timed alone.
      await new Promise((res) => setTimeout(res, 20));
    }
    return { ms };
  } finally {
    for (const s of stops) s.stop();
  }
}

async function main(): Promise<void> {
  const file = process.argv[2];
  if (!file) throw new Error('usage: api-child.ts KUBECONFIG');
  const api = new Api(readKubeconfig(file));
  const say = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`);
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const c = JSON.parse(line) as { op: string; [k: string]: any };
    try {
      if (c.op === 'watchReady') await watchReady(api, c.selector, c.count, say);
      else if (c.op === 'gone') say((await gone(api, c.selector, c.timeoutMs ?? 120_000), { gone: true }));
      else if (c.op === 'list') say(await list(api, c.path, c.requests, c.warmup ?? 0));
      else if (c.op === 'watchDelay') say(await watchDelay(api, c.watchers, c.writes, c.prefix));
      else throw new Error(`unknown op ${c.op}`);
    } catch (err) {
      say({ error: err instanceof Error ? err.message : String(err) });
    }
  }
  api.agent.destroy();
}

main().catch((err) => {
  process.stderr.write(`api bench client failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
