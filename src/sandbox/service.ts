/**
 * Pod sandboxes: pinned network, IPC and UTS namespaces, a CNI network, a
 * tmpfs /dev/shm, and, only for pods whose containers share one PID
 * namespace, an infra process (catatonit) that holds it and needs no image.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Db } from '../db.js';
import { SkiffError, errorMessage, invalidArgument, isErrno, wrap } from '../errors.js';
import type { PodSandboxConfig__Output } from '../gen/runtime/v1/PodSandboxConfig.js';
import type { Logger } from '../log.js';
import { RecordIndex } from '../record-index.js';
import { KeyedLock, Registrar, Rollback } from '../registrar.js';
import { removeRuntimeRemains } from '../sys/cgroup.js';
import { mount as libcMount } from '../sys/libc.js';
import { bindMount, isMountpoint, unmount } from '../sys/mount.js';
import { runChecked, type Runner } from '../sys/run.js';
import type { OciRuntime } from '../oci/runtime.js';
import { DEFAULT_MASKED, DEFAULT_READONLY } from '../oci/defaults.js';
import { PhaseTrace } from '../trace.js';
import type { CniNetwork, PortMapping } from './cni.js';
import { createPinnedUserns, passableByPodRoot } from '../sys/idmap.js';
import { hostIdOf, podUserns, sharedHostIds, type PodUserns } from './userns.js';
import { needsInfra } from './infra.js';
import { pinNamespaces } from './pin-ns.js';

export type SandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

export interface SandboxRecord {
  id: string;
  name: string;
  state: SandboxState;
  createdAt: number;
  config: PodSandboxConfig__Output;
  runtimeHandler: string;
  dir: string;
  netns?: string;
  ipcns?: string;
  utsns?: string;
  /** The pod's own user namespace (pinned like the others) and its mappings; none: the host's. */
  userns?: string;
  usernsMaps?: PodUserns;
  hostNetwork: boolean;
  hostIpc: boolean;
  hostPid: boolean;
  shm?: string;
  ips: string[];
  infraPid?: number;
  /** The pod runs no infra process (see needsInfra); records written before this field existed all have one. */
  noInfra?: boolean;
  cgroupParent: string;
  hostname: string;
}

export interface SandboxDeps {
  db: Db;
  stateDir: string;
  runtimes: Map<string, OciRuntime | { unavailable: string }>;
  defaultRuntime: string;
  cni: CniNetwork;
  runner: Runner;
  log: Logger;
  infraBinary: string;
  /** The lowest oom_score_adj a child may be given here (lowering below the daemon's own can be refused). */
  oomScoreAdjFloor: number;
  /** Whether pods on this handler can have a user namespace (idmapped layers work here); the reason when not. */
  userNamespaces?: (handler: string) => { ok: true } | { ok: false; reason: string };
  /** Stops and removes a pod's containers (supplied by the container service). */
  containers: { stopAll(sandboxId: string): Promise<void>; removeAll(sandboxId: string): Promise<void> };
}

const nsMode = (m: unknown): string => String(m ?? 'POD');

const MS_NOSUID = 2;
const MS_NODEV = 4;
const MS_NOEXEC = 8;

/** Whether the pod was started with an infra process. */
export function hasInfra(s: Pick<SandboxRecord, 'noInfra'>): boolean {
  return !s.noInfra;
}

export function nowNs(): number {
  return Date.now() * 1e6;
}

export class SandboxService {
  private readonly names = new Registrar();
  private readonly locks = new KeyedLock();
  readonly sandboxesDir: string;
  /** Every pod's record, in memory and written through to the sandboxes table. */
  private readonly records: RecordIndex<SandboxRecord>;

