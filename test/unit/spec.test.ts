import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { buildSpec, capsFromMask, commandLine, DEFAULT_CAPS, mergeEnv, type PodContext } from '../../src/container/spec.js';
import { seccompChoice, toOciSeccomp } from '../../src/container/seccomp.js';
import { resolveUser } from '../../src/container/user.js';
import type { ContainerConfig__Output } from '../../src/gen/runtime/v1/ContainerConfig.js';

const image = { config: { Entrypoint: ['/entry'], Cmd: ['default-arg'], Env: ['PATH=/bin', 'A=image'], WorkingDir: '/work', User: '' } };

function config(over: Partial<ContainerConfig__Output> = {}): ContainerConfig__Output {
  return {
    metadata: { name: 'c', attempt: 0 },
    image: null,
    command: [],
    args: [],
    workingDir: '',
    envs: [],
    mounts: [],
    devices: [],
    labels: {},
    annotations: {},
    logPath: '',
    stdin: false,
    stdinOnce: false,
    tty: false,
    linux: null,
    windows: null,
    CDIDevices: [],
    stopSignal: 'RUNTIME_DEFAULT',
    ...over,
  } as unknown as ContainerConfig__Output;
}

const pod: PodContext = {
  sandboxId: 'sb',
  netns: '/run/ns/net',
  ipcns: '/run/ns/ipc',
  utsns: '/run/ns/uts',
  infraPid: 42,
  hostPid: false,
  hostsFile: '/sb/hosts',
  resolvFile: '/sb/resolv.conf',
  hostnameFile: '/sb/hostname',
  shmPath: '/sb/shm',
  cgroupParent: '/kubepods/pod1',
  sysctls: { 'net.ipv4.ip_unprivileged_port_start': '0' },
};

describe('commandLine (the kubelet\'s rules)', () => {
  it.each([
    [[], [], ['/entry', 'default-arg']],
    [[], ['x'], ['/entry', 'x']],
    [['/bin/sh'], [], ['/bin/sh']],
    [['/bin/sh'], ['-c', 'true'], ['/bin/sh', '-c', 'true']],
  ])('command %j args %j → %j', (command, args, want) => {
    expect(commandLine(image, { command, args })).toEqual(want);
  });
  it('refuses a container with no command anywhere', () => {
    expect(() => commandLine({}, { command: [], args: [] })).toThrow(/no command/);
  });
});

