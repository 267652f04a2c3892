/**
 * The service proxier: Services + ready pods → one iptables-restore per
 * sync, as kube-proxy's iptables mode does. Changes are only noted when they
 * arrive; a bounded-frequency runner syncs at most every minSync, fully at
 * least every syncPeriod, and after any failure the next sync is full.
 * A partial sync rewrites the top-level chains whole and only the chains of
 * service ports whose rules changed.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { computeEndpoints, endpointsFromSlices, PodIndex, selectorMatches, type Endpoint, type SliceLike } from './endpoints.js';
import { Iptables, jumpInsertLine, type CommandRunner } from './iptables.js';
import { Nft } from './nft.js';
import { affinityChanged, assembleNft, renderNftPort, type NftPortRules } from './nft-rules.js';
import { assemble, assembleFullSplit, declarationOrder, FILTER_CHAINS, NAT_CHAINS, renderPort, SERVICE_CHAIN_RE, type PortRules } from './rules.js';
import { Allocator, parseCidr, type ServiceInfo, type ServiceProblem } from './service.js';
import type { EndpointSliceSource, PodSource, ServiceSource } from './sources.js';
import type { HealthCheckTarget, ServiceHealthServer } from './health-check.js';

export interface ProxyMetrics {
  observeSync(seconds: number, full: boolean, rules: number): void;
  restoreFailed(): void;
}

/** kube-proxy's sync metrics (same names, so its dashboards read them) on the registry given. */
export function registerProxyMetrics(registry: Registry): ProxyMetrics {
  const duration = new Histogram({
    name: 'kubeproxy_sync_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds',
    labelNames: ['sync'],
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [registry],
  });
  const last = new Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', registers: [registry] });
  const written = new Gauge({ name: 'kubeproxy_sync_proxy_rules_iptables_last', help: 'Number of iptables rules written by the last sync', registers: [registry] });
  const total = new Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_written_total', help: 'iptables rules written by all syncs', registers: [registry] });
  const failures = new Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', help: 'Failed iptables-restore runs', registers: [registry] });
  return {
    observeSync(seconds, full, rules) {
      duration.observe({ sync: full ? 'full' : 'partial' }, seconds);
      last.setToCurrentTime();
      written.set(rules);
      total.inc(rules);
    },
    restoreFailed() {
      failures.inc();
    },
  };
}

export type ProxyMode = 'iptables' | 'nftables';
export const PROXY_MODES: readonly ProxyMode[] = ['iptables', 'nftables'];

export interface ProxierOptions {
  /** iptables (the default) or nftables (kube-proxy's nftables layout, one `nft -f` per sync). */
  mode?: ProxyMode;
  services: ServiceSource;
  /** The pods DNS answers from; and the endpoints' source unless `slices` is given. */
  pods: PodSource;
  /** Endpoints from EndpointSlices (as kube-proxy): `nodeName` tells this node's endpoints from the others'. */
  slices?: { source: EndpointSliceSource; nodeName: string };
  /** Default 10.96.0.0/12. */
  serviceCidr?: string;
  /** Pod network: traffic from outside it to a cluster IP is masqueraded. */
  podCidr: string;
  minSyncMs?: number;
  syncPeriodMs?: number;
  /** Full syncs of more than `splitAbove` service ports (default 2000) are applied in several restores of `portsPerRestore` ports (default 500; see assembleFullSplit). */
  portsPerRestore?: number;
  splitAbove?: number;
  run: CommandRunner;
  /**
   * The network namespace `run`'s commands reach: a path (as nsenter's
   * --net=), or null for this process's own. nftables mode then writes
   * partial syncs over netlink there (nft spends ~100 ms reading a large
   * table before each command); undefined keeps every write in nft.
   */
  netns?: string | null;
  log: Logger;
  metrics?: ProxyMetrics;
  now?: () => number;
  /** Serves LoadBalancer Services' health-check node ports (externalTrafficPolicy Local), kept in step with each sync. */
  healthChecks?: ServiceHealthServer;
}

export interface SyncResult {
  full: boolean;
  ms: number;
  rulesWritten: number;
  /** Bytes of iptables-restore input. */
  bytes: number;
  /** iptables-restore runs: one, except for full syncs of many service ports. */
  restores?: number;
  /** nftables mode: how the sync was written (partial syncs go over netlink when the namespace is known). */
  via?: 'nft' | 'netlink';
}

