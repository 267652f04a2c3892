/**
 * Pods in a user namespace through the real daemon, runc and the kernel: the
 * pod's root is root inside and host uid 100000 outside, its image layers and
 * an emptyDir-like host volume (root-owned on the host) appear owned by it
 * through idmapped mounts, all its containers share one user namespace, and
 * it survives a daemon restart. Options skiff cannot honour are refused with
 * InvalidArgument before anything is made.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { mountsUnder, startPodFixture, type PodFixture } from '../helpers/pods.js';
import { SpdyTestClient } from '../helpers/spdy-client.js';
import { waitFor } from '../helpers/registry.js';

const HOST_ID = 100000;
const LENGTH = 65536;
const range = (hostId = HOST_ID, length = LENGTH, containerId = 0) => ({ hostId, containerId, length });
const userns = (extra: Record<string, unknown> = {}) => ({ mode: 'POD' as const, uids: [range()], gids: [range()], ...extra });

let seq = 0;

/** Mount points whose source is `dir` or below it (idmapped clones of a volume are mounted elsewhere). */
function mountsFrom(dir: string): string[] {
  return readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .filter((f) => f[3] === dir || f[3]?.startsWith(`${dir}/`))
    .map((f) => f[4]!);
}

describe.skipIf(!isRoot)('pods with a user namespace', () => {
  let fx: PodFixture;
  let vol: string;
  let termLog: string;
  const exposed = new Map<number, number>();
  /** A host port reaching the streaming server inside the test's network namespace (one per server port). */
  async function hostPortFor(url: string): Promise<number> {
    const port = Number(new URL(url).port);
    if (!exposed.has(port)) exposed.set(port, await fx.ns.exposePort(port, fx.dirs.base));
    return exposed.get(port)!;
  }
  let pod: { id: string; config: Record<string, unknown> };
  let first: string;

  function podConfig(name: string, nsOpts: Record<string, unknown>) {
    return { metadata: { name, namespace: 'test', uid: `uid-${name}`, attempt: 0 }, hostname: name, logDirectory: path.join(fx.dirs.base, 'logs', name), linux: { securityContext: { namespaceOptions: nsOpts } } };
  }

  async function start(command: string[], extra: Record<string, unknown> = {}): Promise<string> {
    const name = `c${++seq}`;
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image: fx.image }, command, logPath: `${name}.log`, linux: { securityContext: { namespaceOptions: { usernsOptions: userns() } } }, ...extra },
      sandboxConfig: pod.config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    return containerId!;
  }

  async function exec(id: string, script: string): Promise<string> {
    const r = await fx.skiff.runtime.ExecSync({ containerId: id, cmd: ['sh', '-c', script], timeout: 20 });
    return Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString();
  }

  async function hostPid(id: string): Promise<number> {
    const st = await fx.skiff.runtime.ContainerStatus({ containerId: id, verbose: true });
    return JSON.parse(st.info!.info!).pid as number;
  }

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-userns');
    // runc reaches a pod's rootfs from inside its user namespace: the state dir and those above it
    // must be searchable by others (the daemon reports userNamespaces false otherwise), so it restarts.
    for (const d of [fx.dirs.base, fx.dirs.state]) await fs.chmod(d, 0o711);
    await fx.skiff.stop();
    await fx.skiff.start();
    // An emptyDir-like volume: a directory the host's root owns, mode 0755.
    vol = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-userns-vol-'));
    await fs.chmod(vol, 0o755);
    // A file volume, as the kubelet gives /dev/termination-log.
    termLog = path.join(fx.dirs.base, 'termination-log');
    await fs.writeFile(termLog, '');
    const config = podConfig('upod', { usernsOptions: userns() });
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    pod = { id: podSandboxId!, config };
    first = await start(['sh', '-c', 'echo started-in-userns; exec sleep 100000'], {
      mounts: [
        { containerPath: '/vol', hostPath: vol },
        { containerPath: '/dev/termination-log', hostPath: termLog },
      ],
    });
  }, 120_000);

  afterAll(async () => {
    const leaks = fx ? await fx.cleanup() : { mounts: [], processes: [] };
    const volMounts = vol ? mountsFrom(vol) : [];
    if (vol) await fs.rm(vol, { recursive: true, force: true });
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
    expect(volMounts, 'mounts left on the volume').toEqual([]);
  });

  it('reports userNamespaces for runc, probed on this kernel', async () => {
    const st = await fx.skiff.runtime.Status({});
    const runc = st.runtimeHandlers?.find((h) => h.name === 'runc');
    expect(runc?.features?.userNamespaces).toBe(true);
  });

  it('runs the pod as root inside and as the mapped uid on the host', async () => {
    expect(await exec(first, 'cat /proc/self/uid_map /proc/self/gid_map')).toMatch(new RegExp(`^\\s*0\\s+${HOST_ID}\\s+${LENGTH}\\n\\s*0\\s+${HOST_ID}\\s+${LENGTH}\\n$`));
    expect(await exec(first, 'id -u; id -g')).toBe('0\n0\n');
    const status = await fs.readFile(`/proc/${await hostPid(first)}/status`, 'utf8');
    expect(status).toMatch(new RegExp(`\\nUid:\\t${HOST_ID}\\t${HOST_ID}\\t${HOST_ID}\\t${HOST_ID}\\n`));
    expect(status).toMatch(new RegExp(`\\nGid:\\t${HOST_ID}\\t${HOST_ID}\\t${HOST_ID}\\t${HOST_ID}\\n`));
  });

  it('sees its image owned by root and writes its own rootfs', async () => {
    // The layers are owned by the host's root on disk; through the idmapped mounts they are the pod's.
    expect(await exec(first, 'stat -c "%u:%g" / /bin /bin/busybox /etc')).toBe('0:0\n0:0\n0:0\n0:0\n');
    expect(await exec(first, 'echo new > /etc/made-here && echo more >> /bin/busybox.note && touch /bin && stat -c "%u:%g" /etc/made-here && cat /etc/made-here')).toBe('0:0\nnew\n');
    // /etc/hosts and the pod's /dev/shm are its root's too.
    expect(await exec(first, 'echo "10.9.9.9 extra" >> /etc/hosts && touch /dev/shm/x && stat -c "%u:%g" /etc/hosts /dev/shm/x')).toBe('0:0\n0:0\n');
  });

  it('writes a root-owned host volume, with owners on disk as they would be without a user namespace', async () => {
    await fs.writeFile(path.join(vol, 'from-host'), 'h');
    await fs.chown(path.join(vol, 'from-host'), 1000, 2000);
    expect(await exec(first, 'stat -c "%u:%g %a" /vol /vol/from-host && echo data > /vol/f && mkdir /vol/d && stat -c "%u:%g" /vol/f /vol/d')).toBe('0:0 755\n1000:2000 644\n0:0\n0:0\n');
    // The volume is idmapped, not the files chowned: what the pod's root writes is root's on disk
    // (as the kubelet's fsGroup handling expects), though the process is uid 100000 on the host.
    for (const f of ['f', 'd']) {
      const st = await fs.stat(path.join(vol, f));
      expect([st.uid, st.gid], f).toEqual([0, 0]);
    }
    expect(await fs.readFile(path.join(vol, 'f'), 'utf8')).toBe('data\n');
    // Without the idmapped mount the pod's root could not write there at all.
    expect((await fs.stat(vol)).uid).toBe(0);
    // A file volume too.
    expect(await exec(first, 'echo bye > /dev/termination-log && stat -c "%u:%g" /dev/termination-log')).toBe('0:0\n');
    expect(await fs.readFile(termLog, 'utf8')).toBe('bye\n');
  });

  it('puts a second container of the pod in the same user namespace', async () => {
    const second = await start(['sleep', '100000']);
    const a = await exec(first, 'readlink /proc/self/ns/user');
    const b = await exec(second, 'readlink /proc/self/ns/user');
    expect(a).toMatch(/^user:\[\d+\]\n$/);
    expect(b).toBe(a);
    // ... which is not the host's.
    expect(a.trim()).not.toBe(await fs.readlink('/proc/self/ns/user'));
  });

  it('runs a non-root user as its mapped host id, with a working directory it owns', async () => {
    const id = await start(['sleep', '100000'], { workingDir: '/made/for-1000', linux: { securityContext: { runAsUser: { value: 1000 }, runAsGroup: { value: 3000 }, namespaceOptions: { usernsOptions: userns() } } } });
    expect(await exec(id, 'id -u; id -g; pwd; stat -c "%u:%g" . && touch ./mine && stat -c "%u:%g" ./mine')).toBe('1000\n3000\n/made/for-1000\n1000:3000\n1000:3000\n');
    const status = await fs.readFile(`/proc/${await hostPid(id)}/status`, 'utf8');
    expect(status).toMatch(new RegExp(`\\nUid:\\t${HOST_ID + 1000}\\t`));
    expect(status).toMatch(new RegExp(`\\nGid:\\t${HOST_ID + 3000}\\t`));
    await fx.skiff.runtime.StopContainer({ containerId: id, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: id });
  });

  it('runs a terminal exec and attaches to a container over SPDY', async () => {
    const shell = await start(['sh'], { stdin: true });
    const url = (await fx.skiff.runtime.Exec({ containerId: first, cmd: ['sh'], tty: true, stdin: true, stdout: true })).url!;
    const port = await hostPortFor(url);
    const ex = await SpdyTestClient.connect(url, ['v4.channel.k8s.io'], port);
    const error = await ex.client.open({ streamtype: 'error', requestid: '0' });
    const input = await ex.client.open({ streamtype: 'stdin', requestid: '0' });
    const stdout = await ex.client.open({ streamtype: 'stdout', requestid: '0' });
    // (A terminal session has its resize stream, as kubectl opens it.)
    await ex.client.open({ streamtype: 'resize', requestid: '0' });
    ex.client.write(input, 'echo "u=$(id -u) $(readlink /proc/self/ns/user) $(tty)"; exit 0\n');
    await ex.client.until(() => error.fin).catch((err) => {
      throw new Error(`exec: ${String(err)}; stdout so far ${JSON.stringify(stdout.data.toString())}, error ${JSON.stringify(error.data.toString())}`);
    });
    ex.client.close();
    expect(stdout.data.toString()).toContain(`u=0 ${(await exec(first, 'readlink /proc/self/ns/user')).trim()} /dev/pts/`);
    expect(JSON.parse(error.data.toString())).toEqual({ metadata: {}, status: 'Success' });
    const att = (await fx.skiff.runtime.Attach({ containerId: shell, stdin: true, stdout: true, stderr: true })).url!;
    const at = await SpdyTestClient.connect(att, ['v4.channel.k8s.io'], port);
    await at.client.open({ streamtype: 'error', requestid: '0' });
    const stdin = await at.client.open({ streamtype: 'stdin', requestid: '0' });
    const out = await at.client.open({ streamtype: 'stdout', requestid: '0' });
    await at.client.open({ streamtype: 'stderr', requestid: '0' });
    at.client.write(stdin, 'echo attached-as-$(id -u)\n');
    await at.client.until(() => out.data.toString() === 'attached-as-0\n').catch((err) => {
      throw new Error(`attach: ${String(err)}; stdout so far ${JSON.stringify(out.data.toString())}`);
    });
    at.client.close();
    await fx.skiff.runtime.StopContainer({ containerId: shell, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: shell });
  });

  it('keeps logs, stats and port-forward working', async () => {
    const logFile = path.join(fx.dirs.base, 'logs', 'upod', 'c1.log');
    expect(await fs.readFile(logFile, 'utf8')).toMatch(/ stdout F started-in-userns\n/);
    const stats = await fx.skiff.runtime.ContainerStats({ containerId: first });
    expect(Number(stats.stats?.memory?.workingSetBytes?.value ?? 0)).toBeGreaterThan(0);
    const web = await start(['sh', '-c', 'mkdir -p /www && echo hello-from-userns > /www/index.html && exec httpd -f -p 80 -h /www']);
    const url = (await fx.skiff.runtime.PortForward({ podSandboxId: pod.id, port: [80] })).url!;
    const streamHostPort = await hostPortFor(url);
    let body = '';
    await waitFor('httpd in the pod to answer through port-forward', async () => {
      const again = (await fx.skiff.runtime.PortForward({ podSandboxId: pod.id, port: [80] })).url!;
      const { client } = await SpdyTestClient.connect(again, ['portforward.k8s.io'], streamHostPort);
      await client.open({ streamtype: 'error', port: '80', requestid: '0' });
      const data = await client.open({ streamtype: 'data', port: '80', requestid: '0' });
      client.write(data, 'GET /index.html HTTP/1.0\r\n\r\n', true);
      await client.until(() => data.fin);
      client.close();
      body = data.data.toString();
      return body.includes('hello-from-userns');
    });
    expect(body).toMatch(/^HTTP\/1\.[01] 200/);
    await fx.skiff.runtime.StopContainer({ containerId: web, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: web });
  });

  it('survives a daemon crash: the pod stays ready, exec still works, a cut-short create is cleaned up', async () => {
    // What a crash between mounting an idmapped volume and saving the record leaves: a
    // container dir with no record, a volume clone still mounted in it.
    const orphan = 'e'.repeat(64);
    const keep = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-userns-keep-'));
    await fs.writeFile(path.join(keep, 'precious'), 'p');
    const staged = path.join(fx.dirs.state, 'userns', orphan, 'idmapped', '0');
    await fs.mkdir(staged, { recursive: true });
    await fs.mkdir(path.join(fx.dirs.root, 'containers', orphan));
    expect(spawnSync('mount', ['--bind', keep, staged]).status).toBe(0);
    try {
      await fx.skiff.stop('SIGKILL');
      await fx.skiff.start();
      expect(mountsFrom(keep)).toEqual([]);
      await expect(fs.stat(path.join(fx.dirs.state, 'userns', orphan))).rejects.toThrow(/ENOENT/);
      await expect(fs.stat(path.join(fx.dirs.root, 'containers', orphan))).rejects.toThrow(/ENOENT/);
      // The removal never went through the mount.
      expect(await fs.readFile(path.join(keep, 'precious'), 'utf8')).toBe('p');
    } finally {
      for (const m of mountsFrom(keep)) spawnSync('umount', ['-l', m]);
      await fs.rm(keep, { recursive: true, force: true });
    }
    const p = await fx.skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id });
    expect(String(p.status?.state)).toBe('SANDBOX_READY');
    const c = await fx.skiff.runtime.ContainerStatus({ containerId: first });
    expect(String(c.status?.state)).toBe('CONTAINER_RUNNING');
    expect(await exec(first, 'id -u; cat /etc/made-here /vol/f')).toBe('0\nnew\ndata\n');
  });

  it('refuses user namespace options it cannot honour, leaving nothing behind', async () => {
    const cases: Array<[string, Record<string, unknown>, RegExp]> = [
      ['container', { usernsOptions: userns({ mode: 'CONTAINER' }) }, /mode CONTAINER is not supported/],
      ['target', { usernsOptions: userns({ mode: 'TARGET' }) }, /mode TARGET is not supported/],
      ['nomap', { usernsOptions: { mode: 'POD' } }, /needs a uid mapping/],
      ['twouid', { usernsOptions: userns({ uids: [range(), range(200000, 10, 65536)] }) }, /2 uid mappings given; only one range/],
      ['notzero', { usernsOptions: userns({ gids: [range(HOST_ID, LENGTH, 1)] }) }, /must start at container id 0/],
      ['hostroot', { usernsOptions: userns({ uids: [range(0)] }) }, /map the host's root/],
      ['wrap', { usernsOptions: userns({ uids: [range(0xffff0000, 0x20000)] }) }, /goes past the largest id/],
      ['nodemaps', { usernsOptions: userns({ mode: 'NODE' }) }, /mode NODE takes no uid\/gid mappings/],
      ['hostnet', { network: 'NODE', usernsOptions: userns() }, /cannot share the host's network namespace/],
      ['hostpid', { pid: 'NODE', usernsOptions: userns() }, /cannot share the host's pid namespace/],
    ];
    for (const [name, nsOpts, message] of cases) {
      const r = await codeOf(fx.skiff.runtime.RunPodSandbox({ config: podConfig(`bad-${name}`, nsOpts) }));
      expect(r.code, name).toBe(grpc.status.INVALID_ARGUMENT);
      expect(r.details, name).toMatch(message);
    }
    const pods = (await fx.skiff.runtime.ListPodSandbox({})).items ?? [];
    expect(pods.map((p) => p.id)).toEqual([pod.id]);
    // A container cannot ask for another user namespace than its pod's.
    const other = await codeOf(
      fx.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: { metadata: { name: 'other' }, image: { image: fx.image }, command: ['true'], logPath: 'other.log', linux: { securityContext: { namespaceOptions: { usernsOptions: userns({ uids: [range(200000)] }) } } } },
        sandboxConfig: pod.config,
      }),
    );
    expect(other.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(other.details).toMatch(/differ from its pod's/);
    const hostish = await codeOf(
      fx.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: { metadata: { name: 'hostish' }, image: { image: fx.image }, command: ['true'], logPath: 'h.log', linux: { securityContext: { namespaceOptions: { usernsOptions: { mode: 'NODE' } } } } },
        sandboxConfig: pod.config,
      }),
    );
    expect(hostish.code).toBe(grpc.status.INVALID_ARGUMENT);
    // A volume whose source is missing fails the create and undoes it: no mount, no dir left.
    const missing = await codeOf(
      fx.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: { metadata: { name: 'missing' }, image: { image: fx.image }, command: ['true'], logPath: 'm.log', mounts: [{ containerPath: '/a', hostPath: vol }, { containerPath: '/b', hostPath: path.join(vol, 'nope') }] },
        sandboxConfig: pod.config,
      }),
    );
    expect(missing.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(missing.details).toMatch(/mount \/b: source .*nope: does not exist/);
    const live = ((await fx.skiff.runtime.ListContainers({ filter: { podSandboxId: pod.id } })).containers ?? []).length;
    expect((await fs.readdir(path.join(fx.dirs.state, 'userns'))).length).toBe(live);
    // Only the first container's clone of the volume is mounted.
    expect(mountsFrom(vol)).toHaveLength(1);
    // A user the pod's namespace does not map.
    const unmapped = await codeOf(
      fx.skiff.runtime.CreateContainer({
        podSandboxId: pod.id,
        config: { metadata: { name: 'unmapped' }, image: { image: fx.image }, command: ['true'], logPath: 'u.log', linux: { securityContext: { runAsUser: { value: LENGTH } } } },
        sandboxConfig: pod.config,
      }),
    );
    expect(unmapped.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(unmapped.details).toMatch(new RegExp(`user ${LENGTH} is outside the pod's user namespace \\(uids 0-${LENGTH - 1}\\)`));
    expect((await fs.readdir(path.join(fx.dirs.state, 'userns'))).length).toBe(live);
    const names = ((await fx.skiff.runtime.ListContainers({ filter: { podSandboxId: pod.id } })).containers ?? []).map((c) => c.metadata?.name);
    expect(names).not.toContain('other');
    expect(names).not.toContain('hostish');
  });

  it('removes the pod with its mounts: nothing stays mounted under the daemon root or the volume', async () => {
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    // (The private mount that holds the namespace pins stays while the daemon runs.)
    expect(mountsUnder(fx.dirs.base).filter((m) => m !== path.join(fx.dirs.state, 'sandboxes'))).toEqual([]);
    expect(await fs.readdir(path.join(fx.dirs.state, 'userns'))).toEqual([]);
    expect(mountsFrom(vol)).toEqual([]);
    expect(mountsFrom(termLog)).toEqual([]);
    // The volume's data is the host's: removing the pod leaves it.
    expect(await fs.readFile(path.join(vol, 'f'), 'utf8')).toBe('data\n');
  });
});
