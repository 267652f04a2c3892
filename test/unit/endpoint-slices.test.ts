/**
 * The endpoint-slice and endpoints controllers against a real Store through
 * localClient: what kube-controller-manager writes for ready, not-ready and
 * terminating pods, named target ports, publishNotReadyAddresses, headless
 * hostnames, 100 endpoints per slice, Services without selectors, deleted
 * Services and a Service scaled to none; the kubernetes Service; the tables
 * kubectl prints.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { localClient, type ApiClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { toTable } from '../../src/api/table.js';
import type { ApiObject, Obj } from '../../src/api/types.js';
import { silentLogger } from '../../src/log.js';
import { EndpointSliceController } from '../../src/node/endpoint-slices.js';
import { KubernetesService } from '../../src/node/kubernetes-service.js';
import { waitFor } from '../helpers/registry.js';

const SLICES = 'endpointslices.discovery.k8s.io';

interface Fixture {
  store: Store;
  client: ApiClient;
  controller: EndpointSliceController;
}

let current: Fixture | undefined;
afterEach(() => {
  current?.controller.stop();
  current?.store.close();
  current = undefined;
});

async function setup(): Promise<Fixture> {
  const store = new Store({ kinds: nodeKinds('node-a') });
  const client = localClient(store);
  const controller = new EndpointSliceController({ client, log: silentLogger });
  await controller.start();
  current = { store, client, controller };
  return current;
}

async function addPod(client: ApiClient, name: string, o: { ip?: string; ready?: boolean; labels?: Record<string, string>; port?: number; hostname?: string; subdomain?: string; node?: string } = {}): Promise<ApiObject> {
  const pod = await client.create('pods', 'default', {
    metadata: { name, labels: o.labels ?? { app: 'web' } },
    spec: {
      ...(o.node ? { nodeName: o.node } : {}),
      ...(o.hostname ? { hostname: o.hostname } : {}),
      ...(o.subdomain ? { subdomain: o.subdomain } : {}),
      containers: [{ name: 'c', image: 'busybox', ports: [{ name: 'http', containerPort: o.port ?? 8080 }] }],
    },
  });
  if (o.ip === undefined) return pod;
  const status = { phase: 'Running', podIP: o.ip, podIPs: [{ ip: o.ip }], conditions: [{ type: 'Ready', status: o.ready === false ? 'False' : 'True' }] };
  return client.update('pods', 'default', name, { ...pod, status }, { status: true });
}

const service = (name: string, spec: Obj): Obj => ({ metadata: { name, labels: { team: 'a' } }, spec: { ports: [{ name: 'web', port: 80, targetPort: 'http' }], ...spec } });

const slicesOf = async (client: ApiClient, svc: string) => (await client.list(SLICES, { namespace: 'default', labelSelector: `kubernetes.io/service-name=${svc}` })).items;
const endpointsOf = (s: ApiObject[]) => s.flatMap((x) => (x.endpoints as Obj[] | undefined) ?? []);

/** Waits until the Service's slices hold `n` endpoints in all and `check` holds. */
async function until(client: ApiClient, svc: string, n: number, check: (s: ApiObject[]) => boolean = () => true): Promise<ApiObject[]> {
  return waitFor(`${n} endpoints of ${svc}`, async () => {
    const s = await slicesOf(client, svc);
    return s.length > 0 && endpointsOf(s).length === n && check(s) ? s : undefined;
  }, 5_000);
}

