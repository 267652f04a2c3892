/**
 * The pod's volumes on the host, as the kubelet's volume plugins lay them out
 * under <pod-dir>/volumes/<plugin>/<name>: emptyDir (a directory or a tmpfs),
 * hostPath (the host path itself, after its type check), and the projected
 * kinds (configMap, secret, downwardAPI, projected) written with the atomic
 * writer so that refresh() updates them in place; persistentVolumeClaim
 * and ephemeral volumes (the claim's bound PersistentVolume, its host
 * directory). Also the pod's managed /etc/hosts, and teardown.
 */
import fs from 'node:fs/promises';
import { closeSync } from 'node:fs';
import path from 'node:path';
import type {
  ConfigMapProjection,
  DownwardAPIVolumeFile,
  KeyToPath,
  Pod,
  SecretProjection,
  Volume,
} from 'kubernetes-types/core/v1.js';
import { errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { MNT_DETACH, mount as libcMount, umount2 } from '../sys/libc.js';
import { writeAtomic, type Payload } from './atomic-writer.js';
import { NotOwnDirectoryError, openDirBeneath } from './beneath.js';
import { podDomain, podHostname } from './cri-config.js';
import { configMapData, podFieldValue, resourceContainer, secretData } from './env.js';
import type { PodContext, VolumeManager } from './model.js';
import { persistentHostPathRefusal } from './host-paths.js';
import { hostCapacity, podMemoryLimit, quantityValue, resourceFieldValue, type NodeCapacity } from './resources.js';

/** A volume that could not be set up; the worker reports it as FailedMount. */
export class VolumeSetupError extends Error {
  constructor(
    readonly volume: string,
    reason: string,
  ) {
    super(`MountVolume.SetUp failed for volume "${volume}" : ${reason}`);
    this.name = 'VolumeSetupError';
  }
}

export const PLUGIN_DIRS = {
  emptyDir: 'kubernetes.io~empty-dir',
  configMap: 'kubernetes.io~configmap',
  secret: 'kubernetes.io~secret',
  downwardAPI: 'kubernetes.io~downward-api',
  projected: 'kubernetes.io~projected',
} as const;

const DEFAULT_MODE = 0o644;
const ETC_HOSTS = 'etc-hosts';

export interface HostVolumeManagerOptions {
  /** The agent's root: pods live in <rootDir>/pods/<uid>. */
  rootDir: string;
  /** The host's hosts file, the base of a host-network pod's /etc/hosts. */
  hostsFile?: string;
  node?: NodeCapacity;
  log?: Logger;
}

type ProjectedKind = 'configMap' | 'secret' | 'downwardAPI' | 'projected';

function projectedKind(v: Volume): ProjectedKind | undefined {
  if (v.configMap) return 'configMap';
  if (v.secret) return 'secret';
  if (v.downwardAPI) return 'downwardAPI';
  if (v.projected) return 'projected';
  return undefined;
}

/**
 * A memory-backed emptyDir's size, as the kubelet computes it: the node's
 * memory, or the pod's memory limit when it has one, or the volume's
 * sizeLimit when that is smaller still. A missing or zero sizeLimit never
 * means an unlimited tmpfs (tmpfs takes size=0 as no limit at all).
 */
export function memoryVolumeSize(pod: Pod, v: Volume, node: NodeCapacity): number {
  let size = node.memoryBytes;
  const podLimit = podMemoryLimit(pod);
  if (podLimit !== undefined && podLimit > 0 && podLimit <= size) size = podLimit;
  const limit = v.emptyDir?.sizeLimit;
  const asked = limit === undefined ? 0 : quantityValue(limit);
  if (asked > 0 && asked <= size) size = asked;
  // tmpfs rounds up to whole pages; the bound is what matters.
  return Math.max(1, Math.ceil(size));
}

function checkName(kind: string, name: string): void {
  if (!name || name === '.' || name === '..' || name.includes('/') || name.includes('\0')) throw new Error(`invalid ${kind} "${name}"`);
}

// ---------------------------------------------------------------- /etc/hosts

const MANAGED_HEADER = '# Kubernetes-managed hosts file.\n';
const HOST_NETWORK_HEADER = '# Kubernetes-managed hosts file (host network).\n';

function aliasLines(pod: Pod): string {
  const aliases = pod.spec?.hostAliases ?? [];
  if (!aliases.length) return '';
  let s = '\n# Entries added by HostAliases.\n';
  for (const a of aliases) s += `${a.ip}\t${(a.hostnames ?? []).join('\t')}\n`;
  return s;
}

/** The kubelet's managed hosts file for a pod on its own network. */
export function managedHostsContent(pod: Pod, podIPs: string[], clusterDomain: string): string {
  const hostname = podHostname(pod);
  const domain = podDomain(pod, clusterDomain);
  let s = MANAGED_HEADER;
  s += '127.0.0.1\tlocalhost\n';
  s += '::1\tlocalhost ip6-localhost ip6-loopback\n';
  s += 'fe00::0\tip6-localnet\n';
  s += 'fe00::0\tip6-mcastprefix\n';
  s += 'fe00::1\tip6-allnodes\n';
  s += 'fe00::2\tip6-allrouters\n';
  for (const ip of podIPs) s += domain ? `${ip}\t${hostname}.${domain}\t${hostname}\n` : `${ip}\t${hostname}\n`;
  return s + aliasLines(pod);
}

/** A host-network pod's hosts file: the host's, with the pod's aliases after it. */
export function hostNetworkHostsContent(pod: Pod, hostFile: string): string {
  return HOST_NETWORK_HEADER + hostFile + (hostFile && !hostFile.endsWith('\n') ? '\n' : '') + aliasLines(pod);
}

// ---------------------------------------------------------------- mounts

function unescapeMountinfo(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_m, o: string) => String.fromCharCode(parseInt(o, 8)));
}

