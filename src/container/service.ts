/**
 * Containers: an overlayfs rootfs over the image's snapshots, an OCI bundle,
 * conmon as the monitor (it holds stdio, writes the CRI log and the exit
 * code), and the runtime CLI for start, signals and removal.
 *
 * States follow the CRI: CREATED → RUNNING → EXITED; every operation refreshes
 * the record, checks its guard, acts and saves.
 */
import { spawn, type ChildProcess, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Db } from '../db.js';
import { SkiffError, errorMessage, failedPrecondition, invalidArgument, isErrno, noSpaceAt, notFound } from '../errors.js';
import type { ContainerConfig__Output } from '../gen/runtime/v1/ContainerConfig.js';
import type { ImageRecord, ImageService } from '../image/service.js';
import type { Snapshotter } from '../image/snapshot.js';
import type { Logger } from '../log.js';
import { RecordIndex } from '../record-index.js';
import { KeyedLock, Registrar, Rollback } from '../registrar.js';
import type { SandboxRecord, SandboxService } from '../sandbox/service.js';
import { nowNs } from '../sandbox/service.js';
import { removeRuntimeRemains } from '../sys/cgroup.js';
import { mountOverlay, mountsBelow, unmount } from '../sys/mount.js';
import { idmappedBind, idmappedTree, passableByPodRoot, withUsernsFd } from '../sys/idmap.js';
import { checkContainerUserns, hostIdOf, type PodUserns } from '../sandbox/userns.js';
import { ociIdMappings } from '../sandbox/service.js';
import { closeFd, openpty, setCloexec } from '../sys/libc.js';
import type { Runner } from '../sys/run.js';
import { clearReopenTarget, prepareContainerLog } from './log-file.js';
import { startConmon, type OciRuntime } from '../oci/runtime.js';
import { PhaseTrace } from '../trace.js';
import { buildSpec, type OciDevice, type OciSpec, type ResolvedUser } from './spec.js';
import { loadSeccomp, seccompChoice } from './seccomp.js';
import type { HandlerFeatures } from '../oci/features.js';
import { resolveUser } from './user.js';
import { isSameProcess, processStartTimeSync } from '../sys/proc.js';
import { oomKilled } from './stats.js';
import { runExecSync, type ExecSyncResult } from './exec-sync.js';

export type ContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED' | 'CONTAINER_UNKNOWN';

export interface ContainerRecord {
  id: string;
  name: string;
  sandboxId: string;
  state: ContainerState;
  config: ContainerConfig__Output;
  imageId: string;
  /** The top snapshot of the image's layers: the container's rootfs stands on it. */
  chainId?: string;
  /** What the kubelet asked for, as it asked. */
  imageRef: string;
  createdAt: number;
  startedAt: number;
  finishedAt: number;
  exitCode: number;
  reason: string;
  message: string;
  pid?: number;
  /** The container process's start time (/proc/<pid>/stat field 22): with `pid`, names it for sure. */
  pidStartTime?: number;
  /** conmon's pid and start time: while it lives, its exit file will tell how the container ended. */
  conmonPid?: number;
  conmonStartTime?: number;
  logPath: string;
  runtimeHandler: string;
  bundle: string;
  rootfs: string;
  spec: OciSpec;
}

/** A pod's own user namespace, as a container in it is made: the pinned namespace and its mappings. */
interface ContainerUserns {
  pin: string;
  maps: PodUserns;
}

/** What a pod's ids are on the host: through its user namespace's mappings, or the same without one. */
function hostIdsIn(userns: ContainerUserns | undefined): (uid: number, gid: number) => { uid: number; gid: number } {
  return (uid, gid) => (userns ? { uid: hostIdOf(userns.maps.uids, uid), gid: hostIdOf(userns.maps.gids, gid) } : { uid, gid });
}

export interface ContainerDeps {
  db: Db;
  rootDir: string;
  stateDir: string;
  images: ImageService;
  snapshots: Snapshotter;
  sandboxes: () => SandboxService;
  runtimeFor: (handler: string) => OciRuntime;
  runner: Runner;
  log: Logger;
  /** The lowest oom_score_adj this process may give a child (lowering below our own can be refused). */
  oomScoreAdjFloor: number;
  /** The capabilities this daemon holds (its bounding set). */
  allowedCaps?: string[];
  /** conmon's --log-size-max: a container's log never grows past it between two rotations. */
  logSizeMax?: number;
  /** What the runtime behind a pod's handler supports (recursive read-only mounts). */
  handlerFeatures?: (handler: string) => HandlerFeatures;
  onEvent?: (type: 'CONTAINER_CREATED_EVENT' | 'CONTAINER_STARTED_EVENT' | 'CONTAINER_STOPPED_EVENT' | 'CONTAINER_DELETED_EVENT', c: ContainerRecord) => void;
}

export class ContainerService {
  private readonly names = new Registrar();
  private readonly locks = new KeyedLock();
  /** Separate from `locks`: a stop holds its container's lock while it waits for the exit. */
  private readonly exitLocks = new KeyedLock();
  private readonly exitDir: string;
  private readonly socketDir: string;
  /**
   * Where containers of pods in a user namespace have their rootfs and
   * idmapped volumes mounted: runc reaches them from inside the pod's user
   * namespace, so this tree (and the state dir above it) must be searchable
   * by all, unlike the root dir with the writable layers.
   */
  private readonly usernsDir: string;
  private readonly waiters = new Map<string, Array<() => void>>();
  private watcher?: fs.FSWatcher;

  constructor(private readonly d: ContainerDeps) {
    this.exitDir = path.join(d.stateDir, 'exits');
    this.socketDir = path.join(d.stateDir, 'attach');
    this.usernsDir = path.join(d.stateDir, 'userns');
    this.records = new RecordIndex<ContainerRecord>(
      {
        load: () => (d.db.prepare('SELECT data FROM containers ORDER BY rowid').all() as Array<{ data: string }>).map((r) => JSON.parse(r.data) as ContainerRecord),
        put: (c, json) => void d.db.prepare('INSERT OR REPLACE INTO containers (id, name, sandbox_id, data) VALUES (?, ?, ?, ?)').run(c.id, c.name, c.sandboxId, json),
        remove: (id) => void d.db.prepare('DELETE FROM containers WHERE id = ?').run(id),
      },
      'container',
    );
  }

