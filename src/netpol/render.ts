/**
 * The model as one `nft -f` transaction: the table is created (so the
 * delete cannot fail), deleted and written whole, so the kernel swaps the
 * old rules for the new in one commit and no packet meets half of them.
 *
 * Layout of `inet skiff-netpol`: a set of addresses per selection; a base
 * chain on forward (after prerouting's DNAT, so a packet sent to a Service
 * is judged at the backend pod it now goes to) and one on input (a pod's
 * packets to the node itself, service DNS included, are its egress). Both
 * accept replies of allowed connections first (conntrack), then send a
 * packet from an egress-isolated pod through `egress` (a match returns,
 * the end drops) and one to an ingress-isolated pod through `ingress` (a
 * match accepts, the end drops). Packets the node itself sends leave by
 * output, which has no chain here: the node reaches its pods (probes).
 * A named port is a set of `address . port` pairs (one per selection, name
 * and protocol), so the rules depend on the policies alone: a pod's labels
 * or ports change set elements, which renderDelta writes as a few lines.
 */
import net from 'node:net';
import type { Model, Peer, PortMatch, Rule } from './model.js';

export const TABLE = 'skiff-netpol';

const family = (ip: string) => (net.isIP(ip.split('/')[0]!) === 6 ? 'ip6' : 'ip');
const list = (items: string[]) => (items.length === 1 ? items[0]! : `{ ${items.join(', ')} }`);

/** The address of a set element: itself, or the first part of an `address . port` pair. */
const addressOf = (element: string) => element.split(' . ')[0]!;

function setDecl(name: string, members: string[], v6: boolean, withPort = false): string[] {
  const own = members.filter((m) => (net.isIP(addressOf(m)) === 6) === v6);
  return [
    `  set ${name}${v6 ? '_v6' : ''} {`,
    `    type ${v6 ? 'ipv6_addr' : 'ipv4_addr'}${withPort ? ' . inet_service' : ''}`,
    ...(own.length > 0 ? [`    elements = { ${own.join(', ')} }`] : []),
    '  }',
  ];
}

/** The rule's matches for the far end, per address family; none when the peer cannot match that family. */
function peerMatch(peer: Peer, dir: 'saddr' | 'daddr'): Array<{ v6: boolean; text: string }> {
  switch (peer.kind) {
    case 'any':
      return [{ v6: false, text: '' }, { v6: true, text: '' }];
    case 'set':
      return [
        { v6: false, text: `ip ${dir} @${peer.set}` },
        { v6: true, text: `ip6 ${dir} @${peer.set}_v6` },
      ];
    case 'cidr': {
      const f = family(peer.cidr);
      const except = peer.except.length > 0 ? ` ${f} ${dir} != ${list(peer.except)}` : '';
      return [{ v6: f === 'ip6', text: `${f} ${dir} ${peer.cidr}${except}` }];
    }
  }
}

function portMatch(p: PortMatch, v6: boolean): string {
  if ('named' in p) return `meta l4proto ${p.protocol} ${v6 ? 'ip6' : 'ip'} daddr . th dport @${p.named}${v6 ? '_v6' : ''}`;
  const range = p.from === 0 && p.to === 65535 ? '' : p.from === p.to ? ` th dport ${p.from}` : ` th dport ${p.from}-${p.to}`;
  return `meta l4proto ${p.protocol}${range}`;
}

function ruleLines(r: Rule, withV6: boolean): string[] {
  const ingress = r.direction === 'ingress';
  const verdict = ingress ? 'accept' : 'return';
  const out: string[] = [];
  for (const peer of peerMatch(r.peer, ingress ? 'saddr' : 'daddr')) {
    if (peer.v6 && !withV6) continue;
    const f = peer.v6 ? 'ip6' : 'ip';
    const parts = [`${f} ${ingress ? 'daddr' : 'saddr'} @${r.selected}${peer.v6 ? '_v6' : ''}`];
    if (peer.text) parts.push(peer.text);
    if (r.port) parts.push(portMatch(r.port, peer.v6));
    out.push(`    ${parts.join(' ')} ${verdict} comment ${nftComment(r.origin)}`);
  }
  return out;
}

/** IPv6 sets and rules only when some pod has an IPv6 address: without one no IPv6 rule could match. */
const hasV6 = (model: Model) => [...model.sets.values()].some((m) => m.some((ip) => net.isIP(ip) === 6));

