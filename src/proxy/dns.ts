/**
 * Service DNS: a small server on the node answering for the cluster domain
 * from the proxy's view of Services and pods, and forwarding every other
 * name to the host's resolvers. dns-packet is the wire codec; this file only
 * decides answers and bounds what a client can make it do.
 */
import { randomBytes, randomInt } from 'node:crypto';
import dgram from 'node:dgram';
import net from 'node:net';
import os from 'node:os';
import dnsPacket, { type Answer, type Packet, type Question } from 'dns-packet';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { PodIndex, podAddress, resolveTargetPort, selectedPods, type SliceLike } from './endpoints.js';
import { encodeResponse, rawQuestion, type RawQuestion } from './dns-wire.js';
import { cidrContains, intToIp, ipToInt, parseCidr, type Cidr, type ServiceInfo } from './service.js';

export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
const TTL = 5;
/** Largest query accepted (UDP datagram or TCP message); real queries are well under 512 bytes. */
export const MAX_QUERY_BYTES = 4096;
const UDP_PLAIN_LIMIT = 512;
/** The largest UDP answer sent, whatever buffer a client advertises; also what the OPT record advertises. */
const MAX_UDP_ANSWER = 4096;
const OPT_ANSWER = { type: 'OPT', name: '.', udpPayloadSize: MAX_UDP_ANSWER, flags: 0 } as unknown as Answer;

/** What DNS answers from: the Services as the proxier last resolved them, and the pods. */
export interface DnsView {
  services(): ServiceInfo[];
  pods(): Pod[];
  /** A Service's EndpointSlices, when endpoints come from them: headless names are then read there (hostname, ready). */
  slicesOf?(namespace: string, name: string): SliceLike[];
}

export type Decision = { kind: 'answer'; packet: Packet } | { kind: 'forward' };

const rcodeFlags = (rcode: number, q: Packet) => (rcode & 0xf) | ((q.flags ?? 0) & dnsPacket.RECURSION_DESIRED) | dnsPacket.RECURSION_AVAILABLE;

function reply(q: Packet, rcode: number, answers: Answer[] = [], extra: Partial<Packet> = {}): Packet {
  return {
    type: 'response',
    id: q.id,
    flags: rcodeFlags(rcode, q) | (rcode === RCODE.NOERROR || rcode === RCODE.NXDOMAIN ? dnsPacket.AUTHORITATIVE_ANSWER : 0),
    questions: q.questions,
    answers,
    authorities: extra.authorities ?? [],
    additionals: extra.additionals ?? [],
  };
}

/** The zone's SOA, for negative answers; `apex` is the zone it is for (the cluster domain or a reverse zone). */
function soa(apex: string, clusterDomain: string): Answer {
  return {
    type: 'SOA',
    name: apex,
    ttl: TTL,
    class: 'IN',
    data: { mname: `ns.dns.${clusterDomain}`, rname: `hostmaster.${clusterDomain}`, serial: 1, refresh: 7200, retry: 1800, expire: 86400, minimum: TTL },
  };
}

const dashed = (ip: string) => ip.replace(/\./g, '-');

/** The schema of the Kubernetes DNS-Based Service Discovery specification this server follows. */
export const DNS_SCHEMA_VERSION = '1.0.1';

/**
 * `<a-b-c-d>.<ns>.pod.<zone>`: "verified" answers only for the address of a pod that runs in that
 * namespace (as CoreDNS's `pods verified`); "insecure" for any address (kube-dns, `pods insecure`).
 */
export type PodRecords = 'verified' | 'insecure';

export interface ZoneOptions {
  /**
   * The address ranges whose reverse names (`<d>.<c>.<b>.<a>.in-addr.arpa`) are answered here with
   * authority, NXDOMAIN when unknown, never forwarded: the service and pod CIDRs. Reverse names of
   * cluster IPs and headless endpoints outside them are answered too; other reverse names are forwarded.
   */
  reverse?: Cidr[];
  pods?: PodRecords;
}

/**
 * Decides the answer to one query, purely. Names in the cluster domain are
 * answered (NXDOMAIN when unknown), and the reverse names of cluster IPs,
 * headless endpoints and the CIDRs in `zone.reverse`; anything else is forwarded.
 */
