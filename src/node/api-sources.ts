/**
 * The proxy's and service DNS's sources read from the node's API, as
 * kube-proxy reads its informers: Services, EndpointSlices (the endpoints
 * the proxy programs, with each endpoint's node), and Pods (for DNS's pod
 * records and headless names). Each is a Informer over the ApiClient,
 * so the same code could follow a remote API server.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { ApiClient } from '../api/client.js';
import { SERVICE_NAME_LABEL } from '../api/kinds/endpoints.js';
import type { ApiObject } from '../api/types.js';
import type { Logger } from '../log.js';
import type { SliceLike } from '../proxy/endpoints.js';
import type { EndpointSliceSource, PodChange, PodSource, ServiceSource } from '../proxy/sources.js';
import { API_SOURCE_FILE, type StoredObject } from '../stored-object.js';
import { EndpointSliceController } from './endpoint-slices.js';
import { KubernetesService } from './kubernetes-service.js';
import { ServiceLB } from './service-lb.js';
import { Informer, type CacheChange } from './informer.js';

type Listener<T> = (arg: T) => void;

class Listeners<T = void> {
  private readonly set = new Set<Listener<T>>();
  add(l: Listener<T>): () => void {
    this.set.add(l);
    return () => this.set.delete(l);
  }
  emit(arg: T): void {
    for (const l of this.set) l(arg);
  }
}

export interface ApiProxySources {
  services: ServiceSource;
  pods: PodSource;
  slices: EndpointSliceSource;
  stop(): void;
}

/** A Service as the proxy's allocator reads one: its revision changes with every write, so an edit is parsed again. */
function asStored(o: ApiObject): StoredObject {
  return {
    apiVersion: o.apiVersion,
    kind: o.kind,
    namespace: o.metadata.namespace ?? 'default',
    name: o.metadata.name ?? '',
    uid: o.metadata.uid ?? '',
    revision: o.metadata.resourceVersion,
    object: o,
    source: { file: API_SOURCE_FILE, document: 0, line: 0 },
  };
}

/** Starts the three caches; resolves once each has its first list. */
export async function startApiProxySources(opts: { client: ApiClient; log: Logger }): Promise<ApiProxySources> {
  const serviceChanged = new Listeners();
  const podChanged = new Listeners<PodChange[] | undefined>();
  const sliceChanged = new Listeners<string[] | undefined>();
  // Converted once per object version: the proxier and DNS tell unchanged objects by identity.
  const stored = new WeakMap<ApiObject, StoredObject>();
  const services = new Informer(opts.client, 'services', () => serviceChanged.emit(), opts.log);
  // An empty change is the informer's relist: any pod may have changed.
  const pods = new Informer(opts.client, 'pods', (c) => podChanged.emit(c.before || c.after ? [c as PodChange] : undefined), opts.log);
  /** namespace/service → slice namespace/name → slice. */
  const byService = new Map<string, Map<string, SliceLike>>();
  const serviceOf = (o: ApiObject | undefined) => {
    const svc = o?.metadata.labels?.[SERVICE_NAME_LABEL];
    return o && svc ? `${o.metadata.namespace}/${svc}` : undefined;
  };
  const index = (c: CacheChange): string[] => {
    const touched: string[] = [];
    const before = serviceOf(c.before);
    if (before && c.before) {
      byService.get(before)?.delete(c.before.metadata.name!);
      if (byService.get(before)?.size === 0) byService.delete(before);
      touched.push(before);
    }
    const after = serviceOf(c.after);
    if (after && c.after) {
      let m = byService.get(after);
      if (!m) byService.set(after, (m = new Map()));
      m.set(c.after.metadata.name!, c.after as unknown as SliceLike);
      if (after !== before) touched.push(after);
    }
    return touched;
  };
  const slices: Informer = new Informer(
    opts.client,
    'endpointslices.discovery.k8s.io',
    (c) => {
      if (!c.before && !c.after) {
        byService.clear();
        for (const s of slices.list()) index({ after: s });
        sliceChanged.emit(undefined);
        return;
      }
      sliceChanged.emit(index(c));
    },
    opts.log,
  );
  const caches = [services, pods, slices];
  try {
    await Promise.all(caches.map((c) => c.start()));
  } catch (err) {
    for (const c of caches) c.stop();
    throw err;
  }
  return {
    services: {
      list: () =>
        services.list().map((o) => {
          let s = stored.get(o);
          if (!s) stored.set(o, (s = asStored(o)));
          return s;
        }),
      onChange: (l) => serviceChanged.add(l),
    },
    pods: {
      list: () => pods.list() as unknown as Pod[],
      onChange: (l) => podChanged.add(l),
      hasSynced: () => pods.hasSynced(),
    },
    slices: {
      slicesOf: (ns, name) => [...(byService.get(`${ns}/${name}`)?.values() ?? [])],
      onChange: (l) => sliceChanged.add(l),
      hasSynced: () => slices.hasSynced(),
    },
    stop: () => {
      for (const c of caches) c.stop();
    },
  };
}

export interface NodeServicesOptions {
  client: ApiClient;
  nodeName: string;
  serviceCidr: string;
  /** The API's address as served ("host:port"), and the node's IP for a wildcard host. */
  apiAddress: string;
  hostIP: string;
  log: Logger;
}

/** Where pods reach the API: its host, or the node's IP for a wildcard; none on loopback (pods cannot reach it there). */
export function apiEndpoint(address: string, hostIP: string): { ip: string; port: number } | undefined {
  const i = address.lastIndexOf(':');
  const host = address.slice(0, i).replace(/^\[|\]$/g, '');
  const port = Number(address.slice(i + 1));
  if (host === '0.0.0.0' || host === '' || host === '::') return hostIP ? { ip: hostIP, port } : undefined;
  if (host.startsWith('127.') || host === '::1' || host === 'localhost' || host.includes(':')) return undefined;
  return { ip: host, port };
}

/**
 * What a cluster's control plane and kube-proxy's informers give the
 * node's Services: the endpoint-slice and endpoints controllers, the
 * `kubernetes` Service, ServiceLB's addresses for LoadBalancers, and the
 * proxy's sources read from the API.
 */
export async function startNodeServices(o: NodeServicesOptions): Promise<{ sources: ApiProxySources; slices: { source: EndpointSliceSource; nodeName: string }; stop(): void }> {
  const controller = new EndpointSliceController({ client: o.client, log: o.log });
  const port = Number(o.apiAddress.slice(o.apiAddress.lastIndexOf(':') + 1));
  const kubernetes = new KubernetesService({ client: o.client, serviceCidr: o.serviceCidr, endpoint: apiEndpoint(o.apiAddress, o.hostIP), apiPort: port, log: o.log });
  // Without a node address there is nothing to give a load balancer: its Services stay <pending>, as on a cluster without a cloud.
  const serviceLB = o.hostIP ? new ServiceLB({ client: o.client, nodeIP: o.hostIP, log: o.log }) : undefined;
  await kubernetes.start();
  await controller.start();
  const sources = await (async () => {
    await serviceLB?.start();
    return startApiProxySources({ client: o.client, log: o.log });
  })().catch((err) => {
    serviceLB?.stop();
    controller.stop();
    kubernetes.stop();
    throw err;
  });
  return {
    sources,
    slices: { source: sources.slices, nodeName: o.nodeName },
    stop: () => {
      sources.stop();
      serviceLB?.stop();
      controller.stop();
      kubernetes.stop();
    },
  };
}
