/**
 * Service rules rendered as `nft -f` text, in kube-proxy's nftables layout
 * (table `ip kube-proxy`, verdict maps `service-ips` and
 * `service-nodeports`, chains `service-`, `local-`, `external-`,
 * `endpoint-`, `firewall-`, sets `affinity-`, named as kube-proxy names
 * them), so `nft list table ip kube-proxy` reads as it does on a kube-proxy
 * node. Pure: the proxier decides what changed and applies the text as one
 * transaction. A packet's lookup is one map lookup whatever the number of
 * Services; only the chains of the Service it hits are walked.
 */
import type { Endpoint } from './endpoints.js';
import { categorizeEndpoints, chainHash, MASQ_MARK } from './rules.js';
import type { ServicePortInfo } from './service.js';

export const NFT_FAMILY = 'ip';
export const NFT_TABLE = 'kube-proxy';

/**
 * Past this many service ports per table, the Services' own chains are
 * spread over more tables (see tableCount). The kernel checks a table for
 * loops whenever a transaction adds a jump or goto into it, walking every
 * chain reachable from its base chains once per hook: 58 ms for one
 * element at 10,000 Services in one table on this machine's 6.18, 2 ms
 * when the same Services are spread over 16 tables.
 */
export const PORTS_PER_TABLE = 1000;
/** At most this many tables: `kube-proxy`, then `kube-proxy-1` … `kube-proxy-63`. */
export const MAX_TABLES = 64;
const SHARD_RE = /^kube-proxy-([1-9]\d?)$/;

/** How many tables hold this many service ports: 1 up to perTable, then a power of two so no table holds more (at most MAX_TABLES). */
export function tableCount(ports: number, perTable = PORTS_PER_TABLE): number {
  let n = 1;
  while (ports > n * perTable && n < MAX_TABLES) n *= 2;
  return n;
}

/** The i-th table's name: the first is kube-proxy's own. */
export const tableName = (i: number) => (i === 0 ? NFT_TABLE : `${NFT_TABLE}-${i}`);

/** True for the name of a table this proxy makes besides `kube-proxy` (a Service table). */
export const isServiceTable = (name: string) => SHARD_RE.test(name) && Number(SHARD_RE.exec(name)![1]) < MAX_TABLES;

/** The table a service port's dispatch lives in (FNV-1a of its key: the same port, the same table, for a given count). */
export function portTable(key: string, tables: number): string {
  if (tables <= 1) return NFT_TABLE;
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return tableName((h >>> 0) % tables);
}

/** The table one of a port's chains is written in: a firewall chain sits with the filter chains that reach it, in `kube-proxy`. */
export const chainTable = (key: string, c: NftChain, tables: number) => (c.filter ? NFT_TABLE : portTable(key, tables));

const at = (table: string) => `${NFT_FAMILY} ${table}`;

// Top-level chains and maps (kube-proxy's names).
const SERVICES = 'services';
const MASQUERADING = 'masquerading';
const MARK_MASQ = 'mark-for-masquerade';
const ENDPOINTS_CHECK = 'service-endpoints-check';
const FIREWALL_CHECK = 'firewall-check';
const REJECT_CHAIN = 'reject-chain';
export const MAPS = {
  serviceIps: 'service-ips',
  nodePorts: 'service-nodeports',
  noEndpointServices: 'no-endpoint-services',
  noEndpointNodePorts: 'no-endpoint-nodeports',
  firewallIps: 'firewall-ips',
} as const;
type MapName = keyof typeof MAPS;
/** The maps every table has; the others (the filter chains' maps) are only in `kube-proxy`. */
const DISPATCH_MAPS: readonly MapName[] = ['serviceIps', 'nodePorts'];
const mapTable = (m: MapName, key: string, tables: number) => (DISPATCH_MAPS.includes(m) ? portTable(key, tables) : NFT_TABLE);
const ADDR_KEY = 'ipv4_addr . inet_proto . inet_service : verdict';
const PORT_KEY = 'inet_proto . inet_service : verdict';
const MAP_TYPES: Record<MapName, string> = { serviceIps: ADDR_KEY, nodePorts: PORT_KEY, noEndpointServices: ADDR_KEY, noEndpointNodePorts: PORT_KEY, firewallIps: ADDR_KEY };

