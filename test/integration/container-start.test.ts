/**
 * The daemon's own steps of a pod start. RunPodSandbox makes the pod's
 * namespaces in-process (no helper), leaving every daemon thread in its own.
 * StartContainer's hand-off to the container's init (runc's exec fifo, read
 * by skiff itself): a started container is one runc reports running; an
 * init that died between create and start fails the call with a clear
 * error and leaves nothing behind; a process that cannot exec after the
 * start signal ends as an exited container. The daemon's runc is a wrapper
 * around the real one that kills the init right after `runc create` when
 * the container's spec asks for it (an env var), as an OOM kill or an
 * operator's kill -9 in that window would.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawn, spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { leftBehind, processesMentioning } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

const KILL_MARK = 'SKIFF_TEST_KILL_INIT_BEFORE_START=1';

describe.skipIf(!isRoot)('pod start: in-process namespaces, and the start signal handed to the init by the daemon', () => {
  let dirs: DaemonDirs | undefined;
  let ns: TestNetns | undefined;
  let skiff: SkiffProcess | undefined;
  let image = '';
  let runcRoot = '';
  let seq = 0;

  beforeAll(async () => {
    const registryHost = inject('registryHost');
    // A file that is executable by its mode but by nothing else: exec(2) fails with ENOEXEC.
    const img = await busyboxImage({}, [{ name: 'bin/not-a-program', data: Buffer.from('\x00\x01 not an executable\n'), mode: 0o755 }]);
    await new Pusher(`http://${registryHost}`).image('test/busybox-start', 'v1', img);
    image = `${registryHost}/test/busybox-start:v1`;
    dirs = await makeDirs();
    ns = new TestNetns().create();
    await ns.bridgePort(Number(registryHost.split(':')[1]), dirs.base);
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    const real = spawnSync('sh', ['-c', 'command -v runc'], { encoding: 'utf8' }).stdout.trim();
    expect(real).not.toBe('');
    const binDir = path.join(dirs.base, 'bin');
    await fs.mkdir(binDir);
    await fs.writeFile(
      path.join(binDir, 'runc'),
      [
        '#!/bin/sh',
        'bundle= pidfile= prev=',
        'for a in "$@"; do',
        '  case "$prev" in --bundle|-b) bundle=$a ;; --pid-file) pidfile=$a ;; esac',
        '  prev=$a',
        'done',
        `${real} "$@" || exit $?`,
        'case " $* " in',
        `  *" create "*) if [ -n "$bundle" ] && grep -q '${KILL_MARK}' "$bundle/config.json"; then kill -9 "$(cat "$pidfile")"; fi ;;`,
        'esac',
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns!.wrap(['env', `PATH=${binDir}:${process.env.PATH}`, ...a])).start();
    await skiff.images.PullImage({ image: { image } });
    runcRoot = path.join(dirs.state, 'runtimes', 'runc');
  });

  afterAll(async () => {
    let leaks: { mounts: string[]; processes: string[] } | undefined;
    try {
      if (skiff) {
        const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
        for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
        await skiff.stop();
      }
    } finally {
      await ns?.destroy();
      if (dirs) {
        leaks = await leftBehind(dirs.base);
        await fs.rm(dirs.base, { recursive: true, force: true });
      }
    }
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  /** A pod without an infra process (pid CONTAINER, as a kubelet asks by default) and one container in it. */
  async function podWith(command: string[], envs: Array<{ key: string; value: Buffer }> = [], hostname = '') {
    const n = `st${++seq}`;
    const config = {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}-${randomBytes(3).toString('hex')}`, attempt: 0 },
      hostname,
      logDirectory: path.join(dirs!.base, 'logs', n),
      linux: { securityContext: { namespaceOptions: { pid: 'CONTAINER' as const } } },
    };
    const podId = (await skiff!.runtime.RunPodSandbox({ config })).podSandboxId!;
    const containerId = (await skiff!.runtime.CreateContainer({
      podSandboxId: podId,
      config: { metadata: { name: 'c' }, image: { image }, command, envs, logPath: 'c.log', linux: { securityContext: { namespaceOptions: { pid: 'CONTAINER' } } } },
      sandboxConfig: config,
    })).containerId!;
    return { podId, containerId };
  }

  const runcState = (id: string) => spawnSync('runc', [`--root=${runcRoot}`, 'state', id], { encoding: 'utf8' });
  const status = async (id: string) => (await skiff!.runtime.ContainerStatus({ containerId: id })).status!;

  it('makes a pod\'s namespaces in the daemon itself: named, loopback up, and every daemon thread back in its own', async () => {
    const pid = skiff!.child.pid!;
    expect((await fs.readFile(`/proc/${pid}/comm`, 'utf8')).trim()).toBe('node');
    const own = { net: (await fs.stat(ns!.path)).ino, ipc: (await fs.stat('/proc/self/ns/ipc')).ino, uts: (await fs.stat('/proc/self/ns/uts')).ino };
    const threadsElsewhere = async () => {
      const out: string[] = [];
      for (const t of await fs.readdir(`/proc/${pid}/task`)) {
        for (const [kind, ino] of Object.entries(own)) {
          const got = (await fs.stat(`/proc/${pid}/task/${t}/ns/${kind}`).catch(() => undefined))?.ino;
          if (got !== undefined && got !== ino) out.push(`${t} ${kind}`);
        }
      }
      return out;
    };
    expect(await threadsElsewhere()).toEqual([]);
    // The longest name the kernel keeps (64 bytes; RunPodSandbox refuses longer ones).
    const long = `h${'x'.repeat(63)}`;
    for (const hostname of ['pin-ns-host', long]) {
      const { podId, containerId } = await podWith(['sleep', '1000'], [], hostname);
      await skiff!.runtime.StartContainer({ containerId });
      const r = await skiff!.runtime.ExecSync({ containerId, cmd: ['sh', '-c', 'hostname; cat /sys/class/net/lo/flags; ping -c1 -W2 127.0.0.1 >/dev/null && echo pong'], timeout: 10 });
      expect(r.exitCode, Buffer.from(r.stderr ?? '').toString()).toBe(0);
      const [name, flags, pong] = Buffer.from(r.stdout!).toString().trim().split('\n');
      expect(name).toBe(hostname);
      expect(Number(flags) & 1).toBe(1);
      expect(pong).toBe('pong');
      // The pod's namespaces are its own, not the daemon's.
      const st = await skiff!.runtime.PodSandboxStatus({ podSandboxId: podId, verbose: true });
      const info = JSON.parse(st.info!.info!) as { netns?: string };
      expect((await fs.stat(info.netns!)).ino).not.toBe(own.net);
      expect(await threadsElsewhere()).toEqual([]);
      await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
    }
    // A pod on the node's network still gets an IPC namespace of its own, and the node's name.
    const n = `hn${++seq}`;
    const config = {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 },
      logDirectory: path.join(dirs!.base, 'logs', n),
      linux: { securityContext: { namespaceOptions: { network: 'NODE' as const, pid: 'CONTAINER' as const } } },
    };
    const podId = (await skiff!.runtime.RunPodSandbox({ config })).podSandboxId!;
    expect(await threadsElsewhere()).toEqual([]);
    await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
  });

  it('masquerades what pods send out of the pod CIDR with one rule set for the network, and keeps no rule per pod', async () => {
    // Another network namespace, reachable from the daemon's over a veth, with no route back to the pod CIDR:
    // a pod reaches a server there only if its packets leave with the daemon's address.
    const outside = new TestNetns().create();
    const veth = `sk${randomBytes(3).toString('hex')}`;
    const sh = (cmd: string) => {
      const r = spawnSync('sh', ['-c', cmd], { encoding: 'utf8' });
      expect(r.status, `${cmd}: ${r.stderr}`).toBe(0);
      return r.stdout;
    };
    let server: ReturnType<typeof spawn> | undefined;
    try {
      sh(`ip link add ${veth}a netns ${ns!.name} type veth peer name ${veth}b netns ${outside.name}`);
      sh(`ip -n ${ns!.name} addr add 192.0.2.1/24 dev ${veth}a && ip -n ${ns!.name} link set ${veth}a up`);
      sh(`ip -n ${outside.name} addr add 192.0.2.2/24 dev ${veth}b && ip -n ${outside.name} link set ${veth}b up`);
      // Answers each connection with the address it came from.
      server = spawn('nsenter', [`--net=${outside.path}`, 'socat', 'TCP-LISTEN:7070,bind=192.0.2.2,fork,reuseaddr', 'SYSTEM:echo $SOCAT_PEERADDR'], { stdio: 'ignore' });
      const { podId, containerId } = await podWith(['sleep', '1000']);
      await skiff!.runtime.StartContainer({ containerId });
      const podIp = (await skiff!.runtime.PodSandboxStatus({ podSandboxId: podId })).status!.network!.ip!;
      expect(podIp).toMatch(/^10\.88\./);
      let seen = '';
      await waitFor('the pod to reach the outside server', async () => {
        const r = await skiff!.runtime.ExecSync({ containerId, cmd: ['sh', '-c', 'nc -w 2 192.0.2.2 7070 </dev/null'], timeout: 10 });
        seen = Buffer.from(r.stdout ?? '').toString().trim();
        return seen !== '';
      });
      expect(seen).toBe('192.0.2.1');

      // The rules: one jump for the CIDR to one chain, nothing naming the pod.
      const nat = () => spawnSync('nsenter', [`--net=${ns!.path}`, 'iptables', '-t', 'nat', '-S'], { encoding: 'utf8' }).stdout;
      const jumps = nat().split('\n').filter((l) => l.startsWith('-A POSTROUTING') && l.includes('SKIFF-MASQ-'));
      expect(jumps).toHaveLength(1);
      expect(jumps[0]).toMatch(/^-A POSTROUTING -s 10\.88\.0\.0\/16 -m comment --comment "skiff pods on \S+" -j SKIFF-MASQ-[0-9a-f]{16}$/);
      const chain = jumps[0]!.split(' -j ')[1]!;
      expect(nat().split('\n').filter((l) => l.startsWith(`-A ${chain} `))).toEqual([
        `-A ${chain} -d 10.88.0.0/16 -j RETURN`,
        `-A ${chain} -d 224.0.0.0/4 -j RETURN`,
        `-A ${chain} -j MASQUERADE`,
      ]);
      expect(nat()).not.toContain(podId);
      expect(nat()).not.toContain(podIp);
      const before = nat();
      await skiff!.runtime.StopPodSandbox({ podSandboxId: podId });
      await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
      // Stopping a pod changes nothing in the nat table: the network's rules stay for the other pods.
      expect(nat()).toBe(before);
    } finally {
      server?.kill('SIGTERM');
      await outside.destroy();
    }
  });

  it('starts a created container: runc reports it running, its fifo is gone and its process runs', async () => {
    const { podId, containerId } = await podWith(['sleep', '1000']);
    await skiff!.runtime.StartContainer({ containerId });
    const st = runcState(containerId);
    expect(st.status, st.stderr).toBe(0);
    const state = JSON.parse(st.stdout) as { status: string; pid: number };
    expect(state.status).toBe('running');
    await expect(fs.stat(path.join(runcRoot, containerId, 'exec.fifo'))).rejects.toThrow(/ENOENT/);
    // The init execs sleep a moment after it takes the start signal.
    await waitFor('sleep to run', async () => ((await fs.readFile(`/proc/${state.pid}/comm`, 'utf8')).trim() === 'sleep' ? true : undefined), 5_000);
    expect((await status(containerId)).state).toBe('CONTAINER_RUNNING');
    // A second start is refused: the container is no longer created.
    expect((await codeOf(skiff!.runtime.StartContainer({ containerId }))).code).toBe(grpc.status.FAILED_PRECONDITION);
    await skiff!.runtime.StopContainer({ containerId, timeout: 0 });
    await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
  });

  it('fails StartContainer with a clear error when the init died before it was started, and leaves nothing behind', async () => {
    const [key, value] = KILL_MARK.split('=') as [string, string];
    const { podId, containerId } = await podWith(['sleep', '1000'], [{ key, value: Buffer.from(value) }]);
    const t0 = Date.now();
    const err = await codeOf(skiff!.runtime.StartContainer({ containerId }));
    // Found by watching the init, not by a timeout.
    expect(Date.now() - t0).toBeLessThan(5_000);
    expect(err.code).toBe(grpc.status.INTERNAL);
    expect(err.details).toMatch(/already dead: it exited or was killed before it was started/);
    const st = await status(containerId);
    expect(st.state).toBe('CONTAINER_EXITED');
    expect(st.reason).toBe('StartError');
    expect(st.message).toMatch(/already dead/);
    // runc forgot it, and no process of it (init, conmon) is left.
    expect(runcState(containerId).status).not.toBe(0);
    await expect(fs.stat(path.join(runcRoot, containerId))).rejects.toThrow(/ENOENT/);
    await waitFor('the container\'s processes to go', async () => (processesMentioning(containerId).length === 0 ? true : undefined), 5_000);
    await skiff!.runtime.RemoveContainer({ containerId });
    await expect(skiff!.runtime.ContainerStatus({ containerId })).rejects.toThrow(/not found/);
    await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
  });

  it('reports a process that cannot exec after the start signal as an exited container, as runc start does', async () => {
    const { podId, containerId } = await podWith(['/bin/not-a-program']);
    await skiff!.runtime.StartContainer({ containerId });
    const st = await waitFor('the container to exit', async () => {
      const s = await status(containerId);
      return s.state === 'CONTAINER_EXITED' ? s : undefined;
    }, 10_000);
    expect(st.exitCode).not.toBe(0);
    expect(processesMentioning(containerId)).toEqual([]);
    await skiff!.runtime.RemoveContainer({ containerId });
    await expect(fs.stat(path.join(runcRoot, containerId))).rejects.toThrow(/ENOENT/);
    await skiff!.runtime.RemovePodSandbox({ podSandboxId: podId });
  });
});