  constructor(private readonly d: SandboxDeps) {
    this.sandboxesDir = path.join(d.stateDir, 'sandboxes');
    this.records = new RecordIndex<SandboxRecord>(
      {
        load: () => (d.db.prepare('SELECT data FROM sandboxes ORDER BY rowid').all() as Array<{ data: string }>).map((r) => JSON.parse(r.data) as SandboxRecord),
        put: (s, json) => void d.db.prepare('INSERT OR REPLACE INTO sandboxes (id, name, data) VALUES (?, ?, ?)').run(s.id, s.name, json),
        remove: (id) => void d.db.prepare('DELETE FROM sandboxes WHERE id = ?').run(id),
      },
      'pod sandbox',
    );
  }

  /** The namespace pins need a private mount to live on. */
  async init(): Promise<void> {
    await fs.mkdir(this.sandboxesDir, { recursive: true, mode: 0o711 });
    if (!(await isMountpoint(this.sandboxesDir))) await bindMount(this.d.runner, this.sandboxesDir, this.sandboxesDir, { private: true });
    for (const s of this.list()) this.names.reserve(s.name, s.id, 'pod sandbox');
    await this.reconcile();
  }

  /**
   * What a process killed mid-RunPodSandbox leaves behind has no record:
   * its infra process, network, namespace pins and files go.
   */
  private async removeOrphans(): Promise<void> {
    const known = new Set(this.list().map((s) => s.id));
    await this.d.cni.removeTempFiles();
    const orphans = new Set<string>();
    for (const name of await fs.readdir(this.sandboxesDir)) if (/^[a-f0-9]{64}$/.test(name) && !known.has(name)) orphans.add(name);
    for (const id of await this.d.cni.cachedIds()) if (!known.has(id)) orphans.add(id);
    for (const id of orphans) {
      this.d.log.warn('removing the remains of a pod sandbox with no record', { id });
      const dir = path.join(this.sandboxesDir, id);
      for (const rt of this.d.runtimes.values()) if (!('unavailable' in rt)) await removeRuntimeRemains(rt, id, path.join(dir, 'infra'), this.d.log);
      const pin = path.join(dir, 'ns', 'net');
      // While the pin holds the namespace, DEL can find the pod's interface and so its masquerade rules.
      const netns = (await isMountpoint(pin)) ? pin : undefined;
      await this.d.cni.del(id, { netns }).catch(async (err) => {
        // No record means nobody retries it: say so once rather than fail again at every start.
        this.d.log.error('CNI DEL for an orphaned pod failed; its network may leak', { id, error: errorMessage(err) });
        await this.d.cni.discard(id);
      });
      for (const f of ['shm', 'ns/net', 'ns/ipc', 'ns/uts', 'ns/user']) await unmount(this.d.runner, path.join(dir, f)).catch(() => undefined);
      await fs.rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * A pod whose infra process died while skiff was down is no longer ready;
   * nor is a pod without one whose namespace pins or files are gone (a
   * reboot empties the state directory, an admin may have unmounted a pin).
   */
  private async reconcile(): Promise<void> {
    await this.removeOrphans();
    // One read of the mount table for every pod's pins.
    const mounted = new Set((await fs.readFile('/proc/self/mountinfo', 'utf8')).split('\n').map((l) => l.split(' ')[4]));
    for (const s of this.list()) {
      if (s.state !== 'SANDBOX_READY') continue;
      if (await this.stillReady(s, (p) => mounted.has(p.replace(/ /g, '\\040')))) continue;
      this.d.log.warn(hasInfra(s) ? 'pod infra process is gone; marking the pod not ready' : 'pod namespaces are gone; marking the pod not ready', { id: s.id, name: s.name });
      s.state = 'SANDBOX_NOTREADY';
      this.save(s);
    }
  }

  private async stillReady(s: SandboxRecord, isMounted: (p: string) => boolean): Promise<boolean> {
    if (hasInfra(s)) {
      const rt = this.d.runtimes.get(s.runtimeHandler || this.d.defaultRuntime);
      const st = rt && !('unavailable' in rt) ? await rt.state(s.id).catch(() => undefined) : undefined;
      return st?.status === 'running';
    }
    if (!(await fs.stat(s.dir).then(() => true, () => false))) return false;
    for (const pin of [s.netns, s.ipcns, s.utsns]) if (pin && !isMounted(pin)) return false;
    return true;
  }

  /** Drops the private mount for namespace pins when no pod needs it any more. */
  async close(): Promise<void> {
    if (this.list().length === 0 && (await isMountpoint(this.sandboxesDir))) await unmount(this.d.runner, this.sandboxesDir);
  }

  /** One lifecycle operation per pod at a time. */
  private locked<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.locks.run(id, fn);
  }

  /**
   * Runs `fn` holding the pod's lifecycle lock, the one Stop and
   * RemovePodSandbox take: a container created under it lands in a pod that
   * is ready throughout, or is not created at all.
   */
  withPodLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.locked(id, fn);
  }

