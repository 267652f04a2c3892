/**
 * Pod networking through CNI plugins, as the CNI spec defines the calls:
 * ADD runs a network list's plugins in order, each given the previous
 * result; DEL runs them in reverse. Each ADD's inputs and result are cached
 * on disk so that DEL works after a daemon restart; when that cache is lost
 * or unreadable, DEL runs from the network config alone (the spec lets DEL
 * go without a prevResult). The pod's loopback is brought up by skiff itself
 * when it creates the namespace.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { SkiffError, errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { findExecutable, type Runner } from '../sys/run.js';
import { ensureNetworkMasq, removeMasqRules, type IpFamily } from './masq.js';
import { ipv4Addresses, type Ipv4Address } from '../sys/netlink.js';
import type { PhaseTrace } from '../trace.js';

export interface PortMapping {
  hostPort: number;
  containerPort: number;
  protocol: string;
  hostIP?: string;
}

export interface CniOptions {
  confDir: string;
  binDirs: string[];
  /** Where skiff keeps its default network list and its result cache. */
  dataDir: string;
  podCidr: string;
  /** The bridge of skiff's own network (one per daemon: two daemons on a host must not share it). */
  bridge: string;
  runner: Runner;
  log: Logger;
  pluginTimeoutMs?: number;
  /** The node's IPv4 addresses, for the pod CIDR check (default: one rtnetlink dump, in this thread's network namespace). */
  addresses?: () => Ipv4Address[] | Promise<Ipv4Address[]>;
}

export interface NetworkList {
  cniVersion: string;
  name: string;
  plugins: Array<Record<string, unknown> & { type: string }>;
  file: string;
}

interface CacheEntry {
  list: NetworkList;
  netns: string;
  args: string;
  ifname: string;
  portMappings: PortMapping[];
  result?: unknown;
}

/** Linux caps interface names at 15 bytes. */
const IFNAMSIZ = 15;

/** The default bridge of a daemon: named from its root, so two daemons on one host get two bridges. */
export function defaultBridgeName(root: string): string {
  return `skiff${createHash('sha256').update(path.resolve(root)).digest('hex').slice(0, 8)}`;
}

export function checkBridgeName(name: string): string {
  if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.length > IFNAMSIZ || name === '.' || name === '..') {
    throw new SkiffError('InvalidArgument', `bridge name "${name}" is not a valid interface name (letters, digits, "_.-", at most ${IFNAMSIZ})`);
  }
  return name;
}

export interface AddResult {
  ips: string[];
  result: unknown;
}


/** How long skiff trusts its network's masquerade rules before it checks them again (in the background). */
const MASQ_RECHECK_MS = 60_000;

export class CniNetwork {
  private podCidr: string;
  /** The pod CIDR whose masquerade rules were last written, and when. */
  private masqWritten: { cidr: string; at: number } | undefined;
  private masqWriting: { cidr: string; done: Promise<void> } | undefined;
  /** The last write started: each waits for the one before, whatever its CIDR. */
  private masqQueue: Promise<void> = Promise.resolve();

  constructor(private readonly o: CniOptions) {
    this.podCidr = o.podCidr;
  }

  get cidr(): string {
    return this.podCidr;
  }

  /**
   * Takes a new pod CIDR for skiff's own network. Its bridge carries the old
   * gateway address, so the change is made only while no pod is attached:
   * the bridge is then removed and the next ADD creates it afresh.
   */
  async setPodCidr(cidr: string): Promise<void> {
    if (cidr === this.podCidr) return;
    if (!/^\d+\.\d+\.\d+\.\d+\/\d+$/.test(cidr)) throw new SkiffError('InvalidArgument', `pod CIDR "${cidr}" is not an IPv4 CIDR`);
    const attached = await this.cachedIds();
    if (attached.length) {
      throw new SkiffError('FailedPrecondition', `cannot change the pod CIDR from ${this.podCidr} to ${cidr} while ${attached.length} pod(s) use the network`);
    }
    await this.o.runner('ip', ['link', 'del', this.o.bridge]);
    this.podCidr = cidr;
  }

