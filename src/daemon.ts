/** `skiff cri`: wires the stores, services and servers together and runs them. */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { openDb, type Db } from './db.js';
import { SkiffError, errorMessage } from './errors.js';
import { tryLockExclusive } from './sys/libc.js';
import type { Logger } from './log.js';
import { LocalContentStore } from './image/content.js';
import { RegistryClient } from './image/registry.js';
import { ImageService } from './image/service.js';
import { OverlaySnapshotter } from './image/snapshot.js';
import { isPolledMethod } from './server/boundary.js';
import { createGrpcServer } from './server/grpc-server.js';
import { startAuthorityProxy, type AuthorityProxy } from './server/h2-authority-proxy.js';
import { imageFsInfo } from './server/image-fs-info.js';
import { listImages } from './server/image-list.js';
import { pullImage } from './server/image-pull.js';
import { removeImage } from './server/image-remove.js';
import { imageStatus } from './server/image-status.js';
import { skiffImagesHandlers } from './server/skiff-images.js';
import { ImagesDir } from './image/images-dir.js';
import { status, type Readiness } from './server/runtime-status.js';
import { NO_FEATURES, featuresDocument, featuresFromDocument, usernsSupport, type HandlerFeatures } from './oci/features.js';
import { probeIdmappedOverlay, unsearchableAncestor } from './sys/idmap.js';
import { version } from './server/runtime-version.js';
import { containerHandlers } from './server/container.js';
import { sandboxHandlers } from './server/sandbox.js';
import { metricsHandlers, statsHandlers, statsReaders } from './server/stats.js';
import { ContainerEvents } from './server/events.js';
import { streamingHandlers } from './server/streaming.js';
import { StreamingServer } from './streaming/server.js';
import { ContainerService } from './container/service.js';
import { OciRuntime } from './oci/runtime.js';
import { capsFromMask } from './container/spec.js';
import { CniNetwork, checkBridgeName, defaultBridgeName } from './sandbox/cni.js';
import { SandboxService } from './sandbox/service.js';
import { findExecutable, run, type Runner } from './sys/run.js';
import { releaseIdleMemory } from './sys/idle-memory.js';
import { IdleRelease } from './idle-release.js';

export interface DaemonOptions {
  socket: string;
  root: string;
  state: string;
  registryConfig: string;
  pinnedImages: string[];
  cniConfDir: string;
  cniBinDirs: string[];
  podCidr: string;
  /** The bridge of skiff's own network; by default one named from `root`. */
  cniBridge?: string;
  infraBinary: string;
  streamAddress: string;
  streamPort: number;
  /** A registry download that receives nothing for this long fails (0: never). */
  imagePullProgressTimeoutMs?: number;
  /** A streaming session with no traffic either way for this long is closed (default 4 h). */
  streamIdleTimeoutMs?: number;
  /** Image archives imported at start and when added; '' or undefined: none. */
  imagesDir?: string;
  /** Memory the daemon holds but does not use goes back after this long with no calls (0: never; default 5 s). */
  idleReleaseAfterMs?: number;
  /** conmon's --log-size-max for every container (0 or undefined: no cap). */
  containerLogSizeMax?: number;
}

export interface Daemon {
  images: ImageService;
  /** Stops accepting, lets in-flight RPCs finish, and closes the stores. */
  close(): Promise<void>;
}

/** Locks `<root>/lock` (holding the owner's pid), or fails saying which process has it. */
async function lockRoot(root: string): Promise<fsp.FileHandle> {
  const file = path.join(root, 'lock');
  const fh = await fsp.open(file, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o600);
  if (!tryLockExclusive(fh.fd)) {
    const owner = (await fh.readFile('utf8').catch(() => '')).trim();
    await fh.close();
    throw new SkiffError('FailedPrecondition', `another skiff${owner ? ` (pid ${owner})` : ''} is using --root ${root}; stop it first`);
  }
  await fh.truncate(0);
  await fh.write(`${process.pid}\n`, 0);
  return fh;
}

async function socketInUse(p: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = net.connect(p);
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}

function listen(server: net.Server): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.once('listening', () => {
      server.off('error', reject);
      resolve();
    });
  });
}

/** What the crash guard logs: tests look for it to prove no input of theirs reached it. */
export const CRASH_GUARD_MESSAGE = 'crash guard: an error escaped every handler; still serving';

/**
 * The last line of defence: an error that escaped every handler is logged and
 * the daemon keeps serving its other clients. Reaching it is a bug to fix.
 */