/** The whole table as nft -f input. */
export function renderRules(model: Model): string {
  const withV6 = hasV6(model);
  const decl = (name: string, members: string[], withPort = false) => [...setDecl(name, members, false, withPort), ...(withV6 ? setDecl(name, members, true, withPort) : [])];
  const lines: string[] = [`table inet ${TABLE} {}`, `delete table inet ${TABLE}`, `table inet ${TABLE} {`];
  for (const [name, members] of model.sets) lines.push(...decl(name, members));
  for (const [name, members] of model.portSets) lines.push(...decl(name, members, true));
  lines.push(...decl('ingress_isolated', model.isolated.ingress), ...decl('egress_isolated', model.isolated.egress));
  const base = (hook: string, judgeIngress: boolean) => [
    `  chain ${hook} {`,
    `    type filter hook ${hook} priority filter; policy accept;`,
    '    ct state established,related accept',
    '    ip saddr @egress_isolated jump egress',
    ...(withV6 ? ['    ip6 saddr @egress_isolated_v6 jump egress'] : []),
    ...(judgeIngress ? ['    ip daddr @ingress_isolated jump ingress', ...(withV6 ? ['    ip6 daddr @ingress_isolated_v6 jump ingress'] : [])] : []),
    '  }',
  ];
  lines.push(...base('forward', true), ...base('input', false));
  for (const direction of ['ingress', 'egress'] as const) {
    lines.push(`  chain ${direction} {`);
    for (const r of model.rules) if (r.direction === direction) lines.push(...ruleLines(r, withV6));
    lines.push(`    drop comment ${JSON.stringify(`no policy allows this ${direction}`)}`, '  }');
  }
  lines.push('}', '');
  return lines.join('\n');
}

/** Removes the table (a node stopping enforcement, or a test cleaning up): nft -f input. */
export function renderCleanup(): string {
  return `table inet ${TABLE} {}\ndelete table inet ${TABLE}\n`;
}

/** What a model's table looks like without its set elements: equal skeletons differ in elements only. */
function skeleton(model: Model): string {
  let text = skeletons.get(model);
  if (text === undefined) {
    text = JSON.stringify({ sets: [...model.sets.keys()], portSets: [...model.portSets.keys()], rules: model.rules, withV6: hasV6(model) });
    skeletons.set(model, text);
  }
  return text;
}

/** A model's skeleton, made once: the model in force is compared again with each next one. */
const skeletons = new WeakMap<Model, string>();

/**
 * The change from `prev` (in force) to `next` as element additions and
 * deletions only, one transaction; undefined when more than elements
 * changed (render the whole table then). A label change or a new pod is
 * usually just this: a few lines instead of every rule.
 */
export function renderDelta(prev: Model, next: Model): string | undefined {
  if (skeleton(prev) !== skeleton(next)) return undefined;
  const lines: string[] = [];
  const change = (name: string, before: string[], after: string[]) => {
    const had = new Set(before);
    const has = new Set(after);
    for (const v6 of [false, true]) {
      const fam = (element: string) => (net.isIP(addressOf(element)) === 6) === v6;
      const gone = before.filter((ip) => fam(ip) && !has.has(ip));
      const added = after.filter((ip) => fam(ip) && !had.has(ip));
      const set = `${name}${v6 ? '_v6' : ''}`;
      if (gone.length > 0) lines.push(`delete element inet ${TABLE} ${set} { ${gone.join(', ')} }`);
      if (added.length > 0) lines.push(`add element inet ${TABLE} ${set} { ${added.join(', ')} }`);
    }
  };
  for (const [name, after] of next.sets) change(name, prev.sets.get(name) ?? [], after);
  for (const [name, after] of next.portSets) change(name, prev.portSets.get(name) ?? [], after);
  change('ingress_isolated', prev.isolated.ingress, next.isolated.ingress);
  change('egress_isolated', prev.isolated.egress, next.isolated.egress);
  return lines.length > 0 ? `${lines.join('\n')}\n` : '';
}

/** nft takes comments of at most 128 bytes: a long namespace and policy name is cut (with an ellipsis), never the write refused. */
export function nftComment(text: string): string {
  const MAX = 128;
  let t = text.replace(/["\\\n]/g, '_');
  if (Buffer.byteLength(t) > MAX) {
    t = Buffer.from(t).subarray(0, MAX - 3).toString().replace(/\uFFFD+$/, '') + '...';
  }
  return JSON.stringify(t);
}