/** Node ports answer on every local address but 127.0.0.0/8 (kube-proxy's nftables default: no localhost node ports). */
const NODE_LOCAL = 'fib daddr type local ip daddr != 127.0.0.0/8';

/** One element of a verdict map: `key : verdict`. */
export interface NftElement {
  key: string;
  verdict: string;
  comment?: string;
}

export interface NftChain {
  name: string;
  rules: string[];
  /** Reached from the filter chains (a firewall chain): kept in `kube-proxy` whatever table the port's other chains are in. */
  filter?: true;
}

/** Everything one service port contributes to the table. */
export interface NftPortRules {
  key: string;
  elements: Record<MapName, NftElement[]>;
  /** Its own chains, in the order they are written (service/local/external/firewall, then endpoints). */
  chains: NftChain[];
  /** ClientIP affinity: one set of client addresses per endpoint, each entry timing out after the affinity seconds. */
  sets: Array<{ name: string; timeout: number }>;
}

/** A service port's name in kube-proxy's chain names: `ns/svc/proto/portName`. */
const portBase = (sp: ServicePortInfo) => `${sp.namespace}/${sp.name}/${sp.protocol.toLowerCase()}/${sp.portName}`;
/** kube-proxy prefixes a name with 8 characters of base32(sha256(name)) so similar names read apart. */
const hashed = (name: string) => `${chainHash(name).slice(0, 8)}-${name}`;
export const nftServiceBase = (sp: ServicePortInfo) => hashed(portBase(sp));
export const nftEndpointBase = (sp: ServicePortInfo, ep: Endpoint) => hashed(`${portBase(sp)}__${ep.ip}/${ep.port}`);

/** Chains and sets this proxy makes per service port all have a '/' in their names; the fixed ones never do. */
export const isServiceChain = (name: string) => name.includes('/');

const q = (s: string) => `"${s.replace(/["\\]/g, '')}"`;

/** nft refuses a comment of more than 128 bytes ("comment too long"), and with it the whole transaction. */
export const NFT_COMMENT_MAX = 128;

/**
 * A comment nft takes: cut to NFT_COMMENT_MAX bytes. A port's key
 * (`ns/name:port`) can be 191 characters long, and one Service's comment
 * must not make every sync fail.
 */
export function nftComment(s: string): string {
  const b = Buffer.from(s, 'utf8');
  if (b.length <= NFT_COMMENT_MAX) return s;
  // Cut on a character boundary: no UTF-8 sequence split in two.
  let end = NFT_COMMENT_MAX;
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end).toString('utf8');
}

export interface NftRenderOptions {
  /** Pod traffic (kube-proxy's local detector): masquerade decisions and the external chain's short-circuit. */
  podCidr: string;
}

