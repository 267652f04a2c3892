/**
 * `npm run bench -- netpol [changes]`: issue 25's NetworkPolicy case, 500
 * policies over 1,000 pods, time from a label change to the rule in force
 * (target ≤ 100 ms).
 *
 * The real parts: the node's NetworkPolicyController over a real API store
 * (localClient, as the unit tests build it), real `nft -f` into a network
 * namespace this bench creates. "In force" is judged by real packets, not by
 * reading the table back: a probe process in the namespace sends a UDP
 * datagram every millisecond from a pod's address to another pod's address
 * (both on lo, so each datagram passes the table's input chain, where the
 * egress rules judge it) and records which arrived; a change's latency is
 * the send time of the first datagram on the new side of the change
 * (arrived after an allow, lost after a block), less the time just before
 * the API update. Resolution: the send interval (about 1 ms).
 *
 * Three cases, 20 changes each by default, alternating block and allow:
 * - a pod's label moves it into and out of an egress-deny policy's
 *   selection: only set elements change (the controller writes a delta);
 * - a pod's label moves it into and out of the peers of an egress rule
 *   with a named port: the named port's set of `address . port` changes
 *   (a delta too);
 * - the policy with the named port is edited (its port becomes a number
 *   no pod listens on, and back): the rules change, so the whole table is
 *   written again, every policy's rules in one transaction.
 * Next to each, the floor measured in the same run by the same probe: an
 * `nft -f` of one element add (and delete) into the same table, through the
 * same nsenter. And a profile: API update → the controller's nft call
 * (watch delivery, model and render) and the nft call itself.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import readline from 'node:readline';
import { localClient, type ApiClient } from '../src/api/client.js';
import { nodeKinds } from '../src/api/kinds/index.js';
import { Store } from '../src/api/store.js';
import { silentLogger } from '../src/log.js';
import { buildModel } from '../src/netpol/model.js';
import { renderDelta, renderRules } from '../src/netpol/render.js';
import { NetworkPolicyController, policyPod } from '../src/node/network-policy.js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { NetworkPolicy } from 'kubernetes-types/networking/v1.js';
import { run, type Runner } from '../src/sys/run.js';
import { TestNetns } from '../test/helpers/netns.js';

const POLICIES = 'networkpolicies.networking.k8s.io';
const NAMESPACES = 10;
const PODS = 1000;
const POLICY_COUNT = 500;
/** The probe's two pods: the sender (fenced for egress) and the receiver (a peer with a named port). */
const SRC = '10.98.0.2';
const DST = '10.99.0.1';
const PORT = 9000;

/** The probe, run inside the namespace: sends, receives, and answers "when did the change take" questions on stdin. */
const PROBE = `
const dgram = require('dgram');
const readline = require('readline');
const sent = [];
const got = [];
const rx = dgram.createSocket('udp4');
const tx = dgram.createSocket('udp4');
rx.on('message', (m) => { got[m.readUInt32BE(0)] = true; });
rx.bind(${PORT}, '${DST}', () => tx.bind(0, '${SRC}', () => {
  const buf = Buffer.alloc(4);
  setInterval(() => { const s = sent.length; sent.push(process.hrtime.bigint()); buf.writeUInt32BE(s); tx.send(buf, ${PORT}, '${DST}'); }, 1);
  process.stdout.write('ready\\n');
}));
// "<t0 ns> allow|block": the first datagram sent at or after t0 from which on all arrived (allow) or none did (block), once that has held for 100 ms.
readline.createInterface({ input: process.stdin }).on('line', (line) => {
  const [t0s, want] = line.split(' ');
  const t0 = BigInt(t0s);
  const deadline = Date.now() + 15000;
  const check = () => {
    let first = sent.findIndex((t) => t >= t0);
    if (first >= 0) {
      const now = process.hrtime.bigint();
      if (want === 'allow') {
        let lost = first - 1;
        for (let i = first; i < sent.length && sent[i] < now - 20000000n; i++) if (!got[i]) lost = i;
        const s = lost + 1;
        if (s < sent.length && now - sent[s] > 100000000n) return process.stdout.write(String(Number(sent[s] - t0) / 1e6) + '\\n');
      } else {
        let last = -1;
        for (let i = sent.length - 1; i >= first; i--) if (got[i]) { last = i; break; }
        const s = last + 1 > first ? last + 1 : first;
        if (s < sent.length && now - sent[s] > 100000000n) return process.stdout.write(String(Number(sent[s] - t0) / 1e6) + '\\n');
      }
    }
    if (Date.now() > deadline) return process.stdout.write('timeout\\n');
    setTimeout(check, 20);
  };
  check();
});
`;