export function installCrashGuard(log: Logger): void {
  process.on('uncaughtException', (err) => log.error(CRASH_GUARD_MESSAGE, { kind: 'uncaughtException', error: err instanceof Error ? (err.stack ?? err.message) : String(err) }));
  process.on('unhandledRejection', (err) => log.error(CRASH_GUARD_MESSAGE, { kind: 'unhandledRejection', error: err instanceof Error ? (err.stack ?? err.message) : String(err) }));
}

/**
 * The root holds every image and the records of every container (their
 * environments, secrets among them): only the daemon's user may enter it.
 * A root made here is 0700 already; one that was there before is tightened
 * to that, and one another user owns is refused, as that user could change
 * what the daemon reads.
 */
async function ownRoot(root: string, log: Logger): Promise<void> {
  const st = await fsp.stat(root);
  if (!st.isDirectory()) throw new SkiffError('FailedPrecondition', `--root ${root} is not a directory`);
  const me = process.getuid?.() ?? 0;
  if (st.uid !== me) throw new SkiffError('FailedPrecondition', `--root ${root} belongs to uid ${st.uid}, not to this daemon's uid ${me}: give it to uid ${me} (chown) or choose another root`);
  if ((st.mode & 0o077) !== 0) {
    await fsp.chmod(root, 0o700);
    log.warn('--root was open to other users; its mode is now 0700', { root, was: `0${(st.mode & 0o7777).toString(8)}` });
  }
}