export function decide(q: Packet, view: DnsView, domain: string, zone: ZoneOptions = {}): Decision {
  const question = q.questions?.[0] as Question | undefined;
  if (!question || (q.questions?.length ?? 0) !== 1) return { kind: 'answer', packet: reply(q, RCODE.FORMERR) };
  const name = question.name.toLowerCase().replace(/\.$/, '');
  const cluster = domain.toLowerCase();
  const inCluster = name === cluster || name.endsWith(`.${cluster}`);
  const rev = inCluster ? undefined : reverseLookup(name, view, cluster, zone.reverse ?? []);
  if (!inCluster && !rev) return { kind: 'forward' };
  if (question.class !== 'IN' && question.class !== undefined) return { kind: 'answer', packet: reply(q, RCODE.NOTIMP) };
  let found: Found | undefined;
  let apex = cluster;
  if (rev) {
    apex = rev.apex;
    found = rev.names.length ? { ...NONE, ptr: rev.names } : undefined;
  } else {
    const labels = name === cluster ? [] : name.slice(0, -(cluster.length + 1)).split('.');
    found = lookup(labels, view, cluster, zone.pods ?? 'verified');
  }
  if (!found) return { kind: 'answer', packet: reply(q, RCODE.NXDOMAIN, [], { authorities: [soa(apex, cluster)] }) };
  const wanted = question.type as string;
  const any = wanted === 'ANY' || wanted === '*';
  const answers: Answer[] = [];
  const additionals: Answer[] = [];
  const rr = (type: 'A' | 'PTR' | 'TXT' | 'CNAME', data: string) => ({ type, name: question.name, ttl: TTL, class: 'IN', data }) as Answer;
  if (found.cname) {
    // An ExternalName Service: its name is an alias, whatever type is asked; the client's resolver follows it (CoreDNS answers so).
    return { kind: 'answer', packet: reply(q, RCODE.NOERROR, [rr('CNAME', found.cname)]) };
  }
  if (wanted === 'A' || any) for (const ip of found.a) answers.push(rr('A', ip));
  if (wanted === 'PTR' || any) for (const target of found.ptr) answers.push(rr('PTR', target));
  if (wanted === 'TXT' || any) for (const text of found.txt) answers.push(rr('TXT', text));
  if (wanted === 'SRV' || any) {
    const glue = new Set<string>();
    for (const s of found.srv) {
      answers.push({ type: 'SRV', name: question.name, ttl: TTL, class: 'IN', data: { priority: 0, weight: Math.floor(100 / found.srv.length) || 1, port: s.port, target: s.target } });
      for (const ip of s.ips) {
        if (glue.has(`${s.target}/${ip}`)) continue;
        glue.add(`${s.target}/${ip}`);
        additionals.push({ type: 'A', name: s.target, ttl: TTL, class: 'IN', data: ip });
      }
    }
  }
  // A name that exists without records of this type: NOERROR with no answers (NODATA), and the SOA.
  return { kind: 'answer', packet: reply(q, RCODE.NOERROR, answers, { additionals, authorities: answers.length ? [] : [soa(apex, cluster)] }) };
}

interface Found {
  /** An ExternalName Service's target: the name is a CNAME, with no records of its own. */
  cname?: string;
  a: string[];
  srv: Array<{ port: number; target: string; ips: string[] }>;
  ptr: string[];
  txt: string[];
}

const NONE: Found = { a: [], srv: [], ptr: [], txt: [] };

/** Per-snapshot lookups, so a query costs a map lookup, not a walk over 10,000 Services or 30,000 pods. */
const serviceMaps = new WeakMap<ServiceInfo[], { byName: Map<string, ServiceInfo>; namespaces: Set<string> }>();
const podIndexes = new WeakMap<Pod[], { index: PodIndex; byIP: Map<string, Pod[]> }>();
/** Address → the names it has (cluster IPs, headless endpoints), per Service snapshot, for its pods and zone. */
const reverseMaps = new WeakMap<ServiceInfo[], { pods: Pod[]; zone: string; names: Map<string, string[]> }>();

function servicesOf(view: DnsView) {
  const list = view.services();
  let m = serviceMaps.get(list);
  if (!m) {
    m = { byName: new Map(list.map((s) => [`${s.namespace}/${s.name}`, s])), namespaces: new Set(list.map((s) => s.namespace)) };
    serviceMaps.set(list, m);
  }
  return m;
}

function podsOf(view: DnsView) {
  const list = view.pods();
  let m = podIndexes.get(list);
  if (!m) {
    const byIP = new Map<string, Pod[]>();
    for (const p of list) {
      const ip = podAddress(p);
      if (ip) byIP.set(ip, [...(byIP.get(ip) ?? []), p]);
    }
    m = { index: new PodIndex(list), byIP };
    podIndexes.set(list, m);
  }
  return m;
}

/** A DNS label as Kubernetes validates a hostname (RFC 1123), lower-cased; undefined when it is not one. */
function hostLabel(text: string | undefined): string | undefined {
  const l = text?.toLowerCase();
  return l && l.length <= 63 && /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(l) ? l : undefined;
}

/** A ready endpoint of a headless Service and the label that names it under the Service. */
interface NamedEndpoint {
  /** The endpoint's port for a service port (a named targetPort resolves per pod), or undefined. */
  port(sp: ServiceInfo['ports'][number]): number | undefined;
  ip: string;
  /**
   * The spec's _hostname_: the pod's `hostname` when its `subdomain` is this Service (as the
   * EndpointSlice controller sets the endpoint's hostname), else its address dashed.
   */
  label: string;
}