/** Mount points at or under `dir`, deepest first. */
export async function mountsUnder(dir: string): Promise<string[]> {
  const text = await fs.readFile('/proc/self/mountinfo', 'utf8');
  const out: string[] = [];
  for (const line of text.split('\n')) {
    const mp = line.split(' ')[4];
    if (!mp) continue;
    const p = unescapeMountinfo(mp);
    if (p === dir || p.startsWith(dir + '/')) out.push(p);
  }
  return out.sort((a, b) => b.length - a.length);
}

// ---------------------------------------------------------------- the manager

export class HostVolumeManager implements VolumeManager {
  private readonly node: NodeCapacity;
  private readonly hostsFile: string;
  /** One write at a time per volume directory: setUp from the worker and refresh from elsewhere may meet. */
  private readonly writing = new Map<string, Promise<unknown>>();
  /** Skipped projected sources already warned about, by pod uid/volume/source. */
  private readonly warned = new Set<string>();

  constructor(private readonly opts: HostVolumeManagerOptions) {
    this.node = opts.node ?? hostCapacity();
    this.hostsFile = opts.hostsFile ?? '/etc/hosts';
  }

  podDir(uid: string): string {
    checkName('pod uid', uid);
    return path.join(this.opts.rootDir, 'pods', uid);
  }