describe('the endpoint-slice controller', () => {
  it('writes a slice and an Endpoints of the selected pods, owned by the Service, with conditions, node and target', async () => {
    const { client } = await setup();
    const a = await addPod(client, 'a', { ip: '10.88.0.2', node: 'node-a' });
    await addPod(client, 'b', { ip: '10.88.0.3', ready: false, node: 'node-b' });
    await addPod(client, 'no-ip');
    await addPod(client, 'other', { ip: '10.88.0.9', labels: { app: 'db' } });
    const svc = await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    const [slice, ...more] = await until(client, 'web', 2);
    expect(more).toEqual([]);
    expect(slice!.metadata.name).toMatch(/^web-[a-z0-9]{5}$/);
    expect(slice!.metadata.labels).toEqual({ team: 'a', 'kubernetes.io/service-name': 'web', 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' });
    expect(slice!.metadata.ownerReferences).toEqual([{ apiVersion: 'v1', kind: 'Service', name: 'web', uid: svc.metadata.uid, controller: true, blockOwnerDeletion: true }]);
    expect(slice!.addressType).toBe('IPv4');
    expect(slice!.ports).toEqual([{ name: 'web', port: 8080, protocol: 'TCP' }]);
    expect(slice!.endpoints).toEqual([
      { addresses: ['10.88.0.2'], conditions: { ready: true, serving: true, terminating: false }, nodeName: 'node-a', targetRef: { kind: 'Pod', namespace: 'default', name: 'a', uid: a.metadata.uid } },
      { addresses: ['10.88.0.3'], conditions: { ready: false, serving: false, terminating: false }, nodeName: 'node-b', targetRef: expect.objectContaining({ name: 'b' }) },
    ]);
    const ep = await waitFor('Endpoints', () => client.get('endpoints', 'default', 'web'), 5_000);
    expect(ep.metadata.labels).toMatchObject({ team: 'a', 'endpoints.kubernetes.io/managed-by': 'endpoint-controller' });
    expect(ep.subsets).toEqual([
      {
        addresses: [{ ip: '10.88.0.2', nodeName: 'node-a', targetRef: expect.objectContaining({ name: 'a' }) }],
        notReadyAddresses: [{ ip: '10.88.0.3', nodeName: 'node-b', targetRef: expect.objectContaining({ name: 'b' }) }],
        ports: [{ name: 'web', port: 8080, protocol: 'TCP' }],
      },
    ]);
  });

  it('marks a deleted pod that still serves as serving and terminating, and leaves it out of Endpoints', async () => {
    const { client } = await setup();
    await addPod(client, 'a', { ip: '10.88.0.2' });
    await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    await until(client, 'web', 1);
    await client.delete('pods', 'default', 'a', { gracePeriodSeconds: 30 });
    const s = await until(client, 'web', 1, (s) => (endpointsOf(s)[0]!.conditions as Obj).terminating === true);
    expect(endpointsOf(s)[0]!.conditions).toEqual({ ready: false, serving: true, terminating: true });
    await waitFor('Endpoints without it', async () => ((await client.get('endpoints', 'default', 'web')).subsets as unknown[]).length === 0, 5_000);
  });

  it('publishes not-ready pods as ready with publishNotReadyAddresses, and names headless endpoints by hostname', async () => {
    const { client } = await setup();
    await addPod(client, 'a', { ip: '10.88.0.2', ready: false, hostname: 'db-0', subdomain: 'db' });
    await addPod(client, 'b', { ip: '10.88.0.3', hostname: 'x', subdomain: 'elsewhere' });
    await client.create('services', 'default', service('db', { selector: { app: 'web' }, clusterIP: 'None', publishNotReadyAddresses: true }));
    const [slice] = await until(client, 'db', 2);
    expect(slice!.metadata.labels!['service.kubernetes.io/headless']).toBe('');
    const [a, b] = endpointsOf([slice!]);
    expect(a).toMatchObject({ hostname: 'db-0', conditions: { ready: true, serving: true, terminating: false } });
    expect(b!.hostname).toBeUndefined();
  });

  it('resolves a named targetPort per pod: pods with different numbers are in different slices', async () => {
    const { client } = await setup();
    await addPod(client, 'a', { ip: '10.88.0.2', port: 8080 });
    await addPod(client, 'b', { ip: '10.88.0.3', port: 9090 });
    await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    const s = await until(client, 'web', 2, (s) => s.length === 2);
    expect(s.map((x) => [(x.ports as Obj[])[0]!.port, endpointsOf([x]).map((e) => (e.addresses as string[])[0])]).sort()).toEqual([
      [8080, ['10.88.0.2']],
      [9090, ['10.88.0.3']],
    ]);
  });

  it('puts at most 100 endpoints in a slice', async () => {
    const { client } = await setup();
    for (let i = 0; i < 250; i++) await addPod(client, `p${String(i).padStart(3, '0')}`, { ip: `10.88.${Math.floor(i / 200)}.${(i % 200) + 2}` });
    await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    const s = await until(client, 'web', 250);
    expect(s.map((x) => endpointsOf([x]).length).sort()).toEqual([100, 100, 50]);
  });

  it('leaves one empty slice when no pod is left, and removes its own slices and Endpoints with the Service', async () => {
    const { client, store } = await setup();
    await addPod(client, 'a', { ip: '10.88.0.2' });
    await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    await until(client, 'web', 1);
    await client.delete('pods', 'default', 'a', { gracePeriodSeconds: 0 });
    const s = await until(client, 'web', 0);
    expect(s).toHaveLength(1);
    const row = toTable(store.kind(SLICES)!, s, {}, 'None', Date.now()) as { rows: Array<{ cells: unknown[] }> };
    expect(row.rows[0]!.cells.slice(1, 4)).toEqual(['IPv4', '<unset>', '<unset>']);
    await client.delete('services', 'default', 'web');
    await waitFor('slices gone', async () => (await slicesOf(client, 'web')).length === 0, 5_000);
    await waitFor('Endpoints gone', async () => (await client.list('endpoints', { namespace: 'default' })).items.length === 0, 5_000);
  });

  it('keeps the slices and Endpoints a user wrote for a Service without a selector', async () => {
    const { client, controller } = await setup();
    await client.create('services', 'default', service('ext', {}));
    await client.create(SLICES, 'default', { metadata: { name: 'ext-1', labels: { 'kubernetes.io/service-name': 'ext' } }, addressType: 'IPv4', endpoints: [{ addresses: ['192.0.2.7'] }], ports: [{ name: 'web', port: 9376 }] });
    await client.create('endpoints', 'default', { metadata: { name: 'ext' }, subsets: [{ addresses: [{ ip: '192.0.2.7' }], ports: [{ name: 'web', port: 9376 }] }] });
    await addPod(client, 'a', { ip: '10.88.0.2' });
    await new Promise((r) => setTimeout(r, 100));
    await controller.settled();
    const s = await slicesOf(client, 'ext');
    expect(s.map((x) => x.metadata.name)).toEqual(['ext-1']);
    expect(endpointsOf(s)).toEqual([{ addresses: ['192.0.2.7'], conditions: {} }]);
    expect((await client.get('endpoints', 'default', 'ext')).subsets).toEqual([{ addresses: [{ ip: '192.0.2.7' }], ports: [{ name: 'web', port: 9376, protocol: 'TCP' }] }]);
  });

  it('follows a pod becoming ready, and a Service changing its selector', async () => {
    const { client } = await setup();
    const a = await addPod(client, 'a', { ip: '10.88.0.2', ready: false });
    await addPod(client, 'b', { ip: '10.88.0.3', labels: { app: 'api' } });
    const svc = await client.create('services', 'default', service('web', { selector: { app: 'web' } }));
    await until(client, 'web', 1, (s) => (endpointsOf(s)[0]!.conditions as Obj).ready === false);
    await client.update('pods', 'default', 'a', { ...(await client.get('pods', 'default', 'a')), status: { ...(a.status as Obj), conditions: [{ type: 'Ready', status: 'True' }] } }, { status: true });
    await until(client, 'web', 1, (s) => (endpointsOf(s)[0]!.conditions as Obj).ready === true);
    await client.update('services', 'default', 'web', { ...svc, spec: { ...(svc.spec as Obj), selector: { app: 'api' } } });
    await until(client, 'web', 1, (s) => (endpointsOf(s)[0]!.addresses as string[])[0] === '10.88.0.3');
  });
});

describe('the kubernetes Service', () => {
  it('takes the service CIDR\'s first address, port 443 to the API, with its slice and Endpoints, and is put back when deleted', async () => {
    const store = new Store({ kinds: nodeKinds('node-a') });
    const client = localClient(store);
    const k = new KubernetesService({ client, serviceCidr: '10.96.0.0/12', endpoint: { ip: '192.0.2.10', port: 6443 }, apiPort: 6443, log: silentLogger, everyMs: 20 });
    try {
      await k.start();
      const svc = await client.get('services', 'default', 'kubernetes');
      expect(svc.spec).toMatchObject({ type: 'ClusterIP', clusterIP: '10.96.0.1', ports: [{ name: 'https', port: 443, protocol: 'TCP', targetPort: 6443 }] });
      expect((await client.get(SLICES, 'default', 'kubernetes')).endpoints).toEqual([{ addresses: ['192.0.2.10'], conditions: { ready: true } }]);
      expect((await client.get('endpoints', 'default', 'kubernetes')).subsets).toEqual([{ addresses: [{ ip: '192.0.2.10' }], ports: [{ name: 'https', port: 6443, protocol: 'TCP' }] }]);
      await client.delete('services', 'default', 'kubernetes');
      await waitFor('the Service back', () => client.get('services', 'default', 'kubernetes'), 2_000);
    } finally {
      k.stop();
      store.close();
    }
  });
});
