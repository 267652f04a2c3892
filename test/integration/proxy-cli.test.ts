/**
 * `skiff proxy` as a process, standalone: Services from a manifest directory,
 * pods from a stand-in for kubelet-lite's watch API, rules in a network
 * namespace of the test's own, service DNS answering there, then
 * `skiff proxy --cleanup` leaving iptables-save and the nftables ruleset as
 * it found them. In both proxy modes, and a start in the other mode removes
 * the first one's rules.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../helpers/daemon.js';
import { TestNetns } from '../helpers/netns.js';
import { pod } from '../helpers/proxy-fixtures.js';
import { freePort, waitFor } from '../helpers/registry.js';

const isRoot = process.getuid?.() === 0;
const bin = path.join(repoRoot, 'bin', 'skiff.js');

const RESOLVE = `
const { Resolver } = require('dns').promises;
const r = new Resolver({ timeout: 1000, tries: 2 });
r.setServers([process.env.SERVER]);
r[process.env.METHOD || 'resolve4'](process.env.NAME).then((a) => process.stdout.write(JSON.stringify(a)), (e) => process.stdout.write(JSON.stringify(e.code)));
`;

describe.skipIf(!isRoot).each(['iptables', 'nftables'] as const)('skiff proxy (standalone process) in %s mode', (mode) => {
  const ns = new TestNetns();
  const client = new TestNetns();
  let dir = '';
  let proxy: ChildProcess | undefined;
  let kubelet: http.Server;
  const watchers: http.ServerResponse[] = [];
  const pods: Pod[] = [pod('web-1', { ns: 'demo', ip: '10.244.0.11' })];
  let before = '';
  let dnsPort = 0;
  let logs = '';

  const inNs = (argv: string[]) => spawnSync('nsenter', [`--net=${ns.path}`, ...argv], { encoding: 'utf8' });
  const save = () =>
    ['filter', 'nat']
      .map((t) => inNs(['iptables-save', '-t', t]).stdout)
      .join('')
      .split('\n')
      .filter((l) => !l.startsWith('#'))
      .map((l) => l.replace(/\[\d+:\d+\]$/, ''))
      .join('\n') + inNs(['nft', 'list', 'ruleset']).stdout.split('\ntable ').filter((t) => t.includes('kube-proxy')).join('\n');
  /** The rules of this file's mode, as text. */
  const rules = () => (mode === 'iptables' ? inNs(['iptables-save', '-t', 'nat']).stdout + inNs(['iptables-save', '-t', 'filter']).stdout : inNs(['nft', 'list', 'ruleset']).stdout);
  const startProxy = (m: string, kubeletPort: number) => {
    const child = spawn(
      'nsenter',
      [
        `--net=${ns.path}`,
        process.execPath,
        bin,
        'proxy',
        '--proxy-mode',
        m,
        '--manifests',
        path.join(dir, 'manifests'),
        '--kubelet',
        `http://127.0.0.1:${kubeletPort}`,
        '--pod-cidr',
        '10.244.0.0/24',
        '--min-sync-period',
        '100ms',
        '--dns-port',
        String(dnsPort),
        '--resolv-conf',
        path.join(dir, 'resolv.conf'),
        '--metrics-address',
        '',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    child.stderr!.on('data', (c) => (logs += c));
    return child;
  };
  let kubeletPort = 0;

  beforeAll(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-proxy-cli-'));
    ns.create();
    client.create();
    // The pod network: a bridge whose address (the first of --pod-cidr) is where DNS listens by default.
    const ip = (...a: string[]) => spawnSync('ip', a, { encoding: 'utf8' });
    ip('-n', ns.name, 'link', 'add', 'br0', 'type', 'bridge');
    ip('-n', ns.name, 'addr', 'add', '10.244.0.1/24', 'dev', 'br0');
    ip('-n', ns.name, 'link', 'set', 'br0', 'up');
    ip('-n', ns.name, 'link', 'add', 'vc0', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', client.name);
    ip('-n', ns.name, 'link', 'set', 'vc0', 'master', 'br0', 'up');
    ip('-n', client.name, 'addr', 'add', '10.244.0.13/24', 'dev', 'eth0');
    ip('-n', client.name, 'link', 'set', 'eth0', 'up');
    before = save();
    kubelet = http.createServer((req, res) => {
      if (req.url !== '/pods?watch=true') return void res.writeHead(404).end();
      res.writeHead(200, { 'Content-Type': 'application/json' });
      for (const p of pods) res.write(JSON.stringify({ type: 'ADDED', object: p }) + '\n');
      watchers.push(res);
    });
    kubeletPort = await freePort();
    await new Promise<void>((r) => kubelet.listen(kubeletPort, '127.0.0.1', r));
    await ns.bridgePort(kubeletPort, dir);
    await fs.mkdir(path.join(dir, 'manifests'));
    await fs.writeFile(
      path.join(dir, 'manifests', 'web.yaml'),
      'apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: demo}\nspec:\n  clusterIP: 10.96.0.20\n  selector: {app: web}\n  ports: [{name: http, port: 80, targetPort: 8080}]\n' +
        '---\napiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: demo}\nspec:\n  clusterIP: None\n  selector: {app: web}\n  ports: [{name: pg, port: 5432}]\n',
    );
    // The netns is the test's own, so DNS can take port 53; its resolv.conf names DNS itself,
    // which it must skip (never the host's /etc/resolv.conf: nothing leaves this machine).
    dnsPort = 53;
    await fs.writeFile(path.join(dir, 'resolv.conf'), 'nameserver 10.244.0.1\n');
    proxy = startProxy(mode, kubeletPort);
  });

  afterAll(async () => {
    if (proxy && proxy.exitCode === null && proxy.signalCode === null) {
      proxy.kill('SIGKILL');
      await new Promise((r) => proxy!.once('exit', r));
    }
    for (const w of watchers) w.destroy();
    await new Promise<void>((r) => {
      kubelet?.closeAllConnections();
      kubelet ? kubelet.close(() => r()) : r();
    });
    await client.destroy();
    await ns.destroy();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('programs a Service from the manifest directory with the pods from the watch, and a pod resolves its name', async () => {
    const dnat = mode === 'iptables' ? '--to-destination 10.244.0.11:8080' : 'dnat to 10.244.0.11:8080';
    await waitFor('the Service\'s rules', async () => rules().includes(dnat), 20_000).catch((err) => {
      throw new Error(`${err}\n${logs}`);
    });
    if (mode === 'iptables') {
      expect(rules()).toContain('-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "demo/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-');
    } else {
      expect(rules()).toMatch(/10\.96\.0\.20 \. tcp \. 80 : goto service-[A-Z2-7]{8}-demo\/web\/tcp\/http/);
      expect(inNs(['iptables-save', '-t', 'nat']).stdout).not.toContain('KUBE-');
    }
    // From a pod, at the pod network's gateway (the default --dns-address); headless too.
    const resolve = (name: string, method = 'resolve4') =>
      JSON.parse(
        spawnSync('nsenter', [`--net=${client.path}`, process.execPath, '-e', RESOLVE], {
          encoding: 'utf8',
          env: { ...process.env, SERVER: `10.244.0.1:${dnsPort}`, NAME: name, METHOD: method },
        }).stdout,
      ) as unknown;
    await waitFor('service DNS', async () => JSON.stringify(resolve('web.demo.svc.cluster.local')) === '["10.96.0.20"]', 20_000).catch((err) => {
      throw new Error(`${err}\n${logs}`);
    });
    expect(resolve('db.demo.svc.cluster.local')).toEqual(['10.244.0.11']);
    expect(resolve('nope.demo.svc.cluster.local')).toBe('ENOTFOUND');
    // The specification's other records: its version, and PTR for the cluster IP and the headless
    // pod, answered here; an unknown address in --pod-cidr is NXDOMAIN, not forwarded (which would be
    // REFUSED: the only nameserver is DNS itself).
    expect(resolve('dns-version.cluster.local', 'resolveTxt')).toEqual([['1.0.1']]);
    expect(resolve('10.96.0.20', 'reverse')).toEqual(['web.demo.svc.cluster.local']);
    expect(resolve('10.244.0.11', 'reverse')).toEqual(['10-244-0-11.db.demo.svc.cluster.local']);
    expect(resolve('99.0.244.10.in-addr.arpa', 'resolvePtr')).toBe('ENOTFOUND');
    expect(resolve('1.2.0.192.in-addr.arpa', 'resolvePtr')).toBe('EREFUSED');
    // Its only nameserver is itself: skipped with a warning, so other names are refused at once.
    expect(resolve('example.org')).toBe('EREFUSED');
    expect(logs).toMatch(/does not forward to itself.*"skipped":\["10\.244\.0\.1:53"\]/);
  });

  it('follows the watch and the directory: an unready pod and a removed manifest take the rules away', async () => {
    const unready = pod('web-1', { ns: 'demo', ip: '10.244.0.11', ready: false });
    for (const w of watchers) w.write(JSON.stringify({ type: 'MODIFIED', object: unready }) + '\n');
    const refused = mode === 'iptables' ? '"demo/web:http has no endpoints"' : '10.96.0.20 . tcp . 80 comment "demo/web:http" : goto reject-chain';
    await waitFor('the endpoint gone', async () => rules().includes(refused), 20_000);
    await fs.rm(path.join(dir, 'manifests', 'web.yaml'));
    await waitFor('the Service gone', async () => !save().includes('demo/web'), 20_000);
  });

  it('a start in the other mode removes this mode\'s rules; --cleanup leaves the rules as they were before the proxy ran', async () => {
    proxy!.kill('SIGTERM');
    const code = await new Promise<number | null>((r) => proxy!.once('exit', (c) => r(c)));
    expect(code).toBe(0);
    expect(save()).not.toBe(before); // the rules stay when the proxy stops
    const hasIptables = () => inNs(['iptables-save', '-t', 'nat']).stdout.includes(':KUBE-SERVICES');
    const hasNft = () => inNs(['nft', 'list', 'tables']).stdout.includes('table ip kube-proxy');
    expect(mode === 'iptables' ? hasIptables() : hasNft()).toBe(true);
    proxy = startProxy(mode === 'iptables' ? 'nftables' : 'iptables', kubeletPort);
    await waitFor('the other mode in place of this one', async () => (mode === 'iptables' ? hasNft() && !hasIptables() : hasIptables() && !hasNft()), 20_000).catch((err) => {
      throw new Error(`${err}\n${logs}`);
    });
    proxy.kill('SIGTERM');
    expect(await new Promise<number | null>((r) => proxy!.once('exit', (c) => r(c)))).toBe(0);
    const r = spawnSync('nsenter', [`--net=${ns.path}`, process.execPath, bin, 'proxy', '--cleanup'], { encoding: 'utf8' });
    expect(r.status).toBe(0);
    expect(save()).toBe(before);
  });
});
