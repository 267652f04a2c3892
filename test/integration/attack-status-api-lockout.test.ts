/**
 * A local user trying to lock the node out of the agent's status API (issue
 * 29): as uid 65534 (and more uids), idle pod watches, slowloris sockets
 * and connect/close loops, each opened again as soon as it is closed, while
 * root's /healthz and /pods, root's own pod watch and another ordinary
 * user's health check keep being answered, and the log keeps to a few
 * lines about it. The attackers are real processes under other uids
 * (setpriv), so the server tells them apart by the kernel's own record of
 * who owns each socket.
 */
import { spawn } from 'node:child_process';
import http from 'node:http';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { createLogger } from '../../src/log.js';
import { StatusServer, type StatusServerOptions } from '../../src/kubelet-lite/status-server.js';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { FakeAgentView, testPod } from '../helpers/fake-agent-view.js';

const attacker = path.join(repoRoot, 'test/helpers/status-api-attacker.mjs');

interface Counts {
  connects: number;
  closed: number;
  watchesStreaming: number;
  maxOpen: number;
  healthOk: number;
  healthFailed: number;
}

/** The attacker script as `uid`, with no groups: its counts when it is done. */
function runAs(uid: number, opts: Record<string, unknown>): Promise<Counts> {
  const child = spawn('setpriv', [`--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', process.execPath, attacker, JSON.stringify(opts)], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString().slice(0, 4096)));
  // Bounded even if the script hangs.
  const kill = setTimeout(() => child.kill('SIGKILL'), Number(opts.ms) + 20_000);
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => {
      clearTimeout(kill);
      if (code !== 0) reject(new Error(`attacker as uid ${uid} exited ${code}: ${err}`));
      else resolve(JSON.parse(out) as Counts);
    });
  });
}

/** One GET on a connection of its own (as a health checker makes it), with a deadline. */
function get(url: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(url, { agent: false, timeout: 3000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('no answer within 3 s')));
    req.on('error', reject);
  });
}

/** Root's pod watch, as the proxy holds it: the lines it has read so far. */
function watch(url: string) {
  const w = { text: '', ended: false, req: undefined as unknown as http.ClientRequest };
  w.req = http.get(`${url}/pods?watch=true`, { agent: false }, (res) => {
    res.setEncoding('utf8');
    res.on('data', (d: string) => (w.text += d));
    res.on('close', () => (w.ended = true));
  });
  w.req.on('error', () => (w.ended = true));
  return w;
}

async function until(what: string, fn: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

describe.skipIf(!isRoot)('the status API under a lockout attempt by non-root users', () => {
  let server: StatusServer | undefined;
  const logLines: string[] = [];

  async function start(view: FakeAgentView, opts: Partial<StatusServerOptions> = {}): Promise<StatusServer> {
    logLines.length = 0;
    const log = createLogger('info', (line) => logLines.push(line));
    server = await StatusServer.listen({ address: '127.0.0.1:0', view, log, ...opts });
    return server;
  }

  afterEach(async () => {
    await server?.close();
    server = undefined;
  });

  /**
   * Root's checks while the attack runs: each /healthz and /pods on a new
   * connection must be answered, and `sample` is called at each round.
   */
  async function keepAsking(s: StatusServer, attack: Promise<unknown>, sample: () => void): Promise<{ asked: number; failures: string[] }> {
    let over = false;
    void attack.finally(() => (over = true));
    const failures: string[] = [];
    let asked = 0;
    while (!over) {
      for (const p of ['/healthz', '/pods']) {
        asked++;
        try {
          const r = await get(`${s.url}${p}`);
          if (r.status !== 200 || (p === '/healthz' && r.body !== 'ok')) failures.push(`${p}: ${r.status}`);
        } catch (err) {
          failures.push(`${p}: ${(err as Error).message}`);
        }
      }
      sample();
      await new Promise((r) => setTimeout(r, 100));
    }
    return { asked, failures };
  }

  const refusalLines = () => logLines.filter((l) => l.includes('connections refused or shed'));

  it('with the default bounds, one user holding watches, slowloris sockets and a connect loop keeps neither root nor another user out', async () => {
    const view = new FakeAgentView();
    view.set(testPod('default', 'web'));
    const s = await start(view);
    const mine = watch(s.url);
    await until("root's watch", () => mine.text.includes('"ADDED"'));

    const ms = 12_000;
    const attack = Promise.all([
      runAs(65534, { port: s.port, ms, watches: 140, slowloris: 200, churn: 8 }),
      runAs(65533, { port: s.port, ms, mode: 'probe' }),
    ]);
    let most = 0;
    let changed = false;
    const t0 = Date.now();
    const { asked, failures } = await keepAsking(s, attack, () => {
      most = Math.max(most, s.connectionsOf(65534));
      // A change in the middle of the attack reaches root's watch.
      if (!changed && Date.now() - t0 > ms / 2) {
        changed = true;
        view.set(testPod('default', 'web', { metadata: { name: 'web', namespace: 'default', labels: { during: 'attack' } } }));
      }
    });
    const [hostile, other] = await attack;
    expect(failures.length, `${failures.length} of ${asked} of root's requests failed, such as ${failures.slice(0, 3).join('; ')}`).toBe(0);

    // The attack was real: it connected over and over and held watches.
    expect(hostile.connects).toBeGreaterThan(1000);
    expect(hostile.watchesStreaming).toBeGreaterThanOrEqual(16);
    expect(asked).toBeGreaterThan(20);
    expect(other.healthFailed, "the other user's failed health checks").toBe(0);
    expect(other.healthOk).toBeGreaterThan(10);
    expect(most).toBeLessThanOrEqual(16);
    expect(most).toBeGreaterThan(0);
    expect(mine.ended).toBe(false);
    expect(mine.text).toContain('"during":"attack"');
    mine.req.destroy();

    // Thousands refused; a line for the first, then one per 10 s with the count.
    const lines = refusalLines();
    expect(lines.length).toBeGreaterThanOrEqual(1);
    expect(lines.length).toBeLessThanOrEqual(3);
    const counted = lines.map((l) => (JSON.parse(l) as { count: number }).count).reduce((a, b) => a + b, 0);
    expect(counted).toBeGreaterThan(100);
    expect(logLines.length).toBeLessThan(10);
  });

  it('with many users filling the non-root share, root still gets in and each user keeps to its bound', async () => {
    const view = new FakeAgentView();
    view.set(testPod('default', 'web'));
    // Small bounds, so that four attackers overfill them: 24 in all, 8 kept for root, 6 per user.
    const s = await start(view, { maxConnections: 24, reservedForRoot: 8, maxConnectionsPerUser: 6 });
    const mine = watch(s.url);
    await until("root's watch", () => mine.text.includes('"ADDED"'));
    const uids = [65534, 65533, 65532, 65531];
    const ms = 8_000;
    const attack = Promise.all(uids.map((uid) => runAs(uid, { port: s.port, ms, watches: 10, slowloris: 10 })));
    let perUser = 0;
    let share = 0;
    const { asked, failures } = await keepAsking(s, attack, () => {
      let sum = 0;
      for (const uid of uids) {
        perUser = Math.max(perUser, s.connectionsOf(uid));
        sum += s.connectionsOf(uid);
      }
      share = Math.max(share, sum);
    });
    const counts = await attack;
    expect(failures.length, `${failures.length} of ${asked} of root's requests failed, such as ${failures.slice(0, 3).join('; ')}`).toBe(0);

    expect(counts.every((c) => c.connects > 20)).toBe(true);
    expect(perUser).toBeLessThanOrEqual(6);
    expect(share).toBeLessThanOrEqual(16);
    expect(share).toBeGreaterThan(6);
    expect(mine.ended).toBe(false);
    mine.req.destroy();
    expect(refusalLines().length).toBeLessThanOrEqual(2);
  });
});
