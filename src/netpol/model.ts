/**
 * NetworkPolicy as the node enforces it, decided purely: from the policies,
 * the node's pods (address, labels, namespace, named container ports) and
 * the namespaces' labels, which addresses each policy selects and what each
 * of its rules lets through. render.ts writes this as one nft transaction;
 * `allows` reads the same model as a packet would meet the rules, for tests.
 *
 * Semantics are networking.k8s.io/v1's: a pod is isolated for a direction
 * when any policy of that type selects it, and then only what some policy
 * allows passes (the union). policyTypes defaults to Ingress, plus Egress
 * when the policy has egress rules. A rule with no peers allows every peer,
 * with no ports every port; a missing or empty rule list allows nothing.
 */
import net from 'node:net';
import type { NetworkPolicy, NetworkPolicyPeer, NetworkPolicyPort } from 'kubernetes-types/networking/v1.js';
import { selectorMatches, type LabelSelector } from '../labels.js';
import { cidrHas, normalizeCidr } from './cidr.js';

export interface PolicyPod {
  namespace: string;
  name: string;
  ip: string;
  labels: Record<string, string>;
  /** The containers' named ports, for named ports in rules. */
  ports: Array<{ name: string; port: number; protocol: string }>;
}

export interface PolicyNamespace {
  name: string;
  labels: Record<string, string>;
}

export type Protocol = 'tcp' | 'udp' | 'sctp';
export type Direction = 'ingress' | 'egress';

/** The other end of a rule: anyone, the addresses of a set, or a CIDR less its exceptions. */
export type Peer = { kind: 'any' } | { kind: 'set'; set: string } | { kind: 'cidr'; cidr: string; except: string[] };

/**
 * A port or range; or a named port: `named` is a set of `address . port`
 * pairs, each pod that names the port (of that protocol) with its number,
 * so pods moving in or out change the set's elements, never the rules.
 */
export type PortMatch = { protocol: Protocol; from: number; to: number } | { protocol: Protocol; named: string };

export interface Rule {
  direction: Direction;
  /** `namespace/name` and the rule's index, for the rule's comment. */
  origin: string;
  /** The set of the policy's pods: destinations of an ingress rule, sources of an egress one. */
  selected: string;
  peer: Peer;
  /** Undefined: every port and protocol. */
  port?: PortMatch;
}

export interface Model {
  /** Set name → pod addresses, in the order they were first named. */
  sets: Map<string, string[]>;
  /** Named-port set name → `address . port` elements, sorted. */
  portSets: Map<string, string[]>;
  /** Pods isolated for ingress / egress (a policy of that type selects them). */
  isolated: Record<Direction, string[]>;
  rules: Rule[];
  /** Policies or parts of them that could not be enforced, with why (a port name no pod has is not one). */
  problems: Array<{ policy: string; message: string }>;
}

const PROTOCOLS: Record<string, Protocol> = { TCP: 'tcp', UDP: 'udp', SCTP: 'sctp' };

/** The rules one ingress or egress rule may expand to, and the node's rules in all (a 10,000-rule table writes in well under a second). */
export const MAX_RULES_PER_POLICY_RULE = 10_000;
export const MAX_RULES = 50_000;

/** The policy types in force: as given, else Ingress plus Egress when there are egress rules. */
export function policyTypes(p: NetworkPolicy): Direction[] {
  const given = p.spec?.policyTypes;
  if (given && given.length > 0) return (['Ingress', 'Egress'] as const).filter((t) => given.includes(t)).map((t) => (t === 'Ingress' ? 'ingress' : 'egress'));
  return (p.spec?.egress?.length ?? 0) > 0 ? ['ingress', 'egress'] : ['ingress'];
}

/** A LabelSelector from the API's JSON; absent fields as empty. */
const asSelector = (s: unknown): LabelSelector => (s && typeof s === 'object' ? (s as LabelSelector) : {});

/**
 * Builds the model. Pods without an address are left out (they cannot send
 * or receive yet); so are policies that are not objects with a spec.
 */
