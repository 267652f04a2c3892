/**
 * An authenticated but hostile client of the node's API (issue 23, point 5):
 * bodies and requests that are valid enough to be read, sent to the real
 * API in its own process (its real store, database and credentials), while
 * a second client times GET /healthz. Each hostile request must be answered
 * with a Status quickly, and the health check must keep being answered.
 */
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { ApiProcess } from '../helpers/api-process.js';
import { freePort } from '../helpers/registry.js';

const MIB = 1024 * 1024;
const BODY = 3 * MIB - 1024;

describe.skipIf(!isRoot)('a hostile client of the node API', () => {
  let base: string;
  let api: ApiProcess;

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-attack-api-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort());
    await api.start();
  }, 60_000);

  afterAll(async () => {
    await api?.kill('SIGTERM');
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  /** `send` while /healthz is asked every 50 ms: the answer, how long it took, and the slowest health check. */
  async function whileHealthTimed(send: () => Promise<{ status: number; body: string }>): Promise<{ status: number; body: string; ms: number; slowestHealthMs: number }> {
    let done = false;
    let slowest = 0;
    const prober = (async () => {
      while (!done) {
        const t0 = performance.now();
        const h = await api.request('GET', '/healthz');
        expect(h.status).toBe(200);
        slowest = Math.max(slowest, performance.now() - t0);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const t0 = performance.now();
    // Bounded, so a test of a request that holds the node fails in seconds rather than at the suite's timeout.
    const out = await Promise.race([send(), new Promise<never>((_, reject) => setTimeout(() => reject(new Error('no answer within 10 s')), 10_000).unref())]).finally(() => (done = true));
    const ms = performance.now() - t0;
    await prober;
    return { ...out, ms, slowestHealthMs: slowest };
  }

  const apply = (name: string, body: string, query = '') =>
    api.request('PATCH', `/api/v1/namespaces/default/configmaps/${name}?fieldManager=attack${query}`, body, { 'Content-Type': 'application/apply-patch+yaml' });

  it('refuses YAML apply bodies too large to compose, at once (3 MiB of "[" held the event loop for a minute and 2.8 GB)', async () => {
    const bodies: Record<string, string> = {
      'nested flow sequences': '['.repeat(BODY),
      'flow collections one after another': `[${'[],'.repeat(BODY / 3 - 10)}]`,
      'a block map of 300,000 keys': `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostile\ndata:\n${Array.from({ length: 300_000 }, (_, i) => `  k${i}: v`).join('\n')}`.slice(0, BODY),
      'JSON that is not (so read as YAML)': `{${'['.repeat(BODY - 1)}`,
    };
    for (const [what, body] of Object.entries(bodies)) {
      const r = await whileHealthTimed(() => apply('hostile', body));
      expect([400, 413], `${what}: ${r.body.slice(0, 300)}`).toContain(r.status);
      expect(JSON.parse(r.body), what).toMatchObject({ kind: 'Status', status: 'Failure' });
      expect(r.ms, what).toBeLessThan(3000);
      expect(r.slowestHealthMs, what).toBeLessThan(3000);
    }
    // A YAML apply of ordinary size still works.
    const ok = await apply('hostile', 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostile\ndata:\n  a: "1"\n');
    expect(ok.status, ok.body).toBe(201);
  });

  it('refuses a protobuf body of 1.5M empty fields with 413 as it reads them (the whole field list was built first: 1.4 s and +140 MiB)', async () => {
    // kubectl 1.35 sends this type: the k8s magic, runtime.Unknown {typeMeta v1 ConfigMap, raw}, and raw of
    // 1.5M fields numbered 15 (none in a ConfigMap), each two bytes: tag, length 0.
    const raw = Buffer.alloc(3_000_000);
    for (let i = 0; i < raw.length; i += 2) raw[i] = (15 << 3) | 2;
    const typeMeta = Buffer.concat([Buffer.from([0x0a, 2]), Buffer.from('v1'), Buffer.from([0x12, 9]), Buffer.from('ConfigMap')]);
    const len = (n: number) => {
      const out: number[] = [];
      for (; n >= 0x80; n >>>= 7) out.push((n & 0x7f) | 0x80);
      return Buffer.from([...out, n]);
    };
    const body = Buffer.concat([Buffer.from('k8s\0', 'binary'), Buffer.from([0x0a]), len(typeMeta.length), typeMeta, Buffer.from([0x12]), len(raw.length), raw]);
    expect(body.length).toBeLessThan(3 * MIB);
    const before = (await api.stats()).rss;
    const r = await whileHealthTimed(() => api.request('POST', '/api/v1/namespaces/default/configmaps', body, { 'Content-Type': 'application/vnd.kubernetes.protobuf' }));
    const after = (await api.stats()).rss;
    console.log(`protobuf of 1.5M empty fields: ${r.status} in ${r.ms.toFixed(0)} ms, slowest /healthz ${r.slowestHealthMs.toFixed(0)} ms, RSS ${(before / MIB).toFixed(0)} → ${(after / MIB).toFixed(0)} MiB`);
    expect(r.status, r.body.slice(0, 300)).toBe(413);
    expect(JSON.parse(r.body)).toMatchObject({ kind: 'Status', status: 'Failure', reason: 'RequestEntityTooLarge' });
    expect(r.ms).toBeLessThan(1000);
    expect(r.slowestHealthMs).toBeLessThan(1000);
  });

  it('finds duplicate keys under fieldValidation=Strict in linear time (the library compared every pair: 20,000 keys took seconds)', async () => {
    const keys = Array.from({ length: 20_000 }, (_, i) => `  k${i}: v`).join('\n');
    const body = `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dup\ndata:\n${keys}\n  k7: again\n`;
    const r = await whileHealthTimed(() => apply('dup', body, '&fieldValidation=Strict'));
    expect(r.status, r.body).toBe(400);
    expect(JSON.parse(r.body).message).toMatch(/Map keys must be unique: "k7"/);
    expect(r.ms).toBeLessThan(2000);
    // Without Strict, the same body is taken (the last value wins, as YAML maps are read elsewhere).
    const dup = await apply('dup2', 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: dup2\ndata:\n  a: "1"\n  a: "2"\n');
    expect(dup.status, dup.body).toBe(201);
  });
});