/** One service port's elements, chains and sets, as kube-proxy's nftables proxier writes them. */
export function renderNftPort(sp: ServicePortInfo, endpoints: Endpoint[], opts: NftRenderOptions): NftPortRules {
  const out: NftPortRules = { key: sp.key, elements: { serviceIps: [], nodePorts: [], noEndpointServices: [], noEndpointNodePorts: [], firewallIps: [] }, chains: [], sets: [] };
  if (!sp.clusterIP) return out; // headless: DNS only
  const p = sp.protocol.toLowerCase();
  const { cluster: clusterEps, local: localEps, any: hasEndpoints } = categorizeEndpoints(endpoints);
  const lbIPs = sp.loadBalancerIPs ?? [];
  const extIPs = sp.externalIPs ?? [];
  const externallyAccessible = sp.nodePort !== undefined || lbIPs.length > 0 || extIPs.length > 0;
  const externalLocal = externallyAccessible && sp.externalLocal;
  const base = nftServiceBase(sp);
  const clusterChain = `service-${base}`;
  const localChain = `local-${base}`;
  const externalChain = `external-${base}`;
  const fwChain = `firewall-${base}`;
  const usesCluster = clusterEps.length > 0 && (!sp.internalLocal || externallyAccessible);
  const usesLocal = localEps.length > 0 && (sp.internalLocal || externalLocal);
  const internalChain = sp.internalLocal ? localChain : clusterChain;
  const hasInternal = hasEndpoints && (!sp.internalLocal || localEps.length > 0);
  const externalPolicyChain = externalLocal ? localChain : clusterChain;
  const hasExternal = hasEndpoints && (!externalLocal || localEps.length > 0);
  const usesExternal = hasEndpoints && externallyAccessible;
  const noEndpoints = `goto ${REJECT_CHAIN}`;
  const internalVerdict = hasEndpoints ? 'drop' : noEndpoints;
  const externalVerdict = hasEndpoints ? 'drop' : noEndpoints;
  const comment = nftComment(sp.key);
  const el = out.elements;
  const addrKey = (ip: string, port: number) => `${ip} . ${p} . ${port}`;

  if (hasInternal) el.serviceIps.push({ key: addrKey(sp.clusterIP, sp.port), verdict: `goto ${internalChain}` });
  else el.noEndpointServices.push({ key: addrKey(sp.clusterIP, sp.port), verdict: internalVerdict, comment });
  for (const ip of extIPs) {
    if (hasEndpoints) el.serviceIps.push({ key: addrKey(ip, sp.port), verdict: `goto ${externalChain}` });
    if (!hasExternal) el.noEndpointServices.push({ key: addrKey(ip, sp.port), verdict: externalVerdict, comment });
  }
  const firewalled = lbIPs.length > 0 && (sp.sourceRanges?.length ?? 0) > 0;
  for (const ip of lbIPs) {
    if (hasEndpoints) el.serviceIps.push({ key: addrKey(ip, sp.port), verdict: `goto ${externalChain}` });
    if (firewalled) el.firewallIps.push({ key: addrKey(ip, sp.port), verdict: `goto ${fwChain}`, comment });
    if (!hasExternal) el.noEndpointServices.push({ key: addrKey(ip, sp.port), verdict: externalVerdict, comment });
  }
  if (sp.nodePort !== undefined) {
    // Node ports are not subject to loadBalancerSourceRanges (neither are kube-proxy's).
    if (hasEndpoints) el.nodePorts.push({ key: `${p} . ${sp.nodePort}`, verdict: `goto ${externalChain}` });
    if (!hasExternal) el.noEndpointNodePorts.push({ key: `${p} . ${sp.nodePort}`, verdict: externalVerdict, comment });
  }

  const chains = new Map<string, string[]>();
  const chain = (name: string) => {
    let rules = chains.get(name);
    if (!rules) chains.set(name, (rules = []));
    return rules;
  };
  if (usesCluster) chain(clusterChain);
  if (usesLocal) chain(localChain);
  if (usesExternal) chain(externalChain);
  if (firewalled) chain(fwChain).push(`ip saddr != { ${sp.sourceRanges!.join(', ')} } drop`);
  if (hasInternal) {
    // Traffic to the cluster IP from outside the pod network (the node, other hosts) is masqueraded.
    chain(internalChain).push(`ip daddr ${sp.clusterIP} ${p} dport ${sp.port} ip saddr != ${opts.podCidr} jump ${MARK_MASQ}`);
  }
  if (usesExternal) {
    const ext = chain(externalChain);
    if (!externalLocal) ext.push(`jump ${MARK_MASQ}`);
    else {
      // Pods and the node itself reach every endpoint (as if through an outside balancer); the node's own traffic is masqueraded.
      ext.push(`ip saddr ${opts.podCidr} goto ${clusterChain} comment "short-circuit pod traffic"`);
      ext.push(`fib saddr type local jump ${MARK_MASQ} comment "masquerade local traffic"`);
      ext.push(`fib saddr type local goto ${clusterChain} comment "short-circuit local traffic"`);
    }
    if (hasExternal) ext.push(`goto ${externalPolicyChain}`);
  }

  const affinity = sp.affinitySeconds;
  const reachable = [...new Set([...(usesCluster ? clusterEps : []), ...(usesLocal ? localEps : [])])];
  const epBase = new Map(reachable.map((e) => [e, nftEndpointBase(sp, e)]));
  const balance = (name: string, eps: Endpoint[]) => {
    const rules = chain(name);
    if (affinity !== undefined) for (const e of eps) rules.push(`ip saddr @affinity-${epBase.get(e)} goto endpoint-${epBase.get(e)}`);
    // kube-proxy writes one `numgen random mod N vmap { 0 : goto …, … }`; each such vmap is an
    // anonymous set, and the kernel names a new anonymous set by walking the table's sets, so a
    // 10,000-Service transaction spent 90 s in the kernel (6.18). One rule per endpoint instead, as
    // iptables' statistic rules: the i-th of N is taken with probability 1/(N-i), evenly in all.
    eps.forEach((e, i) => {
      const left = eps.length - i;
      rules.push(left > 1 ? `numgen random mod ${left} 0 goto endpoint-${epBase.get(e)}` : `goto endpoint-${epBase.get(e)}`);
    });
  };
  if (usesCluster) balance(clusterChain, clusterEps);
  if (usesLocal) balance(localChain, localEps);
  for (const e of reachable) {
    const b = epBase.get(e)!;
    // A pod reaching itself through the Service (hairpin) is masqueraded, or it would answer itself.
    const rules = chain(`endpoint-${b}`);
    rules.push(`ip saddr ${e.ip} jump ${MARK_MASQ}`);
    if (affinity !== undefined) {
      rules.push(`update @affinity-${b} { ip saddr }`);
      out.sets.push({ name: `affinity-${b}`, timeout: affinity });
    }
    rules.push(`meta l4proto ${p} dnat to ${e.ip}:${e.port}`);
  }
  out.chains = [...chains].map(([name, rules]) => (name === fwChain ? { name, rules, filter: true } : { name, rules }));
  return out;
}

