import type { Pod, Service } from 'kubernetes-types/core/v1.js';
import { describe, expect, it, vi } from 'vitest';
import { computeEndpoints } from '../../src/proxy/endpoints.js';
import { Allocator } from '../../src/proxy/service.js';
import type { StoredObject } from '../../src/stored-object.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

function endpointsOf(spec: Parameters<typeof serviceObject>[2], pods: Pod[], ns = 'default') {
  const { services, problems } = new Allocator('10.96.0.0/12').resolve([serviceObject(ns, 'svc', spec)]);
  expect(problems).toEqual([]);
  const map = computeEndpoints(services, pods);
  return Object.fromEntries([...map].map(([k, v]) => [k, v.map((e) => `${e.ip}:${e.port}`)]));
}

const terminating = (p: Pod): Pod => ({ ...p, metadata: { ...p.metadata, deletionTimestamp: '2026-12-01T00:00:00Z' } });

describe('endpoints from pods', () => {
  const named = [{ name: 'web', containerPort: 8080 }];
  const cases: Array<{ name: string; spec: Parameters<typeof serviceObject>[2]; pods: Pod[]; want: Record<string, string[]> }> = [
    {
      name: 'ready pods matching the selector serve, sorted by address',
      spec: { selector: { app: 'web' }, ports: [{ port: 80, targetPort: 8080 }] },
      pods: [pod('b', { ip: '10.88.0.10' }), pod('a', { ip: '10.88.0.9' })],
      want: { 'default/svc': ['10.88.0.9:8080', '10.88.0.10:8080'] },
    },
    {
      name: 'not-ready pods are dropped',
      spec: { selector: { app: 'web' }, ports: [{ port: 80 }] },
      pods: [pod('a', { ip: '10.88.0.2', ready: false }), pod('b', { ip: '10.88.0.3' })],
      want: { 'default/svc': ['10.88.0.3:80'] },
    },
    {
      name: 'publishNotReadyAddresses keeps not-ready pods',
      spec: { selector: { app: 'web' }, publishNotReadyAddresses: true, ports: [{ port: 80 }] },
      pods: [pod('a', { ip: '10.88.0.2', ready: false })],
      want: { 'default/svc': ['10.88.0.2:80'] },
    },
    {
      name: 'other namespaces, other labels, finished pods and pods without an IP do not serve',
      spec: { selector: { app: 'web' }, ports: [{ port: 80 }] },
      pods: [
        pod('a', { ip: '10.88.0.2', ns: 'other' }),
        pod('b', { ip: '10.88.0.3', labels: { app: 'api' } }),
        pod('c', { ip: '10.88.0.4', phase: 'Succeeded' }),
        pod('d', {}),
      ],
      want: { 'default/svc': [] },
    },
    {
      name: 'a named targetPort is resolved per pod; a pod without that port is not an endpoint for it',
      spec: {
        selector: { app: 'web' },
        ports: [
          { name: 'http', port: 80, targetPort: 'web' },
          { name: 'metrics', port: 9090 },
        ],
      },
      pods: [pod('a', { ip: '10.88.0.2', ports: named }), pod('b', { ip: '10.88.0.3', ports: [{ name: 'web', containerPort: 9000 }] }), pod('c', { ip: '10.88.0.4' })],
      want: { 'default/svc:http': ['10.88.0.2:8080', '10.88.0.3:9000'], 'default/svc:metrics': ['10.88.0.2:9090', '10.88.0.3:9090', '10.88.0.4:9090'] },
    },
    {
      name: 'a named port must match the protocol',
      spec: { selector: { app: 'web' }, ports: [{ port: 53, protocol: 'UDP', targetPort: 'web' }] },
      pods: [pod('a', { ip: '10.88.0.2', ports: named })],
      want: { 'default/svc': [] },
    },
    {
      name: 'hostNetwork pods serve on the host IP',
      spec: { selector: { app: 'web' }, ports: [{ port: 80 }] },
      pods: [pod('a', { hostNetwork: true, hostIP: '192.168.1.10', ip: '192.168.1.10' })],
      want: { 'default/svc': ['192.168.1.10:80'] },
    },
    {
      name: 'a pod being deleted is not used while a ready one serves',
      spec: { selector: { app: 'web' }, ports: [{ port: 80 }] },
      pods: [terminating(pod('old', { ip: '10.88.0.2' })), pod('new', { ip: '10.88.0.3' })],
      want: { 'default/svc': ['10.88.0.3:80'] },
    },
    {
      name: 'with no ready endpoint, pods being deleted that are still Ready serve (a rolling update of one replica)',
      spec: { selector: { app: 'web' }, ports: [{ port: 80 }] },
      pods: [terminating(pod('old', { ip: '10.88.0.2' })), pod('new', { ip: '10.88.0.3', ready: false }), terminating(pod('gone', { ip: '10.88.0.4', ready: false }))],
      want: { 'default/svc': ['10.88.0.2:80'] },
    },
    {
      name: 'the fallback is per port: a port that has ready endpoints does not use terminating ones',
      spec: { selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 'web' }, { name: 'metrics', port: 9090 }] },
      pods: [terminating(pod('old', { ip: '10.88.0.2', ports: named })), pod('new', { ip: '10.88.0.3' })],
      want: { 'default/svc:http': ['10.88.0.2:8080'], 'default/svc:metrics': ['10.88.0.3:9090'] },
    },
    {
      name: 'publishNotReadyAddresses counts pods being deleted as ready, as the EndpointSlice controller does',
      spec: { selector: { app: 'web' }, publishNotReadyAddresses: true, ports: [{ port: 80 }] },
      pods: [terminating(pod('old', { ip: '10.88.0.2', ready: false })), pod('new', { ip: '10.88.0.3' })],
      want: { 'default/svc': ['10.88.0.2:80', '10.88.0.3:80'] },
    },
    {
      name: 'a Service without a selector has no endpoints',
      spec: { ports: [{ port: 80 }] },
      pods: [pod('a', { ip: '10.88.0.2' })],
      want: { 'default/svc': [] },
    },
  ];
  for (const c of cases) it(c.name, () => expect(endpointsOf(c.spec, c.pods)).toEqual(c.want));
});

