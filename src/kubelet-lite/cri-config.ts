/**
 * Pod → CRI configs, the way the kubelet's kuberuntime builds them: the
 * sandbox config (hostname, DNS, ports, namespaces, sysctls) and each
 * container's (command with $(VAR), env, mounts, resources, security
 * context, labels and annotations the kubelet's tools know).
 *
 * containerConfig is synchronous by contract, so the little file work it does
 * (subPath directories, the termination message file) uses sync fs calls.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Container, Pod, PodSecurityContext, SeccompProfile, SecurityContext, Service, VolumeMount } from 'kubernetes-types/core/v1.js';
import type { ContainerConfig } from '../gen/runtime/v1/ContainerConfig.js';
import type { LinuxContainerSecurityContext } from '../gen/runtime/v1/LinuxContainerSecurityContext.js';
import type { Mount } from '../gen/runtime/v1/Mount.js';
import type { MountPropagation } from '../gen/runtime/v1/MountPropagation.js';
import type { NamespaceOption } from '../gen/runtime/v1/NamespaceOption.js';
import type { PodSandboxConfig } from '../gen/runtime/v1/PodSandboxConfig.js';
import type { PortMapping } from '../gen/runtime/v1/PortMapping.js';
import type { Protocol } from '../gen/runtime/v1/Protocol.js';
import type { SecurityProfile } from '../gen/runtime/v1/SecurityProfile.js';
import { AT_FDCWD, MNT_DETACH, mount as libcMount, O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, umount2, UMOUNT_NOFOLLOW } from '../sys/libc.js';
import { NotOwnDirectoryError, openDirBeneath, STRICT } from './beneath.js';
import { podDnsConfig } from './dns.js';
import { expand, mapLookup, resolveEnv, servicesFromObjects } from './env.js';
import {
  CONTAINER_NAME_LABEL,
  CONTAINER_TYPE_LABEL,
  ContainerConfigError,
  MANAGED_BY_LABEL,
  NODE_LABEL,
  POD_NAME_LABEL,
  POD_NAMESPACE_LABEL,
  POD_UID_LABEL,
  RESTART_COUNT_ANNOTATION,
  CONTAINER_IMAGE_ANNOTATION,
  TERMINATION_GRACE_ANNOTATION,
  TERMINATION_MESSAGE_PATH_ANNOTATION,
  TERMINATION_MESSAGE_POLICY_ANNOTATION,
  type ConfigBuilder,
  type ContainerConfigOptions,
  type PodContext,
} from './model.js';
import { containerResources, hostCapacity, type NodeCapacity } from './resources.js';
import { createTerminationLog } from './termination-log.js';

export const CONTAINER_HASH_ANNOTATION = 'io.kubernetes.container.hash';
const HOSTNAME_MAX = 63;
/** Volume kinds the kubelet always mounts read-only (since CVE-2017-1002102). */
const READ_ONLY_VOLUMES = ['configMap', 'secret', 'downwardAPI', 'projected'] as const;

/** Where a container instance's termination message lives on the host; the worker reads it after the exit. */
export function terminationLogHostPath(podDir: string, containerName: string, restartCount: number): string {
  // The name may come back from the runtime (a container someone else made with the pod's labels): one plain component only.
  if (!containerName || containerName === '.' || containerName === '..' || containerName.includes('/') || !Number.isSafeInteger(restartCount)) {
    throw new Error(`no termination log for container ${JSON.stringify(containerName)} instance ${restartCount}`);
  }
  return path.join(podDir, 'containers', containerName, `${restartCount}.termination-log`);
}

/** The pod's log directory, which the runtime writes container logs under. */
export function podLogDirectory(podDir: string): string {
  return path.join(podDir, 'logs');
}

/**
 * The log file the runtime reports for a container, if it is under the pod's
 * log directory: the runtime takes any log path a CRI client gives, and the
 * agent serves and reads these files for anyone who asks its status API.
 */
export function containerLogIn(podDir: string, logPath: string): string | undefined {
  if (!logPath) return undefined;
  const dir = podLogDirectory(podDir);
  const file = path.resolve(dir, logPath);
  return file.startsWith(dir + '/') ? file : undefined;
}

