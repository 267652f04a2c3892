/**
 * Pods with an infra process (pid POD: the containers share one PID
 * namespace, which catatonit holds) and pods without one (pid CONTAINER, the
 * kubelet's default: the containers join the pinned net/ipc/uts namespaces
 * directly). Both kinds go through the same doors a kubelet uses: start,
 * exec, status, stats, port-forward, a daemon restart, a namespace lost
 * while the daemon was down, stop and removal.
 */
import fs from 'node:fs';
import path from 'node:path';
import { randomBytes } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { mountsUnder, startPodFixture, type PodFixture } from '../helpers/pods.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';

type Mode = 'POD' | 'CONTAINER' | 'NODE';

const kinds = [
  { kind: 'with an infra process (pid POD)', pid: 'POD', infra: true },
  { kind: 'without an infra process (pid CONTAINER)', pid: 'CONTAINER', infra: false },
] as const;

const ls = (d: string) => {
  try {
    return fs.readdirSync(d);
  } catch {
    return [];
  }
};

describe.skipIf(!isRoot)('pods with and without an infra process', () => {
  let f: PodFixture;
  const cgroupParent = `/skiff-noinfra-${randomBytes(4).toString('hex')}`;
  let seq = 0;

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-noinfra');
  });

  afterAll(async () => {
    let leaks: Awaited<ReturnType<PodFixture['cleanup']>> | undefined;
    let cgroups: string[] = [];
    try {
      leaks = await f?.cleanup();
    } finally {
      // Even when the cleanup failed half-way, the test's cgroups go.
      cgroups = cgroupDirs();
      for (const c of cgroups) spawnSync('rmdir', [c]);
      for (const ctl of ls('/sys/fs/cgroup')) spawnSync('rmdir', [path.join('/sys/fs/cgroup', ctl, cgroupParent)]);
    }
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
    expect(cgroups, 'cgroups left behind').toEqual([]);
  });

  /** The cgroups under the test's cgroup parent, in every hierarchy. */
  function cgroupDirs(): string[] {
    const out: string[] = [];
    for (const ctl of ls('/sys/fs/cgroup')) {
      const d = path.join('/sys/fs/cgroup', ctl, cgroupParent);
      for (const n of ls(d)) if (fs.statSync(path.join(d, n)).isDirectory()) out.push(path.join(d, n));
    }
    return out;
  }

  /** The names of the processes living in the network namespace pinned at `pin`. */
  function processesInNetns(pin: string): string[] {
    const ino = fs.statSync(pin).ino;
    const out: string[] = [];
    for (const p of ls('/proc')) {
      if (!/^\d+$/.test(p)) continue;
      try {
        if (fs.statSync(`/proc/${p}/ns/net`).ino !== ino) continue;
        out.push(fs.readFileSync(`/proc/${p}/comm`, 'utf8').trim());
      } catch {
        // gone meanwhile
      }
    }
    return out.sort();
  }

  /** The processes in the namespace once they look like `want` (runc's init and the shell exec theirs a moment after StartContainer), or as they are after 10 s. */
  async function settledProcesses(pin: string, want: string[]): Promise<string[]> {
    const deadline = Date.now() + 10_000;
    let got = processesInNetns(pin);
    while (JSON.stringify(got) !== JSON.stringify(want) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      got = processesInNetns(pin);
    }
    return got;
  }

  function podConfig(pid: Mode) {
    const n = `ni${++seq}`;
    return {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}-${randomBytes(3).toString('hex')}`, attempt: 0 },
      hostname: `host-${n}`,
      logDirectory: path.join(f.dirs.base, 'logs', n),
      linux: {
        cgroupParent,
        sysctls: { 'kernel.shm_rmid_forced': '1', 'net.ipv4.ip_unprivileged_port_start': '123' },
        securityContext: { namespaceOptions: { pid } },
      },
    };
  }

  async function runPod(pid: Mode) {
    const config = podConfig(pid);
    const id = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    return { id, config, pin: path.join(f.dirs.state, 'sandboxes', id, 'ns', 'net') };
  }

  async function runWeb(pod: Awaited<ReturnType<typeof runPod>>, name = 'web', command?: string[]) {
    const containerId = (
      await f.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: {
          metadata: { name },
          image: { image: f.image },
          command: command ?? ['sh', '-c', `mkdir -p /www && echo hello-${pod.config.metadata.name} > /www/index.html && exec httpd -f -p 80 -h /www`],
          logPath: `${name}.log`,
          linux: { securityContext: { namespaceOptions: { pid: pod.config.linux.securityContext.namespaceOptions.pid } } },
        },
        sandboxConfig: pod.config,
      })
    ).containerId!;
    await f.skiff.runtime.StartContainer({ containerId });
    return containerId;
  }

  async function exec(containerId: string, cmd: string[]): Promise<string> {
    const r = await f.skiff.runtime.ExecSync({ containerId, cmd, timeout: 10 });
    expect(r.exitCode, Buffer.from(r.stderr ?? '').toString()).toBe(0);
    return Buffer.from(r.stdout!).toString();
  }

  async function status(podId: string) {
    const r = await f.skiff.runtime.PodSandboxStatus({ podSandboxId: podId, verbose: true });
    return { state: r.status!.state, ip: r.status!.network!.ip, pid: JSON.parse(r.info!.info!).pid as number };
  }

  /** An HTTP GET of port 80 in the pod through PortForward (SPDY), as kubectl port-forward does it. */
  async function forwardGet(podId: string): Promise<string> {
    const url = (await f.skiff.runtime.PortForward({ podSandboxId: podId, port: [80] })).url!;
    const hostPort = await f.ns.exposePort(Number(new URL(url).port), f.dirs.base);
    const { client } = await SpdyTestClient.connect(url, ['portforward.k8s.io'], hostPort);
    try {
      await client.open({ streamtype: 'error', port: '80', requestid: '0' });
      const data = await client.open({ streamtype: 'data', port: '80', requestid: '0' });
      client.write(data, 'GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n', true);
      await client.until(() => data.fin);
      return data.data.toString();
    } finally {
      client.close();
    }
  }

  describe.each(kinds)('$kind', ({ pid, infra }) => {
    it('runs and execs, names the pod, applies its sysctls, reports status and stats, and forwards a port', async () => {
      const pod = await runPod(pid);
      const web = await runWeb(pod);
      const st = await status(pod.id);
      expect(st.state).toBe('SANDBOX_READY');
      expect(st.ip).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
      // Only the pod's own processes live in its network namespace: the infra process is there or not at all.
      expect(await settledProcesses(pod.pin, infra ? ['httpd', 'pause'] : ['httpd'])).toEqual(infra ? ['httpd', 'pause'] : ['httpd']);
      if (infra) expect(fs.readFileSync(`/proc/${st.pid}/comm`, 'utf8').trim()).toBe('pause');
      else expect(st.pid).toBe(0);
      // PID 1 of the container's PID namespace: the infra's init when shared, the container's own process if not.
      expect(await exec(web, ['cat', '/proc/1/comm'])).toBe(infra ? 'pause\n' : 'httpd\n');
      expect(await exec(web, ['hostname'])).toBe(`host-${pod.config.metadata.name}\n`);
      expect(await exec(web, ['cat', '/proc/sys/kernel/shm_rmid_forced', '/proc/sys/net/ipv4/ip_unprivileged_port_start'])).toBe('1\n123\n');
      // A second container shares the network and IPC namespaces: it reaches the first over localhost.
      const second = (
        await f.skiff.runtime.CreateContainer({
          podSandboxId: pod.id,
          config: { metadata: { name: 'client' }, image: { image: f.image }, command: ['sleep', '1000'], logPath: 'client.log', linux: { securityContext: { namespaceOptions: { pid } } } },
          sandboxConfig: pod.config,
        })
      ).containerId!;
      await f.skiff.runtime.StartContainer({ containerId: second });
      expect(await exec(second, ['wget', '-q', '-O', '-', 'http://127.0.0.1/index.html'])).toBe(`hello-${pod.config.metadata.name}\n`);
      expect(await exec(second, ['readlink', '/proc/self/ns/ipc'])).toBe(await exec(web, ['readlink', '/proc/self/ns/ipc']));
      expect(await exec(second, ['cat', '/proc/1/comm'])).toBe(infra ? 'pause\n' : 'sleep\n');

      const stats = (await f.skiff.runtime.PodSandboxStats({ podSandboxId: pod.id })).stats!;
      expect(stats.linux!.network!.defaultInterface?.name).toBe('eth0');
      expect(stats.linux!.network!.interfaces!.map((i) => i.name)).toEqual(['eth0']);
      expect(stats.linux!.containers!.map((c) => c.attributes!.id).sort()).toEqual([web, second].sort());
      expect(Number(stats.linux!.memory!.workingSetBytes!.value)).toBeGreaterThan(0);
      // httpd, sleep, and the infra process if there is one.
      expect(Number(stats.linux!.process!.processCount!.value)).toBe(infra ? 3 : 2);

      expect(await forwardGet(pod.id)).toMatch(new RegExp(`^HTTP/1\\.[01] 200[\\s\\S]*hello-${pod.config.metadata.name}`));
      const list = await f.skiff.runtime.ListPodSandbox({ filter: { id: pod.id } });
      expect(list.items!.map((p) => [p.id, p.state])).toEqual([[pod.id, 'SANDBOX_READY']]);
      await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    });

    it('stays ready across a daemon restart (kill -9), its containers running, and takes new containers after it', async () => {
      const pod = await runPod(pid);
      const web = await runWeb(pod);
      await f.skiff.stop('SIGKILL');
      await f.skiff.start();
      expect((await status(pod.id)).state).toBe('SANDBOX_READY');
      expect((await f.skiff.runtime.ContainerStatus({ containerId: web })).status?.state).toBe('CONTAINER_RUNNING');
      expect(await exec(web, ['hostname'])).toBe(`host-${pod.config.metadata.name}\n`);
      const again = await runWeb(pod, 'again', ['sleep', '1000']);
      expect(await exec(again, ['readlink', '/proc/self/ns/net'])).toBe(await exec(web, ['readlink', '/proc/self/ns/net']));
      expect(await exec(again, ['cat', '/proc/1/comm'])).toBe(infra ? 'pause\n' : 'sleep\n');
      expect(await exec(again, ['wget', '-q', '-O', '-', 'http://127.0.0.1/index.html'])).toBe(`hello-${pod.config.metadata.name}\n`);
      expect(await forwardGet(pod.id)).toMatch(/200[\s\S]*hello-/);
      const stats = (await f.skiff.runtime.PodSandboxStats({ podSandboxId: pod.id })).stats!;
      expect(stats.linux!.network!.defaultInterface?.name).toBe('eth0');
      await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    });

    it(`is NOTREADY after a restart when its ${infra ? 'infra process died' : 'network namespace pin was unmounted'} while the daemon was down, and is still removed cleanly`, async () => {
      const pod = await runPod(pid);
      const st = await status(pod.id);
      expect((await f.skiff.stop()).code).toBe(0);
      if (infra) {
        process.kill(st.pid, 'SIGKILL');
        await new Promise((r) => setTimeout(r, 300));
      } else {
        expect(spawnSync('umount', [pod.pin]).status).toBe(0);
      }
      await f.skiff.start();
      expect((await status(pod.id)).state).toBe('SANDBOX_NOTREADY');
      await f.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
      await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
      expect(fs.existsSync(path.join(f.dirs.state, 'sandboxes', pod.id))).toBe(false);
      expect(mountsUnder(path.join(f.dirs.state, 'sandboxes', pod.id))).toEqual([]);
    });

    it('a RunPodSandbox whose network fails leaves nothing behind: no pins, mounts, files, infra process or record', async () => {
      const conf = path.join(f.dirs.base, 'net.d', '00-broken.conflist');
      await fs.promises.writeFile(conf, JSON.stringify({ cniVersion: '1.0.0', name: 'broken', plugins: [{ type: 'no-such-plugin' }] }));
      const before = ls(path.join(f.dirs.state, 'sandboxes')).sort();
      try {
        const config = podConfig(pid);
        await expect(f.skiff.runtime.RunPodSandbox({ config })).rejects.toThrow(/no-such-plugin/);
      } finally {
        await fs.promises.rm(conf, { force: true });
      }
      expect(ls(path.join(f.dirs.state, 'sandboxes')).sort()).toEqual(before);
      expect(mountsUnder(path.join(f.dirs.state, 'sandboxes') + '/').filter((m) => !before.some((b) => m.includes(b)))).toEqual([]);
      expect((await f.skiff.runtime.ListPodSandbox({})).items!.filter((p) => !before.includes(p.id!))).toEqual([]);
      expect(cgroupDirs().filter((c) => !before.some((b) => c.includes(b)) && path.basename(c).startsWith('skiff-'))).toEqual([]);
    });

    it('stop ends every process in the pod and keeps the stats answering; removal leaves no mounts, processes or cgroups', async () => {
      const pod = await runPod(pid);
      const web = await runWeb(pod);
      const ino = fs.statSync(pod.pin).ino;
      // With no container running, the pod's interfaces are still read (without infra: inside the pinned namespace).
      await f.skiff.runtime.StopContainer({ containerId: web, timeout: 2 });
      const stats = (await f.skiff.runtime.PodSandboxStats({ podSandboxId: pod.id })).stats!;
      expect(stats.linux!.network!.interfaces!.map((i) => i.name)).toEqual(['eth0']);
      await f.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
      expect((await status(pod.id)).state).toBe('SANDBOX_NOTREADY');
      const left = ls('/proc').filter((p) => /^\d+$/.test(p)).filter((p) => {
        try {
          return fs.statSync(`/proc/${p}/ns/net`).ino === ino;
        } catch {
          return false;
        }
      });
      expect(left, 'processes still in the pod network namespace').toEqual([]);
      await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
      expect(mountsUnder(path.join(f.dirs.state, 'sandboxes', pod.id))).toEqual([]);
      expect(fs.existsSync(path.join(f.dirs.state, 'sandboxes', pod.id))).toBe(false);
      expect(cgroupDirs().filter((c) => c.includes(pod.id) || c.includes(web))).toEqual([]);
      expect((await f.skiff.runtime.ListPodSandbox({ filter: { id: pod.id } })).items).toEqual([]);
    });
  });

  it('a host-network pod without an infra process shares the node network, pins only its IPC namespace, and stays ready across a restart', async () => {
    const config = { ...podConfig('CONTAINER'), hostname: '' };
    config.linux.securityContext = { namespaceOptions: { pid: 'CONTAINER', network: 'NODE' } } as never;
    // A network sysctl has no place in the node's network namespace (runc refuses it).
    config.linux.sysctls = { 'kernel.shm_rmid_forced': '1' } as never;
    const id = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const nsDir = path.join(f.dirs.state, 'sandboxes', id, 'ns');
    expect(ls(nsDir).sort()).toEqual(['ipc']);
    const web = await runWeb({ id, config, pin: '' }, 'hostweb', ['sleep', '1000']);
    // The daemon runs in the test's network namespace: that is the node's network here.
    expect(await exec(web, ['readlink', '/proc/self/ns/net'])).toBe(`net:[${fs.statSync(f.ns.path).ino}]\n`);
    expect(await exec(web, ['readlink', '/proc/self/ns/ipc'])).toBe(`ipc:[${fs.statSync(path.join(nsDir, 'ipc')).ino}]\n`);
    await f.skiff.stop('SIGKILL');
    await f.skiff.start();
    expect((await status(id)).state).toBe('SANDBOX_READY');
    expect((await f.skiff.runtime.ContainerStatus({ containerId: web })).status?.state).toBe('CONTAINER_RUNNING');
    await f.skiff.runtime.RemovePodSandbox({ podSandboxId: id });
    expect(fs.existsSync(path.join(f.dirs.state, 'sandboxes', id))).toBe(false);
  });

  it('removes at start-up the remains of a pod without an infra process that has no record (a crash mid-RunPodSandbox): pins, network, files', async () => {
    const pod = await runPod('CONTAINER');
    const dir = path.join(f.dirs.state, 'sandboxes', pod.id);
    const ip = (await status(pod.id)).ip;
    expect(mountsUnder(dir).length).toBe(4); // net, ipc, uts pins and shm
    await f.skiff.stop();
    const Database = (await import('better-sqlite3')).default;
    const db = new Database(path.join(f.dirs.root, 'metadata.db'));
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(pod.id);
    db.close();
    await f.skiff.start();
    expect(mountsUnder(dir)).toEqual([]);
    expect(fs.existsSync(dir)).toBe(false);
    expect(fs.existsSync(path.join(f.dirs.root, 'cni', 'cache', `${pod.id}.json`))).toBe(false);
    // host-local gave the address back.
    const ipam = ls(path.join(f.dirs.root, 'cni', 'ipam')).flatMap((n) => ls(path.join(f.dirs.root, 'cni', 'ipam', n)));
    expect(ipam).not.toContain(ip);
    expect(f.skiff.log).toMatch(/removing the remains of a pod sandbox with no record/);
  });

  it('a pod in the host PID namespace (pid NODE) runs no infra process; its containers see the host PID namespace', async () => {
    const pod = await runPod('NODE');
    const web = await runWeb(pod);
    expect(await settledProcesses(pod.pin, ['httpd'])).toEqual(['httpd']);
    expect(await exec(web, ['readlink', '/proc/self/ns/pid'])).toBe(`${fs.readlinkSync('/proc/self/ns/pid')}\n`);
    expect(await exec(web, ['hostname'])).toBe(`host-${pod.config.metadata.name}\n`);
    await f.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });
});