  private save(s: SandboxRecord): void {
    this.records.save(s);
  }

  /** A copy of the pod's record, to change and save. */
  get(id: string): SandboxRecord | undefined {
    return this.records.get(id);
  }

  /** By full id or unique prefix (a copy). */
  find(idOrPrefix: string): SandboxRecord | undefined {
    return this.records.find(idOrPrefix);
  }

  /** By full id or unique prefix: the stored record itself, to read and never change (status calls). */
  findView(idOrPrefix: string): Readonly<SandboxRecord> | undefined {
    return this.records.findView(idOrPrefix);
  }

  mustGet(id: string): SandboxRecord {
    return this.records.mustGet(id);
  }

  mustView(id: string): Readonly<SandboxRecord> {
    return this.records.mustView(id);
  }

  /** Copies of every pod's record, in creation order. */
  list(): SandboxRecord[] {
    return this.records.values().map((s) => structuredClone(s) as SandboxRecord);
  }

  /** The stored records themselves, in creation order: read them, never change them. */
  listView(): ReadonlyArray<Readonly<SandboxRecord>> {
    return this.records.values();
  }

  runtimeFor(handler: string): OciRuntime {
    const name = handler || this.d.defaultRuntime;
    const rt = this.d.runtimes.get(name);
    if (!rt) throw invalidArgument(`unknown runtime handler "${name}" (known: ${[...this.d.runtimes.keys()].join(', ')})`);
    if ('unavailable' in rt) throw new SkiffError('FailedPrecondition', `runtime handler "${name}" is unavailable on this host: ${rt.unavailable}`);
    return rt;
  }

  async run(config: PodSandboxConfig__Output, handler: string): Promise<string> {
    const md = config.metadata;
    if (!md || !md.name) throw invalidArgument('RunPodSandbox: metadata.name is required');
    if (!md.namespace) throw invalidArgument('RunPodSandbox: metadata.namespace is required');
    const runtime = this.runtimeFor(handler);
    const name = `${md.name}_${md.namespace}_${md.uid}_${md.attempt}`;
    const id = randomBytes(32).toString('hex');
    this.names.reserve(name, id, 'pod sandbox');
    const undo = new Rollback();
    undo.add('name', () => this.names.release(name));
    try {
      return await this.locked(id, () => this.create(id, name, config, runtime, handler, undo));
    } catch (err) {
      await undo.run((what, e) => this.d.log.warn('sandbox rollback step failed', { id, step: what, error: errorMessage(e) }));
      throw err;
    }
  }

  /** Host ids claimed by pods being created (their records are not saved yet). */
  private readonly usernsClaims = new Map<string, { podUid: string; maps: PodUserns }>();

