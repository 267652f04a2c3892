import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import type { Endpoint } from '../../src/proxy/endpoints.js';
import type { CommandRunner } from '../../src/proxy/iptables.js';
import { Proxier } from '../../src/proxy/proxier.js';
import { assemble, assembleFullSplit, chainHash, renderPort, sepChain, svcChain } from '../../src/proxy/rules.js';
import type { ServicePortInfo } from '../../src/proxy/service.js';
import { MemoryPodSource, MemoryServiceSource } from '../../src/proxy/sources.js';
import { silentLogger } from '../../src/log.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';
import { prng } from '../helpers/prng.js';

const goldenDir = path.join(path.dirname(fileURLToPath(import.meta.url)), 'golden/proxy');

/** Compares with test/unit/golden/proxy/<name>.txt; UPDATE_GOLDEN=1 rewrites the file (then review the diff). */
function golden(name: string, text: string): void {
  const file = path.join(goldenDir, `${name}.txt`);
  if (process.env.UPDATE_GOLDEN === '1') fs.writeFileSync(file, text);
  expect(text).toBe(fs.readFileSync(file, 'utf8'));
}

const opts = { podCidr: '10.88.0.0/16' };

function port(over: Partial<ServicePortInfo> = {}): ServicePortInfo {
  return {
    key: 'ns1/web:http',
    namespace: 'ns1',
    name: 'web',
    portName: 'http',
    protocol: 'TCP',
    port: 80,
    targetPort: 8080,
    clusterIP: '10.96.0.10',
    externalLocal: false,
    internalLocal: false,
    ...over,
  };
}

const eps = (...ips: string[]): Endpoint[] => ips.map((ip, i) => ({ ip, port: 8080, pod: `ns1/p${i}`, local: true }));
const render = (sp: ServicePortInfo, e: Endpoint[]) => assemble({ ports: [renderPort(sp, e, opts)], stale: [] }).text;

describe('chain names', () => {
  it('are kube-proxy\'s: 16 characters of base32(sha256(port name + protocol))', () => {
    // The "kubernetes" Service's chain on every kube-proxy cluster.
    expect(chainHash('default/kubernetes:https' + 'tcp')).toBe('NPX46M4PTMTKRN6Y');
    expect(svcChain(port({ key: 'default/kubernetes:https' }))).toBe('KUBE-SVC-NPX46M4PTMTKRN6Y');
    const a = sepChain(port(), eps('10.88.0.2')[0]!);
    const b = sepChain(port(), eps('10.88.0.3')[0]!);
    expect(a).toMatch(/^KUBE-SEP-[A-Z2-7]{16}$/);
    expect(a).not.toBe(b);
    expect(svcChain(port({ protocol: 'UDP' }))).not.toBe(svcChain(port()));
  });
});

