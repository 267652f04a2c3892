/**
 * The OCI runtime config for a container: the image's config and the CRI
 * ContainerConfig merged the way the kubelet expects (containerd and CRI-O
 * agree on these rules), inside namespaces the pod provides.
 */
import type { ContainerConfig__Output } from '../gen/runtime/v1/ContainerConfig.js';
import { invalidArgument } from '../errors.js';
import type { ImageConfig } from '../image/service.js';
import { DEFAULT_MASKED, DEFAULT_READONLY } from '../oci/defaults.js';

export interface OciSpec {
  ociVersion: string;
  process: {
    terminal: boolean;
    user: { uid: number; gid: number; additionalGids?: number[]; umask?: number };
    args: string[];
    env: string[];
    cwd: string;
    capabilities: Record<'bounding' | 'effective' | 'permitted' | 'inheritable' | 'ambient', string[]>;
    noNewPrivileges: boolean;
    oomScoreAdj?: number;
    rlimits?: Array<{ type: string; hard: number; soft: number }>;
    apparmorProfile?: string;
  };
  root: { path: string; readonly: boolean };
  hostname?: string;
  mounts: Array<{ destination: string; type: string; source: string; options: string[] }>;
  annotations: Record<string, string>;
  linux: {
    namespaces: Array<{ type: string; path?: string }>;
    resources: Record<string, unknown>;
    cgroupsPath: string;
    sysctl?: Record<string, string>;
    maskedPaths: string[];
    readonlyPaths: string[];
    rootfsPropagation?: string;
    devices?: Array<Record<string, unknown>>;
    seccomp?: Record<string, unknown>;
    uidMappings?: OciIdMapping[];
    gidMappings?: OciIdMapping[];
  };
}

export interface OciIdMapping {
  containerID: number;
  hostID: number;
  size: number;
}

/** The capabilities a container has unless it asks otherwise (the same set containerd and Docker grant). */
export const DEFAULT_CAPS = [
  'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_FSETID', 'CAP_FOWNER', 'CAP_MKNOD', 'CAP_NET_RAW', 'CAP_SETGID',
  'CAP_SETUID', 'CAP_SETFCAP', 'CAP_SETPCAP', 'CAP_NET_BIND_SERVICE', 'CAP_SYS_CHROOT', 'CAP_KILL', 'CAP_AUDIT_WRITE',
];

export const ALL_CAPS = [
  'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_DAC_READ_SEARCH', 'CAP_FOWNER', 'CAP_FSETID', 'CAP_KILL', 'CAP_SETGID', 'CAP_SETUID',
  'CAP_SETPCAP', 'CAP_LINUX_IMMUTABLE', 'CAP_NET_BIND_SERVICE', 'CAP_NET_BROADCAST', 'CAP_NET_ADMIN', 'CAP_NET_RAW',
  'CAP_IPC_LOCK', 'CAP_IPC_OWNER', 'CAP_SYS_MODULE', 'CAP_SYS_RAWIO', 'CAP_SYS_CHROOT', 'CAP_SYS_PTRACE', 'CAP_SYS_PACCT',
  'CAP_SYS_ADMIN', 'CAP_SYS_BOOT', 'CAP_SYS_NICE', 'CAP_SYS_RESOURCE', 'CAP_SYS_TIME', 'CAP_SYS_TTY_CONFIG', 'CAP_MKNOD',
  'CAP_LEASE', 'CAP_AUDIT_WRITE', 'CAP_AUDIT_CONTROL', 'CAP_SETFCAP', 'CAP_MAC_OVERRIDE', 'CAP_MAC_ADMIN', 'CAP_SYSLOG',
  'CAP_WAKE_ALARM', 'CAP_BLOCK_SUSPEND', 'CAP_AUDIT_READ', 'CAP_PERFMON', 'CAP_BPF', 'CAP_CHECKPOINT_RESTORE',
];