export async function startDaemon(opts: DaemonOptions, log: Logger): Promise<Daemon> {
  // Checked before anything is created: a bad name should leave no state behind.
  const bridge = checkBridgeName(opts.cniBridge || defaultBridgeName(opts.root));
  // The state dir is searchable by others (as containerd's /run/containerd is): runc reaches a
  // user-namespaced pod's rootfs below it from inside the pod's namespace. Everything in it has a
  // restrictive mode of its own, the sockets included.
  await fsp.mkdir(opts.state, { recursive: true, mode: 0o711 });
  for (const dir of [opts.root, path.dirname(opts.socket)]) await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  await ownRoot(opts.root, log);
  // Two daemons on one root would corrupt each other's images and pods (and the second would
  // take the socket of the first while it is still finishing its calls): the root is locked
  // for the daemon's whole life, released by the kernel however it ends.
  const lock = await lockRoot(opts.root);
  if (await socketInUse(opts.socket)) {
    await lock.close();
    throw new SkiffError('FailedPrecondition', `another process is serving ${opts.socket}; stop it first`);
  }
  await fsp.rm(opts.socket, { force: true });
  // Left by versions that served gRPC on a private socket behind the public one.
  await fsp.rm(path.join(opts.state, 'grpc.sock'), { force: true });

  const db: Db = openDb(path.join(opts.root, 'metadata.db'));
  const content = new LocalContentStore(path.join(opts.root, 'content'));
  await content.init();
  const snapshots = new OverlaySnapshotter(opts.root, db);
  await snapshots.init();
  // Read at every pull: a directory or hosts.toml added later takes effect without a restart.
  const registry = new RegistryClient({ configRoot: opts.registryConfig, logger: log, progressTimeoutMs: opts.imagePullProgressTimeoutMs });
  // Decompressed copies of archives being imported live here (unlinked at once; a crash leaves none).
  const importTmpDir = path.join(opts.root, 'import-tmp');
  await fsp.rm(importTmpDir, { recursive: true, force: true });
  const images = new ImageService({ db, content, snapshots, registry, log, pinned: opts.pinnedImages, importTmpDir });
  await images.gc();

  const runner = run;
  // Pods in a user namespace need the kernel to idmap overlay layers (tried once, beside the runtime probes)
  // and runc to reach their rootfs under the state dir from inside the pod's user namespace.
  const kernelIdmap = unsearchableAncestor(opts.state).then((closed) =>
    closed
      ? { ok: false as const, reason: `${closed} is not searchable by other users (mode o+x), and runc reaches a pod's rootfs under ${opts.state} from inside the pod's user namespace` }
      : probeIdmappedOverlay(opts.state, runner),
  );
  const runtimes = await probeRuntimes(path.join(opts.state, 'runtimes'), runner);
  // Asked of each working runtime once: `features` says whether it applies recursive read-only mounts
  // and joins user namespaces.
  const features = new Map<string, HandlerFeatures>();
  const userns = new Map<string, { ok: true } | { ok: false; reason: string }>();
  const kernel = await kernelIdmap;
  if (!kernel.ok) log.info('pods with a user namespace are not supported here', { reason: kernel.reason });
  for (const [name, rt] of runtimes) {
    if ('unavailable' in rt) continue;
    const doc = await featuresDocument(rt.binary, runner);
    features.set(name, doc === undefined ? { ...NO_FEATURES } : featuresFromDocument(doc));
    userns.set(name, kernel.ok ? usernsSupport(rt.binary, doc) : kernel);
  }
  const cni = new CniNetwork({
    confDir: opts.cniConfDir,
    binDirs: opts.cniBinDirs,
    dataDir: path.join(opts.root, 'cni'),
    podCidr: opts.podCidr,
    bridge,
    runner,
    log,
  });
  const oomFloor = Number((await fsp.readFile('/proc/self/oom_score_adj', 'utf8').catch(() => '0')).trim()) || 0;
  let sandboxes: SandboxService;
  const events = new ContainerEvents(log);
  const containers = new ContainerService({
    db,
    rootDir: opts.root,
    stateDir: opts.state,
    images,
    snapshots,
    sandboxes: () => sandboxes,
    runtimeFor: (h) => sandboxes.runtimeFor(h),
    handlerFeatures: (h) => features.get(sandboxes.runtimeFor(h).name) ?? NO_FEATURES,
    runner,
    log,
    oomScoreAdjFloor: oomFloor,
    allowedCaps: await boundingCaps(),
    logSizeMax: opts.containerLogSizeMax,
    onEvent: (type, c) => events.publish(type, c),
  });
  sandboxes = new SandboxService({
    db,
    stateDir: opts.state,
    runtimes,
    defaultRuntime: 'runc',
    cni,
    runner,
    log,
    infraBinary: opts.infraBinary,
    oomScoreAdjFloor: oomFloor,
    userNamespaces: (h) => userns.get(sandboxes.runtimeFor(h).name) ?? { ok: false, reason: 'not probed' },
    containers,
  });
  events.bind(sandboxes, containers);
  images.setSnapshotUsers(() => containers.listView().flatMap((c) => (c.chainId ? [c.chainId] : [])));
  await sandboxes.init();
  await containers.init();

  const readiness: Readiness = {
    runtime: async () => {
      const rt = runtimes.get('runc');
      if (!rt || 'unavailable' in rt) return { ready: false, reason: 'RuntimeNotReady', message: `the default runtime handler runc is unavailable: ${rt && 'unavailable' in rt ? rt.unavailable : 'runc not found'}` };
      // Looked up at each call: installing the package later makes the node ready without a restart.
      if (!(await which('conmon'))) return { ready: false, reason: 'RuntimeNotReady', message: 'conmon, the container monitor, is not installed (not on PATH)' };
      if (!(await findExecutable(path.basename(opts.infraBinary), [path.dirname(opts.infraBinary)]))) {
        return { ready: false, reason: 'RuntimeNotReady', message: `the pod infra binary ${opts.infraBinary} is missing or not executable` };
      }
      return { ready: true };
    },
    network: () => cni.status(),
    handlers: () => [...runtimes].filter(([, r]) => !('unavailable' in r)).map(([n]) => n),
    defaultHandler: 'runc',
    features: (name) => features.get(name) ?? NO_FEATURES,
    userNamespaces: (name) => userns.get(name)?.ok ?? false,
    info: () => ({
      root: opts.root,
      state: opts.state,
      registryConfig: opts.registryConfig,
      cniConfDir: opts.cniConfDir,
      cniBinDirs: opts.cniBinDirs,
      podCidr: opts.podCidr,
      cniBridge: bridge,
      cgroupDriver: 'cgroupfs',
      runtimeHandlers: Object.fromEntries([...runtimes].map(([n, r]) => [n, 'unavailable' in r ? { available: false, reason: r.unavailable } : { available: true, binary: r.binary }])),
    }),
  };
  const streaming = new StreamingServer({
    address: opts.streamAddress,
    port: opts.streamPort,
    tokenTtlMs: 60_000,
    idleTimeoutMs: opts.streamIdleTimeoutMs,
    log,
    startExec: (id, cmd) => containers.execProcess(id, cmd),
    startExecTty: (id, cmd) => containers.execTty(id, cmd),
  });
  await streaming.start();
  // One for both: the layer walks and namespace reads of stats and metrics calls are bounded together.
  const stats = statsReaders();
  const server = createGrpcServer(
    {
      Version: version,
      Status: status(readiness),
      ...sandboxHandlers(sandboxes, containers),
      ...containerHandlers(containers, sandboxes),
      ...statsHandlers(sandboxes, containers, stats),
      ...metricsHandlers(sandboxes, containers, stats),
      ...streamingHandlers(streaming, sandboxes, containers),
      RuntimeConfig: async () => ({ linux: { cgroupDriver: 'CGROUPFS' } }),
      UpdateRuntimeConfig: async (req: { runtimeConfig?: { networkConfig?: { podCidr?: string } | null } | null }) => {
        const cidr = req.runtimeConfig?.networkConfig?.podCidr;
        if (cidr) await cni.setPodCidr(cidr);
        return {};
      },
    },
    {
      PullImage: pullImage(images),
      ListImages: listImages(images),
      ImageStatus: imageStatus(images),
      RemoveImage: removeImage(images),
      ImageFsInfo: imageFsInfo(images),
    },
    log,
    { GetContainerEvents: events.handler },
    skiffImagesHandlers(images, log),
  );

  const oldMask = process.umask(0o117);
  let proxy: AuthorityProxy;
  try {
    proxy = startAuthorityProxy(opts.socket, (conn) => server.attach(conn), log);
    await listen(proxy.server);
  } finally {
    process.umask(oldMask);
  }
  await fsp.chmod(opts.socket, 0o660);
  // Imported before the daemon says it serves: a node started with its images there finds them at once.
  let imagesDir: ImagesDir | undefined;
  if (opts.imagesDir) {
    imagesDir = new ImagesDir({ dir: opts.imagesDir, stateFile: path.join(opts.root, 'images-dir.json'), importArchive: (f, o) => images.importArchive(f, o), log });
    await imagesDir.start();
  }
  // glibc keeps the pages a burst of work freed (request buffers, JSON, child plumbing) inside its arenas:
  // they go back once the daemon is quiet. Quiet means no call that changes something: a kubelet's polls
  // (relists every second, statuses, stats, probes) never stop, and take little. Once per quiet spell.
  const afterMs = opts.idleReleaseAfterMs ?? 5_000;
  const idleRelease =
    afterMs > 0
      ? new IdleRelease({
          afterMs,
          release: async () => log.debug('idle: memory released', { ...(await releaseIdleMemory()) }),
          onError: (err) => log.warn('idle: releasing memory failed', { error: errorMessage(err) }),
        })
      : undefined;
  if (idleRelease) server.onActivity = (p) => isPolledMethod(p) || idleRelease.touch();
  log.info('skiff cri serving', { socket: opts.socket, root: opts.root, state: opts.state, registryConfig: opts.registryConfig, imagesDir: opts.imagesDir, streaming: streaming.url });

  let closing: Promise<void> | undefined;
  return {
    images,
    close: () =>
      (closing ??= (async () => {
        proxy.server.close();
        idleRelease?.close();
        events.close();
        await imagesDir?.close();
        // In-flight RPCs finish; a call still running after the grace period is cut off.
        await server.shutdown(30_000);
        await proxy.destroyConnections();
        await streaming.close();
        await registry.close();
        containers.close();
        await sandboxes.close();
        db.close();
        await fsp.rm(opts.socket, { force: true });
        await lock.close();
      })()),
  };
}