/** spec.hostname or the pod's name, cut to 63 characters without a trailing '-' or '.'. */
export function podHostname(pod: Pod): string {
  const name = pod.spec?.hostname || pod.metadata?.name || '';
  if (name.length <= HOSTNAME_MAX) return name;
  return name.slice(0, HOSTNAME_MAX).replace(/[-.]+$/, '');
}

/** The name the pod's kernel gets: its hostname, or with setHostnameAsFQDN its FQDN (64 characters at most). */
export function kernelHostname(pod: Pod, clusterDomain: string): string {
  const host = podHostname(pod);
  const domain = podDomain(pod, clusterDomain);
  if (!pod.spec?.setHostnameAsFQDN || !domain) return host;
  const fqdn = `${host}.${domain}`;
  if (fqdn.length > 64) {
    throw new ContainerConfigError(`failed to construct FQDN from pod hostname and cluster domain, FQDN ${fqdn} is too long (64 characters is the max, ${fqdn.length} characters requested)`);
  }
  return fqdn;
}

/** The domain part of the pod's FQDN when spec.subdomain is set: `<subdomain>.<ns>.svc.<cluster-domain>`. */
export function podDomain(pod: Pod, clusterDomain: string): string {
  const sub = pod.spec?.subdomain;
  if (!sub || !clusterDomain) return '';
  return `${sub}.${pod.metadata?.namespace || 'default'}.svc.${clusterDomain}`;
}

function podNamespace(pod: Pod): string {
  return pod.metadata?.namespace || 'default';
}

/**
 * Network and IPC: the pod's unless on the host's; PID: per container unless
 * shared in the pod or the host's. A `hostUsers: false` pod also gets its own
 * user namespace, mapping its ids 0..length-1 to the block allocated to it;
 * without a block it cannot be configured (never silently the host's).
 */
export function namespacesForPod(pod: Pod, userns?: PodContext['userns']): NamespaceOption {
  const s = pod.spec;
  const out: NamespaceOption = {
    network: s?.hostNetwork ? 'NODE' : 'POD',
    pid: s?.hostPID ? 'NODE' : s?.shareProcessNamespace ? 'POD' : 'CONTAINER',
    ipc: s?.hostIPC ? 'NODE' : 'POD',
  };
  if (s?.hostUsers === false) {
    if (!userns) throw new ContainerConfigError('no user namespace range has been allocated for the pod (spec.hostUsers: false)');
    const range = [{ hostId: userns.hostId, containerId: 0, length: userns.length }];
    out.usernsOptions = { mode: 'POD', uids: range, gids: range.map((r) => ({ ...r })) };
  } else if (s?.hostUsers === true) {
    out.usernsOptions = { mode: 'NODE', uids: [], gids: [] };
  }
  return out;
}

/**
 * The container's AppArmor profile, else the pod's, else the deprecated
 * per-container annotation's; undefined when none asks (the runtime's default).
 */
export function appArmorProfile(pod: Pod, container: string, cSc: SecurityContext | undefined): SecurityProfile | undefined {
  const p = cSc?.appArmorProfile ?? pod.spec?.securityContext?.appArmorProfile;
  if (p) {
    if (p.type === 'Localhost') return { profileType: 'Localhost', localhostRef: p.localhostProfile ?? '' };
    return { profileType: p.type === 'RuntimeDefault' ? 'RuntimeDefault' : 'Unconfined' };
  }
  const a = pod.metadata?.annotations?.[`container.apparmor.security.beta.kubernetes.io/${container}`];
  if (a === undefined) return undefined;
  if (a.startsWith('localhost/')) return { profileType: 'Localhost', localhostRef: a.slice('localhost/'.length) };
  return { profileType: a === 'runtime/default' ? 'RuntimeDefault' : 'Unconfined' };
}

