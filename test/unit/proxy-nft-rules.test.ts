import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { Endpoint } from '../../src/proxy/endpoints.js';
import type { CommandRunner } from '../../src/proxy/iptables.js';
import { assembleNft, changedOps, nftEndpointBase, nftServiceBase, opsText, portTable, renderNftPort, tableCount } from '../../src/proxy/nft-rules.js';
import { Proxier } from '../../src/proxy/proxier.js';
import type { ServicePortInfo } from '../../src/proxy/service.js';
import { MemoryPodSource, MemoryServiceSource } from '../../src/proxy/sources.js';
import { silentLogger } from '../../src/log.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

const goldenDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'golden/proxy');

/** Compares with test/unit/golden/proxy/<name>.nft; UPDATE_GOLDEN=1 rewrites the file (then review the diff). */
function golden(name: string, text: string): void {
  const file = path.join(goldenDir, `${name}.nft`);
  if (process.env.UPDATE_GOLDEN === '1') fs.writeFileSync(file, text);
  expect(text).toBe(fs.readFileSync(file, 'utf8'));
}

const opts = { podCidr: '10.88.0.0/16' };

function port(over: Partial<ServicePortInfo> = {}): ServicePortInfo {
  return { key: 'ns1/web:http', namespace: 'ns1', name: 'web', portName: 'http', protocol: 'TCP', port: 80, targetPort: 8080, clusterIP: '10.96.0.10', externalLocal: false, internalLocal: false, ...over };
}

const eps = (...ips: string[]): Endpoint[] => ips.map((ip, i) => ({ ip, port: 8080, pod: `ns1/p${i}`, local: true }));
/** A port's own part of the text (the fixed header is the same for every port and golden once). */
const own = (sp: ServicePortInfo, e: Endpoint[]) => {
  const text = assembleNft({ ports: [renderNftPort(sp, e, opts)] }).text;
  return text.split('\n').filter((l) => l.includes('ns1/')).join('\n') + '\n';
};

describe('nftables names', () => {
  it("are kube-proxy's: 8 characters of base32(sha256(name)), then ns/svc/proto/port (and __ip/port for endpoints)", () => {
    expect(nftServiceBase(port())).toMatch(/^[A-Z2-7]{8}-ns1\/web\/tcp\/http$/);
    expect(nftEndpointBase(port(), eps('10.88.0.2')[0]!)).toMatch(/^[A-Z2-7]{8}-ns1\/web\/tcp\/http__10\.88\.0\.2\/8080$/);
    expect(nftServiceBase(port({ protocol: 'UDP' }))).not.toBe(nftServiceBase(port()));
  });
});

describe('rendered nftables (golden)', () => {
  it('the fixed part of the table, made afresh', () => {
    golden('nft-header', assembleNft({ ports: [], fresh: true }).text);
  });
  it('a ClusterIP Service with two endpoints', () => {
    golden('nft-two-endpoints', own(port(), eps('10.88.0.2', '10.88.0.3')));
  });
  it('a Service without endpoints: REJECT through the no-endpoint maps, no chains', () => {
    const text = own(port({ nodePort: 30080 }), []);
    golden('nft-no-endpoints', text);
    expect(text).not.toContain('add chain');
  });
  it('internalTrafficPolicy Local with only a remote endpoint: DROP', () => {
    const text = own(port({ internalLocal: true }), [{ ip: '10.88.0.9', port: 8080, pod: 'ns1/far', local: false }]);
    expect(text).toBe(`add element ip kube-proxy no-endpoint-services { 10.96.0.10 . tcp . 80 comment "ns1/web:http" : drop }\n`);
  });
  it('a LoadBalancer with externalTrafficPolicy Local, affinity, source ranges, an external IP and a remote endpoint', () => {
    const sp = port({ nodePort: 30080, externalLocal: true, affinitySeconds: 600, loadBalancerIPs: ['192.168.50.2'], sourceRanges: ['192.168.50.0/24'], externalIPs: ['192.168.60.2'] });
    golden('nft-lb-local', own(sp, [...eps('10.88.0.2'), { ip: '10.88.0.9', port: 8080, pod: 'ns1/far', local: false }]));
  });
  it('terminating endpoints serve only when no ready one is left', () => {
    const t = (ip: string, local: boolean): Endpoint => ({ ip, port: 8080, pod: 'ns1/t', local, terminating: true });
    expect(own(port(), [...eps('10.88.0.2'), t('10.88.0.3', true)])).not.toContain('10.88.0.3');
    expect(own(port(), [t('10.88.0.3', true)])).toContain('dnat to 10.88.0.3:8080');
  });
});

