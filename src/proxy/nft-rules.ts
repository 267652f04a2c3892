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
const T = `${NFT_FAMILY} ${NFT_TABLE}`;

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
  const comment = sp.key;
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
  out.chains = [...chains].map(([name, rules]) => ({ name, rules }));
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
  staleChains?: string[];
  staleSets?: string[];
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

/** The table's fixed part: base chains, dispatch chains and maps, each (re)made and flushed. */
function header(out: string[]): number {
  out.push(`add table ${T} { comment "rules for kube-proxy" ; }`);
  for (const [name, type, hook, prio] of BASE_CHAINS) {
    out.push(`add chain ${T} ${name} { type ${type} hook ${hook} priority ${prio} ; }`, `flush chain ${T} ${name}`);
  }
  for (const c of [ENDPOINTS_CHECK, FIREWALL_CHECK, SERVICES, MASQUERADING, MARK_MASQ, REJECT_CHAIN]) out.push(`add chain ${T} ${c}`, `flush chain ${T} ${c}`);
  for (const m of Object.keys(MAPS) as MapName[]) out.push(`add map ${T} ${MAPS[m]} { type ${MAP_TYPES[m]} ; }`, `flush map ${T} ${MAPS[m]}`);
  const rules: Array<[string, string]> = [
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
  for (const [c, r] of rules) out.push(`add rule ${T} ${c} ${r}`);
  return rules.length;
}

const elementText = (e: NftElement) => (e.comment ? `${e.key} comment ${q(e.comment)} : ${e.verdict}` : `${e.key} : ${e.verdict}`);

/** `add element` (or `delete element`, keys only) lines for one map, by the map's name in the table. */
function elementLines(out: string[], verb: 'add' | 'delete', map: string, elements: NftElement[]): void {
  // Batches keep lines short; one transaction all the same.
  const text = verb === 'add' ? elementText : (e: NftElement) => e.key;
  for (let i = 0; i < elements.length; i += 1000) out.push(`${verb} element ${T} ${map} { ${elements.slice(i, i + 1000).map(text).join(', ')} }`);
}

/** A chain is declared (and emptied, when it may exist) before any rule names it: rules jump to chains declared later in the text. */
function declareChain(out: string[], c: NftChain, flush: boolean): void {
  out.push(`add chain ${T} ${c.name}`);
  if (flush) out.push(`flush chain ${T} ${c.name}`);
}

function writeRules(out: string[], c: NftChain): void {
  for (const r of c.rules) out.push(`add rule ${T} ${c.name} ${r}`);
}

const setLine = (s: { name: string; timeout: number }): string => `add set ${T} ${s.name} { type ipv4_addr ; flags dynamic,timeout ; timeout ${s.timeout}s ; }`;

/** One `nft -f` transaction. */
export function assembleNft(input: NftAssembleInput): NftRuleset {
  return input.previous ? assemblePartial(input, input.previous) : assembleFull(input);
}

function assembleFull(input: NftAssembleInput): NftRuleset {
  const out: string[] = [];
  if (input.fresh) out.push(`add table ${T}`, `delete table ${T}`);
  let n = header(out);
  const all: Record<MapName, NftElement[]> = { serviceIps: [], nodePorts: [], noEndpointServices: [], noEndpointNodePorts: [], firewallIps: [] };
  for (const pr of input.ports) {
    for (const s of pr.sets) out.push(setLine(s));
    for (const m of Object.keys(all) as MapName[]) for (const e of pr.elements[m]) all[m].push(e);
  }
  for (const pr of input.ports) for (const c of pr.chains) declareChain(out, c, !input.fresh);
  for (const pr of input.ports) {
    for (const c of pr.chains) {
      writeRules(out, c);
      n += c.rules.length;
    }
  }
  // Maps were flushed above, so every stale chain is unreferenced by now.
  for (const c of input.staleChains ?? []) out.push(`flush chain ${T} ${c}`);
  for (const c of input.staleChains ?? []) out.push(`delete chain ${T} ${c}`);
  for (const s of input.staleSets ?? []) out.push(`delete set ${T} ${s}`);
  for (const m of Object.keys(all) as MapName[]) {
    elementLines(out, 'add', MAPS[m], all[m]);
    n += all[m].length;
  }
  out.push('');
  return { text: out.join('\n'), rulesWritten: n };
}

/**
 * One step of a partial sync, in the proxy's table: what a line of `nft -f`
 * text says, kept apart so the same steps can be sent as netlink messages
 * (nft-netlink.ts) instead of through nft.
 */
export type NftOp =
  | { op: 'add-element' | 'delete-element'; map: string; elements: NftElement[] }
  | { op: 'add-set'; name: string; timeout: number }
  | { op: 'add-chain' | 'flush-chain' | 'delete-chain'; chain: string }
  | { op: 'add-rule'; chain: string; rule: string }
  | { op: 'delete-set'; name: string };

/** The ops as `nft -f` text, one transaction. */
export function opsText(ops: NftOp[]): string {
  const out: string[] = [];
  for (const o of ops) {
    switch (o.op) {
      case 'add-element':
      case 'delete-element':
        elementLines(out, o.op === 'add-element' ? 'add' : 'delete', o.map, o.elements);
        break;
      case 'add-set':
        out.push(setLine(o));
        break;
      case 'add-chain':
      case 'flush-chain':
      case 'delete-chain':
        out.push(`${o.op.replace('-', ' ')} ${T} ${o.chain}`);
        break;
      case 'add-rule':
        out.push(`add rule ${T} ${o.chain} ${o.rule}`);
        break;
      case 'delete-set':
        out.push(`delete set ${T} ${o.name}`);
        break;
    }
  }
  if (out.length === 0) return '';
  out.push('');
  return out.join('\n');
}

/** What a partial sync changes, as ops; `rulesWritten` counts rules and elements as a full sync does. */
export function partialOps(ports: NftPortRules[], previous: Map<string, NftPortRules>): { ops: NftOp[]; rulesWritten: number } {
  const current = new Map(ports.map((p) => [p.key, p]));
  // Only the ports whose rendering is not the one applied (same object: nothing of it changed), in key order.
  const keys: string[] = [];
  for (const p of ports) if (previous.get(p.key) !== p) keys.push(p.key);
  for (const k of previous.keys()) if (!current.has(k)) keys.push(k);
  keys.sort();
  const dels: Record<MapName, NftElement[]> = { serviceIps: [], nodePorts: [], noEndpointServices: [], noEndpointNodePorts: [], firewallIps: [] };
  const adds: Record<MapName, NftElement[]> = { serviceIps: [], nodePorts: [], noEndpointServices: [], noEndpointNodePorts: [], firewallIps: [] };
  const sets: NftOp[] = [];
  const declared: NftOp[] = [];
  const rules: NftOp[] = [];
  const goneChains: string[] = [];
  const goneSets: string[] = [];
  let n = 0;
  for (const key of keys) {
    const old = previous.get(key);
    const cur = current.get(key);
    if (old === cur) continue; // the same rendering: nothing of it changed
    for (const m of Object.keys(dels) as MapName[]) {
      const before = new Map((old?.elements[m] ?? []).map((e) => [e.key, elementText(e)]));
      const after = new Map((cur?.elements[m] ?? []).map((e) => [e.key, e]));
      for (const e of old?.elements[m] ?? []) if (after.get(e.key) === undefined || elementText(after.get(e.key)!) !== before.get(e.key)) dels[m].push(e);
      for (const e of cur?.elements[m] ?? []) if (before.get(e.key) !== elementText(e)) adds[m].push(e);
    }
    const oldChains = new Map((old?.chains ?? []).map((c) => [c.name, c.rules.join('\n')]));
    const curChains = new Set((cur?.chains ?? []).map((c) => c.name));
    for (const c of cur?.chains ?? []) {
      const was = oldChains.get(c.name);
      if (was === c.rules.join('\n')) continue;
      // Declared (and emptied, when it exists) before any rule names it: rules jump to chains declared later.
      declared.push({ op: 'add-chain', chain: c.name });
      if (was !== undefined) declared.push({ op: 'flush-chain', chain: c.name });
      for (const r of c.rules) rules.push({ op: 'add-rule', chain: c.name, rule: r });
      n += c.rules.length;
    }
    for (const c of old?.chains ?? []) if (!curChains.has(c.name)) goneChains.push(c.name);
    const curSets = new Set((cur?.sets ?? []).map((s) => s.name));
    const oldSets = new Map((old?.sets ?? []).map((s) => [s.name, s.timeout]));
    // A set's timeout cannot be changed in place: the proxier makes the table afresh when one changes (see affinityChanged).
    for (const s of cur?.sets ?? []) if (!oldSets.has(s.name)) sets.push({ op: 'add-set', name: s.name, timeout: s.timeout });
    for (const s of old?.sets ?? []) if (!curSets.has(s.name)) goneSets.push(s.name);
  }
  const ops: NftOp[] = [];
  // Elements that go first (nothing may point at a chain about to be deleted), then new sets and
  // chains, then the chains and sets no longer wanted, last the elements that lead to the new chains.
  for (const m of Object.keys(dels) as MapName[]) if (dels[m].length) ops.push({ op: 'delete-element', map: MAPS[m], elements: dels[m] });
  ops.push(...sets, ...declared, ...rules);
  for (const c of goneChains) ops.push({ op: 'flush-chain', chain: c });
  for (const c of goneChains) ops.push({ op: 'delete-chain', chain: c });
  for (const s of goneSets) ops.push({ op: 'delete-set', name: s });
  for (const m of Object.keys(adds) as MapName[]) {
    if (adds[m].length) ops.push({ op: 'add-element', map: MAPS[m], elements: adds[m] });
    n += adds[m].length + dels[m].length;
  }
  return { ops, rulesWritten: ops.length ? n : 0 };
}

function assemblePartial(input: NftAssembleInput, previous: Map<string, NftPortRules>): NftRuleset {
  const { ops, rulesWritten } = partialOps(input.ports, previous);
  return { text: opsText(ops), rulesWritten, ops };
}

/** True when some affinity set both had and has a different timeout: the table must be made afresh. */
export function affinityChanged(previous: Map<string, NftPortRules>, ports: NftPortRules[]): boolean {
  const before = new Map<string, number>();
  for (const pr of previous.values()) for (const s of pr.sets) before.set(s.name, s.timeout);
  for (const pr of ports) for (const s of pr.sets) if (before.has(s.name) && before.get(s.name) !== s.timeout) return true;
  return false;
}