/** The container's seccomp profile, else the pod's, else Unconfined (the kubelet's default without SeccompDefault). */
export function seccompProfile(podSc: PodSecurityContext | undefined, cSc: SecurityContext | undefined, profileRoot: string): SecurityProfile {
  const p: SeccompProfile | undefined = cSc?.seccompProfile ?? podSc?.seccompProfile;
  switch (p?.type) {
    case 'RuntimeDefault':
      return { profileType: 'RuntimeDefault' };
    case 'Localhost':
      if (!p.localhostProfile) throw new ContainerConfigError('localhostProfile must be set if seccompProfile type is Localhost.');
      // Validation refuses these already; a profile that leaves the seccomp directory must never reach the runtime.
      if (path.isAbsolute(p.localhostProfile) || p.localhostProfile.split('/').includes('..')) {
        throw new ContainerConfigError(`localhostProfile ${JSON.stringify(p.localhostProfile)} must be a path beneath ${profileRoot} without '..'`);
      }
      return { profileType: 'Localhost', localhostRef: path.join(profileRoot, p.localhostProfile) };
    default:
      return { profileType: 'Unconfined' };
  }
}

function supplementalGroups(podSc: PodSecurityContext | undefined): number[] {
  const out: number[] = [];
  if (podSc?.fsGroup !== undefined) out.push(podSc.fsGroup);
  for (const g of podSc?.supplementalGroups ?? []) out.push(g);
  return out;
}