  async init(): Promise<void> {
    await fsp.mkdir(this.exitDir, { recursive: true, mode: 0o700 });
    await fsp.mkdir(this.socketDir, { recursive: true, mode: 0o700 });
    await fsp.mkdir(path.join(this.d.rootDir, 'containers'), { recursive: true, mode: 0o700 });
    await fsp.mkdir(this.usernsDir, { recursive: true, mode: 0o711 });
    for (const c of this.list()) this.names.reserve(c.name, c.id, 'container');
    this.watcher = fs.watch(this.exitDir, (_ev, file) => {
      if (file) this.recordExitOrRetry(String(file));
    });
    this.watcher.unref();
    // Containers may have exited while skiff was down: conmon left their exit files, or,
    // when conmon died too (or the host rebooted and the exit files went with the tmpfs),
    // the runtime tells whether they still run.
    for (const c of this.list()) {
      if (c.state !== 'CONTAINER_RUNNING') continue;
      await this.reconcile(c.id).catch((err) => this.d.log.warn('could not learn whether a container still runs', { id: c.id, error: errorMessage(err) }));
    }
    await this.removeOrphans();
  }

  /** What a process killed mid-CreateContainer leaves behind has no record: it goes. */
  private async removeOrphans(): Promise<void> {
    const known = new Set(this.list().map((c) => c.id));
    const dirs = [path.join(this.d.rootDir, 'containers'), path.join(this.d.stateDir, 'containers')];
    const orphans = new Set<string>();
    // Exit files and attach links count too: a removal cut short may have left only those.
    for (const d of [...dirs, this.exitDir, this.socketDir, this.usernsDir]) for (const n of await fsp.readdir(d).catch(() => [] as string[])) if (/^[a-f0-9]{64}$/.test(n) && !known.has(n)) orphans.add(n);
    for (const id of orphans) {
      this.d.log.warn('removing the remains of a container with no record', { id });
      await removeRuntimeRemains(this.d.runtimeFor(''), id, path.join(this.d.stateDir, 'containers', id), this.d.log);
      // A directory that still holds a mount is left (removing it would reach into a volume).
      const removed = await removeContainerDir(this.d.runner, path.join(this.d.rootDir, 'containers', id))
        .then(() => removeContainerDir(this.d.runner, path.join(this.usernsDir, id)))
        .then(
        () => true,
        (err) => (this.d.log.error('cannot remove the remains of a container', { id, error: errorMessage(err) }), false),
      );
      if (!removed) continue;
      for (const d of dirs) await fsp.rm(path.join(d, id), { recursive: true, force: true });
      await fsp.rm(path.join(this.socketDir, id), { force: true });
      await fsp.rm(path.join(this.exitDir, id), { force: true });
    }
  }

  close(): void {
    this.watcher?.close();
    for (const id of [...this.exitRetries.keys()]) this.stopExitRetry(id);
  }

