/**
 * Service DNS: a small server on the node answering for the cluster domain
 * from the proxy's view of Services and pods, and forwarding every other
 * name to the host's resolvers. dns-packet is the wire codec; this file only
 * decides answers and bounds what a client can make it do.
 */
import dgram from 'node:dgram';
import net from 'node:net';
import dnsPacket, { type Answer, type Packet, type Question } from 'dns-packet';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { PodIndex, podAddress, resolveTargetPort, selectedPods } from './endpoints.js';
import type { ServiceInfo } from './service.js';

export const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
const TTL = 5;
/** Largest query accepted (UDP datagram or TCP message); real queries are well under 512 bytes. */
export const MAX_QUERY_BYTES = 4096;
const UDP_PLAIN_LIMIT = 512;

/** What DNS answers from: the Services as the proxier last resolved them, and the pods. */
export interface DnsView {
  services(): ServiceInfo[];
  pods(): Pod[];
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

function soa(domain: string): Answer {
  return {
    type: 'SOA',
    name: domain,
    ttl: TTL,
    class: 'IN',
    data: { mname: `ns.dns.${domain}`, rname: `hostmaster.${domain}`, serial: 1, refresh: 7200, retry: 1800, expire: 86400, minimum: TTL },
  };
}

const dashed = (ip: string) => ip.replace(/\./g, '-');

/**
 * Decides the answer to one query, purely. Names in the cluster domain are
 * answered (NXDOMAIN when unknown); anything else is forwarded.
 */
export function decide(q: Packet, view: DnsView, domain: string): Decision {
  const question = q.questions?.[0] as Question | undefined;
  if (!question || (q.questions?.length ?? 0) !== 1) return { kind: 'answer', packet: reply(q, RCODE.FORMERR) };
  const name = question.name.toLowerCase().replace(/\.$/, '');
  const zone = domain.toLowerCase();
  if (name !== zone && !name.endsWith(`.${zone}`)) return { kind: 'forward' };
  if (question.class !== 'IN' && question.class !== undefined) return { kind: 'answer', packet: reply(q, RCODE.NOTIMP) };
  const labels = name === zone ? [] : name.slice(0, -(zone.length + 1)).split('.');
  const found = lookup(labels, view, zone);
  if (!found) return { kind: 'answer', packet: reply(q, RCODE.NXDOMAIN, [], { authorities: [soa(zone)] }) };
  const wanted = question.type as string;
  const any = wanted === 'ANY' || wanted === '*';
  const answers: Answer[] = [];
  const additionals: Answer[] = [];
  if (wanted === 'A' || any) for (const ip of found.a) answers.push({ type: 'A', name: question.name, ttl: TTL, class: 'IN', data: ip });
  if (wanted === 'SRV' || any) {
    for (const s of found.srv) {
      answers.push({ type: 'SRV', name: question.name, ttl: TTL, class: 'IN', data: { priority: 0, weight: Math.floor(100 / found.srv.length) || 1, port: s.port, target: s.target } });
      for (const ip of s.ips) additionals.push({ type: 'A', name: s.target, ttl: TTL, class: 'IN', data: ip });
    }
  }
  // A name that exists without records of this type: NOERROR with no answers (NODATA), and the SOA.
  return { kind: 'answer', packet: reply(q, RCODE.NOERROR, answers, { additionals, authorities: answers.length ? [] : [soa(zone)] }) };
}

interface Found {
  a: string[];
  srv: Array<{ port: number; target: string; ips: string[] }>;
}

/** Per-snapshot lookups, so a query costs a map lookup, not a walk over 10,000 Services or 30,000 pods. */
const serviceMaps = new WeakMap<ServiceInfo[], { byName: Map<string, ServiceInfo>; namespaces: Set<string> }>();
const podIndexes = new WeakMap<Pod[], { index: PodIndex; byIP: Map<string, Pod[]> }>();

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

function lookup(labels: string[], view: DnsView, zone: string): Found | undefined {
  // Structure-only names (the zone, "svc", "<ns>.svc", "pod") exist, with no records.
  if (labels.length === 0 || (labels.length === 1 && (labels[0] === 'svc' || labels[0] === 'pod'))) return { a: [], srv: [] };
  const kind = labels[labels.length - 1];
  if (kind === 'pod' && labels.length === 3) {
    const [ipDashed, ns] = labels as [string, string];
    const ip = ipDashed.replace(/-/g, '.');
    const exists = (podsOf(view).byIP.get(ip) ?? []).some((p) => (p.metadata?.namespace ?? 'default') === ns && !p.spec?.hostNetwork);
    return exists ? { a: [ip], srv: [] } : undefined;
  }
  if (kind !== 'svc') return undefined;
  if (labels.length === 2) {
    const ns = labels[0];
    return servicesOf(view).namespaces.has(ns!) ? { a: [], srv: [] } : undefined;
  }
  const svcLabelIndex = labels.length - 3;
  if (svcLabelIndex < 0) return undefined;
  const svcName = labels[svcLabelIndex]!;
  const ns = labels[svcLabelIndex + 1]!;
  const svc = servicesOf(view).byName.get(`${ns}/${svcName}`);
  if (!svc) return undefined;
  const svcFqdn = `${svcName}.${ns}.svc.${zone}`;
  const serving = svc.headless ? selectedPods(svc, podsOf(view).index) : [];
  const podIPs = serving.map((p) => podAddress(p)!).filter(Boolean);
  const prefix = labels.slice(0, svcLabelIndex);
  if (prefix.length === 0) {
    // <svc>.<ns>.svc: A = cluster IP (headless: the ready pods); SRV = every named port.
    const a = svc.headless ? [...new Set(podIPs)].sort() : svc.clusterIP ? [svc.clusterIP] : [];
    const srv = svc.ports.filter((p) => p.portName).flatMap((p) => srvFor(svc, p, serving, svcFqdn));
    return { a, srv };
  }
  if (prefix.length === 1 && svc.headless) {
    // <a-b-c-d>.<svc>.<ns>.svc: one pod of a headless Service.
    const ip = podIPs.find((x) => dashed(x) === prefix[0]);
    return ip ? { a: [ip], srv: [] } : undefined;
  }
  if (prefix.length === 2 && prefix[0]!.startsWith('_') && prefix[1]!.startsWith('_')) {
    // _<port>._<proto>.<svc>.<ns>.svc
    const portName = prefix[0]!.slice(1);
    const proto = prefix[1]!.slice(1).toUpperCase();
    const sp = svc.ports.find((p) => p.portName === portName && p.protocol === proto);
    if (!sp) return undefined;
    return { a: [], srv: srvFor(svc, sp, serving, svcFqdn) };
  }
  return undefined;
}

function srvFor(svc: ServiceInfo, sp: ServiceInfo['ports'][number], serving: Pod[], svcFqdn: string): Found['srv'] {
  if (!svc.headless) return [{ port: sp.port, target: svcFqdn, ips: svc.clusterIP ? [svc.clusterIP] : [] }];
  const out: Found['srv'] = [];
  for (const pod of serving) {
    const port = resolveTargetPort(sp, pod);
    const ip = podAddress(pod);
    if (port === undefined || !ip) continue;
    out.push({ port, target: `${dashed(ip)}.${svcFqdn}`, ips: [ip] });
  }
  return out;
}

// ---------------------------------------------------------------- upstreams

/** Nameservers from resolv.conf text, as host:port, skipping `exclude` (our own address: no loops). */
export function parseResolvConf(text: string, exclude: string[] = []): Array<{ host: string; port: number }> {
  const out: Array<{ host: string; port: number }> = [];
  for (const line of text.split('\n')) {
    const m = /^\s*nameserver\s+(\S+)/.exec(line);
    if (!m || net.isIP(m[1]!) === 0 || exclude.includes(m[1]!)) continue;
    out.push({ host: m[1]!, port: 53 });
  }
  return out.slice(0, 3);
}

// ---------------------------------------------------------------- server

export interface DnsServerOptions {
  address: string;
  /** Default 53; 0 picks a free port (tests). */
  port?: number;
  clusterDomain: string;
  view: DnsView;
  upstreams: Array<{ host: string; port: number }>;
  log: Logger;
  forwardTimeoutMs?: number;
  maxInflightForwards?: number;
  maxTcpConnections?: number;
  tcpIdleMs?: number;
}

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