function headlessEndpoints(svc: ServiceInfo, view: DnsView): NamedEndpoint[] {
  const out: NamedEndpoint[] = [];
  if (view.slicesOf) {
    // The endpoint-slice controller already set hostname (the pod's, when its subdomain is this Service) and ready.
    for (const slice of view.slicesOf(svc.namespace, svc.name)) {
      if (slice.addressType !== 'IPv4') continue;
      const ports = slice.ports ?? [];
      const port = (sp: ServiceInfo['ports'][number]) => ports.find((p) => (p.name ?? '') === sp.portName && (p.protocol ?? 'TCP') === sp.protocol)?.port;
      for (const e of slice.endpoints ?? []) {
        const ip = e.addresses?.[0];
        if (!ip || !net.isIPv4(ip) || e.conditions?.ready === false) continue;
        out.push({ ip, port, label: hostLabel(e.hostname) ?? dashed(ip) });
      }
    }
    return out;
  }
  for (const pod of selectedPods(svc, podsOf(view).index)) {
    const ip = podAddress(pod);
    if (!ip) continue;
    const host = pod.spec?.subdomain?.toLowerCase() === svc.name.toLowerCase() ? hostLabel(pod.spec?.hostname) : undefined;
    out.push({ ip, label: host ?? dashed(ip), port: (sp) => resolveTargetPort(sp, pod) });
  }
  return out;
}

function lookup(labels: string[], view: DnsView, zone: string, pods: PodRecords): Found | undefined {
  // Structure-only names (the zone, "svc", "<ns>.svc", "pod") exist, with no records.
  if (labels.length === 0 || (labels.length === 1 && (labels[0] === 'svc' || labels[0] === 'pod'))) return NONE;
  if (labels.length === 1 && labels[0] === 'dns-version') return { ...NONE, txt: [DNS_SCHEMA_VERSION] };
  const kind = labels[labels.length - 1];
  if (kind === 'pod' && labels.length === 3) {
    const [ipDashed, ns] = labels as [string, string];
    const ip = ipDashed.replace(/-/g, '.');
    if (pods === 'insecure') return net.isIPv4(ip) && dashed(ip) === ipDashed ? { ...NONE, a: [ip] } : undefined;
    const exists = (podsOf(view).byIP.get(ip) ?? []).some((p) => (p.metadata?.namespace ?? 'default') === ns && !p.spec?.hostNetwork);
    return exists ? { ...NONE, a: [ip] } : undefined;
  }
  if (kind !== 'svc') return undefined;
  if (labels.length === 2) {
    const ns = labels[0];
    return servicesOf(view).namespaces.has(ns!) ? NONE : undefined;
  }
  const svcLabelIndex = labels.length - 3;
  if (svcLabelIndex < 0) return undefined;
  const svcName = labels[svcLabelIndex]!;
  const ns = labels[svcLabelIndex + 1]!;
  const svc = servicesOf(view).byName.get(`${ns}/${svcName}`);
  if (!svc) return undefined;
  const svcFqdn = `${svcName}.${ns}.svc.${zone}`;
  if (svc.externalName !== undefined) return svcLabelIndex === 0 ? { ...NONE, cname: svc.externalName } : undefined;
  const endpoints = svc.headless ? headlessEndpoints(svc, view) : [];
  // A headless Service without ready endpoints has no records, so its name does not exist (the
  // spec's SHOULD for A), and no name below it does either (RFC 8020): NXDOMAIN for every type.
  if (svc.headless && endpoints.length === 0) return undefined;
  const prefix = labels.slice(0, svcLabelIndex);
  if (prefix.length === 0) {
    // <svc>.<ns>.svc: A = cluster IP (headless: the ready pods); SRV = every named port.
    const a = svc.headless ? [...new Set(endpoints.map((e) => e.ip))].sort() : svc.clusterIP ? [svc.clusterIP] : [];
    const srv = svc.ports.filter((p) => p.portName).flatMap((p) => srvFor(svc, p, endpoints, svcFqdn));
    return { ...NONE, a, srv };
  }
  if (prefix.length === 1 && svc.headless) {
    // <hostname>.<svc>.<ns>.svc: the endpoints of that name, one A record per address.
    const a = [...new Set(endpoints.filter((e) => e.label === prefix[0]).map((e) => e.ip))].sort();
    return a.length ? { ...NONE, a } : undefined;
  }
  if (prefix.length === 2 && prefix[0]!.startsWith('_') && prefix[1]!.startsWith('_')) {
    // _<port>._<proto>.<svc>.<ns>.svc
    const portName = prefix[0]!.slice(1);
    const proto = prefix[1]!.slice(1).toUpperCase();
    const sp = svc.ports.find((p) => p.portName === portName && p.protocol === proto);
    if (!sp) return undefined;
    return { ...NONE, srv: srvFor(svc, sp, endpoints, svcFqdn) };
  }
  return undefined;
}

