/**
 * What k3s's ServiceLB gives a node without a cloud: every LoadBalancer
 * Service that names no loadBalancerClass (a class means another controller
 * owns it) gets the node's InternalIP as its `status.loadBalancer.ingress`,
 * written through the status subresource, and the proxy then answers the
 * service port on that address as kube-proxy answers a load balancer's IP.
 * A Service that stops being such a LoadBalancer has the address taken back.
 * Level-triggered: each pass compares every Service's status with what it
 * should be, so a missed event or a restart changes nothing.
 */
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { Informer, keyOf } from './informer.js';

export interface ServiceLBOptions {
  client: ApiClient;
  /** The node's InternalIP: the load balancers' address. */
  nodeIP: string;
  log: Logger;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The ingress the Service should have from us; undefined: none of our business (another class). */
export function wantedIngress(svc: ApiObject, nodeIP: string): Obj[] | undefined {
  const spec = isObj(svc.spec) ? svc.spec : {};
  if (spec.type === 'LoadBalancer') return spec.loadBalancerClass ? undefined : [{ ip: nodeIP, ipMode: 'VIP' }];
  return [];
}

const isLB = (s: ApiObject | undefined) => isObj(s?.spec) && s.spec.type === 'LoadBalancer';

/** A LoadBalancer's service ports as protocol/port. */
function lbPorts(svc: ApiObject): Set<string> {
  const spec = isObj(svc.spec) ? svc.spec : {};
  const ports = Array.isArray(spec.ports) ? spec.ports : [];
  return new Set(ports.filter(isObj).map((p) => `${typeof p.protocol === 'string' ? p.protocol : 'TCP'}/${String(p.port)}`));
}

export class ServiceLB {
  private readonly informer: Informer;
  private pending = new Set<string>();
  private running = false;
  private stopped = false;

  constructor(private readonly o: ServiceLBOptions) {
    this.informer = new Informer(o.client, 'services', (c) => {
      if (!c.before && !c.after) for (const s of this.informer.list()) this.pending.add(keyOf(s));
      else if (c.after) this.pending.add(keyOf(c.after));
      // A LoadBalancer's ports changed or gone: one waiting for them may have them now.
      if (isLB(c.before) || isLB(c.after)) for (const s of this.informer.list()) if (isLB(s)) this.pending.add(keyOf(s));
      void this.run();
    }, o.log);
  }

  async start(): Promise<void> {
    await this.informer.start();
  }

  stop(): void {
    this.stopped = true;
    this.informer.stop();
  }

  /** Settles when no pass is running or due (for tests). */
  async idle(): Promise<void> {
    while (this.running || this.pending.size > 0) await new Promise((r) => setTimeout(r, 20));
  }

  private async run(): Promise<void> {
    if (this.running || this.stopped) return;
    this.running = true;
    try {
      while (this.pending.size > 0 && !this.stopped) {
        const keys = [...this.pending];
        this.pending.clear();
        for (const k of keys) await this.syncOne(k);
      }
    } finally {
      this.running = false;
    }
  }

  /** Services pending for a port another has (namespace/name → the other), said once. */
  private readonly blocked = new Map<string, string>();

  /** Whether the Service's status holds the address we give. */
  private hasOurs(svc: ApiObject): boolean {
    const status = isObj(svc.status) ? svc.status : {};
    const lb = isObj(status.loadBalancer) ? status.loadBalancer : {};
    const have = Array.isArray(lb.ingress) ? lb.ingress : [];
    return JSON.stringify(have) === JSON.stringify(wantedIngress({ ...svc, spec: { type: 'LoadBalancer' } }, this.o.nodeIP));
  }

  /**
   * Another of our LoadBalancers that keeps a port this one wants: one that
   * holds the address when this one does not, else the older (then the
   * first by namespace/name).
   */
  private portHolder(svc: ApiObject): string | undefined {
    const mine = lbPorts(svc);
    const rank = (s: ApiObject) => [this.hasOurs(s) ? 0 : 1, String(s.metadata.creationTimestamp ?? ''), keyOf(s)] as const;
    const me = rank(svc);
    for (const other of this.informer.list()) {
      if (keyOf(other) === keyOf(svc) || !wantedIngress(other, this.o.nodeIP)?.length) continue;
      if (![...lbPorts(other)].some((p) => mine.has(p))) continue;
      const them = rank(other);
      if (them[0] < me[0] || (them[0] === me[0] && (them[1] < me[1] || (them[1] === me[1] && them[2] < me[2])))) return keyOf(other);
    }
    return undefined;
  }

  private async syncOne(key: string): Promise<void> {
    const [ns, name] = key.split('/') as [string, string];
    const svc = this.informer.get(ns, name);
    if (!svc) return;
    let want = wantedIngress(svc, this.o.nodeIP);
    if (!want) return;
    const status = isObj(svc.status) ? svc.status : {};
    const lb = isObj(status.loadBalancer) ? status.loadBalancer : {};
    const have = Array.isArray(lb.ingress) ? lb.ingress : [];
    // One node address answers one Service per port, as k3s's ServiceLB (whose pods hold the ports): a later
    // Service wanting a port another already has stays pending until that one lets it go.
    const blocker = want.length ? this.portHolder(svc) : undefined;
    if (blocker) {
      if (this.blocked.get(key) !== blocker) this.o.log.info('LoadBalancer Service pending: its port is taken on the node address', { service: key, by: blocker });
      this.blocked.set(key, blocker);
      want = [];
    } else this.blocked.delete(key);
    // Another Service's address is taken back only when it is the one we give (someone else's stays).
    if (want.length === 0 && !this.hasOurs(svc)) return;
    if (JSON.stringify(have) === JSON.stringify(want)) return;
    try {
      const wrote = await this.o.client.update('services', ns, name, { ...svc, status: { ...status, loadBalancer: want.length ? { ingress: want } : {} } }, { status: true });
      this.informer.wrote(wrote);
    } catch (err) {
      if (err instanceof ApiError && err.reason === 'NotFound') return;
      // A Conflict means a newer version is on its way through the watch, which queues it again.
      if (!(err instanceof ApiError && err.reason === 'Conflict')) this.o.log.warn('could not write a LoadBalancer Service\'s address', { service: key, error: errorMessage(err) });
    }
  }
}