class Probe {
  private readonly child: ChildProcess;
  private readonly lines: string[] = [];
  private waiter: (() => void) | undefined;

  constructor(ns: TestNetns) {
    this.child = spawn('nsenter', [`--net=${ns.path}`, process.execPath, '-e', PROBE], { stdio: ['pipe', 'pipe', 'inherit'] });
    readline.createInterface({ input: this.child.stdout! }).on('line', (l) => {
      this.lines.push(l);
      this.waiter?.();
    });
  }

  private async line(): Promise<string> {
    while (this.lines.length === 0) await new Promise<void>((r) => (this.waiter = r));
    this.waiter = undefined;
    return this.lines.shift()!;
  }

  async ready(): Promise<void> {
    if ((await this.line()) !== 'ready') throw new Error('the probe did not start');
  }

  /** Milliseconds from t0 to the first datagram on the `want` side. */
  async since(t0: bigint, want: 'allow' | 'block'): Promise<number> {
    this.child.stdin!.write(`${t0} ${want}\n`);
    const l = await this.line();
    if (l === 'timeout') throw new Error(`the probe never saw the change to ${want} (15 s)`);
    return Number(l);
  }

  stop(): void {
    this.child.kill('SIGKILL');
  }
}

const podIp = (k: number) => `10.88.${k >> 8}.${k & 255}`;

async function fixtures(client: ApiClient): Promise<void> {
  for (let n = 0; n < NAMESPACES; n++) await client.create('namespaces', '', { metadata: { name: `ns-${n}`, labels: { team: `t${n % 3}` } } });
  await client.create('namespaces', '', { metadata: { name: 'probe' } });
  const addPod = async (ns: string, name: string, labels: Record<string, string>, ip: string, port = 8080, protocol = 'TCP') => {
    const pod = await client.create('pods', ns, { metadata: { name, labels }, spec: { containers: [{ name: 'c', image: 'busybox', ports: [{ name: 'http', containerPort: port, protocol }] }] } });
    await client.update('pods', ns, name, { ...pod, status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] } }, { status: true });
  };
  for (let k = 0; k < PODS - 2; k++) await addPod(`ns-${k % NAMESPACES}`, `p-${k}`, { app: `a${k % 50}`, tier: `t${k % 5}` }, podIp(k));
  await addPod('probe', 'src', { role: 'free' }, SRC);
  await addPod('probe', 'dst', { app: 'none' }, DST, PORT, 'UDP');
  // 498 policies over the 998 pods: ingress by pod label on a port; every 5th from a namespace selector, every 10th on the named port.
  for (let j = 0; j < POLICY_COUNT - 2; j++) {
    const from = j % 5 === 0 ? { namespaceSelector: { matchLabels: { team: `t${j % 3}` } }, podSelector: { matchLabels: { tier: `t${j % 5}` } } } : { podSelector: { matchLabels: { tier: `t${(j + 1) % 5}` } } };
    const ports = j % 10 === 0 ? [{ port: 'http' }] : [{ port: 8000 + (j % 100), protocol: 'TCP' }];
    await client.create(POLICIES, `ns-${j % NAMESPACES}`, { metadata: { name: `pol-${j}` }, spec: { podSelector: { matchLabels: { app: `a${j % 50}` } }, ingress: [{ from: [from], ports }] } });
  }
  // The probe's two: pods labelled role=fenced have no egress but to pods app=target on their named port "http".
  await client.create(POLICIES, 'probe', { metadata: { name: 'fence' }, spec: { podSelector: { matchLabels: { role: 'fenced' } }, policyTypes: ['Egress'] } });
  await client.create(POLICIES, 'probe', { metadata: { name: 'to-target' }, spec: { podSelector: { matchLabels: { role: 'fenced' } }, policyTypes: ['Egress'], egress: [{ to: [{ podSelector: { matchLabels: { app: 'target' } } }], ports: [{ port: 'http', protocol: 'UDP' }] }] } });
}