function srvFor(svc: ServiceInfo, sp: ServiceInfo['ports'][number], endpoints: NamedEndpoint[], svcFqdn: string): Found['srv'] {
  if (!svc.headless) return [{ port: sp.port, target: svcFqdn, ips: svc.clusterIP ? [svc.clusterIP] : [] }];
  // One record per endpoint name and port; endpoints sharing a hostname share its record.
  const byTarget = new Map<string, Found['srv'][number]>();
  for (const e of endpoints) {
    const port = e.port(sp);
    if (port === undefined) continue;
    const target = `${e.label}.${svcFqdn}`;
    const key = `${target}:${port}`;
    const rec = byTarget.get(key);
    if (!rec) byTarget.set(key, { port, target, ips: [e.ip] });
    else if (!rec.ips.includes(e.ip)) rec.ips.push(e.ip);
  }
  return [...byTarget.values()];
}

// ---------------------------------------------------------------- reverse names

/** The reverse zone an IPv4 CIDR lies in, octet aligned: 10.96.0.0/12 → 10.in-addr.arpa. */
export function reverseZone(c: Cidr): string {
  const octets = intToIp(c.base).split('.').slice(0, Math.floor(c.bits / 8));
  return [...octets.reverse(), 'in-addr', 'arpa'].join('.');
}

function reverseNames(view: DnsView, zone: string): Map<string, string[]> {
  const services = view.services();
  const pods = view.pods();
  const cached = reverseMaps.get(services);
  if (cached && cached.pods === pods && cached.zone === zone) return cached.names;
  const names = new Map<string, string[]>();
  const add = (ip: string, name: string) => {
    const list = names.get(ip);
    if (!list) names.set(ip, [name]);
    else if (!list.includes(name)) list.push(name);
  };
  for (const svc of services) {
    const fqdn = `${svc.name.toLowerCase()}.${svc.namespace.toLowerCase()}.svc.${zone}`;
    if (!svc.headless && svc.clusterIP) add(svc.clusterIP, fqdn);
    if (svc.headless) for (const e of headlessEndpoints(svc, view)) add(e.ip, `${e.label}.${fqdn}`);
  }
  for (const list of names.values()) list.sort();
  reverseMaps.set(services, { pods, zone, names });
  return names;
}

/**
 * A reverse name answered here: the names of the address (none: NXDOMAIN) and the zone whose SOA
 * goes with a negative answer; undefined for a reverse name that is not ours to answer.
 */
function reverseLookup(name: string, view: DnsView, zone: string, cidrs: Cidr[]): { names: string[]; apex: string } | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.in-addr\.arpa$/.exec(name);
  if (!m) return undefined;
  const ip = [m[4], m[3], m[2], m[1]].map(Number).join('.');
  if (ipToInt(ip) === undefined) return undefined;
  const canonical = `${ip.split('.').reverse().join('.')}.in-addr.arpa` === name;
  const known = canonical ? (reverseNames(view, zone).get(ip) ?? []) : [];
  const within = cidrs.find((c) => cidrContains(c, ip));
  if (!known.length && !within) return undefined;
  return { names: known, apex: within ? reverseZone(within) : 'in-addr.arpa' };
}

// ---------------------------------------------------------------- upstreams

export interface Upstream {
  host: string;
  port: number;
}

/** Nameservers from resolv.conf text, as host:port (at most three, as glibc reads). */
export function parseResolvConf(text: string): Upstream[] {
  const out: Upstream[] = [];
  for (const line of text.split('\n')) {
    const m = /^\s*nameserver\s+(\S+)/.exec(line);
    if (!m || net.isIP(m[1]!) === 0) continue;
    out.push({ host: m[1]!, port: 53 });
  }
  return out.slice(0, 3);
}

/** One spelling per address: IPv4-mapped IPv6 as IPv4, IPv6 compressed and lower-case, no zone. */
export function canonicalIP(ip: string): string {
  const bare = ip.replace(/%.*$/, '').toLowerCase();
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(bare);
  if (mapped) return mapped[1]!;
  if (!net.isIPv6(bare)) return bare;
  const host = new URL(`http://[${bare}]/`).hostname.slice(1, -1);
  const mappedHex = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(host);
  if (!mappedHex) return host;
  const hi = parseInt(mappedHex[1]!, 16);
  const lo = parseInt(mappedHex[2]!, 16);
  return `${hi >> 8}.${hi & 0xff}.${lo >> 8}.${lo & 0xff}`;
}

/** Where Linux delivers a packet sent to `host`, canonical: the unspecified address is loopback. */
function deliveredTo(host: string): string {
  const ip = canonicalIP(host);
  return ip === '0.0.0.0' ? '127.0.0.1' : ip === '::' ? '::1' : ip;
}

/** The addresses of this host's interfaces, canonical. */
export function hostAddresses(): string[] {
  return Object.values(os.networkInterfaces()).flatMap((list) => (list ?? []).map((a) => canonicalIP(a.address)));
}