export interface NftAssembleInput {
  /** Every service port's rules. */
  ports: NftPortRules[];
  /**
   * A partial sync: what the last successful sync wrote, per port key. Only
   * the ports whose rendering differs are touched: map elements deleted and
   * added one by one, their chains rewritten, chains and sets no longer
   * wanted deleted. Undefined: a full sync, which rewrites the whole table.
   */
  previous?: Map<string, NftPortRules>;
  /**
   * A full sync over a table of unknown content (the first, or after a
   * failure): the table is deleted and made again in the same transaction.
   * Otherwise a full sync keeps the table (and its affinity sets' entries)
   * and deletes `staleChains` / `staleSets`.
   */
  fresh?: boolean;
  staleChains?: Array<{ table: string; name: string }>;
  staleSets?: Array<{ table: string; name: string }>;
  /** Tables the ports are spread over (see tableCount); default 1. */
  tables?: number;
  /** A fresh sync: other tables of this proxy to delete (an earlier count's, or left by an earlier run). */
  dropTables?: string[];
}

export interface NftRuleset {
  text: string;
  /** Rules and elements written. */
  rulesWritten: number;
  /** A partial sync's steps, which the text spells out (see NftOp). */
  ops?: NftOp[];
}

const BASE_CHAINS: Array<[string, string, string, number]> = [
  // Filtering sees destinations before DNAT, so it runs just ahead of it.
  ['filter-prerouting', 'filter', 'prerouting', -110],
  ['filter-input', 'filter', 'input', -110],
  ['filter-forward', 'filter', 'forward', -110],
  ['filter-output', 'filter', 'output', -110],
  ['nat-prerouting', 'nat', 'prerouting', -100],
  ['nat-output', 'nat', 'output', -100],
  ['nat-postrouting', 'nat', 'postrouting', 100],
];

