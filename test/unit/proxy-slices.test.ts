/**
 * The proxy reading endpoints from EndpointSlices, as kube-proxy does:
 * ports matched by name and protocol, conditions (unset = ready), this
 * node's endpoints by nodeName, serving-terminating endpoints only when no
 * ready one is left (for the cluster, and separately for this node under
 * the Local policies), DROP for Local with no local endpoint; the proxier
 * following a slice source; an API Service edited in place parsed again.
 */
import { Resolver } from 'node:dns/promises';
import { afterEach, describe, expect, it } from 'vitest';
import { DnsServer } from '../../src/proxy/dns.js';
import { endpointsFromSlices, type Endpoint, type SliceLike } from '../../src/proxy/endpoints.js';
import type { CommandRunner } from '../../src/proxy/iptables.js';
import { Proxier } from '../../src/proxy/proxier.js';
import { assemble, categorizeEndpoints, renderPort } from '../../src/proxy/rules.js';
import { Allocator, type ServiceInfo, type ServicePortInfo } from '../../src/proxy/service.js';
import { MemoryPodSource, MemoryServiceSource, type EndpointSliceSource } from '../../src/proxy/sources.js';
import { silentLogger } from '../../src/log.js';
import { serviceObject } from '../helpers/proxy-fixtures.js';

const NODE = 'node-a';

function svcInfo(spec: Parameters<typeof serviceObject>[2]): ServiceInfo {
  const { services, problems } = new Allocator('10.96.0.0/12').resolve([serviceObject('ns1', 'web', spec)]);
  expect(problems).toEqual([]);
  return services[0]!;
}

type Ep = { ip: string; node?: string; ready?: boolean; serving?: boolean; terminating?: boolean };
function slice(ports: SliceLike['ports'], eps: Ep[], addressType = 'IPv4'): SliceLike {
  return {
    addressType,
    metadata: { name: 'web-x', namespace: 'ns1' },
    ports,
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      conditions: { ...(e.ready !== undefined ? { ready: e.ready } : {}), ...(e.serving !== undefined ? { serving: e.serving } : {}), ...(e.terminating !== undefined ? { terminating: e.terminating } : {}) },
      ...(e.node ? { nodeName: e.node } : {}),
      targetRef: { kind: 'Pod', namespace: 'ns1', name: `p-${e.ip}` },
    })),
  };
}

const show = (eps: Endpoint[]) => eps.map((e) => `${e.ip}:${e.port}${e.local ? ' local' : ''}${e.terminating ? ' terminating' : ''}`);