/**
 * Whether a query sent to `u` reaches the server listening at `listen`: the same port, and an address
 * the listening socket receives on. A socket bound to a specific address receives only what is sent to
 * that address (so a stub resolver on 127.0.0.53 is a real upstream for a DNS on 127.0.0.1 or on the
 * pod gateway); one bound to 0.0.0.0 receives what is sent to any of the host's IPv4 addresses, the
 * whole of 127.0.0.0/8 included; one bound to :: receives IPv6 and IPv4 alike (dual-stack). Linux
 * delivers a packet for the unspecified address to loopback, so a nameserver 0.0.0.0 is 127.0.0.1.
 */
export function isSelf(u: Upstream, listen: { address: string; port: number }, local: readonly string[]): boolean {
  if (u.port !== listen.port) return false;
  const dest = deliveredTo(u.host);
  const bound = canonicalIP(listen.address);
  const isLocal = (ip: string) => (net.isIPv4(ip) ? ip.startsWith('127.') : ip === '::1') || local.includes(ip);
  if (bound === '0.0.0.0') return net.isIPv4(dest) && isLocal(dest);
  if (bound === '::') return isLocal(dest);
  return dest === bound;
}

const upstreamText = (u: Upstream) => (net.isIPv6(u.host) ? `[${u.host}]:${u.port}` : `${u.host}:${u.port}`);

/** A name nobody else asks for: two labels of 64 random bits in decimal, as CoreDNS's loop plugin asks. */
function probeName(): string {
  const b = randomBytes(16);
  return `${b.readBigUInt64BE(0)}.${b.readBigUInt64BE(8)}`;
}

/** A forwarded query as it would look coming back to us: its id and its question, case folded. */
function loopKey(id: number | undefined, question: Question): string {
  return `${id ?? 0}/${question.type}/${question.class ?? 'IN'}/${question.name.toLowerCase()}`;
}

/** The answer bytes with the client's id (a query that shared another's forward gets that one's answer). */
function withId(answer: Buffer, id: number): Buffer {
  const out = Buffer.from(answer);
  out.writeUInt16BE(id, 0);
  return out;
}

// ---------------------------------------------------------------- server

export interface DnsServerOptions {
  address: string;
  /** Default 53; 0 picks a free port (tests). */
  port?: number;
  clusterDomain: string;
  view: DnsView;
  /** Where to forward; any that is the server itself or that forwards back to it is dropped. */
  upstreams: Upstream[];
  log: Logger;
  forwardTimeoutMs?: number;
  maxInflightForwards?: number;
  maxTcpConnections?: number;
  tcpIdleMs?: number;
  /** The host's addresses, which a server on 0.0.0.0 or :: receives on (default: its interfaces'). */
  localAddresses?: () => string[];
  /** How long an upstream that does not answer the loop probe is probed again (default 30 s, as CoreDNS). */
  loopProbeWindowMs?: number;
  /** CIDRs whose reverse names are answered here and never forwarded (the service and pod CIDRs). */
  reverseCidrs?: string[];
  /** Which `<a-b-c-d>.<ns>.pod.<zone>` names exist (default verified). */
  podRecords?: PodRecords;
}

/** Between two loop probes of an upstream that answered neither. */
const PROBE_RETRY_MS = 1000;

export class DnsServer {
  private udp?: dgram.Socket;
  private tcp?: net.Server;
  private readonly conns = new Set<net.Socket>();
  private inflight = 0;
  private readonly forwardTimeoutMs: number;
  private readonly maxInflight: number;
  private readonly maxConns: number;
  private readonly idleMs: number;
  private closed = false;
  private readonly counters = { queries: 0, forwarded: 0, loops: 0 };
  /** The upstreams in use: the configured ones less the server itself and those found looping. */
  private upstreams: Upstream[] = [];
  /** Loop probes in flight: the probe name → the upstream it was sent to. */
  private readonly probes = new Map<string, Upstream>();
  private probing: Promise<void> = Promise.resolve();
  private readonly wakers = new Set<() => void>();
  /** Forwards in flight by loopKey → who asked (address:port), one entry per query. */
  private readonly outstanding = new Map<string, string[]>();
  /** Forwards in flight by the query's bytes less its id, which identical queries share. */
  private readonly pending = new Map<string, Promise<Buffer | undefined>>();
  private warnedEcho = false;
  private readonly zone: ZoneOptions;

  constructor(private readonly opts: DnsServerOptions) {
    const reverse = (opts.reverseCidrs ?? []).map((text) => {
      const c = parseCidr(text);
      if (!c) throw new Error(`service DNS: "${text}" is not an IPv4 CIDR`);
      return c;
    });
    this.zone = { reverse, pods: opts.podRecords ?? 'verified' };
    this.forwardTimeoutMs = opts.forwardTimeoutMs ?? 2000;
    this.maxInflight = opts.maxInflightForwards ?? 256;
    this.maxConns = opts.maxTcpConnections ?? 64;
    this.idleMs = opts.tcpIdleMs ?? 10_000;
  }