  async setUp(ctx: PodContext): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (const v of ctx.pod.spec?.volumes ?? []) {
      try {
        out.set(v.name, await this.setUpOne(ctx, v));
      } catch (err) {
        if (err instanceof VolumeSetupError) throw err;
        throw new VolumeSetupError(v.name, errorMessage(err));
      }
    }
    return out;
  }

  async refresh(ctx: PodContext): Promise<void> {
    let first: unknown;
    for (const v of ctx.pod.spec?.volumes ?? []) {
      if (!projectedKind(v)) continue;
      try {
        await this.setUpOne(ctx, v);
      } catch (err) {
        // Keep the others current; the volume that failed keeps its last good contents.
        first ??= err instanceof VolumeSetupError ? err : new VolumeSetupError(v.name, errorMessage(err));
      }
    }
    if (first) throw first;
  }

  private volumeDir(ctx: PodContext, plugin: string, name: string): string {
    checkName('volume name', name);
    return path.join(ctx.podDir, 'volumes', plugin, name);
  }

  private async setUpOne(ctx: PodContext, v: Volume): Promise<string> {
    if (v.emptyDir) return this.emptyDir(ctx, v);
    if (v.hostPath) {
      await checkHostPath(v.hostPath.path, v.hostPath.type ?? '');
      return v.hostPath.path;
    }
    if (v.persistentVolumeClaim) return this.claimVolume(ctx, v.name, v.persistentVolumeClaim.claimName, false);
    if (v.ephemeral) return this.claimVolume(ctx, v.name, `${ctx.pod.metadata?.name ?? ''}-${v.name}`, true);
    const kind = projectedKind(v);
    if (kind) {
      const dir = this.volumeDir(ctx, PLUGIN_DIRS[kind], v.name);
      const payload = this.payload(ctx, v, kind);
      const fsGroup = ctx.pod.spec?.securityContext?.fsGroup;
      // With an fsGroup the files belong to that group and it may read them, as the kubelet's volume ownership does.
      if (fsGroup !== undefined) for (const f of payload.values()) f.mode |= 0o440;
      // Written through a descriptor of the volume's directory, reached with no symlink: a link the pod left
      // there would otherwise have its files (and key-named links to them) made in a host directory.
      const fd = this.openVolumeDir(v.name, dir);
      try {
        await this.serially(dir, () => writeAtomic(`/proc/self/fd/${fd}`, payload, { gid: fsGroup }));
      } finally {
        closeSync(fd);
      }
      return dir;
    }
    const type = Object.keys(v).find((k) => k !== 'name') ?? 'unknown';
    throw new VolumeSetupError(v.name, `volume type ${type} is not supported by kubelet-lite`);
  }

  /**
   * The host directory of the volume bound to the pod's claim, as the
   * kubelet's volume manager finds it: the claim, bound (its volumeName, and
   * the PV's claimRef naming the claim's uid), the PV's hostPath or local
   * path (checked again against the paths no PV may name). An unbound claim
   * is an error the worker retries: the pod waits, as the kubelet's does.
   */
  private async claimVolume(ctx: PodContext, volume: string, claimName: string, ephemeral: boolean): Promise<string> {
    const ns = ctx.pod.metadata?.namespace ?? 'default';
    const claim = ctx.objects.get('PersistentVolumeClaim', ns, claimName);
    if (!claim) throw new VolumeSetupError(volume, `persistentvolumeclaim "${claimName}" not found`);
    const c = claim.object as { metadata?: { ownerReferences?: Array<{ uid?: string }>; deletionTimestamp?: string }; spec?: { volumeName?: string } };
    if (ephemeral && !(c.metadata?.ownerReferences ?? []).some((r) => r.uid === ctx.uid)) {
      throw new VolumeSetupError(volume, `PVC ${ns}/${claimName} was not created for pod ${ns}/${ctx.pod.metadata?.name ?? ''} (pod is not owner)`);
    }
    const pvName = c.spec?.volumeName;
    if (!pvName) throw new VolumeSetupError(volume, `persistentvolumeclaim "${claimName}" is not bound yet (waiting for its volume to be provisioned or bound)`);
    const pv = ctx.objects.get('PersistentVolume', '', pvName);
    const spec = (pv?.object as { spec?: { claimRef?: { uid?: string; name?: string; namespace?: string }; hostPath?: { path?: string; type?: string }; local?: { path?: string } } } | undefined)?.spec;
    if (!pv || !spec) throw new VolumeSetupError(volume, `persistentvolume "${pvName}" of claim "${claimName}" not found`);
    if (spec.claimRef?.uid !== claim.uid || spec.claimRef?.name !== claimName || (spec.claimRef?.namespace ?? '') !== ns) {
      throw new VolumeSetupError(volume, `persistentvolume "${pvName}" is not bound to claim "${ns}/${claimName}" yet`);
    }
    const p = spec.hostPath?.path ?? spec.local?.path;
    if (!p) throw new VolumeSetupError(volume, `persistentvolume "${pvName}" has no hostPath or local source, the only ones this node can mount`);
    const why = persistentHostPathRefusal(p, pvName, this.opts.rootDir);
    if (why) throw new VolumeSetupError(volume, `persistentvolume "${pvName}": path ${JSON.stringify(p)} ${why}`);
    if (spec.hostPath) await checkHostPath(p, spec.hostPath.type ?? '');
    else if (!(await fs.stat(p).catch(() => undefined))?.isDirectory()) throw new VolumeSetupError(volume, `local volume path ${p} of persistentvolume "${pvName}" is not a directory`);
    return p;
  }

  private serially<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.writing.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const settled = next.catch(() => undefined);
    this.writing.set(key, settled);
    void settled.then(() => {
      if (this.writing.get(key) === settled) this.writing.delete(key);
    });
    return next;
  }

  /** An O_PATH descriptor of a volume's directory under the pod directory, made as needed, with no symlink followed. */
  private openVolumeDir(volume: string, dir: string): number {
    try {
      return openDirBeneath(this.opts.rootDir, path.relative(this.opts.rootDir, dir), 0o755);
    } catch (err) {
      if (err instanceof NotOwnDirectoryError) throw new VolumeSetupError(volume, err.message);
      throw err;
    }
  }

  private async emptyDir(ctx: PodContext, v: Volume): Promise<string> {
    const dir = this.volumeDir(ctx, PLUGIN_DIRS.emptyDir, v.name);
    const medium = v.emptyDir?.medium ?? '';
    if (medium !== '' && medium !== 'Memory') throw new VolumeSetupError(v.name, `emptyDir medium ${medium} is not supported`);
    // The pod may reach its own directory: a symlink left at the volume's place (or on the way to it)
    // would have the chmod below open a host directory to everyone, or the tmpfs mounted over it.
    const open = () => this.openVolumeDir(v.name, dir);
    let fd = open();
    try {
      if (medium === 'Memory') {
        // mountinfo shows resolved paths.
        const real = await fs.realpath(`/proc/self/fd/${fd}`);
        if (!(await mountsUnder(real)).includes(real)) {
          libcMount('tmpfs', `/proc/self/fd/${fd}`, 'tmpfs', 0, `size=${memoryVolumeSize(ctx.pod, v, this.node)},mode=0777`);
          // The descriptor still names the directory beneath the mount: the tmpfs's root is what gets the modes.
          closeSync(fd);
          fd = open();
        }
      }
      const at = `/proc/self/fd/${fd}`;
      // Any user the containers run as may write here.
      await fs.chmod(at, 0o777);
      const fsGroup = ctx.pod.spec?.securityContext?.fsGroup;
      if (fsGroup !== undefined) {
        const st = await fs.stat(at);
        await fs.chown(at, st.uid, fsGroup);
        await fs.chmod(at, 0o2777);
      }
    } finally {
      closeSync(fd);
    }
    return dir;
  }

  private payload(ctx: PodContext, v: Volume, kind: ProjectedKind): Payload {
    const payload: Payload = new Map();
    switch (kind) {
      case 'configMap': {
        const src = v.configMap!;
        this.projectConfigMap(ctx, payload, src, src.defaultMode ?? DEFAULT_MODE);
        break;
      }
      case 'secret': {
        const src = v.secret!;
        this.projectSecret(ctx, payload, { name: src.secretName, items: src.items, optional: src.optional }, src.defaultMode ?? DEFAULT_MODE);
        break;
      }
      case 'downwardAPI':
        this.projectDownward(ctx, payload, v.downwardAPI!.items ?? [], v.downwardAPI!.defaultMode ?? DEFAULT_MODE);
        break;
      case 'projected': {
        const mode = v.projected!.defaultMode ?? DEFAULT_MODE;
        for (const s of v.projected!.sources ?? []) {
          if (s.configMap) this.projectConfigMap(ctx, payload, s.configMap, mode);
          else if (s.secret) this.projectSecret(ctx, payload, s.secret, mode);
          else if (s.downwardAPI) this.projectDownward(ctx, payload, s.downwardAPI.items ?? [], mode);
          else {
            const what = Object.keys(s).join(',') || 'empty';
            // No API server to issue tokens or trust bundles: the rest of the volume still works.
            const key = `${ctx.uid}/${v.name}/${what}`;
            if (!this.warned.has(key)) {
              this.warned.add(key);
              this.opts.log?.warn('projected volume source skipped', { pod: ctx.pod.metadata?.name, volume: v.name, source: what });
            }
          }
        }
        break;
      }
    }
    return payload;
  }

  private project(payload: Payload, what: string, data: Map<string, Buffer>, items: KeyToPath[] | undefined, optional: boolean, mode: number): void {
    if (!items?.length) {
      for (const [k, d] of data) payload.set(k, { data: d, mode });
      return;
    }
    for (const it of items) {
      const d = data.get(it.key);
      if (!d) {
        if (optional) continue;
        throw new Error(what === 'configmap' ? `configmap references non-existent config key: ${it.key}` : `secret references non-existent secret key: ${it.key}`);
      }
      payload.set(it.path, { data: d, mode: it.mode ?? mode });
    }
  }

  private projectConfigMap(ctx: PodContext, payload: Payload, src: ConfigMapProjection, mode: number): void {
    const ns = ctx.pod.metadata?.namespace || 'default';
    const cm = ctx.objects.configMap(ns, src.name ?? '');
    if (!cm) {
      if (src.optional) return;
      throw new Error(`configmap "${src.name}" not found`);
    }
    this.project(payload, 'configmap', configMapData(cm), src.items, src.optional ?? false, mode);
  }

  private projectSecret(ctx: PodContext, payload: Payload, src: SecretProjection & { name?: string }, mode: number): void {
    const ns = ctx.pod.metadata?.namespace || 'default';
    const s = ctx.objects.secret(ns, src.name ?? '');
    if (!s) {
      if (src.optional) return;
      throw new Error(`secret "${src.name}" not found`);
    }
    this.project(payload, 'secret', secretData(s), src.items, src.optional ?? false, mode);
  }

  private projectDownward(ctx: PodContext, payload: Payload, items: DownwardAPIVolumeFile[], mode: number): void {
    for (const it of items) {
      let value: string;
      if (it.fieldRef) value = podFieldValue(ctx, it.fieldRef.fieldPath);
      else if (it.resourceFieldRef) {
        const c = resourceContainer(ctx.pod, undefined, it.resourceFieldRef.containerName);
        value = resourceFieldValue(c, it.resourceFieldRef.resource, it.resourceFieldRef.divisor, this.node);
      } else continue;
      payload.set(it.path, { data: Buffer.from(value), mode: it.mode ?? mode });
    }
  }

  async writeEtcHosts(ctx: PodContext): Promise<string> {
    const pod = ctx.pod;
    let content: string;
    if (pod.spec?.hostNetwork) {
      content = hostNetworkHostsContent(pod, await fs.readFile(this.hostsFile, 'utf8').catch(() => ''));
    } else {
      if (!ctx.podIP) throw new Error(`pod ${pod.metadata?.name}: no pod IP yet for its hosts file`);
      content = managedHostsContent(pod, [ctx.podIP], ctx.clusterDomain);
    }
    const file = path.join(ctx.podDir, ETC_HOSTS);
    const want = Buffer.from(content);
    // The pod directory reached with no symlink (the pod may have swapped it for one), the file with none either.
    let dirFd: number;
    try {
      dirFd = openDirBeneath(this.opts.rootDir, path.relative(this.opts.rootDir, ctx.podDir), 0o750);
    } catch (err) {
      if (err instanceof NotOwnDirectoryError) throw new Error(`not writing the pod's hosts file: ${err.message}`);
      throw err;
    }
    // Rewritten in place, never replaced: running containers have this inode bind-mounted, and may write
    // to it as much as they like, so only a file of the wanted size is read to compare.
    let fh: fs.FileHandle;
    try {
      fh = await fs.open(`/proc/self/fd/${dirFd}/${ETC_HOSTS}`, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_NOFOLLOW | fs.constants.O_NONBLOCK, 0o644);
    } finally {
      closeSync(dirFd);
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw new Error(`not writing the pod's hosts file: ${file} is not a regular file`);
      const { size } = st;
      let same = false;
      if (size === want.length) {
        const buf = Buffer.alloc(want.length);
        const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
        same = bytesRead === want.length && buf.equals(want);
      }
      if (!same) {
        await fh.truncate(0);
        await fh.write(want, 0, want.length, 0);
      }
    } finally {
      await fh.close();
    }
    return file;
  }

  async emptyEmptyDirs(ctx: PodContext): Promise<void> {
    for (const v of ctx.pod.spec?.volumes ?? []) {
      if (!v.emptyDir) continue;
      const dir = this.volumeDir(ctx, PLUGIN_DIRS.emptyDir, v.name);
      const st = await fs.lstat(dir).catch(() => undefined);
      if (!st?.isDirectory()) continue;
      const real = await fs.realpath(dir);
      for (const mp of (await mountsUnder(real)).sort((a, b) => b.length - a.length)) {
        try {
          umount2(mp);
        } catch (err) {
          if (isErrno(err, 'EBUSY')) umount2(mp, MNT_DETACH);
          else if (!isErrno(err, 'EINVAL') && !isErrno(err, 'ENOENT')) throw err;
        }
      }
      // Deleting through a mount would delete what it shows: left as it is instead.
      if ((await mountsUnder(real)).length) throw new Error(`pod ${ctx.uid}: emptyDir ${v.name} still mounted after unmount`);
      // fs.rm unlinks symlinks, never follows them.
      for (const name of await fs.readdir(dir)) await fs.rm(path.join(dir, name), { recursive: true, force: true });
    }
  }

  async tearDown(uid: string): Promise<void> {
    const dir = this.podDir(uid);
    const st = await fs.lstat(dir).catch((err) => {
      if (isErrno(err, 'ENOENT')) return undefined;
      throw err;
    });
    if (!st) return;
    if (!st.isDirectory()) {
      await fs.unlink(dir);
      return;
    }
    // mountinfo shows resolved paths: look for the pod dir as the kernel names it.
    const real = await fs.realpath(dir);
    for (const mp of await mountsUnder(real)) {
      try {
        umount2(mp);
      } catch (err) {
        if (isErrno(err, 'EBUSY')) umount2(mp, MNT_DETACH);
        else if (!isErrno(err, 'EINVAL') && !isErrno(err, 'ENOENT')) throw err;
      }
    }
    const left = await mountsUnder(real);
    // Deleting through a mount would delete what it shows: refuse instead.
    if (left.length) throw new Error(`pod ${uid}: still mounted after unmount: ${left.join(', ')}`);
    // fs.rm unlinks symlinks, never follows them.
    await fs.rm(dir, { recursive: true, force: true });
    for (const k of this.warned) if (k.startsWith(`${uid}/`)) this.warned.delete(k);
  }
}