describe('rendered rules (golden)', () => {
  it('a ClusterIP Service with one endpoint', () => {
    golden('one-endpoint', render(port(), eps('10.88.0.2')));
  });

  it('a Service without endpoints REJECTs in the filter table and has no nat chains', () => {
    const text = render(port({ nodePort: 30080 }), []);
    golden('no-endpoints', text);
    expect(text).toContain('-A KUBE-SERVICES -m comment --comment "ns1/web:http has no endpoints" -m tcp -p tcp -d 10.96.0.10 --dport 80 -j REJECT');
    expect(text).toContain('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/web:http has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30080 -j REJECT');
    expect(text).not.toMatch(/KUBE-SVC-|KUBE-SEP-|KUBE-EXT-/);
  });

  it('several endpoints are balanced with probabilities 1/(n-i)', () => {
    const text = render(port(), eps('10.88.0.2', '10.88.0.3', '10.88.0.4', '10.88.0.5'));
    golden('four-endpoints', text);
    const probs = [...text.matchAll(/--probability (\S+)/g)].map((m) => m[1]);
    expect(probs).toEqual(['0.2500000000', '0.3333333333', '0.5000000000']);
    expect(text.match(/-j KUBE-SEP-/g)).toHaveLength(4);
  });

  it('ClientIP affinity checks and sets a recent list per endpoint', () => {
    const text = render(port({ affinitySeconds: 10800 }), eps('10.88.0.2', '10.88.0.3'));
    golden('affinity', text);
    expect(text.match(/--rcheck --seconds 10800 --reap/g)).toHaveLength(2);
    expect(text.match(/--rsource --set/g)).toHaveLength(2);
  });

  it('NodePort: KUBE-NODEPORTS jumps to the EXT chain, which masquerades', () => {
    const text = render(port({ nodePort: 30080, protocol: 'UDP', key: 'ns1/dns:dns' }), eps('10.88.0.2', '10.88.0.3'));
    golden('nodeport-udp', text);
    expect(text).toMatch(/-A KUBE-NODEPORTS -m comment --comment ns1\/dns:dns -m udp -p udp --dport 30080 -j KUBE-EXT-/);
  });

  it('LoadBalancer: its addresses lead to the EXT chain, through a KUBE-FW chain that passes only its source ranges (KUBE-PROXY-FIREWALL drops the rest)', () => {
    const text = render(port({ nodePort: 30082, loadBalancerIPs: ['192.0.2.10'], sourceRanges: ['198.51.100.0/24', '203.0.113.7/32'] }), eps('10.88.0.2'));
    golden('loadbalancer-source-ranges', text);
    expect(text).toMatch(/-A KUBE-SERVICES -m comment --comment "ns1\/web:http loadbalancer IP" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j KUBE-FW-/);
    expect(text).toMatch(/-A KUBE-FW-\S+ -m comment --comment "ns1\/web:http loadbalancer IP" -s 198.51.100.0\/24 -j KUBE-EXT-/);
    expect(text).toMatch(/-A KUBE-PROXY-FIREWALL -m comment --comment "ns1\/web:http traffic not accepted by KUBE-FW-\S+" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j DROP/);
    // Without source ranges, straight to EXT; without node ports (allocateLoadBalancerNodePorts: false), no KUBE-NODEPORTS rule.
    const open = render(port({ loadBalancerIPs: ['192.0.2.10'] }), eps('10.88.0.2'));
    golden('loadbalancer-no-nodeports', open);
    expect(open).toMatch(/-d 192.0.2.10 --dport 80 -j KUBE-EXT-/);
    expect(open).not.toMatch(/KUBE-FW-|-A KUBE-NODEPORTS -m comment/);
    // No endpoints: the address REJECTs in the filter table, as a node port would.
    expect(render(port({ loadBalancerIPs: ['192.0.2.10'] }), [])).toMatch(/-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1\/web:http has no endpoints" -m tcp -p tcp -d 192.0.2.10 --dport 80 -j REJECT/);
  });

  it('externalIPs lead to the EXT chain, and REJECT (or DROP under a Local policy) without endpoints for them', () => {
    const text = render(port({ externalIPs: ['192.0.2.20'] }), eps('10.88.0.2'));
    expect(text).toContain('-A KUBE-SERVICES -m comment --comment "ns1/web:http external IP" -m tcp -p tcp -d 192.0.2.20 --dport 80 -j KUBE-EXT-');
    expect(text).toMatch(/-A KUBE-EXT-\S+ -m comment --comment "masquerade traffic for ns1\/web:http external destinations" -j KUBE-MARK-MASQ/);
    expect(render(port({ externalIPs: ['192.0.2.20'] }), [])).toContain('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/web:http has no endpoints" -m tcp -p tcp -d 192.0.2.20 --dport 80 -j REJECT');
    const remote = [{ ip: '10.88.0.9', port: 8080, pod: 'ns1/far', local: false }];
    expect(render(port({ externalIPs: ['192.0.2.20'], externalLocal: true }), remote)).toContain('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/web:http has no local endpoints" -m tcp -p tcp -d 192.0.2.20 --dport 80 -j DROP');
  });

  it('externalTrafficPolicy and internalTrafficPolicy Local use the SVL chain', () => {
    const text = render(port({ nodePort: 30081, externalLocal: true, internalLocal: true }), eps('10.88.0.2'));
    golden('local-policies', text);
    expect(text).toMatch(/-A KUBE-SERVICES .* -j KUBE-SVL-/);
    expect(text).toMatch(/-A KUBE-EXT-\S+ -j KUBE-SVL-/);
    expect(text).toMatch(/pod traffic for ns1\/web:http external destinations" -s 10.88.0.0\/16 -j KUBE-SVC-/);
  });

  it('declares chains in descending name order (iptables-nft inserts into its sorted chain cache from the front)', () => {
    const many = Array.from({ length: 50 }, (_, i) => renderPort(port({ key: `ns1/s${i}:http`, clusterIP: `10.96.1.${i + 1}` }), eps('10.88.0.2', '10.88.0.3'), opts));
    const decls = assemble({ ports: many, stale: [] }).text.split('*nat')[1]!.split('\n').filter((l) => l.startsWith(':'));
    expect(decls.length).toBe(4 + 50 * 3);
    expect(decls).toEqual([...decls].sort().reverse());
  });

  it('a full sync of many ports splits into restores that together write what one restore would', () => {
    const ports = Array.from({ length: 5 }, (_, i) => renderPort(port({ key: `ns1/s${i}:http`, clusterIP: `10.96.1.${i + 1}` }), i === 3 ? [] : eps('10.88.0.2'), opts));
    const one = assemble({ ports, stale: ['KUBE-SEP-AAAAAAAAAAAAAAAA'] }).text;
    const split = assembleFullSplit({ ports, stale: ['KUBE-SEP-AAAAAAAAAAAAAAAA'] }, 2);
    expect(split).toHaveLength(1 + 3 + 1);
    expect(assembleFullSplit({ ports, stale: [] }, 5)).toHaveLength(1);
    // The marking chains first (per-port chains jump to KUBE-MARK-MASQ), the dispatch and the deletions last.
    expect(split[0]!.text).toContain('-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000');
    expect(split[4]!.text).toContain(':KUBE-SERVICES - [0:0]');
    expect(split[4]!.text).toContain('-X KUBE-SEP-AAAAAAAAAAAAAAAA');
    for (const r of split.slice(1, 4)) expect(r.text).not.toMatch(/KUBE-SERVICES|KUBE-NODEPORTS|-X /);
    const lines = (t: string) => t.split('\n').filter((l) => l && l !== 'COMMIT' && !l.startsWith('*'));
    const union = new Set(split.flatMap((r) => lines(r.text)));
    expect([...union].sort()).toEqual([...new Set(lines(one))].sort());
  });

  it('a headless Service makes no rules', () => {
    const pr = renderPort(port({ clusterIP: undefined }), eps('10.88.0.2'), opts);
    expect(pr.natServices).toEqual([]);
    expect(pr.chains).toEqual([]);
    expect(pr.filter).toEqual([]);
  });

  it('a partial sync edits the top-level chains rule by rule and writes only the changed ports\' own chains; stale chains are deleted', () => {
    const a = renderPort(port(), eps('10.88.0.2'), opts);
    const b = renderPort(port({ key: 'ns1/api:http', name: 'api', clusterIP: '10.96.0.11', nodePort: 30090 }), eps('10.88.0.7'), opts);
    const gone = renderPort(port({ key: 'ns1/old:http', name: 'old', clusterIP: '10.96.0.12' }), eps('10.88.0.9'), opts);
    const empty = renderPort(port({ key: 'ns1/empty:http', name: 'empty', clusterIP: '10.96.0.13' }), [], opts);
    const previous = new Map([a, gone, empty].map((p) => [p.key, p]));
    const emptyNow = renderPort(port({ key: 'ns1/empty:http', name: 'empty', clusterIP: '10.96.0.13' }), eps('10.88.0.4'), opts);
    const text = assemble({ ports: [b, emptyNow, a], previous, changed: new Set([b.key, emptyNow.key]), stale: [...gone.chains] }).text;
    golden('partial', text);
    // Top-level chains are not declared (that would flush them).
    expect(text).not.toMatch(/^:KUBE-(SERVICES|NODEPORTS|POSTROUTING|MARK-MASQ|EXTERNAL-SERVICES|FORWARD) /m);
    // The unchanged port is not mentioned at all.
    expect(text).not.toContain('ns1/web:http');
    for (const c of b.chains) expect(text).toContain(`:${c} - [0:0]`);
    expect(text).toContain('-I KUBE-SERVICES 1 -m comment --comment "ns1/api:http cluster IP" -m tcp -p tcp -d 10.96.0.11 --dport 80 -j KUBE-SVC-');
    expect(text).toContain('-A KUBE-NODEPORTS -m comment --comment ns1/api:http -m tcp -p tcp --dport 30090 -j KUBE-EXT-');
    expect(text).toContain('-D KUBE-SERVICES -m comment --comment "ns1/old:http cluster IP" -m tcp -p tcp -d 10.96.0.12 --dport 80 -j KUBE-SVC-');
    expect(text).toContain('-D KUBE-SERVICES -m comment --comment "ns1/empty:http has no endpoints" -m tcp -p tcp -d 10.96.0.13 --dport 80 -j REJECT');
    // Deletions come before the chains they referenced are removed.
    const lines = text.split('\n');
    for (const c of gone.chains) expect(lines.indexOf(`-X ${c}`)).toBeGreaterThan(lines.findIndex((l) => l.startsWith('-D KUBE-SERVICES') && l.includes('ns1/old')));
  });
});

/** A fake iptables that records every command and returns a configured iptables-save. */
function recorder(save = '') {
  const calls: Array<{ argv: string[]; input?: string }> = [];
  let fail = false;
  const run: CommandRunner = async (argv, input) => {
    calls.push({ argv, input });
    if (argv[0] === 'iptables-save') return { code: 0, stdout: argv.includes('nat') ? save : '', stderr: '' };
    if (argv[0] === 'iptables-restore' && fail) return { code: 2, stdout: '', stderr: 'iptables-restore: line 3 failed' };
    if (argv[0] === 'iptables' && argv.includes('-C')) return { code: 1, stdout: '', stderr: '' };
    return { code: 0, stdout: '', stderr: '' };
  };
  return {
    run,
    calls,
    restores: () => calls.filter((c) => c.argv[0] === 'iptables-restore').map((c) => c.input!),
    setFail: (f: boolean) => (fail = f),
  };
}

function setup(save = '') {
  const services = new MemoryServiceSource();
  const pods = new MemoryPodSource();
  const rec = recorder(save);
  const proxier = new Proxier({ services, pods, podCidr: '10.88.0.0/16', run: rec.run, log: silentLogger });
  return { services, pods, rec, proxier };
}

const web = serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] });
const api = serviceObject('ns1', 'api', { clusterIP: '10.96.0.11', selector: { app: 'api' }, ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] });