describe('partial nftables transactions', () => {
  it('an endpoint removed: only its chain and set go, the service chain is rewritten, no map is touched', () => {
    const sp = port({ affinitySeconds: 60 });
    const before = renderNftPort(sp, eps('10.88.0.2', '10.88.0.3'), opts);
    const other = renderNftPort(port({ key: 'ns1/db', name: 'db', portName: '', clusterIP: '10.96.0.11' }), eps('10.88.0.7'), opts);
    const after = renderNftPort(sp, eps('10.88.0.2'), opts);
    const text = assembleNft({ ports: [after, other], previous: new Map([[before.key, before], [other.key, other]]) }).text;
    golden('nft-partial-endpoint-removed', text);
    expect(text).not.toContain('ns1/db');
    expect(text).not.toContain('element');
  });
  it('a Service added and one removed: elements added and deleted one by one', () => {
    const a = renderNftPort(port(), eps('10.88.0.2'), opts);
    const b = renderNftPort(port({ key: 'ns1/db', name: 'db', portName: '', clusterIP: '10.96.0.11' }), eps('10.88.0.7'), opts);
    const text = assembleNft({ ports: [b], previous: new Map([[a.key, a]]) }).text;
    golden('nft-partial-swap', text);
    const lines = text.split('\n');
    // The element that leads to a chain goes before the chain does, and the new element comes after its chain.
    expect(lines.findIndex((l) => l.startsWith('delete element'))).toBeLessThan(lines.findIndex((l) => l.startsWith('delete chain')));
    expect(lines.findIndex((l) => l.startsWith('add element'))).toBeGreaterThan(lines.findIndex((l) => l.startsWith('add rule')));
  });
  it("a port's comment is cut to the 128 bytes nft takes (ns/name:port may be 191 characters)", () => {
    const ns = `n${'a'.repeat(62)}`;
    const name = `s${'b'.repeat(62)}`;
    const sp = port({ key: `${ns}/${name}:http`, namespace: ns, name });
    const r = renderNftPort(sp, [], opts);
    expect(r.elements.noEndpointServices[0]!.comment).toBe(sp.key.slice(0, 128));
    const short = renderNftPort(port(), [], opts);
    expect(short.elements.noEndpointServices[0]!.comment).toBe('ns1/web:http');
  });

  it('nothing changed: no text', () => {
    const a = renderNftPort(port(), eps('10.88.0.2'), opts);
    expect(assembleNft({ ports: [a], previous: new Map([[a.key, a]]) }).text).toBe('');
  });
});