  /**
   * What the server has done so far: queries it received (UDP datagrams and TCP messages, its own
   * that came back included), queries it sent upstream (probes included), and queries it refused
   * as its own coming back.
   */
  stats(): { queries: number; forwarded: number; loops: number } {
    return { ...this.counters };
  }

  /** The upstreams it forwards to now, copies. */
  activeUpstreams(): Upstream[] {
    return this.upstreams.map((u) => ({ ...u }));
  }

  /** Settles when every upstream has answered its loop probe, or stopped being probed. */
  loopChecked(): Promise<void> {
    return this.probing;
  }

  /**
   * Serves UDP and TCP on the same port. Asked for port 0, it takes the port the kernel gives UDP,
   * which TCP may already use (another connection's ephemeral port): it then tries another, a few times.
   * Then it drops the upstreams that are itself and probes the others for loops, in the background.
   */
  async start(): Promise<{ port: number }> {
    for (let attempt = 1; ; attempt++) {
      try {
        const bound = await this.bindBoth();
        this.useUpstreams(bound.port);
        return bound;
      } catch (err) {
        await this.close();
        this.closed = false;
        if (this.opts.port || !isErrno(err, 'EADDRINUSE') || attempt >= 5) throw err;
      }
    }
  }

  /**
   * A forwarder that forwards to itself sends each query round until its in-flight cap stops it
   * (a thousand packets a query). The upstreams that are this server, by address and port, are
   * never used; the others are probed, as CoreDNS's loop plugin does: a query for a random name
   * goes to each, and if it arrives back here, that upstream forwards to us.
   */
  private useUpstreams(port: number): void {
    const local = this.opts.localAddresses?.() ?? hostAddresses();
    const listen = { address: this.opts.address, port };
    const self = this.opts.upstreams.filter((u) => isSelf(u, listen, local));
    this.upstreams = this.opts.upstreams.filter((u) => !isSelf(u, listen, local)).map((u) => ({ ...u }));
    if (self.length) {
      this.opts.log.warn('service DNS does not forward to itself: nameservers that are its own address are skipped', {
        skipped: self.map(upstreamText),
        listening: upstreamText({ host: listen.address, port }),
        remaining: this.upstreams.map(upstreamText),
      });
    }
    const until = Date.now() + (this.opts.loopProbeWindowMs ?? 30_000);
    this.probing = Promise.all(this.upstreams.map((u) => this.probe(u, until))).then(() => {});
  }