  private locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.locks.run(id, fn);
  }

  /**
   * Records live in the database and, parsed and frozen, in memory (in
   * creation order), so that list and status calls never touch the database.
   * get/find/list hand out copies; view/findView/listView the stored records.
   */
  private readonly records: RecordIndex<ContainerRecord>;

  private save(c: ContainerRecord): void {
    this.records.save(c);
  }

  private forget(id: string): void {
    this.records.delete(id);
  }

  get(id: string): ContainerRecord | undefined {
    return this.records.get(id);
  }

  find(idOrPrefix: string): ContainerRecord | undefined {
    return this.records.find(idOrPrefix);
  }

  /** By full id or unique prefix: the stored record itself, to read and never change (status calls). */
  findView(idOrPrefix: string): Readonly<ContainerRecord> | undefined {
    return this.records.findView(idOrPrefix);
  }

  mustView(id: string): Readonly<ContainerRecord> {
    return this.records.mustView(id);
  }

  /**
   * The container's writable layer (overlay upper dir), always under the root dir: for a pod in
   * a user namespace the rootfs is mounted under the state dir instead, with no upper beside it.
   */
  writableLayer(id: string): string {
    return path.join(this.d.rootDir, 'containers', id, 'upper');
  }

  /** The stored records themselves: read them, never change them. */
  listView(sandboxId?: string): ReadonlyArray<Readonly<ContainerRecord>> {
    const all = this.records.values();
    return sandboxId ? all.filter((c) => c.sandboxId === sandboxId) : all;
  }

  mustGet(id: string): ContainerRecord {
    return this.records.mustGet(id);
  }

  list(sandboxId?: string): ContainerRecord[] {
    return this.listView(sandboxId).map((c) => structuredClone(c) as ContainerRecord);
  }

  /**
   * Holds the pod's lock from checking the pod to saving the record, so a
   * concurrent Stop/RemovePodSandbox either sees the container and takes it
   * down, or comes first and the create fails and rolls back.
   */
  async create(sandboxId: string, config: ContainerConfig__Output): Promise<string> {
    const found = this.d.sandboxes().mustGet(sandboxId);
    return this.d.sandboxes().withPodLock(found.id, () => this.createInPod(found.id, config));
  }

  /**
   * Idmapped copies of the container's host volumes, each mounted at a file or
   * directory under `staging`: runc binds these instead of the host paths, so
   * the pod's root owns what the host's root owns there.
   */
  private async idmapVolumes(config: ContainerConfig__Output, staging: string, usernsFd: number, undo: Rollback): Promise<ContainerConfig__Output['mounts']> {
    const out: ContainerConfig__Output['mounts'] = [];
    for (const [i, m] of config.mounts.entries()) {
      const prop = String(m.propagation ?? '');
      if (!['', '0', 'undefined', 'PROPAGATION_PRIVATE'].includes(prop)) {
        // The idmapped copy is a mount of its own: mounts made later on either side would not cross.
        throw invalidArgument(`mount ${m.containerPath}: propagation ${prop} is not supported in a pod with a user namespace`);
      }
      let st: fs.Stats;
      try {
        st = await fsp.stat(m.hostPath);
      } catch (err) {
        throw invalidArgument(`mount ${m.containerPath}: source ${m.hostPath}: ${isErrno(err, 'ENOENT') ? 'does not exist' : errorMessage(err)}`);
      }
      const target = path.join(staging, String(i));
      if (st.isDirectory()) await fsp.mkdir(target);
      else await fsp.writeFile(target, '');
      undo.add(`idmapped volume ${m.containerPath}`, () => unmount(this.d.runner, target));
      try {
        idmappedBind(m.hostPath, target, usernsFd, m.readonly ? { recursive: m.recursiveReadOnly ?? false } : undefined);
      } catch (err) {
        throw invalidArgument(`mount ${m.containerPath}: cannot give ${m.hostPath} to a pod in a user namespace (an idmapped mount of it failed: ${errorMessage(err)})`);
      }
      out.push({ ...m, hostPath: target });
    }
    return out;
  }

  private appArmor: Promise<boolean> | undefined;

  /** Whether the host has AppArmor: asked once (it cannot change without a reboot), never with a sync call on a request. */
  private appArmorEnabled(): Promise<boolean> {
    this.appArmor ??= fsp.access('/sys/module/apparmor/parameters/enabled').then(
      () => true,
      () => false,
    );
    return this.appArmor;
  }

  /**
   * The container's directories and its root filesystem: the image's layers under a new writable
   * layer through overlayfs (idmapped for a pod with its own user namespace), and the volumes it
   * mounts idmapped likewise. Each step registers its undo on `undo`.
   */
  private async prepareRootfs(
    id: string,
    config: ContainerConfig__Output,
    image: ImageRecord,
    userns: ContainerUserns | undefined,
    undo: Rollback,
  ): Promise<{ dir: string; bundle: string; rootfs: string; mountsFor: ContainerConfig__Output['mounts']; top: string | undefined }> {
    const shift = hostIdsIn(userns);
    const dir = path.join(this.d.rootDir, 'containers', id);
    const bundle = path.join(this.d.stateDir, 'containers', id);
    const mountDir = userns ? path.join(this.usernsDir, id) : dir;
    const rootfs = path.join(mountDir, 'rootfs');
    // Not recursive (init made the parent): a recursive mkdir reports a full disk as ENOENT.
    await fsp.mkdir(dir, { mode: 0o700 });
    undo.add('dir', () => removeContainerDir(this.d.runner, dir));
    undo.add('bundle', () => fsp.rm(bundle, { recursive: true, force: true }));
    // Side by side, and all settled before a failure is thrown, so the rollback removes what each made.
    const made = await Promise.allSettled([
      // The upper dir's mode is the mode of the container's `/`.
      fsp.mkdir(path.join(dir, 'upper'), { mode: 0o755 }),
      fsp.mkdir(path.join(dir, 'work'), { mode: 0o700 }),
      fsp.mkdir(path.join(dir, 'rootfs'), { mode: 0o700 }),
      fsp.mkdir(bundle, { recursive: true, mode: 0o700 }),
    ]);
    for (const r of made) if (r.status === 'rejected') throw r.reason;
    if (userns) {
      // The pod's root is not the host's: runc, inside its user namespace, must pass through
      // (and no other host user: the rootfs and the idmapped volume clones are below).
      await fsp.mkdir(mountDir, { mode: 0o700 });
      undo.add('userns dir', () => removeContainerDir(this.d.runner, mountDir));
      await passableByPodRoot(mountDir, shift(0, 0).gid);
      for (const p of ['rootfs', 'idmapped']) await fsp.mkdir(path.join(mountDir, p), { mode: 0o711 });
    }
    const top = image.chainIds[image.chainIds.length - 1];
    const lowers = top ? this.d.snapshots.lowerDirs(top) : [];
    if (!lowers.length) {
      await fsp.mkdir(path.join(dir, 'empty'));
      lowers.push(path.join(dir, 'empty'));
    }
    let mountsFor = config.mounts;
    if (userns) {
      const root = shift(0, 0);
      // Only the new, empty writable layer is chowned: the container's `/` belongs to its root.
      await fsp.chown(path.join(dir, 'upper'), root.uid, root.gid);
      mountsFor = await withUsernsFd(userns.pin, async (u) => {
        // The lower layers are idmapped copies, handed to overlayfs as descriptors that
        // close once it holds them: nothing more is mounted than the overlay itself.
        const fds: number[] = [];
        try {
          for (const l of lowers) fds.push(idmappedTree(l, u));
          await mountOverlay(this.d.runner, fds.map((fd) => `/proc/self/fd/${fd}`), path.join(dir, 'upper'), path.join(dir, 'work'), rootfs);
        } finally {
          for (const fd of fds) closeFd(fd);
        }
        undo.add('rootfs mount', () => unmount(this.d.runner, rootfs));
        return this.idmapVolumes(config, path.join(mountDir, 'idmapped'), u, undo);
      });
    } else {
      await mountOverlay(this.d.runner, lowers, path.join(dir, 'upper'), path.join(dir, 'work'), rootfs);
      undo.add('rootfs mount', () => unmount(this.d.runner, rootfs));
    }
    return { dir, bundle, rootfs, mountsFor, top };
  }

  /**
   * Who the container's process runs as and what it is given, checked against the pod: the user from
   * the image's own files, inside the pod's user namespace if it has one; its devices; whether the
   * AppArmor it asks for exists here; the container whose pid namespace it joins.
   */
  private async resolveProcess(
    sandbox: Readonly<SandboxRecord>,
    config: ContainerConfig__Output,
    rootfs: string,
    image: ImageRecord,
    userns: ContainerUserns | undefined,
  ): Promise<{ user: ResolvedUser; devices: OciDevice[]; targetPid: number | undefined }> {
    const sc = config.linux?.securityContext;
    if (sc?.runAsGroup && !sc.runAsUser && !sc.runAsUsername) {
      throw invalidArgument('run_as_group needs run_as_user or run_as_username');
    }
    const user = await resolveUser(rootfs, {
      runAsUser: sc?.runAsUser ? Number(sc.runAsUser.value) : undefined,
      runAsUsername: sc?.runAsUsername || undefined,
      runAsGroup: sc?.runAsGroup ? Number(sc.runAsGroup.value) : undefined,
      supplementalGroups: (sc?.supplementalGroups ?? []).map(Number),
      imageUser: image.config.config?.User,
    });
    if (userns) {
      // An id the pod's namespace does not map would fail deep in runc (setuid EINVAL): say which.
      const range = (maps: typeof userns.maps.uids) => maps.map((m) => `${m.containerId}-${m.containerId + m.length - 1}`).join(', ');
      if (hostIdOf(userns.maps.uids, user.uid) < 0) throw invalidArgument(`user ${user.uid} is outside the pod's user namespace (uids ${range(userns.maps.uids)})`);
      for (const g of [user.gid, ...user.additionalGids]) {
        if (hostIdOf(userns.maps.gids, g) < 0) throw invalidArgument(`group ${g} is outside the pod's user namespace (gids ${range(userns.maps.gids)})`);
      }
    }
    const devices = await resolveDevices(config);
    const apparmor = sc?.apparmor ? String(sc.apparmor.profileType) : '';
    const wantsLocalAppArmor = apparmor === 'Localhost' || apparmor === '2' || (sc?.apparmorProfile ?? '').startsWith('localhost/');
    if (wantsLocalAppArmor && !(await this.appArmorEnabled())) {
      throw invalidArgument('an AppArmor profile was requested, but AppArmor is not enabled on this host');
    }
    const nsOpts = sc?.namespaceOptions;
    let targetPid: number | undefined;
    if (String(nsOpts?.pid) === 'TARGET') {
      const target = this.find(nsOpts?.targetId ?? '');
      if (!target || target.sandboxId !== sandbox.id || target.state !== 'CONTAINER_RUNNING' || !target.pid) {
        throw invalidArgument(`pid namespace target "${nsOpts?.targetId ?? ''}" is not a running container of pod ${sandbox.id}`);
      }
      targetPid = target.pid;
    }
    return { user, devices, targetPid };
  }

  private async createInPod(sandboxId: string, config: ContainerConfig__Output): Promise<string> {
    const sandbox = this.d.sandboxes().get(sandboxId);
    if (!sandbox) throw notFound(`pod sandbox "${sandboxId}" not found (it was removed)`);
    if (sandbox.state !== 'SANDBOX_READY') throw failedPrecondition(`pod sandbox ${sandbox.id} is not ready`);
    const md = config.metadata;
    if (!md?.name) throw invalidArgument('CreateContainer: metadata.name is required');
    const imageRef = config.image?.image ?? '';
    if (!imageRef) throw invalidArgument('CreateContainer: image.image is required');
    const pmd = sandbox.config.metadata!;
    const name = `${md.name}_${pmd.name}_${pmd.namespace}_${pmd.uid}_${md.attempt}`;
    const id = randomBytes(32).toString('hex');
    this.names.reserve(name, id, 'container');
    const undo = new Rollback();
    undo.add('name', () => this.names.release(name));
    // Until the record exists, only this lease keeps RemoveImage from deleting the layers mounted below.
    const held = this.d.images.acquire(imageRef);
    const trace = new PhaseTrace();
    try {
      if (!held) throw notFound(`image "${imageRef}" not found: pull it first`);
      const image = held.image;
      checkContainerUserns(config.linux?.securityContext?.namespaceOptions?.usernsOptions, sandbox.usernsMaps);
      const userns = sandbox.userns && sandbox.usernsMaps ? { pin: sandbox.userns, maps: sandbox.usernsMaps } : undefined;
      // The pod's root: what host root owns shows as this through the idmapped layers.
      const shift = hostIdsIn(userns);
      const { bundle, rootfs, mountsFor, top } = await this.prepareRootfs(id, config, image, userns, undo);
      trace.mark('dirs+rootfs');
      const sc = config.linux?.securityContext;
      const { user, devices, targetPid } = await this.resolveProcess(sandbox, config, rootfs, image, userns);
      const spec = buildSpec({
        id,
        image: image.config,
        config: { ...config, mounts: mountsFor },
        pod: podContext(sandbox),
        rootfs,
        user,
        oomScoreAdjFloor: this.d.oomScoreAdjFloor,
        allowedCaps: this.d.allowedCaps,
        devices,
        targetPid,
        recursiveReadOnlyMounts: this.d.handlerFeatures?.(sandbox.runtimeHandler).recursiveReadOnlyMounts ?? false,
      });
      const seccomp = await loadSeccomp(seccompChoice(sc?.seccomp, sc?.seccompProfilePath ?? ''), spec.process.capabilities.bounding, sc?.privileged ?? false);
      if (seccomp) spec.linux.seccomp = seccomp;
      // The working directory must exist, as the kubelet expects runtimes to create it.
      const owner = shift(user.uid, user.gid);
      await ensureDirInRoot(rootfs, spec.process.cwd, owner.uid, owner.gid);
      trace.mark('spec');
      await fsp.writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec));
      trace.mark('bundle');
      const logPath = sandbox.config.logDirectory && config.logPath ? path.join(sandbox.config.logDirectory, config.logPath) : path.join(bundle, 'console.log');
      const rec: ContainerRecord = {
        id,
        name,
        sandboxId: sandbox.id,
        state: 'CONTAINER_CREATED',
        config,
        imageId: image.id,
        chainId: top,
        imageRef,
        createdAt: nowNs(),
        startedAt: 0,
        finishedAt: 0,
        exitCode: 0,
        reason: '',
        message: '',
        logPath,
        runtimeHandler: sandbox.runtimeHandler,
        bundle,
        rootfs,
        spec,
      };
      this.save(rec);
      trace.mark('db');
      this.d.onEvent?.('CONTAINER_CREATED_EVENT', rec);
      this.d.log.debug('CreateContainer phases (ms)', { id, ...trace.fields() });
      return id;
    } catch (err) {
      await undo.run((what, e) => this.d.log.warn('container rollback step failed', { id, step: what, error: errorMessage(e) }));
      throw noSpaceAt(err, `container ${id} (under ${path.join(this.d.rootDir, 'containers')})`);
    } finally {
      await held?.release();
    }
  }

  async start(id: string): Promise<void> {
    const found = this.mustGet(id);
    await this.locked(found.id, async () => {
      // Removed while this call waited for the lock.
      const c = this.get(found.id);
      if (!c) throw notFound(`container "${id}" not found`);
      if (c.state !== 'CONTAINER_CREATED') throw failedPrecondition(`container ${c.id} is ${c.state}, not CONTAINER_CREATED`);
      const runtime = this.d.runtimeFor(c.runtimeHandler);
      const trace = new PhaseTrace();
      await Promise.all([this.prepareLog(c), fsp.rm(path.join(this.exitDir, c.id), { force: true })]);
      trace.mark('files');
      try {
        const pid = await startConmon({
          id: c.id,
          name: c.name,
          bundle: c.bundle,
          runtime,
          logPath: c.logPath,
          logSizeMax: this.d.logSizeMax,
          exitDir: this.exitDir,
          socketDir: this.socketDir,
          pidFile: path.join(c.bundle, 'pid'),
          conmonPidFile: path.join(c.bundle, 'conmon.pid'),
          tty: c.config.tty,
          stdin: c.config.stdin,
          stdinOnce: c.config.stdinOnce,
        });
        const startedAt = nowNs();
        trace.mark('conmon+create');
        c.pid = pid;
        // What names the init (for the runtime start, which watches it, and later) and conmon:
        // small reads of files just written and of /proc, done in place.
        c.pidStartTime = processStartTimeSync(pid);
        c.conmonPid = Number(readSmall(path.join(c.bundle, 'conmon.pid')).trim()) || undefined;
        c.conmonStartTime = processStartTimeSync(c.conmonPid);
        await trace.time('runtime start', () => runtime.startCreated(c.id, pid, c.pidStartTime));
        trace.mark('start');
        c.state = 'CONTAINER_RUNNING';
        c.startedAt = startedAt;
        this.save(c);
        trace.mark('db');
        this.d.onEvent?.('CONTAINER_STARTED_EVENT', c);
        this.d.log.debug('StartContainer phases (ms)', { id: c.id, ...trace.fields() });
      } catch (err) {
        // A container that could not start is EXITED with the reason, as containerd reports it.
        await runtime.delete(c.id).catch(() => undefined);
        c.state = 'CONTAINER_EXITED';
        c.pid = undefined;
        c.finishedAt = nowNs();
        c.exitCode = 128;
        c.reason = 'StartError';
        c.message = errorMessage(err);
        this.save(c);
        throw err;
      }
    });
    // It may have exited before we saved it as running (the container did start: a failure to record that goes to the retries).
    await this.onExitFile(found.id).catch(() => this.recordExitOrRetry(found.id));
  }

  /** Exits whose recording failed (the metadata database could not be written), retried each second. */
  private readonly exitRetries = new Map<string, NodeJS.Timeout>();

  /**
   * Records the exit in `id`'s exit file, if any. When that fails (a full
   * disk: SQLite cannot write), the exit is tried again every second until
   * it is recorded or the container is gone: nothing else would look at the
   * file again, and the container would stay RUNNING for good.
   */
  private recordExitOrRetry(id: string): void {
    if (this.exitRetries.has(id)) return;
    this.onExitFile(id).catch((err) => {
      if (this.exitRetries.has(id) || !this.records.view(id)) return;
      this.d.log.warn('could not record a container exit; retrying', { id, error: errorMessage(err) });
      const timer = setInterval(() => {
        if (!this.records.view(id)) return this.stopExitRetry(id);
        this.onExitFile(id).then(() => this.stopExitRetry(id), () => undefined);
      }, 1_000);
      timer.unref();
      this.exitRetries.set(id, timer);
    });
  }

  private stopExitRetry(id: string): void {
    clearInterval(this.exitRetries.get(id));
    this.exitRetries.delete(id);
  }

  /**
   * Reads conmon's exit file for `id`, if there is one, and records the exit,
   * once: the watcher and the callers that poll may see the same file.
   */
  private onExitFile(id: string): Promise<void> {
    if (!/^[a-f0-9]{64}$/.test(id)) return Promise.resolve();
    return this.exitLocks.run(id, async () => void (await this.recordExit(id)));
  }

  /**
   * Learns whether a running container still runs: from conmon's exit file,
   * or, when conmon is gone and left none (killed, or a reboot emptied the
   * state tmpfs), from the runtime and the container process itself.
   * 'orphaned' is a container that runs with no monitor: only a kill by the
   * runtime, then this again, can end it.
   */
  private reconcile(id: string): Promise<'running' | 'exited' | 'orphaned'> {
    return this.exitLocks.run(id, async () => {
      if (await this.recordExit(id)) return 'exited';
      const c = this.get(id);
      if (!c || c.state !== 'CONTAINER_RUNNING') return 'exited';
      if (await isSameProcess(c.conmonPid, c.conmonStartTime)) return 'running';
      // conmon writes the exit file before it exits: now that it is gone, look once more.
      if (await this.recordExit(id)) return 'exited';
      const state = await this.d.runtimeFor(c.runtimeHandler).state(c.id);
      const alive = state !== undefined && state.status !== 'stopped' && (c.pidStartTime === undefined || (await isSameProcess(c.pid, c.pidStartTime)));
      if (alive) return 'orphaned';
      this.recordLost(c.id);
      return 'exited';
    });
  }

  /** An exit nobody saw: the CRI's way to say so is exit code 255, reason Unknown. */
  private recordLost(id: string): void {
    // The record as it is now, not as it was before the awaits that found the exit.
    const c = this.get(id);
    if (!c || c.state !== 'CONTAINER_RUNNING') return;
    this.d.log.warn('container exited while its monitor was gone: exit code unknown', { id: c.id });
    c.state = 'CONTAINER_EXITED';
    c.exitCode = 255;
    c.reason = 'Unknown';
    c.message = 'the container is no longer running and its monitor (conmon) is gone: its exit code is unknown';
    c.finishedAt = Math.max(nowNs(), c.startedAt);
    c.pid = undefined;
    this.save(c);
    this.d.onEvent?.('CONTAINER_STOPPED_EVENT', c);
    this.wake(c.id);
  }

  /** Records the exit conmon reported in its exit file; false when there is no such file yet. */
  private async recordExit(id: string): Promise<boolean> {
    let text: string;
    let mtimeMs: number;
    try {
      const f = path.join(this.exitDir, id);
      text = await fsp.readFile(f, 'utf8');
      mtimeMs = (await fsp.stat(f)).mtimeMs;
    } catch {
      return false;
    }
    if (text.trim() === '') return false;
    const seen = this.records.view(id);
    const oom = seen?.state === 'CONTAINER_RUNNING' && (await oomKilled(seen.spec.linux.cgroupsPath));
    // Read after the await: an UpdateContainerResources saved meanwhile is kept.
    const c = this.get(id);
    if (!c || c.state !== 'CONTAINER_RUNNING') {
      this.wake(id);
      return true;
    }
    const code = Number(text.trim());
    c.state = 'CONTAINER_EXITED';
    c.exitCode = Number.isFinite(code) ? code : -1;
    // When conmon wrote the exit file; never before the start (that clock had milliseconds only).
    c.finishedAt = Math.max(Math.round(mtimeMs * 1000) * 1000, c.startedAt);
    c.reason = oom ? 'OOMKilled' : c.exitCode === 0 ? 'Completed' : 'Error';
    c.pid = undefined;
    this.save(c);
    this.d.onEvent?.('CONTAINER_STOPPED_EVENT', c);
    this.wake(id);
    return true;
  }

  private wake(id: string): void {
    for (const w of this.waiters.get(id) ?? []) w();
    this.waiters.delete(id);
  }

  /**
   * Resolves true when the container is no longer running, false after `ms`.
   * Meanwhile it polls (the exit file may be missed by the watcher, conmon may
   * die); whichever way it ends, its timers and its waiter go with it.
   */
  private waitExit(id: string, ms: number): Promise<boolean> {
    return new Promise((resolve) => {
      const exited = () => this.records.view(id)?.state !== 'CONTAINER_RUNNING';
      if (exited()) return resolve(true);
      let settled = false;
      const finish = (v: boolean) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearInterval(poll);
        const rest = (this.waiters.get(id) ?? []).filter((w) => w !== waiter);
        if (rest.length) this.waiters.set(id, rest);
        else this.waiters.delete(id);
        resolve(v);
      };
      const waiter = () => finish(true);
      const check = () =>
        this.reconcile(id).then(
          () => exited() && finish(true),
          (err) => this.d.log.warn('could not learn whether a container still runs', { id, error: errorMessage(err) }),
        );
      const timer = setTimeout(() => void check().finally(() => finish(exited())), ms);
      const poll = setInterval(() => void check(), 500);
      timer.unref();
      poll.unref();
      const list = this.waiters.get(id) ?? [];
      list.push(waiter);
      this.waiters.set(id, list);
    });
  }

  async stop(id: string, timeoutSeconds: number): Promise<void> {
    const found = this.mustGet(id);
    await this.locked(found.id, () => this.stopLocked(found.id, timeoutSeconds));
  }

  private async stopLocked(id: string, timeoutSeconds: number): Promise<void> {
    const c = this.get(id);
    if (!c || c.state !== 'CONTAINER_RUNNING') return;
    // A container whose conmon died may have ended unseen: learn that before signalling.
    const seen = await this.reconcile(c.id).catch((err) => {
      this.d.log.warn('could not learn whether a container still runs; stopping it anyway', { id: c.id, error: errorMessage(err) });
      return 'running' as const;
    });
    if (seen === 'exited') return;
    const runtime = this.d.runtimeFor(c.runtimeHandler);
    if (timeoutSeconds > 0) {
      const image = this.d.images.find(c.imageId);
      const signal = (image?.config.config?.StopSignal || 'SIGTERM').replace(/^(?!SIG)(?=[A-Z])/, 'SIG');
      // The stop signal comes from the image: one the runtime does not know must not make the container unstoppable.
      const sent = await runtime.kill(c.id, signal).then(
        () => true,
        (err) => (this.d.log.warn('could not send the image\'s stop signal; killing the container', { id: c.id, signal, error: errorMessage(err) }), false),
      );
      if (sent && (await this.waitExit(c.id, timeoutSeconds * 1000))) return;
    }
    await runtime.kill(c.id, 'SIGKILL');
    if (!(await this.waitExit(c.id, 10_000))) {
      throw new SkiffError('DeadlineExceeded', `container ${c.id} did not exit within 10s of SIGKILL`);
    }
  }

  async remove(id: string): Promise<void> {
    const found = this.find(id);
    if (!found) return;
    await this.locked(found.id, async () => {
      const c = this.get(found.id);
      if (!c) return;
      if (c.state === 'CONTAINER_RUNNING') await this.stopLocked(c.id, 0);
      const runtime = this.d.runtimeFor(c.runtimeHandler);
      await runtime.delete(c.id);
      // Nothing may stay mounted in the dirs removed below (an idmapped volume is the host's data).
      await unmountContainerMounts(this.d.runner, path.dirname(c.rootfs));
      // The record goes before the files: a crash from here on leaves files with no record,
      // which the next start removes, never a record whose files are half gone.
      this.forget(c.id);
      this.names.release(c.name);
      await fsp.rm(path.dirname(c.rootfs), { recursive: true, force: true });
      await fsp.rm(path.join(this.d.rootDir, 'containers', c.id), { recursive: true, force: true });
      await fsp.rm(c.bundle, { recursive: true, force: true });
      await fsp.rm(path.join(this.exitDir, c.id), { force: true });
      // conmon leaves a link to the bundle in the attach socket directory.
      await fsp.rm(path.join(this.socketDir, c.id), { force: true });
      this.d.onEvent?.('CONTAINER_DELETED_EVENT', c);
      // Snapshots of an image removed while this container used it can go now.
      await this.d.images.gc().catch((err) => this.d.log.warn('snapshot cleanup after container removal failed', { error: errorMessage(err) }));
    });
  }

  /**
   * Starts a command in a running container with piped stdio, for streaming
   * exec. The caller owns the process: it pipes the streams and awaits `exit`.
   */
  async execProcess(id: string, cmd: string[]): Promise<ChildProcessWithoutNullStreams & { pidFile: string }> {
    const { c, runtime, tmp, processJson } = await this.prepareExec(id, cmd, false);
    // The pid file names the command inside the container: killing runc alone would leave it running.
    const pidFile = path.join(tmp, 'pid');
    const child = spawn(runtime.binary, [`--root=${runtime.root}`, 'exec', '--pid-file', pidFile, '--process', processJson, c.id], { stdio: ['pipe', 'pipe', 'pipe'] });
    child.on('error', () => undefined);
    child.on('close', () => void fsp.rm(tmp, { recursive: true, force: true }));
    return Object.assign(child, { pidFile });
  }

  /**
   * Starts a command on a terminal in a running container. runc runs in the
   * foreground with its stdio on a pseudo-terminal skiff owns: it makes the
   * container's terminal, proxies it to ours, and exits with the command's
   * exit code. Resizing ours and signalling runc (SIGWINCH) resizes theirs.
   * The caller reads and writes `master` and closes it after `child` exits.
   */
  async execTty(id: string, cmd: string[]): Promise<{ child: ChildProcess; master: number; pidFile: string }> {
    const { c, runtime, tmp, processJson } = await this.prepareExec(id, cmd, true);
    let pty: { master: number; slave: number };
    try {
      pty = openpty();
    } catch (err) {
      await fsp.rm(tmp, { recursive: true, force: true });
      throw err;
    }
    const { master, slave } = pty;
    // No other child may inherit either side: a stray copy keeps the terminal open.
    setCloexec(master);
    setCloexec(slave);
    const pidFile = path.join(tmp, 'pid');
    let child;
    try {
      child = spawn(runtime.binary, [`--root=${runtime.root}`, 'exec', '--tty', '--pid-file', pidFile, '--process', processJson, c.id], { stdio: [slave, slave, slave] });
    } catch (err) {
      closeFd(master);
      throw err;
    } finally {
      // The child has its copies; ours would keep the terminal open after it exits.
      closeFd(slave);
    }
    child.on('error', () => undefined);
    child.on('close', () => void fsp.rm(tmp, { recursive: true, force: true }));
    return { child, master, pidFile };
  }

  /** Changes a container's cgroup limits, in the runtime and in its recorded config. */
  async updateResources(id: string, res: NonNullable<NonNullable<ContainerConfig__Output['linux']>['resources']>): Promise<void> {
    const found = this.mustGet(id);
    await this.locked(found.id, async () => {
      // Removed while this call waited for the lock.
      const c = this.get(found.id);
      if (!c) throw notFound(`container "${id}" not found`);
      if (c.state === 'CONTAINER_EXITED') throw failedPrecondition(`container ${c.id} has exited`);
      const r: Record<string, unknown> = {};
      const cpu: Record<string, unknown> = {};
      if (res.cpuShares) cpu.shares = Number(res.cpuShares);
      if (res.cpuQuota) cpu.quota = Number(res.cpuQuota);
      if (res.cpuPeriod) cpu.period = Number(res.cpuPeriod);
      if (res.cpusetCpus) cpu.cpus = res.cpusetCpus;
      if (res.cpusetMems) cpu.mems = res.cpusetMems;
      if (Object.keys(cpu).length) r.cpu = cpu;
      if (res.memoryLimitInBytes) r.memory = { limit: Number(res.memoryLimitInBytes), ...(res.memorySwapLimitInBytes ? { swap: Number(res.memorySwapLimitInBytes) } : {}) };
      if (res.hugepageLimits.length) r.hugepageLimits = res.hugepageLimits.map((h) => ({ pageSize: h.pageSize, limit: Number(h.limit) }));
      if (Object.keys(res.unified).length) r.unified = res.unified;
      if (c.state === 'CONTAINER_RUNNING') {
        const runtime = this.d.runtimeFor(c.runtimeHandler);
        const file = path.join(c.bundle, 'resources.json');
        await fsp.writeFile(file, JSON.stringify(r));
        const out = await this.d.runner(runtime.binary, [`--root=${runtime.root}`, 'update', `--resources=${file}`, c.id], { timeoutMs: 30_000 });
        if (out.code !== 0) throw new SkiffError('Internal', `${runtime.name} update ${c.id} failed: ${out.stderr.trim()}`);
      }
      c.spec.linux.resources = { ...c.spec.linux.resources, ...r };
      c.config.linux = { ...(c.config.linux ?? ({} as NonNullable<ContainerConfig__Output['linux']>)), resources: res };
      await fsp.writeFile(path.join(c.bundle, 'config.json'), JSON.stringify(c.spec));
      // The container may have exited while runc updated it: the exit recorded meanwhile stays, only the resources change.
      const cur = this.get(c.id)!;
      cur.spec.linux.resources = c.spec.linux.resources;
      cur.config.linux = c.config.linux;
      this.save(cur);
    });
  }

  /** The CRI client's log directory and the path in it, when the log is there (not the bundle's console.log). */
  private logIn(c: ContainerRecord): { dir: string; rel: string } | undefined {
    const rel = c.config.logPath;
    if (!rel || !c.logPath.endsWith(`/${rel}`)) return undefined;
    return { dir: c.logPath.slice(0, -rel.length - 1), rel };
  }

  /** The log file conmon is about to open, made by the runtime with nothing a pod left there followed. */
  private async prepareLog(c: ContainerRecord): Promise<void> {
    const at = this.logIn(c);
    if (!at) {
      await fsp.mkdir(path.dirname(c.logPath), { recursive: true });
      return;
    }
    await fsp.mkdir(at.dir, { recursive: true });
    const removed = await prepareContainerLog(at.dir, at.rel);
    if (removed.length) this.d.log.warn('removed what was not a plain log file at a container log path before starting it', { id: c.id, log: c.logPath, removed });
  }

  /** Asks conmon to reopen the log file (after the kubelet rotated it). */
  async reopenLog(id: string): Promise<void> {
    const c = this.mustGet(id);
    if (c.state !== 'CONTAINER_RUNNING') throw failedPrecondition(`container ${c.id} is not running`);
    const at = this.logIn(c);
    if (at && (await clearReopenTarget(at.dir, at.rel))) this.d.log.warn('removed what was at a container log\'s reopen path before conmon opened it', { id: c.id, log: `${c.logPath}.tmp` });
    const ctl = path.join(c.bundle, 'ctl');
    let fh: fsp.FileHandle;
    try {
      fh = await fsp.open(ctl, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK);
    } catch (err) {
      throw new SkiffError('Internal', `cannot reach conmon for ${c.id}: ${errorMessage(err)}`);
    }
    try {
      // conmon's control messages are "<type> <height> <width>"; type 2 reopens the log.
      await fh.write('2 0 0\n');
    } finally {
      await fh.close();
    }
    const deadline = Date.now() + 5_000;
    while (Date.now() < deadline) {
      if (await fsp.stat(c.logPath).then(() => true, () => false)) return;
      await new Promise((r) => setTimeout(r, 20));
    }
    throw new SkiffError('DeadlineExceeded', `conmon did not reopen ${c.logPath} within 5s`);
  }

  async stopAll(sandboxId: string): Promise<void> {
    for (const c of this.list(sandboxId)) await this.stop(c.id, 0);
  }

  async removeAll(sandboxId: string): Promise<void> {
    for (const c of this.list(sandboxId)) await this.remove(c.id);
  }

  /** What every exec needs: a running container, a command, its runtime and a process file. */
  private async prepareExec(id: string, cmd: string[], terminal: boolean): Promise<{ c: ContainerRecord; runtime: OciRuntime; tmp: string; processJson: string }> {
    const c = this.mustGet(id);
    if (c.state !== 'CONTAINER_RUNNING') throw failedPrecondition(`container ${c.id} is not running`);
    if (!cmd.length) throw invalidArgument('exec: cmd is empty');
    const runtime = this.d.runtimeFor(c.runtimeHandler);
    const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-exec-'));
    const processJson = path.join(tmp, 'process.json');
    const env = terminal && !c.spec.process.env.some((e) => e.startsWith('TERM=')) ? [...c.spec.process.env, 'TERM=xterm'] : c.spec.process.env;
    try {
      await fsp.writeFile(processJson, JSON.stringify({ ...c.spec.process, env, terminal, args: cmd }));
    } catch (err) {
      // (EMFILE, ENOSPC): the directory is nobody's once this fails.
      await fsp.rm(tmp, { recursive: true, force: true });
      throw err;
    }
    return { c, runtime, tmp, processJson };
  }

  /**
   * Runs a command in a running container and collects its output. It answers
   * when the command exits; a timeout, or the client cancelling, kills the
   * command and is DeadlineExceeded (what the kubelet reads as a probe timeout).
   */
  async execSync(id: string, cmd: string[], timeoutSeconds: number, signal?: AbortSignal): Promise<ExecSyncResult> {
    const { c, runtime, tmp, processJson } = await this.prepareExec(id, cmd, false);
    try {
      await fsp.mkdir(path.join(tmp, 'exit'));
      return await runExecSync({
        runtime,
        containerId: c.id,
        processJson,
        workDir: tmp,
        timeoutMs: timeoutSeconds > 0 ? timeoutSeconds * 1000 : 0,
        signal,
      });
    } finally {
      await fsp.rm(tmp, { recursive: true, force: true });
    }
  }
}