  /**
   * Refuses host ids that another running pod's user namespace maps (the kubelet never gives
   * two pods the same: they would be one user to the kernel, signals, ptrace and limits
   * included), and claims them until this pod's record holds them. A sandbox of the same pod
   * (its next attempt) and a stopped pod's ids are no conflict, as with the kubelet. Checked
   * and claimed with no await between, so two creates cannot both pass.
   */
  private claimHostIds(id: string, podUid: string, maps: PodUserns, undo: Rollback): void {
    const others = [
      ...this.list().filter((s) => s.state === 'SANDBOX_READY' && s.usernsMaps).map((s) => ({ id: s.id, podUid: s.config.metadata?.uid ?? '', maps: s.usernsMaps! })),
      ...[...this.usernsClaims].map(([claimId, c]) => ({ id: claimId, ...c })),
    ];
    for (const o of others) {
      if (o.podUid === podUid) continue;
      const kind = sharedHostIds(maps, o.maps);
      if (kind) throw invalidArgument(`user namespace: the ${kind} mapping shares host ids with the user namespace of running pod sandbox ${o.id}`);
    }
    this.usernsClaims.set(id, { podUid, maps });
    undo.add('user namespace host ids', () => this.usernsClaims.delete(id));
  }

  private async create(id: string, name: string, config: PodSandboxConfig__Output, runtime: OciRuntime, handler: string, undo: Rollback): Promise<string> {
    const trace = new PhaseTrace();
    const opts = config.linux?.securityContext?.namespaceOptions;
    const hostNetwork = nsMode(opts?.network) === 'NODE';
    const hostIpc = nsMode(opts?.ipc) === 'NODE';
    const hostPid = nsMode(opts?.pid) === 'NODE';
    const userns = podUserns(opts?.usernsOptions, { network: hostNetwork, pid: hostPid, ipc: hostIpc });
    if (userns) {
      const support = this.d.userNamespaces?.(handler) ?? { ok: false, reason: 'not probed' };
      if (!support.ok) throw invalidArgument(`runtime handler "${handler || this.d.defaultRuntime}" cannot run pods in a user namespace here: ${support.reason}`);
      this.claimHostIds(id, config.metadata?.uid ?? '', userns, undo);
    }
    const withInfra = needsInfra(config);
    // Only mappings with a host port concern the network (as containerd passes them).
    const ports: PortMapping[] = config.portMappings.filter((p) => p.hostPort > 0).map((p) => ({
      hostPort: p.hostPort,
      containerPort: p.containerPort,
      protocol: String(p.protocol ?? 'TCP').toLowerCase(),
      ...(p.hostIp ? { hostIP: p.hostIp } : {}),
    }));
    // Which network, and whether it may be used, needs no namespace: learn it while they are made.
    const networkList = hostNetwork ? undefined : this.d.cni.prepare(ports);
    networkList?.catch(() => undefined);
    const dir = path.join(this.sandboxesDir, id);
    // Nobody else passes: it holds the pod's /dev/shm (mode 1777) and the files it is given.
    await fs.mkdir(dir, { mode: 0o700 });
    undo.add('dir', () => fs.rm(dir, { recursive: true, force: true }));
    // The pod's root owns the files skiff writes for it (they are skiff's, not the image's).
    const rootUid = userns ? hostIdOf(userns.uids, 0) : 0;
    const rootGid = userns ? hostIdOf(userns.gids, 0) : 0;
    // runc reaches the infra rootfs and the pod's files from inside the pod's user namespace.
    if (userns) await passableByPodRoot(dir, rootGid);
    const hostname = config.hostname || (hostNetwork ? os.hostname() : md5ish(id));
    const rec: SandboxRecord = {
      id,
      name,
      state: 'SANDBOX_NOTREADY',
      createdAt: nowNs(),
      config,
      runtimeHandler: handler,
      dir,
      hostNetwork,
      hostIpc,
      hostPid,
      ips: [],
      ...(withInfra ? {} : { noInfra: true }),
      cgroupParent: config.linux?.cgroupParent || '/skiff',
      hostname,
      ...(userns ? { usernsMaps: userns } : {}),
    };
    // Namespaces, pinned to files so they outlive every process of the pod.
    const nsDir = path.join(dir, 'ns');
    await fs.mkdir(nsDir);
    const unshareArgs: string[] = [];
    const pins: Array<'net' | 'ipc' | 'uts'> = [...(hostNetwork ? [] : ['net' as const]), ...(hostIpc ? [] : ['ipc' as const]), ...(hostNetwork ? [] : ['uts' as const])];
    for (const kind of pins) {
      const f = path.join(nsDir, kind);
      unshareArgs.push(`--${kind}=${f}`);
      undo.add(`${kind} namespace`, () => unmount(this.d.runner, f));
      if (kind === 'net') rec.netns = f;
      else if (kind === 'ipc') rec.ipcns = f;
      else rec.utsns = f;
    }
    if (userns) {
      rec.userns = path.join(nsDir, 'user');
      undo.add('user namespace', () => unmount(this.d.runner, rec.userns!));
    }
    if (!hostIpc) rec.shm = path.join(dir, 'shm');
    // The pod's files (hosts, resolv.conf, hostname) are written while its namespaces are made;
    // a failure waits for them, so that the rollback removes a directory nobody writes in.
    const files = trace.time('files', async () => {
      await this.writeFiles(rec);
      if (userns) for (const f of ['hosts', 'resolv.conf', 'hostname']) await fs.chown(path.join(dir, f), rootUid, rootGid);
    });
    // The CNI cache entry (synced) needs only the network list and the pin's path: written while
    // the namespaces are made. Until the network step owns it, undoing it is dropping it.
    const podMeta = { name: config.metadata!.name, namespace: config.metadata!.namespace, uid: config.metadata!.uid };
    const begun = rec.netns ? this.d.cni.begin(id, rec.netns, podMeta, ports, networkList) : undefined;
    begun?.catch(() => undefined);
    if (begun) undo.add('network cache', () => begun.then(() => this.d.cni.discard(id), () => undefined));
    try {
      const made = await Promise.allSettled([
        ...[...pins, ...(userns ? ['user'] : [])].map((kind) => fs.writeFile(path.join(nsDir, kind), '')),
        ...(rec.shm ? [fs.mkdir(rec.shm)] : []),
      ]);
      for (const r of made) if (r.status === 'rejected') throw r.reason;
      // The pod's /dev/shm is a mount in the host's mount namespace (skiff's), made with no helper process.
      if (rec.shm) {
        undo.add('shm', () => unmount(this.d.runner, rec.shm!));
        libcMount('shm', rec.shm, 'tmpfs', MS_NOSUID | MS_NODEV | MS_NOEXEC, `mode=1777,size=65536k${userns ? `,uid=${rootUid},gid=${rootGid}` : ''}`);
      }
      if (userns) {
        // One helper names the pod (the UTS namespace's /proc/sys/kernel/hostname, a shell
        // builtin's write) and brings its loopback up.
        const setup = ['sh', '-c', 'printf %s "$1" > /proc/sys/kernel/hostname && ip link set lo up', 'sh', hostname];
        // The user namespace is made with the others, which it then owns: the pod's root
        // administers its own network (sysfs, mqueue) as with containerd 2 and CRI-O. They
        // exist once it returns, so the setup enters them instead of making them.
        await createPinnedUserns({ user: rec.userns!, net: rec.netns, ipc: rec.ipcns, uts: rec.utsns }, userns.uids, userns.gids);
        if (rec.netns) await runChecked(this.d.runner, 'nsenter', [...unshareArgs, ...setup]);
      } else {
        // Made, named and pinned by the daemon itself: no helper process.
        pinNamespaces({ net: rec.netns, ipc: rec.ipcns, uts: rec.utsns }, hostname);
      }
    } catch (err) {
      await Promise.allSettled([files, begun]);
      throw err;
    }
    trace.mark('namespaces');
    // The network and the infra process need only the namespaces: set them up side by side.
    const infra = withInfra ? trace.time('infra', () => this.startInfra(rec, runtime, undo)) : Promise.resolve(undefined);
    const network = trace.time('network', async () => {
      if (!rec.netns) return;
      // The cache is written (whole) before the first plugin runs: without it there is nothing to undo.
      undo.add('network', () =>
        this.d.cni.del(id).catch(async (err) => {
          // The pod never existed for the kubelet, so nothing retries this DEL: report it, and leave
          // no cache entry behind that would fail again at every start.
          this.d.log.error('CNI DEL while undoing a failed RunPodSandbox failed; its network may leak', { id, error: errorMessage(err) });
          await this.d.cni.discard(id);
        }),
      );
      const res = await this.d.cni.add(id, rec.netns, podMeta, ports, { list: networkList, begun, trace });
      rec.ips = res.ips;
    });
    const [infraResult, networkResult, filesResult] = await Promise.allSettled([infra, network, files]);
    if (filesResult.status === 'rejected') throw filesResult.reason;
    if (infraResult.status === 'rejected') throw infraResult.reason;
    if (networkResult.status === 'rejected') throw networkResult.reason;
    trace.mark('infra+network');
    rec.infraPid = infraResult.value;
    rec.state = 'SANDBOX_READY';
    this.save(rec);
    trace.mark('db');
    // The record holds the pod's host ids from here on.
    this.usernsClaims.delete(id);
    this.d.log.info('pod sandbox ready', { id, name, ips: rec.ips, infraPid: rec.infraPid, infra: withInfra });
    this.d.log.debug('RunPodSandbox phases (ms)', { id, ...trace.fields() });
    return id;
  }

