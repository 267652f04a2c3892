/**
 * A pod's resolver configuration from its dnsPolicy and dnsConfig, as the
 * kubelet's network/dns package builds it: cluster DNS with the namespace's
 * search path, the host's resolv.conf, or only what the pod says.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { DNSConfig } from '../gen/runtime/v1/DNSConfig.js';

export const MAX_NAMESERVERS = 3;
export const MAX_SEARCH_PATHS = 32;
export const MAX_SEARCH_LINE_CHARS = 2048;
const MAX_SEARCH_DOMAIN_LEN = 253;

export interface ResolvConf {
  servers: string[];
  searches: string[];
  options: string[];
}

/** Reads resolv.conf text: nameservers, the last search line, options (a later option of the same name wins). */
export function parseResolvConf(text: string): ResolvConf {
  const out: ResolvConf = { servers: [], searches: [], options: [] };
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (!line || line.startsWith('#') || line.startsWith(';')) continue;
    const fields = line.split(/\s+/);
    switch (fields[0]) {
      case 'nameserver':
        if (fields[1]) out.servers.push(fields[1]);
        break;
      case 'search':
        out.searches = fields
          .slice(1)
          .filter((s) => s !== '.')
          .map((s) => s.replace(/\.$/, ''));
        break;
      case 'options':
        out.options = mergeOptions(out.options, fields.slice(1).map(splitOption));
        break;
    }
  }
  return out;
}

function splitOption(o: string): { name: string; value?: string } {
  const i = o.indexOf(':');
  return i < 0 ? { name: o } : { name: o.slice(0, i), value: o.slice(i + 1) };
}

/** Options merged by name: a new value replaces the old one where it stood. */
function mergeOptions(existing: string[], extra: Array<{ name?: string; value?: string }>): string[] {
  const m = new Map<string, string>();
  for (const o of existing) {
    const { name, value } = splitOption(o);
    m.set(name, value ?? '');
  }
  for (const o of extra) if (o.name) m.set(o.name, o.value ?? '');
  return [...m].map(([k, v]) => (v ? `${k}:${v}` : k));
}

function unique(xs: string[]): string[] {
  return [...new Set(xs)];
}

export type DnsType = 'cluster' | 'host' | 'none';

/** ClusterFirst on the host's network means Default, unless the pod asked for ClusterFirstWithHostNet. */
export function dnsType(pod: Pod): DnsType {
  switch (pod.spec?.dnsPolicy ?? 'ClusterFirst') {
    case 'None':
      return 'none';
    case 'ClusterFirstWithHostNet':
      return 'cluster';
    case 'Default':
      return 'host';
    default:
      return pod.spec?.hostNetwork ? 'host' : 'cluster';
  }
}

/** Search paths cut to what resolvers take: 32 paths, none longer than a DNS name, 2048 characters in all. */
function fitSearches(searches: string[]): string[] {
  let s = searches.slice(0, MAX_SEARCH_PATHS).filter((d) => d.length <= MAX_SEARCH_DOMAIN_LEN);
  while (s.length && s.join(' ').length > MAX_SEARCH_LINE_CHARS) s = s.slice(0, -1);
  return s;
}

export interface DnsInputs {
  clusterDomain: string;
  clusterDNS: string[];
  hostResolvConf: string;
}

export function podDnsConfig(pod: Pod, inputs: DnsInputs): DNSConfig {
  const host = parseResolvConf(inputs.hostResolvConf);
  let cfg: ResolvConf;
  let type = dnsType(pod);
  // ClusterFirst without a cluster DNS server to point at falls back to the host's, as the kubelet does.
  if (type === 'cluster' && inputs.clusterDNS.length === 0) type = 'host';
  switch (type) {
    case 'none':
      cfg = { servers: [], searches: [], options: [] };
      break;
    case 'host':
      cfg = host;
      break;
    case 'cluster': {
      const ns = pod.metadata?.namespace || 'default';
      const d = inputs.clusterDomain;
      const cluster = d ? [`${ns}.svc.${d}`, `svc.${d}`, d] : [];
      cfg = { servers: [...inputs.clusterDNS], searches: unique([...cluster, ...host.searches]), options: ['ndots:5'] };
      break;
    }
  }
  const extra = pod.spec?.dnsConfig;
  if (extra) {
    cfg = {
      servers: unique([...cfg.servers, ...(extra.nameservers ?? [])]),
      searches: unique([...cfg.searches, ...(extra.searches ?? [])]),
      options: mergeOptions(cfg.options, extra.options ?? []),
    };
  }
  return { servers: cfg.servers.slice(0, MAX_NAMESERVERS), searches: fitSearches(cfg.searches), options: cfg.options };
}