/** Where the pod's namespaces are; `undefined` means the host's (NODE mode). */
export interface PodContext {
  sandboxId: string;
  netns?: string;
  ipcns?: string;
  utsns?: string;
  /** The pod's user namespace (a pinned file) and its mappings; none: the host's. */
  userns?: { path: string; uidMappings: OciIdMapping[]; gidMappings: OciIdMapping[] };
  /** The infra process's pid, for containers sharing the pod's PID namespace. */
  infraPid?: number;
  /** Share the host's PID namespace. */
  hostPid: boolean;
  hostsFile: string;
  resolvFile: string;
  hostnameFile: string;
  /** The pod's hostname: containers see it as $HOSTNAME, as with containerd and Docker. */
  hostname?: string;
  shmPath?: string;
  cgroupParent: string;
  sysctls: Record<string, string>;
}

export interface OciDevice {
  path: string;
  type: 'c' | 'b';
  major: number;
  minor: number;
  fileMode: number;
  uid: number;
  gid: number;
  permissions: string;
}

export interface ResolvedUser {
  uid: number;
  gid: number;
  additionalGids: number[];
  home?: string;
}

function capName(c: string): string {
  const up = c.toUpperCase();
  return up.startsWith('CAP_') ? up : `CAP_${up}`;
}

/** The command the kubelet means: CRI command/args over the image's Entrypoint/Cmd. */
export function commandLine(image: ImageConfig, cfg: Pick<ContainerConfig__Output, 'command' | 'args'>): string[] {
  const imgEntry = image.config?.Entrypoint ?? [];
  const imgCmd = image.config?.Cmd ?? [];
  let argv: string[];
  if (cfg.command.length) argv = [...cfg.command, ...cfg.args];
  else argv = [...imgEntry, ...(cfg.args.length ? cfg.args : imgCmd)];
  if (!argv.length) throw invalidArgument('no command specified: neither the container config nor the image has one');
  return argv;
}

export function mergeEnv(image: string[], cri: Array<{ key: string; value: string | Buffer }>): string[] {
  const out = new Map<string, string>();
  for (const e of image) {
    const i = e.indexOf('=');
    out.set(i < 0 ? e : e.slice(0, i), i < 0 ? '' : e.slice(i + 1));
  }
  for (const { key, value } of cri) out.set(key, Buffer.isBuffer(value) ? value.toString('utf8') : value);
  return [...out].map(([k, v]) => `${k}=${v}`);
}

/**
 * A recursive read-only mount is read-only all the way down, submounts
 * included. The CRI asks for `readonly` too and private propagation (a
 * submount arriving later through propagation could not be made read-only),
 * and only a handler that applies `rro` may take it: a plain `ro` would leave
 * the submounts writable while the kubelet believes otherwise.
 */
function checkRecursiveReadOnly(m: { containerPath: string; readonly: boolean; propagation: unknown }, supported: boolean): void {
  const where = `mount ${m.containerPath}`;
  if (!m.readonly) throw invalidArgument(`${where}: recursive_read_only requires readonly to be set too`);
  const p = String(m.propagation ?? '');
  if (!['', '0', 'undefined', 'PROPAGATION_PRIVATE'].includes(p)) throw invalidArgument(`${where}: recursive_read_only requires PROPAGATION_PRIVATE, not ${p}`);
  if (!supported) throw invalidArgument(`${where}: recursive_read_only is not supported by this runtime handler (it does not list the rro mount option)`);
}

function propagationOption(p: string): string[] {
  switch (p) {
    case 'PROPAGATION_HOST_TO_CONTAINER':
      return ['rslave'];
    case 'PROPAGATION_BIDIRECTIONAL':
      return ['rshared'];
    default:
      return ['rprivate'];
  }
}