  constructor(private readonly opts: DnsServerOptions) {
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

  /**
   * Serves UDP and TCP on the same port. Asked for port 0, it takes the port the kernel gives UDP,
   * which TCP may already use (another connection's ephemeral port): it then tries another, a few times.
   */
  async start(): Promise<{ port: number }> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.bindBoth();
      } catch (err) {
        await this.close();
        this.closed = false;
        if (this.opts.port || !isErrno(err, 'EADDRINUSE') || attempt >= 5) throw err;
      }
    }
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
    for (const c of this.conns) c.destroy();
    await Promise.all([
      new Promise<void>((r) => (this.udp ? this.udp.close(() => r()) : r())),
      new Promise<void>((r) => (this.tcp ? this.tcp.close(() => r()) : r())),
    ]);
  }

  /** The answer bytes for one raw query, or undefined to stay silent (not even a header to answer). */
  private async handle(raw: Buffer, transport: 'udp' | 'tcp'): Promise<Buffer | undefined> {
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
    const d = decide(q, this.opts.view, this.opts.clusterDomain);
    if (d.kind === 'answer') return this.fit(d.packet, q, transport);
    return this.forward(raw, q, transport);
  }

  /** Keeps a UDP answer within what the client can take; TC tells it to retry over TCP. */
  private fit(p: Packet, q: Packet, transport: 'udp' | 'tcp'): Buffer {
    const buf = dnsPacket.encode(p);
    if (transport === 'tcp') return buf;
    const opt = q.additionals?.find((a) => a.type === 'OPT') as { udpPayloadSize?: number } | undefined;
    const limit = Math.max(UDP_PLAIN_LIMIT, Math.min(opt?.udpPayloadSize ?? UDP_PLAIN_LIMIT, 4096));
    if (buf.length <= limit) return buf;
    return dnsPacket.encode({ ...p, flags: (p.flags ?? 0) | dnsPacket.TRUNCATED_RESPONSE, answers: [], additionals: [], authorities: [] });
  }

  private async forward(raw: Buffer, q: Packet, transport: 'udp' | 'tcp'): Promise<Buffer> {
    const upstream = this.opts.upstreams[0];
    if (!upstream || this.inflight >= this.maxInflight) return dnsPacket.encode(reply(q, upstream ? RCODE.SERVFAIL : RCODE.REFUSED));
    this.inflight++;
    try {
      for (const u of this.opts.upstreams) {
        const answer = await (transport === 'udp' ? this.forwardUdp(raw, u) : this.forwardTcp(raw, u)).catch(() => undefined);
        if (answer && answer.length >= 12 && answer.readUInt16BE(0) === raw.readUInt16BE(0)) return answer;
      }
      return dnsPacket.encode(reply(q, RCODE.SERVFAIL));
    } finally {
      this.inflight--;
    }
  }

  private forwardUdp(raw: Buffer, u: { host: string; port: number }): Promise<Buffer> {
    this.counters.forwarded++;
    return new Promise((resolve, reject) => {
      const sock = dgram.createSocket(net.isIPv6(u.host) ? 'udp6' : 'udp4');
      const done = (err?: Error, buf?: Buffer) => {
        clearTimeout(timer);
        sock.close();
        if (err) reject(err);
        else resolve(buf!);
      };
      const timer = setTimeout(() => done(new Error('upstream timed out')), this.forwardTimeoutMs);
      sock.on('error', (err) => done(err));
      sock.on('message', (msg, rinfo) => {
        if (rinfo.address !== u.host || rinfo.port !== u.port) return; // not from the upstream we asked
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
      const out = await this.handle(msg, 'udp');
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
          const out = await this.handle(Buffer.from(raw), 'tcp');
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