describe('Proxier syncs', () => {
  it('the first sync is full, deletes chains a previous run left and puts the jumps in; later ones are partial', async () => {
    const { services, pods, rec, proxier } = setup(':KUBE-SEP-LEFTOVERLEFTOVER - [0:0]\n:KUBE-SVC-LEFTOVERLEFTOVER - [0:0]\n:OTHER - [0:0]\n');
    services.set(web);
    services.set(api);
    pods.set(pod('w1', { ns: 'ns1', ip: '10.88.0.2' }));
    pods.set(pod('a1', { ns: 'ns1', ip: '10.88.0.7', labels: { app: 'api' } }));
    const first = await proxier.syncNow();
    expect(first.full).toBe(true);
    const [t1] = rec.restores();
    expect(t1).toContain('-X KUBE-SEP-LEFTOVERLEFTOVER');
    expect(t1).toContain('-X KUBE-SVC-LEFTOVERLEFTOVER');
    expect(t1).not.toContain('OTHER');
    // The jumps out of the built-in chains ride in the same restore.
    expect(t1!.match(/^-I (INPUT|FORWARD|OUTPUT|PREROUTING|POSTROUTING) 1 /gm)).toHaveLength(11);
    expect(t1).toContain('-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\n');

    // A new endpoint for web: only web's chains are written.
    pods.set(pod('w2', { ns: 'ns1', ip: '10.88.0.3' }));
    const second = await proxier.syncNow();
    expect(second.full).toBe(false);
    const t2 = rec.restores()[1]!;
    expect(t2).not.toMatch(/^-I /m);
    expect(t2).toContain(`:${svcChain(port())} - [0:0]`);
    expect(t2).not.toMatch(/:KUBE-SVC-\S+ - \[0:0\]\n(?![\s\S]*ns1\/web)/);
    expect(t2).not.toContain('-> 10.88.0.7');
    // web's cluster IP rule did not change: the dispatch chain is left alone.
    expect(t2).not.toContain('KUBE-SERVICES');

    // Nothing changed: no restore at all.
    await proxier.syncNow();
    expect(rec.restores()).toHaveLength(2);

    // The UDP endpoint goes away: its chains are deleted, conntrack is cleared for it.
    pods.delete(pod('a1', { ns: 'ns1' }));
    await proxier.syncNow();
    const t4 = rec.restores()[2]!;
    const apiSep = sepChain(port({ key: 'ns1/api:dns', protocol: 'UDP', port: 53, targetPort: 53, clusterIP: '10.96.0.11' }), { ip: '10.88.0.7', port: 53, pod: 'ns1/a1', local: true });
    expect(t4).toContain(`-X ${apiSep}`);
    expect(t4).toContain('-A KUBE-SERVICES -m comment --comment "ns1/api:dns has no endpoints"');
    expect(t4).toContain('-D KUBE-SERVICES -m comment --comment "ns1/api:dns cluster IP"');
    const ct = rec.calls.filter((c) => c.argv[0] === 'conntrack').map((c) => c.argv.join(' '));
    expect(ct).toContain('conntrack -D -p udp --orig-dst 10.96.0.11 --dst-nat 10.88.0.7');
  });

  it('a failed restore is retried as a full sync', async () => {
    const { services, pods, rec, proxier } = setup();
    services.set(web);
    pods.set(pod('w1', { ns: 'ns1', ip: '10.88.0.2' }));
    await proxier.syncNow();
    rec.setFail(true);
    pods.set(pod('w2', { ns: 'ns1', ip: '10.88.0.3' }));
    await expect(proxier.syncNow()).rejects.toThrow(/iptables-restore failed.*line 3/);
    rec.setFail(false);
    const r = await proxier.syncNow();
    expect(r.full).toBe(true);
  });

  it('a bad Service is reported against itself and the others are still programmed', async () => {
    const { services, pods, rec, proxier } = setup();
    services.set(web);
    pods.set(pod('w1', { ns: 'ns1', ip: '10.88.0.2' }));
    await proxier.syncNow();
    // Sorts before web, but web already holds the address.
    services.set(serviceObject('ns1', 'thief', { clusterIP: '10.96.0.10', ports: [{ port: 80 }] }));
    services.set(serviceObject('ns1', 'outside', { clusterIP: '192.168.0.1', ports: [{ port: 80 }] }));
    services.set(serviceObject('ns1', 'np', { type: 'NodePort', ports: [{ port: 80, nodePort: 80 }] }));
    services.set(serviceObject('ns1', 'nomatch', { selector: { app: 'nothing' }, ports: [{ port: 80 }] }));
    await proxier.syncNow();
    const text = rec.restores()[1]!;
    expect(text).not.toContain('ns1/web'); // untouched by its neighbours' problems
    expect(text).toContain('"ns1/nomatch has no endpoints"');
    expect(proxier.problems()).toEqual([
      { service: 'ns1/np', reason: 'port 80: nodePort 80 is not in 30000-32767' },
      { service: 'ns1/outside', reason: 'clusterIP 192.168.0.1 is not in the service CIDR 10.96.0.0/12' },
      { service: 'ns1/thief', reason: 'clusterIP 10.96.0.10 is already taken by ns1/web' },
    ]);
  });
});