export function buildSpec(args: {
  id: string;
  image: ImageConfig;
  config: ContainerConfig__Output;
  pod: PodContext;
  rootfs: string;
  user: ResolvedUser;
  oomScoreAdjFloor: number;
  /** The capabilities this daemon holds: a container can be given no others. */
  allowedCaps?: string[];
  /** For NamespaceMode TARGET: the pid of the container whose PID namespace to join. */
  targetPid?: number;
  /** The CRI devices, resolved on the host (type and numbers). */
  devices?: OciDevice[];
  /** Whether the pod's runtime handler applies `rro` (recursive read-only) mounts. */
  recursiveReadOnlyMounts?: boolean;
}): OciSpec {
  const { id, image, config, pod, rootfs, user } = args;
  const linux = config.linux;
  const sc = linux?.securityContext;
  const privileged = sc?.privileged ?? false;
  let caps = privileged ? [...ALL_CAPS] : [...DEFAULT_CAPS];
  const add = (sc?.capabilities?.addCapabilities ?? []).map(capName);
  const drop = (sc?.capabilities?.dropCapabilities ?? []).map(capName);
  if (!privileged) {
    if (add.includes('CAP_ALL')) caps = [...ALL_CAPS];
    else for (const c of add) if (!caps.includes(c)) caps.push(c);
    if (drop.includes('CAP_ALL')) caps = caps.filter((c) => add.includes(c));
    else caps = caps.filter((c) => !drop.includes(c));
  }
  if (args.allowedCaps) caps = caps.filter((c) => args.allowedCaps!.includes(c));
  const ambient = (sc?.capabilities?.addAmbientCapabilities ?? []).map(capName).filter((c) => caps.includes(c));

  // HOSTNAME first, so the image or the kubelet may still set their own.
  const env = mergeEnv([...(pod.hostname ? [`HOSTNAME=${pod.hostname}`] : []), ...(image.config?.Env ?? [])], config.envs);
  if (!env.some((e) => e.startsWith('HOME=')) && user.home) env.push(`HOME=${user.home}`);

  const mounts: OciSpec['mounts'] = [
    { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
    { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620', 'gid=5'] },
    { destination: '/dev/mqueue', type: 'mqueue', source: 'mqueue', options: ['nosuid', 'noexec', 'nodev'] },
    { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', privileged ? 'rw' : 'ro'] },
    { destination: '/sys/fs/cgroup', type: 'cgroup', source: 'cgroup', options: ['nosuid', 'noexec', 'nodev', 'relatime', privileged ? 'rw' : 'ro'] },
  ];
  const userMounts = new Set(config.mounts.map((m) => m.containerPath));
  const podFile = (dest: string, src: string) => {
    if (!userMounts.has(dest)) mounts.push({ destination: dest, type: 'bind', source: src, options: ['rbind', 'rprivate', sc?.readonlyRootfs ? 'ro' : 'rw'] });
  };
  podFile('/etc/hosts', pod.hostsFile);
  podFile('/etc/resolv.conf', pod.resolvFile);
  podFile('/etc/hostname', pod.hostnameFile);
  if (!userMounts.has('/dev/shm')) {
    if (pod.shmPath) mounts.push({ destination: '/dev/shm', type: 'bind', source: pod.shmPath, options: ['rbind', 'rprivate', 'rw'] });
    else mounts.push({ destination: '/dev/shm', type: 'tmpfs', source: 'shm', options: ['nosuid', 'noexec', 'nodev', 'mode=1777', 'size=65536k'] });
  }
  let rootfsPropagation: string | undefined;
  for (const m of config.mounts) {
    if (!m.containerPath.startsWith('/')) throw invalidArgument(`mount container path "${m.containerPath}" is not absolute`);
    if (m.uidMappings?.length || m.gidMappings?.length) throw invalidArgument(`mount ${m.containerPath}: uid/gid mappings on a mount are not supported (a pod in a user namespace gets its volumes idmapped to it)`);
    const prop = propagationOption(String(m.propagation));
    if (prop[0] === 'rshared') rootfsPropagation = 'rshared';
    else if (prop[0] === 'rslave' && rootfsPropagation !== 'rshared') rootfsPropagation = 'rslave';
    const access = m.readonly ? ['ro'] : ['rw'];
    if (m.recursiveReadOnly) {
      checkRecursiveReadOnly(m, args.recursiveReadOnlyMounts ?? false);
      access.push('rro');
    }
    mounts.push({ destination: m.containerPath, type: 'bind', source: m.hostPath, options: ['rbind', ...prop, ...access] });
  }

  const ns: OciSpec['linux']['namespaces'] = [{ type: 'mount' }];
  const nsOpts = sc?.namespaceOptions;
  // No namespace_options is the proto's default, POD (0): share the pod's PID namespace, as containerd does.
  const pidMode = String(nsOpts?.pid ?? 'POD');
  if (pidMode === 'TARGET') {
    if (!args.targetPid) throw invalidArgument(`pid namespace target "${nsOpts?.targetId ?? ''}" is not a running container`);
    ns.push({ type: 'pid', path: `/proc/${args.targetPid}/ns/pid` });
  } else if (pidMode === 'POD' && pod.infraPid) ns.push({ type: 'pid', path: `/proc/${pod.infraPid}/ns/pid` });
  else if (pidMode === 'NODE' || pod.hostPid) {
    // the host's
  } else ns.push({ type: 'pid' });
  if (pod.netns) ns.push({ type: 'network', path: pod.netns });
  if (pod.ipcns) ns.push({ type: 'ipc', path: pod.ipcns });
  if (pod.utsns) ns.push({ type: 'uts', path: pod.utsns });
  if (pod.userns) ns.push({ type: 'user', path: pod.userns.path });

  const res = linux?.resources;
  const resources: Record<string, unknown> = {
    devices: [{ allow: privileged, access: 'rwm' }],
  };
  if (res) {
    const cpu: Record<string, unknown> = {};
    if (res.cpuShares) cpu.shares = res.cpuShares;
    if (res.cpuQuota) cpu.quota = res.cpuQuota;
    if (res.cpuPeriod) cpu.period = res.cpuPeriod;
    if (res.cpusetCpus) cpu.cpus = res.cpusetCpus;
    if (res.cpusetMems) cpu.mems = res.cpusetMems;
    if (Object.keys(cpu).length) resources.cpu = cpu;
    if (res.memoryLimitInBytes) {
      resources.memory = { limit: res.memoryLimitInBytes, ...(res.memorySwapLimitInBytes ? { swap: res.memorySwapLimitInBytes } : {}) };
    }
    if (res.hugepageLimits.length) resources.hugepageLimits = res.hugepageLimits.map((h) => ({ pageSize: h.pageSize, limit: h.limit }));
    if (Object.keys(res.unified).length) resources.unified = res.unified;
  }
  const oom = res?.oomScoreAdj ?? 0;
  const devices = args.devices ?? [];
  if (devices.length) {
    resources.devices = [
      ...(resources.devices as unknown[]),
      ...devices.map((d) => ({ allow: true, type: d.type, major: d.major, minor: d.minor, access: d.permissions })),
    ];
  }

  const spec: OciSpec = {
    ociVersion: '1.0.2-dev',
    process: {
      terminal: config.tty,
      user: { uid: user.uid, gid: user.gid, ...(user.additionalGids.length ? { additionalGids: user.additionalGids } : {}) },
      args: commandLine(image, config),
      env,
      cwd: config.workingDir || image.config?.WorkingDir || '/',
      capabilities: { bounding: caps, effective: caps, permitted: caps, inheritable: [], ambient },
      noNewPrivileges: sc?.noNewPrivs ?? false,
      oomScoreAdj: Math.max(oom, args.oomScoreAdjFloor),
    },
    root: { path: rootfs, readonly: sc?.readonlyRootfs ?? false },
    mounts,
    annotations: { ...config.annotations, 'io.kubernetes.cri.container-type': 'container', 'io.kubernetes.cri.sandbox-id': pod.sandboxId },
    linux: {
      namespaces: ns,
      resources,
      cgroupsPath: `${pod.cgroupParent.replace(/\/+$/, '')}/skiff-${id}`,
      maskedPaths: privileged ? [] : sc?.maskedPaths?.length ? sc.maskedPaths : DEFAULT_MASKED,
      readonlyPaths: privileged ? [] : sc?.readonlyPaths?.length ? sc.readonlyPaths : DEFAULT_READONLY,
      ...(rootfsPropagation ? { rootfsPropagation } : {}),
      ...(pod.userns ? { uidMappings: pod.userns.uidMappings, gidMappings: pod.userns.gidMappings } : {}),
      ...(Object.keys(pod.sysctls).length ? { sysctl: pod.sysctls } : {}),
      ...(devices.length ? { devices: devices.map(({ permissions: _p, ...d }) => d) } : {}),
    },
  };
  return spec;
}

/** The capability names in a /proc/<pid>/status Cap* mask (kernel numbering). */
export function capsFromMask(hex: string): string[] {
  const mask = BigInt(`0x${hex}`);
  return ALL_CAPS.filter((_c, i) => (mask >> BigInt(i)) & 1n);
}