describe('cluster IP and node port allocation', () => {
  it('is stable across syncs, honours the spec and keeps addresses of existing Services', () => {
    const alloc = new Allocator('10.96.0.0/12');
    const a = serviceObject('default', 'a', { ports: [{ port: 80 }] });
    const b = serviceObject('default', 'b', { clusterIP: '10.96.5.5', type: 'NodePort', ports: [{ port: 80, nodePort: 30500 }] });
    const c = serviceObject('default', 'c', { type: 'NodePort', ports: [{ name: 'x', port: 80 }, { name: 'y', port: 81 }] });
    const first = alloc.resolve([a, b, c]);
    expect(first.problems).toEqual([]);
    const ipOf = (r: typeof first, n: string) => r.services.find((s) => s.name === n)!;
    expect(ipOf(first, 'b').clusterIP).toBe('10.96.5.5');
    expect(ipOf(first, 'b').ports[0]!.nodePort).toBe(30500);
    const cPorts = ipOf(first, 'c').ports.map((p) => p.nodePort!);
    for (const np of cPorts) expect(np).toBeGreaterThanOrEqual(30000);
    expect(new Set(cPorts).size).toBe(2);
    const second = alloc.resolve([c, b, a]);
    for (const n of ['a', 'b', 'c']) expect(ipOf(second, n)).toEqual(ipOf(first, n));
    // A fresh allocator (a restarted proxy) picks the same addresses for Services not pinned in the spec.
    const again = new Allocator('10.96.0.0/12').resolve([a, b, c]);
    expect(ipOf(again, 'a').clusterIP).toBe(ipOf(first, 'a').clusterIP);
    // A deleted Service frees its address and node port.
    alloc.resolve([a, c]);
    const d = serviceObject('default', 'd', { clusterIP: '10.96.5.5', type: 'NodePort', ports: [{ port: 80, nodePort: 30500 }] });
    expect(alloc.resolve([a, c, d]).problems).toEqual([]);
  });

  it('answers a few changed Services on their own as a whole pass over all of them would (random edits, conflicts and a full CIDR)', () => {
    // The same edits to two allocators, one resolving changes on their own, one always a whole pass.
    // mulberry32: a small PRNG whose low bits are as good as its high ones.
    let seed = 7;
    const rand = (n: number) => {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return Math.floor((((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * n);
    };
    const specOf = (): Service['spec'] => {
      const type = (['ClusterIP', 'ClusterIP', 'NodePort', 'LoadBalancer', 'ExternalName'] as const)[rand(5)];
      if (type === 'ExternalName') return { type, externalName: 'example.test' };
      const spec: Service['spec'] = { type, ports: [{ name: 'a', port: 80 }] };
      if (rand(3) === 0) spec.ports!.push({ name: 'b', port: 81, protocol: 'UDP' });
      // A few addresses and node ports asked for by several Services, so some collide.
      if (rand(4) === 0) spec.clusterIP = rand(5) === 0 ? 'None' : `10.96.0.${2 + rand(4)}`;
      if (type !== 'ClusterIP' && rand(3) === 0) spec.ports![0]!.nodePort = 30000 + rand(4);
      if (type === 'LoadBalancer' && rand(2) === 0) {
        spec.externalTrafficPolicy = 'Local';
        if (rand(2) === 0) spec.healthCheckNodePort = 30000 + rand(6);
      }
      if (rand(8) === 0) spec.ports![0]!.name = 'Bad_Name';
      return spec;
    };
    const some = new Allocator('10.96.0.0/27');
    const whole = new Allocator('10.96.0.0/27', { incrementalMax: 0 });
    const live = new Map<string, StoredObject>();
    let prev = new Map<string, StoredObject>();
    const seen = new Set<string>();
    const shortcut = vi.spyOn(some as unknown as { resolveSome: () => unknown }, 'resolveSome');
    for (let step = 0; step < 400; step++) {
      for (let k = 1 + rand(3); k > 0; k--) {
        const name = `s${rand(20)}`;
        if (live.has(name) && rand(3) === 0) live.delete(name);
        else live.set(name, serviceObject('default', name, specOf()));
      }
      const objects = [...live.values()];
      const a = some.resolve(objects);
      const b = whole.resolve(objects);
      expect(JSON.stringify([a.services, a.problems]), `step ${step}`).toBe(JSON.stringify([b.services, b.problems]));
      // What it says changed is what did.
      if (a.changed) expect(new Set(a.changed)).toEqual(new Set([...live.keys(), ...seen].filter((n) => prev.get(n)?.uid !== live.get(n)?.uid).map((n) => `default/${n}`)));
      prev = new Map(live);
      for (const n of live.keys()) seen.add(n);
    }
    // Most steps start from an answer without allocation problems, so the shortcut was taken.
    expect(shortcut.mock.calls.length).toBeGreaterThan(100);
  });

  it('reports bad Services against themselves (of two new ones asking for one node port, the first by name gets it)', () => {
    const alloc = new Allocator('10.96.0.0/24');
    const r = alloc.resolve([
      serviceObject('default', 'a-first', { type: 'NodePort', ports: [{ port: 80, nodePort: 30001 }] }),
      serviceObject('default', 'np-taken', { type: 'NodePort', ports: [{ port: 80, nodePort: 30001 }] }),
      serviceObject('default', 'np-range', { type: 'NodePort', ports: [{ port: 80, nodePort: 29999 }] }),
      serviceObject('default', 'ip-out', { clusterIP: '10.97.0.1', ports: [{ port: 80 }] }),
      serviceObject('default', 'np-cip', { ports: [{ port: 80, nodePort: 30002 }] }),
      serviceObject('default', 'front_end', { ports: [{ port: 80 }] }),
      serviceObject('default', 'noname', { ports: [{ port: 80 }, { port: 81 }] }),
      serviceObject('default', 'badproto', { ports: [{ port: 80, protocol: 'ICMP' as 'TCP' }] }),
      serviceObject('default', 'headless', { clusterIP: 'None', selector: { app: 'x' }, ports: [{ port: 80 }] }),
    ]);
    expect(r.services.map((s) => s.name)).toEqual(['a-first', 'headless']);
    expect(r.services[1]!.headless).toBe(true);
    expect(r.services[1]!.clusterIP).toBeUndefined();
    expect(r.problems.map((p) => `${p.service}: ${p.reason}`)).toEqual([
      'default/badproto: spec.ports[0].protocol: Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"',
      `default/front_end: metadata.name: Invalid value: "front_end": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')`,
      'default/ip-out: clusterIP 10.97.0.1 is not in the service CIDR 10.96.0.0/24',
      'default/noname: spec.ports[0].name: Required value; spec.ports[1].name: Required value',
      "default/np-cip: spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'",
      'default/np-range: port 80: nodePort 29999 is not in 30000-32767',
      'default/np-taken: port 80: nodePort 30001/TCP is already taken by default/a-first',
    ]);
  });
});