/** The fixed rules of `kube-proxy`, by chain. */
const HEADER_RULES: Array<[string, string]> = [
  // reject is only valid in the input, forward and output hooks.
  ['filter-input', `ct state new jump ${ENDPOINTS_CHECK}`],
  ['filter-forward', `ct state new jump ${ENDPOINTS_CHECK}`],
  ['filter-output', `ct state new jump ${ENDPOINTS_CHECK}`],
  ['filter-prerouting', `ct state new jump ${FIREWALL_CHECK}`],
  ['filter-output', `ct state new jump ${FIREWALL_CHECK}`],
  ['nat-output', `jump ${SERVICES}`],
  ['nat-prerouting', `jump ${SERVICES}`],
  ['nat-postrouting', `jump ${MASQUERADING}`],
  [MARK_MASQ, `mark set mark or ${MASQ_MARK}`],
  [MASQUERADING, `mark and ${MASQ_MARK} == 0 return`],
  [MASQUERADING, `mark set mark xor ${MASQ_MARK}`],
  [MASQUERADING, 'masquerade fully-random'],
  [REJECT_CHAIN, 'reject'],
  [ENDPOINTS_CHECK, `ip daddr . meta l4proto . th dport vmap @${MAPS.noEndpointServices}`],
  [ENDPOINTS_CHECK, `${NODE_LOCAL} meta l4proto . th dport vmap @${MAPS.noEndpointNodePorts}`],
  [FIREWALL_CHECK, `ip daddr . meta l4proto . th dport vmap @${MAPS.firewallIps}`],
  [SERVICES, `ip daddr . meta l4proto . th dport vmap @${MAPS.serviceIps}`],
  [SERVICES, `${NODE_LOCAL} meta l4proto . th dport vmap @${MAPS.nodePorts}`],
];

/** The table's fixed part: base chains, dispatch chains and maps, each (re)made and flushed. */
function header(out: string[]): number {
  const T = at(NFT_TABLE);
  out.push(`add table ${T} { comment "rules for kube-proxy" ; }`);
  for (const [name, type, hook, prio] of BASE_CHAINS) {
    out.push(`add chain ${T} ${name} { type ${type} hook ${hook} priority ${prio} ; }`, `flush chain ${T} ${name}`);
  }
  for (const c of [ENDPOINTS_CHECK, FIREWALL_CHECK, SERVICES, MASQUERADING, MARK_MASQ, REJECT_CHAIN]) out.push(`add chain ${T} ${c}`, `flush chain ${T} ${c}`);
  for (const m of Object.keys(MAPS) as MapName[]) out.push(`add map ${T} ${MAPS[m]} { type ${MAP_TYPES[m]} ; }`, `flush map ${T} ${MAPS[m]}`);
  for (const [c, r] of HEADER_RULES) out.push(`add rule ${T} ${c} ${r}`);
  return HEADER_RULES.length;
}

/** The chains of a further table's fixed part: the nat base chains that lead to the Services, and the dispatch. */
const SHARD_CHAINS = new Set(['nat-prerouting', 'nat-output', SERVICES, MARK_MASQ]);

/**
 * A further table's fixed part: the nat base chains and the dispatch (its
 * own service-ips and service-nodeports maps) for its own Services;
 * masquerading, the filter chains and their maps stay in `kube-proxy`
 * (the packet mark that asks for masquerading crosses tables).
 */
function shardHeader(out: string[], table: string): number {
  const T = at(table);
  out.push(`add table ${T} { comment "rules for kube-proxy: Services spread over tables" ; }`);
  for (const [name, type, hook, prio] of BASE_CHAINS) if (SHARD_CHAINS.has(name)) out.push(`add chain ${T} ${name} { type ${type} hook ${hook} priority ${prio} ; }`, `flush chain ${T} ${name}`);
  for (const c of [SERVICES, MARK_MASQ]) out.push(`add chain ${T} ${c}`, `flush chain ${T} ${c}`);
  for (const m of DISPATCH_MAPS) out.push(`add map ${T} ${MAPS[m]} { type ${MAP_TYPES[m]} ; }`, `flush map ${T} ${MAPS[m]}`);
  const rules = HEADER_RULES.filter(([c]) => SHARD_CHAINS.has(c));
  for (const [c, r] of rules) out.push(`add rule ${T} ${c} ${r}`);
  return rules.length;
}