/** What DNS needs: Services as last resolved, and the pods (and the slices, when endpoints come from them). */
export interface ServiceView {
  services(): ServiceInfo[];
  pods(): Pod[];
  slicesOf?(namespace: string, name: string): SliceLike[];
}

interface Applied {
  /** The Service object this came from (parsed Services are cached by content, so identity means unchanged). */
  service: ServiceInfo;
  fingerprint: string;
  /** iptables mode's rendering. */
  rules?: PortRules;
  /** nftables mode's rendering. */
  nft?: NftPortRules;
  port: ServiceInfo['ports'][number];
  endpoints: Endpoint[];
}

export class Proxier implements ServiceView {
  private readonly allocator: Allocator;
  private readonly ipt: Iptables;
  private readonly nft: Nft;
  readonly mode: ProxyMode;
  private readonly minSyncMs: number;
  private readonly syncPeriodMs: number;
  private readonly portsPerRestore: number;
  private readonly splitAbove: number;
  private readonly now: () => number;
  /** What the last successful sync programmed, per service port key. */
  private applied = new Map<string, Applied>();
  /** Service chains present in the kernel as far as we know. */
  private chainsInKernel = new Set<string>();
  private needFull = true;
  private firstSync = true;
  private lastServices: ServiceInfo[] = [];
  private lastPods: Pod[] = [];
  private lastProblems = new Map<string, string>();
  private serial: Promise<unknown> = Promise.resolve();
  private timer?: NodeJS.Timeout;
  private periodic?: NodeJS.Timeout;
  private running = false;
  private pending = false;
  private lastStart = -Infinity;
  private lastFullEnd = -Infinity;
  private lastFullMs = 0;
  private stopped = true;
  private unsubscribe: Array<() => void> = [];
  private readonly unsubscribeTracking: Array<() => void>;
  private servicesDirty = true;
  private problemsNow: ServiceProblem[] = [];
  /** The pod objects the last sync saw: pod sources replace a pod's object when it changes. */
  private podsSeen = new Set<Pod>();
  /** Services whose EndpointSlices changed since the last sync; undefined: any may have. */
  private slicesTouched: Set<string> | undefined = new Set();
  /** Resolvers of waitForSync() calls. */
  private waiters: Array<() => void> = [];

  constructor(private readonly opts: ProxierOptions) {
    this.allocator = new Allocator(opts.serviceCidr ?? '10.96.0.0/12');
    const slices = opts.slices?.source;
    if (slices) this.slicesOf = (namespace, name) => slices.slicesOf(namespace, name);
    if (!parseCidr(opts.podCidr)) throw new Error(`pod CIDR "${opts.podCidr}" is not an IPv4 CIDR`);
    this.ipt = new Iptables(opts.run);
    this.nft = new Nft(opts.run, opts.netns);
    this.mode = opts.mode ?? 'iptables';
    this.minSyncMs = opts.minSyncMs ?? 1000;
    this.syncPeriodMs = opts.syncPeriodMs ?? 30_000;
    this.portsPerRestore = opts.portsPerRestore ?? 500;
    this.splitAbove = opts.splitAbove ?? Math.max(2000, this.portsPerRestore);
    this.now = opts.now ?? (() => performance.now());
    // Change tracking (kube-proxy's change trackers): what changed decides how much of a sync is recomputed.
    this.unsubscribeTracking = [opts.services.onChange(() => (this.servicesDirty = true))];
  }

  /** Starts watching the sources and syncing (the first sync runs at once). */
  start(): void {
    this.stopped = false;
    const kick = () => this.kick();
    this.unsubscribe.push(this.opts.services.onChange(kick), this.opts.pods.onChange(kick));
    const slices = this.opts.slices?.source;
    if (slices) {
      this.unsubscribe.push(
        slices.onChange((services) => {
          if (!services) this.slicesTouched = undefined;
          else for (const s of services) this.slicesTouched?.add(s);
          kick();
        }),
      );
    }
    this.periodic = setInterval(() => {
      // A full sync at 10,000 Services takes most of a minute (iptables-nft, see rules.ts): never
      // spend more than a fifth of the time in periodic full syncs.
      if (this.now() - this.lastFullEnd < 4 * this.lastFullMs) return;
      this.needFull = true;
      this.kick();
    }, this.syncPeriodMs);
    this.periodic.unref();
    this.kick();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    clearInterval(this.periodic);
    for (const u of this.unsubscribe) u();
    for (const u of this.unsubscribeTracking) u();
    this.unsubscribe = [];
    await this.serial.catch(() => {});
    this.nft.close();
  }

  services(): ServiceInfo[] {
    return this.lastServices;
  }

