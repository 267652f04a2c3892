/** `skiff kubelet`: the node agent alone, against any CRI endpoint. */
import os from 'node:os';
import { parseArgs } from 'node:util';
import { MAX_PODS_AT_ONCE } from '../controllers/validate.js';
import { tryParseQuantity } from '../kubelet-lite/quantity.js';
import { parseDuration, parseEvictionConfig } from '../kubelet-lite/eviction.js';
import { startKubelet, type KubeletOptions } from '../kubelet-lite/run.js';
import { ControlPlane } from '../node/control-plane.js';
import { SysctlAllowlist } from '../kubelet-lite/sysctls.js';
import { createLogger, isLogLevel, type Logger } from '../log.js';
import { untilSignal } from './signals.js';
import type { FlagSpec, Values } from './flags.js';

export const KUBELET_HELP = `Flags for "skiff kubelet" (the node agent alone, against skiff, containerd or CRI-O):
  --manifests DIR          Pod, ConfigMap and Secret manifests, watched (default /etc/skiff/manifests)
  --runtime-endpoint URL   the CRI socket (default unix:///run/skiff/skiff.sock)
  --status-address ADDR    the read-only status API, host:port (default 127.0.0.1:10255)
  --root-dir DIR           pod volumes and state (default /var/lib/skiff/kubelet)
  --node-name NAME         this node's name (default the hostname)
  --node-ip IP             the address reported as hostIP (default the first non-loopback IPv4)
  --cluster-domain DOMAIN  the cluster's DNS domain (default cluster.local)
  --cluster-dns IP         nameserver for ClusterFirst pods (repeatable; default the host's)
  --image-gc-high-threshold PERCENT
                           image filesystem use that starts image GC (default 85)
  --image-gc-low-threshold PERCENT
                           where image GC stops (default 80)
  --minimum-image-ttl-duration DURATION
                           how long an unused image stays before image GC (or the
                           eviction manager under disk pressure) may remove it
                           (default 2m0s)
  --max-pods N             pods running at once; more wait, Pending, until one
                           ends (default 110)
  --allowed-unsafe-sysctls LIST
                           unsafe sysctls pods may set, comma-separated names or
                           prefixes ending in * (repeatable; default none: a pod
                           setting one fails with SysctlForbidden)
  --container-log-max-size SIZE
                           a running container's log is rotated when it passes
                           this, checked every 10s (default 10Mi)
  --container-log-max-files N
                           log files kept per container, the current one
                           included (default 5, at least 2)
  --eviction-hard LIST     hard eviction thresholds, signal<quantity or percentage,
                           comma-separated (default memory.available<100Mi,
                           nodefs.available<10%,imagefs.available<15%,
                           nodefs.inodesFree<5%; a given list replaces it whole)
  --eviction-soft LIST     soft eviction thresholds, in the same form (default none)
  --eviction-soft-grace-period LIST
                           how long each soft threshold must hold before pods are
                           evicted, signal=duration (such as memory.available=1m30s)
  --eviction-minimum-reclaim LIST
                           how far past its threshold a signal must recover before
                           the pressure ends, signal=quantity or percentage
  --eviction-pressure-transition-period DURATION
                           how long a pressure condition stays after its threshold
                           was last met (default 5m0s)
  --eviction-max-pod-grace-period SECONDS
                           the most grace a soft eviction gives a pod (default 0: its own)
  --log-level LEVEL        debug, info, warn or error (default info)
`;

/** The flags of `skiff kubelet` (`skiff node` takes them too, less --runtime-endpoint). */
export const KUBELET_FLAGS = {
  manifests: { type: 'string', default: '/etc/skiff/manifests' },
  'runtime-endpoint': { type: 'string', default: 'unix:///run/skiff/skiff.sock' },
  'status-address': { type: 'string', default: '127.0.0.1:10255' },
  'root-dir': { type: 'string', default: '/var/lib/skiff/kubelet' },
  'node-name': { type: 'string', default: os.hostname().toLowerCase() },
  'node-ip': { type: 'string' },
  'cluster-domain': { type: 'string', default: 'cluster.local' },
  'cluster-dns': { type: 'string', multiple: true, default: [] as string[] },
  'image-gc-high-threshold': { type: 'string', default: '85' },
  'image-gc-low-threshold': { type: 'string', default: '80' },
  'minimum-image-ttl-duration': { type: 'string', default: '2m0s' },
  'max-pods': { type: 'string', default: '110' },
  'allowed-unsafe-sysctls': { type: 'string', multiple: true, default: [] as string[] },
  'container-log-max-size': { type: 'string', default: '10Mi' },
  'container-log-max-files': { type: 'string', default: '5' },
  'eviction-hard': { type: 'string' },
  'eviction-soft': { type: 'string' },
  'eviction-soft-grace-period': { type: 'string' },
  'eviction-minimum-reclaim': { type: 'string' },
  'eviction-pressure-transition-period': { type: 'string' },
  'eviction-max-pod-grace-period': { type: 'string' },
  'log-level': { type: 'string', default: 'info' },
} satisfies FlagSpec;

