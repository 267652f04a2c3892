/**
 * Crash consistency: the daemon is killed with SIGKILL at random moments of a
 * pull, a RunPodSandbox, a CreateContainer, a StartContainer or a removal,
 * as a node losing power or an OOM kill would. In half the rounds its own
 * in-flight children (runc, CNI plugins, unshare) die with it, as they do
 * when the service manager kills its cgroup; in the others they run to their
 * end with no daemon to hear of it. conmon, which detaches, always survives.
 * After each restart the database must agree with the disk, and once every
 * pod is removed through the API nothing of theirs may remain: no mount, no
 * netns pin, veth, IPAM address, iptables rule, cgroup, runc state, conmon.
 *
 * The moments come from a seeded PRNG: the seed is printed, and
 * SKIFF_CRASH_SEED replays a run; SKIFF_CRASH_ROUNDS sets the round count.
 */
import Database from 'better-sqlite3';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { mountsUnder, processesMentioning } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';
import { prng } from '../helpers/prng.js';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface ProcInfo {
  pid: number;
  ppid: number;
  state: string;
  comm: string;
}

function processes(): ProcInfo[] {
  const out: ProcInfo[] = [];
  for (const n of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(n)) continue;
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/${n}/stat`, 'utf8');
    } catch {
      continue;
    }
    const close = stat.lastIndexOf(')');
    const comm = stat.slice(stat.indexOf('(') + 1, close);
    const [state, ppid] = stat.slice(close + 2).split(' ');
    out.push({ pid: Number(n), ppid: Number(ppid), state: state!, comm });
  }
  return out;
}

/** The daemon's descendants, except conmon and what runs under it. */
function descendantsButConmon(root: number): number[] {
  const all = processes();
  const out: number[] = [];
  const walk = (pid: number) => {
    for (const p of all) {
      if (p.ppid !== pid || p.comm === 'conmon') continue;
      out.push(p.pid);
      walk(p.pid);
    }
  };
  walk(root);
  return out;
}

const ID = /^[a-f0-9]{64}$/;
const ls = (d: string) => (fs.existsSync(d) ? fs.readdirSync(d) : []);

describe.skipIf(!isRoot)('crash consistency: SIGKILL at random moments, then restart and reconcile', () => {
  const seed = Number(process.env.SKIFF_CRASH_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const rounds = Number(process.env.SKIFF_CRASH_ROUNDS ?? 60);
  const rand = prng(seed);
  let dirs: DaemonDirs;
  let ns: TestNetns;
  let skiff: SkiffProcess;
  let image: string;
  const cgroupParent = `/skiff-crash-${randomBytes(4).toString('hex')}`;
  let args: string[];
  let seq = 0;

  const start = async () => {
    skiff = await new SkiffProcess(dirs, args, (a) => ns.wrap(a)).start();
  };

  beforeAll(async () => {
    console.log(`crash-consistency seed=${seed} rounds=${rounds} (replay with SKIFF_CRASH_SEED=${seed})`);
    const reg = inject('registryHost');
    await new Pusher(`http://${reg}`).image('test/crash-busybox', 'v1', await busyboxImage());
    image = `${reg}/test/crash-busybox:v1`;
    dirs = await makeDirs();
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fsp.mkdir(path.join(dirs.base, 'net.d'));
    args = ['--cni-conf-dir', path.join(dirs.base, 'net.d')];
    await start();
    await skiff.images.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (skiff?.child && skiff.child.exitCode === null) {
      const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await skiff.stop();
    }
    await ns?.destroy();
    await sleep(200);
    const mounts = dirs ? mountsUnder(dirs.base) : [];
    const procs = dirs ? processesMentioning(dirs.base) : [];
    for (const m of mounts.reverse()) spawnSync('umount', ['-l', m]);
    for (const c of cgroupDirs(true)) spawnSync('rmdir', [c]);
    if (dirs) await fsp.rm(dirs.base, { recursive: true, force: true });
    expect(mounts, 'mounts left behind').toEqual([]);
    expect(procs, 'processes left behind').toEqual([]);
  });

  function podConfig() {
    const n = `crash${++seq}`;
    return {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 },
      hostname: n,
      logDirectory: path.join(dirs.base, 'logs', n),
      // Every other pod runs without an infra process (pid CONTAINER, as the kubelet asks by default).
      linux: { cgroupParent, securityContext: { namespaceOptions: { pid: seq % 2 ? ('CONTAINER' as const) : ('POD' as const) } } },
    };
  }

  function containerConfig(n: string) {
    return { metadata: { name: n }, image: { image }, command: ['sleep', '1000'], logPath: `${n}.log`, linux: {} };
  }

  /** The pod cgroups (or, with `self`, the parent too) under every controller. */
  function cgroupDirs(self = false): string[] {
    const out: string[] = [];
    for (const ctl of ls('/sys/fs/cgroup')) {
      const d = path.join('/sys/fs/cgroup', ctl, cgroupParent);
      if (!fs.existsSync(d)) continue;
      for (const n of ls(d)) if (n.startsWith('skiff-') && fs.statSync(path.join(d, n)).isDirectory()) out.push(path.join(d, n));
      if (self) out.push(d);
    }
    return out;
  }

  function inNs(cmd: string[]): string {
    const r = spawnSync('ip', ['netns', 'exec', ns.name, ...cmd], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`${cmd.join(' ')}: ${r.stderr}`);
    return r.stdout;
  }

  /** The database and the disk agree: every record has its dirs, every dir its record. */
  function checkDbAgreesWithDisk(where: string): void {
    const db = new Database(path.join(dirs.root, 'metadata.db'), { readonly: true, fileMustExist: true });
    try {
      const containers = new Set((db.prepare('SELECT id FROM containers').all() as Array<{ id: string }>).map((r) => r.id));
      const sandboxes = new Set((db.prepare('SELECT id FROM sandboxes').all() as Array<{ id: string }>).map((r) => r.id));
      const snapshots = new Set((db.prepare('SELECT id FROM snapshots').all() as Array<{ id: number }>).map((r) => String(r.id)));
      const images = db.prepare('SELECT id, chain_ids, blobs FROM images').all() as Array<{ id: string; chain_ids: string; blobs: string }>;
      const chains = new Set((db.prepare('SELECT chain_id FROM snapshots').all() as Array<{ chain_id: string }>).map((r) => r.chain_id));
      const problems: string[] = [];
      const onDisk = (d: string) => new Set(ls(d).filter((n) => ID.test(n)));
      for (const [label, dir, want] of [
        ['container dir', path.join(dirs.root, 'containers'), containers],
        ['container bundle', path.join(dirs.state, 'containers'), containers],
        ['sandbox dir', path.join(dirs.state, 'sandboxes'), sandboxes],
      ] as const) {
        const have = onDisk(dir);
        for (const id of want) if (!have.has(id)) problems.push(`${label} of record ${id} is missing`);
        for (const id of have) if (!want.has(id)) problems.push(`${label} ${id} has no record`);
      }
      const snapDirs = new Set(ls(path.join(dirs.root, 'snapshots')));
      for (const id of snapshots) if (!snapDirs.has(id)) problems.push(`snapshot ${id} has a record but no dir`);
      for (const id of snapDirs) if (!snapshots.has(id)) problems.push(`snapshot dir ${id} has no record`);
      for (const img of images) {
        for (const c of JSON.parse(img.chain_ids) as string[]) if (!chains.has(c)) problems.push(`image ${img.id} lacks snapshot ${c}`);
      }
      const ingest = ls(path.join(dirs.root, 'content', 'ingest'));
      if (ingest.length) problems.push(`ingest files left: ${ingest.join(', ')}`);
      const work = ls(path.join(dirs.root, 'snapshots-work'));
      if (work.length) problems.push(`unpack work dirs left: ${work.join(', ')}`);
      expect(problems, `${where}: database and disk disagree`).toEqual([]);
    } finally {
      db.close();
    }
  }

  /** With no pod left, nothing of any pod may remain. */
  async function checkNoPodRemains(where: string): Promise<void> {
    const problems: string[] = [];
    const sandboxesMount = path.join(dirs.state, 'sandboxes');
    for (const m of mountsUnder(dirs.base)) if (m !== sandboxesMount) problems.push(`mount ${m}`);
    for (const l of inNs(['ip', '-o', 'link', 'show', 'type', 'veth']).split('\n').filter(Boolean)) problems.push(`veth ${l}`);
    const ipamDir = path.join(dirs.root, 'cni', 'ipam', 'skiff');
    for (const f of ls(ipamDir)) if (/^\d+\.\d+\.\d+\.\d+$/.test(f)) problems.push(`IPAM address ${f} still allocated`);
    for (const f of ls(path.join(dirs.root, 'cni', 'cache'))) problems.push(`CNI cache ${f}`);
    for (const l of inNs(['iptables-save']).split('\n')) if (/id: "[a-f0-9]{64}"/.test(l)) problems.push(`iptables ${l}`);
    for (const c of cgroupDirs()) problems.push(`cgroup ${c}`);
    for (const rt of ls(path.join(dirs.state, 'runtimes'))) for (const s of ls(path.join(dirs.state, 'runtimes', rt))) problems.push(`${rt} state ${s}`);
    for (const p of processesMentioning(dirs.base)) if (!/ cri --socket |socat /.test(p)) problems.push(`process ${p.trim()}`);
    for (const f of ls(path.join(dirs.state, 'exits'))) problems.push(`exit file ${f}`);
    for (const f of ls(path.join(dirs.state, 'attach'))) problems.push(`attach link ${f}`);
    expect(problems, `${where}: left behind with no pod`).toEqual([]);
  }

  function zombiesOfDaemon(): ProcInfo[] {
    const pid = skiff.child.pid!;
    return processes().filter((p) => p.ppid === pid && p.state === 'Z');
  }

  /**
   * Kills the daemon. With `tree`, its in-flight children die with it (a
   * service manager killing the cgroup); without, they run on to the end
   * of what they were doing (killing the main process only), and the
   * restart must cope with what they finished after the daemon's death.
   */
  async function crash(tree: boolean): Promise<void> {
    const pid = skiff.child.pid!;
    const kids = descendantsButConmon(pid);
    // Without `tree`, only the daemon's own children are waited for: a `runc run --detach`
    // leaves the pod's infra process running below it, as it should.
    const direct = new Set(processes().filter((p) => p.ppid === pid).map((p) => p.pid));
    const awaited = tree ? kids : kids.filter((k) => direct.has(k));
    skiff.closeClients();
    process.kill(pid, 'SIGKILL');
    for (const k of tree ? kids : []) {
      try {
        process.kill(k, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    await skiff.exit;
    // The killed children's own children (a runc init mid-create) are orphans now: let them die too.
    await waitFor('the killed daemon\'s children to exit', async () => awaited.every((k) => !fs.existsSync(`/proc/${k}`)) || undefined, 30_000);
  }

  async function readyPod(): Promise<{ id: string; config: ReturnType<typeof podConfig> }> {
    const config = podConfig();
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  type Op = 'pull' | 'runPod' | 'create' | 'start' | 'stopPod' | 'removePod' | 'removeContainer';
  const ops: Op[] = ['pull', 'runPod', 'create', 'start', 'stopPod', 'removePod', 'removeContainer'];

  /** Sets up what `op` needs and returns the operation itself, not yet started. */
  async function prepare(op: Op): Promise<() => Promise<unknown>> {
    switch (op) {
      case 'pull':
        await skiff.images.RemoveImage({ image: { image } });
        return () => skiff.images.PullImage({ image: { image } });
      case 'runPod':
        return () => readyPod();
      case 'create': {
        const pod = await readyPod();
        return () => skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig('c'), sandboxConfig: pod.config });
      }
      case 'start':
      case 'stopPod':
      case 'removePod':
      case 'removeContainer': {
        const pod = await readyPod();
        const { containerId } = await skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig('c'), sandboxConfig: pod.config });
        if (op === 'start') return () => skiff.runtime.StartContainer({ containerId: containerId! });
        await skiff.runtime.StartContainer({ containerId: containerId! });
        if (op === 'stopPod') return () => skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
        if (op === 'removePod') return () => skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
        return () => skiff.runtime.RemoveContainer({ containerId: containerId! });
      }
    }
  }

  /** How long each operation takes here, measured once, so the kills land inside it. */
  const durations = new Map<Op, number>();

  async function removeAllPods(): Promise<void> {
    const pods = await skiff.runtime.ListPodSandbox({});
    for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! });
  }

  it(`keeps the database and the disk in agreement and leaks nothing, over ${rounds} crashes`, { timeout: 900_000 }, async () => {
    for (const op of ops) {
      const run = await prepare(op);
      const t0 = Date.now();
      await run();
      durations.set(op, Date.now() - t0);
      await removeAllPods();
      if (op === 'pull') continue;
    }
    console.log(`crash-consistency operation times (ms): ${JSON.stringify(Object.fromEntries(durations))}`);
    const tally: Record<string, { ok: number; failed: number }> = {};
    for (let round = 0; round < rounds; round++) {
      const op = ops[Math.floor(rand() * ops.length)]!;
      const delay = Math.floor(rand() * (durations.get(op)! * 1.2 + 5));
      const tree = rand() < 0.5;
      const where = `round ${round} (seed ${seed}): kill ${delay}ms into ${op}${tree ? ' with its children' : ', children left to finish'}`;
      const run = await prepare(op);
      const call = run().then(
        () => 'ok' as const,
        () => 'failed' as const,
      );
      await sleep(delay);
      await crash(tree);
      const outcome = await call;
      (tally[op] ??= { ok: 0, failed: 0 })[outcome === 'ok' ? 'ok' : 'failed']++;
      await start();
      checkDbAgreesWithDisk(where);
      // What the kubelet does next: it retries, or removes what it no longer wants.
      if ((await skiff.images.ImageStatus({ image: { image } })).image == null) await skiff.images.PullImage({ image: { image } });
      const { containers } = await skiff.runtime.ListContainers({});
      const running = (containers ?? []).filter((c) => c.state === 'CONTAINER_RUNNING');
      await removeAllPods();
      for (const c of running) expect(zombiesOfDaemon().map((z) => z.pid), `${where}: zombies after container ${c.id} stopped`).toEqual([]);
      checkDbAgreesWithDisk(`${where}, after removing every pod`);
      await checkNoPodRemains(where);
    }
    console.log(`crash-consistency outcomes of the interrupted calls: ${JSON.stringify(tally)}`);
    // A stop after the last crash: conmons of this daemon's containers must have been reaped.
    const pod = await readyPod();
    const { containerId } = await skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: containerConfig('z'), sandboxConfig: pod.config });
    await skiff.runtime.StartContainer({ containerId: containerId! });
    await skiff.runtime.StopContainer({ containerId: containerId!, timeout: 0 });
    await sleep(300);
    expect(zombiesOfDaemon(), 'zombie processes of the daemon').toEqual([]);
    await removeAllPods();
    await checkNoPodRemains('at the end');
  });
});