const elementText = (e: NftElement) => (e.comment ? `${e.key} comment ${q(e.comment)} : ${e.verdict}` : `${e.key} : ${e.verdict}`);

/** `add element` (or `delete element`, keys only) lines for one map, by the map's name in the table. */
function elementLines(out: string[], verb: 'add' | 'delete', table: string, map: string, elements: NftElement[]): void {
  // Batches keep lines short; one transaction all the same.
  const text = verb === 'add' ? elementText : (e: NftElement) => e.key;
  for (let i = 0; i < elements.length; i += 1000) out.push(`${verb} element ${at(table)} ${map} { ${elements.slice(i, i + 1000).map(text).join(', ')} }`);
}

/** A chain is declared (and emptied, when it may exist) before any rule names it: rules jump to chains declared later in the text. */
function declareChain(out: string[], table: string, c: NftChain, flush: boolean): void {
  out.push(`add chain ${at(table)} ${c.name}`);
  if (flush) out.push(`flush chain ${at(table)} ${c.name}`);
}

function writeRules(out: string[], table: string, c: NftChain): void {
  for (const r of c.rules) out.push(`add rule ${at(table)} ${c.name} ${r}`);
}

const setLine = (table: string, s: { name: string; timeout: number }): string => `add set ${at(table)} ${s.name} { type ipv4_addr ; flags dynamic,timeout ; timeout ${s.timeout}s ; }`;

/** Elements by table (in table order) and map (in MAPS order). */
class ElementsByTable {
  private readonly byTable = new Map<string, Record<MapName, NftElement[]>>();
  constructor(tables: number) {
    for (let i = 0; i < tables; i++) this.byTable.set(tableName(i), emptyMaps());
  }
  add(table: string, m: MapName, e: NftElement): void {
    let maps = this.byTable.get(table);
    if (!maps) this.byTable.set(table, (maps = emptyMaps()));
    maps[m].push(e);
  }
  /** Each non-empty list, maps in MAPS order and, for each map, the tables in order. */
  *lists(): Generator<[string, MapName, NftElement[]]> {
    for (const m of Object.keys(MAPS) as MapName[]) for (const [table, maps] of this.byTable) if (maps[m].length) yield [table, m, maps[m]];
  }
}

const emptyMaps = (): Record<MapName, NftElement[]> => ({ serviceIps: [], nodePorts: [], noEndpointServices: [], noEndpointNodePorts: [], firewallIps: [] });

/** One `nft -f` transaction. */
export function assembleNft(input: NftAssembleInput): NftRuleset {
  return input.previous ? assemblePartial(input, input.previous) : assembleFull(input);
}

function assembleFull(input: NftAssembleInput): NftRuleset {
  const out: string[] = [];
  const tables = input.tables ?? 1;
  const shards = Array.from({ length: tables - 1 }, (_, i) => tableName(i + 1));
  if (input.fresh) {
    for (const t of new Set([NFT_TABLE, ...(input.dropTables ?? []), ...shards])) out.push(`add table ${at(t)}`, `delete table ${at(t)}`);
  }
  let n = header(out);
  for (const t of shards) n += shardHeader(out, t);
  const all = new ElementsByTable(tables);
  for (const pr of input.ports) {
    const table = portTable(pr.key, tables);
    for (const s of pr.sets) out.push(setLine(table, s));
    for (const m of Object.keys(MAPS) as MapName[]) for (const e of pr.elements[m]) all.add(mapTable(m, pr.key, tables), m, e);
  }
  for (const pr of input.ports) for (const c of pr.chains) declareChain(out, chainTable(pr.key, c, tables), c, !input.fresh);
  for (const pr of input.ports) {
    for (const c of pr.chains) {
      writeRules(out, chainTable(pr.key, c, tables), c);
      n += c.rules.length;
    }
  }
  // Maps were flushed above, so every stale chain is unreferenced by now.
  for (const c of input.staleChains ?? []) out.push(`flush chain ${at(c.table)} ${c.name}`);
  for (const c of input.staleChains ?? []) out.push(`delete chain ${at(c.table)} ${c.name}`);
  for (const s of input.staleSets ?? []) out.push(`delete set ${at(s.table)} ${s.name}`);
  for (const [table, m, elements] of all.lists()) {
    elementLines(out, 'add', table, MAPS[m], elements);
    n += elements.length;
  }
  out.push('');
  return { text: out.join('\n'), rulesWritten: n };
}

