/**
 * Services as the proxy sees them: parsed from manifest objects (no API
 * server has defaulted them), with cluster IPs and node ports allocated
 * stably, and every problem reported against its own Service so one bad
 * manifest never breaks the others' rules.
 */
import { createHash } from 'node:crypto';
import type { Service, ServicePort } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import { applyServiceDefaults, serviceErrors } from './service-validation.js';

export type Protocol = 'TCP' | 'UDP' | 'SCTP';

/** One port of one Service: the unit kube-proxy programs ("ns/name:port"). */
export interface ServicePortInfo {
  /** `ns/name:portName`, or `ns/name` for an unnamed port: kube-proxy's ServicePortName string. */
  key: string;
  namespace: string;
  name: string;
  portName: string;
  protocol: Protocol;
  port: number;
  targetPort: number | string;
  /** Undefined for headless Services (DNS only). */
  clusterIP?: string;
  nodePort?: number;
  /** Seconds of ClientIP affinity; undefined without affinity. */
  affinitySeconds?: number;
  /** A LoadBalancer's addresses (its status's ingress IPs): the port is answered there too (KUBE-EXT). */
  loadBalancerIPs?: string[];
  /** spec.externalIPs: the port is answered there too, as external traffic (KUBE-EXT / external- chain). */
  externalIPs?: string[];
  /** A LoadBalancer's loadBalancerSourceRanges, normalised: only these sources reach it through its addresses (KUBE-FW). */
  sourceRanges?: string[];
  externalLocal: boolean;
  internalLocal: boolean;
}

/** A Service after parsing and allocation. */
export interface ServiceInfo {
  namespace: string;
  name: string;
  /** namespace/name. */
  key: string;
  uid: string;
  type: ServiceType;
  /** An ExternalName Service's name, without a trailing dot: DNS answers a CNAME to it; it has no ports or address. */
  externalName?: string;
  /** A LoadBalancer with externalTrafficPolicy Local: where its health is answered over HTTP (kube-proxy's health-check server). */
  healthCheckNodePort?: number;
  /** Equality selector; undefined = no selector (no endpoints are computed). */
  selector?: Record<string, string>;
  headless: boolean;
  clusterIP?: string;
  publishNotReady: boolean;
  ports: ServicePortInfo[];
}

export interface ServiceProblem {
  service: string;
  reason: string;
}

export const DEFAULT_AFFINITY_SECONDS = 10800;
export const NODE_PORT_MIN = 30000;
export const NODE_PORT_MAX = 32767;

// ---------------------------------------------------------------- IPv4 helpers

export function ipToInt(ip: string): number | undefined {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/.exec(ip);
  if (!m) return undefined;
  const parts = m.slice(1).map(Number);
  if (parts.some((p) => p > 255)) return undefined;
  return ((parts[0]! << 24) >>> 0) + (parts[1]! << 16) + (parts[2]! << 8) + parts[3]!;
}

