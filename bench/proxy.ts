/**
 * `npm run bench -- proxy [iptables|nftables] [sizes...]`: the proxier's
 * syncs at 1,000, 5,000 and 10,000 Services (3 endpoints each), in each mode
 * (both by default), each into a fresh network namespace, next to the floor:
 * the same text applied at once into an empty namespace
 * (`iptables-restore --noflush`, or `nft -f`). Then, with the largest number
 * present, one added Service and one removed endpoint (partial syncs).
 */
import { spawnSync } from 'node:child_process';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { silentLogger } from '../src/log.js';
import { processRunner, type CommandRunner } from '../src/proxy/iptables.js';
import { Proxier, PROXY_MODES, type ProxyMode } from '../src/proxy/proxier.js';
import { encodeOps } from '../src/proxy/nft-netlink.js';
import type { NftOp } from '../src/proxy/nft-rules.js';
import { assemble } from '../src/proxy/rules.js';
import { NfnetlinkSocket } from '../src/sys/nfnetlink.js';
import { MemoryPodSource, MemoryServiceSource } from '../src/proxy/sources.js';
import { TestNetns } from '../test/helpers/netns.js';
import { pod, serviceObject } from '../test/helpers/proxy-fixtures.js';

function fixtures(n: number) {
  const services = new MemoryServiceSource();
  const pods = new MemoryPodSource();
  for (let i = 0; i < n; i++) {
    services.set(serviceObject('bench', `svc-${i}`, { selector: { app: `a${i}` }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }));
    for (let j = 0; j < 3; j++) {
      const k = i * 3 + j;
      pods.set(pod(`p-${i}-${j}`, { ns: 'bench', labels: { app: `a${i}` }, ip: `10.${64 + (k >> 16)}.${(k >> 8) & 255}.${k & 255}` }));
    }
  }
  return { services, pods };
}

function recordingRunner(inner: CommandRunner): { run: CommandRunner; last: () => string } {
  let text = '';
  return {
    run: (argv, input) => {
      if (argv.includes('iptables-restore') || (argv[0] === 'nft' && argv[1] === '-f')) text = input ?? '';
      return inner(argv, input);
    },
    last: () => text,
  };
}

function restoreFloor(text: string, mode: ProxyMode = 'iptables'): number {
  const ns = new TestNetns().create();
  live.add(ns);
  try {
    const t0 = performance.now();
    const argv = mode === 'iptables' ? ['iptables-restore', '-w', '5', '--noflush'] : ['nft', '-f', '-'];
    const r = spawnSync('nsenter', [`--net=${ns.path}`, ...argv], { input: text, maxBuffer: 64 * 2 ** 20 });
    const ms = performance.now() - t0;
    if (r.status !== 0) throw new Error(`floor restore failed: ${r.stderr}`);
    return ms;
  } finally {
    spawnSync('ip', ['netns', 'del', ns.name]);
    live.delete(ns);
  }
}

/**
 * The latency of a new connection to a Service's cluster IP from the node's
 * namespace: the Service sorted last (the end of iptables' KUBE-SERVICES),
 * its endpoints' addresses on a link there with a listener, 200
 * connections one after another, each a new conntrack entry through the
 * nat rules. Median in microseconds.
 */
function firstPacketMicros(ns: TestNetns, proxier: Proxier): number {
  const svc = proxier.services().at(-1)!;
  const i = Number(svc.name.replace('svc-', ''));
  const ips = [0, 1, 2].map((j) => {
    const k = i * 3 + j;
    return `10.${64 + (k >> 16)}.${(k >> 8) & 255}.${k & 255}`;
  });
  const ip = (...a: string[]) => spawnSync('ip', ['-n', ns.name, ...a]);
  // A veth pair stands for the node's uplink (this kernel has no dummy links).
  ip('link', 'add', 'bench0', 'type', 'veth', 'peer', 'name', 'bench1');
  ip('link', 'set', 'bench0', 'up');
  ip('link', 'set', 'bench1', 'up');
  for (const a of ips) ip('addr', 'add', `${a}/32`, 'dev', 'bench0');
  ip('route', 'add', '10.96.0.0/12', 'dev', 'bench0');
  const script = `
const net = require('net');
const srv = net.createServer((s) => s.destroy()).listen(8080, '0.0.0.0', async () => {
  const t = [];
  for (let i = 0; i < 220; i++) {
    t.push(await new Promise((res) => {
      const t0 = process.hrtime.bigint();
      const c = net.connect({ host: process.env.HOST, port: 80 }, () => { res(Number(process.hrtime.bigint() - t0) / 1000); c.destroy(); });
      c.on('error', () => res(-1));
    }));
  }
  const ok = t.slice(20).filter((x) => x >= 0).sort((a, b) => a - b);
  process.stdout.write(String(ok.length ? ok[Math.floor(ok.length / 2)] : -1));
  srv.close();
});`;
  const r = spawnSync('nsenter', [`--net=${ns.path}`, process.execPath, '-e', script], { encoding: 'utf8', env: { ...process.env, HOST: svc.clusterIP! }, timeout: 60_000 });
  return Number(r.stdout);
}