// ---------------------------------------------------------------- hostPath

/** The hostPath plugin's type checks; the *OrCreate types create what is missing. */
export async function checkHostPath(p: string, type: string): Promise<void> {
  const stat = () => fs.stat(p).catch((err) => (isErrno(err, 'ENOENT') || isErrno(err, 'ENOTDIR') ? undefined : Promise.reject(err)));
  const st = await stat();
  const fail = (what: string) => new Error(`hostPath type check failed: ${p} is not ${what}`);
  // Validation refuses these; the API server does too, so a path never means other than it reads.
  if (p.split('/').includes('..')) throw new Error(`hostPath ${p} must not contain '..'`);
  switch (type) {
    case '':
      return;
    case 'DirectoryOrCreate':
      if (!st) await fs.mkdir(p, { recursive: true, mode: 0o755 });
      else if (!st.isDirectory()) throw fail('a directory');
      return;
    case 'Directory':
      if (!st?.isDirectory()) throw fail('a directory');
      return;
    case 'FileOrCreate':
      // The parent must exist, as for the kubelet; O_CREAT without O_TRUNC never clobbers what a race put there.
      // O_EXCL|O_NONBLOCK: a FIFO a race put there instead is neither opened nor waited on.
      if (!st) {
        const made = await fs.open(p, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_EXCL | fs.constants.O_NONBLOCK, 0o644).catch((err) => (isErrno(err, 'EEXIST') ? undefined : Promise.reject(err)));
        if (made) await made.close();
        else if (!(await stat())?.isFile()) throw fail('a file');
      } else if (!st.isFile()) throw fail('a file');
      return;
    case 'File':
      if (!st?.isFile()) throw fail('a file');
      return;
    case 'Socket':
      if (!st?.isSocket()) throw fail('a socket file');
      return;
    case 'CharDevice':
      if (!st?.isCharacterDevice()) throw fail('a character device');
      return;
    case 'BlockDevice':
      if (!st?.isBlockDevice()) throw fail('a block device');
      return;
    default:
      throw new Error(`${type} is an invalid volume type`);
  }
}
