/**
 * ServiceLB's choice of which LoadBalancer Services get the node address
 * when they want the same ports, driven through its informer's change
 * callback with a client that takes every status write.
 */
import { describe, expect, it } from 'vitest';
import type { ApiClient } from '../../src/api/client.js';
import type { ApiObject } from '../../src/api/types.js';
import { silentLogger } from '../../src/log.js';
import type { CacheChange } from '../../src/node/informer.js';
import { ServiceLB } from '../../src/node/service-lb.js';

const NODE_IP = '192.0.2.10';

function harness() {
  let rv = 1;
  const client = {
    update: async (_r: string, _ns: string, _n: string, obj: ApiObject) => ({ ...obj, metadata: { ...obj.metadata, resourceVersion: String(++rv) } }),
  } as unknown as ApiClient;
  const lb = new ServiceLB({ client, nodeIP: NODE_IP, log: silentLogger });
  // The informer is not started: objects go into its copy as a watch would put them, and its callback is called.
  const inf = (lb as unknown as { informer: { items: Map<string, ApiObject>; onChange: (c: CacheChange) => void } }).informer;
  const put = async (name: string, ports: number[], created: string) => {
    const before = inf.items.get(`default/${name}`);
    const after = {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { namespace: 'default', name, creationTimestamp: created, resourceVersion: String(++rv) },
      spec: { type: 'LoadBalancer', ports: ports.map((port) => ({ port, protocol: 'TCP' })) },
      status: before?.status ?? {},
    } as ApiObject;
    inf.items.set(`default/${name}`, after);
    inf.onChange({ before, after });
    await lb.idle();
  };
  const address = (name: string) => ((inf.items.get(`default/${name}`)?.status as { loadBalancer?: { ingress?: Array<{ ip: string }> } }).loadBalancer?.ingress ?? [])[0]?.ip ?? 'pending';
  return { lb, put, address };
}

describe('ServiceLB ports on the node address', () => {
  it('a Service pending for one port blocks no other on its other ports', async () => {
    const { lb, put, address } = harness();
    await put('a', [80], '2026-01-01T00:00:00Z');
    await put('b', [80, 443], '2026-01-02T00:00:00Z');
    await put('c', [443], '2026-01-03T00:00:00Z');
    // b waits for 80 (a has it) and so holds nothing: 443 is free for c.
    expect([address('a'), address('b'), address('c')]).toEqual([NODE_IP, 'pending', NODE_IP]);
    lb.stop();
  });

  it('a holder that adds a port another holds goes pending, older or not, and gets the address back when it drops the port', async () => {
    const { lb, put, address } = harness();
    await put('a', [80], '2026-01-01T00:00:00Z');
    await put('d', [8080], '2025-01-01T00:00:00Z');
    expect([address('a'), address('d')]).toEqual([NODE_IP, NODE_IP]);
    await put('d', [8080, 80], '2025-01-01T00:00:00Z');
    expect([address('a'), address('d')]).toEqual([NODE_IP, 'pending']);
    await put('d', [8080], '2025-01-01T00:00:00Z');
    expect([address('a'), address('d')]).toEqual([NODE_IP, NODE_IP]);
    lb.stop();
  });
});