const fmtUs = (us: number) => (us < 0 ? 'failed' : `${us.toFixed(0)} µs`);

const fmt = (ms: number) => `${ms.toFixed(0).padStart(6)} ms`;

const live = new Set<TestNetns>();
/** An interrupted run must not leave its namespaces behind. */
function deleteOnSignal(): void {
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      for (const ns of live) spawnSync('ip', ['netns', 'del', ns.name]);
      process.exit(130);
    });
  }
}

export async function benchProxy(sizes = [1000, 5000, 10000], modes: readonly ProxyMode[] = PROXY_MODES): Promise<void> {
  deleteOnSignal();
  if (modes.includes('iptables')) await benchIptables(sizes);
  if (modes.includes('nftables')) await benchNftables(sizes);
}

async function benchIptables(sizes: number[]): Promise<void> {
  process.stdout.write('proxy, iptables mode: full sync (render + iptables-restore) vs the floor (iptables-restore of the same text, empty netns)\n');
  for (const n of sizes) {
    const ns = new TestNetns().create();
    live.add(ns);
    try {
      const { services, pods } = fixtures(n);
      const rec = recordingRunner(processRunner(['nsenter', `--net=${ns.path}`]));
      const proxier = new Proxier({ services, pods, podCidr: '10.64.0.0/10', run: rec.run, log: silentLogger });
      const full = await proxier.syncNow();
      // The floor: the same rules as one text, restored at once into an empty namespace.
      const single = assemble({ ports: [...proxier.programmed().values()], stale: [] }).text;
      const lines = single.split('\n').length;
      const floor = restoreFloor(single);
      process.stdout.write(
        `  ${String(n).padStart(6)} services: full sync ${fmt(full.ms)} (${full.restores} restores)  floor ${fmt(floor)}  ratio ${(full.ms / floor).toFixed(2)}  (${lines} lines)  new connection to the last Service ${fmtUs(firstPacketMicros(ns, proxier))}\n`,
      );
      if (n === sizes[sizes.length - 1]) {
        const { adds, dels, rules } = await partialSyncs(proxier, services, pods);
        const again = await proxier.syncNow(true);
        const rss = process.memoryUsage().rss / 2 ** 20;
        process.stdout.write(`  at ${n}: one Service added: median ${fmt(med(adds))}, min ${fmt(Math.min(...adds))} (${rules[0]} rules)\n`);
        process.stdout.write(`  at ${n}: one endpoint removed: median ${fmt(med(dels))}, min ${fmt(Math.min(...dels))} (${rules[1]} rules)\n`);
        process.stdout.write(`  at ${n}: full resync over existing rules ${fmt(again.ms)}\n`);
        process.stdout.write(`  RSS with ${n} services: ${rss.toFixed(0)} MiB\n`);
      }
      await proxier.stop();
    } finally {
      await ns.destroy();
      live.delete(ns);
    }
  }
}

/** Eleven partial syncs of each kind: a Service added (3 endpoints), then one endpoint of an old one removed; their times and rule counts. */
async function partialSyncs(proxier: Proxier, services: ReturnType<typeof fixtures>['services'], pods: ReturnType<typeof fixtures>['pods'], first = 0): Promise<{ adds: number[]; dels: number[]; rules: number[]; via: Set<string> }> {
  const adds: number[] = [];
  const dels: number[] = [];
  const via = new Set<string>();
  let rules = [0, 0];
  for (let r = first; r < first + 11; r++) {
    services.set(serviceObject('bench', `added-${r}`, { selector: { app: `added-${r}` }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }));
    for (let j = 0; j < 3; j++) pods.set(pod(`added-${r}-${j}`, { ns: 'bench', labels: { app: `added-${r}` }, ip: `10.127.${r}.${j + 1}` }));
    const add = await proxier.syncNow();
    pods.delete({ metadata: { namespace: 'bench', name: `p-${7 + r}-1` } } as Pod);
    const del = await proxier.syncNow();
    if (add.full || del.full) throw new Error('a partial sync was full');
    adds.push(add.ms);
    dels.push(del.ms);
    for (const x of [add, del]) if (x.via) via.add(x.via);
    rules = [add.rulesWritten, del.rulesWritten];
  }
  return { adds, dels, rules, via };
}

