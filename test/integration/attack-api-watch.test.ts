/**
 * Watches that never read (issue 23, point 5): a thousand authenticated
 * watches on ConfigMaps whose clients never read a byte, then six ConfigMaps
 * of 1 MiB written. Each watch may leave 1 MiB unread, so without a bound on
 * the total the node held about 1 GiB (its RSS went from 80 to 656 MiB, and
 * /healthz took 3.7 s). What the API process counts as written but unread
 * (the watches' writableLength, summed) must stay within its total budget,
 * health checks must stay quick, and a watch opened afterwards still sees
 * every change.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import https from 'node:https';
import type { IncomingMessage } from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { ApiProcess } from '../helpers/api-process.js';
import { freePort } from '../helpers/registry.js';

const MIB = 1024 * 1024;
const WATCHES = 1000;
/** The server's default total of unread watch bytes. */
const BUDGET = 64 * MIB;

describe.skipIf(!isRoot)('watches that never read', () => {
  let base: string;
  let api: ApiProcess;
  const idle: IncomingMessage[] = [];

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-attack-watch-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort(), { SKIFF_API_MAX_WATCHES: '1024' });
    await api.start();
  }, 60_000);

  afterAll(async () => {
    for (const r of idle) r.destroy();
    await api?.kill('SIGTERM');
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  /** A watch whose client takes the headers and then never reads again. */
  function idleWatch(tls: { ca: Buffer; cert: Buffer; key: Buffer }, query: string): Promise<IncomingMessage> {
    return new Promise((resolve, reject) => {
      const req = https.request({ host: '127.0.0.1', port: api.port, method: 'GET', path: `/api/v1/namespaces/default/configmaps?watch=true${query}`, agent: false, ...tls }, (res) => {
        res.pause();
        res.socket.pause();
        resolve(res);
      });
      req.on('error', reject);
      req.end();
    });
  }

  async function healthMs(): Promise<number> {
    const t0 = performance.now();
    const h = await api.request('GET', '/healthz');
    expect(h.status).toBe(200);
    return performance.now() - t0;
  }

  it('bounds the bytes all watches hold unread, and keeps /healthz quick', async () => {
    const pki = path.join(api.dir, 'pki');
    const tls = { ca: fs.readFileSync(path.join(pki, 'ca.crt')), cert: fs.readFileSync(path.join(pki, 'admin.crt')), key: fs.readFileSync(path.join(pki, 'admin.key')) };
    const start = await api.request('GET', '/api/v1/namespaces/default/configmaps');
    const fromRv = JSON.parse(start.body).metadata.resourceVersion as string;
    // The API's own watchers (the scheduler's sum of pod requests) are there before any client's.
    const own = (await api.stats()).watches;
    for (let i = 0; i < WATCHES; i += 50) {
      const batch = await Promise.all(Array.from({ length: Math.min(50, WATCHES - i) }, () => idleWatch(tls, `&resourceVersion=${fromRv}`)));
      idle.push(...batch);
    }
    const before = await api.stats();
    expect(before.watches).toBe(own + WATCHES);

    const data = 'x'.repeat(MIB - 4096);
    let slowest = 0;
    let mostUnread = 0;
    for (let i = 0; i < 6; i++) {
      const r = await api.request('POST', '/api/v1/namespaces/default/configmaps', JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: `big-${i}` }, data: { d: data } }), { 'Content-Type': 'application/json' });
      expect(r.status, r.body.slice(0, 300)).toBe(201);
      slowest = Math.max(slowest, await healthMs());
      mostUnread = Math.max(mostUnread, (await api.stats()).unreadWatchBytes);
    }
    const after = await api.stats();
    console.log(`watches ${before.watches} → ${after.watches}; unread at most ${(mostUnread / MIB).toFixed(1)} MiB; RSS ${(before.rss / MIB).toFixed(0)} → ${(after.rss / MIB).toFixed(0)} MiB; slowest /healthz ${slowest.toFixed(0)} ms`);
    // Within the total, with one 1 MiB event of slack (the write that passed it).
    expect(mostUnread).toBeLessThanOrEqual(BUDGET + 2 * MIB);
    // It took 6.8 s here before the bound (3.7 s in the attack's report); generous for a shared machine.
    expect(slowest).toBeLessThan(2000);

    // The node still serves watches: one from before the writes, read to the end, gets all six.
    const seen = await new Promise<string[]>((resolve, reject) => {
      const names: string[] = [];
      let rest = '';
      const req = https.request({ host: '127.0.0.1', port: api.port, method: 'GET', path: `/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=${fromRv}&timeoutSeconds=5`, agent: false, ...tls }, (res) => {
        res.setEncoding('utf8');
        res.on('data', (t: string) => {
          rest += t;
          let nl;
          while ((nl = rest.indexOf('\n')) >= 0) {
            const ev = JSON.parse(rest.slice(0, nl)) as { type: string; object: { metadata: { name: string } } };
            rest = rest.slice(nl + 1);
            if (ev.type === 'ADDED') names.push(ev.object.metadata.name);
            if (names.length === 6) {
              req.destroy();
              resolve(names);
            }
          }
        });
        res.on('end', () => resolve(names));
      });
      req.on('error', (e) => (names.length === 6 ? undefined : reject(e)));
      req.end();
    });
    expect(seen).toEqual(['big-0', 'big-1', 'big-2', 'big-3', 'big-4', 'big-5']);
  }, 120_000);
});
