/** The `skiff` command line. */
import path from 'node:path';
import { parseArgs } from 'node:util';
import { CRI_FLAGS, daemonOptionsFrom } from './flags.js';

export { parseDuration } from './flags.js';

import { createLogger } from '../log.js';
import { untilSignal } from './signals.js';
import { SKIFF_VERSION } from '../version.js';

// Each command's modules are imported when that command runs: a `skiff cri` daemon never
// loads the agent, the proxy, kubectl's printers or their libraries (YAML, metrics, DNS,
// WebSocket client), which would stay in its memory for its whole life.

/** The whole help text; it quotes every command's flags, so it loads every command. */
async function helpText(): Promise<string> {
  const [{ KUBECTL_HELP }, { KUBELET_HELP }, { PROXY_HELP }] = await Promise.all([import('./kubectl.js'), import('./kubelet.js'), import('./proxy.js')]);
  return `skiff ${SKIFF_VERSION}: a small Kubernetes container runtime (CRI v1)

Usage:
  skiff node [flags]    a whole node in one process: the runtime, the agent (pods, workloads) and
                        the service proxy with service DNS, running a directory of manifests
  skiff cri [flags]     serve the CRI runtime and image services on a Unix socket
  skiff kubelet [flags] run pods from Kubernetes manifests in a directory (the node agent alone)
  skiff proxy [flags]   program Services from the manifest directory as iptables (or, with
                        --proxy-mode nftables, nftables) rules, and serve service DNS
                        (kube-proxy's job); skiff proxy --cleanup removes the rules
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
  --idle-release-after D   after D with no call that changes something (polls do not count), give
                           back memory held but unused (default 5s; 0 never)
  --log-size-max SIZE      conmon starts a container's log afresh (dropping what it held) when a
                           write would take it past SIZE: a backstop between the agent's log
                           rotations (default 0, none; "skiff node" sets twice
                           --container-log-max-size)
  --log-level LEVEL        debug, info, warn or error (default info)

${KUBELET_HELP}
${PROXY_HELP}
Point crictl at it:
  crictl --runtime-endpoint unix:///run/skiff/skiff.sock --image-endpoint unix:///run/skiff/skiff.sock images
`;
}

async function cri(args: string[]): Promise<number> {
  const { values } = parseArgs({ args, options: { ...CRI_FLAGS, help: { type: 'boolean', short: 'h' } }, strict: true, allowPositionals: false });
  if (values.help) {
    process.stdout.write(await helpText());
    return 0;
  }
  const opts = daemonOptionsFrom(values);
  const level = opts.logLevel;
  const log = createLogger(level);
  const { installCrashGuard, startDaemon } = await import('../daemon.js');
  installCrashGuard(log);
  if (process.getuid?.() !== 0) log.warn('skiff cri is not running as root: unpacking layers with their owners and devices will fail');
  const daemon = await startDaemon(
    opts,
    log,
  );
  return untilSignal(log, 'shutting down', () => daemon.close());
}

export async function main(argv: string[]): Promise<number> {
  const [cmd, ...rest] = argv;
  switch (cmd) {
    case 'cri':
      return cri(rest);
    case 'node':
      return (await import('./node.js')).node(rest);
    case 'kubelet':
      return (await import('./kubelet.js')).kubelet(rest);
    case 'proxy':
      return (await import('./proxy.js')).proxy(rest);
    case 'get':
    case 'rollout':
    case 'describe':
    case 'logs':
    case 'exec':
      return (await (await import('./kubectl.js')).runKubectl(cmd, rest))!;
    case 'images':
      return (await import('./images.js')).imagesCommand(rest);
    case 'version':
    case '--version':
      process.stdout.write(`skiff ${SKIFF_VERSION}\n`);
      return 0;
    case undefined:
    case 'help':
    case '--help':
    case '-h':
      process.stdout.write(await helpText());
      return 0;
    default:
      process.stderr.write(`skiff: unknown command "${cmd}"\n\n${await helpText()}`);
      return 2;
  }
}
