/**
 * Traffic policies and terminating endpoints with real packets, in both
 * proxy modes: endpoints come from EndpointSlices (as inside `skiff node`),
 * whose nodeName tells this node's endpoints from another's. Both backend
 * pods sit on this node's bridge, so a "remote" one is only remote by its
 * slice: what the proxy chooses is what is tested, and every answer names the
 * pod that gave it. A DROP is a connection that times out.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import type { EndpointSlice } from 'kubernetes-types/discovery/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import type { SliceLike } from '../../src/proxy/endpoints.js';
import { processRunner } from '../../src/proxy/iptables.js';
import { Proxier, PROXY_MODES } from '../../src/proxy/proxier.js';
import { MemoryPodSource, MemoryServiceSource, type EndpointSliceSource } from '../../src/proxy/sources.js';
import { TestNetns } from '../helpers/netns.js';
import { serviceObject } from '../helpers/proxy-fixtures.js';

const isRoot = process.getuid?.() === 0;
const NODE = 'node-a';

const SERVER = `
const name = process.env.POD_NAME;
require('net').createServer((s) => { s.on('error', () => {}); s.end(name + '\\n'); }).listen(8080, '0.0.0.0');
`;

const CLIENT = `
const net = require('net');
const { HOST, PORT, COUNT } = process.env;
function tcp() {
  return new Promise((res) => {
    const s = net.connect({ host: HOST, port: +PORT });
    let d = '';
    const t = setTimeout(() => { s.destroy(); res('TIMEOUT'); }, 1200);
    s.on('data', (c) => (d += c));
    s.on('end', () => { clearTimeout(t); res(d.trim()); });
    s.on('error', (e) => { clearTimeout(t); res('ERR ' + e.code); });
  });
}
(async () => {
  const out = [];
  for (let i = 0; i < +COUNT; i++) out.push(await tcp());
  process.stdout.write(JSON.stringify(out));
})();
`;

function sh(argv: string[]): string {
  const r = spawnSync(argv[0]!, argv.slice(1), { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${argv.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

const IPS = { local: '10.244.0.11', remote: '10.244.0.12', client: '10.244.0.13' } as const;

interface Ep {
  ip: string;
  node: string;
  ready?: boolean;
  terminating?: boolean;
}

function slice(name: string, eps: Ep[]): SliceLike {
  return {
    addressType: 'IPv4',
    metadata: { namespace: 'demo', name: `${name}-abc`, labels: { 'kubernetes.io/service-name': name } },
    ports: [{ name: '', port: 8080, protocol: 'TCP' }],
    endpoints: eps.map((e) => ({
      addresses: [e.ip],
      nodeName: e.node,
      conditions: { ready: e.ready ?? true, serving: true, terminating: e.terminating ?? false },
    })) as EndpointSlice['endpoints'],
  };
}

describe.skipIf(!isRoot).each(PROXY_MODES)('traffic policies and terminating endpoints in %s mode', (mode) => {
  const node = new TestNetns();
  const pods = { local: new TestNetns(), remote: new TestNetns(), client: new TestNetns() };
  const servers: ChildProcess[] = [];
  const services = new MemoryServiceSource();
  const slices = new Map<string, SliceLike[]>();
  const listeners = new Set<(s?: string[]) => void>();
  const source: EndpointSliceSource = { slicesOf: (ns, name) => slices.get(`${ns}/${name}`) ?? [], onChange: (l) => (listeners.add(l), () => listeners.delete(l)), hasSynced: () => true };
  let proxier: Proxier;

  const setSlice = (name: string, eps: Ep[]) => {
    slices.set(`demo/${name}`, [slice(name, eps)]);
    for (const l of listeners) l([`demo/${name}`]);
  };

  async function connect(host: string, port: number, count: number): Promise<string[]> {
    const child = spawn('nsenter', [`--net=${pods.client.path}`, process.execPath, '-e', CLIENT], { env: { ...process.env, HOST: host, PORT: String(port), COUNT: String(count) }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    await new Promise((r) => child.on('close', r));
    return JSON.parse(out) as string[];
  }

  beforeAll(async () => {
    node.create();
    const inNode = (...a: string[]) => sh(['ip', '-n', node.name, ...a]);
    inNode('link', 'add', 'br0', 'type', 'bridge');
    inNode('addr', 'add', '10.244.0.1/24', 'dev', 'br0');
    inNode('link', 'set', 'br0', 'up');
    inNode('link', 'add', 'uplink0', 'type', 'veth', 'peer', 'name', 'uplink1');
    inNode('link', 'set', 'uplink0', 'up');
    inNode('link', 'set', 'uplink1', 'up');
    inNode('route', 'add', '10.96.0.0/12', 'dev', 'uplink0');
    sh(['nsenter', `--net=${node.path}`, 'sysctl', '-qw', 'net.ipv4.ip_forward=1']);
    sh(['nsenter', `--net=${node.path}`, 'sysctl', '-qw', 'net.bridge.bridge-nf-call-iptables=1']);
    let i = 0;
    for (const [name, ns] of Object.entries(pods) as Array<[keyof typeof IPS, TestNetns]>) {
      ns.create();
      const veth = `vq${i++}`;
      inNode('link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns.name);
      inNode('link', 'set', veth, 'master', 'br0', 'up');
      sh(['ip', '-n', ns.name, 'addr', 'add', `${IPS[name]}/24`, 'dev', 'eth0']);
      sh(['ip', '-n', ns.name, 'link', 'set', 'eth0', 'up']);
      sh(['ip', '-n', ns.name, 'route', 'add', 'default', 'via', '10.244.0.1']);
      if (name !== 'client') servers.push(spawn('nsenter', [`--net=${ns.path}`, process.execPath, '-e', SERVER], { env: { ...process.env, POD_NAME: name }, stdio: 'ignore' }));
    }
    for (const name of ['local', 'remote'] as const) {
      const deadline = Date.now() + 20_000;
      while ((await connect(IPS[name], 8080, 1))[0] !== name) {
        if (Date.now() > deadline) throw new Error(`server in ${name} did not come up`);
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    proxier = new Proxier({ mode, services, pods: new MemoryPodSource(), slices: { source, nodeName: NODE }, podCidr: '10.244.0.0/24', run: processRunner(['nsenter', `--net=${node.path}`]), netns: node.path, log: silentLogger });
    // Started, so it hears which Services' slices change (and syncs only those); syncNow() waits for the rules.
    proxier.start();
  });

  afterAll(async () => {
    await proxier?.stop();
    await proxier?.cleanup().catch(() => {});
    for (const s of servers) s.kill('SIGKILL');
    await Promise.all(servers.map((s) => (s.exitCode !== null || s.signalCode !== null ? undefined : new Promise((r) => s.once('exit', r)))));
    for (const ns of Object.values(pods)) await ns.destroy();
    await node.destroy();
  });

  it('internalTrafficPolicy Local: only this node\'s endpoint; DROP when it has none, though another node has one', async () => {
    services.set(serviceObject('demo', 'itp', { clusterIP: '10.96.0.30', selector: { app: 'x' }, internalTrafficPolicy: 'Local', ports: [{ port: 80, targetPort: 8080 }] }));
    setSlice('itp', [{ ip: IPS.remote, node: 'node-b' }]);
    await proxier.syncNow();
    expect(await connect('10.96.0.30', 80, 2)).toEqual(['TIMEOUT', 'TIMEOUT']);
    setSlice('itp', [
      { ip: IPS.local, node: NODE },
      { ip: IPS.remote, node: 'node-b' },
    ]);
    await proxier.syncNow();
    expect(await connect('10.96.0.30', 80, 12)).toEqual(Array(12).fill('local'));
  });

  it('with the Local policy, a local serving-terminating endpoint comes before DROP', async () => {
    setSlice('itp', [
      { ip: IPS.local, node: NODE, ready: false, terminating: true },
      { ip: IPS.remote, node: 'node-b' },
    ]);
    await proxier.syncNow();
    expect(await connect('10.96.0.30', 80, 6)).toEqual(Array(6).fill('local'));
    services.delete('demo', 'itp');
  });

  it('a serving-terminating endpoint serves only while no ready one is left (the last replica of a rolling update)', async () => {
    services.set(serviceObject('demo', 'roll', { clusterIP: '10.96.0.31', selector: { app: 'y' }, ports: [{ port: 80, targetPort: 8080 }] }));
    setSlice('roll', [{ ip: IPS.local, node: NODE, ready: false, terminating: true }]);
    await proxier.syncNow();
    expect(await connect('10.96.0.31', 80, 4)).toEqual(Array(4).fill('local'));
    setSlice('roll', [
      { ip: IPS.local, node: NODE, ready: false, terminating: true },
      { ip: IPS.remote, node: 'node-b' },
    ]);
    await proxier.syncNow();
    expect(await connect('10.96.0.31', 80, 10)).toEqual(Array(10).fill('remote'));
    // Without any endpoint left: refused at once, not dropped.
    setSlice('roll', []);
    await proxier.syncNow();
    expect((await connect('10.96.0.31', 80, 1))[0]).toBe('ERR ECONNREFUSED');
  });
});
