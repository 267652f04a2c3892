import type { IncomingMessage } from 'node:http';
import { describe, expect, it } from 'vitest';
import { metricsRequest, type MetricsSnapshot } from '../../src/api/metrics.js';
import { snapshotOf } from '../../src/node/resource-metrics.js';

const get = (path: string, snap: MetricsSnapshot | undefined, method = 'GET') => {
  const url = new URL(path, 'https://api');
  return metricsRequest({ method } as IncomingMessage, url.pathname.split('/').filter(Boolean), url, async () => snap);
};

const summary = {
  node: { nodeName: 'n1', cpu: { time: 't', usageNanoCores: 250_000_000 }, memory: { time: 't', workingSetBytes: 512 * 1024 * 1024 } },
  pods: [
    { podRef: { name: 'web', namespace: 'default', uid: 'u1' }, containers: [{ name: 'c', cpu: { time: 't', usageNanoCores: 1_000_000 }, memory: { time: 't', workingSetBytes: 3000 } }] },
    { podRef: { name: 'db', namespace: 'prod', uid: 'u2' }, containers: [{ name: 'c', cpu: { time: 't', usageNanoCores: 5 }, memory: { time: 't', workingSetBytes: 8192 } }] },
    { podRef: { name: 'starting', namespace: 'default', uid: 'u3' }, containers: [{ name: 'c' }] },
  ],
};
const pods = [{ metadata: { uid: 'u1', labels: { app: 'web' } } }, { metadata: { uid: 'u2', labels: { app: 'db' } } }];
const snap = snapshotOf(summary, pods, 10, new Date(Date.UTC(2030, 0, 1)));

describe('metrics.k8s.io', () => {
  it('serves NodeMetrics and PodMetrics as metrics-server does', async () => {
    expect((await get('/apis/metrics.k8s.io/v1beta1/nodes', snap)).body).toEqual({
      kind: 'NodeMetricsList',
      apiVersion: 'metrics.k8s.io/v1beta1',
      metadata: {},
      items: [{ kind: 'NodeMetrics', apiVersion: 'metrics.k8s.io/v1beta1', metadata: { name: 'n1', creationTimestamp: '2030-01-01T00:00:00Z' }, timestamp: '2030-01-01T00:00:00Z', window: '10s', usage: { cpu: '250000000n', memory: '524288Ki' } }],
    });
    const all = (await get('/apis/metrics.k8s.io/v1beta1/pods', snap)).body as { items: Array<{ metadata: { name: string } }> };
    expect(all.items.map((p) => p.metadata.name)).toEqual(['web', 'db']);
    const web = (await get('/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/web', snap)).body as Record<string, unknown>;
    expect(web).toMatchObject({ kind: 'PodMetrics', metadata: { name: 'web', namespace: 'default', labels: { app: 'web' } }, containers: [{ name: 'c', usage: { cpu: '1000000n', memory: '3000' } }] });
    const selected = (await get('/apis/metrics.k8s.io/v1beta1/pods?labelSelector=app%3Ddb', snap)).body as { items: unknown[] };
    expect(selected.items).toHaveLength(1);
    const resources = (await get('/apis/metrics.k8s.io/v1beta1', snap)).body as { resources: Array<{ name: string; verbs: string[] }> };
    expect(resources.resources.map((r) => [r.name, r.verbs])).toEqual([['nodes', ['get', 'list']], ['pods', ['get', 'list']]]);
  });

  it('refuses what it does not serve', async () => {
    await expect(get('/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope', snap)).rejects.toMatchObject({ reason: 'NotFound' });
    await expect(get('/apis/metrics.k8s.io/v1beta1/nodes', snap, 'POST')).rejects.toMatchObject({ reason: 'MethodNotAllowed' });
    await expect(get('/apis/metrics.k8s.io/v1beta1/namespaces/x/nodes', snap)).rejects.toMatchObject({ reason: 'NotFound' });
    await expect(get('/apis/metrics.k8s.io/v1beta1/pods?labelSelector=%3D%3D%3D', snap)).rejects.toMatchObject({ reason: 'BadRequest' });
    await expect(get('/apis/metrics.k8s.io/v1beta1/nodes', undefined)).rejects.toMatchObject({ reason: 'ServiceUnavailable' });
    await expect(get('/apis/metrics.k8s.io/v2/nodes', snap)).rejects.toMatchObject({ reason: 'NotFound' });
  });
});
