import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { registerProxyMetrics } from '../../src/proxy/proxier.js';
import { HttpPodSource, InProcessPodSource, type PodWatchType } from '../../src/proxy/sources.js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { pod } from '../helpers/proxy-fixtures.js';

const cleanups: Array<() => void | Promise<void>> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function waitFor(what: string, cond: () => boolean, ms = 5000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A stand-in for kubelet-lite's status API: each connection to /pods?watch=true gets a handler. */
async function watchServer(onWatch: (res: http.ServerResponse, n: number) => void) {
  let connections = 0;
  const paths: string[] = [];
  const server = http.createServer((req, res) => {
    paths.push(req.url ?? '');
    if (req.url !== '/pods?watch=true') {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { 'Content-Type': 'application/json' });
    onWatch(res, connections++);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, connections: () => connections, paths };
}

const line = (type: PodWatchType, p: Pod) => JSON.stringify({ type, object: p }) + '\n';

describe('HttpPodSource (kubelet-lite watch over HTTP)', () => {
  it('follows the watch, and after a reconnect forgets pods deleted meanwhile', async () => {
    const streams: http.ServerResponse[] = [];
    const srv = await watchServer((res, n) => {
      streams.push(res);
      if (n === 0) res.write(line('ADDED', pod('a', { ip: '10.88.0.2' })) + line('ADDED', pod('b', { ip: '10.88.0.3' })));
      else res.write(line('ADDED', pod('b', { ip: '10.88.0.3' })));
    });
    const src = new HttpPodSource({ url: srv.url, log: silentLogger, reconnectMs: 50 });
    cleanups.push(() => src.close());
    let changes = 0;
    src.onChange(() => changes++);
    src.start();
    await waitFor('initial list', () => src.list().length === 2);
    streams[0]!.write(line('MODIFIED', pod('a', { ip: '10.88.0.2', ready: false })));
    await waitFor('modification', () => src.list().find((p) => p.metadata?.name === 'a')?.status?.conditions?.[0]?.status === 'False');
    streams[0]!.write(line('DELETED', pod('b')));
    await waitFor('deletion', () => src.list().length === 1);
    // The server goes away; the new stream's initial burst replaces everything.
    streams[0]!.end();
    await waitFor('reconnect', () => srv.connections() === 2 && src.list().map((p) => p.metadata?.name).join() === 'b');
    expect(changes).toBeGreaterThanOrEqual(4);
    expect(srv.paths.every((p) => p === '/pods?watch=true')).toBe(true); // never polls the list
  });

  it('drops a connection whose line grows past the limit, and skips lines that are not pod events', async () => {
    let n = 0;
    const srv = await watchServer((res, i) => {
      n = i;
      if (i === 0) {
        res.write('not json\n' + JSON.stringify({ type: 'ADDED', object: { kind: 'Pod' } }) + '\n' + line('ADDED', pod('ok', { ip: '10.88.0.9' })));
        res.write('x'.repeat(5000));
      } else {
        res.write(line('ADDED', pod('after', { ip: '10.88.0.10' })));
      }
    });
    const src = new HttpPodSource({ url: srv.url, log: silentLogger, reconnectMs: 50, maxLineBytes: 4096 });
    cleanups.push(() => src.close());
    src.start();
    await waitFor('reconnect after the long line', () => n >= 1 && src.list().map((p) => p.metadata?.name).join() === 'after');
  });
});

describe('InProcessPodSource', () => {
  it('starts from the agent\'s list and follows its events', () => {
    const listeners: Array<(t: PodWatchType, p: Pod) => void> = [];
    const agent = {
      listPods: () => [pod('a', { ip: '10.88.0.2' })],
      watchPods: (l: (t: PodWatchType, p: Pod) => void) => {
        listeners.push(l);
        return () => listeners.splice(listeners.indexOf(l), 1);
      },
    };
    const src = new InProcessPodSource(agent);
    let changes = 0;
    src.onChange(() => changes++);
    expect(src.list()).toHaveLength(1);
    listeners[0]!('ADDED', pod('b', { ip: '10.88.0.3' }));
    listeners[0]!('DELETED', pod('a'));
    expect(src.list().map((p) => p.metadata?.name)).toEqual(['b']);
    expect(changes).toBe(2);
    src.close();
    expect(listeners).toHaveLength(0);
  });
});

describe('proxy metrics', () => {
  it('records sync durations, rules written and the last sync time on the registry given', async () => {
    const registry = new Registry();
    const m = registerProxyMetrics(registry);
    m.observeSync(0.2, true, 1500);
    m.observeSync(0.01, false, 12);
    m.restoreFailed();
    const text = await registry.metrics();
    expect(text).toContain('kubeproxy_sync_proxy_rules_duration_seconds_count{sync="full"} 1');
    expect(text).toContain('kubeproxy_sync_proxy_rules_duration_seconds_count{sync="partial"} 1');
    expect(text).toContain('kubeproxy_sync_proxy_rules_iptables_last 12');
    expect(text).toContain('kubeproxy_sync_proxy_rules_iptables_written_total 1512');
    expect(text).toContain('kubeproxy_sync_proxy_rules_iptables_restore_failures_total 1');
    const last = Number(/^kubeproxy_sync_proxy_rules_last_timestamp_seconds (\S+)$/m.exec(text)![1]);
    expect(Math.abs(last - Date.now() / 1000)).toBeLessThan(60);
  });
});