export function intToIp(n: number): string {
  return [(n >>> 24) & 255, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

export interface Cidr {
  base: number;
  bits: number;
  size: number;
  text: string;
}

export function parseCidr(text: string): Cidr | undefined {
  const [ip, bitsText] = text.split('/');
  const base = ipToInt(ip ?? '');
  const bits = Number(bitsText);
  if (base === undefined || !Number.isInteger(bits) || bits < 0 || bits > 32 || bitsText === '') return undefined;
  const size = 2 ** (32 - bits);
  const masked = bits === 0 ? 0 : (base & ((0xffffffff << (32 - bits)) >>> 0)) >>> 0;
  return { base: masked, bits, size, text: `${intToIp(masked)}/${bits}` };
}

export function cidrContains(c: Cidr, ip: string): boolean {
  const n = ipToInt(ip);
  return n !== undefined && n >= c.base && n < c.base + c.size;
}

function hash32(s: string): number {
  return createHash('sha256').update(s).digest().readUInt32BE(0);
}

// ---------------------------------------------------------------- parsing

function parsePort(svcKey: string, p: ServicePort): ServicePortInfo {
  const portName = p.name ?? '';
  const tp = p.targetPort;
  return {
    key: portName ? `${svcKey}:${portName}` : svcKey,
    namespace: '',
    name: '',
    portName,
    protocol: (p.protocol ?? 'TCP') as Protocol,
    port: p.port,
    targetPort: typeof tp === 'string' && /^\d+$/.test(tp) ? Number(tp) : (tp ?? p.port),
    nodePort: p.nodePort || undefined,
    externalLocal: false,
    internalLocal: false,
  };
}

export type ServiceType = 'ClusterIP' | 'NodePort' | 'LoadBalancer' | 'ExternalName';

interface Parsed {
  info: ServiceInfo;
  type: ServiceType;
  /** The clusterIP asked for in the spec; '' for none. */
  wantIP: string;
  /** Node ports are given (or allocated) for its ports. */
  nodePorts: boolean;
  /** It has a health-check node port: the spec's (the API allocated it), else one allocated here (a manifest file's). */
  healthCheck: boolean;
}

/** The allocator's key for a Service's health-check node port (TCP, as kube-proxy serves it). */
const hcKey = (service: string) => `${service}#health-check/TCP`;

/** At most this many reasons of one Service are reported (a hostile one may have thousands). */
const MAX_REASONS = 5;

function parseService(obj: StoredObject): Parsed | string {
  // Validated as the API server validates it, on a defaulted copy: a file gets what kubectl apply would.
  const svc = structuredClone(obj.object as Service) as Service & Record<string, unknown>;
  if (typeof svc.spec !== 'object' || svc.spec === null) svc.spec = {};
  applyServiceDefaults(svc.spec as Record<string, unknown>);
  const errs = serviceErrors({ ...svc, metadata: { ...(svc.metadata ?? {}), name: obj.name, namespace: obj.namespace } }, { metadata: true });
  if (errs.length > 0) {
    const shown = errs.slice(0, MAX_REASONS).map((e) => `${e.field}: ${e.message}`);
    if (errs.length > MAX_REASONS) shown.push(`and ${errs.length - MAX_REASONS} more`);
    return shown.join('; ');
  }
  const spec = svc.spec;
  const key = `${obj.namespace}/${obj.name}`;
  const type = spec.type as ServiceType;
  const wantIP = spec.clusterIP ?? '';
  const externalName = type === 'ExternalName' ? spec.externalName!.replace(/\.$/, '') : undefined;
  const headless = wantIP === 'None' || type === 'ExternalName';
  const nodePorts = type === 'NodePort' || (type === 'LoadBalancer' && spec.allocateLoadBalancerNodePorts !== false);
  // ServiceLB's addresses, as kube-proxy reads a load balancer's: its status's ingress IPs (ipMode Proxy ones are the balancer's own).
  const lbIPs = type === 'LoadBalancer' ? [...new Set((svc.status?.loadBalancer?.ingress ?? []).filter((i) => i.ip && ipToInt(i.ip) !== undefined && i.ipMode !== 'Proxy').map((i) => i.ip!))] : [];
  const sourceRanges = type === 'LoadBalancer' ? [...new Set((spec.loadBalancerSourceRanges ?? []).map((r) => parseCidr(r.trim())!.text))] : [];
  const externalIPs = type === 'ExternalName' || headless ? [] : [...new Set((spec.externalIPs ?? []).filter((ip) => ipToInt(ip) !== undefined))];
  const ports: ServicePortInfo[] = [];
  for (const p of type === 'ExternalName' ? [] : (spec.ports ?? [])) {
    const r = parsePort(key, p);
    r.namespace = obj.namespace;
    r.name = obj.name;
    // A node port a spec names but this type does not take was refused above; one left from another type is not kept.
    if (!nodePorts) r.nodePort = undefined;
    if (spec.sessionAffinity === 'ClientIP') r.affinitySeconds = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds ?? DEFAULT_AFFINITY_SECONDS;
    r.externalLocal = (type === 'NodePort' || type === 'LoadBalancer' || externalIPs.length > 0) && spec.externalTrafficPolicy === 'Local';
    r.internalLocal = spec.internalTrafficPolicy === 'Local';
    if (lbIPs.length) r.loadBalancerIPs = lbIPs;
    if (externalIPs.length) r.externalIPs = externalIPs;
    if (sourceRanges.length) r.sourceRanges = sourceRanges;
    ports.push(r);
  }
  let selector: Record<string, string> | undefined;
  if (spec.selector && Object.keys(spec.selector).length > 0 && type !== 'ExternalName') selector = { ...spec.selector };
  const info: ServiceInfo = { namespace: obj.namespace, name: obj.name, key, uid: obj.uid, type, selector, headless, publishNotReady: spec.publishNotReadyAddresses === true, ports };
  if (externalName) info.externalName = externalName;
  const healthCheck = type === 'LoadBalancer' && spec.externalTrafficPolicy === 'Local';
  if (healthCheck && spec.healthCheckNodePort) info.healthCheckNodePort = spec.healthCheckNodePort;
  return { info, type, wantIP: headless ? '' : wantIP, nodePorts, healthCheck };
}

/** Why the proxy cannot program this Service (as it reads its spec), or undefined: the node's API refuses the same. */
export function serviceProblem(obj: StoredObject): string | undefined {
  const r = parseService(obj);
  return typeof r === 'string' ? r : undefined;
}

// ---------------------------------------------------------------- allocation

/**
 * Cluster IPs and node ports, remembered for as long as the Service exists
 * so a Service keeps its address across syncs. Addresses not given in the
 * spec start at a hash of the Service's name, so a restarted proxy mostly
 * picks the same ones again.
 */
export class Allocator {
  private readonly ips = new Map<string, string>(); // service key -> ip
  private readonly ipOwners = new Map<string, string>(); // ip -> service key
  private readonly nodePorts = new Map<string, number>(); // port key/protocol -> nodePort
  private readonly nodePortOwners = new Map<string, string>(); // nodePort/protocol -> port key
  /** Each Service as last resolved, by namespace/name, and by its object. */
  private entries = new Map<string, Entry>();
  private readonly byObject = new Map<StoredObject, Entry>();
  /** Counts resolve() calls: an entry seen in this one carries its number. */
  private gen = 0;
  private last: ResolveResult | undefined;
  /** Allocation problems in the last answer: the next resolve() is then a whole pass. */
  private allocProblems = 0;
  /** Health-check node ports the Services hold or ask for, by namespace/name. */
  private readonly hcPorts = new Map<string, number>();
  /** Each Service's allocation problem (undefined: allocated) during one resolve(). */
  private readonly allocated = new Map<Parsed, string | undefined>();
  private reserved = new Set<number>();
  /** At most this many changed or removed Services are resolved on their own (see resolve()). */
  private readonly incrementalMax: number;
  readonly cidr: Cidr;

  constructor(serviceCidr: string, opts: { incrementalMax?: number } = {}) {
    this.incrementalMax = opts.incrementalMax ?? 256;
    const c = parseCidr(serviceCidr);
    if (!c || c.bits > 30) throw new Error(`service CIDR "${serviceCidr}" is not an IPv4 CIDR with room for Services (at most /30)`);
    this.cidr = c;
  }

  /**
   * Parses and allocates every Service; returns those that can be programmed
   * and a problem for each that cannot. Services already holding addresses
   * are processed first, so a newcomer never takes an address away.
   *
   * When only a few Services changed since the last call and every Service
   * then was allocated, only those are parsed, released and allocated again
   * (the others hold what they hold, so the answer is the one a whole pass
   * gives); the answer's arrays are then the last answer's when nothing
   * changed. After any allocation problem the next call is a whole pass, as
   * a Service gone may have freed what another one waits for.
   */
  resolve(objects: StoredObject[]): ResolveResult {
    // Unchanged Services are told by identity (sources hand out the same object until it changes) or, for
    // a copy, by uid and revision; names are only built for the others.
    const gen = ++this.gen;
    const changed: StoredObject[] = [];
    let duplicate = false;
    for (const obj of objects) {
      if (obj.kind !== 'Service') continue;
      let e = this.byObject.get(obj);
      if (!e || !sameContent(e, obj)) {
        const was = this.entries.get(`${obj.namespace}/${obj.name}`);
        if (!was || !sameContent(was, obj) || was.gen === gen) {
          changed.push(obj);
          continue;
        }
        this.byObject.delete(was.obj);
        this.byObject.set(obj, was);
        was.obj = obj;
        e = was;
      }
      // The same Service twice in one list: left to the whole pass.
      if (e.gen === gen) duplicate = true;
      e.gen = gen;
    }
    const changedKeys = new Set(changed.map((o) => `${o.namespace}/${o.name}`));
    if (changedKeys.size !== changed.length) duplicate = true;
    const removed: string[] = [];
    for (const [key, e] of this.entries) {
      if (e.gen === gen) duplicate ||= changedKeys.has(key);
      else if (!changedKeys.has(key)) removed.push(key);
    }
    const last = this.last;
    if (last && this.allocProblems === 0 && !duplicate && changed.length + removed.length <= this.incrementalMax) {
      if (changed.length === 0 && removed.length === 0) return { ...last, changed: [] };
      return (this.last = this.resolveSome(last, changed, removed));
    }
    return (this.last = this.resolveAll(objects));
  }

  private resolveAll(objects: StoredObject[]): ResolveResult {
    const problems: ServiceProblem[] = [];
    const parsed: Parsed[] = [];
    const entries = new Map<string, Entry>();
    this.byObject.clear();
    // One Service per namespace/name, the last given: two would both be allocated (under one key, so the
    // address held was one's and the ports the other's) and both written, and the next answers built on it.
    const byKey = new Map<string, StoredObject>();
    for (const obj of objects) if (obj.kind === 'Service') byKey.set(`${obj.namespace}/${obj.name}`, obj);
    for (const [key, obj] of byKey) {
      // An object's uid (or, for the API's objects, its revision) changes with its content: unchanged Services are not parsed again.
      const was = this.entries.get(key);
      const r = was && sameContent(was, obj) ? was.parsed : parseService(obj);
      const e: Entry = { obj, uid: obj.uid, revision: obj.revision, parsed: r, gen: this.gen };
      entries.set(key, e);
      this.byObject.set(obj, e);
      if (typeof r === 'string') problems.push({ service: key, reason: r });
      else parsed.push(r);
    }
    this.entries = entries;
    this.release(parsed);
    this.hcPorts.clear();
    this.allocateInOrder(parsed);
    const services: ServiceInfo[] = [];
    let allocProblems = 0;
    for (const p of parsed) {
      const problem = this.allocated.get(p);
      if (problem) {
        problems.push({ service: keyOf(p), reason: problem });
        allocProblems++;
      } else services.push(p.info);
      if (p.healthCheck && p.info.healthCheckNodePort) this.hcPorts.set(keyOf(p), p.info.healthCheckNodePort);
    }
    this.allocated.clear();
    this.allocProblems = allocProblems;
    services.sort(byName);
    problems.sort((a, b) => byteCompare(a.service, b.service));
    return { services, problems };
  }

  /** resolve() for a few changed or removed Services, from the last answer. */
  private resolveSome(last: ResolveResult, changed: StoredObject[], removed: string[]): ResolveResult {
    const gone = new Set<ServiceInfo>();
    const keys = new Set<string>(removed);
    const want = new Map<string, Parsed | string>();
    const objectOf = new Map<string, StoredObject>();
    for (const obj of changed) {
      const key = `${obj.namespace}/${obj.name}`;
      keys.add(key);
      want.set(key, parseService(obj));
      objectOf.set(key, obj);
    }
    for (const key of keys) {
      const old = this.entries.get(key);
      const was = old?.parsed;
      if (was !== undefined && typeof was !== 'string') gone.add(was.info);
      this.releaseOne(key, was, want.get(key));
      this.hcPorts.delete(key);
      if (old) this.byObject.delete(old.obj);
      const r = want.get(key);
      const obj = objectOf.get(key);
      if (r === undefined || !obj) this.entries.delete(key);
      else {
        const e: Entry = { obj, uid: obj.uid, revision: obj.revision, parsed: r, gen: this.gen };
        this.entries.set(key, e);
        this.byObject.set(obj, e);
      }
    }
    const parsed = [...want.values()].filter((r): r is Parsed => typeof r !== 'string');
    for (const [key, r] of want) if (typeof r !== 'string' && r.healthCheck && r.info.healthCheckNodePort) this.hcPorts.set(key, r.info.healthCheckNodePort);
    this.allocateInOrder(parsed);
    // The last answer's list is sorted: the few gone are found and the few new placed by bisection.
    const services = last.services.slice();
    for (const info of gone) {
      const i = bisect(services, info);
      if (services[i] === info) services.splice(i, 1);
    }
    const problems = last.problems.filter((p) => !keys.has(p.service));
    for (const [key, r] of want) if (typeof r === 'string') problems.push({ service: key, reason: r });
    for (const p of parsed) {
      const problem = this.allocated.get(p);
      if (problem) {
        problems.push({ service: keyOf(p), reason: problem });
        this.allocProblems++;
      } else services.splice(bisect(services, p.info), 0, p.info);
      if (p.healthCheck && p.info.healthCheckNodePort) this.hcPorts.set(keyOf(p), p.info.healthCheckNodePort);
    }
    this.allocated.clear();
    problems.sort((a, b) => byteCompare(a.service, b.service));
    return { services, problems, changed: [...keys] };
  }

  /** Allocates each (holders first, then those asking for a specific address, then by name), noting each one's problem in `allocated`. */
  private allocateInOrder(parsed: Parsed[]): void {
    const order = parsed.map((p) => {
      const key = keyOf(p);
      return { p, key: `${this.ips.has(key) ? 0 : 1}${p.wantIP ? 0 : 1}${key}` };
    });
    order.sort((a, b) => byteCompare(a.key, b.key));
    // Health-check ports the API gave are spoken for before any node port is picked.
    this.reserved = new Set(this.hcPorts.values());
    for (const p of parsed) if (p.healthCheck && p.info.healthCheckNodePort) this.reserved.add(p.info.healthCheckNodePort);
    for (const o of order) this.allocated.set(o.p, this.allocate(o.p));
  }

  /** Forgets addresses of Services gone, or whose spec now asks for a different one. */
  private release(parsed: Parsed[]): void {
    const want = new Map(parsed.map((p) => [keyOf(p), p]));
    for (const [key, ip] of this.ips) {
      const p = want.get(key);
      if (!p || p.info.headless || (p.wantIP && p.wantIP !== ip)) {
        this.ips.delete(key);
        this.ipOwners.delete(ip);
      }
    }
    const wantPorts = new Map<string, number | undefined>();
    for (const p of parsed) wantedPorts(p, wantPorts);
    for (const [pk, np] of this.nodePorts) {
      if (!wantPorts.has(pk) || (wantPorts.get(pk) !== undefined && wantPorts.get(pk) !== np)) this.releasePort(pk, np);
    }
  }

  /** release() for one Service: what it was (if it parsed), what it is now (undefined: gone). */
  private releaseOne(key: string, was: Parsed | string | undefined, now: Parsed | string | undefined): void {
    const p = typeof now === 'string' ? undefined : now;
    const ip = this.ips.get(key);
    if (ip !== undefined && (!p || p.info.headless || (p.wantIP && p.wantIP !== ip))) {
      this.ips.delete(key);
      this.ipOwners.delete(ip);
    }
    if (was === undefined || typeof was === 'string') return;
    // A Service's node ports are keyed by its own port keys: what it held is among what it wanted.
    const held = new Map<string, number | undefined>();
    wantedPorts(was, held);
    const wantPorts = new Map<string, number | undefined>();
    if (p) wantedPorts(p, wantPorts);
    for (const pk of held.keys()) {
      const np = this.nodePorts.get(pk);
      if (np === undefined) continue;
      if (!wantPorts.has(pk) || (wantPorts.get(pk) !== undefined && wantPorts.get(pk) !== np)) this.releasePort(pk, np);
    }
  }

  private releasePort(pk: string, np: number): void {
    this.nodePorts.delete(pk);
    this.nodePortOwners.delete(`${np}/${pk.split('/').pop()}`);
  }

  private allocate(p: Parsed): string | undefined {
    const key = keyOf(p);
    const info = p.info;
    const newIP = !info.headless && !this.ips.has(key);
    if (!info.headless) {
      let ip = this.ips.get(key);
      if (!ip) {
        if (p.wantIP) {
          if (!cidrContains(this.cidr, p.wantIP)) return `clusterIP ${p.wantIP} is not in the service CIDR ${this.cidr.text}`;
          const owner = this.ipOwners.get(p.wantIP);
          if (owner) return `clusterIP ${p.wantIP} is already taken by ${owner}`;
          ip = p.wantIP;
        } else {
          ip = this.pickIP(key);
          if (!ip) return `no free clusterIP left in ${this.cidr.text}`;
        }
      }
      info.clusterIP = ip;
      for (const sp of info.ports) sp.clusterIP = ip;
    }
    // Node ports: all or nothing for the Service.
    const taken: string[] = [];
    const undo = () => {
      for (const pk of taken) {
        const np = this.nodePorts.get(pk);
        this.nodePorts.delete(pk);
        if (np !== undefined) this.nodePortOwners.delete(`${np}/${pk.split('/').pop()}`);
      }
      if (newIP && info.clusterIP) {
        this.ips.delete(key);
        this.ipOwners.delete(info.clusterIP);
      }
    };
    if (p.nodePorts) {
      for (const sp of info.ports) {
        const pk = `${sp.key}/${sp.protocol}`;
        let np = this.nodePorts.get(pk);
        if (np === undefined) {
          if (sp.nodePort !== undefined) {
            if (sp.nodePort < NODE_PORT_MIN || sp.nodePort > NODE_PORT_MAX) {
              undo();
              return `port ${sp.portName || sp.port}: nodePort ${sp.nodePort} is not in ${NODE_PORT_MIN}-${NODE_PORT_MAX}`;
            }
            const owner = this.nodePortOwners.get(`${sp.nodePort}/${sp.protocol}`);
            if (owner) {
              undo();
              return `port ${sp.portName || sp.port}: nodePort ${sp.nodePort}/${sp.protocol} is already taken by ${owner}`;
            }
            np = sp.nodePort;
          } else {
            np = this.pickNodePort(pk, sp.protocol);
            if (np === undefined) {
              undo();
              return 'no free nodePort left';
            }
          }
          this.nodePorts.set(pk, np);
          this.nodePortOwners.set(`${np}/${sp.protocol}`, sp.key);
          taken.push(pk);
        }
        sp.nodePort = np;
      }
    }
    if (p.healthCheck) {
      const pk = hcKey(key);
      let np = this.nodePorts.get(pk);
      if (np === undefined) {
        const want = info.healthCheckNodePort;
        const owner = want !== undefined ? this.nodePortOwners.get(`${want}/TCP`) : undefined;
        if (owner) {
          undo();
          return `healthCheckNodePort ${want} is already taken by ${owner}`;
        }
        np = want ?? this.pickNodePort(pk, 'TCP');
        if (np === undefined) {
          undo();
          return 'no free node port left for the health check';
        }
        this.nodePorts.set(pk, np);
        this.nodePortOwners.set(`${np}/TCP`, `${key} health check`);
        taken.push(pk);
      }
      info.healthCheckNodePort = np;
    }
    if (info.clusterIP) {
      this.ips.set(key, info.clusterIP);
      this.ipOwners.set(info.clusterIP, key);
    }
    return undefined;
  }

  private pickIP(key: string): string | undefined {
    // Skip the network address, the broadcast address and .1 (the "kubernetes" Service's by convention).
    const usable = this.cidr.size - 3;
    const start = hash32(key) % usable;
    for (let i = 0; i < usable; i++) {
      const ip = intToIp(this.cidr.base + 2 + ((start + i) % usable));
      if (!this.ipOwners.has(ip)) return ip;
    }
    return undefined;
  }

  private pickNodePort(key: string, protocol: Protocol): number | undefined {
    const span = NODE_PORT_MAX - NODE_PORT_MIN + 1;
    const start = hash32(key) % span;
    for (let i = 0; i < span; i++) {
      const np = NODE_PORT_MIN + ((start + i) % span);
      if (!this.nodePortOwners.has(`${np}/${protocol}`) && !this.reserved.has(np)) return np;
    }
    return undefined;
  }
}

/** Plain code-unit order: localeCompare costs tens of milliseconds over 10,000 names. */
export const byteCompare = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

const keyOf = (p: Parsed) => p.info.key;
const byName = (a: ServiceInfo, b: ServiceInfo) => byteCompare(a.namespace, b.namespace) || byteCompare(a.name, b.name);

/** The first index in `sorted` (by namespace and name) whose Service does not sort before `s`. */
function bisect(sorted: ServiceInfo[], s: ServiceInfo): number {
  let lo = 0;
  let hi = sorted.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (byName(sorted[mid]!, s) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** What resolve() answers. */
export interface ResolveResult {
  /** Sorted by namespace, then name. */
  services: ServiceInfo[];
  problems: ServiceProblem[];
  /** The Services (namespace/name) added, changed or removed since the last call; undefined: any may have been. */
  changed?: string[];
}

/** A Service in a list sorted by namespace and name (resolve()'s), by namespace/name. */
export function findService(sorted: ServiceInfo[], key: string): ServiceInfo | undefined {
  const slash = key.indexOf('/');
  const namespace = key.slice(0, slash);
  const name = key.slice(slash + 1);
  const s = sorted[bisect(sorted, { namespace, name } as ServiceInfo)];
  return s && s.namespace === namespace && s.name === name ? s : undefined;
}

interface Entry {
  obj: StoredObject;
  uid: string;
  revision: string | undefined;
  parsed: Parsed | string;
  gen: number;
}

/** An object's uid (or, for the API's objects, its revision) changes with its content. */
const sameContent = (e: Entry, obj: StoredObject) => e.uid === obj.uid && e.revision === obj.revision;

/** The node ports a Service wants (each port's, when it has them, and its health check's), by allocator key: the spec's, or undefined for any. */
function wantedPorts(p: Parsed, out: Map<string, number | undefined>): void {
  if (p.nodePorts) for (const sp of p.info.ports) out.set(`${sp.key}/${sp.protocol}`, sp.nodePort);
  if (p.healthCheck) out.set(hcKey(keyOf(p)), p.info.healthCheckNodePort);
}