async function relabel(client: ApiClient, name: string, labels: Record<string, string>): Promise<void> {
  const pod = await client.get('pods', 'probe', name);
  await client.update('pods', 'probe', name, { ...pod, metadata: { ...pod.metadata, labels } });
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};
const fmt = (ms: number) => `${ms.toFixed(1).padStart(6)} ms`;
const line = (what: string, xs: number[]) => `  ${what.padEnd(58)} p50 ${fmt(pct(xs, 50))}  p99 ${fmt(pct(xs, 99))}  max ${fmt(Math.max(...xs))}  (n=${xs.length})\n`;

interface NftCall {
  start: bigint;
  end: bigint;
  bytes: number;
  delta: boolean;
}

export async function benchNetpol(changes = 20): Promise<void> {
  const ns = new TestNetns().create();
  const cleanup = () => spawnSync('ip', ['netns', 'del', ns.name]);
  const onSignal = () => {
    cleanup();
    process.exit(130);
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const store = new Store({ kinds: nodeKinds('node-a') });
  let controller: NetworkPolicyController | undefined;
  let probe: Probe | undefined;
  try {
    for (const a of [SRC, DST]) spawnSync('ip', ['-n', ns.name, 'addr', 'add', `${a}/32`, 'dev', 'lo']);
    const calls: NftCall[] = [];
    const failures: string[] = [];
    const runner: Runner = async (cmd, args, opts) => {
      const start = process.hrtime.bigint();
      const r = await run('nsenter', [`--net=${ns.path}`, cmd, ...args], opts);
      const text = String(opts?.input ?? '');
      calls.push({ start, end: process.hrtime.bigint(), bytes: text.length, delta: !text.includes('chain ') });
      if (r.code !== 0) failures.push(r.stderr.trim().split('\n').slice(0, 3).join(' | '));
      return r;
    };
    const client = localClient(store);
    process.stdout.write(`netpol: ${POLICY_COUNT} policies over ${PODS} pods, label change → rule in force (real packets), ${changes} changes per case\n`);
    const t0 = performance.now();
    await fixtures(client);
    controller = new NetworkPolicyController({ client, log: silentLogger, runner, retryMs: 60_000 });
    await controller.start();
    const table = spawnSync('nsenter', [`--net=${ns.path}`, 'nft', 'list', 'table', 'inet', 'skiff-netpol'], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
    if (table.status !== 0) throw new Error(`no table after start: ${table.stderr}`);
    const rules = table.stdout.split('\n').filter((l) => /(accept|return|drop) comment/.test(l)).length;
    const sets = table.stdout.split('\n').filter((l) => /^\s+set /.test(l)).length;
    process.stdout.write(`  fixtures and first write: ${(performance.now() - t0).toFixed(0)} ms; table: ${rules} rules, ${sets} sets, ${calls.at(-1)!.bytes} bytes of nft input\n`);

    probe = new Probe(ns);
    await probe.ready();
    // Not fenced yet: the datagrams pass.
    await probe.since(process.hrtime.bigint(), 'allow');

    /** One label change and its times: to in force (probe), to the controller's nft call, and that call. */
    const measure = async (change: () => Promise<void>, want: 'allow' | 'block') => {
      const before = calls.length;
      const t = process.hrtime.bigint();
      await change();
      const ms = await probe!.since(t, want).catch((err: Error) => {
        throw new Error(`${err.message}${failures.length > 0 ? `; the controller's nft write failed: ${failures[0]}` : ''}`);
      });
      await controller!.idle();
      if (failures.length > 0) throw new Error(`the controller's nft write failed: ${failures[0]}`);
      const mine = calls.slice(before);
      if (mine.length === 0) throw new Error('the change wrote nothing');
      return { ms, toCall: Number(mine[0]!.start - t) / 1e6, nft: Number(mine[0]!.end - mine[0]!.start) / 1e6, delta: mine.every((c) => c.delta), writes: mine.length };
    };

    const runCase = async (name: string, change: (on: boolean) => Promise<void>, onIs: 'allow' | 'block') => {
      const ms: number[] = [];
      const toCall: number[] = [];
      const nft: number[] = [];
      const kinds = new Set<string>();
      for (let i = 0; i < changes; i++) {
        const turnOn = i % 2 === 0;
        const want = turnOn ? onIs : onIs === 'allow' ? 'block' : 'allow';
        const r = await measure(() => change(turnOn), want);
        ms.push(r.ms);
        toCall.push(r.toCall);
        nft.push(r.nft);
        kinds.add(r.delta ? 'element delta' : 'whole table');
        if (r.writes > 1) kinds.add(`${r.writes} writes`);
      }
      process.stdout.write(line(`${name} (${[...kinds].join(', ')}): in force`, ms));
      process.stdout.write(line('    of which API update → controller calls nft', toCall));
      process.stdout.write(line('    of which the nft -f call', nft));
    };

    // The floor: one element add (a block) and delete (an allow) with nft -f through the same nsenter, judged by the same probe.
    const floors: number[] = [];
    const floorCalls: number[] = [];
    for (let i = 0; i < changes; i++) {
      const add = i % 2 === 0;
      const t = process.hrtime.bigint();
      const r = await run('nsenter', [`--net=${ns.path}`, 'nft', '-f', '-'], { input: `${add ? 'add' : 'delete'} element inet skiff-netpol egress_isolated { ${SRC} }\n` });
      const end = process.hrtime.bigint();
      if (r.code !== 0) throw new Error(`floor nft -f failed: ${r.stderr}`);
      floors.push(await probe.since(t, add ? 'block' : 'allow'));
      floorCalls.push(Number(end - t) / 1e6);
    }
    process.stdout.write(line('floor: nft -f of one element into the table: in force', floors));
    process.stdout.write(line('    of which the nft -f call', floorCalls));

    const label = (pod: string, on: Record<string, string>, off: Record<string, string>) => (turnOn: boolean) => relabel(client, pod, turnOn ? on : off);
    await runCase('src into/out of an egress-deny selection', label('src', { role: 'fenced' }, { role: 'free' }), 'block');
    // src stays fenced; dst moves in and out of the named-port rule's peers.
    const t = process.hrtime.bigint();
    await relabel(client, 'src', { role: 'fenced' });
    await probe.since(t, 'block');
    await controller.idle();
    await runCase('dst into/out of a named-port egress rule', label('dst', { app: 'target' }, { app: 'none' }), 'allow');
    // dst stays a peer; the policy's port moves between its name and a number nothing listens on.
    const t1 = process.hrtime.bigint();
    await relabel(client, 'dst', { app: 'target' });
    await probe.since(t1, 'allow');
    await controller.idle();
    const editPolicy = async (port: string | number) => {
      const p = await client.get(POLICIES, 'probe', 'to-target');
      await client.update(POLICIES, 'probe', 'to-target', { ...p, spec: { ...(p.spec as object), egress: [{ to: [{ podSelector: { matchLabels: { app: 'target' } } }], ports: [{ port, protocol: 'UDP' }] }] } });
    };
    await runCase('the named-port policy edited', async (on) => editPolicy(on ? PORT + 1 : 'http'), 'block');

    // The controller's own work alone, over the same objects: the model, then a delta and the whole table.
    const pods = (await client.list('pods')).items.map((o) => policyPod(o as unknown as Pod)!).filter(Boolean);
    const policies = (await client.list(POLICIES)).items as unknown as NetworkPolicy[];
    const namespaces = (await client.list('namespaces')).items.map((n) => ({ name: n.metadata.name ?? '', labels: n.metadata.labels ?? {} }));
    const models: number[] = [];
    const deltas: number[] = [];
    const wholes: number[] = [];
    let prev = buildModel(policies, pods, namespaces);
    for (let i = 0; i < changes; i++) {
      const moved = pods.map((p) => (p.name === 'src' ? { ...p, labels: { role: i % 2 === 0 ? 'free' : 'fenced' } } : p));
      const a = performance.now();
      const next = buildModel(policies, moved, namespaces);
      const b = performance.now();
      if (renderDelta(prev, next) === undefined) throw new Error('a label change was not a delta');
      const c = performance.now();
      renderRules(next);
      wholes.push(performance.now() - c);
      models.push(b - a);
      deltas.push(c - b);
      prev = next;
    }
    process.stdout.write(line('the controller alone: the model of 500 policies, 1,000 pods', models));
    process.stdout.write(line('    its delta against the last', deltas));
    process.stdout.write(line('    the whole table rendered', wholes));
  } finally {
    probe?.stop();
    controller?.stop();
    store.close();
    cleanup();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  benchNetpol(Number(process.argv[2]) || 20).catch((err) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  });
}
