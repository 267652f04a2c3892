/**
 * `npm run bench -- proxy`: the proxier's syncs at 1,000, 5,000 and 10,000
 * Services (3 endpoints each), each into a fresh network namespace, next to
 * the floor: `iptables-restore --noflush` of the same text into an empty
 * namespace. Then, with 10,000 present, one added Service and one removed
 * endpoint (partial syncs).
 */
import { spawnSync } from 'node:child_process';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { silentLogger } from '../src/log.js';
import { processRunner, type CommandRunner } from '../src/proxy/iptables.js';
import { Proxier } from '../src/proxy/proxier.js';
import { assemble } from '../src/proxy/rules.js';
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
      if (argv.includes('iptables-restore')) text = input ?? '';
      return inner(argv, input);
    },
    last: () => text,
  };
}

function restoreFloor(text: string): number {
  const ns = new TestNetns().create();
  live.add(ns);
  try {
    const t0 = performance.now();
    const r = spawnSync('nsenter', [`--net=${ns.path}`, 'iptables-restore', '-w', '5', '--noflush'], { input: text });
    const ms = performance.now() - t0;
    if (r.status !== 0) throw new Error(`floor restore failed: ${r.stderr}`);
    return ms;
  } finally {
    spawnSync('ip', ['netns', 'del', ns.name]);
    live.delete(ns);
  }
}

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

export async function benchProxy(sizes = [1000, 5000, 10000]): Promise<void> {
  deleteOnSignal();
  process.stdout.write('proxy: full sync (render + iptables-restore) vs the floor (iptables-restore of the same text, empty netns)\n');
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
        `  ${String(n).padStart(6)} services: full sync ${fmt(full.ms)} (${full.restores} restores)  floor ${fmt(floor)}  ratio ${(full.ms / floor).toFixed(2)}  (${lines} lines)\n`,
      );
      if (n === sizes[sizes.length - 1]) {
        // Partial syncs, five of each: add a Service (3 endpoints), then remove one endpoint of an old one.
        const adds: number[] = [];
        const dels: number[] = [];
        let rules = [0, 0];
        for (let r = 0; r < 5; r++) {
          services.set(serviceObject('bench', `added-${r}`, { selector: { app: `added-${r}` }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }));
          for (let j = 0; j < 3; j++) pods.set(pod(`added-${r}-${j}`, { ns: 'bench', labels: { app: `added-${r}` }, ip: `10.127.${r}.${j + 1}` }));
          const add = await proxier.syncNow();
          pods.delete({ metadata: { namespace: 'bench', name: `p-${7 + r}-1` } } as Pod);
          const del = await proxier.syncNow();
          if (add.full || del.full) throw new Error('a partial sync was full');
          adds.push(add.ms);
          dels.push(del.ms);
          rules = [add.rulesWritten, del.rulesWritten];
        }
        const again = await proxier.syncNow(true);
        const rss = process.memoryUsage().rss / 2 ** 20;
        const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
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

if (import.meta.url === `file://${process.argv[1]}`) {
  const sizes = process.argv.slice(2).map(Number).filter((n) => n > 0);
  benchProxy(sizes.length ? sizes : undefined).catch((err) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  });
}