/**
 * runc is the default handler; crun is offered only where it works. crun 1.8
 * refuses hosts with hybrid cgroups, so it is probed, not assumed.
 */
async function probeRuntimes(stateDir: string, runner: Runner): Promise<Map<string, OciRuntime | { unavailable: string }>> {
  const out = new Map<string, OciRuntime | { unavailable: string }>();
  const hybrid = fs.existsSync('/sys/fs/cgroup/unified') && !fs.existsSync('/sys/fs/cgroup/cgroup.controllers');
  for (const [name, binary] of [['runc', 'runc'], ['crun', 'crun']] as const) {
    const full = await which(binary);
    const v = full ? await runner(full, ['--version']).catch(() => undefined) : undefined;
    if (!full || !v || v.code !== 0) {
      out.set(name, { unavailable: `${binary} is not installed` });
    } else if (name === 'crun' && hybrid) {
      out.set(name, { unavailable: 'crun refuses hosts with hybrid cgroups (v1 controllers with a v2 hierarchy), as this one has' });
    } else {
      await fsp.mkdir(path.join(stateDir, name), { recursive: true, mode: 0o700 });
      out.set(name, new OciRuntime(name, full, path.join(stateDir, name), runner));
    }
  }
  return out;
}

/** The absolute path of `cmd` on PATH (conmon wants the runtime's full path). */
function which(cmd: string): Promise<string | undefined> {
  return findExecutable(cmd, (process.env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':'));
}

/** This process's capability bounding set: a container can get nothing beyond it. */
async function boundingCaps(): Promise<string[] | undefined> {
  const status = await fsp.readFile('/proc/self/status', 'utf8').catch(() => '');
  const m = /^CapBnd:\s*([0-9a-f]+)$/m.exec(status);
  return m ? capsFromMask(m[1]!) : undefined;
}
