/** The `skiff` command line. */
import path from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';

export type FlagSpec = NonNullable<ParseArgsConfig['options']>;
import { installCrashGuard, startDaemon, type DaemonOptions } from '../daemon.js';
import { errorMessage } from '../errors.js';
import { KUBECTL_HELP, runKubectl } from './kubectl.js';
import { KUBELET_HELP, kubelet } from './kubelet.js';
import { NODE_HELP, node } from './node.js';
import { PROXY_HELP, proxy } from './proxy.js';
import { imagesCommand } from './images.js';
import { createLogger, isLogLevel, type LogLevel } from '../log.js';
import { SKIFF_VERSION } from '../version.js';

const HELP = `skiff ${SKIFF_VERSION}: a small Kubernetes container runtime (CRI v1)

Usage:
  skiff node [flags]    a whole node in one process: the runtime, the agent (pods, workloads) and
                        the service proxy with service DNS, running a directory of manifests
  skiff cri [flags]     serve the CRI runtime and image services on a Unix socket
  skiff kubelet [flags] run pods from Kubernetes manifests in a directory (the node agent alone)
  skiff proxy [flags]   program Services from the manifest directory as iptables rules, and serve
                        service DNS (kube-proxy's job); skiff proxy --cleanup removes the rules
  skiff images import FILE... | ls | rm REF... | pull REF
                        the running daemon's images: load OCI or docker save archives, list,
                        remove, pull with progress (skiff images --help)
  skiff version         print the version
  skiff help            show this help

${KUBECTL_HELP}
Flags for "skiff cri":
  --socket PATH            CRI socket to serve (default /run/skiff/skiff.sock)
  --root DIR               persistent state: images, snapshots, metadata (default /var/lib/skiff)
  --state DIR              per-boot state (default /run/skiff)
  --registry-config DIR    registry hosts in containerd's certs.d/<host>/hosts.toml layout
                           (default /etc/skiff/certs.d; a missing directory means defaults)
  --pinned-image REF       an image reported as pinned, so the kubelet never collects it (repeatable)
  --cni-conf-dir DIR       CNI network configs (default /etc/cni/net.d; none there means skiff's own
                           bridge + host-local + portmap network)
  --cni-bin-dir DIR        CNI plugin directory, searched in order (repeatable; default /usr/lib/cni, /opt/cni/bin)
  --pod-cidr CIDR          pod addresses for skiff's own network (default 10.88.0.0/16)
  --cni-bridge NAME        the bridge of skiff's own network (default "skiff" + 8 hex digits of a
                           hash of --root, so two daemons on one host get two bridges)
  --infra-binary PATH      the pod infra process, run as "PATH -P" (default /usr/bin/catatonit)
  --stream-address ADDR    where exec, attach and port-forward URLs are served (default 127.0.0.1)
  --stream-port PORT       their port; 0 picks a free one (default 0)
  --image-pull-progress-timeout DURATION
                           fail a registry download that receives nothing for this long, e.g. 30s, 5m
                           (default 5m; 0 never)
  --stream-idle-timeout D  close a streaming session with no traffic either way for D
                           (e.g. 90s, 30m, 4h; default 4h, as the kubelet)
  --images-dir DIR         image archives (.tar, .tar.gz, .tar.zst: OCI layout or docker save) imported
                           at start and whenever one is added (default <root>/images, so
                           /var/lib/skiff/images; "" for none)
  --log-level LEVEL        debug, info, warn or error (default info)

${KUBELET_HELP}
${PROXY_HELP}
Point crictl at it:
  crictl --runtime-endpoint unix:///run/skiff/skiff.sock --image-endpoint unix:///run/skiff/skiff.sock images
`;

/** The flags of `skiff cri` (and of `skiff node`, which takes them all). */
export const CRI_FLAGS = {
  socket: { type: 'string', default: '/run/skiff/skiff.sock' },
  root: { type: 'string', default: '/var/lib/skiff' },
  state: { type: 'string', default: '/run/skiff' },
  'registry-config': { type: 'string', default: '/etc/skiff/certs.d' },
  'pinned-image': { type: 'string', multiple: true, default: [] as string[] },
  'log-level': { type: 'string', default: 'info' },
  'cni-conf-dir': { type: 'string', default: '/etc/cni/net.d' },
  'cni-bin-dir': { type: 'string', multiple: true, default: ['/usr/lib/cni', '/opt/cni/bin'] as string[] },
  'pod-cidr': { type: 'string', default: '10.88.0.0/16' },
  'cni-bridge': { type: 'string' },
  'infra-binary': { type: 'string', default: '/usr/bin/catatonit' },
  'stream-address': { type: 'string', default: '127.0.0.1' },
  'stream-port': { type: 'string', default: '0' },
  'image-pull-progress-timeout': { type: 'string', default: '5m' },
  'stream-idle-timeout': { type: 'string', default: '4h' },
  'images-dir': { type: 'string' },
} satisfies FlagSpec;

