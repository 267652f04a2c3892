/**
 * The races and failures around pods that a kubelet runs into: RemoveImage
 * or RemovePodSandbox while a CreateContainer is under way, CNI DEL that
 * fails or has lost its cached result, two daemons on one host, readiness
 * when parts are missing, and image fs usage after removals. All through the
 * real socket, with the daemon in a network namespace of the test's own.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { mountsUnder, processesMentioning } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

let seq = 0;
function podConfig(dirs: DaemonDirs) {
  const n = `hpod${++seq}`;
  return {
    metadata: { name: n, namespace: 'test', uid: `uid-${n}-${randomBytes(3).toString('hex')}`, attempt: 0 },
    hostname: n,
    logDirectory: path.join(dirs.base, 'logs', n),
    labels: { pod: n },
    linux: {},
  };
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe.skipIf(!isRoot)('sandbox hardening: create races, CNI teardown, bridges, readiness, image fs usage', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let reg: string;
  let image: string;
  /** Files here make the bridge plugin wrapper fail: `fail-ADD`, `fail-DEL`. */
  let faults: string;
  const extra: SkiffProcess[] = [];
  const extraDirs: DaemonDirs[] = [];

  beforeAll(async () => {
    reg = inject('registryHost');
    await new Pusher(`http://${reg}`).image('test/hard-busybox', 'v1', await busyboxImage());
    image = `${reg}/test/hard-busybox:v1`;
    dirs = await makeDirs();
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    faults = path.join(dirs.base, 'faults');
    await fs.mkdir(faults);
    // A bridge plugin that fails on command; the other plugins come from the real directory.
    const wrapDir = path.join(dirs.base, 'cni-bin');
    await fs.mkdir(wrapDir);
    await fs.writeFile(
      path.join(wrapDir, 'bridge'),
      `#!/bin/sh\nif [ -e "${faults}/fail-$CNI_COMMAND" ]; then\n  printf '{"cniVersion":"1.0.0","code":11,"msg":"injected %s failure"}' "$CNI_COMMAND"\n  exit 1\nfi\nexec /usr/lib/cni/bridge "$@"\n`,
      { mode: 0o755 },
    );
    skiff = await new SkiffProcess(
      dirs,
      ['--cni-conf-dir', path.join(dirs.base, 'net.d'), '--cni-bin-dir', wrapDir, '--cni-bin-dir', '/usr/lib/cni'],
      (a) => ns.wrap(a),
    ).start();
    await skiff.images.PullImage({ image: { image } });
  });

  afterAll(async () => {
    await fs.rm(faults, { recursive: true, force: true }).catch(() => undefined);
    for (const d of [skiff, ...extra]) {
      if (!d?.child) continue;
      const pods = await d.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await d.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await d.stop();
    }
    await ns?.destroy();
    await sleep(200);
    const bases = [dirs, ...extraDirs].filter(Boolean).map((d) => d.base);
    const mounts = bases.flatMap((b) => mountsUnder(b));
    const procs = bases.flatMap((b) => processesMentioning(b));
    for (const b of bases) await fs.rm(b, { recursive: true, force: true });
    expect(mounts, 'mounts left behind').toEqual([]);
    expect(procs, 'processes left behind').toEqual([]);
  });

  async function runPod(d: SkiffProcess = skiff, dd: DaemonDirs = dirs) {
    const config = podConfig(dd);
    const { podSandboxId } = await d.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  /** Whether host-local holds an address for the pod (its reservation files name the pod's id). */
  async function addressHeld(id: string): Promise<boolean> {
    const dir = path.join(dirs.root, 'cni', 'ipam', 'skiff');
    for (const f of await fs.readdir(dir).catch(() => [] as string[])) {
      if (/^\d/.test(f) && (await fs.readFile(path.join(dir, f), 'utf8')).includes(id)) return true;
    }
    return false;
  }

  function iptablesSave(): string {
    const r = spawnSync('ip', ['netns', 'exec', ns.name, 'iptables-save', '-t', 'nat'], { encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`iptables-save: ${r.stderr}`);
    return r.stdout;
  }

  function cacheFile(id: string): string {
    return path.join(dirs.root, 'cni', 'cache', `${id}.json`);
  }

  async function removeRecord(podId: string): Promise<void> {
    const Database = (await import('better-sqlite3')).default;
    const db = new Database(path.join(dirs.root, 'metadata.db'));
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(podId);
    db.close();
  }

  it('a RemoveImage racing CreateContainer never takes the layers from under the new container', async () => {
    const marker = `marker ${randomBytes(6).toString('hex')}`;
    await new Pusher(`http://${reg}`).image('test/hard-race', 'v1', await busyboxImage({}, [{ name: 'race-marker', data: marker }]));
    const ref = `${reg}/test/hard-race:v1`;
    const snapshotsBefore = (await fs.readdir(path.join(dirs.root, 'snapshots'))).length;
    const pod = await runPod();
    const outcomes = { created: 0, notFound: 0 };
    for (let i = 0; i < 20; i++) {
      await skiff.images.PullImage({ image: { image: ref } });
      const startCreate = () =>
        skiff.runtime.CreateContainer({
          podSandboxId: pod.id,
          config: { metadata: { name: `race${i}` }, image: { image: ref }, command: ['sleep', '1000'], linux: {} },
          sandboxConfig: pod.config,
        });
      const startRemove = () => skiff.images.RemoveImage({ image: { image: ref } });
      // Spread the removal over the create's lifetime, from before its image look-up to after its commit.
      const removeFirst = i % 4 === 1;
      const jitter = () => sleep(i % 4 === 0 ? 0 : Math.floor(Math.random() * 25));
      const remove = removeFirst ? startRemove() : jitter().then(startRemove);
      const create = removeFirst ? sleep(Math.floor(Math.random() * 3)).then(startCreate) : startCreate();
      const [c, r] = await Promise.allSettled([create, remove]);
      expect(r.status, 'RemoveImage').toBe('fulfilled');
      if (c.status === 'rejected') {
        expect((c.reason as grpc.ServiceError).code, (c.reason as grpc.ServiceError).details).toBe(grpc.status.NOT_FOUND);
        outcomes.notFound++;
        continue;
      }
      outcomes.created++;
      const id = c.value.containerId!;
      await skiff.runtime.StartContainer({ containerId: id });
      const out = await skiff.runtime.ExecSync({ containerId: id, cmd: ['sh', '-c', 'cat /race-marker && ls /bin/busybox >/dev/null && echo " ok"'], timeout: 10 });
      expect(Buffer.from(out.stdout!).toString(), Buffer.from(out.stderr!).toString()).toBe(`${marker} ok\n`);
      await skiff.runtime.RemoveContainer({ containerId: id });
    }
    // Both sides of the race were taken: creates that won (and kept their layers) and creates that lost.
    expect(outcomes.created, JSON.stringify(outcomes)).toBeGreaterThan(0);
    expect(outcomes.notFound, JSON.stringify(outcomes)).toBeGreaterThan(0);
    // Nothing that only a create's hold kept survives: the marker layer went with the last user.
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    await waitFor('the race image\'s own snapshot to be collected', async () => (await fs.readdir(path.join(dirs.root, 'snapshots'))).length === snapshotsBefore || undefined);
  });

  it('a RemovePodSandbox racing CreateContainer leaves no container record and no rootfs mount', async () => {
    const codes = new Set<number>();
    let created = 0;
    for (let i = 0; i < 15; i++) {
      const pod = await runPod();
      const startCreate = () =>
        skiff.runtime.CreateContainer({
          podSandboxId: pod.id,
          config: { metadata: { name: 'racer' }, image: { image }, command: ['sleep', '1000'], linux: {} },
          sandboxConfig: pod.config,
        });
      const startRemove = () => skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
      // Either side may start first; the other lands at some point of its work.
      const removeFirst = i % 3 === 1;
      const remove = removeFirst ? startRemove() : sleep(i % 3 === 0 ? 0 : Math.floor(Math.random() * 20)).then(startRemove);
      const create = removeFirst ? sleep(Math.floor(Math.random() * 30)).then(startCreate) : startCreate();
      const [c, r] = await Promise.allSettled([create, remove]);
      expect(r.status, r.status === 'rejected' ? String(r.reason) : '').toBe('fulfilled');
      if (c.status === 'rejected') {
        const e = c.reason as grpc.ServiceError;
        expect([grpc.status.NOT_FOUND, grpc.status.FAILED_PRECONDITION], e.details).toContain(e.code);
        codes.add(e.code);
      } else {
        created++;
        expect((await codeOf(skiff.runtime.ContainerStatus({ containerId: c.value.containerId! }))).code).toBe(grpc.status.NOT_FOUND);
      }
      expect((await skiff.runtime.ListContainers({})).containers ?? []).toEqual([]);
      expect(mountsUnder(path.join(dirs.root, 'containers'))).toEqual([]);
      expect(await fs.readdir(path.join(dirs.root, 'containers'))).toEqual([]);
      expect(await fs.readdir(path.join(dirs.state, 'containers')).catch(() => [])).toEqual([]);
    }
    expect(created, 'no create won the race').toBeGreaterThan(0);
    expect(codes.size, 'no create lost the race').toBeGreaterThan(0);
  });

  it('a failed CNI DEL fails StopPodSandbox, and the retry succeeds once the fault is gone', async () => {
    const pod = await runPod();
    expect(await addressHeld(pod.id)).toBe(true);
    await fs.writeFile(path.join(faults, 'fail-DEL'), '');
    try {
      const err = await codeOf(skiff.runtime.StopPodSandbox({ podSandboxId: pod.id }));
      expect(err.code).toBe(grpc.status.INTERNAL);
      expect(err.details).toMatch(/tear down the network of pod sandbox .*CNI DEL with plugin bridge failed: injected DEL failure/);
      const removeErr = await codeOf(skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id }));
      expect(removeErr.code).toBe(grpc.status.INTERNAL);
      // Nothing was torn down that a retry needs: the address and the cached result remain.
      expect(await addressHeld(pod.id)).toBe(true);
      await fs.access(cacheFile(pod.id));
      expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id })).status?.state).toBe('SANDBOX_NOTREADY');
    } finally {
      await fs.rm(path.join(faults, 'fail-DEL'), { force: true });
    }
    await skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    expect(await addressHeld(pod.id)).toBe(false);
    await expect(fs.access(cacheFile(pod.id))).rejects.toThrow();
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    expect(mountsUnder(path.join(dirs.state, 'sandboxes', pod.id))).toEqual([]);
  });

  for (const damage of ['emptied', 'removed'] as const) {
    it(`releases an orphaned pod's network, and per-pod masquerade rules an older skiff wrote for it, when its cached CNI result was ${damage}`, async () => {
      const pod = await runPod();
      expect(await addressHeld(pod.id)).toBe(true);
      // The rules skiff wrote per pod before it masqueraded the whole pod CIDR (the bridge plugin's own chain name and comment).
      const chain = `CNI-${createHash('sha512').update(`skiff${pod.id}`).digest('hex').slice(0, 24)}`;
      const comment = `-m comment --comment "name: \\"skiff\\" id: \\"${pod.id}\\""`;
      const legacy = spawnSync('nsenter', [`--net=${ns.path}`, 'iptables-restore', '--noflush'], {
        input: `*nat\n:${chain} - [0:0]\n-A ${chain} -d 10.88.0.0/16 ${comment} -j ACCEPT\n-A ${chain} ! -d 224.0.0.0/4 ${comment} -j MASQUERADE\n-A POSTROUTING -s 10.88.0.200/32 ${comment} -j ${chain}\nCOMMIT\n`,
        encoding: 'utf8',
      });
      expect(legacy.status, legacy.stderr).toBe(0);
      expect(iptablesSave()).toContain(pod.id);
      await skiff.stop('SIGKILL');
      await removeRecord(pod.id);
      if (damage === 'emptied') await fs.writeFile(cacheFile(pod.id), '');
      else await fs.rm(cacheFile(pod.id));
      await skiff.start();
      expect(iptablesSave()).not.toContain(pod.id);
      expect(iptablesSave()).not.toContain(chain);
      expect(skiff.log).not.toContain('Unexpected end of JSON input');
      expect(skiff.log).not.toMatch(/CNI DEL for an orphaned pod failed/);
      await expect(fs.access(cacheFile(pod.id))).rejects.toThrow();
      expect(mountsUnder(path.join(dirs.state, 'sandboxes', pod.id))).toEqual([]);
      // Its address went back to the pool: host-local keeps no reservation for it.
      const ipam = await fs.readdir(path.join(dirs.root, 'cni', 'ipam', 'skiff')).catch(() => [] as string[]);
      for (const f of ipam) {
        if (!/^\d/.test(f)) continue;
        expect(await fs.readFile(path.join(dirs.root, 'cni', 'ipam', 'skiff', f), 'utf8')).not.toContain(pod.id);
      }
    });
  }

  it('a RunPodSandbox whose rollback DEL fails leaves no cache entry that fails at every start', async () => {
    await fs.writeFile(path.join(faults, 'fail-ADD'), '');
    await fs.writeFile(path.join(faults, 'fail-DEL'), '');
    try {
      const err = await codeOf(skiff.runtime.RunPodSandbox({ config: podConfig(dirs) }));
      expect(err.details).toMatch(/CNI ADD with plugin bridge failed: injected ADD failure/);
      expect(skiff.log).toMatch(/CNI DEL while undoing a failed RunPodSandbox failed/);
      const cached = (await fs.readdir(path.join(dirs.root, 'cni', 'cache')).catch(() => [] as string[])).filter((n) => n.endsWith('.json'));
      expect(cached).toEqual([]);
      await skiff.stop();
      await skiff.start();
      expect(skiff.log).not.toMatch(/CNI DEL for an orphaned pod/);
      expect(skiff.log).not.toMatch(/removing the remains of a pod sandbox/);
    } finally {
      await fs.rm(path.join(faults, 'fail-ADD'), { force: true });
      await fs.rm(path.join(faults, 'fail-DEL'), { force: true });
    }
  });

  it('gives two daemons in one network namespace two bridges, and refuses a second daemon on the same pod CIDR', async () => {
    const other = await makeDirs();
    extraDirs.push(other);
    await fs.mkdir(path.join(other.base, 'net.d'));
    const a = await runPod();
    // Same default CIDR as the first daemon, whose bridge now holds its gateway: not ready, and says why.
    const clashing = await new SkiffProcess(other, ['--cni-conf-dir', path.join(other.base, 'net.d')], (x) => ns.wrap(x)).start();
    extra.push(clashing);
    const net = (await clashing.runtime.Status({})).status!.conditions!.find((c) => c.type === 'NetworkReady')!;
    expect(net.status).toBe(false);
    expect(net.reason).toBe('NetworkPluginNotReady');
    expect(net.message).toMatch(/pod CIDR 10\.88\.0\.0\/16 is already used by 10\.88\.0\.1\/16 on skiff[0-9a-f]{8}/);
    const refused = await codeOf(clashing.runtime.RunPodSandbox({ config: podConfig(other) }));
    expect(refused.code).toBe(grpc.status.FAILED_PRECONDITION);
    expect(refused.details).toMatch(/give this daemon its own --pod-cidr/);
    await clashing.stop();
    const second = await new SkiffProcess(other, ['--cni-conf-dir', path.join(other.base, 'net.d'), '--pod-cidr', '10.77.0.0/24'], (x) => ns.wrap(x)).start();
    extra.push(second);
    expect((await second.runtime.Status({})).status!.conditions!.find((c) => c.type === 'NetworkReady')!.status).toBe(true);
    const b = await runPod(second, other);
    const bridgeOf = async (d: SkiffProcess) => JSON.parse((await d.runtime.Status({ verbose: true })).info!.config!).cniBridge as string;
    const [ba, bb] = [await bridgeOf(skiff), await bridgeOf(second)];
    expect(ba).toMatch(/^skiff[0-9a-f]{8}$/);
    expect(bb).toMatch(/^skiff[0-9a-f]{8}$/);
    expect(ba).not.toBe(bb);
    const bridges = spawnSync('ip', ['-n', ns.name, '-o', 'link', 'show', 'type', 'bridge'], { encoding: 'utf8' }).stdout;
    expect(bridges).toContain(`${ba}:`);
    expect(bridges).toContain(`${bb}:`);
    expect((await second.runtime.PodSandboxStatus({ podSandboxId: b.id })).status?.network?.ip).toMatch(/^10\.77\.0\.\d+$/);
    // Each daemon masquerades its own pod CIDR, through a chain of its own.
    const jumps = () => iptablesSave().split('\n').filter((l) => l.startsWith('-A POSTROUTING') && l.includes(' -j SKIFF-MASQ-'));
    expect(jumps().map((j) => /-s (\S+)/.exec(j)![1]).sort()).toEqual(['10.77.0.0/24', '10.88.0.0/16']);
    expect(new Set(jumps().map((j) => j.split(' -j ')[1])).size).toBe(2);
    // Removing one daemon's pod leaves the other's network alone.
    await second.runtime.RemovePodSandbox({ podSandboxId: b.id });
    expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: a.id })).status?.state).toBe('SANDBOX_READY');
    expect(await addressHeld(a.id)).toBe(true);
    expect(jumps()).toHaveLength(2);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: a.id });
    await second.stop();
  });

  it('reports NetworkReady false with a reason for missing plugins or only invalid configs, and RuntimeReady false without runc', async () => {
    const other = await makeDirs();
    extraDirs.push(other);
    const cond = async (d: SkiffProcess, type: string) => (await d.runtime.Status({})).status!.conditions!.find((c) => c.type === type)!;

    const noPlugins = await new SkiffProcess(other, ['--cni-bin-dir', path.join(other.base, 'empty-bin')]).start();
    try {
      const net = await cond(noPlugins, 'NetworkReady');
      expect(net.status).toBe(false);
      expect(net.reason).toBe('NetworkPluginNotReady');
      expect(net.message).toMatch(/CNI plugin "bridge"/);
    } finally {
      await noPlugins.stop();
    }

    const badConf = path.join(other.base, 'bad-net.d');
    await fs.mkdir(badConf);
    await fs.writeFile(path.join(badConf, '10-broken.conflist'), '{"cniVersion": "1.0.0", "name": "x", "plugins": [');
    const broken = await new SkiffProcess(other, ['--cni-conf-dir', badConf]).start();
    try {
      const net = await cond(broken, 'NetworkReady');
      expect(net.status).toBe(false);
      expect(net.reason).toBe('NetworkPluginNotReady');
      expect(net.message).toMatch(/10-broken\.conflist/);
      // And a pod is refused, not put on a network nobody configured.
      const err = await codeOf(broken.runtime.RunPodSandbox({ config: podConfig(other) }));
      expect(err.code).toBe(grpc.status.FAILED_PRECONDITION);
      expect(err.details).toMatch(/no valid CNI network config/);
      // No network was set up, so its rollback had nothing to undo (and no DEL to fail).
      expect(broken.log).not.toMatch(/CNI DEL while undoing/);
    } finally {
      await broken.stop();
    }

    // A PATH with every tool of the host but the OCI runtimes: the default handler is unavailable.
    const bin = path.join(other.base, 'bin-without-runc');
    await fs.mkdir(bin);
    for (const dir of ['/usr/sbin', '/usr/bin']) {
      for (const n of await fs.readdir(dir)) {
        if (n === 'runc' || n === 'crun') continue;
        await fs.symlink(path.join(dir, n), path.join(bin, n)).catch(() => undefined);
      }
    }
    const savedPath = process.env.PATH;
    process.env.PATH = bin;
    let noRunc: SkiffProcess | undefined;
    try {
      noRunc = await new SkiffProcess(other).start();
    } finally {
      process.env.PATH = savedPath;
    }
    try {
      const rt = await cond(noRunc, 'RuntimeReady');
      expect(rt.status).toBe(false);
      expect(rt.reason).toBe('RuntimeNotReady');
      expect(rt.message).toMatch(/runc/);
    } finally {
      await noRunc.stop();
    }
  });

  it('reports ImageFsInfo used bytes lower right after RemoveImage and after the last container on a removed image goes', async () => {
    const big = randomBytes(3 << 20);
    await new Pusher(`http://${reg}`).image('test/hard-fs', 'v1', await busyboxImage({}, [{ name: 'big.bin', data: big }]));
    const ref = `${reg}/test/hard-fs:v1`;
    const used = async () => Number((await skiff.images.ImageFsInfo({})).imageFilesystems![0]!.usedBytes!.value);
    const base = await used();
    await skiff.images.PullImage({ image: { image: ref } });
    const pulled = await used();
    expect(pulled - base).toBeGreaterThan(2 * big.length - 4096); // the blob and its unpacked snapshot
    await skiff.images.RemoveImage({ image: { image: ref } });
    expect(await used()).toBeLessThanOrEqual(base + 4096);

    // A container keeps the snapshot (not the blob) until it is removed.
    await skiff.images.PullImage({ image: { image: ref } });
    const pod = await runPod();
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name: 'fs-user' }, image: { image: ref }, command: ['sleep', '1000'], linux: {} },
      sandboxConfig: pod.config,
    });
    await skiff.images.RemoveImage({ image: { image: ref } });
    const held = await used();
    expect(held - base).toBeGreaterThan(big.length - 4096);
    expect(held - base).toBeLessThan(2 * big.length);
    await skiff.runtime.RemoveContainer({ containerId: containerId! });
    expect(await used()).toBeLessThanOrEqual(base + 4096);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });
});