export function podContext(s: SandboxRecord) {
  return {
    sandboxId: s.id,
    netns: s.netns,
    ipcns: s.ipcns,
    utsns: s.utsns,
    infraPid: s.infraPid,
    hostPid: s.hostPid,
    hostsFile: path.join(s.dir, 'hosts'),
    resolvFile: path.join(s.dir, 'resolv.conf'),
    hostnameFile: path.join(s.dir, 'hostname'),
    hostname: s.hostname,
    shmPath: s.shm,
    ...(s.userns && s.usernsMaps ? { userns: { path: s.userns, ...ociIdMappings(s.usernsMaps) } } : {}),
    cgroupParent: s.cgroupParent,
    sysctls: s.config.linux?.sysctls ?? {},
  };
}

/**
 * Unmounts a container directory's rootfs and idmapped volumes; throws when
 * something is still mounted below it afterwards.
 */
async function unmountContainerMounts(runner: Runner, dir: string): Promise<void> {
  await unmount(runner, path.join(dir, 'rootfs'));
  const staged = path.join(dir, 'idmapped');
  for (const n of await fsp.readdir(staged).catch(() => [] as string[])) await unmount(runner, path.join(staged, n));
  const left = await mountsBelow(dir);
  if (left.length) throw new SkiffError('Internal', `${left[0]} is still mounted; not removing ${dir}`);
}

