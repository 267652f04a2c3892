/** `skiff proxy`: Services from a manifest directory → iptables or nftables rules, and service DNS. */
import fs from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { Registry } from 'prom-client';
import { errorMessage, isErrno } from '../errors.js';
import { ObjectStore } from '../kubelet-lite/store.js';
import { ManifestWatcher } from '../kubelet-lite/watch.js';
import { createLogger, isLogLevel, type Logger } from '../log.js';
import { DnsServer, parseResolvConf, type PodRecords } from '../proxy/dns.js';
import { processRunner } from '../proxy/iptables.js';
import { ServiceHealthServer } from '../proxy/health-check.js';
import { cleanupAll, Proxier, PROXY_MODES, registerProxyMetrics, type ProxierOptions, type ProxyMode } from '../proxy/proxier.js';
import { intToIp, parseCidr } from '../proxy/service.js';
import { HttpPodSource, storeServiceSource, type PodSource, type ServiceSource } from '../proxy/sources.js';
import { parseDuration, type FlagSpec, type Values } from './flags.js';
import { untilSignal } from './signals.js';

export const PROXY_HELP = `Flags for "skiff proxy" (Services to iptables or nftables rules in kube-proxy's layouts, and service DNS):
  --proxy-mode MODE        iptables (the default) or nftables (table "ip kube-proxy", and
                           kube-proxy-1... past 1,000 service ports; one transaction per
                           sync); starting in one mode removes the other's rules
  --manifests DIR          Service manifests, watched (default /etc/skiff/manifests)
  --kubelet URL            kubelet-lite's status API; its pod watch gives the endpoints
                           (default http://127.0.0.1:10255)
  --service-cidr CIDR      where cluster IPs are allocated (default 10.96.0.0/12)
  --pod-cidr CIDR          the pod network; traffic to a cluster IP from outside it is
                           masqueraded (default 10.88.0.0/16)
  --min-sync-period D      at most one sync per D, e.g. 1s, 500ms (default 1s)
  --sync-period D          a full sync every D, or rarer if full syncs take over a fifth
                           of it (default 30s)
  --dns-address IP         where service DNS listens, UDP and TCP (default the pod network's
                           gateway, the first address of --pod-cidr; "" for no DNS)
  --dns-port PORT          its port (default 53)
  --cluster-domain DOMAIN  the cluster's DNS domain (default cluster.local)
  --dns-pods MODE          <a-b-c-d>.<ns>.pod names: "verified" answers only for a pod's
                           address in that namespace, "insecure" for any (default verified)
  --resolv-conf FILE       whose nameservers DNS forwards other names to; never to itself
                           (default /etc/resolv.conf)
  --metrics-address ADDR   host:port serving /metrics (default 127.0.0.1:10249; "" for none)
  --cleanup                remove every rule, chain and table the proxy made (both modes), then exit
  --log-level LEVEL        debug, info, warn or error (default info)
`;

/** Services from the manifest directory, through kubelet-lite's store and watcher. */
function manifestServices(dir: string, log: Logger): { source: ServiceSource; start(): Promise<void>; stop(): Promise<void> } {
  const store = new ObjectStore({ nodeName: os.hostname().toLowerCase(), log });
  const watcher = new ManifestWatcher({ dir, store, log });
  let rescan: NodeJS.Timeout | undefined;
  return {
    source: storeServiceSource(store),
    async start() {
      await watcher.start();
      rescan = setInterval(() => void watcher.rescan(), 60_000);
      rescan.unref();
    },
    async stop() {
      clearInterval(rescan);
      await watcher.close();
    },
  };
}