describe('incremental syncs', () => {
  it('after any sequence of Service and pod changes, partial syncs leave what a fresh full sync computes', async () => {
    const rand = prng(20261130);
    const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
    const { services, pods, proxier } = setup();
    const apps = ['a', 'b', 'c', 'd'];
    const names = Array.from({ length: 12 }, (_, i) => `p${i}`);
    const objects = new Map<string, ReturnType<typeof serviceObject>>();
    const norm = (m: Map<string, unknown>) => JSON.stringify([...m].sort(([a], [b]) => (a < b ? -1 : 1)));
    let programmedSome = false;
    for (let step = 0; step < 300; step++) {
      const r = rand();
      if (r < 0.25) {
        const app = pick(apps);
        const o = serviceObject('ns1', `svc-${app}`, {
          selector: { app },
          type: rand() < 0.3 ? 'NodePort' : 'ClusterIP',
          sessionAffinity: rand() < 0.2 ? 'ClientIP' : 'None',
          ports: [{ name: 'http', port: 80, targetPort: rand() < 0.5 ? 'web' : 8080, protocol: rand() < 0.3 ? 'UDP' : 'TCP' }],
        });
        services.set(o);
        objects.set(o.name, o);
      } else if (r < 0.3) {
        services.delete('ns1', `svc-${pick(apps)}`);
      } else if (r < 0.8) {
        const name = pick(names);
        pods.set(pod(name, { ns: pick(['ns1', 'ns1', 'ns2']), labels: { app: pick(apps) }, ip: `10.88.0.${names.indexOf(name) + 2}`, ready: rand() < 0.8, ports: [{ name: 'web', containerPort: 9000 }] }));
      } else {
        pods.delete(pod(pick(names), { ns: 'ns1' }));
      }
      if (rand() < 0.5) {
        await proxier.syncNow();
        const fresh = setup();
        for (const o of services.list()) fresh.services.set(o);
        for (const p of pods.list()) fresh.pods.set(p);
        await fresh.proxier.syncNow();
        expect(norm(proxier.programmed()), `step ${step}`).toBe(norm(fresh.proxier.programmed()));
        programmedSome ||= proxier.programmed().size > 0;
      }
    }
    expect(programmedSome).toBe(true);
  });
});

