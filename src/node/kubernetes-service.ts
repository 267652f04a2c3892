/**
 * The `default/kubernetes` Service, as kube-apiserver keeps it: the service
 * CIDR's first address, port 443 (named https) to the API's own port, with
 * the Endpoints and EndpointSlice (both named kubernetes) that point at the
 * address the API is reached on. Put back every `everyMs` if removed or
 * changed, as the API server's reconciler does.
 */
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { SERVICE_NAME_LABEL } from '../api/kinds/endpoints.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { intToIp, parseCidr } from '../proxy/service.js';

export interface KubernetesServiceOptions {
  client: ApiClient;
  /** The service CIDR: the Service takes its first address. */
  serviceCidr: string;
  /** Where pods reach the API (undefined: the Service has no endpoints, e.g. an API on loopback only). */
  endpoint?: { ip: string; port: number };
  /** The API's port, the Service's targetPort. */
  apiPort: number;
  log: Logger;
  everyMs?: number;
}

const NS = 'default';
const NAME = 'kubernetes';

/** The first address of an IPv4 CIDR ("10.96.0.0/12" → "10.96.0.1"). */
export function firstServiceIP(cidr: string): string {
  const c = parseCidr(cidr);
  if (!c) throw new Error(`service CIDR "${cidr}" is not an IPv4 CIDR`);
  return intToIp(c.base + 1);
}

export class KubernetesService {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(private readonly o: KubernetesServiceOptions) {}

  /** Ensures the objects now, then every `everyMs` (default 10 s). */
  async start(): Promise<void> {
    // Not fatal: an address another Service holds is reported, and tried again on the next tick.
    await this.ensure().catch((err) => this.o.log.warn('could not write the kubernetes Service', { error: errorMessage(err) }));
    const tick = () => {
      this.timer = setTimeout(() => {
        void this.ensure()
          .catch((err) => this.o.log.warn('could not keep the kubernetes Service', { error: errorMessage(err) }))
          .finally(() => !this.stopped && tick());
      }, this.o.everyMs ?? 10_000);
      this.timer.unref();
    };
    tick();
  }

  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  async ensure(): Promise<void> {
    const ip = firstServiceIP(this.o.serviceCidr);
    const ports = [{ name: 'https', port: 443, protocol: 'TCP', targetPort: this.o.apiPort }];
    await this.put('services', { apiVersion: 'v1', kind: 'Service', metadata: { name: NAME, namespace: NS, labels: { component: 'apiserver', provider: 'kubernetes' } }, spec: { type: 'ClusterIP', clusterIP: ip, clusterIPs: [ip], sessionAffinity: 'None', ports } }, (cur) => {
      const spec = (cur.spec ?? {}) as Obj;
      return spec.clusterIP === ip && JSON.stringify((spec.ports as Obj[] | undefined)?.map((p) => [p.name, p.port, p.protocol, p.targetPort])) === JSON.stringify(ports.map((p) => [p.name, p.port, p.protocol, p.targetPort]));
    });
    const ep = this.o.endpoint;
    const epPorts = ep ? [{ name: 'https', port: ep.port, protocol: 'TCP' }] : [];
    const subsets = ep ? [{ addresses: [{ ip: ep.ip }], ports: epPorts }] : [];
    // The endpoint-slice mirroring controller is told to leave it alone, as the API server tells it.
    await this.put('endpoints', { apiVersion: 'v1', kind: 'Endpoints', metadata: { name: NAME, namespace: NS, labels: { 'endpointslice.kubernetes.io/skip-mirror': 'true' } }, subsets }, (cur) => JSON.stringify(cur.subsets ?? []) === JSON.stringify(subsets));
    const endpoints = ep ? [{ addresses: [ep.ip], conditions: { ready: true } }] : [];
    await this.put(
      'endpointslices.discovery.k8s.io',
      { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: NAME, namespace: NS, labels: { [SERVICE_NAME_LABEL]: NAME } }, addressType: 'IPv4', endpoints, ports: epPorts },
      (cur) => JSON.stringify([cur.endpoints ?? [], cur.ports ?? []]) === JSON.stringify([endpoints, epPorts]),
    );
  }

  /** Creates the object, or rewrites it when `same` says the stored one differs. */
  private async put(resource: string, want: Obj & { metadata: Obj }, same: (cur: ApiObject) => boolean): Promise<void> {
    let cur: ApiObject | undefined;
    try {
      cur = await this.o.client.get(resource, NS, NAME);
    } catch (err) {
      if (!(err instanceof ApiError && err.reason === 'NotFound')) throw err;
    }
    if (!cur) {
      await this.o.client.create(resource, NS, want).catch((err) => {
        if (!(err instanceof ApiError && err.reason === 'AlreadyExists')) throw err;
      });
      return;
    }
    if (same(cur)) return;
    const { metadata: _m, ...body } = want;
    await this.o.client.update(resource, NS, NAME, { ...cur, ...body, metadata: { ...cur.metadata, labels: { ...(cur.metadata.labels ?? {}), ...(want.metadata.labels as Obj) } } });
  }
}