function allContainers(pod: Pod): Container[] {
  return [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
}

/** FNV-1a (32 bits) of the container spec: changes when the spec does, as the kubelet's container hash. */
export function containerHash(c: Container): string {
  let h = 0x811c9dc5;
  for (const b of Buffer.from(JSON.stringify(c))) {
    h ^= b;
    h = Math.imul(h, 0x01000193) >>> 0;
  }
  return h.toString(16);
}

function podRef(ctx: PodContext): string {
  return `${ctx.pod.metadata?.name}_${podNamespace(ctx.pod)}(${ctx.uid})`;
}

/** The kubelet's runAsNonRoot check, against the user the container will really run as. */
export function verifyRunAsNonRoot(ctx: PodContext, c: Container, imageUser: ContainerConfigOptions['imageUser']): void {
  const podSc = ctx.pod.spec?.securityContext;
  const nonRoot = c.securityContext?.runAsNonRoot ?? podSc?.runAsNonRoot;
  if (!nonRoot) return;
  const suffix = `(pod: "${podRef(ctx)}", container: ${c.name})`;
  const runAsUser = c.securityContext?.runAsUser ?? podSc?.runAsUser;
  if (runAsUser !== undefined) {
    if (runAsUser === 0) throw new ContainerConfigError(`container's runAsUser breaks non-root policy ${suffix}`);
    return;
  }
  if (imageUser?.uid === undefined && imageUser?.username) {
    throw new ContainerConfigError(`container has runAsNonRoot and image has non-numeric user (${imageUser.username}), cannot verify user is non-root ${suffix}`);
  }
  // No user from the image at all is root, as it is for the runtime.
  if ((imageUser?.uid ?? 0) === 0) throw new ContainerConfigError(`container has runAsNonRoot and image will run as root ${suffix}`);
}

export interface ConfigBuilderOptions {
  /** The node's capacity, for limits a container leaves open (default: this host's). */
  node?: NodeCapacity;
  /** Where Localhost seccomp profiles live (default: `<root-dir>/seccomp`, beside the pods directory). */
  seccompProfileRoot?: string;
  /**
   * The Services whose variables pods get (enableServiceLinks), with their
   * cluster IPs; by default the Services in the manifest directory as written.
   */
  services?: (ctx: PodContext) => Service[];
  /** Binds a checked subPath where the runtime mounts it from (default: pinSubpath; tests record instead). */
  pinSubpath?: (root: string, checked: string, target: string, targetRoot?: string) => void;
}

export class KubeletConfigBuilder implements ConfigBuilder {
  private readonly node: NodeCapacity;

  constructor(private readonly opts: ConfigBuilderOptions = {}) {
    this.node = opts.node ?? hostCapacity();
  }

  private profileRoot(ctx: PodContext): string {
    return this.opts.seccompProfileRoot ?? path.resolve(ctx.podDir, '..', '..', 'seccomp');
  }

  sandboxConfig(ctx: PodContext, attempt: number): PodSandboxConfig {
    const pod = ctx.pod;
    const ns = podNamespace(pod);
    const podSc = pod.spec?.securityContext;
    const portMappings: PortMapping[] = [];
    for (const c of pod.spec?.containers ?? []) {
      for (const p of c.ports ?? []) {
        if (!p.hostPort) continue;
        portMappings.push({ protocol: (p.protocol ?? 'TCP') as Protocol, containerPort: p.containerPort, hostPort: p.hostPort, hostIp: p.hostIP ?? '' });
      }
    }
    const sysctls: Record<string, string> = {};
    for (const s of podSc?.sysctls ?? []) sysctls[s.name] = s.value;
    return {
      metadata: { name: pod.metadata?.name ?? '', namespace: ns, uid: ctx.uid, attempt },
      // On the host's network the pod has the host's name, as the kubelet leaves it.
      hostname: pod.spec?.hostNetwork ? '' : kernelHostname(pod, ctx.clusterDomain),
      logDirectory: podLogDirectory(ctx.podDir),
      dnsConfig: podDnsConfig(pod, ctx),
      portMappings,
      labels: {
        ...(pod.metadata?.labels ?? {}),
        [POD_NAME_LABEL]: pod.metadata?.name ?? '',
        [POD_NAMESPACE_LABEL]: ns,
        [POD_UID_LABEL]: ctx.uid,
        [MANAGED_BY_LABEL]: 'true',
        [NODE_LABEL]: ctx.nodeName,
      },
      annotations: { ...(pod.metadata?.annotations ?? {}) },
      linux: {
        cgroupParent: '',
        sysctls,
        securityContext: {
          namespaceOptions: namespacesForPod(pod, ctx.userns),
          ...(podSc?.runAsUser !== undefined ? { runAsUser: { value: podSc.runAsUser } } : {}),
          ...(podSc?.runAsGroup !== undefined ? { runAsGroup: { value: podSc.runAsGroup } } : {}),
          supplementalGroups: supplementalGroups(podSc),
          privileged: allContainers(pod).some((c) => c.securityContext?.privileged === true),
          seccomp: seccompProfile(podSc, undefined, this.profileRoot(ctx)),
        },
      },
    };
  }

  containerConfig(ctx: PodContext, c: Container, opts: ContainerConfigOptions): ContainerConfig {
    const pod = ctx.pod;
    const ns = podNamespace(pod);
    verifyRunAsNonRoot(ctx, c, opts.imageUser);
    const { env, warnings } = resolveEnv(ctx, c, this.node, (this.opts.services ?? servicesFromObjects)(ctx));
    opts.warnings?.push(...warnings);
    const lookup = mapLookup(env);
    const annotations: Record<string, string> = {
      [CONTAINER_HASH_ANNOTATION]: containerHash(c),
      [RESTART_COUNT_ANNOTATION]: String(opts.restartCount),
      [CONTAINER_IMAGE_ANNOTATION]: c.image ?? '',
      [TERMINATION_MESSAGE_PATH_ANNOTATION]: c.terminationMessagePath ?? '',
      [TERMINATION_MESSAGE_POLICY_ANNOTATION]: c.terminationMessagePolicy ?? 'File',
    };
    if (pod.spec?.terminationGracePeriodSeconds !== undefined) annotations[TERMINATION_GRACE_ANNOTATION] = String(pod.spec.terminationGracePeriodSeconds);
    return {
      metadata: { name: c.name, attempt: opts.restartCount },
      image: { image: opts.image, userSpecifiedImage: c.image ?? '' },
      command: (c.command ?? []).map((s) => expand(s, lookup)),
      args: (c.args ?? []).map((s) => expand(s, lookup)),
      workingDir: c.workingDir ?? '',
      // skiff's proto declares the value as bytes (the wire form of a string): a JS string there would be taken as base64.
      envs: [...env].map(([key, value]) => ({ key, value: Buffer.from(value) })),
      mounts: this.mounts(ctx, c, opts, env),
      labels: {
        [CONTAINER_NAME_LABEL]: c.name,
        [POD_NAME_LABEL]: pod.metadata?.name ?? '',
        [POD_NAMESPACE_LABEL]: ns,
        [POD_UID_LABEL]: ctx.uid,
        [MANAGED_BY_LABEL]: 'true',
        [NODE_LABEL]: ctx.nodeName,
        [CONTAINER_TYPE_LABEL]: opts.kind,
      },
      annotations,
      logPath: path.join(c.name, `${opts.restartCount}.log`),
      stdin: c.stdin ?? false,
      stdinOnce: c.stdinOnce ?? false,
      tty: c.tty ?? false,
      linux: {
        resources: containerResources(pod, c, this.node),
        securityContext: this.securityContext(ctx, c, opts),
      },
    };
  }

  private securityContext(ctx: PodContext, c: Container, opts: ContainerConfigOptions): LinuxContainerSecurityContext {
    const podSc = ctx.pod.spec?.securityContext;
    const sc = c.securityContext;
    const out: LinuxContainerSecurityContext = { namespaceOptions: namespacesForPod(ctx.pod, ctx.userns) };
    const runAsUser = sc?.runAsUser ?? podSc?.runAsUser;
    const runAsGroup = sc?.runAsGroup ?? podSc?.runAsGroup;
    if (runAsUser !== undefined) out.runAsUser = { value: runAsUser };
    else if (runAsGroup !== undefined) {
      // CRI takes a group only beside a user: the image's, by id or name.
      if (opts.imageUser?.uid !== undefined) out.runAsUser = { value: opts.imageUser.uid };
      else if (opts.imageUser?.username) out.runAsUsername = opts.imageUser.username;
    }
    // With neither, the runtime applies the image's User whole ("1000:1000" keeps its group);
    // the image's uid alone, as the kubelet sends it, would leave the group to /etc/passwd or root.
    if (runAsGroup !== undefined) out.runAsGroup = { value: runAsGroup };
    out.supplementalGroups = supplementalGroups(podSc);
    out.privileged = sc?.privileged ?? false;
    if (sc?.capabilities) out.capabilities = { addCapabilities: [...(sc.capabilities.add ?? [])], dropCapabilities: [...(sc.capabilities.drop ?? [])] };
    out.readonlyRootfs = sc?.readOnlyRootFilesystem ?? false;
    // Only an explicit allowPrivilegeEscalation: false sets no_new_privs, as the kubelet does.
    out.noNewPrivs = sc?.allowPrivilegeEscalation === false;
    out.seccomp = seccompProfile(podSc, sc, this.profileRoot(ctx));
    const apparmor = appArmorProfile(ctx.pod, c.name, sc);
    if (apparmor) {
      out.apparmor = apparmor;
      // The deprecated string form too, for runtimes that read only it.
      out.apparmorProfile = apparmor.profileType === 'Localhost' ? `localhost/${apparmor.localhostRef}` : apparmor.profileType === 'RuntimeDefault' ? 'runtime/default' : 'unconfined';
    }
    return out;
  }

  private mounts(ctx: PodContext, c: Container, opts: ContainerConfigOptions, env: Map<string, string>): Mount[] {
    const out: Mount[] = [];
    const privileged = c.securityContext?.privileged === true;
    for (const [i, vm] of (c.volumeMounts ?? []).entries()) {
      const base = opts.volumes.get(vm.name);
      if (base === undefined) throw new ContainerConfigError(`cannot find volume "${vm.name}" to mount into container "${c.name}"`);
      const vol = ctx.pod.spec?.volumes?.find((v) => v.name === vm.name);
      const forcedRO = vol !== undefined && (READ_ONLY_VOLUMES.some((k) => vol[k] !== undefined) || vol.persistentVolumeClaim?.readOnly === true);
      let hostPath = base;
      const sub = subPathOf(vm, env);
      if (sub) {
        // The checked path is still the container's to change (a directory swapped for a symlink before the
        // runtime mounts it): the runtime gets a bind of what was checked, in a directory no container reaches.
        const checked = safeSubpath(base, sub);
        hostPath = subpathTarget(ctx.podDir, vm.name, c.name, i);
        (this.opts.pinSubpath ?? pinSubpath)(fs.realpathSync(base), checked, hostPath, path.dirname(path.dirname(ctx.podDir)));
      }
      out.push({
        containerPath: vm.mountPath,
        hostPath,
        readonly: (vm.readOnly ?? false) || forcedRO,
        propagation: propagation(vm, privileged),
      });
    }
    if (opts.etcHosts && !out.some((m) => path.posix.normalize(m.containerPath ?? '') === '/etc/hosts')) {
      out.push({ containerPath: '/etc/hosts', hostPath: opts.etcHosts, readonly: false, propagation: 'PROPAGATION_PRIVATE' });
    }
    if (c.terminationMessagePath) {
      // Made beneath the pod directory with no symlink followed: the pod may reach its own directory.
      const file = createTerminationLog(ctx.podDir, terminationLogHostPath(ctx.podDir, c.name, opts.restartCount));
      out.push({ containerPath: c.terminationMessagePath, hostPath: file, readonly: false, propagation: 'PROPAGATION_PRIVATE' });
    }
    return out;
  }
}

function propagation(vm: VolumeMount, privileged: boolean): MountPropagation {
  switch (vm.mountPropagation) {
    case 'HostToContainer':
      return 'PROPAGATION_HOST_TO_CONTAINER';
    case 'Bidirectional':
      if (!privileged) throw new ContainerConfigError('Bidirectional mount propagation is available only to privileged containers');
      return 'PROPAGATION_BIDIRECTIONAL';
    default:
      return 'PROPAGATION_PRIVATE';
  }
}

/** Where a container's subPath mount is bound for the runtime, as the kubelet lays it out. */
export function subpathTarget(podDir: string, volume: string, container: string, index: number): string {
  return path.join(podDir, 'volume-subpaths', volume, container, String(index));
}

const MS_BIND = 0x1000;
const MS_REC = 0x4000;

/**
 * Binds `checked` (what safeSubpath resolved under the volume at `root`) onto
 * `target`, through a descriptor opened beneath the volume without following
 * any symlink: a component swapped for a symlink since the check fails the
 * open, and what the descriptor holds is what gets mounted. A mount left at
 * `target` by an earlier instance of the container is replaced.
 */
export function pinSubpath(root: string, checked: string, target: string, targetRoot = path.dirname(target)): void {
  const rel = path.relative(root, checked);
  if (rel === '..' || rel.startsWith('../') || path.isAbsolute(rel)) throw new ContainerConfigError(`subpath ${checked} not within volume path ${root}`);
  let fd: number;
  const rootFd = openat2(AT_FDCWD, root, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  try {
    fd = openat2(rootFd, rel || '.', O_PATH | O_CLOEXEC, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
  } catch (err) {
    throw new ContainerConfigError(`subpath ${rel} of volume path ${root} changed while it was being mounted: ${(err as Error).message}`);
  } finally {
    fs.closeSync(rootFd);
  }
  let dirFd: number | undefined;
  let targetFd: number | undefined;
  try {
    const isDir = fs.fstatSync(fd).isDirectory();
    // The target's directory is the pod's too (volume-subpaths/...): reached with no symlink
    // followed, and the target itself handled through that directory's descriptor.
    try {
      dirFd = openDirBeneath(targetRoot, path.relative(targetRoot, path.dirname(target)), 0o750);
    } catch (err) {
      if (err instanceof NotOwnDirectoryError) throw new ContainerConfigError(`cannot mount subpath: ${err.message}`);
      throw err;
    }
    const name = path.basename(target);
    const at = `/proc/self/fd/${dirFd}/${name}`;
    try {
      umount2(at, MNT_DETACH | UMOUNT_NOFOLLOW);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'EINVAL' && code !== 'ENOENT') throw err;
    }
    const st = fs.lstatSync(at, { throwIfNoEntry: false });
    const fits = st !== undefined && (isDir ? st.isDirectory() : st.isFile());
    if (st && !fits) {
      if (st.isDirectory()) fs.rmdirSync(at);
      else fs.unlinkSync(at);
    }
    if (!fits) {
      if (isDir) fs.mkdirSync(at, { mode: 0o750 });
      else fs.closeSync(fs.openSync(at, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK, 0o640));
    }
    try {
      targetFd = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
    } catch (err) {
      throw new ContainerConfigError(`subpath mount target ${target} changed while it was being made: ${(err as Error).message}`);
    }
    const made = fs.fstatSync(targetFd);
    if (isDir ? !made.isDirectory() : !made.isFile()) throw new ContainerConfigError(`subpath mount target ${target} changed while it was being made`);
    libcMount(`/proc/self/fd/${fd}`, `/proc/self/fd/${targetFd}`, '', MS_BIND | MS_REC, '');
  } finally {
    if (targetFd !== undefined) fs.closeSync(targetFd);
    if (dirFd !== undefined) fs.closeSync(dirFd);
    fs.closeSync(fd);
  }
}

/** The mount's subPath, or its subPathExpr expanded with the container's env (every variable must have a value). */
function subPathOf(vm: VolumeMount, env: Map<string, string>): string {
  if (vm.subPathExpr) {
    const missing = new Set<string>();
    const sub = expand(vm.subPathExpr, (name) => {
      const v = env.get(name);
      if (!v) missing.add(name);
      return v ?? '';
    });
    if (missing.size) throw new ContainerConfigError(`missing value for ${[...missing].sort().join(', ')}`);
    return sub;
  }
  return vm.subPath ?? '';
}

function within(root: string, p: string): boolean {
  return p === root || p.startsWith(root.endsWith('/') ? root : root + '/');
}

/** Resolves symlinks that stay under the directory, refuses any that leave it (EXDEV) and /proc magic links. */
const BENEATH = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;

function closeQuietly(fd: number): void {
  try {
    fs.closeSync(fd);
  } catch {
    // already closed
  }
}

/**
 * `sub` under the volume at `base`, created as directories where missing.
 * Refuses absolute paths, `..`, and symlinks (in the volume, which a
 * container may write) that lead out of it; returns the resolved path. Every
 * step goes through descriptors opened beneath the volume (openat2), and a
 * missing directory is made in the directory such a descriptor holds, so a
 * component swapped for a symlink meanwhile never sends the walk outside.
 */
export function safeSubpath(base: string, sub: string): string {
  if (path.isAbsolute(sub)) throw new ContainerConfigError(`error SubPath \`${sub}\` must not be an absolute path`);
  if (sub.split('/').includes('..')) throw new ContainerConfigError(`error SubPath \`${sub}\` must not contain '..'`);
  let root: string;
  let rootFd: number;
  try {
    root = fs.realpathSync(base);
    rootFd = openat2(AT_FDCWD, root, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  } catch (err) {
    throw new ContainerConfigError(`volume path ${base} for subPath ${sub}: ${(err as Error).message}`);
  }
  const refuse = (err: unknown): never => {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EXDEV' || code === 'ELOOP') throw new ContainerConfigError(`subpath "${sub}" not within volume path "${base}"`);
    throw new ContainerConfigError(`subPath ${sub}: ${(err as Error).message}`);
  };
  try {
    const mode = fs.fstatSync(rootFd).mode & 0o7777;
    const parts = sub.split('/').filter((p) => p && p !== '.');
    for (let i = 0; i < parts.length; i++) {
      const rel = parts.slice(0, i + 1).join('/');
      let fd: number | undefined;
      try {
        fd = openat2(rootFd, rel, O_PATH | O_CLOEXEC, BENEATH);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') refuse(err);
      }
      if (fd !== undefined) {
        closeQuietly(fd);
        continue;
      }
      // Missing: made inside the parent as a descriptor holds it, whatever the path names by now.
      let parent: number;
      try {
        parent = openat2(rootFd, i ? parts.slice(0, i).join('/') : '.', O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, BENEATH);
      } catch (err) {
        return refuse(err);
      }
      try {
        const at = `/proc/self/fd/${parent}/${parts[i]}`;
        fs.mkdirSync(at, { mode });
        // The volume's own mode (an emptyDir's 0777), not what the umask leaves of it; through an fd opened
        // without following links, since the container can swap the new directory for a symlink meanwhile.
        const dfd = fs.openSync(at, fs.constants.O_RDONLY | fs.constants.O_DIRECTORY | fs.constants.O_NOFOLLOW);
        try {
          fs.fchmodSync(dfd, mode);
        } finally {
          fs.closeSync(dfd);
        }
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') refuse(err);
      } finally {
        closeQuietly(parent);
      }
    }
    let fd: number;
    try {
      fd = openat2(rootFd, parts.length ? parts.join('/') : '.', O_PATH | O_CLOEXEC, BENEATH);
    } catch (err) {
      return refuse(err);
    }
    try {
      const final = fs.readlinkSync(`/proc/self/fd/${fd}`);
      if (!within(root, final)) throw new ContainerConfigError(`subpath "${sub}" not within volume path "${base}"`);
      return final;
    } finally {
      closeQuietly(fd);
    }
  } finally {
    closeQuietly(rootFd);
  }
}
