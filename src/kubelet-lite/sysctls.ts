/**
 * Which sysctls a pod may set, as the kubelet's sysctl admission decides:
 * the safe set (namespaced, and unable to hurt other pods or the node) is
 * always allowed; any other sysctl only when `--allowed-unsafe-sysctls`
 * names it or a prefix of it (`kernel.msg*`). Only namespaced sysctls can
 * be allowed at all, and a pod on the host's network or IPC namespace may
 * set none of that namespace's: they would change the host.
 */
import type { PodValidation } from './model.js';

type SysctlNamespace = 'ipc' | 'net';

/** The kubelet's safe sysctls (as of Kubernetes 1.32; all need kernels older than this machine's). */
export const SAFE_SYSCTLS = [
  'kernel.shm_rmid_forced',
  'net.ipv4.ip_local_port_range',
  'net.ipv4.tcp_syncookies',
  'net.ipv4.ping_group_range',
  'net.ipv4.ip_unprivileged_port_start',
  'net.ipv4.ip_local_reserved_ports',
  'net.ipv4.tcp_keepalive_time',
  'net.ipv4.tcp_fin_timeout',
  'net.ipv4.tcp_keepalive_intvl',
  'net.ipv4.tcp_keepalive_probes',
  'net.ipv4.tcp_rmem',
  'net.ipv4.tcp_wmem',
] as const;

const SYSCTL_NAME = /^([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?$/;
/** A name, or a prefix ending in `*` (`kernel.msg*`, `fs.mqueue.*`). */
const SYSCTL_PATTERN = /^(([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?\*?|([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])+\*)$/;

/** `net/ipv4/conf/eth0.1/forwarding` → `net.ipv4.conf.eth0/1.forwarding`: slashes separate when the first separator is one. */
export function normalizeSysctlName(name: string): string {
  const dot = name.indexOf('.');
  const slash = name.indexOf('/');
  if (slash < 0 || (dot >= 0 && dot < slash)) return name;
  return name.replace(/[./]/g, (c) => (c === '.' ? '/' : '.'));
}

/** The namespace a sysctl lives in, or undefined for one that is the host's alone. */
function namespaceOf(name: string): SysctlNamespace | undefined {
  if (name === 'kernel.sem' || name.startsWith('kernel.shm') || name.startsWith('kernel.msg') || name.startsWith('fs.mqueue.')) return 'ipc';
  if (name.startsWith('net.')) return 'net';
  return undefined;
}

export class SysctlAllowlist {
  private readonly exact = new Map<string, SysctlNamespace>();
  private readonly prefixes: Array<{ prefix: string; ns: SysctlNamespace }> = [];

  /** `unsafe`: the patterns of `--allowed-unsafe-sysctls`; a bad one throws with the reason. */
  constructor(unsafe: readonly string[] = []) {
    for (const s of SAFE_SYSCTLS) this.exact.set(s, namespaceOf(s)!);
    for (const raw of unsafe) {
      const p = normalizeSysctlName(raw);
      if (!SYSCTL_PATTERN.test(p)) throw new Error(`--allowed-unsafe-sysctls: "${raw}" is not a sysctl name or a prefix ending in *`);
      const ns = namespaceOf(p.endsWith('*') ? p.slice(0, -1) : p);
      if (!ns) throw new Error(`--allowed-unsafe-sysctls: "${raw}" is not a namespaced sysctl and can never be set for one pod`);
      if (p.endsWith('*')) this.prefixes.push({ prefix: p.slice(0, -1), ns });
      else this.exact.set(p, ns);
    }
  }

  /** Why the pod may not run here (the kubelet's SysctlForbidden message), or undefined. */
  forbidden(sysctls: ReadonlyArray<{ name?: string }>, host: { network: boolean; ipc: boolean }): string | undefined {
    for (const s of sysctls) {
      const name = normalizeSysctlName(s.name ?? '');
      const ns = this.exact.get(name) ?? this.prefixes.find((p) => name.startsWith(p.prefix))?.ns;
      if (!ns || !SYSCTL_NAME.test(name)) return `forbidden sysctl: "${s.name}" not allowlisted`;
      if (ns === 'net' && host.network) return `forbidden sysctl: "${s.name}" not allowed with host net enabled`;
      if (ns === 'ipc' && host.ipc) return `forbidden sysctl: "${s.name}" not allowed with host ipc enabled`;
    }
    return undefined;
  }
}

/** A valid pod the kubelet's sysctl admission refuses becomes an unrunnable one (reason SysctlForbidden). */
export function admitPod(v: PodValidation, allow: SysctlAllowlist): PodValidation {
  if (!v.ok) return v;
  const spec = v.pod.spec;
  const why = allow.forbidden(spec?.securityContext?.sysctls ?? [], { network: spec?.hostNetwork === true, ipc: spec?.hostIPC === true });
  return why ? { ok: false, reasons: [why], reason: 'SysctlForbidden' } : v;
}
