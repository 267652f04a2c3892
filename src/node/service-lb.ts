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

  /** The ports each Service was last given the address with (protocol/port): a port added since is not yet its own. */
  private readonly held = new Map<string, Set<string>>();

  /**
   * Whether the Service keeps what it has: it holds the address, and held
   * every port it has now when it was given it (first seen holding, as after
   * a restart: the ports it has).
   */
  private keeps(s: ApiObject): boolean {
    if (!this.hasOurs(s)) return false;
    const k = keyOf(s);
    let h = this.held.get(k);
    if (!h) this.held.set(k, (h = lbPorts(s)));
    for (const p of lbPorts(s)) if (!h.has(p)) return false;
    return true;
  }

  /**
   * Another of our LoadBalancers given a port this one wants. Services are
   * given the address in turn: those that keep theirs (see keeps) first,
   * then the older, then by namespace/name; each one whose ports none before
   * it was given. So a Service pending for one port blocks no one on its
   * others, and a holder that adds a port another holds goes pending rather
   * than take it.
   */
  private portHolder(svc: ApiObject): string | undefined {
    const rank = (s: ApiObject) => [this.keeps(s) ? 0 : 1, String(s.metadata.creationTimestamp ?? ''), keyOf(s)] as const;
    const all = this.informer
      .list()
      .filter((s) => keyOf(s) === keyOf(svc) || wantedIngress(s, this.o.nodeIP)?.length)
      .map((s) => ({ key: keyOf(s), rank: rank(s), ports: lbPorts(s) }));
    all.sort((a, b) => (a.rank[0] - b.rank[0]) || (a.rank[1] < b.rank[1] ? -1 : a.rank[1] > b.rank[1] ? 1 : a.rank[2] < b.rank[2] ? -1 : a.rank[2] > b.rank[2] ? 1 : 0));
    const given = new Map<string, string>(); // protocol/port → the Service given it
    for (const c of all) {
      let by: string | undefined;
      for (const p of c.ports) by ??= given.get(p);
      if (c.key === keyOf(svc)) return by;
      if (!by) for (const p of c.ports) given.set(p, c.key);
    }
    return undefined;
  }

  private async syncOne(key: string): Promise<void> {
    const [ns, name] = key.split('/') as [string, string];
    const svc = this.informer.get(ns, name);
    if (!svc) {
      this.held.delete(key);
      return;
    }
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
      this.held.delete(key);
      want = [];
    } else {
      this.blocked.delete(key);
      if (want.length) this.held.set(key, lbPorts(svc));
      else this.held.delete(key);
    }
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