  /**
   * skiff's own network. portmap is in it only for pods that map host ports:
   * for the others it would do nothing, and DEL runs the list cached at ADD.
   * The bridge plugin does not masquerade: its ipMasq writes a chain and a
   * jump per pod (nine iptables runs at ADD, as many at DEL, and rules left
   * behind when a pod removes its eth0). skiff masquerades the whole pod CIDR
   * with one rule set instead (ensureMasq), as podman's networks do.
   */
  private defaultList(withPortmap = true): NetworkList {
    return {
      cniVersion: '1.0.0',
      name: 'skiff',
      file: path.join(this.o.dataDir, 'net.d', '10-skiff.conflist'),
      plugins: [
        {
          type: 'bridge',
          bridge: this.o.bridge,
          isGateway: true,
          ipMasq: false,
          hairpinMode: true,
          ipam: { type: 'host-local', ranges: [[{ subnet: this.podCidr }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: path.join(this.o.dataDir, 'ipam') },
        },
        ...(withPortmap ? [{ type: 'portmap', capabilities: { portMappings: true } }] : []),
      ],
    };
  }

  /**
   * The network list in use: the first valid one in the config dir (by
   * name), else skiff's default. Configs that are all invalid are an error,
   * not a reason to fall back to a network the operator did not ask for.
   */
  async networkList(): Promise<NetworkList> {
    let names: string[] = [];
    try {
      names = (await fs.readdir(this.o.confDir)).filter((n) => /\.(conflist|conf|json)$/.test(n)).sort();
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
    const problems: string[] = [];
    for (const n of names) {
      const file = path.join(this.o.confDir, n);
      try {
        return parseNetworkConfig(await fs.readFile(file, 'utf8'), file);
      } catch (err) {
        problems.push(`${file}: ${errorMessage(err)}`);
        this.o.log.warn('skipping invalid CNI config', { file, error: errorMessage(err) });
      }
    }
    if (problems.length) throw new SkiffError('FailedPrecondition', `no valid CNI network config in ${this.o.confDir} (${problems.join('; ')})`);
    const list = this.defaultList();
    await fs.mkdir(path.dirname(list.file), { recursive: true });
    const { file: _f, ...json } = list;
    const text = JSON.stringify(json, null, 2);
    // Status asks for this every few seconds: write only when it changed (the bridge, the CIDR).
    if ((await fs.readFile(list.file, 'utf8').catch(() => '')) !== text) await writeAtomic(list.file, text);
    return list;
  }

  private findPlugin(type: string): Promise<string | undefined> {
    return findExecutable(type, this.o.binDirs);
  }

  /** Ready when a network list exists and every plugin it names is installed. */
  async status(): Promise<{ ready: boolean; reason?: string; message?: string }> {
    try {
      const list = await this.networkList();
      for (const p of list.plugins) {
        if (!(await this.findPlugin(p.type))) {
          return { ready: false, reason: 'NetworkPluginNotReady', message: `CNI plugin "${p.type}" (from ${list.file}) is not in ${this.o.binDirs.join(', ')}` };
        }
      }
      const clash = this.isDefault(list) ? await this.podCidrClash() : undefined;
      if (clash) return { ready: false, reason: 'NetworkPluginNotReady', message: clash };
      return { ready: true };
    } catch (err) {
      return { ready: false, reason: 'NetworkPluginNotReady', message: `cannot load the CNI configuration: ${errorMessage(err)}` };
    }
  }

  private isDefault(list: NetworkList): boolean {
    return list.name === 'skiff' && list.file === this.defaultList().file;
  }

  /**
   * Another interface with an address inside the pod CIDR (typically another
   * daemon's bridge on the same default CIDR) would take the routes of this
   * daemon's pods: their replies would go out the wrong bridge.
   */
  private async podCidrClash(): Promise<string | undefined> {
    let addrs: Ipv4Address[];
    try {
      addrs = await (this.o.addresses ?? ipv4Addresses)();
    } catch (err) {
      this.o.log.debug('cannot list the node\'s addresses for the pod CIDR check', { error: errorMessage(err) });
      return undefined;
    }
    for (const a of addrs) {
      if (a.ifname === this.o.bridge) continue;
      if (insideCidr(a.local, a.prefixlen, this.podCidr)) {
        return `pod CIDR ${this.podCidr} is already used by ${a.local}/${a.prefixlen} on ${a.ifname} (another skiff daemon's bridge?); give this daemon its own --pod-cidr`;
      }
    }
    return undefined;
  }

  private async exec(command: 'ADD' | 'DEL', list: NetworkList, plugin: NetworkList['plugins'][0], entry: CacheEntry, id: string, prevResult: unknown): Promise<unknown> {
    const bin = await this.findPlugin(plugin.type);
    if (!bin) throw new SkiffError('FailedPrecondition', `CNI plugin "${plugin.type}" not found in ${this.o.binDirs.join(', ')}`);
    const conf: Record<string, unknown> = { ...plugin, cniVersion: list.cniVersion, name: list.name };
    const caps = (plugin.capabilities ?? {}) as Record<string, boolean>;
    delete conf.capabilities;
    if (caps.portMappings && entry.portMappings.length) conf.runtimeConfig = { portMappings: entry.portMappings };
    if (prevResult !== undefined) conf.prevResult = prevResult;
    const res = await this.o.runner(bin, [], {
      input: JSON.stringify(conf),
      timeoutMs: this.o.pluginTimeoutMs ?? 30_000,
      env: {
        PATH: process.env.PATH,
        CNI_COMMAND: command,
        CNI_CONTAINERID: id,
        CNI_NETNS: entry.netns,
        CNI_IFNAME: entry.ifname,
        CNI_ARGS: entry.args,
        CNI_PATH: this.o.binDirs.join(':'),
      },
    });
    if (res.code !== 0 || res.timedOut) {
      let msg = (res.stdout || res.stderr).trim();
      try {
        const j = JSON.parse(res.stdout) as { msg?: string; details?: string };
        msg = [j.msg, j.details].filter(Boolean).join(': ');
      } catch {
        // plain text
      }
      throw new SkiffError('Internal', `CNI ${command} with plugin ${plugin.type} failed${res.timedOut ? ' (timed out)' : ''}: ${msg || `exit ${res.code}`}`);
    }
    if (command === 'DEL' || !res.stdout.trim()) return prevResult;
    return JSON.parse(res.stdout);
  }

  private cacheFile(id: string): string {
    return path.join(this.o.dataDir, 'cache', `${id}.json`);
  }

  /**
   * The network list an ADD for a pod with these host ports will run, once
   * checked (skiff's own network must not clash with another bridge). It
   * needs no namespace, so a caller may start it first and pass it to add.
   */
  async prepare(portMappings: PortMapping[]): Promise<NetworkList> {
    const list = await this.networkList();
    if (!this.isDefault(list)) return list;
    const clash = await this.podCidrClash();
    if (clash) throw new SkiffError('FailedPrecondition', clash);
    return portMappings.length ? list : { ...this.defaultList(false), file: list.file };
  }

  /**
   * Writes (synced) the cache entry of the ADD that `add` will run: it needs
   * only the network list and the path of the namespace's pin, so a caller
   * may write it while the namespace is being made and pass it to add. Until
   * add runs, undoing it is `discard` (no plugin has run).
   */
  async begin(
    id: string,
    netns: string,
    meta: { name: string; namespace: string; uid: string },
    portMappings: PortMapping[],
    listPromise?: Promise<NetworkList>,
  ): Promise<CacheEntry> {
    const list = await (listPromise ?? this.prepare(portMappings));
    const args = `IgnoreUnknown=1;K8S_POD_NAMESPACE=${meta.namespace};K8S_POD_NAME=${meta.name};K8S_POD_INFRA_CONTAINER_ID=${id};K8S_POD_UID=${meta.uid}`;
    const entry: CacheEntry = { list, netns, args, ifname: 'eth0', portMappings };
    // Written before the first plugin runs: a DEL after a crash mid-ADD still knows what to undo.
    await fs.mkdir(path.dirname(this.cacheFile(id)), { recursive: true });
    await writeAtomic(this.cacheFile(id), JSON.stringify(entry));
    return entry;
  }

  async add(
    id: string,
    netns: string,
    meta: { name: string; namespace: string; uid: string },
    portMappings: PortMapping[],
    opts: { list?: Promise<NetworkList>; begun?: Promise<CacheEntry>; trace?: PhaseTrace } = {},
  ): Promise<AddResult> {
    const timed = <T>(what: string, step: () => Promise<T>) => (opts.trace ? opts.trace.time(what, step) : step());
    const entry = await timed('cni prepare+cache', () => opts.begun ?? this.begin(id, netns, meta, portMappings, opts.list));
    const list = entry.list;
    let result: unknown;
    // skiff's own network is masqueraded as a whole, written while the plugins run.
    const masq = this.isDefault(list) ? timed('cni masquerade', () => this.ensureMasq()) : undefined;
    masq?.catch(() => undefined);
    for (const p of list.plugins) {
      result = await timed(`cni ${p.type}`, () => this.exec('ADD', list, p, entry, id, result));
    }
    await masq;
    entry.result = result;
    // Not synced: losing it to a power cut leaves the entry written before the plugins ran (or an
    // unreadable one), from which DEL still runs; only a process crash can interrupt, and it keeps the page cache.
    await timed('cni cache', () => writeAtomic(this.cacheFile(id), JSON.stringify(entry), { sync: false }));
    const ips = ((result as { ips?: Array<{ address?: string }> })?.ips ?? []).map((i) => String(i.address ?? '').split('/')[0]!).filter(Boolean);
    return { ips, result };
  }

  /**
   * skiff's network's masquerade rules (masq.ts): written before the first
   * pod of a pod CIDR gets its network, which fails if they cannot be. Then
   * they are trusted for MASQ_RECHECK_MS, after which a pod's ADD rewrites
   * them in the background (someone may have flushed the nat table).
   */
  private ensureMasq(): Promise<void> {
    const cidr = this.podCidr;
    const known = this.masqWritten?.cidr === cidr;
    if (known && Date.now() - this.masqWritten!.at < MASQ_RECHECK_MS) return Promise.resolve();
    if (this.masqWriting?.cidr !== cidr) {
      // One write at a time: each reads the table, then rewrites it. Two at once (a background rewrite for the
      // old pod CIDR, waiting on the xtables lock, and the first write for a new one) could have the older apply
      // last, from what it read before the newer wrote: the new CIDR's jump into a chain that lets only the
      // old CIDR through unmasqueraded, and the old CIDR recorded as written.
      const done = this.masqQueue
        .then(() => ensureNetworkMasq(this.o.runner, this.o.bridge, cidr))
        .then(() => {
          this.masqWritten = { cidr, at: Date.now() };
        })
        .finally(() => {
          if (this.masqWriting?.done === done) this.masqWriting = undefined;
        });
      this.masqWriting = { cidr, done };
      this.masqQueue = done.catch(() => undefined);
    }
    const done = this.masqWriting!.done;
    if (!known) return done;
    done.catch((err) => this.o.log.error('could not rewrite the pod network\'s masquerade rules; pods may lose their way out', { error: errorMessage(err) }));
    return Promise.resolve();
  }

  /** Drops the temporary files of cache writes a crash cut short (call before any ADD runs). */
  async removeTempFiles(): Promise<void> {
    const dir = path.join(this.o.dataDir, 'cache');
    for (const n of await fs.readdir(dir).catch(() => [] as string[])) if (n.endsWith('.tmp')) await fs.rm(path.join(dir, n), { force: true });
  }

  /** The pods with a cached ADD (whose network may still exist). */
  async cachedIds(): Promise<string[]> {
    const names = await fs.readdir(path.join(this.o.dataDir, 'cache')).catch(() => [] as string[]);
    return names.filter((n) => n.endsWith('.json')).map((n) => n.slice(0, -5));
  }

  /** Forgets a pod's cached ADD without running DEL (after a DEL that cannot succeed was reported). */
  async discard(id: string): Promise<void> {
    await fs.rm(this.cacheFile(id), { force: true });
  }

  private async readCache(id: string): Promise<CacheEntry | 'missing' | 'unreadable'> {
    let text: string;
    try {
      text = await fs.readFile(this.cacheFile(id), 'utf8');
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return 'missing';
      throw err;
    }
    try {
      const e = JSON.parse(text) as CacheEntry;
      if (e && typeof e === 'object' && e.list && Array.isArray(e.list.plugins) && typeof e.netns === 'string') return e;
    } catch {
      // empty or cut short: treated below like a missing cache
    }
    return 'unreadable';
  }

  /**
   * After a DEL that succeeded: the masquerade rules the plugins tagged with
   * this pod's id, which their DEL leaves when it finds no interface (a pod
   * with CAP_NET_ADMIN renamed or deleted its eth0) or no namespace. Only for
   * lists with a plugin that masquerades; one `iptables -S POSTROUTING` when
   * nothing is left. A failure is logged, not returned: the plugins' own
   * teardown is done, a stale rule costs space but routes nothing of another
   * pod's, and a StopPodSandbox that failed for it would fail on every retry
   * where iptables is broken, keeping the pod forever.
   */
  private async removeLeftMasq(id: string, entry: CacheEntry, always = false): Promise<void> {
    if (!always && !entry.list.plugins.some((p) => p.ipMasq === true)) return;
    try {
      const removed = await removeMasqRules(this.o.runner, entry.list.name, id, masqFamilies(entry));
      if (removed.length) this.o.log.warn('removed masquerade rules the CNI DEL left behind (the pod renamed or deleted its interface?)', { id, network: entry.list.name, rules: removed.length });
    } catch (err) {
      this.o.log.error('could not check for masquerade rules the CNI DEL left behind; they may leak', { id, network: entry.list.name, error: errorMessage(err) });
    }
  }

  /**
   * Undoes an ADD; retried, bounded. With the cached ADD it runs the cached
   * list with the cached result. Without it (lost, or empty after a crash),
   * DEL runs from the current network config with no prevResult, given the
   * pod's network namespace when it still exists (`netns`); with neither a
   * cache nor a namespace there is nothing to undo.
   */
  async del(id: string, opts: { netns?: string; attempts?: number } = {}): Promise<void> {
    const attempts = opts.attempts ?? 3;
    const cached = await this.readCache(id);
    let entry: CacheEntry;
    // A pod of skiff's network whose cache is lost may come from a skiff that masqueraded per pod.
    let legacyMasq = false;
    if (typeof cached === 'object') {
      // A caller that says where the namespace is, and finds none (its pin is gone), gets a DEL
      // without one, which the spec allows: the plugins release what lives outside it (addresses,
      // host rules). The cached path would name a file that is no longer a namespace.
      entry = 'netns' in opts && !opts.netns ? { ...cached, netns: '' } : cached;
    } else {
      if (cached === 'missing' && !opts.netns) return;
      this.o.log.warn('no usable cached CNI result; running DEL from the network config', { id, cache: cached });
      entry = {
        list: await this.networkList(),
        netns: opts.netns ?? '',
        args: `IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID=${id}`,
        ifname: 'eth0',
        portMappings: [],
      };
      legacyMasq = this.isDefault(entry.list);
    }
    let lastErr: unknown;
    for (let i = 0; i < attempts; i++) {
      try {
        for (const p of [...entry.list.plugins].reverse()) await this.exec('DEL', entry.list, p, entry, id, entry.result);
        await this.removeLeftMasq(id, entry, legacyMasq);
        await fs.rm(this.cacheFile(id), { force: true });
        return;
      } catch (err) {
        lastErr = err;
        // Not unref'd: at start-up this wait may be all that keeps the process alive.
        await new Promise((r) => setTimeout(r, 200 * (i + 1)));
      }
    }
    throw lastErr;
  }
}

/** Families a pod on this list may have masquerade rules for: IPv4, and IPv6 when it had or could get such an address. */
function masqFamilies(entry: CacheEntry): IpFamily[] {
  const ips = (entry.result as { ips?: Array<{ address?: unknown }> } | undefined)?.ips;
  const v6 = Array.isArray(ips) ? ips.some((i) => String(i?.address ?? '').includes(':')) : /"subnet":"[0-9A-Fa-f]*:[^"]*"/.test(JSON.stringify(entry.list.plugins));
  return v6 ? [4, 6] : [4];
}

function ipv4ToInt(a: string): number {
  return a.split('.').reduce((n, o) => n * 256 + Number(o), 0);
}

/** Whether the network `addr/prefix` lies inside `cidr` (same or narrower, and within it). */
export function insideCidr(addr: string, prefix: number, cidr: string): boolean {
  const [net, bitsText] = cidr.split('/');
  const bits = Number(bitsText);
  if (!net || !Number.isInteger(bits) || prefix < bits) return false;
  const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
  return ((ipv4ToInt(addr) & mask) >>> 0) === ((ipv4ToInt(net) & mask) >>> 0);
}

/** One network config file (a .conflist, or a single plugin's .conf), checked enough to run. */
export function parseNetworkConfig(text: string, file: string): NetworkList {
  let j: Record<string, unknown>;
  try {
    j = JSON.parse(text) as Record<string, unknown>;
  } catch (err) {
    throw new SkiffError('InvalidArgument', `not valid JSON: ${errorMessage(err)}`);
  }
  if (!j || typeof j !== 'object' || Array.isArray(j)) throw new SkiffError('InvalidArgument', 'not a JSON object');
  if (typeof j.name !== 'string' || !j.name) throw new SkiffError('InvalidArgument', 'has no "name"');
  const cniVersion = String(j.cniVersion ?? '0.4.0');
  let plugins: unknown[];
  if (Array.isArray(j.plugins)) {
    plugins = j.plugins;
  } else if (typeof j.type === 'string') {
    const { cniVersion: _v, name: _n, ...plugin } = j;
    plugins = [plugin];
  } else {
    throw new SkiffError('InvalidArgument', 'has neither "plugins" nor "type"');
  }
  if (!plugins.length) throw new SkiffError('InvalidArgument', '"plugins" is empty');
  plugins.forEach((p, i) => {
    const t = (p as { type?: unknown } | null)?.type;
    if (typeof t !== 'string' || !/^[A-Za-z0-9_.-]+$/.test(t)) throw new SkiffError('InvalidArgument', `plugin ${i} has no valid "type"`);
  });
  return { cniVersion, name: j.name, plugins: plugins as NetworkList['plugins'], file };
}

/** Writes a file whole or not at all: a crash never leaves it empty or cut short. */
async function writeAtomic(file: string, data: string, opts: { sync?: boolean } = {}): Promise<void> {
  const tmp = `${file}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    const fh = await fs.open(tmp, 'w', 0o600);
    try {
      await fh.writeFile(data);
      if (opts.sync !== false) await fh.sync();
    } finally {
      await fh.close();
    }
    await fs.rename(tmp, file);
  } catch (err) {
    await fs.rm(tmp, { force: true });
    throw err;
  }
}