  /** Probes `u` until it answers (a loop is marked while the probe passes through us) or `until`. */
  private async probe(u: Upstream, until: number): Promise<void> {
    while (!this.closed && this.upstreams.includes(u)) {
      const name = probeName();
      this.probes.set(name, u);
      const raw = dnsPacket.encode({ type: 'query', id: randomInt(65536), flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'HINFO', name, class: 'IN' }] });
      const answered = await this.forwardUdp(raw, u).then(
        () => true,
        () => false,
      );
      this.probes.delete(name);
      if (answered || Date.now() + PROBE_RETRY_MS >= until) return;
      await this.sleep(PROBE_RETRY_MS);
    }
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.wakers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      timer.unref();
      this.wakers.add(wake);
    });
  }

  private dropLooping(u: Upstream, from: string): void {
    if (!this.upstreams.includes(u)) return;
    this.upstreams = this.upstreams.filter((x) => x !== u);
    this.opts.log.error('service DNS upstream forwards our queries back to us (a forwarding loop): no longer forwarding to it', {
      upstream: upstreamText(u),
      cameBackFrom: from,
      remaining: this.upstreams.map(upstreamText),
    });
  }

  private async bindBoth(): Promise<{ port: number }> {
    const type = net.isIPv6(this.opts.address) ? 'udp6' : 'udp4';
    const udp = dgram.createSocket({ type });
    this.udp = udp;
    udp.on('message', (msg, rinfo) => void this.onUdp(msg, rinfo));
    udp.on('error', (err) => this.opts.log.warn('dns udp socket error', { error: errorMessage(err) }));
    await new Promise<void>((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(this.opts.port ?? 53, this.opts.address, () => {
        udp.off('error', reject);
        resolve();
      });
    });
    const port = udp.address().port;
    const tcp = net.createServer((sock) => this.onTcp(sock));
    await new Promise<void>((resolve, reject) => {
      tcp.once('error', reject);
      tcp.listen(port, this.opts.address, () => {
        tcp.off('error', reject);
        resolve();
      });
    });
    this.tcp = tcp;
    return { port };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const wake of [...this.wakers]) wake();
    for (const c of this.conns) c.destroy();
    await Promise.all([
      new Promise<void>((r) => (this.udp ? this.udp.close(() => r()) : r())),
      new Promise<void>((r) => (this.tcp ? this.tcp.close(() => r()) : r())),
    ]);
  }

  /** The answer bytes for one raw query from `from` (address:port), or undefined to stay silent. */
  private async handle(raw: Buffer, transport: 'udp' | 'tcp', from: string): Promise<Buffer | undefined> {
    this.counters.queries++;
    if (raw.length < 12 || raw.length > MAX_QUERY_BYTES) return undefined;
    if (raw[2]! & 0x80) return undefined; // a response: never answer one (reflection loops)
    const headerOnly: Packet = { id: raw.readUInt16BE(0), flags: raw.readUInt16BE(2) & 0x7fff, questions: [] };
    let q: Packet;
    try {
      if (raw.readUInt16BE(4) !== 1) throw new Error('one question per query');
      q = dnsPacket.decode(raw);
    } catch {
      return dnsPacket.encode(reply(headerOnly, RCODE.FORMERR));
    }
    if (((raw[2]! >> 3) & 0xf) !== 0) return dnsPacket.encode(reply({ ...q, questions: q.questions }, RCODE.NOTIMP));
    const question = rawQuestion(raw);
    // dns-packet joins labels with dots, so the one label "web.ns1" would read as two: keep it one.
    if (question?.labels.some((l) => l.includes('.'))) q.questions![0]!.name = question.labels.map((l) => l.replace(/[\\.]/g, '\\$&')).join('.');
    const d = decide(q, this.opts.view, this.opts.clusterDomain, this.zone);
    if (d.kind === 'answer') return this.fit(d.packet, q, transport, question);
    return this.forward(raw, q, transport, from);
  }

  /**
   * Encodes an answer, names compressed, with an OPT record when the query had one (RFC 6891), and
   * keeps it within what the client can take (UDP: its buffer; TCP: 65,535 bytes): the additional
   * records (SRV targets' addresses) are optional and go first (RFC 2181 9); if the answer still does
   * not fit, TC with no records tells a UDP client to ask again over TCP.
   */
  private fit(p: Packet, q: Packet, transport: 'udp' | 'tcp', question: RawQuestion | undefined): Buffer {
    const opt = q.additionals?.find((a) => a.type === 'OPT') as { udpPayloadSize?: number } | undefined;
    const encode = (x: Packet) => encodeResponse(opt ? { ...x, additionals: [...(x.additionals ?? []), OPT_ANSWER] } : x, question);
    const buf = encode(p);
    // Over TCP a message is at most 65,535 bytes, its length being two bytes.
    const limit = transport === 'tcp' ? 0xffff : Math.max(UDP_PLAIN_LIMIT, Math.min(opt?.udpPayloadSize ?? UDP_PLAIN_LIMIT, MAX_UDP_ANSWER));
    if (buf.length <= limit) return buf;
    if (p.additionals?.length) {
      const lean = encode({ ...p, additionals: [] });
      if (lean.length <= limit) return lean;
    }
    return encode({ ...p, flags: (p.flags ?? 0) | dnsPacket.TRUNCATED_RESPONSE, answers: [], additionals: [], authorities: [] });
  }

  /**
   * Forwards a query, unless it is one of ours come back. A loop probe arriving here names the
   * upstream that sent it round, which is then dropped. A query with the id and question of a
   * forward still in flight, from someone other than who asked for that forward (a client's own
   * retransmission is not a loop), is that forward returning through an upstream that keeps ids:
   * SERVFAIL at once stops the round after one lap. Identical queries in flight share one forward,
   * so a loop through an upstream that changes ids waits out one timeout instead of going round.
   * No usable upstream at all is REFUSED: the server will not resolve that name, now or on a
   * retry, and a stub with another nameserver goes to it at once (RFC 2308 lets SERVFAIL be cached).
   */
  private async forward(raw: Buffer, q: Packet, transport: 'udp' | 'tcp', from: string): Promise<Buffer> {
    const question = q.questions![0]!;
    const fail = (rcode: number) => encodeResponse(reply(q, rcode), rawQuestion(raw));
    const probed = this.probes.get(question.name);
    if (probed) {
      this.counters.loops++;
      this.dropLooping(probed, from);
      return fail(RCODE.SERVFAIL);
    }
    const key = loopKey(q.id, question);
    const askers = this.outstanding.get(key);
    if (askers && !askers.includes(from)) {
      this.counters.loops++;
      if (!this.warnedEcho) {
        this.warnedEcho = true;
        this.opts.log.error('service DNS received a query it is forwarding, from another address: an upstream forwards to us (a loop); answering those SERVFAIL', {
          cameBackFrom: from,
          upstreams: this.upstreams.map(upstreamText),
        });
      }
      return fail(RCODE.SERVFAIL);
    }
    if (this.upstreams.length === 0) return fail(RCODE.REFUSED);
    if (this.inflight >= this.maxInflight) return fail(RCODE.SERVFAIL);
    this.inflight++;
    this.outstanding.set(key, [...(askers ?? []), from]);
    try {
      const shareKey = `${transport}:${raw.toString('latin1', 2)}`;
      let shared = this.pending.get(shareKey);
      if (!shared) {
        const p = this.forwardAll(raw, transport).finally(() => {
          if (this.pending.get(shareKey) === p) this.pending.delete(shareKey);
        });
        this.pending.set(shareKey, p);
        shared = p;
      }
      const answer = await shared;
      return answer ? withId(answer, q.id ?? 0) : fail(RCODE.SERVFAIL);
    } finally {
      this.inflight--;
      const left = this.outstanding.get(key) ?? [];
      left.splice(left.indexOf(from), 1);
      if (left.length === 0) this.outstanding.delete(key);
    }
  }

  /** The first upstream's answer with the query's id, trying each in turn; undefined when none answers. */
  private async forwardAll(raw: Buffer, transport: 'udp' | 'tcp'): Promise<Buffer | undefined> {
    for (const u of [...this.upstreams]) {
      const answer = await (transport === 'udp' ? this.forwardUdp(raw, u) : this.forwardTcp(raw, u)).catch(() => undefined);
      if (answer && answer.length >= 12 && answer.readUInt16BE(0) === raw.readUInt16BE(0)) return answer;
    }
    return undefined;
  }

  private forwardUdp(raw: Buffer, u: { host: string; port: number }): Promise<Buffer> {
    this.counters.forwarded++;
    return new Promise((resolve, reject) => {
      const sock = dgram.createSocket(net.isIPv6(u.host) ? 'udp6' : 'udp4');
      const answerer = deliveredTo(u.host);
      const done = (err?: Error, buf?: Buffer) => {
        clearTimeout(timer);
        sock.close();
        if (err) reject(err);
        else resolve(buf!);
      };
      const timer = setTimeout(() => done(new Error('upstream timed out')), this.forwardTimeoutMs);
      sock.on('error', (err) => done(err));
      sock.on('message', (msg, rinfo) => {
        if (canonicalIP(rinfo.address) !== answerer || rinfo.port !== u.port) return; // not from the upstream we asked
        done(undefined, msg);
      });
      sock.send(raw, u.port, u.host);
    });
  }

  private forwardTcp(raw: Buffer, u: { host: string; port: number }): Promise<Buffer> {
    this.counters.forwarded++;
    return new Promise((resolve, reject) => {
      const sock = net.connect({ host: u.host, port: u.port });
      let buf = Buffer.alloc(0);
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new Error('upstream timed out'));
      }, this.forwardTimeoutMs);
      sock.on('connect', () => {
        const len = Buffer.alloc(2);
        len.writeUInt16BE(raw.length);
        sock.end(Buffer.concat([len, raw]));
      });
      sock.on('data', (c: Buffer) => {
        buf = Buffer.concat([buf, c]);
        if (buf.length > 65537) sock.destroy(new Error('upstream answer too long'));
        if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
          clearTimeout(timer);
          sock.destroy();
          resolve(buf.subarray(2, 2 + buf.readUInt16BE(0)));
        }
      });
      sock.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      sock.on('close', () => {
        clearTimeout(timer);
        reject(new Error('upstream closed'));
      });
    });
  }

  private async onUdp(msg: Buffer, rinfo: dgram.RemoteInfo): Promise<void> {
    try {
      const out = await this.handle(msg, 'udp', `${rinfo.address}:${rinfo.port}`);
      if (out && !this.closed) this.udp?.send(out, rinfo.port, rinfo.address);
    } catch (err) {
      this.opts.log.warn('dns query failed', { error: errorMessage(err) });
    }
  }

  private onTcp(sock: net.Socket): void {
    if (this.conns.size >= this.maxConns || this.closed) {
      sock.destroy();
      return;
    }
    this.conns.add(sock);
    const from = `${sock.remoteAddress}:${sock.remotePort}`;
    sock.setTimeout(this.idleMs, () => sock.destroy());
    sock.on('close', () => this.conns.delete(sock));
    sock.on('error', () => {});
    let buf = Buffer.alloc(0);
    let busy = false;
    const pump = async () => {
      if (busy) return;
      busy = true;
      try {
        while (buf.length >= 2) {
          const len = buf.readUInt16BE(0);
          if (len > MAX_QUERY_BYTES || len < 12) {
            sock.destroy();
            return;
          }
          if (buf.length < 2 + len) break;
          const raw = buf.subarray(2, 2 + len);
          buf = buf.subarray(2 + len);
          const out = await this.handle(Buffer.from(raw), 'tcp', from);
          if (!out || sock.destroyed) continue;
          const hdr = Buffer.alloc(2);
          hdr.writeUInt16BE(out.length);
          sock.write(Buffer.concat([hdr, out]));
        }
      } catch (err) {
        this.opts.log.warn('dns tcp query failed', { error: errorMessage(err) });
        sock.destroy();
      } finally {
        busy = false;
        if (buf.length >= 2 && !sock.destroyed) sock.resume();
      }
    };
    sock.on('data', (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      // One query at a time per connection; do not buffer more than one more message's worth.
      if (buf.length > 2 * (MAX_QUERY_BYTES + 2)) sock.pause();
      void pump();
    });
  }
}