/**
 * One step of a partial sync, in one of the proxy's tables (`kube-proxy`
 * when not said): what a line of `nft -f` text says, kept apart so the same
 * steps can be sent as netlink messages (nft-netlink.ts) instead of through nft.
 */
export type NftOp = { table?: string } & (
  | { op: 'add-element' | 'delete-element'; map: string; elements: NftElement[] }
  | { op: 'add-set'; name: string; timeout: number }
  | { op: 'add-chain' | 'flush-chain' | 'delete-chain'; chain: string }
  | { op: 'add-rule'; chain: string; rule: string }
  | { op: 'delete-set'; name: string }
);

/** The ops as `nft -f` text, one transaction. */
export function opsText(ops: NftOp[]): string {
  const out: string[] = [];
  for (const o of ops) {
    const table = o.table ?? NFT_TABLE;
    switch (o.op) {
      case 'add-element':
      case 'delete-element':
        elementLines(out, o.op === 'add-element' ? 'add' : 'delete', table, o.map, o.elements);
        break;
      case 'add-set':
        out.push(setLine(table, o));
        break;
      case 'add-chain':
      case 'flush-chain':
      case 'delete-chain':
        out.push(`${o.op.replace('-', ' ')} ${at(table)} ${o.chain}`);
        break;
      case 'add-rule':
        out.push(`add rule ${at(table)} ${o.chain} ${o.rule}`);
        break;
      case 'delete-set':
        out.push(`delete set ${at(table)} ${o.name}`);
        break;
    }
  }
  if (out.length === 0) return '';
  out.push('');
  return out.join('\n');
}

/** What a partial sync changes, as ops; `rulesWritten` counts rules and elements as a full sync does. */
export function partialOps(ports: NftPortRules[], previous: Map<string, NftPortRules>, tables = 1): { ops: NftOp[]; rulesWritten: number } {
  const current = new Map(ports.map((p) => [p.key, p]));
  // Only the ports whose rendering is not the one applied (same object: nothing of it changed).
  const keys: string[] = [];
  for (const p of ports) if (previous.get(p.key) !== p) keys.push(p.key);
  for (const k of previous.keys()) if (!current.has(k)) keys.push(k);
  return changedOps(keys, (k) => previous.get(k), (k) => current.get(k), tables);
}

/**
 * partialOps() for the ports named only (the others are left as they are):
 * each one's rendering applied before and now (undefined: absent), the
 * count of tables the same before and now.
 */
