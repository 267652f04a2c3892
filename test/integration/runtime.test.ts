import fs from 'node:fs/promises';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { leftBehind, mountsUnder, processesMentioning } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

let seq = 0;
function podConfig(dirs: DaemonDirs, extra: Record<string, unknown> = {}) {
  const n = `pod${++seq}`;
  return {
    metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 },
    hostname: `host-${n}`,
    logDirectory: path.join(dirs.base, 'logs', n),
    labels: { app: 'skiff-test', pod: n },
    linux: {},
    ...extra,
  };
}

describe.skipIf(!isRoot)('RuntimeService: pods and containers with runc, conmon and CNI', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let image: string;

  beforeAll(async () => {
    const reg = inject('registryHost');
    const img = await busyboxImage();
    await new Pusher(`http://${reg}`).image('test/busybox', 'v1', img);
    image = `${reg}/test/busybox:v1`;
    dirs = await makeDirs();
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d')], (a) => ns.wrap(a)).start();
    await skiff.images.PullImage({ image: { image } });
  });

  afterAll(async () => {
    if (skiff) {
      const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await skiff.stop();
    }
    await ns?.destroy();
    // Leak check: nothing of this run may remain mounted or running (conmon, runc, the infra process).
    const { mounts, processes: procs } = dirs ? await leftBehind(dirs.base) : { mounts: [], processes: [] };
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
    expect(mounts, 'mounts left behind').toEqual([]);
    expect(procs, 'processes left behind').toEqual([]);
  });

  async function runPod(extra: Record<string, unknown> = {}) {
    const config = podConfig(dirs, extra);
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  async function runContainer(pod: { id: string; config: ReturnType<typeof podConfig> }, cfg: Record<string, unknown>) {
    const name = `c${++seq}`;
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image }, logPath: `${name}.log`, linux: {}, ...cfg },
      sandboxConfig: pod.config,
    });
    await skiff.runtime.StartContainer({ containerId: containerId! });
    return containerId!;
  }

  async function waitState(id: string, state: string) {
    return waitFor(`container ${id} to be ${state}`, async () => {
      const st = await skiff.runtime.ContainerStatus({ containerId: id });
      return st.status?.state === state ? st.status : undefined;
    });
  }

  it('runs a pod with its own network, hostname and DNS, and lists it', async () => {
    const pod = await runPod({ dnsConfig: { servers: ['10.0.0.10'], searches: ['test.svc'], options: ['ndots:5'] } });
    const st = await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id, verbose: true });
    expect(st.status?.state).toBe('SANDBOX_READY');
    expect(st.status?.network?.ip).toMatch(/^10\.88\.\d+\.\d+$/);
    expect(JSON.parse(st.info!.info!).pid).toBeGreaterThan(0);
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const out = await skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'hostname; cat /etc/resolv.conf; ip -o -4 addr show eth0; ip -o link show lo'], timeout: 10 });
    const text = Buffer.from(out.stdout!).toString();
    expect(text).toContain(`host-pod${seq - 1}`);
    expect(text).toContain('nameserver 10.0.0.10');
    expect(text).toContain('search test.svc');
    expect(text).toContain(st.status!.network!.ip!);
    expect(text).toMatch(/lo: <LOOPBACK,UP/);
    const ready = await skiff.runtime.ListPodSandbox({ filter: { state: { state: 'SANDBOX_READY' }, labelSelector: { pod: pod.config.metadata.name } } });
    expect(ready.items?.map((p) => p.id)).toEqual([pod.id]);
    await skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    expect((await skiff.runtime.ContainerStatus({ containerId: c })).status?.state).toBe('CONTAINER_EXITED');
    expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id })).status?.state).toBe('SANDBOX_NOTREADY');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    expect((await codeOf(skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id }))).code).toBe(grpc.status.NOT_FOUND);
    expect((await codeOf(skiff.runtime.ContainerStatus({ containerId: c }))).code).toBe(grpc.status.NOT_FOUND);
  });

  it('lets pods reach each other over the pod network', async () => {
    const a = await runPod();
    const b = await runPod();
    const ca = await runContainer(a, { command: ['sleep', '1000'] });
    const ipB = (await skiff.runtime.PodSandboxStatus({ podSandboxId: b.id })).status!.network!.ip!;
    await runContainer(b, { command: ['nc', '-l', '-p', '8080', '-e', 'echo', 'hello-from-b'] });
    const r = await waitFor('pod a to reach pod b', async () => {
      const out = await skiff.runtime.ExecSync({ containerId: ca, cmd: ['nc', ipB, '8080'], timeout: 5 });
      const text = Buffer.from(out.stdout!).toString();
      return text.includes('hello-from-b') ? text : undefined;
    });
    expect(r).toContain('hello-from-b');
  });

  it('maps a host port to the pod, reachable on 127.0.0.1', async () => {
    const pod = await runPod({ portMappings: [{ protocol: 'TCP', containerPort: 80, hostPort: 18080 }] });
    await runContainer(pod, { command: ['sh', '-c', 'while true; do echo served-by-pod | nc -l -p 80; done'] });
    const got = await waitFor('the host port to answer', async () => {
      const r = spawnSync('nsenter', [`--net=${ns.path}`, 'socat', '-T', '2', '-', 'TCP:127.0.0.1:18080'], { input: '', encoding: 'utf8', timeout: 5000 });
      return r.stdout.includes('served-by-pod') ? r.stdout : undefined;
    });
    expect(got).toContain('served-by-pod');
    await skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    const after = spawnSync('nsenter', [`--net=${ns.path}`, 'socat', '-T', '1', '-', 'TCP:127.0.0.1:18080'], { input: '', encoding: 'utf8', timeout: 5000 });
    expect(after.stdout).not.toContain('served-by-pod');
  });

  it('marks a pod not ready when its infra process died while skiff was down', async () => {
    const pod = await runPod();
    const pid = JSON.parse((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id, verbose: true })).info!.info!).pid as number;
    expect((await skiff.stop()).code).toBe(0);
    process.kill(pid, 'SIGKILL');
    await skiff.start();
    expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id })).status?.state).toBe('SANDBOX_NOTREADY');
    await skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });

  it('writes CRI-format logs, reports exit codes and reasons, and answers wrong states', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sh', '-c', 'echo out; echo err >&2; printf partial; exit 3'] });
    const st = await waitState(c, 'CONTAINER_EXITED');
    expect(st.exitCode).toBe(3);
    expect(st.reason).toBe('Error');
    expect(Number(st.finishedAt)).toBeGreaterThanOrEqual(Number(st.startedAt));
    const log = await fs.readFile(st.logPath!, 'utf8');
    const lines = log.trim().split('\n');
    // stdout and stderr are separate pipes: their relative order is not defined.
    expect(lines.map((l) => l.split(' ').slice(1).join(' ')).sort()).toEqual(['stderr F err', 'stdout F out', 'stdout P partial']);
    for (const l of lines) expect(l.split(' ')[0]).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+/);
    expect((await codeOf(skiff.runtime.StartContainer({ containerId: c }))).code).toBe(grpc.status.FAILED_PRECONDITION);
    expect((await codeOf(skiff.runtime.ExecSync({ containerId: c, cmd: ['true'], timeout: 1 }))).code).toBe(grpc.status.FAILED_PRECONDITION);
    const ok = await runContainer(pod, { command: ['true'] });
    expect((await waitState(ok, 'CONTAINER_EXITED')).reason).toBe('Completed');
  });

  it('runs ExecSync with exit codes, and kills a command that times out', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const r = await skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'echo o; echo e >&2; exit 7'], timeout: 10 });
    expect([Buffer.from(r.stdout!).toString(), Buffer.from(r.stderr!).toString(), r.exitCode]).toEqual(['o\n', 'e\n', 7]);
    // As containerd answers, and the kubelet reads as a probe timeout.
    expect((await codeOf(skiff.runtime.ExecSync({ containerId: c, cmd: ['sleep', '4321'], timeout: 1 }))).code).toBe(grpc.status.DEADLINE_EXCEEDED);
    // Gone, not even a zombie: critest checks the same with pgrep.
    const left = await skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'ps -o stat,args | grep -c "^[^ ]* *sleep 4321$"'], timeout: 10 });
    expect(Buffer.from(left.stdout!).toString().trim()).toBe('0');
  });

  it('stops with the image\'s signal, then SIGKILL after the timeout', async () => {
    const pod = await runPod();
    // Each container says when its trap is set: the stop must reach a shell that has one.
    const trapped = async (id: string) =>
      waitFor('the trap to be set', async () => (await skiff.runtime.ExecSync({ containerId: id, cmd: ['test', '-e', '/tmp/trapped'], timeout: 5 })).exitCode === 0 || undefined, 10_000);
    const graceful = await runContainer(pod, { command: ['sh', '-c', 'trap "exit 42" TERM; touch /tmp/trapped; while true; do sleep 0.1; done'] });
    await trapped(graceful);
    await skiff.runtime.StopContainer({ containerId: graceful, timeout: 10 });
    expect((await skiff.runtime.ContainerStatus({ containerId: graceful })).status).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 42 });
    const stubborn = await runContainer(pod, { command: ['sh', '-c', 'trap "" TERM; touch /tmp/trapped; while true; do sleep 0.1; done'] });
    await trapped(stubborn);
    const t0 = Date.now();
    await skiff.runtime.StopContainer({ containerId: stubborn, timeout: 1 });
    expect(Date.now() - t0).toBeGreaterThanOrEqual(900);
    expect((await skiff.runtime.ContainerStatus({ containerId: stubborn })).status).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 137 });
  });

  it('applies users, groups, read-only rootfs and capabilities', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, {
      command: ['sleep', '1000'],
      linux: {
        securityContext: {
          runAsUser: { value: 1000 },
          runAsGroup: { value: 1000 },
          supplementalGroups: [4000],
          readonlyRootfs: true,
          capabilities: { dropCapabilities: ['ALL'], addCapabilities: ['NET_BIND_SERVICE'] },
          noNewPrivs: true,
        },
      },
    });
    const r = await skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'id; touch /x 2>&1; grep CapEff /proc/self/status'], timeout: 10 });
    const out = Buffer.from(r.stdout!).toString();
    expect(out).toMatch(/uid=1000\(app\) gid=1000\(app\) groups=.*3000.*4000/);
    expect(out).toMatch(/Read-only file system/);
    expect(out).toContain('CapEff:\t0000000000000000');
    const byName = await runContainer(pod, { command: ['sleep', '1000'], linux: { securityContext: { runAsUsername: 'app' } } });
    expect(Buffer.from((await skiff.runtime.ExecSync({ containerId: byName, cmd: ['id', '-u'], timeout: 10 })).stdout!).toString().trim()).toBe('1000');
  });

  it('refuses bad requests, and a failed create leaves nothing behind', async () => {
    const pod = await runPod();
    const before = mountsUnder(dirs.base).length;
    const containersDir = path.join(dirs.root, 'containers');
    const entriesBefore = await fs.readdir(containersDir);
    const bad = async (cfg: Record<string, unknown>) =>
      codeOf(skiff.runtime.CreateContainer({ podSandboxId: pod.id, config: { metadata: { name: `bad${++seq}` }, image: { image }, linux: {}, ...cfg }, sandboxConfig: pod.config }));
    expect((await bad({ image: { image: `${image}-missing` } })).code).toBe(grpc.status.NOT_FOUND);
    expect((await bad({ linux: { securityContext: { runAsUsername: 'nosuchuser' } } })).details).toMatch(/nosuchuser/);
    expect((await bad({ linux: { securityContext: { runAsGroup: { value: 5 } } } })).code).toBe(grpc.status.INVALID_ARGUMENT);
    expect((await bad({ linux: { securityContext: { seccompProfilePath: 'bogus/profile' } } })).code).toBe(grpc.status.INVALID_ARGUMENT);
    if (!(await fs.stat('/sys/module/apparmor/parameters/enabled').catch(() => undefined))) {
      expect((await bad({ linux: { securityContext: { apparmor: { profileType: 'Localhost', localhostRef: 'k8s-x' } } } })).details).toMatch(/AppArmor is not enabled/);
    }
    expect(mountsUnder(dirs.base).length).toBe(before);
    expect(await fs.readdir(containersDir)).toEqual(entriesBefore);
    expect((await codeOf(skiff.runtime.CreateContainer({ podSandboxId: 'nope', config: { metadata: { name: 'x' }, image: { image } } }))).code).toBe(grpc.status.NOT_FOUND);
    expect((await codeOf(skiff.runtime.StopContainer({ containerId: 'nope', timeout: 1 }))).code).toBe(grpc.status.NOT_FOUND);
    await skiff.runtime.RemoveContainer({ containerId: 'nope' });
  });

  it('checks runtime handlers: unknown ones are refused, unavailable ones fail with the reason and leave nothing', async () => {
    const unknown = await codeOf(skiff.runtime.RunPodSandbox({ config: podConfig(dirs), runtimeHandler: 'kata' }));
    expect(unknown.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(unknown.details).toMatch(/unknown runtime handler "kata"/);
    const info = JSON.parse((await skiff.runtime.Status({ verbose: true })).info!.config!);
    const crun = info.runtimeHandlers.crun as { available: boolean; reason?: string };
    const before = (await skiff.runtime.ListPodSandbox({})).items?.length;
    const mounts = mountsUnder(dirs.base).length;
    if (!crun.available) {
      const err = await codeOf(skiff.runtime.RunPodSandbox({ config: podConfig(dirs), runtimeHandler: 'crun' }));
      expect(err.code).toBe(grpc.status.FAILED_PRECONDITION);
      expect(err.details).toContain(crun.reason);
    } else {
      const pod = (await skiff.runtime.RunPodSandbox({ config: podConfig(dirs), runtimeHandler: 'crun' })).podSandboxId!;
      expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod })).status?.runtimeHandler).toBe('crun');
      await skiff.runtime.RemovePodSandbox({ podSandboxId: pod });
    }
    expect((await skiff.runtime.ListPodSandbox({})).items?.length).toBe(before);
    expect(mountsUnder(dirs.base).length).toBe(mounts);
  });

  it('reports the cgroup driver and takes a pod CIDR from UpdateRuntimeConfig', async () => {
    expect((await skiff.runtime.RuntimeConfig({})).linux?.cgroupDriver).toBe('CGROUPFS');
    // Pods of earlier tests still use the network: the change is refused, not half made.
    for (const p of (await skiff.runtime.ListPodSandbox({})).items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! });
    const busy = await runPod();
    const refused = await codeOf(skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: { networkConfig: { podCidr: '10.99.0.0/24' } } }));
    expect(refused.code).toBe(grpc.status.FAILED_PRECONDITION);
    await skiff.runtime.RemovePodSandbox({ podSandboxId: busy.id });
    await skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: { networkConfig: { podCidr: '10.99.0.0/24' } } });
    try {
      const pod = await runPod();
      expect((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id })).status?.network?.ip).toMatch(/^10\.99\.0\.\d+$/);
      await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    } finally {
      await skiff.runtime.UpdateRuntimeConfig({ runtimeConfig: { networkConfig: { podCidr: '10.88.0.0/16' } } });
    }
  });

  it('runs a host-network pod in the node\'s network namespace', async () => {
    const pod = await runPod({ hostname: '', linux: { securityContext: { namespaceOptions: { network: 'NODE', pid: 'CONTAINER', ipc: 'POD' } } } });
    const st = await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id });
    expect(st.status?.linux?.namespaces?.options?.network).toBe('NODE');
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const names = (text: string) => text.split('\n').filter(Boolean).map((l) => l.split(':')[1]!.trim().split('@')[0]).sort();
    const inside = Buffer.from((await skiff.runtime.ExecSync({ containerId: c, cmd: ['ip', '-o', 'link'], timeout: 10 })).stdout!).toString();
    // The node's namespace (here the test's own) is what the container sees: no pod eth0.
    const node = spawnSync('ip', ['-n', ns.name, '-o', 'link'], { encoding: 'utf8' }).stdout;
    expect(names(inside)).toEqual(names(node));
    expect(names(inside)).not.toContain('eth0');
  });

  it('applies devices, the cgroup parent and pod sysctls', async () => {
    const pod = await runPod({ linux: { cgroupParent: '/skiff-test-parent', sysctls: { 'net.ipv4.ip_unprivileged_port_start': '123' } } });
    const c = await runContainer(pod, {
      command: ['sleep', '1000'],
      devices: [{ containerPath: '/dev/mynull', hostPath: '/dev/null', permissions: 'rwm' }],
    });
    const r = await skiff.runtime.ExecSync({
      containerId: c,
      cmd: ['sh', '-c', 'ls -l /dev/mynull; echo x > /dev/mynull && echo wrote; cat /proc/sys/net/ipv4/ip_unprivileged_port_start; cat /proc/self/cgroup'],
      timeout: 10,
    });
    const out = Buffer.from(r.stdout!).toString();
    expect(out).toMatch(/^c.* 1,\s+3 .*\/dev\/mynull$/m);
    expect(out).toContain('wrote');
    expect(out).toMatch(/^123$/m);
    const spec = JSON.parse((await skiff.runtime.ContainerStatus({ containerId: c, verbose: true })).info!.info!).runtimeSpec;
    expect(spec.linux.cgroupsPath).toBe(`/skiff-test-parent/skiff-${c}`);
    expect(out).toContain(`/skiff-test-parent/skiff-${c}`);
    // runc removes the pod's cgroups, not the parent it was given: that one is the test's to remove.
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    for (const dir of await fs.readdir('/sys/fs/cgroup')) {
      await fs.rmdir(path.join('/sys/fs/cgroup', dir, 'skiff-test-parent')).catch(() => undefined);
    }
    await fs.rmdir('/sys/fs/cgroup/skiff-test-parent').catch(() => undefined);
  });

  it('keeps a removed image\'s layers while a container stands on them', async () => {
    const reg = inject('registryHost');
    const { busyboxImage } = await import('../helpers/busybox.js');
    const { Pusher } = await import('../helpers/oci.js');
    const img = await busyboxImage({}, [{ name: 'in-use-marker', data: `in use ${Date.now()}` }]);
    await new Pusher(`http://${reg}`).image('test/in-use', 'v1', img);
    const ref = `${reg}/test/in-use:v1`;
    await skiff.images.PullImage({ image: { image: ref } });
    const pod = await runPod();
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name: 'in-use' }, image: { image: ref }, command: ['sleep', '1000'], linux: {} },
      sandboxConfig: pod.config,
    });
    await skiff.runtime.StartContainer({ containerId: containerId! });
    await skiff.images.RemoveImage({ image: { image: ref } });
    expect((await skiff.images.ImageStatus({ image: { image: ref } })).image).toBeNull();
    // The container still runs programs from its image's layers.
    const r = await skiff.runtime.ExecSync({ containerId: containerId!, cmd: ['sh', '-c', 'cat /in-use-marker && ls /bin/busybox >/dev/null && echo ok'], timeout: 10 });
    expect(Buffer.from(r.stdout!).toString()).toMatch(/in use \d+ok/);
    const before = (await fs.readdir(path.join(dirs.root, 'snapshots'))).length;
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    expect((await fs.readdir(path.join(dirs.root, 'snapshots'))).length).toBe(before - 1);
  });

  it('clears the remains of a pod and container whose records a crash lost', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const infraPid = JSON.parse((await skiff.runtime.PodSandboxStatus({ podSandboxId: pod.id, verbose: true })).info!.info!).pid as number;
    await skiff.stop('SIGKILL');
    // As if skiff had died before it saved them.
    const Database = (await import('better-sqlite3')).default;
    const db = new Database(path.join(dirs.root, 'metadata.db'));
    db.prepare('DELETE FROM containers WHERE id = ?').run(c);
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(pod.id);
    db.close();
    await skiff.start();
    expect(mountsUnder(path.join(dirs.state, 'sandboxes', pod.id))).toEqual([]);
    expect(mountsUnder(path.join(dirs.root, 'containers', c))).toEqual([]);
    expect(processesMentioning(c)).toEqual([]);
    // Killed by runc delete; gone once the host's init has reaped it (a zombie until then).
    await waitFor('the orphaned infra process to go', async () => {
      const stat = await fs.readFile(`/proc/${infraPid}/stat`, 'utf8').catch(() => '');
      return stat === '' || / Z /.test(stat);
    });
    expect(await fs.readdir(path.join(dirs.root, 'cni', 'cache')).catch(() => [])).not.toContain(`${pod.id}.json`);
  });

  it('joins another container\'s PID namespace with NamespaceMode TARGET', async () => {
    const pod = await runPod();
    const target = await runContainer(pod, { command: ['sh', '-c', 'exec sleep 4242'] });
    const debug = await runContainer(pod, { command: ['sleep', '1000'], linux: { securityContext: { namespaceOptions: { pid: 'TARGET', targetId: target } } } });
    const r = await skiff.runtime.ExecSync({ containerId: debug, cmd: ['sh', '-c', 'ps -o args | grep -c "^sleep 4242"'], timeout: 10 });
    expect(Buffer.from(r.stdout!).toString().trim()).toBe('1');
    const err = await codeOf(skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name: 'bad-target' }, image: { image }, command: ['true'], linux: { securityContext: { namespaceOptions: { pid: 'TARGET', targetId: 'nope' } } } },
      sandboxConfig: pod.config,
    }));
    expect(err.code).toBe(grpc.status.INVALID_ARGUMENT);
  });

  it('gives one of two concurrent same-name pods AlreadyExists', async () => {
    const config = podConfig(dirs);
    const results = await Promise.allSettled([skiff.runtime.RunPodSandbox({ config }), skiff.runtime.RunPodSandbox({ config })]);
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected')!;
    expect((failed.reason as grpc.ServiceError).code).toBe(grpc.status.ALREADY_EXISTS);
  });

  it('streams container events for the kubelet\'s evented PLEG', async () => {
    const { loadCri } = await import('../../src/server/proto.js');
    const client = new (loadCri().runtime.v1.RuntimeService)(`unix:${dirs.socket}`, grpc.credentials.createInsecure());
    const seen: Array<{ id: string; type: string; podState?: string; n: number }> = [];
    const call = client.GetContainerEvents({});
    call.on('data', (e: { containerId: string; containerEventType: string; podSandboxStatus?: { state: string }; containersStatuses: unknown[] }) =>
      seen.push({ id: e.containerId, type: e.containerEventType, podState: e.podSandboxStatus?.state, n: e.containersStatuses.length }),
    );
    call.on('error', () => undefined);
    try {
      await waitFor('the event stream to be open', async () => skiff.log.includes('rpc stream opened'));
      const pod = await runPod();
      const c = await runContainer(pod, { command: ['true'] });
      await waitState(c, 'CONTAINER_EXITED');
      await skiff.runtime.RemoveContainer({ containerId: c });
      await waitFor('four events', async () => seen.filter((e) => e.id === c).length >= 4);
      expect(seen.filter((e) => e.id === c).map((e) => e.type)).toEqual(['CONTAINER_CREATED_EVENT', 'CONTAINER_STARTED_EVENT', 'CONTAINER_STOPPED_EVENT', 'CONTAINER_DELETED_EVENT']);
      expect(seen.find((e) => e.id === c)?.podState).toBe('SANDBOX_READY');
    } finally {
      call.cancel();
      client.close();
    }
  });

  it('updates a running container\'s resources', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'], linux: { resources: { memoryLimitInBytes: 64 << 20 } } });
    const limit = async () => {
      const r = await skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max'], timeout: 10 });
      return Number(Buffer.from(r.stdout!).toString().trim());
    };
    expect(await limit()).toBe(64 << 20);
    await skiff.runtime.UpdateContainerResources({ containerId: c, linux: { memoryLimitInBytes: 96 << 20 } });
    expect(await limit()).toBe(96 << 20);
    const st = await skiff.runtime.ContainerStatus({ containerId: c });
    expect(Number(st.status?.resources?.linux?.memoryLimitInBytes)).toBe(96 << 20);
  });

  it('reports container stats from cgroups', async () => {
    const pod = await runPod();
    // The file is page cache (mostly inactive, so hardly in the working set); the shell variable
    // is anonymous memory that is (the shell stays: sleep is not its last command, so no exec).
    const c = await runContainer(pod, { command: ['sh', '-c', 'head -c 20000000 /dev/zero > /tmp/fill; x=$(head -c 4000000 /dev/zero | tr "\\0" a); sleep 1000; echo "${#x}"'] });
    const stats = await waitFor('memory to show up', async () => {
      const s = await skiff.runtime.ContainerStats({ containerId: c });
      return Number(s.stats?.writableLayer?.usedBytes?.value) > 19_000_000 && Number(s.stats?.memory?.workingSetBytes?.value) > 1_000_000 ? s.stats : undefined;
    });
    expect(Number(stats!.memory?.workingSetBytes?.value)).toBeGreaterThan(0);
    expect(Number(stats!.cpu?.usageCoreNanoSeconds?.value)).toBeGreaterThan(0);
    const list = await skiff.runtime.ListContainerStats({ filter: { podSandboxId: pod.id } });
    expect(list.stats?.map((s) => s.attributes?.id)).toEqual([c]);
    const ps = await skiff.runtime.PodSandboxStats({ podSandboxId: pod.id });
    expect(ps.stats?.linux?.network?.defaultInterface?.name).toBe('eth0');
    const desc = await skiff.runtime.ListMetricDescriptors({});
    expect(desc.descriptors?.map((d) => d.name)).toContain('container_memory_working_set_bytes');
    const metrics = await skiff.runtime.ListPodSandboxMetrics({});
    const mine = metrics.podMetrics?.find((m) => m.podSandboxId === pod.id);
    const ws = mine?.containerMetrics?.[0]?.metrics?.find((m) => m.name === 'container_memory_working_set_bytes');
    expect(Number(ws?.value?.value)).toBeGreaterThan(0);
    expect(ws?.labelValues?.[1]).toBe(pod.config.metadata.name);
  });

  it('keeps containers running across a daemon restart and kill -9, and sees exits that happened meanwhile', async () => {
    const pod = await runPod();
    const keep = await runContainer(pod, { command: ['sleep', '1000'] });
    const quit = await runContainer(pod, { command: ['sh', '-c', 'read x < /tmp/go 2>/dev/null; sleep 1000'] });
    await skiff.stop('SIGKILL');
    await skiff.start();
    expect((await skiff.runtime.ContainerStatus({ containerId: keep })).status?.state).toBe('CONTAINER_RUNNING');
    const r = await skiff.runtime.ExecSync({ containerId: keep, cmd: ['echo', 'alive'], timeout: 10 });
    expect(Buffer.from(r.stdout!).toString()).toBe('alive\n');
    // The second container exits while skiff is down; the restarted daemon must notice.
    const pid = JSON.parse((await skiff.runtime.ContainerStatus({ containerId: quit, verbose: true })).info!.info!).pid as number;
    expect((await skiff.stop()).code).toBe(0);
    process.kill(pid, 'SIGKILL');
    await new Promise((res) => setTimeout(res, 300));
    await skiff.start();
    const st = await waitState(quit, 'CONTAINER_EXITED');
    expect(st.exitCode).toBe(137);
    expect((await skiff.runtime.ContainerStatus({ containerId: keep })).status?.state).toBe('CONTAINER_RUNNING');
  });
});