export function buildModel(policies: NetworkPolicy[], pods: PolicyPod[], namespaces: PolicyNamespace[]): Model {
  const sets = new Map<string, string[]>();
  const setByKey = new Map<string, string>();
  const nsLabels = new Map(namespaces.map((n) => [n.name, n.labels]));
  const live = pods.filter((p) => net.isIP(p.ip) !== 0);
  const problems: Model['problems'] = [];

  const portSets = new Map<string, string[]>();
  const portSetByKey = new Map<string, string>();
  const membersByKey = new Map<string, PolicyPod[]>();
  /** The set of a selection (`key`) and its pods, chosen (`choose`) once per distinct selection. */
  const selection = (key: string, choose: () => PolicyPod[]): { set: string; members: PolicyPod[] } => {
    let name = setByKey.get(key);
    if (!name) {
      name = `s${setByKey.size}`;
      const members = choose();
      setByKey.set(key, name);
      membersByKey.set(key, members);
      sets.set(name, [...new Set(members.map((p) => p.ip))].sort());
    }
    return { set: name, members: membersByKey.get(key)! };
  };

  const isolated: Record<Direction, Set<string>> = { ingress: new Set(), egress: new Set() };
  const rules: Rule[] = [];
  const ordered = [...policies].sort((a, b) => `${a.metadata?.namespace}/${a.metadata?.name}`.localeCompare(`${b.metadata?.namespace}/${b.metadata?.name}`));
  for (const policy of ordered) {
    const ns = policy.metadata?.namespace ?? 'default';
    const id = `${ns}/${policy.metadata?.name ?? ''}`;
    const spec = policy.spec;
    if (!spec || typeof spec !== 'object') continue;
    const podSel = asSelector(spec.podSelector);
    const { set: selected, members: chosen } = selection(`pods ${ns} ${JSON.stringify(podSel)}`, () => live.filter((p) => p.namespace === ns && selectorMatches(podSel, p.labels)));

    /** The peers of a rule as model peers, with the pods each stands for (for named ports). */
    const peersOf = (list: NetworkPolicyPeer[] | undefined): Array<{ peer: Peer; pods: PolicyPod[]; key: string }> => {
      if (!list || list.length === 0) return [{ peer: { kind: 'any' }, pods: live, key: 'any' }];
      const out: Array<{ peer: Peer; pods: PolicyPod[]; key: string }> = [];
      for (const peer of list) {
        if (peer.ipBlock) {
          const c = normalizeCidr(peer.ipBlock.cidr);
          if (!c) {
            problems.push({ policy: id, message: `ipBlock.cidr ${JSON.stringify(peer.ipBlock.cidr)} is not a CIDR` });
            continue;
          }
          const except = (peer.ipBlock.except ?? []).map((e) => normalizeCidr(e)).filter((e) => e !== undefined && e.v6 === c.v6).map((e) => e!.text);
          const inside = live.filter((p) => cidrHas(c.text, p.ip) && !except.some((e) => cidrHas(e, p.ip)));
          out.push({ peer: { kind: 'cidr', cidr: c.text, except }, pods: inside, key: `cidr ${c.text} except ${except.join(',')}` });
          continue;
        }
        if (!peer.podSelector && !peer.namespaceSelector) continue; // the API refuses a peer with nothing in it
        const ps = asSelector(peer.podSelector);
        const nsSel = peer.namespaceSelector ? asSelector(peer.namespaceSelector) : undefined;
        const inNs = (p: PolicyPod) => (nsSel ? selectorMatches(nsSel, nsLabels.get(p.namespace) ?? { 'kubernetes.io/metadata.name': p.namespace }) : p.namespace === ns);
        const key = nsSel ? `peers ns:${JSON.stringify(nsSel)} pods:${JSON.stringify(ps)}` : `pods ${ns} ${JSON.stringify(ps)}`;
        const { set, members } = selection(key, () => live.filter((p) => inNs(p) && selectorMatches(ps, p.labels)));
        out.push({ peer: { kind: 'set', set }, pods: members, key });
      }
      return out;
    };

    /**
     * The rule's ports; a named port is a match on a set of the pods (`onPods`, the selection `podsKey`)
     * that name it, one set per selection, name and protocol. It is there even while no pod names the
     * port (it matches nothing then), so pods naming it later change elements only.
     */
    const portsOf = (list: NetworkPolicyPort[] | undefined, onPods: PolicyPod[], podsKey: string): Array<PortMatch | undefined> => {
      if (!list || list.length === 0) return [undefined];
      const out: PortMatch[] = [];
      for (const p of list) {
        const protocol = PROTOCOLS[p.protocol ?? 'TCP'];
        if (!protocol) {
          problems.push({ policy: id, message: `protocol ${JSON.stringify(p.protocol)} is not TCP, UDP or SCTP` });
          continue;
        }
        if (p.port === undefined || p.port === null) out.push({ protocol, from: 0, to: 65535 });
        else if (typeof p.port === 'number') out.push({ protocol, from: p.port, to: p.endPort ?? p.port });
        else {
          const asNumber = /^\d+$/.test(p.port) ? Number(p.port) : undefined;
          if (asNumber !== undefined) {
            out.push({ protocol, from: asNumber, to: asNumber });
            continue;
          }
          const key = `${protocol} ${p.port} on ${podsKey}`;
          let name = portSetByKey.get(key);
          if (!name) {
            name = `n${portSetByKey.size}`;
            portSetByKey.set(key, name);
            const pairs: string[] = [];
            for (const pod of onPods) {
              const named = pod.ports.find((cp) => cp.name === p.port && (PROTOCOLS[cp.protocol || 'TCP'] ?? 'tcp') === protocol);
              if (named) pairs.push(`${pod.ip} . ${named.port}`);
            }
            portSets.set(name, [...new Set(pairs)].sort());
          }
          out.push({ protocol, named: name });
        }
      }
      return out;
    };

    const types = policyTypes(policy);
    for (const direction of types) {
      for (const ip of sets.get(selected)!) isolated[direction].add(ip);
      const list = direction === 'ingress' ? spec.ingress : spec.egress;
      (list ?? []).forEach((rule, i) => {
        const peers = peersOf(direction === 'ingress' ? (rule as { from?: NetworkPolicyPeer[] }).from : (rule as { to?: NetworkPolicyPeer[] }).to);
        const origin = `${id} ${direction}[${i}]`;
        const made: Rule[] = [];
        if (direction === 'ingress') {
          // A named port is the destination's: the selected pods'.
          const ports = portsOf(rule.ports, chosen, `pods ${ns} ${JSON.stringify(podSel)}`);
          for (const { peer } of peers) for (const port of ports) made.push({ direction, origin, selected, peer, ...(port ? { port } : {}) });
        } else {
          // In egress the destination is the peer: its pods name the port.
          for (const { peer, pods: peerPods, key } of peers) for (const port of portsOf(rule.ports, peerPods, key)) made.push({ direction, origin, selected, peer, ...(port ? { port } : {}) });
        }
        // Peers times ports is the rule count: a small policy can ask for millions. One that asks too much is left out, so it
        // allows nothing (its pods stay fenced by the rest): failing closed, never holding the node's memory.
        if (made.length > MAX_RULES_PER_POLICY_RULE) {
          problems.push({ policy: id, message: `${direction}[${i}] would be ${made.length} nft rules (peers × ports), more than ${MAX_RULES_PER_POLICY_RULE}: not enforced, so it allows nothing` });
        } else if (rules.length + made.length > MAX_RULES) {
          problems.push({ policy: id, message: `${direction}[${i}] would take the node past ${MAX_RULES} nft rules in all: not enforced, so it allows nothing` });
        } else rules.push(...made);
      });
    }
  }
  return { sets, portSets, isolated: { ingress: [...isolated.ingress].sort(), egress: [...isolated.egress].sort() }, rules, problems };
}

