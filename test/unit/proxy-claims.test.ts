import { describe, expect, it } from 'vitest';
import { AddressClaims } from '../../src/proxy/claims.js';
import type { ServicePortInfo } from '../../src/proxy/service.js';

const port = (key: string, clusterIP: string, over: Partial<ServicePortInfo> = {}): ServicePortInfo => ({
  key,
  namespace: 'ns1',
  name: key.slice(4),
  portName: '',
  protocol: 'TCP',
  port: 80,
  targetPort: 8080,
  clusterIP,
  externalLocal: false,
  internalLocal: false,
  ...over,
});

describe('addresses claimed by several service ports', () => {
  it('a cluster IP keeps its own; of external addresses the first port by key keeps one; the rest are written without it', () => {
    const c = new AddressClaims();
    const a = port('ns1/a', '10.96.0.10', { externalIPs: ['192.0.2.7'] });
    const b = port('ns1/b', '10.96.0.11', { externalIPs: ['192.0.2.7', '10.96.0.10'], loadBalancerIPs: ['192.0.2.9'] });
    const self = port('ns1/s', '10.96.0.12', { externalIPs: ['10.96.0.12'] });
    for (const sp of [b, a, self]) c.set(sp.key, sp);
    expect(c.effective(a)).toEqual({ sp: a });
    const eb = c.effective(b);
    expect(eb.sp.externalIPs).toBeUndefined();
    expect(eb.sp.loadBalancerIPs).toEqual(['192.0.2.9']);
    expect(eb.conflict).toBe('not answered on 192.0.2.7:80/TCP (taken by ns1/a), 10.96.0.10:80/TCP (the cluster IP of ns1/a)');
    expect(c.effective(self).conflict).toBe('not answered on 10.96.0.12:80/TCP (the cluster IP of ns1/s)');
    // Another port number is another address.
    const other = port('ns1/c', '10.96.0.13', { port: 81, externalIPs: ['10.96.0.10'] });
    c.set(other.key, other);
    expect(c.effective(other)).toEqual({ sp: other });
  });

  it('a claim let go passes to the next claimant, and says which addresses changed hands', () => {
    const c = new AddressClaims();
    const a = port('ns1/a', '10.96.0.10', { externalIPs: ['192.0.2.7'] });
    const b = port('ns1/b', '10.96.0.11', { externalIPs: ['192.0.2.7'] });
    c.set(a.key, a);
    c.set(b.key, b);
    expect(c.effective(b).conflict).toBeDefined();
    const touched = new Set<string>();
    c.set(a.key, undefined, touched);
    expect([...c.claimants(touched)]).toEqual(['ns1/b']);
    expect(c.effective(b)).toEqual({ sp: b });
  });
});