  pods(): Pod[] {
    return this.lastPods;
  }

  /** Present when endpoints come from EndpointSlices: DNS reads headless names there too. */
  readonly slicesOf?: (namespace: string, name: string) => SliceLike[];

  /** What the last successful sync programmed, per service port key (for debugging and tests). */
  programmed(): Map<string, PortRules> {
    return new Map([...this.applied].filter(([, a]) => a.rules).map(([k, a]) => [k, a.rules!]));
  }

  /** nftables mode's counterpart of programmed(). */
  programmedNft(): Map<string, NftPortRules> {
    return new Map([...this.applied].filter(([, a]) => a.nft).map(([k, a]) => [k, a.nft!]));
  }

  problems(): ServiceProblem[] {
    return [...this.lastProblems].map(([service, reason]) => ({ service, reason }));
  }

  /** Resolves after the next sync that starts from now on completes (successfully or not). */
  waitForSync(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** Runs one sync now, after any in progress; `full` forces a full one. */
  syncNow(full = false): Promise<SyncResult> {
    if (full) this.needFull = true;
    return this.enqueue();
  }

  private enqueue(): Promise<SyncResult> {
    const p = this.serial.then(() => this.sync());
    this.serial = p.catch(() => {});
    return p;
  }

  private kick(): void {
    this.pending = true;
    if (this.stopped || this.running || this.timer) return;
    const wait = Math.max(0, this.lastStart + this.minSyncMs - this.now());
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.loop();
    }, wait);
    this.timer.unref();
  }

  private async loop(): Promise<void> {
    if (this.stopped) return;
    // Programming before the pods are known would turn every Service into a REJECT until they are.
    if (this.opts.pods.hasSynced && !this.opts.pods.hasSynced()) return; // its first list kicks us again
    const slices = this.opts.slices?.source;
    if (slices?.hasSynced && !slices.hasSynced()) return;
    this.running = true;
    this.pending = false;
    try {
      await this.enqueue();
    } catch (err) {
      this.opts.log.error('proxy sync failed; the next sync is full', { error: errorMessage(err) });
      this.pending = true;
    } finally {
      this.running = false;
      if (this.pending) this.kick();
    }
  }

  private async sync(): Promise<SyncResult> {
    const waiters = this.waiters;
    this.waiters = [];
    this.lastStart = this.now();
    const t0 = performance.now();
    const full = this.needFull;
    try {
      const r = await this.syncOnce(full);
      await this.syncHealthChecks();
      return { ...r, ms: performance.now() - t0 };
    } catch (err) {
      this.needFull = true;
      this.opts.metrics?.restoreFailed();
      throw err;
    } finally {
      for (const w of waiters) w();
    }
  }

  private async syncOnce(full: boolean): Promise<Omit<SyncResult, 'ms'>> {
    const t0 = performance.now();
    let services = this.lastServices;
    if (full || this.servicesDirty || this.firstSync) {
      this.servicesDirty = false;
      const r = this.allocator.resolve(this.opts.services.list());
      services = r.services;
      this.problemsNow = r.problems;
    }
    this.reportProblems(this.problemsNow);
    const pods = this.opts.pods.list();
    // Which Services can the pod changes since the last sync touch? (all of them in a full sync)
    const fromSlices = this.opts.slices;
    let touched: Set<string> | undefined;
    if (fromSlices) {
      touched = full || this.firstSync ? undefined : this.slicesTouched;
      this.slicesTouched = new Set();
    } else touched = this.touchedByPods(pods, services, full || this.firstSync);
    this.lastServices = services;
    this.lastPods = pods;

    const next = new Map<string, Applied>();
    const changed = new Set<string>();
    const ports: PortRules[] = [];
    const nftPorts: NftPortRules[] = [];
    const nftMode = this.mode === 'nftables';
    let index: PodIndex | undefined;
    let recomputed = 0;
    for (const svc of services) {
      const first = this.applied.get(svc.ports[0]?.key ?? '');
      if (touched && first && first.service === svc && !touched.has(`${svc.namespace}/${svc.name}`)) {
        // Neither the Service nor any pod it could select changed: keep what was applied.
        for (const sp of svc.ports) {
          const a = this.applied.get(sp.key)!;
          next.set(sp.key, a);
          if (nftMode) nftPorts.push(a.nft!);
          else ports.push(a.rules!);
        }
        continue;
      }
      let endpoints: Map<string, Endpoint[]>;
      if (fromSlices) endpoints = endpointsFromSlices(svc, fromSlices.source.slicesOf(svc.namespace, svc.name), fromSlices.nodeName);
      else {
        // A few Services scan the pod list; more than that pay for an index once.
        if (!index && (!touched || ++recomputed > 16)) index = new PodIndex(pods);
        endpoints = computeEndpoints([svc], index ?? pods);
      }
      for (const sp of svc.ports) {
        const eps = endpoints.get(sp.key) ?? [];
        const fingerprint = JSON.stringify([sp, eps.map((e) => [e.ip, e.port, e.local, e.terminating === true])]);
        const old = this.applied.get(sp.key);
        const same = old !== undefined && old.fingerprint === fingerprint;
        if (!same) changed.add(sp.key);
        if (nftMode) {
          const nft = same && old.nft ? old.nft : renderNftPort(sp, eps, { podCidr: this.opts.podCidr });
          next.set(sp.key, { service: svc, fingerprint, nft, port: sp, endpoints: eps });
          nftPorts.push(nft);
        } else {
          const rules = same && old.rules ? old.rules : renderPort(sp, eps, { podCidr: this.opts.podCidr });
          next.set(sp.key, { service: svc, fingerprint, rules, port: sp, endpoints: eps });
          ports.push(rules);
        }
      }
    }

    if (nftMode) return this.syncNftables(full, t0, services.length, next, nftPorts, changed);

    // Chains left by an earlier run are known only from the kernel; the jumps from the built-in chains are
    // checked on full syncs (someone may have flushed them) and added in the same restore.
    const [kernelChains, missing] = await Promise.all([
      this.firstSync ? this.ipt.chains('nat') : Promise.resolve([]),
      full || this.firstSync ? this.ipt.missingJumps() : Promise.resolve(undefined),
    ]);
    for (const c of kernelChains) if (SERVICE_CHAIN_RE.test(c)) this.chainsInKernel.add(c);
    const isFull = full || this.firstSync;
    const removedKeys = [...this.applied.keys()].filter((k) => !next.has(k));
    // Stale chains: in a full sync, every service chain we know of that is not wanted; in a
    // partial one, the chains of changed or removed ports that their new rules no longer have
    // (a chain name hashes its port's name, so no other port can want it).
    let stale: string[];
    let active: Set<string> | undefined;
    if (isFull) {
      active = new Set<string>();
      for (const pr of ports) for (const c of pr.chains) active.add(c);
      stale = [...this.chainsInKernel].filter((c) => !active!.has(c)).sort();
    } else {
      const gone = new Set<string>();
      for (const key of [...changed, ...removedKeys]) {
        const old = this.applied.get(key);
        if (!old?.rules) continue;
        const now = new Set(next.get(key)?.rules?.chains ?? []);
        for (const c of old.rules.chains) if (!now.has(c)) gone.add(c);
      }
      stale = [...gone].sort();
    }
    const extra = missing && {
      filter: missing.filter((j) => j.table === 'filter').map(jumpInsertLine),
      nat: missing.filter((j) => j.table === 'nat').map(jumpInsertLine),
    };
    if (this.firstSync) await this.nft.deleteTable(); // the other mode's rules go when this one starts
    const previousRules = full || this.firstSync ? undefined : new Map([...this.applied].map(([k, a]) => [k, a.rules!]));
    const restores = previousRules
      ? [assemble({ ports, previous: previousRules, changed, stale, extra })]
      : assembleFullSplit({ ports, stale, extra }, this.portsPerRestore, this.splitAbove);

    if (!isFull && changed.size === 0 && stale.length === 0 && removedKeys.length === 0) {
      // Nothing of ours changed: the top-level chains are already right.
      return { full, rulesWritten: 0, bytes: 0 };
    }
    try {
      for (const r of restores) await this.ipt.restore(r.text);
    } catch (err) {
      // A split full sync may have stopped half-way: learn the chains from the kernel again.
      if (restores.length > 1) this.firstSync = true;
      throw err;
    }
    const ruleset = { rulesWritten: restores.reduce((n, r) => n + r.rulesWritten, 0), bytes: restores.reduce((n, r) => n + r.text.length, 0) };

    const previous = this.applied;
    this.applied = next;
    if (active) {
      this.chainsInKernel = active;
    } else {
      for (const c of stale) this.chainsInKernel.delete(c);
      for (const key of changed) for (const c of next.get(key)?.rules?.chains ?? []) this.chainsInKernel.add(c);
    }
    this.firstSync = false;
    this.needFull = false;
    if (isFull) {
      this.lastFullEnd = this.now();
      this.lastFullMs = performance.now() - t0;
    }
    this.opts.metrics?.observeSync((performance.now() - t0) / 1000, full, ruleset.rulesWritten);
    this.opts.log.debug('proxy rules synced', { full, services: services.length, changed: changed.size, stale: stale.length, rules: ruleset.rulesWritten, ms: Math.round(performance.now() - t0) });
    await this.clearStaleUdp(previous, next);
    return { full, rulesWritten: ruleset.rulesWritten, bytes: ruleset.bytes, restores: restores.length };
  }

  /**
   * nftables mode: one `nft -f` transaction. The first sync (and any after a
   * failure) makes the table afresh, deleting the iptables mode's rules
   * first; a later full sync rewrites the table in place (affinity entries
   * survive); a partial one edits only the changed ports' elements and chains.
   */
  private async syncNftables(full: boolean, t0: number, serviceCount: number, next: Map<string, Applied>, ports: NftPortRules[], changed: Set<string>): Promise<Omit<SyncResult, 'ms'>> {
    const previous = new Map([...this.applied].filter(([, a]) => a.nft).map(([k, a]) => [k, a.nft!]));
    const fresh = this.firstSync || affinityChanged(previous, ports);
    const isFull = full || fresh;
    const removed = [...this.applied.keys()].filter((k) => !next.has(k));
    if (!isFull && changed.size === 0 && removed.length === 0) return { full, rulesWritten: 0, bytes: 0 };
    if (this.firstSync) await cleanupRules(this.opts.run); // the other mode's rules go when this one starts
    let ruleset;
    if (isFull) {
      // Chains and sets of the last sync that this one no longer has.
      const wantChains = new Set<string>();
      const wantSets = new Set<string>();
      for (const pr of ports) {
        for (const c of pr.chains) wantChains.add(c.name);
        for (const s of pr.sets) wantSets.add(s.name);
      }
      const staleChains = new Set<string>();
      const staleSets = new Set<string>();
      if (!fresh) {
        for (const pr of previous.values()) {
          for (const c of pr.chains) if (!wantChains.has(c.name)) staleChains.add(c.name);
          for (const s of pr.sets) if (!wantSets.has(s.name)) staleSets.add(s.name);
        }
      }
      ruleset = assembleNft({ ports, fresh, staleChains: [...staleChains].sort(), staleSets: [...staleSets].sort() });
    } else {
      ruleset = assembleNft({ ports, previous });
    }
    let via: SyncResult['via'] = 'nft';
    if (ruleset.ops) {
      if (ruleset.text) via = await this.nft.applyOps(ruleset.ops, ruleset.text);
    } else if (ruleset.text) await this.nft.apply(ruleset.text);
    const before = this.applied;
    this.applied = next;
    this.firstSync = false;
    this.needFull = false;
    if (isFull) {
      this.lastFullEnd = this.now();
      this.lastFullMs = performance.now() - t0;
    }
    this.opts.metrics?.observeSync((performance.now() - t0) / 1000, isFull, ruleset.rulesWritten);
    this.opts.log.debug('proxy rules synced', { mode: 'nftables', full: isFull, services: serviceCount, changed: changed.size, removed: removed.length, rules: ruleset.rulesWritten, via, ms: Math.round(performance.now() - t0) });
    await this.clearStaleUdp(before, next);
    return { full: isFull, rulesWritten: ruleset.rulesWritten, bytes: ruleset.text.length, restores: ruleset.text && via === 'nft' ? 1 : 0, via };
  }

  /** Each health-checked Service's count of this node's ready endpoints, as kube-proxy reports them. */
  private async syncHealthChecks(): Promise<void> {
    const hc = this.opts.healthChecks;
    if (!hc) return;
    const targets: HealthCheckTarget[] = [];
    for (const svc of this.lastServices) {
      if (svc.healthCheckNodePort === undefined) continue;
      const local = new Set<string>();
      for (const sp of svc.ports) for (const e of this.applied.get(sp.key)?.endpoints ?? []) if (e.local && !e.terminating) local.add(e.ip);
      targets.push({ namespace: svc.namespace, name: svc.name, port: svc.healthCheckNodePort, localEndpoints: local.size });
    }
    await hc.sync(targets);
  }

  /**
   * UDP has no connections: conntrack keeps sending a client's datagrams to
   * the endpoint it first picked, even after that endpoint is gone, or to
   * nowhere if the first ones arrived while there was none. Drop those entries.
   */
  private async clearStaleUdp(previous: Map<string, Applied>, next: Map<string, Applied>): Promise<void> {
    const jobs: Array<{ clusterIP?: string; nodePort?: number; endpointIP?: string }> = [];
    for (const [key, old] of previous) {
      if (old.port.protocol !== 'UDP' || !old.port.clusterIP) continue;
      const now = next.get(key);
      const nowIPs = new Set((now?.endpoints ?? []).map((e) => `${e.ip}:${e.port}`));
      for (const ep of old.endpoints) {
        if (nowIPs.has(`${ep.ip}:${ep.port}`)) continue;
        jobs.push({ clusterIP: old.port.clusterIP, endpointIP: ep.ip });
        if (old.port.nodePort) jobs.push({ nodePort: old.port.nodePort, endpointIP: ep.ip });
      }
    }
    for (const [key, now] of next) {
      if (now.port.protocol !== 'UDP' || !now.port.clusterIP || now.endpoints.length === 0) continue;
      const old = previous.get(key);
      if (!old || old.endpoints.length === 0) {
        jobs.push({ clusterIP: now.port.clusterIP });
        if (now.port.nodePort) jobs.push({ nodePort: now.port.nodePort });
      }
    }
    for (const job of jobs) {
      try {
        await this.ipt.clearUdp(job);
      } catch (err) {
        this.opts.log.warn('could not clear stale UDP conntrack entries', { ...job, error: errorMessage(err) });
      }
    }
  }

  /**
   * Services that pods added, removed or changed since the last sync may
   * select (by their labels before or after), as namespace/name. Pod sources
   * replace a pod's object when it changes, so identity tells.
   */
  private touchedByPods(pods: Pod[], services: ServiceInfo[], all: boolean): Set<string> | undefined {
    const now = new Set(pods);
    const changedPods: Pod[] = [];
    if (!all) {
      for (const p of pods) if (!this.podsSeen.has(p)) changedPods.push(p);
      for (const p of this.podsSeen) if (!now.has(p)) changedPods.push(p);
    }
    this.podsSeen = now;
    if (all) return undefined;
    const touched = new Set<string>();
    if (changedPods.length === 0) return touched;
    for (const svc of services) {
      if (!svc.selector) continue;
      for (const p of changedPods) {
        if ((p.metadata?.namespace ?? 'default') === svc.namespace && selectorMatches(svc.selector, p.metadata?.labels)) {
          touched.add(`${svc.namespace}/${svc.name}`);
          break;
        }
      }
    }
    return touched;
  }

  private reportProblems(problems: ServiceProblem[]): void {
    const now = new Map(problems.map((p) => [p.service, p.reason]));
    for (const [svc, reason] of now) {
      if (this.lastProblems.get(svc) !== reason) this.opts.log.warn('service not programmed', { service: svc, reason });
    }
    this.lastProblems = now;
  }

  /** Removes every jump, chain and rule this proxy makes, and nothing else. */
  async cleanup(): Promise<void> {
    await this.serial.catch(() => {});
    await cleanupRules(this.opts.run);
    await new Nft(this.opts.run).deleteTable();
    this.applied.clear();
    this.chainsInKernel.clear();
    this.firstSync = true;
    this.needFull = true;
  }
}

/** `skiff proxy --cleanup`: both modes' rules. */
export async function cleanupAll(run: CommandRunner): Promise<void> {
  await cleanupRules(run);
  await new Nft(run).deleteTable();
}

/** The iptables mode's rules: the jumps out of the built-in chains first, then our chains. */
export async function cleanupRules(run: CommandRunner): Promise<void> {
  const ipt = new Iptables(run);
  await ipt.removeJumps();
  const filter = new Set(await ipt.chains('filter'));
  const nat = await ipt.chains('nat');
  const natSet = new Set(nat);
  const lines: string[] = ['*filter'];
  const filterGone = FILTER_CHAINS.filter((c) => filter.has(c));
  for (const c of filterGone) lines.push(`:${c} - [0:0]`);
  for (const c of filterGone) lines.push(`-X ${c}`);
  lines.push('COMMIT', '*nat');
  const natGone = [...NAT_CHAINS.filter((c) => natSet.has(c)), ...nat.filter((c) => SERVICE_CHAIN_RE.test(c))];
  lines.push(...declarationOrder(natGone.map((c) => `:${c} - [0:0]`)));
  for (const c of natGone) lines.push(`-X ${c}`);
  lines.push('COMMIT', '');
  await ipt.restore(lines.join('\n'));
}
