/**
 * Addresses several service ports claim. nftables' maps hold one verdict
 * per `address . protocol . port`, so two ports answering one (an external
 * IP that is another Service's cluster IP, two Services with one external
 * IP and port, a Service's external IP equal to its own cluster IP) would
 * make the kernel refuse every transaction that writes both. A cluster IP
 * always keeps its own; of external and load-balancer addresses claimed
 * twice, the port first by key keeps it, and the others are written
 * without that address (and say so). The rule depends only on what is
 * claimed now, so partial syncs and a fresh full sync agree.
 */
import type { ServicePortInfo } from './service.js';

interface Claim {
  port: string;
  /** 0: the port's cluster IP; 1: an external or load-balancer address. */
  rank: 0 | 1;
}

const addrKey = (ip: string, sp: ServicePortInfo) => `${ip} ${sp.protocol} ${sp.port}`;

export class AddressClaims {
  private readonly byAddr = new Map<string, Claim[]>();
  /** Each port's claimed address keys. */
  private readonly byPort = new Map<string, string[]>();

  clear(): void {
    this.byAddr.clear();
    this.byPort.clear();
  }

  /** Replaces a port's claims with those of `sp` (undefined: the port is gone), adding every address whose claims changed to `touched`. */
  set(portKey: string, sp: ServicePortInfo | undefined, touched?: Set<string>): void {
    for (const a of this.byPort.get(portKey) ?? []) {
      const list = this.byAddr.get(a)?.filter((c) => c.port !== portKey) ?? [];
      if (list.length) this.byAddr.set(a, list);
      else this.byAddr.delete(a);
      touched?.add(a);
    }
    this.byPort.delete(portKey);
    if (!sp?.clusterIP) return;
    const claims: Array<[string, 0 | 1]> = [[addrKey(sp.clusterIP, sp), 0]];
    for (const ip of new Set([...(sp.externalIPs ?? []), ...(sp.loadBalancerIPs ?? [])])) claims.push([addrKey(ip, sp), 1]);
    for (const [a, rank] of claims) {
      let list = this.byAddr.get(a);
      if (!list) this.byAddr.set(a, (list = []));
      list.push({ port: portKey, rank });
      touched?.add(a);
    }
    this.byPort.set(
      portKey,
      claims.map(([a]) => a),
    );
  }

  /** The ports claiming any of these addresses. */
  claimants(addrs: Iterable<string>): Set<string> {
    const out = new Set<string>();
    for (const a of addrs) for (const c of this.byAddr.get(a) ?? []) out.add(c.port);
    return out;
  }

  /**
   * The port as it may be written: without the external and load-balancer
   * addresses another claim keeps, and a sentence naming them (undefined:
   * none lost, and `sp` itself is answered).
   */
  effective(sp: ServicePortInfo): { sp: ServicePortInfo; conflict?: string } {
    const ext = sp.externalIPs ?? [];
    const lb = sp.loadBalancerIPs ?? [];
    if (!sp.clusterIP || (ext.length === 0 && lb.length === 0)) return { sp };
    const lost: string[] = [];
    const keeps = (ip: string) => {
      const w = this.winner(addrKey(ip, sp));
      if (w && w.port === sp.key && w.rank === 1) return true;
      lost.push(`${ip}:${sp.port}/${sp.protocol} (${w ? (w.rank === 0 ? `the cluster IP of ${w.port}` : `taken by ${w.port}`) : 'not claimed'})`);
      return false;
    };
    const externalIPs = ext.filter(keeps);
    const loadBalancerIPs = lb.filter((ip) => (ext.includes(ip) ? externalIPs.includes(ip) : keeps(ip)));
    if (lost.length === 0) return { sp };
    const out: ServicePortInfo = { ...sp, externalIPs: externalIPs.length ? externalIPs : undefined, loadBalancerIPs: loadBalancerIPs.length ? loadBalancerIPs : undefined };
    if (!out.externalIPs) delete out.externalIPs;
    if (!out.loadBalancerIPs) delete out.loadBalancerIPs;
    return { sp: out, conflict: `not answered on ${[...new Set(lost)].join(', ')}` };
  }

  private winner(a: string): Claim | undefined {
    let best: Claim | undefined;
    for (const c of this.byAddr.get(a) ?? []) if (!best || c.rank < best.rank || (c.rank === best.rank && c.port < best.port)) best = c;
    return best;
  }
}