  private async writeFiles(rec: SandboxRecord): Promise<void> {
    const dns = rec.config.dnsConfig;
    let resolv: string;
    if (dns && (dns.servers.length || dns.searches.length || dns.options.length)) {
      resolv = [
        ...(dns.searches.length ? [`search ${dns.searches.join(' ')}`] : []),
        ...dns.servers.map((s) => `nameserver ${s}`),
        ...(dns.options.length ? [`options ${dns.options.join(' ')}`] : []),
      ].join('\n') + '\n';
    } else {
      resolv = await fs.readFile('/etc/resolv.conf', 'utf8').catch(() => '');
    }
    await fs.writeFile(path.join(rec.dir, 'resolv.conf'), resolv, { mode: 0o644 });
    await fs.writeFile(path.join(rec.dir, 'hostname'), `${rec.hostname}\n`, { mode: 0o644 });
    const hosts = rec.hostNetwork
      ? await fs.readFile('/etc/hosts', 'utf8').catch(() => '127.0.0.1\tlocalhost\n')
      : '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n';
    await fs.writeFile(path.join(rec.dir, 'hosts'), hosts, { mode: 0o644 });
  }

  private async startInfra(rec: SandboxRecord, runtime: OciRuntime, undo: Rollback): Promise<number> {
    const bundle = path.join(rec.dir, 'infra');
    const rootfs = path.join(bundle, 'rootfs');
    await fs.mkdir(rootfs, { recursive: true });
    await fs.writeFile(path.join(rootfs, 'pause'), '');
    for (const d of ['proc', 'dev']) await fs.mkdir(path.join(rootfs, d));
    const ns: Array<{ type: string; path?: string }> = [{ type: 'mount' }];
    if (rec.userns) ns.push({ type: 'user', path: rec.userns });
    if (!rec.hostPid) ns.push({ type: 'pid' });
    if (rec.netns) ns.push({ type: 'network', path: rec.netns });
    if (rec.ipcns) ns.push({ type: 'ipc', path: rec.ipcns });
    if (rec.utsns) ns.push({ type: 'uts', path: rec.utsns });
    const spec = {
      ociVersion: '1.0.2-dev',
      process: {
        terminal: false,
        user: { uid: 0, gid: 0 },
        args: ['/pause', '-P'],
        env: ['PATH=/'],
        cwd: '/',
        capabilities: { bounding: [], effective: [], permitted: [], inheritable: [], ambient: [] },
        noNewPrivileges: true,
        oomScoreAdj: Math.max(-998, this.d.oomScoreAdjFloor),
      },
      root: { path: 'rootfs', readonly: true },
      hostname: undefined,
      mounts: [
        { destination: '/proc', type: 'proc', source: 'proc', options: ['nosuid', 'noexec', 'nodev'] },
        { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=64k'] },
        { destination: '/pause', type: 'bind', source: this.d.infraBinary, options: ['rbind', 'ro', 'nosuid', 'nodev'] },
      ],
      annotations: { 'io.kubernetes.cri.container-type': 'sandbox', 'io.kubernetes.cri.sandbox-id': rec.id },
      linux: {
        namespaces: ns,
        resources: { devices: [{ allow: false, access: 'rwm' }], cpu: { shares: 2 } },
        cgroupsPath: `${rec.cgroupParent.replace(/\/+$/, '')}/skiff-${rec.id}`,
        maskedPaths: DEFAULT_MASKED,
        readonlyPaths: DEFAULT_READONLY,
        ...(rec.usernsMaps ? ociIdMappings(rec.usernsMaps) : {}),
        ...(Object.keys(rec.config.linux?.sysctls ?? {}).length ? { sysctl: rec.config.linux!.sysctls } : {}),
      },
    };
    await fs.writeFile(path.join(bundle, 'config.json'), JSON.stringify(spec));
    undo.add('infra', () => runtime.delete(rec.id));
    return runtime.runDetached(rec.id, bundle, path.join(bundle, 'pid'));
  }

  /**
   * Stops every container, the infra process (if any) and the network; idempotent.
   * A failed CNI DEL fails the stop (the kubelet retries it) and keeps the
   * network namespace pinned, so the retry can still find what to undo.
   */
  async stop(id: string): Promise<void> {
    const s = this.mustGet(id);
    await this.locked(s.id, async () => {
      const rec = this.get(s.id);
      if (!rec) return;
      await this.d.containers.stopAll(rec.id);
      const runtime = this.d.runtimes.get(rec.runtimeHandler || this.d.defaultRuntime);
      const netnsPinned = rec.netns ? await isMountpoint(rec.netns) : false;
      const [, network] = await Promise.allSettled([
        hasInfra(rec) && runtime && !('unavailable' in runtime) ? runtime.delete(rec.id) : undefined,
        rec.netns ? this.d.cni.del(rec.id, { netns: netnsPinned ? rec.netns : undefined }) : undefined,
        rec.shm ? unmount(this.d.runner, rec.shm) : undefined,
      ]).then((results) => {
        const failed = results.find((r, i) => i !== 1 && r.status === 'rejected') as PromiseRejectedResult | undefined;
        if (failed) throw failed.reason;
        return results;
      });
      for (const f of [network.status === 'fulfilled' ? rec.netns : undefined, rec.ipcns, rec.utsns, rec.userns]) if (f) await unmount(this.d.runner, f);
      rec.state = 'SANDBOX_NOTREADY';
      rec.infraPid = undefined;
      this.save(rec);
      if (network.status === 'rejected') {
        this.d.log.error('CNI DEL failed; StopPodSandbox fails so that it is retried', { id: rec.id, error: errorMessage(network.reason) });
        throw wrap(network.reason, `failed to tear down the network of pod sandbox ${rec.id} (stop it again to retry)`, 'Internal');
      }
    });
  }

  async remove(id: string): Promise<void> {
    const s = this.find(id);
    if (!s) return;
    await this.stop(s.id);
    await this.locked(s.id, async () => {
      await this.d.containers.removeAll(s.id);
      // The record goes before the files: a crash in between leaves a dir with no record,
      // which the next start removes, never a record without its dir.
      this.records.delete(s.id);
      this.names.release(s.name);
      await fs.rm(s.dir, { recursive: true, force: true }).catch((err) => {
        if (!isErrno(err, 'ENOENT')) throw err;
      });
    });
  }
}

/** A short stable hostname from the id, when the pod names none. */
function md5ish(id: string): string {
  return id.slice(0, 12);
}

/** A pod's mappings in the OCI runtime spec's terms. */
export function ociIdMappings(m: PodUserns) {
  const oci = (l: PodUserns['uids']) => l.map((r) => ({ containerID: r.containerId, hostID: r.hostId, size: r.length }));
  return { uidMappings: oci(m.uids), gidMappings: oci(m.gids) };
}
