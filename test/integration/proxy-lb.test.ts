/**
 * LoadBalancer Services (and externalIPs) in both proxy modes with real packets, inside network
 * namespaces this file creates: a "node" namespace with a pod bridge
 * (10.244.0.1) and one serving pod, and an "outside" namespace on a second
 * link of the node (the node is 192.168.77.1 there, the address ServiceLB
 * gives a load balancer) whose clients send from two addresses, 192.168.77.2
 * and 192.168.77.3, so loadBalancerSourceRanges is seen letting one in and
 * dropping the other. The health-check node port is asked over HTTP.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import http from 'node:http';
import type { Service } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { ServiceHealthServer } from '../../src/proxy/health-check.js';
import { processRunner } from '../../src/proxy/iptables.js';
import { Proxier, PROXY_MODES } from '../../src/proxy/proxier.js';
import { MemoryPodSource, MemoryServiceSource } from '../../src/proxy/sources.js';
import { TestNetns } from '../helpers/netns.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

const isRoot = process.getuid?.() === 0;

const SERVER = `
require('net').createServer((s) => { s.on('error', () => {}); s.end('p1 ' + s.remoteAddress + '\\n'); }).listen(8080, '0.0.0.0');
`;

// One TCP connection per run from LADDR; TIMEOUT when nothing answers (a DROP), ERR when refused.
const CLIENT = `
const net = require('net');
const { HOST, PORT, LADDR } = process.env;
const s = net.connect({ host: HOST, port: +PORT, localAddress: LADDR || undefined });
let d = '';
const t = setTimeout(() => { s.destroy(); process.stdout.write('TIMEOUT'); }, 1500);
s.on('data', (c) => (d += c));
s.on('end', () => { clearTimeout(t); process.stdout.write(d.trim()); });
s.on('error', (e) => { clearTimeout(t); process.stdout.write('ERR ' + e.code); });
`;

function sh(argv: string[]): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

const NODE_IP = '192.168.77.1';
const ALLOWED = '192.168.77.2';
const OTHER = '192.168.77.3';
const POD_IP = '10.244.0.11';

describe.skipIf(!isRoot).each(PROXY_MODES)('LoadBalancer Services in %s mode', (mode) => {
  const node = new TestNetns();
  const p1 = new TestNetns();
  const outside = new TestNetns();
  let server: ChildProcess | undefined;
  const services = new MemoryServiceSource();
  const pods = new MemoryPodSource();
  const health = new ServiceHealthServer({ address: '127.0.0.1', log: silentLogger });
  let proxier: Proxier;

  function connect(from: TestNetns, host: string, port: number, laddr?: string): Promise<string> {
    const child = spawn('nsenter', [`--net=${from.path}`, process.execPath, '-e', CLIENT], { env: { ...process.env, HOST: host, PORT: String(port), LADDR: laddr ?? '' }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    return new Promise((r) => child.on('close', () => r(out)));
  }

  function healthOf(port: number): Promise<{ status: number; body: Record<string, unknown> }> {
    return new Promise((resolve, reject) => {
      http.get({ host: '127.0.0.1', port, path: '/healthz' }, (res) => {
        let b = '';
        res.on('data', (c) => (b += c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(b) as Record<string, unknown> }));
      }).on('error', reject);
    });
  }

  const lb = (name: string, spec: Service['spec'], ingress = [{ ip: NODE_IP }]) => {
    const o = serviceObject('demo', name, { type: 'LoadBalancer', selector: { app: 'web' }, ports: [{ port: 80, targetPort: 8080 }], ...spec });
    (o.object as Record<string, unknown>).status = { loadBalancer: { ingress } };
    // The uid stands for the content (the proxy parses a Service again only when it changes): the status is content too.
    return { ...o, uid: createHash('sha256').update(JSON.stringify(o.object)).digest('hex').slice(0, 32) };
  };

  beforeAll(async () => {
    node.create();
    p1.create();
    outside.create();
    const inNode = (...a: string[]) => sh(['ip', '-n', node.name, ...a]);
    inNode('link', 'add', 'br0', 'type', 'bridge');
    inNode('addr', 'add', '10.244.0.1/24', 'dev', 'br0');
    inNode('link', 'set', 'br0', 'up');
    inNode('link', 'add', 'uplink0', 'type', 'veth', 'peer', 'name', 'uplink1');
    inNode('link', 'set', 'uplink0', 'up');
    inNode('link', 'set', 'uplink1', 'up');
    inNode('route', 'add', '10.96.0.0/12', 'dev', 'uplink0');
    sh(['nsenter', `--net=${node.path}`, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    inNode('link', 'add', 'vp0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', p1.name);
    inNode('link', 'set', 'vp0', 'master', 'br0', 'up');
    sh(['ip', '-n', p1.name, 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
    sh(['ip', '-n', p1.name, 'link', 'set', 'eth0', 'up']);
    sh(['ip', '-n', p1.name, 'route', 'add', 'default', 'via', '10.244.0.1']);
    // The node's second link: its address there is the load balancer's.
    inNode('link', 'add', 'ext0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', outside.name);
    inNode('addr', 'add', `${NODE_IP}/24`, 'dev', 'ext0');
    inNode('link', 'set', 'ext0', 'up');
    sh(['ip', '-n', outside.name, 'addr', 'add', `${ALLOWED}/24`, 'dev', 'eth0']);
    sh(['ip', '-n', outside.name, 'addr', 'add', `${OTHER}/24`, 'dev', 'eth0']);
    sh(['ip', '-n', outside.name, 'link', 'set', 'eth0', 'up']);
    server = spawn('nsenter', [`--net=${p1.path}`, process.execPath, '-e', SERVER], { stdio: 'ignore' });
    const deadline = Date.now() + 20_000;
    while (!(await connect(node, POD_IP, 8080)).startsWith('p1')) {
      if (Date.now() > deadline) throw new Error('the pod server did not come up');
      await new Promise((r) => setTimeout(r, 100));
    }
    pods.set(pod('p1', { ns: 'demo', ip: POD_IP, labels: { app: 'web' } }));
    proxier = new Proxier({ mode, services, pods, podCidr: '10.244.0.0/24', run: processRunner(['nsenter', `--net=${node.path}`]), netns: node.path, log: silentLogger, healthChecks: health });
  });

  afterAll(async () => {
    await proxier?.stop();
    await proxier?.cleanup().catch(() => {});
    await health.close();
    server?.kill('SIGKILL');
    if (server && server.exitCode === null && server.signalCode === null) await new Promise((r) => server!.once('exit', r));
    await p1.destroy();
    await outside.destroy();
    await node.destroy();
  });

  it('answers on the node address from the sources in loadBalancerSourceRanges and drops the others; no node port when allocateLoadBalancerNodePorts is false', async () => {
    services.set(lb('web', { clusterIP: '10.96.0.20', loadBalancerSourceRanges: [`${ALLOWED}/32`], allocateLoadBalancerNodePorts: false }));
    await proxier.syncNow();
    expect(proxier.problems()).toEqual([]);
    expect(await connect(outside, NODE_IP, 80, ALLOWED)).toMatch(/^p1 /);
    expect(await connect(outside, NODE_IP, 80, OTHER)).toBe('TIMEOUT');
    expect(await connect(outside, NODE_IP, 80, ALLOWED)).toMatch(/^p1 /);
    // The cluster IP is not behind the firewall: pods and the node reach it.
    expect(await connect(node, '10.96.0.20', 80)).toMatch(/^p1 /);
    if (mode === 'nftables') {
      const table = sh(['nsenter', `--net=${node.path}`, 'nft', 'list', 'table', 'ip', 'kube-proxy']);
      expect(table).toMatch(/192\.168\.77\.1 \. tcp \. 80 comment "demo\/web" : goto firewall-\S+-demo\/web\/tcp\//);
      expect(table).toMatch(/ip saddr != 192\.168\.77\.2 drop/);
      expect(table).not.toMatch(/map service-nodeports \{[^}]*elements/);
      return;
    }
    const nat = sh(['nsenter', `--net=${node.path}`, 'iptables-save', '-t', 'nat']);
    expect(nat).not.toMatch(/-A KUBE-NODEPORTS .*demo\/web/);
    expect(nat).toMatch(/-A KUBE-SERVICES -d 192.168.77.1\/32 -p tcp -m comment --comment "demo\/web loadbalancer IP" -m tcp --dport 80 -j KUBE-FW-/);
    expect(sh(['nsenter', `--net=${node.path}`, 'iptables-save', '-t', 'filter'])).toMatch(/-A KUBE-PROXY-FIREWALL -d 192.168.77.1\/32 -p tcp -m comment --comment "demo\/web traffic not accepted by KUBE-FW-\S+" -m tcp --dport 80 -j DROP/);
  });

  it('without source ranges every source reaches it, and its node port answers too', async () => {
    services.set(lb('web', { clusterIP: '10.96.0.20', ports: [{ port: 80, targetPort: 8080, nodePort: 30090 }] }));
    await proxier.syncNow();
    expect(await connect(outside, NODE_IP, 80, OTHER)).toMatch(/^p1 /);
    expect(await connect(outside, NODE_IP, 80, ALLOWED)).toMatch(/^p1 /);
    expect(await connect(outside, NODE_IP, 30090, OTHER)).toMatch(/^p1 /);
  });

  it('a Service that has no status ingress yet gets its cluster IP and node port only', async () => {
    services.set(lb('web', { clusterIP: '10.96.0.20', ports: [{ port: 80, targetPort: 8080, nodePort: 30090 }] }, []));
    await proxier.syncNow();
    expect(await connect(outside, NODE_IP, 30090, OTHER)).toMatch(/^p1 /);
    expect(await connect(outside, NODE_IP, 80, OTHER)).toMatch(/^ERR ECONNREFUSED/);
  });

  it('externalIPs (issue 28): answered for outside clients on an address routed to the node, masqueraded; Local keeps the client address; none without endpoints', async () => {
    services.set(serviceObject('demo', 'ext', { clusterIP: '10.96.0.22', selector: { app: 'web' }, externalIPs: [NODE_IP], ports: [{ port: 81, targetPort: 8080 }] }));
    await proxier.syncNow();
    expect(await connect(outside, NODE_IP, 81, OTHER)).toBe(`p1 10.244.0.1`);
    services.set(serviceObject('demo', 'ext', { clusterIP: '10.96.0.22', selector: { app: 'web' }, externalIPs: [NODE_IP], externalTrafficPolicy: 'Local', ports: [{ port: 81, targetPort: 8080 }] }));
    await proxier.syncNow();
    expect(await connect(outside, NODE_IP, 81, OTHER)).toBe(`p1 ${OTHER}`);
    services.set(serviceObject('demo', 'ext', { clusterIP: '10.96.0.22', selector: { app: 'none' }, externalIPs: [NODE_IP], ports: [{ port: 81, targetPort: 8080 }] }));
    await proxier.syncNow();
    expect(await connect(outside, NODE_IP, 81, OTHER)).toMatch(/^ERR ECONNREFUSED/);
    services.delete('demo', 'ext');
    await proxier.syncNow();
  });

  it('externalTrafficPolicy Local: the health-check node port says 200 with local endpoints and 503 without, as kube-proxy', async () => {
    services.delete('demo', 'web');
    services.set(lb('local', { clusterIP: '10.96.0.21', externalTrafficPolicy: 'Local', healthCheckNodePort: 31990 }));
    await proxier.syncNow();
    expect(health.ports()).toEqual([31990]);
    const up = await healthOf(31990);
    expect(up).toEqual({ status: 200, body: { service: { namespace: 'demo', name: 'local' }, localEndpoints: 1, serviceProxyHealthy: true } });
    // Local policy keeps the client's address.
    expect(await connect(outside, NODE_IP, 80, OTHER)).toBe(`p1 ${OTHER}`);
    pods.set(pod('p1', { ns: 'demo', ip: POD_IP, labels: { app: 'web' }, ready: false }));
    await proxier.syncNow();
    expect(await healthOf(31990)).toEqual({ status: 503, body: { service: { namespace: 'demo', name: 'local' }, localEndpoints: 0, serviceProxyHealthy: true } });
    services.delete('demo', 'local');
    await proxier.syncNow();
    expect(health.ports()).toEqual([]);
  });
});
