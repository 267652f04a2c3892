/**
 * Pod networking through CNI plugins, as the CNI spec defines the calls:
 * ADD runs a network list's plugins in order, each given the previous
 * result; DEL runs them in reverse. Each ADD's inputs and result are cached
 * on disk so that DEL works after a daemon restart. The pod's loopback is
 * brought up by skiff itself when it creates the namespace.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { SkiffError, errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { findExecutable, type Runner } from '../sys/run.js';

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
  runner: Runner;
  log: Logger;
  pluginTimeoutMs?: number;
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

export interface AddResult {
  ips: string[];
  result: unknown;
}


export class CniNetwork {
  private podCidr: string;

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
    const attached = await fs.readdir(path.join(this.o.dataDir, 'cache')).catch(() => [] as string[]);
    if (attached.length) {
      throw new SkiffError('FailedPrecondition', `cannot change the pod CIDR from ${this.podCidr} to ${cidr} while ${attached.length} pod(s) use the network`);
    }
    await this.o.runner('ip', ['link', 'del', 'skiff0']);
    this.podCidr = cidr;
  }

  /**
   * skiff's own network. portmap is in it only for pods that map host ports:
   * for the others it would do nothing, and DEL runs the list cached at ADD.
   */
  private defaultList(withPortmap = true): NetworkList {
    return {
      cniVersion: '1.0.0',
      name: 'skiff',
      file: path.join(this.o.dataDir, 'net.d', '10-skiff.conflist'),
      plugins: [
        {
          type: 'bridge',
          bridge: 'skiff0',
          isGateway: true,
          ipMasq: true,
          hairpinMode: true,
          ipam: { type: 'host-local', ranges: [[{ subnet: this.podCidr }]], routes: [{ dst: '0.0.0.0/0' }], dataDir: path.join(this.o.dataDir, 'ipam') },
        },
        ...(withPortmap ? [{ type: 'portmap', capabilities: { portMappings: true } }] : []),
      ],
    };
  }

  /** The network list in use: the first in the config dir (by name), else skiff's default. */
  async networkList(): Promise<NetworkList> {
    let names: string[] = [];
    try {
      names = (await fs.readdir(this.o.confDir)).filter((n) => /\.(conflist|conf|json)$/.test(n)).sort();
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
    for (const n of names) {
      const file = path.join(this.o.confDir, n);
      try {
        const j = JSON.parse(await fs.readFile(file, 'utf8')) as Record<string, unknown>;
        if (Array.isArray(j.plugins)) return { cniVersion: String(j.cniVersion ?? '0.4.0'), name: String(j.name), plugins: j.plugins as NetworkList['plugins'], file };
        if (typeof j.type === 'string') {
          const { cniVersion, name, ...plugin } = j;
          return { cniVersion: String(cniVersion ?? '0.4.0'), name: String(name), plugins: [plugin as NetworkList['plugins'][0]], file };
        }
      } catch (err) {
        this.o.log.warn('skipping unreadable CNI config', { file, error: errorMessage(err) });
      }
    }
    const list = this.defaultList();
    await fs.mkdir(path.dirname(list.file), { recursive: true });
    const { file: _f, ...json } = list;
    await fs.writeFile(list.file, JSON.stringify(json, null, 2));
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
      return { ready: true };
    } catch (err) {
      return { ready: false, reason: 'NetworkPluginNotReady', message: `cannot load the CNI configuration: ${errorMessage(err)}` };
    }
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

  async add(id: string, netns: string, meta: { name: string; namespace: string; uid: string }, portMappings: PortMapping[]): Promise<AddResult> {
    let list = await this.networkList();
    if (list.name === 'skiff' && list.file === this.defaultList().file && !portMappings.length) list = { ...this.defaultList(false), file: list.file };
    const args = `IgnoreUnknown=1;K8S_POD_NAMESPACE=${meta.namespace};K8S_POD_NAME=${meta.name};K8S_POD_INFRA_CONTAINER_ID=${id};K8S_POD_UID=${meta.uid}`;
    const entry: CacheEntry = { list, netns, args, ifname: 'eth0', portMappings };
    // Written before the first plugin runs: a DEL after a crash mid-ADD still knows what to undo.
    await fs.mkdir(path.dirname(this.cacheFile(id)), { recursive: true });
    await fs.writeFile(this.cacheFile(id), JSON.stringify(entry));
    let result: unknown;
    for (const p of list.plugins) result = await this.exec('ADD', list, p, entry, id, result);
    entry.result = result;
    await fs.writeFile(this.cacheFile(id), JSON.stringify(entry));
    const ips = ((result as { ips?: Array<{ address?: string }> })?.ips ?? []).map((i) => String(i.address ?? '').split('/')[0]!).filter(Boolean);
    return { ips, result };
  }

  /** The pods with a cached ADD (whose network may still exist). */
  async cachedIds(): Promise<string[]> {
    const names = await fs.readdir(path.join(this.o.dataDir, 'cache')).catch(() => [] as string[]);
    return names.filter((n) => n.endsWith('.json')).map((n) => n.slice(0, -5));
  }

  /** Undoes an ADD; retried, bounded, and a no-op when there is nothing cached. */
  async del(id: string, attempts = 3): Promise<void> {
    let entry: CacheEntry;
    try {
      entry = JSON.parse(await fs.readFile(this.cacheFile(id), 'utf8')) as CacheEntry;
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return;
      throw err;
    }
    let lastErr: unknown;
    for (let i = 0; i < attempts; i++) {
      try {
        for (const p of [...entry.list.plugins].reverse()) await this.exec('DEL', entry.list, p, entry, id, entry.result);
        await fs.rm(this.cacheFile(id), { force: true });
        return;
      } catch (err) {
        lastErr = err;
        await new Promise((r) => setTimeout(r, 200 * (i + 1)).unref());
      }
    }
    throw lastErr;
  }
}