/** The agent's options from parsed flags, each checked with a message that names the flag. */
export function kubeletOptionsFrom(values: Values, log: Logger): KubeletOptions {
  const str = (k: string) => values[k] as string;
  const percent = (flag: string) => {
    const n = Number(str(flag));
    if (!Number.isInteger(n) || n < 0 || n > 100) throw new Error(`--${flag} must be a percentage from 0 to 100, not "${str(flag)}"`);
    return n;
  };
  const high = percent('image-gc-high-threshold');
  const low = percent('image-gc-low-threshold');
  if (low >= high) throw new Error(`--image-gc-low-threshold (${low}) must be below --image-gc-high-threshold (${high})`);
  const imageMinAgeMs = parseDuration(str('minimum-image-ttl-duration'), '--minimum-image-ttl-duration');
  const maxPods = Number(str('max-pods'));
  if (!Number.isInteger(maxPods) || maxPods < 1 || maxPods > MAX_PODS_AT_ONCE)
    throw new Error(`--max-pods must be a whole number from 1 to ${MAX_PODS_AT_ONCE}, not "${str('max-pods')}"`);
  const allowedUnsafeSysctls = (values['allowed-unsafe-sysctls'] as string[]).flatMap((v) => v.split(',')).map((v) => v.trim()).filter(Boolean);
  new SysctlAllowlist(allowedUnsafeSysctls); // a bad pattern is refused here, naming the flag
  const logMaxSize = tryParseQuantity(str('container-log-max-size'));
  if (logMaxSize === undefined || !Number.isSafeInteger(logMaxSize) || logMaxSize < 1)
    throw new Error(`--container-log-max-size must be a size in bytes such as 10Mi or 50M, not "${str('container-log-max-size')}"`);
  const logMaxFiles = Number(str('container-log-max-files'));
  if (!Number.isInteger(logMaxFiles) || logMaxFiles < 2 || logMaxFiles > 1000)
    throw new Error(`--container-log-max-files must be a whole number from 2 to 1000, not "${str('container-log-max-files')}"`);
  // Not a flag of the kubelet's: tests shorten the monitor period through the environment.
  const monitorMs = Number(process.env.SKIFF_CONTAINER_LOG_MONITOR_MS) || undefined;
  // Not a flag of the kubelet's either: tests shorten the eviction manager's 10 s monitoring period.
  const evictionMonitorMs = Number(process.env.SKIFF_EVICTION_MONITOR_MS) || undefined;
  const eviction = parseEvictionConfig(
    {
      hard: values['eviction-hard'] as string | undefined,
      soft: values['eviction-soft'] as string | undefined,
      softGracePeriod: values['eviction-soft-grace-period'] as string | undefined,
      minimumReclaim: values['eviction-minimum-reclaim'] as string | undefined,
      pressureTransitionPeriod: values['eviction-pressure-transition-period'] as string | undefined,
      maxPodGracePeriod: values['eviction-max-pod-grace-period'] as string | undefined,
    },
    evictionMonitorMs && evictionMonitorMs >= 100 ? evictionMonitorMs : undefined,
  );
  return {
    manifests: str('manifests'),
    runtimeEndpoint: str('runtime-endpoint'),
    statusAddress: str('status-address'),
    rootDir: str('root-dir'),
    nodeName: str('node-name'),
    nodeIP: values['node-ip'] as string | undefined,
    clusterDomain: str('cluster-domain'),
    clusterDNS: values['cluster-dns'] as string[],
    imageGc: { highThresholdPercent: high, lowThresholdPercent: low, minAgeMs: imageMinAgeMs },
    maxPods,
    allowedUnsafeSysctls,
    eviction,
    containerLogs: { maxSize: logMaxSize, maxFiles: logMaxFiles, ...(monitorMs ? { monitorMs } : {}) },
    log,
  };
}

export async function kubelet(args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { ...KUBELET_FLAGS, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false });
  if (values.help) {
    process.stdout.write(KUBELET_HELP);
    return 0;
  }
  const level = values['log-level'] as string;
  if (!isLogLevel(level)) throw new Error(`--log-level must be debug, info, warn or error, not "${level}"`);
  const log = createLogger(level);
  const opts = kubeletOptionsFrom(values, log);
  // The manifests' workloads become Pods through the same controllers and store as on a whole node (not served).
  const plane = await ControlPlane.open({ nodeName: opts.nodeName, rootDir: opts.rootDir, log });
  let running;
  try {
    running = await startKubelet({ ...opts, objects: plane.objects, workloads: () => plane.controllers.workloads(), podNetworkReady: plane.networkPolicies.podReady });
  } catch (err) {
    await plane.stop();
    throw err;
  }
  plane.attach(running);
  await Promise.race([running.agent.settled(), new Promise((r) => setTimeout(r, 5_000).unref())]);
  await plane.startControllers();
  return untilSignal(log, 'kubelet-lite stopping; pods keep running', async () => {
    await plane.stop();
    await running.stop();
  });
}