describe('buildSpec', () => {
  const base = { id: 'abc', image, rootfs: '/rootfs', user: { uid: 0, gid: 0, additionalGids: [] }, oomScoreAdjFloor: 0, pod };

  it('merges env (CRI wins), joins the pod\'s namespaces and mounts its files', () => {
    const s = buildSpec({ ...base, config: config({ envs: [{ key: 'A', value: Buffer.from('cri') }, { key: 'B', value: Buffer.from('b') }] as never }) });
    expect(s.process.env).toEqual(['PATH=/bin', 'A=cri', 'B=b']);
    expect(s.process.cwd).toBe('/work');
    // No namespace_options: the proto default, POD, joins the infra process's PID namespace.
    expect(s.linux.namespaces).toEqual([{ type: 'mount' }, { type: 'pid', path: '/proc/42/ns/pid' }, { type: 'network', path: '/run/ns/net' }, { type: 'ipc', path: '/run/ns/ipc' }, { type: 'uts', path: '/run/ns/uts' }]);
    expect(s.mounts.filter((m) => m.type === 'bind').map((m) => [m.destination, m.source])).toEqual([
      ['/etc/hosts', '/sb/hosts'],
      ['/etc/resolv.conf', '/sb/resolv.conf'],
      ['/etc/hostname', '/sb/hostname'],
      ['/dev/shm', '/sb/shm'],
    ]);
    expect(s.linux.cgroupsPath).toBe('/kubepods/pod1/skiff-abc');
    expect(s.linux.sysctl).toEqual(pod.sysctls);
    expect(s.process.capabilities.bounding).toEqual(DEFAULT_CAPS);
  });

  it('shares the pod\'s PID namespace through the infra process when asked, and has its own with CONTAINER', () => {
    const s = buildSpec({ ...base, config: config({ linux: { securityContext: { namespaceOptions: { pid: 'POD' } } } as never }) });
    expect(s.linux.namespaces).toContainEqual({ type: 'pid', path: '/proc/42/ns/pid' });
    const own = buildSpec({ ...base, config: config({ linux: { securityContext: { namespaceOptions: { pid: 'CONTAINER' } } } as never }) });
    expect(own.linux.namespaces).toContainEqual({ type: 'pid' });
  });

  it('sets HOSTNAME to the pod\'s hostname, unless the image or the kubelet set it', () => {
    const withHost = { ...base, pod: { ...pod, hostname: 'web-0' } };
    expect(buildSpec({ ...withHost, config: config() }).process.env).toEqual(['HOSTNAME=web-0', 'PATH=/bin', 'A=image']);
    expect(buildSpec({ ...withHost, config: config({ envs: [{ key: 'HOSTNAME', value: 'mine' }] as never }) }).process.env).toContain('HOSTNAME=mine');
    expect(buildSpec({ ...base, config: config() }).process.env.some((e) => e.startsWith('HOSTNAME='))).toBe(false);
  });

  it('applies resources, clamps oom_score_adj, and maps mount propagation', () => {
    const s = buildSpec({
      ...base,
      oomScoreAdjFloor: -500,
      config: config({
        linux: { resources: { cpuShares: 512, cpuQuota: 50000, cpuPeriod: 100000, memoryLimitInBytes: 1 << 26, oomScoreAdj: -999, cpusetCpus: '0', cpusetMems: '', hugepageLimits: [], unified: {}, memorySwapLimitInBytes: 0 } } as never,
        mounts: [{ containerPath: '/data', hostPath: '/host/data', readonly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' }] as never,
      }),
    });
    expect(s.linux.resources.cpu).toEqual({ shares: 512, quota: 50000, period: 100000, cpus: '0' });
    expect(s.linux.resources.memory).toEqual({ limit: 1 << 26 });
    expect(s.process.oomScoreAdj).toBe(-500);
    expect(s.mounts.at(-1)).toEqual({ destination: '/data', type: 'bind', source: '/host/data', options: ['rbind', 'rslave', 'ro'] });
    expect(s.linux.rootfsPropagation).toBe('rslave');
  });

  it('adds and drops capabilities, never beyond what the daemon holds', () => {
    const caps = (sc: unknown, allowed?: string[]) => buildSpec({ ...base, allowedCaps: allowed, config: config({ linux: { securityContext: sc } as never }) }).process.capabilities.bounding;
    expect(caps({ capabilities: { addCapabilities: ['NET_ADMIN'], dropCapabilities: ['KILL'] } })).toEqual([...DEFAULT_CAPS.filter((c) => c !== 'CAP_KILL'), 'CAP_NET_ADMIN']);
    expect(caps({ capabilities: { addCapabilities: ['NET_BIND_SERVICE'], dropCapabilities: ['ALL'] } })).toEqual(['CAP_NET_BIND_SERVICE']);
    expect(caps({ privileged: true }, ['CAP_CHOWN', 'CAP_SYS_ADMIN'])).toEqual(['CAP_CHOWN', 'CAP_SYS_ADMIN']);
  });

  it('reads capability masks in kernel numbering', () => {
    expect(capsFromMask('3')).toEqual(['CAP_CHOWN', 'CAP_DAC_OVERRIDE']);
    expect(capsFromMask('1fffeffffff')).not.toContain('CAP_SYS_RESOURCE');
  });

  it('merges env without duplicating keys', () => {
    expect(mergeEnv(['A=1', 'B=2'], [{ key: 'A', value: '3' }])).toEqual(['A=3', 'B=2']);
  });
});

describe('resolveUser', () => {
  it('resolves names, groups and memberships from the image, and never follows symlinked files', async () => {
    const root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-user-'));
    try {
      await fs.mkdir(path.join(root, 'etc'));
      await fs.writeFile(path.join(root, 'etc/passwd'), 'root:x:0:0::/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n');
      await fs.writeFile(path.join(root, 'etc/group'), 'app:x:1000:\nextra:x:3000:app,other\nstaff:x:50:\n');
      expect(await resolveUser(root, { imageUser: 'app', supplementalGroups: [] })).toEqual({ uid: 1000, gid: 1000, additionalGids: [3000], home: '/home/app' });
      expect(await resolveUser(root, { imageUser: 'app:staff', supplementalGroups: [7] })).toMatchObject({ uid: 1000, gid: 50, additionalGids: [7, 3000] });
      expect(await resolveUser(root, { runAsUser: 4242, supplementalGroups: [] })).toEqual({ uid: 4242, gid: 0, additionalGids: [], home: undefined });
      expect(await resolveUser(root, { imageUser: '5:6', supplementalGroups: [] })).toMatchObject({ uid: 5, gid: 6 });
      await expect(resolveUser(root, { runAsUsername: 'ghost', supplementalGroups: [] })).rejects.toThrow(/ghost/);
      await fs.rm(path.join(root, 'etc/passwd'));
      await fs.symlink('/etc/passwd', path.join(root, 'etc/passwd'));
      await expect(resolveUser(root, { imageUser: 'root', supplementalGroups: [] })).rejects.toThrow(/not in the image/);
    } finally {
      await fs.rm(root, { recursive: true, force: true });
    }
  });
});

describe('seccomp', () => {
  it('reads the profile choice from both CRI fields', () => {
    expect(seccompChoice(null, '')).toEqual({ kind: 'unconfined' });
    expect(seccompChoice(null, 'runtime/default')).toEqual({ kind: 'default' });
    expect(seccompChoice(null, 'docker/default')).toEqual({ kind: 'default' });
    expect(seccompChoice(null, 'localhost//p.json')).toEqual({ kind: 'localhost', path: '/p.json' });
    expect(() => seccompChoice(null, '/p.json')).toThrow(/unknown seccomp profile/);
    expect(seccompChoice({ profileType: 'Localhost', localhostRef: '/q.json' }, 'unconfined')).toEqual({ kind: 'localhost', path: '/q.json' });
    expect(seccompChoice({ profileType: 'RuntimeDefault' }, '')).toEqual({ kind: 'default' });
  });
  it('converts Docker\'s profile format', () => {
    expect(toOciSeccomp({ defaultAction: 'SCMP_ACT_ALLOW', archMap: [{ architecture: 'SCMP_ARCH_X86_64', subArchitectures: ['SCMP_ARCH_X86'] }], syscalls: [{ name: 'sethostname', action: 'SCMP_ACT_ERRNO' }] })).toEqual({
      defaultAction: 'SCMP_ACT_ALLOW',
      architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86'],
      syscalls: [{ names: ['sethostname'], action: 'SCMP_ACT_ERRNO' }],
    });
  });
});