describe('Services spread over tables', () => {
  // Two port keys that land in different tables of two.
  const keys = ['a', 'b', 'c', 'd', 'e', 'f'].map((n) => `ns1/${n}:http`);
  const inMain = keys.find((k) => portTable(k, 2) === 'kube-proxy')!;
  const inOther = keys.find((k) => portTable(k, 2) === 'kube-proxy-1')!;
  const named = (key: string, over: Partial<ServicePortInfo> = {}) => port({ key, name: key.slice(4, 5), ...over });

  it('the count: one table up to the limit, then a power of two so none holds more, at most 64', () => {
    expect([0, 1000, 1001, 2000, 2001, 10_000, 10_000_000].map((n) => tableCount(n))).toEqual([1, 1, 2, 2, 4, 16, 64]);
    expect(tableCount(3, 1)).toBe(4);
  });

  it('a further table has the nat dispatch for its ports; firewall and no-endpoint parts stay in kube-proxy (golden)', () => {
    const lb = renderNftPort(named(inOther, { clusterIP: '10.96.0.11', nodePort: 30081, affinitySeconds: 60, loadBalancerIPs: ['192.168.50.2'], sourceRanges: ['192.168.50.0/24'] }), eps('10.88.0.3'), opts);
    const web = renderNftPort(named(inMain), eps('10.88.0.2'), opts);
    // Without endpoints: only no-endpoint elements, which are kube-proxy's whatever the port's table.
    const empty = renderNftPort(named('ns1/z:http', { clusterIP: '10.96.0.12', port: 81 }), [], opts);
    const text = assembleNft({ ports: [web, lb, empty], fresh: true, tables: 2 }).text;
    golden('nft-two-tables', text);
    expect(text).toContain('add chain ip kube-proxy-1 nat-prerouting { type nat hook prerouting priority -100 ; }');
    expect(text).not.toContain('add chain ip kube-proxy-1 filter-');
    expect(text).toMatch(/add element ip kube-proxy-1 service-ips \{ 10\.96\.0\.11 \. tcp \. 80 : goto service-/);
    expect(text).toMatch(/add element ip kube-proxy firewall-ips \{ 192\.168\.50\.2 \. tcp \. 80 comment "[^"]+" : goto firewall-/);
    expect(text).toMatch(/add chain ip kube-proxy firewall-/);
    expect(text).toMatch(/add set ip kube-proxy-1 affinity-/);
    expect(text).toMatch(/add element ip kube-proxy no-endpoint-services \{ 10\.96\.0\.12 /);
  });

  it('a partial sync writes each step into its port\'s table', () => {
    const before = renderNftPort(named(inOther), eps('10.88.0.2', '10.88.0.3'), opts);
    const after = renderNftPort(named(inOther), eps('10.88.0.2'), opts);
    const { ops } = changedOps([inOther], () => before, () => after, 2);
    expect(ops.length).toBeGreaterThan(0);
    expect(ops.every((o) => o.table === 'kube-proxy-1')).toBe(true);
    expect(opsText(ops)).not.toContain('ip kube-proxy ');
  });
});

function recorder() {
  const calls: Array<{ argv: string[]; input?: string }> = [];
  const run: CommandRunner = async (argv, input) => {
    calls.push({ argv, input });
    return { code: argv[0] === 'iptables' && argv.includes('-D') ? 1 : 0, stdout: '', stderr: '' };
  };
  return { run, calls, nft: () => calls.filter((c) => c.argv[0] === 'nft' && c.argv[1] === '-f').map((c) => c.input!) };
}

describe('the proxier in nftables mode', () => {
  it('first sync: cleans the iptables mode and makes the table afresh; then one transaction per change, touching only it', async () => {
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const rec = recorder();
    const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: rec.run, log: silentLogger });
    services.set(serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }));
    pods.set(pod('w1', { ns: 'ns1', labels: { app: 'web' }, ip: '10.88.0.2' }));
    const first = await proxier.syncNow();
    expect(first.full).toBe(true);
    expect(rec.calls.some((c) => c.argv[0] === 'iptables' && c.argv.includes('-D'))).toBe(true); // the other mode's jumps
    expect(rec.nft()).toHaveLength(1);
    expect(rec.nft()[0]).toMatch(/^add table ip kube-proxy\ndelete table ip kube-proxy\n/);
    expect(rec.nft()[0]).toContain('add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto service-');

    services.set(serviceObject('ns1', 'db', { clusterIP: '10.96.0.11', selector: { app: 'db' }, ports: [{ port: 5432 }] }));
    const add = await proxier.syncNow();
    expect(add.full).toBe(false);
    const text = rec.nft()[1]!;
    expect(text).toContain('add element ip kube-proxy no-endpoint-services { 10.96.0.11 . tcp . 5432 comment "ns1/db" : goto reject-chain }');
    expect(text).not.toContain('ns1/web');
    expect(text).not.toContain('table');

    const none = await proxier.syncNow();
    expect(none.rulesWritten).toBe(0);
    expect(rec.nft()).toHaveLength(2);

    // A periodic full sync keeps the table (affinity entries survive) and rewrites it whole.
    const again = await proxier.syncNow(true);
    expect(again.full).toBe(true);
    expect(rec.nft()[2]).not.toContain('delete table');
    await proxier.stop();
  });

  it('after a failed sync the table is made afresh: a chain someone deleted cannot fail every sync after', async () => {
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const rec = recorder();
    let failNext = false;
    const run: CommandRunner = async (argv, input) => {
      if (failNext && argv[0] === 'nft' && argv[1] === '-f') {
        failNext = false;
        return { code: 1, stdout: '', stderr: 'Error: Could not process rule: No such file or directory' };
      }
      return rec.run(argv, input);
    };
    const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run, log: silentLogger });
    services.set(serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }));
    const w1 = pod('w1', { ns: 'ns1', labels: { app: 'web' }, ip: '10.88.0.2' });
    pods.set(w1);
    await proxier.syncNow();
    pods.delete(w1);
    failNext = true;
    await expect(proxier.syncNow()).rejects.toThrow(/nft -f failed/);
    const retry = await proxier.syncNow();
    expect(retry.full).toBe(true);
    const text = rec.nft().at(-1)!;
    // Made afresh, not edited: no `delete chain` of the endpoint chain that may no longer be there.
    expect(text).toMatch(/^add table ip kube-proxy\ndelete table ip kube-proxy\n/);
    expect(text).not.toContain('delete chain');
    // A later full sync edits the table again.
    await proxier.syncNow(true);
    expect(rec.nft().at(-1)).not.toContain('delete table');
    await proxier.stop();
  });
});
