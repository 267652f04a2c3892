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
import { AddressClaims } from './claims.js';
import { Nft } from './nft.js';
import { affinityChanged, assembleNft, chainTable, changedOps, opsText, portAffinityChanged, portTable, renderNftPort, tableCount, tableName, type NftOp, type NftPortRules } from './nft-rules.js';
import { assemble, assembleFullSplit, declarationOrder, FILTER_CHAINS, NAT_CHAINS, renderPort, SERVICE_CHAIN_RE, type PortRules } from './rules.js';
import { Allocator, findService, parseCidr, type ServiceInfo, type ServiceProblem } from './service.js';
import type { EndpointSliceSource, PodChange, PodSource, ServiceSource } from './sources.js';
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

/** Pod changes held between syncs, beyond which the next sync reads every pod instead. */
const MAX_POD_CHANGES = 5000;

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
  /** nftables mode: service ports per table before the Services' chains are spread over more tables (default PORTS_PER_TABLE; see tableCount). */
  portsPerTable?: number;
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
  /** nftables mode: the tables the Services are spread over. */
  tables?: number;
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
  /** nftables mode: the tables the applied Services are spread over (see tableCount). */
  private nftTables = 1;
  /** Service chains present in the kernel as far as we know. */
  private chainsInKernel = new Set<string>();
  private needFull = true;
  private firstSync = true;
  /** nftables mode: a sync failed, so the table's content is not known: the next is made afresh. */
  private nftUnknown = false;
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
  /** Pod changes since the last sync, as the pod source told them; undefined: it did not say (any pod may have changed). */
  private podChanges: PodChange[] | undefined;
  /** The pods by label, kept up to date from podChanges between syncs that read every pod. */
  private podIndex: PodIndex | undefined;
  /** nftables mode: which port answers an address several claim (see claims.ts). */
  private readonly claims = new AddressClaims();
  /** nftables mode: the ports written without some of their addresses, and which. */
  private addressConflicts = new Map<string, string>();
  /** The Services with selectors by a label they select on (undefined: to be made from the next sync's list). */
  private bySelector: SelectorIndex | undefined;
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
    this.unsubscribeTracking = [
      opts.services.onChange(() => (this.servicesDirty = true)),
      opts.pods.onChange((changes) => {
        if (opts.slices) return; // endpoints come from the slices
        // More changes than a sync would rather scan for: read every pod instead.
        if (!changes || !this.podChanges || this.podChanges.length + changes.length > MAX_POD_CHANGES) this.podChanges = undefined;
        else for (const c of changes) this.podChanges.push(c);
      }),
    ];
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

  /** Services not programmed, and (nftables mode) ports programmed without an address another claim keeps. */
  problems(): ServiceProblem[] {
    return [...[...this.lastProblems].map(([service, reason]) => ({ service, reason })), ...[...this.addressConflicts].map(([service, reason]) => ({ service, reason }))];
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
      this.nftUnknown = true;
      this.opts.metrics?.restoreFailed();
      throw err;
    } finally {
      for (const w of waiters) w();
    }
  }

  private async syncOnce(full: boolean): Promise<Omit<SyncResult, 'ms'>> {
    const t0 = performance.now();
    let services = this.lastServices;
    const previousServices = services;
    /** Services changed since the last sync (namespace/name); undefined: any may have. */
    let servicesChanged: string[] | undefined = [];
    if (full || this.servicesDirty || this.firstSync) {
      this.servicesDirty = false;
      const r = this.allocator.resolve(this.opts.services.list());
      services = r.services;
      servicesChanged = r.changed;
      this.problemsNow = r.problems;
      if (!servicesChanged) this.bySelector = undefined;
      else if (this.bySelector) {
        for (const key of servicesChanged) {
          const was = findService(previousServices, key);
          if (was) this.bySelector.remove(was);
          const now = findService(services, key);
          if (now) this.bySelector.add(now);
        }
      }
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
    const index = this.podIndex;
    this.lastServices = services;
    this.lastPods = pods;

    const nftMode = this.mode === 'nftables';
    if (nftMode && !full && !this.firstSync && touched && servicesChanged) {
      // Only the Services that changed, or whose pods did, are looked at: the rest stay as applied.
      const next = new Map(this.applied);
      const changed = new Set<string>();
      const removed: string[] = [];
      // A changed Service's addresses may pass to or from another Service's ports: those are looked at too.
      const addrs = new Set<string>();
      for (const key of servicesChanged) {
        const now = findService(services, key);
        const keep = new Set(now?.ports.map((sp) => sp.key));
        for (const sp of findService(previousServices, key)?.ports ?? []) if (!keep.has(sp.key)) this.claims.set(sp.key, undefined, addrs);
        for (const sp of now?.ports ?? []) this.claims.set(sp.key, sp, addrs);
      }
      const force = new Set(touched);
      for (const port of this.claims.claimants(addrs)) force.add(serviceOfPort(port));
      for (const key of new Set([...servicesChanged, ...force])) {
        const svc = findService(services, key);
        const keep = new Set<string>();
        if (svc) {
          this.recompute(svc, force, next, changed, index);
          for (const sp of svc.ports) keep.add(sp.key);
        }
        for (const sp of findService(previousServices, key)?.ports ?? []) {
          if (keep.has(sp.key)) continue;
          if (next.delete(sp.key)) removed.push(sp.key);
          this.noteConflict(sp.key, undefined);
        }
      }
      const all = () => services.flatMap((s) => s.ports.map((sp) => next.get(sp.key)!.nft!));
      return this.syncNftables(false, t0, services.length, next, all, changed, removed);
    }

    const next = new Map<string, Applied>();
    const changed = new Set<string>();
    if (nftMode) {
      this.claims.clear();
      for (const svc of services) for (const sp of svc.ports) this.claims.set(sp.key, sp);
      const live = new Set(services.flatMap((s) => s.ports.map((sp) => sp.key)));
      for (const k of this.addressConflicts.keys()) if (!live.has(k)) this.noteConflict(k, undefined);
    }
    // nftables mode: with the claims made again any port's addresses may have moved, so every Service is looked at
    // (this path runs there only for full syncs and after a whole pass of the allocator).
    for (const svc of services) this.recompute(svc, nftMode ? undefined : touched, next, changed, index);
    const ports: PortRules[] = [];
    const nftPorts: NftPortRules[] = [];
    for (const svc of services) {
      for (const sp of svc.ports) {
        const a = next.get(sp.key)!;
        if (nftMode) nftPorts.push(a.nft!);
        else ports.push(a.rules!);
      }
    }

    if (nftMode) return this.syncNftables(full, t0, services.length, next, () => nftPorts, changed, this.removedKeys(next, changed));

    // Chains left by an earlier run are known only from the kernel; the jumps from the built-in chains are
    // checked on full syncs (someone may have flushed them) and added in the same restore.
    const [kernelChains, missing] = await Promise.all([
      this.firstSync ? this.ipt.chains('nat') : Promise.resolve([]),
      full || this.firstSync ? this.ipt.missingJumps() : Promise.resolve(undefined),
    ]);
    for (const c of kernelChains) if (SERVICE_CHAIN_RE.test(c)) this.chainsInKernel.add(c);
    const isFull = full || this.firstSync;
    const removedKeys = this.removedKeys(next, changed);
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
   * Puts one Service's ports into `next`: what was applied when neither it
   * nor its pods changed (`touched` undefined: they all may have), else its
   * endpoints and rules again, noting in `changed` the ports that differ.
   */
  private recompute(svc: ServiceInfo, touched: Set<string> | undefined, next: Map<string, Applied>, changed: Set<string>, index: PodIndex | undefined): void {
    const first = this.applied.get(svc.ports[0]?.key ?? '');
    if (touched && first && first.service === svc && !touched.has(svc.key)) {
      for (const sp of svc.ports) next.set(sp.key, this.applied.get(sp.key)!);
      return;
    }
    const fromSlices = this.opts.slices;
    const endpoints = fromSlices ? endpointsFromSlices(svc, fromSlices.source.slicesOf(svc.namespace, svc.name), fromSlices.nodeName) : computeEndpoints([svc], index!);
    const nftMode = this.mode === 'nftables';
    for (const port of svc.ports) {
      const eps = endpoints.get(port.key) ?? [];
      let sp = port;
      if (nftMode) {
        const eff = this.claims.effective(port);
        sp = eff.sp;
        this.noteConflict(port.key, eff.conflict);
      }
      const fingerprint = JSON.stringify([sp, eps.map((e) => [e.ip, e.port, e.local, e.terminating === true])]);
      const old = this.applied.get(sp.key);
      const same = old !== undefined && old.fingerprint === fingerprint;
      if (!same) changed.add(sp.key);
      if (nftMode) {
        const nft = same && old.nft ? old.nft : renderNftPort(sp, eps, { podCidr: this.opts.podCidr });
        next.set(sp.key, { service: svc, fingerprint, nft, port: sp, endpoints: eps });
      } else {
        const rules = same && old.rules ? old.rules : renderPort(sp, eps, { podCidr: this.opts.podCidr });
        next.set(sp.key, { service: svc, fingerprint, rules, port: sp, endpoints: eps });
      }
    }
  }

  /**
   * nftables mode: one transaction. The first sync (and any after a
   * failure, or when the count of tables changes) makes the tables afresh,
   * deleting the iptables mode's rules first; a later full sync rewrites
   * them in place (affinity entries survive); a partial one edits only the
   * changed ports' elements and chains, over netlink when it can.
   */
  private async syncNftables(full: boolean, t0: number, serviceCount: number, next: Map<string, Applied>, allPorts: () => NftPortRules[], changed: Set<string>, removed: string[]): Promise<Omit<SyncResult, 'ms'>> {
    if (!full && !this.firstSync && changed.size === 0 && removed.length === 0) return { full, rulesWritten: 0, bytes: 0 };
    // A partial sync looks at the changed and removed ports only; a full one at all of them.
    const touched = full || this.firstSync ? undefined : [...changed, ...removed];
    const before = (k: string) => this.applied.get(k)?.nft;
    const now = (k: string) => next.get(k)?.nft;
    // More service ports than its tables should hold (or far fewer): the table is made afresh, spread anew.
    const tables = tableCount(next.size, this.opts.portsPerTable);
    // After a failure the tables are not known to be what the last success left (someone may have deleted
    // a chain or a table, which made it fail): a full sync that only edited them could fail the same
    // way every time (deleting a stale chain that is not there).
    let fresh = this.firstSync || this.nftUnknown || tables !== this.nftTables;
    let previous: Map<string, NftPortRules> | undefined;
    if (touched) fresh ||= touched.some((k) => portAffinityChanged(before(k), now(k)));
    else {
      previous = new Map([...this.applied].filter(([, a]) => a.nft).map(([k, a]) => [k, a.nft!]));
      fresh ||= affinityChanged(previous, allPorts());
    }
    const isFull = full || fresh;
    if (this.firstSync) await cleanupRules(this.opts.run); // the other mode's rules go when this one starts
    let ruleset;
    if (isFull) {
      const ports = allPorts();
      previous ??= new Map([...this.applied].filter(([, a]) => a.nft).map(([k, a]) => [k, a.nft!]));
      // Chains and sets of the last sync that this one no longer has.
      const wantChains = new Set<string>();
      const wantSets = new Set<string>();
      for (const pr of ports) {
        for (const c of pr.chains) wantChains.add(c.name);
        for (const s of pr.sets) wantSets.add(s.name);
      }
      const staleChains = new Map<string, string>();
      const staleSets = new Map<string, string>();
      if (!fresh) {
        for (const pr of previous.values()) {
          for (const c of pr.chains) if (!wantChains.has(c.name)) staleChains.set(c.name, chainTable(pr.key, c, tables));
          for (const s of pr.sets) if (!wantSets.has(s.name)) staleSets.set(s.name, portTable(pr.key, tables));
        }
      }
      const named = (m: Map<string, string>) => [...m].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([name, table]) => ({ table, name }));
      // Made afresh: the tables of an earlier count go too, and, on the first sync or after a failure, any found.
      const dropTables = fresh ? [...new Set([...Array.from({ length: this.nftTables }, (_, i) => tableName(i)), ...(this.firstSync || this.nftUnknown ? await this.nft.serviceTables() : [])])] : undefined;
      ruleset = assembleNft({ ports, fresh, staleChains: named(staleChains), staleSets: named(staleSets), tables, dropTables });
    } else {
      const { ops: changes, rulesWritten } = changedOps(touched!, before, now, tables);
      // Each table named first (adding a chain it has changes nothing, and fails if the table is gone): a table
      // someone deleted fails this sync, and the next makes them all afresh, even when no change was for it.
      const ops: NftOp[] = changes.length ? [...Array.from({ length: tables }, (_, i) => ({ op: 'add-chain' as const, chain: 'services', ...(i ? { table: tableName(i) } : {}) })), ...changes] : [];
      // The text is made only if nft is to write it.
      ruleset = { ops, rulesWritten, text: '' };
    }
    let via: SyncResult['via'] = 'nft';
    if (ruleset.ops) {
      const ops = ruleset.ops;
      if (ops.length) via = await this.nft.applyOps(ops, () => (ruleset.text = opsText(ops)));
    } else if (ruleset.text) await this.nft.apply(ruleset.text);
    const previousApplied = this.applied;
    this.applied = next;
    this.nftTables = tables;
    this.firstSync = false;
    this.needFull = false;
    this.nftUnknown = false;
    if (isFull) {
      this.lastFullEnd = this.now();
      this.lastFullMs = performance.now() - t0;
    }
    this.opts.metrics?.observeSync((performance.now() - t0) / 1000, isFull, ruleset.rulesWritten);
    this.opts.log.debug('proxy rules synced', { mode: 'nftables', full: isFull, tables, services: serviceCount, changed: changed.size, removed: removed.length, rules: ruleset.rulesWritten, via, ms: Math.round(performance.now() - t0) });
    await this.clearStaleUdp(previousApplied, next, isFull ? undefined : touched);
    return { full: isFull, rulesWritten: ruleset.rulesWritten, bytes: ruleset.text.length, restores: ruleset.text && via === 'nft' ? 1 : 0, via, tables };
  }

  /** Port keys applied last time that `next` no longer has (counted first: usually there are none). */
  private removedKeys(next: Map<string, Applied>, changed: Set<string>): string[] {
    let added = 0;
    for (const k of changed) if (!this.applied.has(k)) added++;
    if (this.applied.size + added === next.size) return [];
    return [...this.applied.keys()].filter((k) => !next.has(k));
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
  private async clearStaleUdp(previous: Map<string, Applied>, next: Map<string, Applied>, keys?: string[]): Promise<void> {
    const jobs: Array<{ clusterIP?: string; nodePort?: number; endpointIP?: string }> = [];
    // Only ports that changed can have stale entries: a partial sync names them.
    const pairs: Iterable<[string, Applied]> = keys ? keys.flatMap((k): Array<[string, Applied]> => (previous.has(k) ? [[k, previous.get(k)!]] : [])) : previous;
    for (const [key, old] of pairs) {
      if (old.port.protocol !== 'UDP' || !old.port.clusterIP) continue;
      const now = next.get(key);
      const nowIPs = new Set((now?.endpoints ?? []).map((e) => `${e.ip}:${e.port}`));
      for (const ep of old.endpoints) {
        if (nowIPs.has(`${ep.ip}:${ep.port}`)) continue;
        jobs.push({ clusterIP: old.port.clusterIP, endpointIP: ep.ip });
        if (old.port.nodePort) jobs.push({ nodePort: old.port.nodePort, endpointIP: ep.ip });
      }
    }
    const nextPairs: Iterable<[string, Applied]> = keys ? keys.flatMap((k): Array<[string, Applied]> => (next.has(k) ? [[k, next.get(k)!]] : [])) : next;
    for (const [key, now] of nextPairs) {
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
   * select (by their labels before or after), as namespace/name; undefined:
   * any (a full sync, or a pod source that did not say what changed). Keeps
   * the pod index in step: updated by the changes, or made again from `pods`.
   */
  private touchedByPods(pods: Pod[], services: ServiceInfo[], all: boolean): Set<string> | undefined {
    const changes = this.podChanges;
    this.podChanges = [];
    if (all || !changes || !this.podIndex) {
      this.podIndex = new PodIndex(pods);
      return undefined;
    }
    const touched = new Set<string>();
    if (changes.length === 0) return touched;
    const changedPods: Pod[] = [];
    for (const c of changes) {
      if (c.before) {
        this.podIndex.remove(c.before);
        changedPods.push(c.before);
      }
      if (c.after) {
        this.podIndex.add(c.after);
        changedPods.push(c.after);
      }
    }
    this.bySelector ??= new SelectorIndex(services);
    for (const p of changedPods) for (const svc of this.bySelector.selecting(p)) touched.add(svc.key);
    return touched;
  }

  /** A port written without some of its addresses (conflict), or again with all (undefined): said once in the log. */
  private noteConflict(port: string, conflict: string | undefined): void {
    if (this.addressConflicts.get(port) === conflict) return;
    if (conflict) {
      this.addressConflicts.set(port, conflict);
      this.opts.log.warn('service address not programmed', { port, reason: conflict });
    } else this.addressConflicts.delete(port);
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

/**
 * Services by one label of their selectors (the first): a pod can only be
 * selected by those filed under one of its own labels. Keyed by the strings
 * the objects already hold, so making one for 10,000 Services builds no names.
 */
class SelectorIndex {
  private readonly byNamespace = new Map<string, Map<string, Map<string, ServiceInfo[]>>>();

  constructor(services: ServiceInfo[]) {
    for (const svc of services) this.add(svc);
  }

  add(svc: ServiceInfo): void {
    const at = this.listOf(svc, true);
    at?.push(svc);
  }

  remove(svc: ServiceInfo): void {
    const at = this.listOf(svc, false);
    const i = at?.indexOf(svc) ?? -1;
    if (i >= 0) at!.splice(i, 1);
  }

  private listOf(svc: ServiceInfo, create: boolean): ServiceInfo[] | undefined {
    const sel = svc.selector;
    if (!sel) return undefined;
    let k: string | undefined;
    for (const key in sel) {
      k = key;
      break;
    }
    if (k === undefined) return undefined;
    let byKey = this.byNamespace.get(svc.namespace);
    if (!byKey && create) this.byNamespace.set(svc.namespace, (byKey = new Map()));
    let byValue = byKey?.get(k);
    if (!byValue && create) byKey!.set(k, (byValue = new Map()));
    const v = sel[k]!;
    let list = byValue?.get(v);
    if (!list && create) byValue!.set(v, (list = []));
    return list;
  }

  /** The Services whose selectors match the pod's labels. */
  selecting(pod: Pod): ServiceInfo[] {
    const labels = pod.metadata?.labels;
    const byKey = this.byNamespace.get(pod.metadata?.namespace ?? 'default');
    if (!labels || !byKey) return [];
    const out: ServiceInfo[] = [];
    for (const k in labels) {
      for (const svc of byKey.get(k)?.get(labels[k]!) ?? []) if (selectorMatches(svc.selector!, labels)) out.push(svc);
    }
    return out;
  }
}

/** A port key's Service (`ns/name:port` or `ns/name`: neither part holds a colon). */
const serviceOfPort = (port: string) => port.split(':')[0]!;

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