const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function benchNftables(sizes: number[]): Promise<void> {
  process.stdout.write('proxy, nftables mode: full sync (render + nft -f) vs the floor (nft -f of the same text, empty netns)\n');
  for (const n of sizes) {
    const ns = new TestNetns().create();
    live.add(ns);
    try {
      const { services, pods } = fixtures(n);
      const rec = recordingRunner(processRunner(['nsenter', `--net=${ns.path}`]));
      // The namespace named: partial syncs go over netlink (full ones through nft -f all the same).
      const proxier = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.64.0.0/10', run: rec.run, netns: ns.path, log: silentLogger });
      const full = await proxier.syncNow();
      const text = rec.last();
      const floor = restoreFloor(text, 'nftables');
      process.stdout.write(
        `  ${String(n).padStart(6)} services: full sync ${fmt(full.ms)} (1 transaction, ${full.tables} table${full.tables === 1 ? '' : 's'})  floor ${fmt(floor)}  ratio ${(full.ms / floor).toFixed(2)}  (${text.split('\n').length} lines)  new connection to the last Service ${fmtUs(firstPacketMicros(ns, proxier))}\n`,
      );
      if (n === sizes[sizes.length - 1]) {
        const { adds, dels, rules, via } = await partialSyncs(proxier, services, pods);
        if (via.size !== 1 || !via.has('netlink')) throw new Error(`partial syncs went by ${[...via].join(' and ')}, not netlink`);
        // The floors of partial transactions on these tables, as netlink batches of their own: one map
        // element with a plain verdict, added then deleted; one with a goto, and one rule in a chain of
        // its own (the kernel checks a whole table for loops when a jump, goto or rule is added to it).
        const socket = NfnetlinkSocket.open(ns.path);
        const one = async (ops: NftOp[]) => {
          const t0 = performance.now();
          await socket.transact(encodeOps(ops));
          return performance.now() - t0;
        };
        const element = (verdict: string) => ({ op: 'add-element' as const, map: 'service-ips', elements: [{ key: '10.255.255.254 . tcp . 1', verdict }] });
        const unelement = { op: 'delete-element' as const, map: 'service-ips', elements: [{ key: '10.255.255.254 . tcp . 1', verdict: 'drop' }] };
        const floors: number[] = [];
        const gotoFloors: number[] = [];
        const ruleFloors: number[] = [];
        for (let r = 0; r < 5; r++) {
          floors.push(await one([element('drop')]));
          await one([unelement]);
          gotoFloors.push(await one([element('goto reject-chain')]));
          await one([unelement]);
          ruleFloors.push(await one([{ op: 'add-chain', chain: 'bench/floor' }, { op: 'add-rule', chain: 'bench/floor', rule: 'ip saddr 10.255.255.254 drop' }]));
          await one([{ op: 'flush-chain', chain: 'bench/floor' }, { op: 'delete-chain', chain: 'bench/floor' }]);
        }
        socket.close();
        const again = await proxier.syncNow(true);
        const rss = process.memoryUsage().rss / 2 ** 20;
        process.stdout.write(
          `  at ${n}: floor (netlink, into table kube-proxy, one of ${full.tables}): one map element: median ${fmt(med(floors))}; with a goto: median ${fmt(med(gotoFloors))}; one rule: median ${fmt(med(ruleFloors))}\n`,
        );
        process.stdout.write(`  at ${n}: one Service added: median ${fmt(med(adds))}, min ${fmt(Math.min(...adds))} (${rules[0]} rules and elements)\n`);
        process.stdout.write(`  at ${n}: one endpoint removed: median ${fmt(med(dels))}, min ${fmt(Math.min(...dels))} (${rules[1]} rules and elements)\n`);
        process.stdout.write(`  at ${n}: full resync over the existing table ${fmt(again.ms)}\n`);
        process.stdout.write(`  RSS with ${n} services: ${rss.toFixed(0)} MiB\n`);
        // The same partial syncs written through nft -f, by a proxier that is not told the namespace.
        await proxier.stop();
        const viaNft = new Proxier({ mode: 'nftables', services, pods, podCidr: '10.64.0.0/10', run: rec.run, log: silentLogger });
        await viaNft.syncNow();
        const t = await partialSyncs(viaNft, services, pods, 11);
        if (!t.via.has('nft') || t.via.size !== 1) throw new Error('the nft comparison did not go through nft');
        process.stdout.write(`  at ${n}: through nft -f instead of netlink: one Service added: median ${fmt(med(t.adds))}; one endpoint removed: median ${fmt(med(t.dels))} (ratio netlink/nft ${(med(adds) / med(t.adds)).toFixed(2)} and ${(med(dels) / med(t.dels)).toFixed(2)})\n`);
        await viaNft.stop();
      }
      await proxier.stop();
    } finally {
      await ns.destroy();
      live.delete(ns);
    }
  }
}

/** `proxy [iptables|nftables] [sizes...]` from the command line. */
export function proxyBenchArgs(args: string[]): { sizes?: number[]; modes?: ProxyMode[] } {
  const modes = args.filter((a): a is ProxyMode => (PROXY_MODES as readonly string[]).includes(a));
  const sizes = args.map(Number).filter((n) => Number.isInteger(n) && n > 0 && n <= 50_000);
  return { sizes: sizes.length ? sizes : undefined, modes: modes.length ? modes : undefined };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { sizes, modes } = proxyBenchArgs(process.argv.slice(2));
  benchProxy(sizes, modes).catch((err) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  });
}