export function changedOps(changedKeys: Iterable<string>, before: (key: string) => NftPortRules | undefined, now: (key: string) => NftPortRules | undefined, tables = 1): { ops: NftOp[]; rulesWritten: number } {
  // In key order, so the same change always makes the same steps.
  const keys = [...new Set(changedKeys)].sort();
  const dels = new ElementsByTable(tables);
  const adds = new ElementsByTable(tables);
  const sets: NftOp[] = [];
  const declared: NftOp[] = [];
  const rules: NftOp[] = [];
  const goneChains: Array<{ table: string; chain: string }> = [];
  const goneSets: Array<{ table: string; name: string }> = [];
  let n = 0;
  for (const key of keys) {
    const old = before(key);
    const cur = now(key);
    if (old === cur) continue; // the same rendering: nothing of it changed
    const table = portTable(key, tables);
    for (const m of Object.keys(MAPS) as MapName[]) {
      const mt = mapTable(m, key, tables);
      const was = new Map((old?.elements[m] ?? []).map((e) => [e.key, elementText(e)]));
      const after = new Map((cur?.elements[m] ?? []).map((e) => [e.key, e]));
      for (const e of old?.elements[m] ?? []) if (after.get(e.key) === undefined || elementText(after.get(e.key)!) !== was.get(e.key)) dels.add(mt, m, e);
      for (const e of cur?.elements[m] ?? []) if (was.get(e.key) !== elementText(e)) adds.add(mt, m, e);
    }
    const oldChains = new Map((old?.chains ?? []).map((c) => [c.name, c.rules.join('\n')]));
    const curChains = new Set((cur?.chains ?? []).map((c) => c.name));
    for (const c of cur?.chains ?? []) {
      const was = oldChains.get(c.name);
      if (was === c.rules.join('\n')) continue;
      const ct = chainTable(key, c, tables);
      // Declared (and emptied, when it exists) before any rule names it: rules jump to chains declared later.
      declared.push({ op: 'add-chain', chain: c.name, ...tableOf(ct) });
      if (was !== undefined) declared.push({ op: 'flush-chain', chain: c.name, ...tableOf(ct) });
      for (const r of c.rules) rules.push({ op: 'add-rule', chain: c.name, rule: r, ...tableOf(ct) });
      n += c.rules.length;
    }
    for (const c of old?.chains ?? []) if (!curChains.has(c.name)) goneChains.push({ table: chainTable(key, c, tables), chain: c.name });
    const curSets = new Set((cur?.sets ?? []).map((s) => s.name));
    const oldSets = new Map((old?.sets ?? []).map((s) => [s.name, s.timeout]));
    // A set's timeout cannot be changed in place: the proxier makes the table afresh when one changes (see affinityChanged).
    for (const s of cur?.sets ?? []) if (!oldSets.has(s.name)) sets.push({ op: 'add-set', name: s.name, timeout: s.timeout, ...tableOf(table) });
    for (const s of old?.sets ?? []) if (!curSets.has(s.name)) goneSets.push({ table, name: s.name });
  }
  const ops: NftOp[] = [];
  // Elements that go first (nothing may point at a chain about to be deleted), then new sets and
  // chains, then the chains and sets no longer wanted, last the elements that lead to the new chains.
  for (const [table, m, elements] of dels.lists()) {
    ops.push({ op: 'delete-element', map: MAPS[m], elements, ...tableOf(table) });
    n += elements.length;
  }
  ops.push(...sets, ...declared, ...rules);
  for (const c of goneChains) ops.push({ op: 'flush-chain', chain: c.chain, ...tableOf(c.table) });
  for (const c of goneChains) ops.push({ op: 'delete-chain', chain: c.chain, ...tableOf(c.table) });
  for (const s of goneSets) ops.push({ op: 'delete-set', name: s.name, ...tableOf(s.table) });
  for (const [table, m, elements] of adds.lists()) {
    ops.push({ op: 'add-element', map: MAPS[m], elements, ...tableOf(table) });
    n += elements.length;
  }
  return { ops, rulesWritten: ops.length ? n : 0 };
}

/** An op's table, said only when it is not `kube-proxy` (the ops of one table read as they always did). */
const tableOf = (table: string): { table?: string } => (table === NFT_TABLE ? {} : { table });

function assemblePartial(input: NftAssembleInput, previous: Map<string, NftPortRules>): NftRuleset {
  const { ops, rulesWritten } = partialOps(input.ports, previous, input.tables);
  return { text: opsText(ops), rulesWritten, ops };
}

/** True when some affinity set both had and has a different timeout: the table must be made afresh. */
export function affinityChanged(previous: Map<string, NftPortRules>, ports: NftPortRules[]): boolean {
  const before = new Map<string, number>();
  for (const pr of previous.values()) for (const s of pr.sets) before.set(s.name, s.timeout);
  for (const pr of ports) for (const s of pr.sets) if (before.has(s.name) && before.get(s.name) !== s.timeout) return true;
  return false;
}

/** affinityChanged() for one port's renderings (an affinity set is named after its port and endpoint: no other port has it). */
export function portAffinityChanged(before: NftPortRules | undefined, now: NftPortRules | undefined): boolean {
  if (!before?.sets.length || !now?.sets.length) return false;
  const was = new Map(before.sets.map((s) => [s.name, s.timeout]));
  return now.sets.some((s) => was.has(s.name) && was.get(s.name) !== s.timeout);
}
