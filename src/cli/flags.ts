/** Flag definitions and their checks, shared by `skiff cri`, `kubelet`, `proxy` and `node`. */
import path from 'node:path';
import type { ParseArgsConfig } from 'node:util';
import type { DaemonOptions } from '../daemon.js';
import { isLogLevel, type LogLevel } from '../log.js';

export type FlagSpec = NonNullable<ParseArgsConfig['options']>;

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
  'idle-release-after': { type: 'string', default: '5s' },
  'log-size-max': { type: 'string', default: '0' },
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
  const idleReleaseAfterMs = parseDuration(str('idle-release-after'));
  if (idleReleaseAfterMs === undefined) throw new Error(`--idle-release-after must be a duration such as 5s or 1m (0: never), not "${str('idle-release-after')}"`);
  const streamIdleTimeoutMs = parseDuration(str('stream-idle-timeout'));
  if (streamIdleTimeoutMs === undefined || streamIdleTimeoutMs <= 0) throw new Error(`--stream-idle-timeout must be a positive duration such as 90s, 30m or 4h, not "${str('stream-idle-timeout')}"`);
  const logSizeMax = parseSize(str('log-size-max'));
  if (logSizeMax === undefined) throw new Error(`--log-size-max must be a size in bytes such as 20Mi or 0 (no cap), not "${str('log-size-max')}"`);
  return {
    logLevel: level,
    containerLogSizeMax: logSizeMax,
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
    idleReleaseAfterMs,
    imagesDir: (values['images-dir'] as string | undefined) ?? path.join(str('root'), 'images'),
  };
}

/** A size: bytes, or with a suffix as Kubernetes quantities have them (`20Mi`, `50M`, `1Gi`). */
export function parseSize(s: string): number | undefined {
  const m = /^(\d{1,15})(Ki|Mi|Gi|k|M|G)?$/.exec(s);
  if (!m) return undefined;
  const unit = { Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, k: 1e3, M: 1e6, G: 1e9 }[m[2] ?? ''] ?? 1;
  const n = Number(m[1]) * unit;
  return Number.isSafeInteger(n) ? n : undefined;
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