export type Values = Record<string, string | boolean | (string | boolean)[] | undefined>;

/** The daemon's options from parsed `skiff cri` flags, each checked with a message that names the flag. */
export function daemonOptionsFrom(values: Values): DaemonOptions & { logLevel: LogLevel } {
  const str = (k: string) => values[k] as string;
  const level = str('log-level');
  if (!isLogLevel(level)) throw new Error(`--log-level must be debug, info, warn or error, not "${level}"`);
  const streamPort = Number(str('stream-port'));
  if (!Number.isInteger(streamPort) || streamPort < 0 || streamPort > 65535) throw new Error(`--stream-port must be a port number, not "${str('stream-port')}"`);
  const progressTimeout = parseDuration(str('image-pull-progress-timeout'));
  if (progressTimeout === undefined) throw new Error(`--image-pull-progress-timeout must be a duration such as 30s or 5m, not "${str('image-pull-progress-timeout')}"`);
  const cidr = str('pod-cidr');
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/.exec(cidr);
  if (!m || m.slice(1, 5).some((o) => Number(o) > 255) || Number(m[5]) > 30) throw new Error(`--pod-cidr must be an IPv4 CIDR with room for pods (at most /30), not "${cidr}"`);
  const streamIdleTimeoutMs = parseDuration(str('stream-idle-timeout'));
  if (streamIdleTimeoutMs === undefined || streamIdleTimeoutMs <= 0) throw new Error(`--stream-idle-timeout must be a positive duration such as 90s, 30m or 4h, not "${str('stream-idle-timeout')}"`);
  return {
    logLevel: level,
    socket: str('socket'),
    root: str('root'),
    state: str('state'),
    registryConfig: str('registry-config'),
    pinnedImages: values['pinned-image'] as string[],
    cniConfDir: str('cni-conf-dir'),
    cniBinDirs: (values['cni-bin-dir'] as string[]).flatMap((d) => d.split(':')).filter(Boolean),
    podCidr: cidr,
    cniBridge: values['cni-bridge'] as string | undefined,
    infraBinary: str('infra-binary'),
    streamAddress: str('stream-address'),
    streamPort,
    imagePullProgressTimeoutMs: progressTimeout,
    streamIdleTimeoutMs,
    imagesDir: (values['images-dir'] as string | undefined) ?? path.join(str('root'), 'images'),
  };
}

async function cri(args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { ...CRI_FLAGS, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false });
  if (values.help) {
    process.stdout.write(HELP);
    return 0;
  }
  const opts = daemonOptionsFrom(values);
  const level = opts.logLevel;
  const log = createLogger(level);
  installCrashGuard(log);
  if (process.getuid?.() !== 0) log.warn('skiff cri is not running as root: unpacking layers with their owners and devices will fail');
  const daemon = await startDaemon(
    opts,
    log,
  );
  return new Promise<number>((resolve) => {
    const stop = (signal: string) => {
      log.info('shutting down', { signal });
      daemon.close().then(
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

/** Go-style durations as containerd's config takes them: `1h30m`, `5m`, `30s`, `500ms`, or `0`. */
export function parseDuration(s: string): number | undefined {
  if (s.trim() === '0') return 0;
  const unit: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let total = 0;
  const re = /(\d+(?:\.\d+)?)(ms|s|m|h)/gy;
  let m: RegExpExecArray | null;
  let end = 0;
  while ((m = re.exec(s))) {
    total += Number(m[1]) * unit[m[2]!]!;
    end = re.lastIndex;
  }
  if (end === 0 || end !== s.length || !Number.isFinite(total)) return undefined;
  return Math.round(total);
}

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'cri':
      return cri(rest);
    case 'node':
      return node(rest);
    case 'kubelet':
      return kubelet(rest);
    case 'proxy':
      return proxy(rest);
    case 'get':
    case 'rollout':
    case 'describe':
    case 'logs':
    case 'exec':
      return (await runKubectl(cmd, rest))!;
    case 'images':
      return imagesCommand(rest);
    case 'version':
    case '--version':
      process.stdout.write(`skiff ${SKIFF_VERSION}\n`);
      return 0;
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(HELP);
      return 0;
    default:
      process.stderr.write(`skiff: unknown command "${cmd}"\n\n${HELP}`);
      return 2;
  }
}