describe('endpoints from EndpointSlices', () => {
  it('matches ports by name and protocol, reads conditions as kube-proxy, tells local endpoints by nodeName', () => {
    const svc = svcInfo({ selector: { app: 'web' }, ports: [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' }] });
    const got = endpointsFromSlices(
      svc,
      [
        slice([{ name: 'http', port: 8080, protocol: 'TCP' }, { name: 'dns', port: 5353, protocol: 'TCP' }], [
          { ip: '10.88.0.3', node: NODE },
          { ip: '10.88.0.2', node: 'node-b', ready: true },
          { ip: '10.88.0.4', ready: false, serving: false },
          { ip: '10.88.0.5', node: NODE, ready: false, serving: true, terminating: true },
          { ip: '10.88.0.6', ready: false, serving: true },
        ]),
        slice([{ name: 'http', port: 8080, protocol: 'TCP' }], [{ ip: '10.88.0.3', node: NODE }]),
        slice([{ name: 'http', port: 8080, protocol: 'TCP' }], [{ ip: 'fd00::1' }], 'IPv6'),
      ],
      NODE,
    );
    expect(Object.fromEntries([...got].map(([k, v]) => [k, show(v)]))).toEqual({
      'ns1/web:http': ['10.88.0.2:8080', '10.88.0.3:8080 local', '10.88.0.5:8080 local terminating'],
      // The slice's dns port is TCP: no endpoint for the UDP service port.
      'ns1/web:dns': [],
    });
  });
});

describe('which endpoints serve (kube-proxy\'s CategorizeEndpoints)', () => {
  const ep = (ip: string, local: boolean, terminating = false): Endpoint => ({ ip, port: 8080, pod: `ns1/${ip}`, local, ...(terminating ? { terminating } : {}) });
  it('the cluster uses ready endpoints, or serving-terminating ones when none is ready; this node likewise its own', () => {
    const c = categorizeEndpoints([ep('10.88.0.2', false), ep('10.88.0.3', true, true)]);
    expect(c.cluster.map((e) => e.ip)).toEqual(['10.88.0.2']);
    expect(c.local.map((e) => e.ip)).toEqual(['10.88.0.3']);
    const t = categorizeEndpoints([ep('10.88.0.2', false, true), ep('10.88.0.3', true, true)]);
    expect(t.cluster.map((e) => e.ip)).toEqual(['10.88.0.2', '10.88.0.3']);
    const r = categorizeEndpoints([ep('10.88.0.2', true), ep('10.88.0.3', true, true)]);
    expect(r.local.map((e) => e.ip)).toEqual(['10.88.0.2']);
  });

  const port = (over: Partial<ServicePortInfo>): ServicePortInfo => ({ key: 'ns1/web:http', namespace: 'ns1', name: 'web', portName: 'http', protocol: 'TCP', port: 80, targetPort: 8080, clusterIP: '10.96.0.10', externalLocal: false, internalLocal: false, ...over });
  const render = (sp: ServicePortInfo, eps: Endpoint[]) => assemble({ ports: [renderPort(sp, eps, { podCidr: '10.88.0.0/16' })], stale: [] }).text;
  const dnats = (text: string) => [...text.matchAll(/--to-destination (\S+)/g)].map((m) => m[1]);

  it('a Service with only terminating endpoints still sends to them; with a ready one, only to it', () => {
    expect(dnats(render(port({}), [ep('10.88.0.2', true, true)]))).toEqual(['10.88.0.2:8080']);
    expect(dnats(render(port({}), [ep('10.88.0.2', true, true), ep('10.88.0.3', false)]))).toEqual(['10.88.0.3:8080']);
  });

  it('internalTrafficPolicy Local: only this node\'s endpoints (its terminating ones before none), DROP without any', () => {
    const local = port({ internalLocal: true });
    const onlyRemote = render(local, [ep('10.88.0.2', false)]);
    expect(onlyRemote).toContain('-A KUBE-SERVICES -m comment --comment "ns1/web:http has no local endpoints" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j DROP');
    expect(dnats(onlyRemote)).toEqual([]);
    const text = render(local, [ep('10.88.0.2', false), ep('10.88.0.3', true, true)]);
    expect(dnats(text)).toEqual(['10.88.0.3:8080']);
    expect(text).toMatch(/-A KUBE-SERVICES .* -j KUBE-SVL-/);
    // A ready local endpoint: the terminating one no longer serves.
    expect(dnats(render(local, [ep('10.88.0.2', true), ep('10.88.0.3', true, true), ep('10.88.0.4', false)]))).toEqual(['10.88.0.2:8080']);
  });

  it('externalTrafficPolicy Local: external clients reach only this node\'s endpoints, DROP without any', () => {
    const text = render(port({ nodePort: 30080, externalLocal: true }), [ep('10.88.0.2', false)]);
    expect(text).toContain('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/web:http has no local endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j DROP');
  });
});

describe('the proxier over a slice source', () => {
  it('programs the endpoints the slices name, and follows a change of one Service\'s slices', async () => {
    const restores: string[] = [];
    const run: CommandRunner = async (argv, input) => {
      if (argv[0] === 'iptables-restore') restores.push(input ?? '');
      if (argv[0] === 'iptables' && argv.includes('-C')) return { code: 1, stdout: '', stderr: '' };
      return { code: 0, stdout: '', stderr: '' };
    };
    const services = new MemoryServiceSource();
    services.set(serviceObject('ns1', 'web', { selector: { app: 'web' }, ports: [{ name: 'http', port: 80 }] }));
    let slices: SliceLike[] = [slice([{ name: 'http', port: 8080, protocol: 'TCP' }], [{ ip: '10.88.0.2', node: NODE }])];
    const listeners = new Set<(s?: string[]) => void>();
    const source: EndpointSliceSource = { slicesOf: (ns, name) => (ns === 'ns1' && name === 'web' ? slices : []), onChange: (l) => (listeners.add(l), () => listeners.delete(l)), hasSynced: () => true };
    // No pods at all: the endpoints come from the slices alone.
    const proxier = new Proxier({ services, pods: new MemoryPodSource(), slices: { source, nodeName: NODE }, podCidr: '10.88.0.0/16', run, log: silentLogger });
    proxier.start();
    await proxier.waitForSync();
    expect(restores.at(-1)).toContain('--to-destination 10.88.0.2:8080');
    slices = [slice([{ name: 'http', port: 8080, protocol: 'TCP' }], [{ ip: '10.88.0.7', node: 'node-b' }])];
    const next = proxier.waitForSync();
    for (const l of listeners) l(['ns1/web']);
    await next;
    await proxier.stop();
    expect(restores.at(-1)).toContain('--to-destination 10.88.0.7:8080');
    expect(restores.at(-1)).not.toContain('10.88.0.2:8080');
  });
});

describe('Services read from the API', () => {
  it('an edit keeps the uid and changes the revision: the allocator parses it again', () => {
    const a = new Allocator('10.96.0.0/12');
    const one = { ...serviceObject('ns1', 'web', { ports: [{ port: 80 }] }), uid: 'api-uid', revision: '5' };
    expect(a.resolve([one]).services[0]!.ports.map((p) => p.port)).toEqual([80]);
    const edited = { ...serviceObject('ns1', 'web', { ports: [{ port: 8080 }] }), uid: 'api-uid', revision: '6' };
    expect(a.resolve([edited]).services[0]!.ports.map((p) => p.port)).toEqual([8080]);
  });
});

describe('service DNS over EndpointSlices', () => {
  const servers: DnsServer[] = [];
  afterEach(async () => {
    for (const s of servers.splice(0)) await s.close();
  });

  it('names a headless Service\'s ready endpoints from its slices: hostname as set there, SRV ports from the slice', async () => {
    const { services } = new Allocator('10.96.0.0/12').resolve([serviceObject('ns1', 'db', { clusterIP: 'None', selector: { app: 'db' }, ports: [{ name: 'pg', port: 5432, targetPort: 'pg' }] })]);
    const dbSlice = slice([{ name: 'pg', port: 5433, protocol: 'TCP' }], [{ ip: '10.88.0.5' }, { ip: '10.88.0.6', ready: false, serving: false }, { ip: '10.88.1.9', node: 'node-b' }]);
    dbSlice.endpoints![0]!.hostname = 'db-0';
    // No pods at all: only the slices know the endpoints (one of them on another node).
    const view = { services: () => services, pods: () => [], slicesOf: (ns: string, name: string) => (ns === 'ns1' && name === 'db' ? [dbSlice] : []) };
    const server = new DnsServer({ address: '127.0.0.1', port: 0, clusterDomain: 'cluster.local', view, upstreams: [], log: silentLogger });
    servers.push(server);
    const { port } = await server.start();
    const r = new Resolver({ timeout: 2000, tries: 1 });
    r.setServers([`127.0.0.1:${port}`]);
    expect((await r.resolve4('db.ns1.svc.cluster.local')).sort()).toEqual(['10.88.0.5', '10.88.1.9']);
    expect(await r.resolve4('db-0.db.ns1.svc.cluster.local')).toEqual(['10.88.0.5']);
    await expect(r.resolve4('10-88-0-6.db.ns1.svc.cluster.local')).rejects.toMatchObject({ code: 'ENOTFOUND' });
    const srv = (await r.resolveSrv('_pg._tcp.db.ns1.svc.cluster.local')).map((x) => `${x.name}:${x.port}`).sort();
    expect(srv).toEqual(['10-88-1-9.db.ns1.svc.cluster.local:5433', 'db-0.db.ns1.svc.cluster.local:5433']);
  });
});
