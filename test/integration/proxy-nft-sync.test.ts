/**
 * The nftables mode's partial syncs against the kernel: after any sequence
 * of Service and pod changes, the table that partial transactions left in
 * one network namespace is the table a fresh full sync writes into another
 * (as `nft list table` shows them, element order aside), whether the
 * partial syncs went through nft or as netlink batches. Seeded, so a
 * failure replays.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { processRunner } from '../../src/proxy/iptables.js';
import { Nft } from '../../src/proxy/nft.js';
import { opsText, portTable, type NftOp } from '../../src/proxy/nft-rules.js';
import { Proxier } from '../../src/proxy/proxier.js';
import { MemoryPodSource, MemoryServiceSource } from '../../src/proxy/sources.js';
import { TestNetns } from '../helpers/netns.js';
import { prng } from '../helpers/prng.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

const isRoot = process.getuid?.() === 0;

describe.skipIf(!isRoot)('nftables partial syncs', () => {
  const live: TestNetns[] = [];
  afterAll(async () => {
    for (const ns of live) await ns.destroy();
  });

  const nft = (ns: TestNetns, ...args: string[]) => {
    const r = spawnSync('nsenter', [`--net=${ns.path}`, 'nft', ...args], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`nft ${args.join(' ')}: ${r.stderr}`);
    return r.stdout;
  };
  /** The proxy's tables as text, each element, rule and declaration a line with its table's name, sorted; affinity entries (clients seen) left out. */
  const table = (ns: TestNetns) => {
    const names = nft(ns, 'list', 'tables', 'ip')
      .split('\n')
      .map((l) => /^table ip (kube-proxy(-\d+)?)$/.exec(l)?.[1])
      .filter((t): t is string => t !== undefined);
    return names
      .flatMap((t) =>
        nft(ns, 'list', 'table', 'ip', t)
          .replace(/elements = \{[^}]*expires[^}]*\}/g, '')
          .split(/[\n,{}]/)
          .map((l) => l.trim())
          .filter(Boolean)
          .map((l) => `${t}: ${l}`),
      )
      .sort()
      .join('\n');
  };

  /** The tables in `ns` are those a fresh proxier's full sync writes into a new namespace. */
  const expectAsFresh = async (ns: TestNetns, services: MemoryServiceSource, pods: MemoryPodSource, portsPerTable?: number) => {
    const fresh = new TestNetns().create();
    live.push(fresh);
    await new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: processRunner(['nsenter', `--net=${fresh.path}`]), portsPerTable, log: silentLogger }).syncNow();
    expect(table(ns)).toBe(table(fresh));
  };

  const setups = [
    { writer: 'nft', label: 'nft' },
    { writer: 'netlink', label: 'netlink' },
    // Each Service port its own share of tables: the count changes as Services come and go.
    { writer: 'netlink', label: 'netlink, Services spread over tables', portsPerTable: 1 },
  ] as const;
  for (const setup of setups) {
  const { writer } = setup;
  const portsPerTable = 'portsPerTable' in setup ? setup.portsPerTable : undefined;
  it(`leave the table a fresh full sync writes, after any sequence of changes (written by ${setup.label})`, async () => {
    const ns = new TestNetns().create();
    live.push(ns);
    const rand = prng(42);
    const pick = <T>(xs: T[]) => xs[Math.floor(rand() * xs.length)]!;
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    // With the namespace known, partial syncs go over netlink; the comparison is against nft's own full sync all the same.
    const netns = writer === 'netlink' ? ns.path : undefined;
    const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: processRunner(['nsenter', `--net=${ns.path}`]), netns, portsPerTable, log: silentLogger });
    const apps = ['a', 'b', 'c', 'd'];
    const names = Array.from({ length: 10 }, (_, i) => `p${i}`);
    let partial = 0;
    let written = 0; // partial syncs that changed something
    let compared = 0;
    let rich = 0; // comparisons with endpoint and local chains and affinity sets in the table
    const tableCounts = new Set<number>();
    let conflicts = 0; // syncs with a port written without an address another claim keeps
    for (let step = 0; step < 120; step++) {
      const r = rand();
      if (r < 0.25) {
        const app = pick(apps);
        const type = pick(['ClusterIP', 'NodePort', 'LoadBalancer'] as const);
        const o = serviceObject('ns1', `svc-${app}`, {
          selector: { app },
          type,
          clusterIP: `10.96.0.${apps.indexOf(app) + 10}`,
          sessionAffinity: rand() < 0.3 ? 'ClientIP' : 'None',
          ...(rand() < 0.3 ? { internalTrafficPolicy: 'Local' } : {}),
          ...(type !== 'ClusterIP' && rand() < 0.4 ? { externalTrafficPolicy: 'Local' } : {}),
          // External and load-balancer addresses claimed twice (by two Services, or another's cluster IP, or its own), on one port often.
          ...(rand() < 0.4 ? { externalIPs: [pick(['192.0.2.7', '10.96.0.10', `10.96.0.${apps.indexOf(app) + 10}`])] } : {}),
          ports: [{ name: 'http', port: rand() < 0.5 ? 80 : 80 + apps.indexOf(app), targetPort: rand() < 0.5 ? 'web' : 8080, protocol: rand() < 0.3 ? 'UDP' : 'TCP' }],
        });
        if (type === 'LoadBalancer') (o.object as Record<string, unknown>).status = { loadBalancer: { ingress: [{ ip: '192.0.2.9' }] } };
        services.set(o);
      } else if (r < 0.32) {
        services.delete('ns1', `svc-${pick(apps)}`);
      } else if (r < 0.85) {
        const name = pick(names);
        pods.set(pod(name, { ns: 'ns1', labels: { app: pick(apps) }, ip: `10.88.0.${names.indexOf(name) + 2}`, ready: rand() < 0.8, ports: [{ name: 'web', containerPort: 9000 }] }));
      } else {
        pods.delete(pod(pick(names), { ns: 'ns1' }));
      }
      const res = await proxier.syncNow();
      if (proxier.problems().some((p) => p.reason.startsWith('not answered on'))) conflicts++;
      if (res.tables) tableCounts.add(res.tables);
      if (!res.full) partial++;
      if (!res.full && res.rulesWritten > 0) {
        written++;
        expect(res.via).toBe(writer);
      }
      if (step % 10 === 9) {
        const fresh = new TestNetns().create();
        live.push(fresh);
        const other = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: processRunner(['nsenter', `--net=${fresh.path}`]), portsPerTable, log: silentLogger });
        await other.syncNow();
        const now = table(ns);
        expect(now, `step ${step}`).toBe(table(fresh));
        if (now.includes('chain endpoint-') && now.includes('chain local-') && now.includes('set affinity-')) rich++;
        await fresh.destroy();
        live.pop();
        compared++;
      }
    }
    expect(partial).toBeGreaterThan(80);
    expect(written).toBeGreaterThan(50);
    expect(compared).toBe(12);
    expect(rich).toBeGreaterThan(2);
    // Addresses were claimed twice at times, and the syncs all went through.
    expect(conflicts).toBeGreaterThan(5);
    // Spread: the count went up and down, each change a fresh table, and partial syncs ran at more than one table.
    if (portsPerTable) expect([...tableCounts].sort()).toEqual([1, 2, 4]);
    await proxier.stop();
  }, 120_000);
  }

  it('read every answer of a batch of 24,000 messages: written once, over netlink', async () => {
    const ns = new TestNetns().create();
    live.push(ns);
    const nft = (...args: string[]) => spawnSync('nsenter', [`--net=${ns.path}`, 'nft', ...args], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
    expect(nft('add', 'table', 'ip', 'kube-proxy').status).toBe(0);
    // The kernel queues an answer to each message; those that do not fit the receive buffer are dropped
    // (ENOBUFS) although the batch was applied. Sending the steps again through nft wrote every rule twice.
    const ops: NftOp[] = [];
    for (let i = 0; i < 12_000; i++) ops.push({ op: 'add-chain', chain: `c${i}` }, { op: 'add-rule', chain: `c${i}`, rule: 'drop' });
    const writer = new Nft(processRunner(['nsenter', `--net=${ns.path}`]), ns.path, Infinity);
    expect(await writer.applyOps(ops, () => opsText(ops))).toBe('netlink');
    writer.close();
    const listing = nft('list', 'table', 'ip', 'kube-proxy').stdout;
    expect(listing.match(/\bdrop\b/g)?.length).toBe(12_000);
    // By default a batch this large is not encoded on the event loop: nft writes it, once.
    expect(nft('delete', 'table', 'ip', 'kube-proxy').status).toBe(0);
    expect(nft('add', 'table', 'ip', 'kube-proxy').status).toBe(0);
    const byDefault = new Nft(processRunner(['nsenter', `--net=${ns.path}`]), ns.path);
    expect(await byDefault.applyOps(ops, () => opsText(ops))).toBe('nft');
    byDefault.close();
    expect(nft('list', 'table', 'ip', 'kube-proxy').stdout.match(/\bdrop\b/g)?.length).toBe(12_000);
  });

  it('write into the namespace at the path now, not one deleted from under the socket and made again there', async () => {
    const ns = new TestNetns().create();
    live.push(ns);
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: processRunner(['nsenter', `--net=${ns.path}`]), netns: ns.path, log: silentLogger });
    services.set(serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 9000 }] }));
    pods.set(pod('w2', { ns: 'ns1', labels: { app: 'web' }, ip: '10.88.0.2', ports: [{ name: 'web', containerPort: 9000 }] }));
    await proxier.syncNow();
    pods.set(pod('w3', { ns: 'ns1', labels: { app: 'web' }, ip: '10.88.0.3', ports: [{ name: 'web', containerPort: 9000 }] }));
    expect((await proxier.syncNow()).via).toBe('netlink'); // the socket is open
    // The namespace goes and another is made under the same name (a pod sandbox made again, a test's netns).
    expect(spawnSync('ip', ['netns', 'del', ns.name]).status).toBe(0);
    expect(spawnSync('ip', ['netns', 'add', ns.name]).status).toBe(0);
    pods.set(pod('w4', { ns: 'ns1', labels: { app: 'web' }, ip: '10.88.0.4', ports: [{ name: 'web', containerPort: 9000 }] }));
    // The new namespace has no table: the partial sync fails there (it was written to the old one, unseen) and the next is full.
    for (let i = 0; i < 2; i++) await proxier.syncNow().catch(() => undefined);
    await expectAsFresh(ns, services, pods);
    await proxier.stop();
  }, 60_000);

  it('notice a further table someone deleted on the next partial sync, even one that changes only another table', async () => {
    const ns = new TestNetns().create();
    live.push(ns);
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const opts = { mode: 'nftables' as const, services, pods, podCidr: '10.88.0.0/16', portsPerTable: 1, log: silentLogger };
    const proxier = new Proxier({ ...opts, run: processRunner(['nsenter', `--net=${ns.path}`]), netns: ns.path });
    // Four one-port Services (four tables); the one changed later is in kube-proxy, another table is deleted.
    const names = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'];
    const mainName = names.find((n) => portTable(`ns1/${n}`, 4) === 'kube-proxy')!;
    const otherName = names.find((n) => portTable(`ns1/${n}`, 4) !== 'kube-proxy')!;
    const chosen = [mainName, otherName, ...names.filter((n) => n !== mainName && n !== otherName).slice(0, 2)];
    chosen.forEach((n, i) => services.set(serviceObject('ns1', n, { clusterIP: `10.96.0.${10 + i}`, selector: { app: n }, ports: [{ port: 80, targetPort: 9000 }] })));
    pods.set(pod('w1', { ns: 'ns1', labels: { app: otherName }, ip: '10.88.0.2' }));
    expect((await proxier.syncNow()).tables).toBe(4);
    const nft = (...args: string[]) => spawnSync('nsenter', [`--net=${ns.path}`, 'nft', ...args], { encoding: 'utf8' });
    expect(nft('delete', 'table', 'ip', portTable(`ns1/${otherName}`, 4)).status).toBe(0);
    pods.set(pod('w2', { ns: 'ns1', labels: { app: mainName }, ip: '10.88.0.3' }));
    await expect(proxier.syncNow()).rejects.toThrow(/No such file|ENOENT/);
    expect((await proxier.syncNow()).full).toBe(true);
    await expectAsFresh(ns, services, pods, 1);
    await proxier.stop();
  }, 60_000);

  it('recover when someone else deleted a chain the proxier wrote: the sync after the failure makes the table afresh', async () => {
    const ns = new TestNetns().create();
    live.push(ns);
    const services = new MemoryServiceSource();
    const pods = new MemoryPodSource();
    const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.88.0.0/16', run: processRunner(['nsenter', `--net=${ns.path}`]), netns: ns.path, log: silentLogger });
    services.set(serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 9000 }] }));
    const pods2 = [2, 3].map((i) => pod(`w${i}`, { ns: 'ns1', labels: { app: 'web' }, ip: `10.88.0.${i}`, ports: [{ name: 'web', containerPort: 9000 }] }));
    for (const p of pods2) pods.set(p);
    await proxier.syncNow();
    // Someone empties the service chain and deletes one endpoint chain; then that endpoint goes.
    const nft = (...args: string[]) => spawnSync('nsenter', [`--net=${ns.path}`, 'nft', ...args], { encoding: 'utf8' });
    const chains = nft('list', 'chains', 'ip').stdout;
    const svcChain = /chain (service-\S+ns1\/web\S*)/.exec(chains)![1]!;
    const epChain = /chain (endpoint-\S+__10\.88\.0\.3\S*)/.exec(chains)![1]!;
    expect(nft('flush', 'chain', 'ip', 'kube-proxy', svcChain).status).toBe(0);
    expect(nft('delete', 'chain', 'ip', 'kube-proxy', epChain).status).toBe(0);
    pods.delete(pods2[1]!);
    await expect(proxier.syncNow()).rejects.toThrow(/No such file|ENOENT/); // the partial sync flushes the chain that is gone
    const retry = await proxier.syncNow();
    expect(retry.full).toBe(true);
    await expectAsFresh(ns, services, pods);
    await proxier.stop();
  }, 60_000);
});
