/** `skiff kubelet`: the node agent alone, against any CRI endpoint. */
import os from 'node:os';
import { parseArgs } from 'node:util';
import { errorMessage } from '../errors.js';
import { startKubelet } from '../kubelet-lite/run.js';
import { createLogger, isLogLevel } from '../log.js';

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
  --log-level LEVEL        debug, info, warn or error (default info)
`;

export async function kubelet(args: string[]): Promise<number> {
  const { values } = parseArgs({
    args,
    options: {
      manifests: { type: 'string', default: '/etc/skiff/manifests' },
      'runtime-endpoint': { type: 'string', default: 'unix:///run/skiff/skiff.sock' },
      'status-address': { type: 'string', default: '127.0.0.1:10255' },
      'root-dir': { type: 'string', default: '/var/lib/skiff/kubelet' },
      'node-name': { type: 'string', default: os.hostname().toLowerCase() },
      'node-ip': { type: 'string' },
      'cluster-domain': { type: 'string', default: 'cluster.local' },
      'cluster-dns': { type: 'string', multiple: true, default: [] },
      'image-gc-high-threshold': { type: 'string', default: '85' },
      'image-gc-low-threshold': { type: 'string', default: '80' },
      'log-level': { type: 'string', default: 'info' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) {
    process.stdout.write(KUBELET_HELP);
    return 0;
  }
  const level = values['log-level']!;
  if (!isLogLevel(level)) throw new Error(`--log-level must be debug, info, warn or error, not "${level}"`);
  const percent = (flag: string, v: string) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 0 || n > 100) throw new Error(`--${flag} must be a percentage from 0 to 100, not "${v}"`);
    return n;
  };
  const high = percent('image-gc-high-threshold', values['image-gc-high-threshold']!);
  const low = percent('image-gc-low-threshold', values['image-gc-low-threshold']!);
  if (low >= high) throw new Error(`--image-gc-low-threshold (${low}) must be below --image-gc-high-threshold (${high})`);
  const log = createLogger(level);
  const running = await startKubelet({
    manifests: values.manifests!,
    runtimeEndpoint: values['runtime-endpoint']!,
    statusAddress: values['status-address']!,
    rootDir: values['root-dir']!,
    nodeName: values['node-name']!,
    nodeIP: values['node-ip'],
    clusterDomain: values['cluster-domain']!,
    clusterDNS: values['cluster-dns']!,
    imageGc: { highThresholdPercent: high, lowThresholdPercent: low },
    log,
  });
  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      log.info('kubelet-lite stopping; pods keep running', { signal });
      running.stop().then(
        () => resolve(0),
        (err) => {
          log.error('shutdown failed', { error: errorMessage(err) });
          resolve(1);
        },
      );
    };
    process.once('SIGTERM', () => stop('SIGTERM'));
    process.once('SIGINT', () => stop('SIGINT'));
  });
}