/** Binds DNS, retrying while its address does not exist yet (the pod bridge appears with the first pod). */
export function startDnsWhenPossible(server: DnsServer, address: string, log: Logger): () => void {
  let timer: NodeJS.Timeout | undefined;
  let stopped = false;
  let warned = false;
  const attempt = () => {
    server.start().then(
      ({ port }) => log.info('service DNS listening', { address, port }),
      (err) => {
        if (stopped) return;
        if (!isErrno(err, 'EADDRNOTAVAIL')) {
          log.error('service DNS could not start', { address, error: errorMessage(err) });
          return;
        }
        if (!warned) log.warn('service DNS waits for its address to exist', { address });
        warned = true;
        timer = setTimeout(attempt, 2000);
        timer.unref();
      },
    );
  };
  attempt();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

function serveMetrics(address: string, registry: Registry, log: Logger): http.Server {
  const m = /^(.*):(\d+)$/.exec(address);
  if (!m) throw new Error(`--metrics-address must be host:port, not "${address}"`);
  const server = http.createServer((req, res) => {
    if (req.method !== 'GET' || req.url !== '/metrics') {
      res.writeHead(404).end();
      return;
    }
    registry.metrics().then(
      (text) => res.writeHead(200, { 'Content-Type': registry.contentType }).end(text),
      () => res.writeHead(500).end(),
    );
  });
  server.maxConnections = 32;
  server.on('error', (err) => log.error('metrics server error', { error: errorMessage(err) }));
  server.listen(Number(m[2]), m[1]);
  return server;
}

/** The flags of `skiff proxy` (`skiff node` takes them too, less --kubelet and --metrics-address). */
export const PROXY_FLAGS = {
  'proxy-mode': { type: 'string', default: 'iptables' },
  manifests: { type: 'string', default: '/etc/skiff/manifests' },
  kubelet: { type: 'string', default: 'http://127.0.0.1:10255' },
  'service-cidr': { type: 'string', default: '10.96.0.0/12' },
  'pod-cidr': { type: 'string', default: '10.88.0.0/16' },
  'min-sync-period': { type: 'string', default: '1s' },
  'sync-period': { type: 'string', default: '30s' },
  'dns-address': { type: 'string' },
  'dns-port': { type: 'string', default: '53' },
  'cluster-domain': { type: 'string', default: 'cluster.local' },
  'dns-pods': { type: 'string', default: 'verified' },
  'resolv-conf': { type: 'string', default: '/etc/resolv.conf' },
  'metrics-address': { type: 'string', default: '127.0.0.1:10249' },
  'log-level': { type: 'string', default: 'info' },
} satisfies FlagSpec;

export interface ProxyOptions {
  mode: ProxyMode;
  serviceCidr: string;
  podCidr: string;
  minSyncMs: number;
  syncPeriodMs: number;
  /** '' for no DNS. */
  dnsAddress: string;
  dnsPort: number;
  clusterDomain: string;
  podRecords: PodRecords;
  /** Where the upstream nameservers are read from. */
  resolvConf: string;
}

/** The proxy's options from parsed flags, each checked with a message that names the flag. */
export function proxyOptionsFrom(values: Values): ProxyOptions {
  const str = (k: string) => values[k] as string;
  const podCidr = parseCidr(str('pod-cidr'));
  if (!podCidr || podCidr.bits > 30) throw new Error(`--pod-cidr must be an IPv4 CIDR, not "${str('pod-cidr')}"`);
  const serviceCidr = parseCidr(str('service-cidr'));
  if (!serviceCidr || serviceCidr.bits > 30) throw new Error(`--service-cidr must be an IPv4 CIDR with room for Services, not "${str('service-cidr')}"`);
  const minSyncMs = parseDuration(str('min-sync-period'));
  const syncPeriodMs = parseDuration(str('sync-period'));
  if (minSyncMs === undefined) throw new Error(`--min-sync-period must be a duration such as 1s, not "${str('min-sync-period')}"`);
  if (!syncPeriodMs) throw new Error(`--sync-period must be a positive duration such as 30s, not "${str('sync-period')}"`);
  const dnsPort = Number(str('dns-port'));
  if (!Number.isInteger(dnsPort) || dnsPort < 0 || dnsPort > 65535) throw new Error(`--dns-port must be a port number, not "${str('dns-port')}"`);
  const podRecords = str('dns-pods');
  if (podRecords !== 'verified' && podRecords !== 'insecure') throw new Error(`--dns-pods must be verified or insecure, not "${podRecords}"`);
  const mode = str('proxy-mode');
  if (!(PROXY_MODES as readonly string[]).includes(mode)) throw new Error(`--proxy-mode must be ${PROXY_MODES.join(' or ')}, not "${mode}" (ipvs is not built: see docs/proxy.md)`);
  return {
    mode: mode as ProxyMode,
    serviceCidr: serviceCidr.text,
    podCidr: podCidr.text,
    minSyncMs,
    syncPeriodMs,
    dnsAddress: (values['dns-address'] as string | undefined) ?? intToIp(podCidr.base + 1),
    dnsPort,
    clusterDomain: str('cluster-domain'),
    podRecords,
    resolvConf: str('resolv-conf'),
  };
}

export interface RunningProxy {
  proxier: Proxier;
  /** Stops syncing and DNS; the rules stay (skiff proxy --cleanup removes them). */
  stop(): Promise<void>;
}

/** The proxier and service DNS over the given sources; `run` runs commands in this process's own network namespace. */
export async function startProxy(opts: ProxyOptions, services: ServiceSource, pods: PodSource, registry: Registry, log: Logger, run = processRunner(), slices?: ProxierOptions['slices']): Promise<RunningProxy> {
  // Health-check node ports on every address of the node, as kube-proxy with no --nodeport-addresses.
  const healthChecks = new ServiceHealthServer({ address: '0.0.0.0', log });
  const proxier = new Proxier({
    mode: opts.mode,
    services,
    pods,
    slices,
    healthChecks,
    serviceCidr: opts.serviceCidr,
    podCidr: opts.podCidr,
    minSyncMs: opts.minSyncMs,
    syncPeriodMs: opts.syncPeriodMs,
    run,
    netns: null,
    log,
    metrics: registerProxyMetrics(registry),
  });
  proxier.start();
  let stopDns = () => {};
  let dns: DnsServer | undefined;
  if (opts.dnsAddress) {
    const resolvConf = await fs.readFile(opts.resolvConf, 'utf8').catch(() => '');
    dns = new DnsServer({
      address: opts.dnsAddress,
      port: opts.dnsPort,
      clusterDomain: opts.clusterDomain,
      view: proxier,
      upstreams: parseResolvConf(resolvConf),
      reverseCidrs: [opts.serviceCidr, opts.podCidr],
      podRecords: opts.podRecords,
      log,
    });
    stopDns = startDnsWhenPossible(dns, opts.dnsAddress, log);
  }
  return {
    proxier,
    async stop() {
      stopDns();
      await Promise.all([proxier.stop(), dns?.close()]);
      await healthChecks.close();
    },
  };
}

export async function proxy(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: { ...PROXY_FLAGS, cleanup: { type: 'boolean', default: false }, help: { type: 'boolean', short: 'h' } },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) {
    process.stdout.write(PROXY_HELP);
    return 0;
  }
  const level = values['log-level'] as string;
  if (!isLogLevel(level)) throw new Error(`--log-level must be debug, info, warn or error, not "${level}"`);
  const log = createLogger(level);
  const run = processRunner();
  if (values.cleanup) {
    await cleanupAll(run);
    log.info('removed the proxy\'s rules, chains and tables (iptables and nftables)');
    return 0;
  }
  const opts = proxyOptionsFrom(values);
  let kubeletUrl: URL;
  try {
    kubeletUrl = new URL(values.kubelet as string);
  } catch {
    throw new Error(`--kubelet must be a URL such as http://127.0.0.1:10255, not "${values.kubelet}"`);
  }
  if (kubeletUrl.protocol !== 'http:') throw new Error(`--kubelet must be an http:// URL, not "${values.kubelet}"`);
  const registry = new Registry();
  const services = manifestServices(values.manifests as string, log);
  const pods = new HttpPodSource({ url: kubeletUrl.href, log });
  await services.start();
  pods.start();
  const running = await startProxy(opts, services.source, pods, registry, log, run);
  const metricsAddress = values['metrics-address'] as string;
  const metricsServer = metricsAddress ? serveMetrics(metricsAddress, registry, log) : undefined;
  log.info('skiff proxy started', { manifests: values.manifests, kubelet: kubeletUrl.href, serviceCidr: opts.serviceCidr, podCidr: opts.podCidr, mode: opts.mode });

  return untilSignal(log, "skiff proxy stopping; its rules stay (skiff proxy --cleanup removes them)", async () => {
    pods.close();
    metricsServer?.close();
    await Promise.all([running.stop(), services.stop()]);
  });
}