describe('the sync runner', () => {
  it('syncs on change at most every minSync, fully every syncPeriod, and retries a failed restore as a full sync', async () => {
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const rec = recorder();
    const proxier = new Proxier({ services, pods, podCidr: '10.88.0.0/16', run: rec.run, log: silentLogger, minSyncMs: 300, syncPeriodMs: 1500 });
    services.set(web);
    proxier.start();
    try {
      await waitUntil(() => rec.restores().length === 1);
      const t0 = Date.now();
      // A burst of changes right after a sync: one more sync, no sooner than minSync after the last.
      for (let i = 0; i < 10; i++) pods.set(pod(`w${i}`, { ns: 'ns1', ip: `10.88.0.${i + 2}` }));
      await waitUntil(() => rec.restores().length === 2);
      expect(Date.now() - t0).toBeGreaterThanOrEqual(200);
      await new Promise((r) => setTimeout(r, 400));
      expect(rec.restores()).toHaveLength(2);
      expect(rec.restores()[1]).not.toContain(':KUBE-SERVICES - [0:0]'); // partial

      // A failing restore is logged and retried, and the retry is a full sync.
      rec.setFail(true);
      pods.delete(pod('w0', { ns: 'ns1' }));
      await waitUntil(() => rec.restores().length === 3);
      rec.setFail(false);
      await waitUntil(() => rec.restores().length === 4);
      expect(rec.restores()[3]).toContain(':KUBE-SERVICES - [0:0]');

      // Nothing changes: the periodic full sync still comes.
      const n = rec.restores().length;
      await waitUntil(() => rec.restores().length > n, 3000);
      expect(rec.restores()[n]).toContain(':KUBE-SERVICES - [0:0]');
    } finally {
      await proxier.stop();
    }
  });
});

describe('the first sync', () => {
  it('waits until the pod source has its first list (no moment where every Service REJECTs)', async () => {
    const services = new MemoryServiceSource();
    services.set(web);
    const listeners = new Set<() => void>();
    let synced = false;
    const pods = {
      list: () => (synced ? [pod('w1', { ns: 'ns1', ip: '10.88.0.2' })] : []),
      onChange: (l: () => void) => (listeners.add(l), () => listeners.delete(l)),
      hasSynced: () => synced,
    };
    const rec = recorder();
    const proxier = new Proxier({ services, pods, podCidr: '10.88.0.0/16', run: rec.run, log: silentLogger, minSyncMs: 50 });
    proxier.start();
    try {
      await new Promise((r) => setTimeout(r, 300));
      expect(rec.restores()).toHaveLength(0);
      synced = true;
      for (const l of listeners) l();
      await waitUntil(() => rec.restores().length === 1);
      expect(rec.restores()[0]).toContain('"ns1/web:http cluster IP"');
      expect(rec.restores()[0]).not.toContain('has no endpoints');
    } finally {
      await proxier.stop();
    }
  });
});

async function waitUntil(cond: () => boolean, ms = 3000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 10));
  }
}