/** Removes a container directory, never through a mount (an idmapped volume is the host's data). */
async function removeContainerDir(runner: Runner, dir: string): Promise<void> {
  await unmountContainerMounts(runner, dir);
  await fsp.rm(dir, { recursive: true, force: true });
}

async function resolveDevices(config: ContainerConfig__Output): Promise<OciDevice[]> {
  const out: OciDevice[] = [];
  for (const d of config.devices) {
    let st: fs.Stats;
    try {
      st = await fsp.stat(d.hostPath);
    } catch (err) {
      throw invalidArgument(`device ${d.hostPath}: ${isErrno(err, 'ENOENT') ? 'no such device on the host' : errorMessage(err)}`);
    }
    if (!st.isCharacterDevice() && !st.isBlockDevice()) throw invalidArgument(`device ${d.hostPath} is not a device node`);
    const rdev = st.rdev;
    out.push({
      path: d.containerPath || d.hostPath,
      type: st.isCharacterDevice() ? 'c' : 'b',
      major: Number((BigInt(rdev) >> 8n) & 0xfffn),
      minor: Number((BigInt(rdev) & 0xffn) | ((BigInt(rdev) >> 12n) & ~0xffn)),
      fileMode: st.mode & 0o777,
      uid: st.uid,
      gid: st.gid,
      permissions: d.permissions || 'rwm',
    });
  }
  return out;
}

/** Creates `dir` inside `rootfs`, refusing to pass through symlinks. */
async function ensureDirInRoot(rootfs: string, dir: string, uid: number, gid: number): Promise<void> {
  if (dir.includes('\0')) throw invalidArgument(`working directory ${JSON.stringify(dir)} holds a NUL byte`);
  let cur = rootfs;
  for (const part of dir.split('/').filter(Boolean)) {
    if (part === '..') throw invalidArgument(`working directory "${dir}" leaves the rootfs`);
    cur = path.join(cur, part);
    const st = await fsp.lstat(cur).catch(() => undefined);
    if (!st) {
      await fsp.mkdir(cur, { mode: 0o755 });
      await fsp.chown(cur, uid, gid);
    } else if (st.isSymbolicLink()) {
      return; // resolved inside the container by the runtime
    } else if (!st.isDirectory()) {
      throw invalidArgument(`working directory "${dir}" is not a directory in the image`);
    }
  }
}

/** A small file's text read in place (one just written: its pages are in memory), or '' when it cannot be read. */
function readSmall(file: string): string {
  try {
    return fs.readFileSync(file, 'utf8');
  } catch {
    return '';
  }
}
