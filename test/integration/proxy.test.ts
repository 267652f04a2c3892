/**
 * The service proxy in both modes (real iptables, real nftables), inside network namespaces this file
 * creates: a "node" namespace with a bridge (the pod network's gateway is
 * 10.244.0.1) and three "pod" namespaces on it, two serving TCP and UDP and
 * one acting as the client. The proxier runs in this process and programs
 * the node namespace through `nsenter`; traffic never leaves these namespaces.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { processRunner } from '../../src/proxy/iptables.js';
import { portTable, tableName } from '../../src/proxy/nft-rules.js';
import { Proxier, PROXY_MODES } from '../../src/proxy/proxier.js';
import { MemoryPodSource, MemoryServiceSource } from '../../src/proxy/sources.js';
import { TestNetns } from '../helpers/netns.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

// Root only; a missing iptables or conntrack is a setup bug (scripts/setup.sh installs them), so it fails rather than skips.
const isRoot = process.getuid?.() === 0;

const SERVER = `
const net = require('net'), dgram = require('dgram');
const name = process.env.POD_NAME;
net.createServer((s) => { s.on('error', () => {}); s.end(name + ' ' + s.remoteAddress + '\\n'); }).listen(8080, '0.0.0.0');
const u = dgram.createSocket('udp4');
u.on('message', (m, r) => u.send(name + ' ' + r.address, r.port, r.address));
u.bind(5353, '0.0.0.0');
`;

const CLIENT = `
const net = require('net'), dgram = require('dgram');
const { PROTO, HOST, PORT, COUNT, SPORT } = process.env;
function tcp() {
  return new Promise((res) => {
    const t0 = Date.now();
    const s = net.connect({ host: HOST, port: +PORT });
    let d = '';
    const t = setTimeout(() => { s.destroy(); res('TIMEOUT'); }, 3000);
    s.on('data', (c) => (d += c));
    s.on('end', () => { clearTimeout(t); res(d.trim()); });
    s.on('error', (e) => { clearTimeout(t); res('ERR ' + e.code + ' ' + (Date.now() - t0)); });
  });
}
function udp() {
  return new Promise((res) => {
    const u = dgram.createSocket({ type: 'udp4', reuseAddr: true });
    const t = setTimeout(() => { u.close(); res('TIMEOUT'); }, 1500);
    u.on('message', (m) => { clearTimeout(t); u.close(); res(m.toString().trim()); });
    u.bind(SPORT ? +SPORT : 0, () => u.send('x', +PORT, HOST));
  });
}
(async () => {
  const out = [];
  for (let i = 0; i < +COUNT; i++) out.push(PROTO === 'udp' ? await udp() : await tcp());
  process.stdout.write(JSON.stringify(out));
})();
`;

function sh(argv: string[]): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

const POD_IPS = { p1: '10.244.0.11', p2: '10.244.0.12', client: '10.244.0.13' } as const;

// nftables mode once more with each service port's dispatch in a table of its own choosing (as at scale; see tableCount).
const SETUPS = [...PROXY_MODES.map((mode) => ({ mode, label: `${mode} mode`, portsPerTable: undefined as number | undefined })), { mode: 'nftables' as const, label: 'nftables mode, Services spread over tables', portsPerTable: 1 }];

describe.skipIf(!isRoot).each(SETUPS)('service proxy in $label', ({ mode, portsPerTable }) => {
  const node = new TestNetns();
  const pods: Record<keyof typeof POD_IPS, TestNetns> = { p1: new TestNetns(), p2: new TestNetns(), client: new TestNetns() };
  const servers: ChildProcess[] = [];
  const services = new MemoryServiceSource();
  const podSource = new MemoryPodSource();
  let proxier: Proxier;
  let before = '';

  /** Both modes' rules: iptables-save of filter and nat, then the nftables ruleset (without iptables-nft's own tables). */
  const save = () =>
    ['filter', 'nat']
      .map((t) => sh(['nsenter', `--net=${node.path}`, 'iptables-save', '-t', t]))
      .join('')
      .split('\n')
      .filter((l) => !l.startsWith('#'))
      .map((l) => l.replace(/\[\d+:\d+\]$/, ''))
      .join('\n') + nftTables();
  const nftTables = () => sh(['nsenter', `--net=${node.path}`, 'nft', 'list', 'tables']).split('\n').filter((l) => l && !/ (filter|nat)$/.test(l)).join('\n');
  /** The proxy's nftables tables: kube-proxy's, then any it spread Services over. */
  const nftList = () =>
    sh(['nsenter', `--net=${node.path}`, 'nft', 'list', 'tables', 'ip'])
      .split('\n')
      .map((l) => /^table ip (kube-proxy(-\d+)?)$/.exec(l)?.[1])
      .filter((t): t is string => t !== undefined)
      .map((t) => sh(['nsenter', `--net=${node.path}`, 'nft', 'list', 'table', 'ip', t]))
      .join('');

  /** Runs `count` connections (or datagrams) from a pod namespace; returns what each got back. */
  async function client(from: TestNetns, proto: 'tcp' | 'udp', host: string, port: number, count: number, sport?: number): Promise<string[]> {
    const child = spawn('nsenter', [`--net=${from.path}`, process.execPath, '-e', CLIENT], {
      env: { ...process.env, PROTO: proto, HOST: host, PORT: String(port), COUNT: String(count), SPORT: sport ? String(sport) : '' },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    await new Promise((r) => child.on('close', r));
    return JSON.parse(out) as string[];
  }

  const names = (answers: string[]) => answers.map((a) => a.split(' ')[0]);

  function backendPod(name: 'p1' | 'p2', labels: Record<string, string>, ready = true): Pod {
    return pod(name, { ns: 'demo', ip: POD_IPS[name], labels, ready, ports: [{ name: 'http', containerPort: 8080 }] });
  }

  beforeAll(async () => {
    node.create();
    const inNode = (...a: string[]) => sh(['ip', '-n', node.name, ...a]);
    inNode('link', 'add', 'br0', 'type', 'bridge');
    inNode('addr', 'add', '10.244.0.1/24', 'dev', 'br0');
    inNode('link', 'set', 'br0', 'up');
    // A node has a default route; cluster IPs need some route, or the kernel refuses before any rule runs.
    // Here it points at a dummy "uplink", as a real node's default route points at its NIC.
    inNode('link', 'add', 'uplink0', 'type', 'veth', 'peer', 'name', 'uplink1');
    inNode('link', 'set', 'uplink0', 'up');
    inNode('link', 'set', 'uplink1', 'up');
    inNode('route', 'add', '10.96.0.0/12', 'dev', 'uplink0');
    sh(['nsenter', `--net=${node.path}`, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    // Replies between pods on one bridge must pass the node's conntrack to be un-DNATed.
    sh(['nsenter', `--net=${node.path}`, 'sysctl', '-qw', 'net.bridge.bridge-nf-call-iptables=1']);
    let i = 0;
    for (const [name, ns] of Object.entries(pods) as Array<[keyof typeof POD_IPS, TestNetns]>) {
      ns.create();
      const veth = `vp${i++}`;
      inNode('link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns.name);
      inNode('link', 'set', veth, 'master', 'br0', 'up');
      inNode('link', 'set', veth, 'type', 'bridge_slave', 'hairpin', 'on');
      sh(['ip', '-n', ns.name, 'addr', 'add', `${POD_IPS[name]}/24`, 'dev', 'eth0']);
      sh(['ip', '-n', ns.name, 'link', 'set', 'eth0', 'up']);
      sh(['ip', '-n', ns.name, 'route', 'add', 'default', 'via', '10.244.0.1']);
      if (name !== 'client') {
        const s = spawn('nsenter', [`--net=${ns.path}`, process.execPath, '-e', SERVER], { env: { ...process.env, POD_NAME: name }, stdio: 'ignore' });
        servers.push(s);
      }
    }
    // Wait until both servers answer directly.
    for (const name of ['p1', 'p2'] as const) {
      const deadline = Date.now() + 20_000;
      for (;;) {
        const got = await client(pods.client, 'tcp', POD_IPS[name], 8080, 1);
        if (got[0]?.startsWith(name)) break;
        if (Date.now() > deadline) throw new Error(`server in ${name} did not come up: ${got[0]}`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    before = save();
    proxier = new Proxier({
      services,
      pods: podSource,
      mode,
      podCidr: '10.244.0.0/24',
      // Full syncs split into several restores, as at scale.
      portsPerRestore: 2,
      splitAbove: 2,
      run: processRunner(['nsenter', `--net=${node.path}`]),
      // nftables mode's partial syncs go over netlink into the node's namespace.
      netns: node.path,
      portsPerTable,
      log: silentLogger,
    });
  });

  afterAll(async () => {
    await proxier?.stop();
    for (const s of servers) s.kill('SIGKILL');
    await Promise.all(servers.map((s) => (s.exitCode !== null || s.signalCode !== null ? undefined : new Promise((r) => s.once('exit', r)))));
    for (const ns of Object.values(pods)) await ns.destroy();
    await node.destroy();
  });

  it('a ClusterIP and a NodePort reach every ready backend, from a pod and from the node', async () => {
    services.set(
      serviceObject('demo', 'web', {
        type: 'NodePort',
        clusterIP: '10.96.0.10',
        selector: { app: 'web' },
        ports: [{ name: 'http', port: 80, targetPort: 'http', nodePort: 30080 }],
      }),
    );
    podSource.set(backendPod('p1', { app: 'web' }));
    podSource.set(backendPod('p2', { app: 'web' }));
    const r = await proxier.syncNow();
    expect(r.full).toBe(true);
    const viaClusterIP = await client(pods.client, 'tcp', '10.96.0.10', 80, 30);
    expect(new Set(names(viaClusterIP))).toEqual(new Set(['p1', 'p2']));
    // Pod-to-pod traffic keeps its source address.
    expect(viaClusterIP.every((a) => a.endsWith(POD_IPS.client))).toBe(true);
    const viaNodePort = await client(pods.client, 'tcp', '10.244.0.1', 30080, 30);
    expect(new Set(names(viaNodePort))).toEqual(new Set(['p1', 'p2']));
    // From the node itself: through nat OUTPUT, masqueraded to the bridge address.
    const fromNode = await client(node, 'tcp', '10.96.0.10', 80, 10);
    expect(names(fromNode).every((n) => n === 'p1' || n === 'p2')).toBe(true);
  });

  it('a pod that turns unready gets no new connections after one sync', async () => {
    podSource.set(backendPod('p2', { app: 'web' }, false));
    const r = await proxier.syncNow();
    expect(r.full).toBe(false);
    expect(names(await client(pods.client, 'tcp', '10.96.0.10', 80, 20))).toEqual(Array(20).fill('p1'));
    podSource.set(backendPod('p2', { app: 'web' }, true));
    await proxier.syncNow();
    expect(new Set(names(await client(pods.client, 'tcp', '10.96.0.10', 80, 30)))).toEqual(new Set(['p1', 'p2']));
  });

  it('ClientIP affinity sticks to one backend', async () => {
    services.set(
      serviceObject('demo', 'sticky', { clusterIP: '10.96.0.11', selector: { app: 'web' }, sessionAffinity: 'ClientIP', ports: [{ port: 80, targetPort: 8080 }] }),
    );
    await proxier.syncNow();
    const got = names(await client(pods.client, 'tcp', '10.96.0.11', 80, 20));
    expect(new Set(got).size).toBe(1);
  });

  it('a Service without endpoints refuses at once', async () => {
    services.set(serviceObject('demo', 'empty', { type: 'NodePort', clusterIP: '10.96.0.12', selector: { app: 'nothing' }, ports: [{ port: 80, nodePort: 30082 }] }));
    await proxier.syncNow();
    const [viaIP] = await client(pods.client, 'tcp', '10.96.0.12', 80, 1);
    expect(viaIP).toMatch(/^ERR ECONNREFUSED \d+$/);
    expect(Number(viaIP!.split(' ')[2])).toBeLessThan(1000);
    const [viaNodePort] = await client(pods.client, 'tcp', '10.244.0.1', 30082, 1);
    expect(viaNodePort).toMatch(/^ERR ECONNREFUSED/);
  });

  it('hairpin: a pod reaches itself through its Service', async () => {
    services.set(serviceObject('demo', 'self', { clusterIP: '10.96.0.13', selector: { app: 'self' }, ports: [{ port: 80, targetPort: 8080 }] }));
    podSource.set(backendPod('p1', { app: 'web', role: 'x' }));
    podSource.set({ ...backendPod('p1', { app: 'web' }), metadata: { namespace: 'demo', name: 'p1', labels: { app: 'web', self: 'yes' } } });
    services.set(serviceObject('demo', 'self', { clusterIP: '10.96.0.13', selector: { self: 'yes' }, ports: [{ port: 80, targetPort: 8080 }] }));
    await proxier.syncNow();
    const got = await client(pods.p1, 'tcp', '10.96.0.13', 80, 3);
    // Masqueraded to the gateway, or the reply would go straight back to itself and be dropped.
    expect(got).toEqual(Array(3).fill('p1 10.244.0.1'));
  });

  it.runIf(portsPerTable !== undefined)('Services spread over tables answer from the table their port key picks', async () => {
    const r = await proxier.syncNow(true);
    expect(r.tables).toBe(4);
    const listing = (t: string) => sh(['nsenter', `--net=${node.path}`, 'nft', 'list', 'table', 'ip', t]);
    const placed = new Set<string>();
    for (const [key, ip] of [['demo/web:http', '10.96.0.10'], ['demo/sticky', '10.96.0.11'], ['demo/self', '10.96.0.13']] as const) {
      const table = portTable(key, 4);
      placed.add(table);
      expect(listing(table), key).toContain(`${ip} . tcp . 80 : goto service-`);
      for (const other of [0, 1, 2, 3].map(tableName).filter((t) => t !== table)) expect(listing(other), `${key} in ${other}`).not.toContain(`${ip} . tcp . 80 : goto`);
    }
    expect(placed.size).toBeGreaterThan(1);
    // The no-endpoint Service's REJECT stays with the filter chains in kube-proxy's own table.
    expect(listing('kube-proxy')).toContain('10.96.0.12 . tcp . 80 comment "demo/empty" : goto reject-chain');
    expect(new Set(names(await client(pods.client, 'tcp', '10.96.0.10', 80, 20)))).toEqual(new Set(['p1', 'p2']));
    expect(new Set(names(await client(pods.client, 'tcp', '10.96.0.11', 80, 5))).size).toBe(1);
    expect(await client(pods.p1, 'tcp', '10.96.0.13', 80, 2)).toEqual(Array(2).fill('p1 10.244.0.1'));
  });

  it('UDP follows its backend after a change (stale conntrack entries are deleted)', async () => {
    services.set(serviceObject('demo', 'udp', { clusterIP: '10.96.0.14', selector: { udp: 'on' }, ports: [{ port: 53, protocol: 'UDP', targetPort: 5353 }] }));
    podSource.set({ ...backendPod('p1', {}), metadata: { namespace: 'demo', name: 'p1', labels: { app: 'web', self: 'yes', udp: 'on' } } });
    await proxier.syncNow();
    expect(await client(pods.client, 'udp', '10.96.0.14', 53, 2, 40053)).toEqual(['p1 10.244.0.13', 'p1 10.244.0.13']);
    // Move the Service to p2 only; the client keeps its source port, so only a deleted conntrack entry lets it reach p2.
    podSource.set({ ...backendPod('p1', {}), metadata: { namespace: 'demo', name: 'p1', labels: { app: 'web', self: 'yes' } } });
    podSource.set({ ...backendPod('p2', {}), metadata: { namespace: 'demo', name: 'p2', labels: { app: 'web', udp: 'on' } } });
    await proxier.syncNow();
    expect(await client(pods.client, 'udp', '10.96.0.14', 53, 2, 40053)).toEqual(['p2 10.244.0.13', 'p2 10.244.0.13']);
  });

  it('a deleted Service loses its chains; cleanup leaves the rules exactly as before', async () => {
    const chains = () =>
      mode === 'iptables' ? (sh(['nsenter', `--net=${node.path}`, 'iptables-save', '-t', 'nat']).match(/^:KUBE-(SVC|SEP|EXT)-\S+/gm) ?? []) : (nftList().match(/^\tchain \S+\//gm) ?? []);
    if (mode === 'nftables') expect(sh(['nsenter', `--net=${node.path}`, 'iptables-save', '-t', 'nat'])).not.toContain('KUBE-');
    const withAll = chains().length;
    services.delete('demo', 'web');
    await proxier.syncNow();
    expect(chains().length).toBeLessThan(withAll);
    // The partial syncs so far left exactly the rules a full sync writes (in another order:
    // partial syncs insert at the top of KUBE-SERVICES), and a full sync adds no second copy of the jumps.
    // (nft lists a map's elements in hash order: each element is a line here.)
    // An affinity entry's remaining time is not a rule: the entry itself must survive the full sync.
    const sorted = (t: string) => t.replace(/ expires \S+/g, '').split(/[\n,{}]/).map((l) => l.trim()).filter(Boolean).sort().join('\n');
    const once = save() + (mode === 'nftables' ? nftList() : '');
    await proxier.syncNow(true);
    expect(sorted(save() + (mode === 'nftables' ? nftList() : ''))).toBe(sorted(once));
    await proxier.stop();
    await proxier.cleanup();
    expect(save()).toBe(before);
  });
});