export interface Packet {
  src: string;
  dst: string;
  protocol: Protocol;
  port: number;
}

function peerHas(model: Model, peer: Peer, ip: string): boolean {
  switch (peer.kind) {
    case 'any':
      return true;
    case 'set':
      return model.sets.get(peer.set)?.includes(ip) ?? false;
    case 'cidr':
      return cidrHas(peer.cidr, ip) && !peer.except.some((e) => cidrHas(e, ip));
  }
}

function ruleAllows(model: Model, r: Rule, pkt: Packet): boolean {
  const self = r.direction === 'ingress' ? pkt.dst : pkt.src;
  const other = r.direction === 'ingress' ? pkt.src : pkt.dst;
  if (!(model.sets.get(r.selected)?.includes(self) ?? false) || !peerHas(model, r.peer, other)) return false;
  if (!r.port) return true;
  if (r.port.protocol !== pkt.protocol) return false;
  if ('named' in r.port) return model.portSets.get(r.port.named)?.includes(`${pkt.dst} . ${pkt.port}`) ?? false;
  return pkt.port >= r.port.from && pkt.port <= r.port.to;
}

/** Whether a new connection passes, as the rendered rules judge it (egress of the source, then ingress of the destination). */
export function allows(model: Model, pkt: Packet): boolean {
  for (const direction of ['egress', 'ingress'] as const) {
    const self = direction === 'ingress' ? pkt.dst : pkt.src;
    if (!model.isolated[direction].includes(self)) continue;
    if (!model.rules.some((r) => r.direction === direction && ruleAllows(model, r, pkt))) return false;
  }
  return true;
}
