/**
 * NetworkPolicy's model and nft rendering: semantics as tables of packets
 * judged by the model the rules are written from (isolation, union, peers,
 * ports, named ports per pod, endPort, defaults of policyTypes), a golden
 * nft text, the applier's one coalesced `nft -f`, and the API kind's
 * defaults, validation and table.
 */
import type { NetworkPolicy } from 'kubernetes-types/networking/v1.js';
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { decodeProtobuf } from '../../src/api/protobuf.js';
import { toTable } from '../../src/api/table.js';
import type { Obj } from '../../src/api/types.js';
import { NftApplier } from '../../src/netpol/apply.js';
import { cidrHas, normalizeCidr, strictSubset } from '../../src/netpol/cidr.js';
import { allows, buildModel, policyTypes, type PolicyNamespace, type PolicyPod, type Protocol } from '../../src/netpol/model.js';
import { renderDelta, renderRules } from '../../src/netpol/render.js';
import type { RunOptions, RunResult } from '../../src/sys/run.js';

const PODS: PolicyPod[] = [
  { namespace: 'default', name: 'web', ip: '10.88.0.2', labels: { app: 'web' }, ports: [{ name: 'http', port: 8080, protocol: 'TCP' }] },
  { namespace: 'default', name: 'web2', ip: '10.88.0.3', labels: { app: 'web' }, ports: [{ name: 'http', port: 9000, protocol: 'TCP' }] },
  { namespace: 'default', name: 'client', ip: '10.88.0.4', labels: { role: 'client' }, ports: [] },
  { namespace: 'team-a', name: 'friend', ip: '10.88.0.5', labels: { role: 'client' }, ports: [] },
  { namespace: 'team-b', name: 'foe', ip: '10.88.0.6', labels: { role: 'client' }, ports: [{ name: 'dns', port: 5353, protocol: 'UDP' }] },
];
const NAMESPACES: PolicyNamespace[] = [
  { name: 'default', labels: { 'kubernetes.io/metadata.name': 'default' } },
  { name: 'team-a', labels: { 'kubernetes.io/metadata.name': 'team-a', team: 'a' } },
  { name: 'team-b', labels: { 'kubernetes.io/metadata.name': 'team-b', team: 'b' } },
];
const ip = (name: string) => PODS.find((p) => p.name === name)?.ip ?? name;
const np = (name: string, spec: Obj, namespace = 'default') => ({ metadata: { name, namespace }, spec }) as unknown as NetworkPolicy;

type Case = [string, string, string, Protocol, number, boolean];
function judge(policies: NetworkPolicy[], cases: Case[]): void {
  const model = buildModel(policies, PODS, NAMESPACES);
  const got = cases.map(([what, src, dst, protocol, port]) => [what, allows(model, { src: ip(src), dst: ip(dst), protocol, port })]);
  expect(got).toEqual(cases.map(([what, , , , , want]) => [what, want]));
}

describe('NetworkPolicy semantics', () => {
  it('no policy: everything passes; a policy selecting a pod isolates only that pod, only for its types', () => {
    judge([], [['open', 'client', 'web', 'tcp', 80, true]]);
    judge([np('deny', { podSelector: { matchLabels: { app: 'web' } } })], [
      ['to a selected pod', 'client', 'web', 'tcp', 8080, false],
      ['to a pod not selected', 'web', 'client', 'tcp', 80, true],
      ['from a selected pod (Ingress only)', 'web', 'foe', 'tcp', 80, true],
      ['from outside the node', '192.0.2.1', 'web', 'tcp', 8080, false],
    ]);
  });

  it('policyTypes: given, else Ingress plus Egress when there are egress rules', () => {
    expect(policyTypes(np('a', { podSelector: {} }))).toEqual(['ingress']);
    expect(policyTypes(np('b', { podSelector: {}, egress: [{}] }))).toEqual(['ingress', 'egress']);
    expect(policyTypes(np('c', { podSelector: {}, policyTypes: ['Egress'] }))).toEqual(['egress']);
    judge([np('egress', { podSelector: { matchLabels: { role: 'client' } }, policyTypes: ['Egress'] })], [
      ['egress denied', 'client', 'web', 'tcp', 8080, false],
      ['ingress still open', 'web', 'client', 'tcp', 80, true],
      ['another namespace is not selected', 'friend', 'web', 'tcp', 8080, true],
    ]);
  });

  it('peers: pod selector in the namespace, namespace selector, both together, ipBlock with except', () => {
    const sel = { matchLabels: { app: 'web' } };
    judge([np('p', { podSelector: sel, ingress: [{ from: [{ podSelector: { matchLabels: { role: 'client' } } }] }] })], [
      ['same namespace, labels match', 'client', 'web', 'tcp', 1, true],
      ['labels match, other namespace', 'friend', 'web', 'tcp', 1, false],
    ]);
    judge([np('n', { podSelector: sel, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }] }] })], [
      ['namespace matches', 'friend', 'web', 'tcp', 1, true],
      ['namespace does not', 'foe', 'web', 'tcp', 1, false],
      ['own namespace does not match either', 'client', 'web', 'tcp', 1, false],
    ]);
    judge([np('both', { podSelector: sel, ingress: [{ from: [{ namespaceSelector: { matchExpressions: [{ key: 'team', operator: 'Exists' }] }, podSelector: { matchLabels: { role: 'client' } } }] }] })], [
      ['both match', 'foe', 'web', 'tcp', 1, true],
      ['namespace without the label', 'client', 'web', 'tcp', 1, false],
    ]);
    judge([np('cidr', { podSelector: sel, ingress: [{ from: [{ ipBlock: { cidr: '10.88.0.1/24', except: ['10.88.0.4/32'] } }] }] })], [
      ['inside', 'friend', 'web', 'tcp', 1, true],
      ['the exception', 'client', 'web', 'tcp', 1, false],
      ['outside', '192.0.2.1', 'web', 'tcp', 1, false],
    ]);
  });

  it('ports: protocol, number, endPort range, a named port resolved per destination pod', () => {
    const sel = { matchLabels: { app: 'web' } };
    judge([np('ports', { podSelector: sel, ingress: [{ ports: [{ port: 'http' }, { protocol: 'UDP', port: 53, endPort: 60 }] }] })], [
      ['http on web is 8080', 'client', 'web', 'tcp', 8080, true],
      ['8080 on web2 is not its http', 'client', 'web2', 'tcp', 8080, false],
      ['http on web2 is 9000', 'client', 'web2', 'tcp', 9000, true],
      ['udp range start', 'client', 'web', 'udp', 53, true],
      ['udp range end', 'client', 'web', 'udp', 60, true],
      ['past the range', 'client', 'web', 'udp', 61, false],
      ['tcp in the udp range', 'client', 'web', 'tcp', 53, false],
    ]);
    judge([np('protocol-only', { podSelector: sel, ingress: [{ ports: [{ protocol: 'SCTP' }] }] })], [
      ['any sctp port', 'client', 'web', 'sctp', 7, true],
      ['not tcp', 'client', 'web', 'tcp', 7, false],
    ]);
    judge([np('egress-named', { podSelector: { matchLabels: { role: 'client' } }, policyTypes: ['Egress'], egress: [{ ports: [{ port: 'dns', protocol: 'UDP' }] }] })], [
      ['to the pod naming the port', 'client', 'foe', 'udp', 5353, true],
      ['the same port elsewhere', 'client', 'web', 'udp', 5353, false],
    ]);
  });

  it('several policies are a union; an empty rule allows all, an empty list nothing', () => {
    const sel = { matchLabels: { app: 'web' } };
    judge([
      np('deny', { podSelector: {}, ingress: [] }),
      np('a', { podSelector: sel, ingress: [{ from: [{ podSelector: { matchLabels: { role: 'client' } } }] }] }),
      np('b', { podSelector: sel, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'b' } } }], ports: [{ port: 7 }] }] }),
    ], [
      ['by a', 'client', 'web', 'tcp', 1, true],
      ['by b', 'foe', 'web', 'tcp', 7, true],
      ['neither', 'foe', 'web', 'tcp', 8, false],
      ['deny alone holds the client pod', 'web', 'client', 'tcp', 1, false],
    ]);
    judge([np('all', { podSelector: sel, ingress: [{}] })], [['an empty rule', 'foe', 'web', 'udp', 9, true]]);
  });

  it('egress and ingress both have to allow', () => {
    judge([
      np('client-out', { podSelector: { matchLabels: { role: 'client' } }, egress: [{ to: [{ podSelector: { matchLabels: { app: 'web' } } }] }] }),
      np('web-in', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: {} }], ports: [{ port: 8080 }] }] }),
    ], [
      ['both allow', 'client', 'web', 'tcp', 8080, true],
      ['egress allows, ingress not', 'client', 'web', 'tcp', 81, false],
      ['egress does not allow', 'client', '10.88.0.9', 'tcp', 8080, false],
    ]);
  });
});

describe('CIDRs', () => {
  it('normalizes, contains, and knows a strict subset', () => {
    expect(normalizeCidr('10.1.2.3/8')?.text).toBe('10.0.0.0/8');
    expect(normalizeCidr('2001:db8::1/32')?.text).toBe('2001:db8::/32');
    expect(normalizeCidr('10.0.0.0')).toBeUndefined();
    expect(normalizeCidr('10.0.0.0/33')).toBeUndefined();
    expect(normalizeCidr('nonsense/8')).toBeUndefined();
    expect(cidrHas('10.0.0.0/8', '10.200.0.1')).toBe(true);
    expect(cidrHas('10.0.0.0/8', '11.0.0.1')).toBe(false);
    expect(cidrHas('10.0.0.0/8', '::1')).toBe(false);
    expect(strictSubset('10.0.0.0/8', '10.1.0.0/16')).toBe(true);
    expect(strictSubset('10.0.0.0/8', '10.0.0.0/8')).toBe(false);
    expect(strictSubset('10.0.0.0/8', '192.168.0.0/16')).toBe(false);
  });
});

describe('the nft text', () => {
  it('is one transaction: the table made, deleted and written whole (golden)', () => {
    const text = renderRules(buildModel([
      np('web', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: { matchLabels: { role: 'client' } } }, { ipBlock: { cidr: '192.0.2.0/24', except: ['192.0.2.128/25'] } }], ports: [{ port: 'http' }, { port: 7000, endPort: 7010, protocol: 'UDP' }] }] }),
      np('out', { podSelector: { matchLabels: { role: 'client' } }, policyTypes: ['Egress'], egress: [{ ports: [{ port: 53, protocol: 'UDP' }] }] }),
    ], PODS, NAMESPACES));
    expect(text).toBe(`table inet skiff-netpol {}
delete table inet skiff-netpol
table inet skiff-netpol {
  set s0 {
    type ipv4_addr
    elements = { 10.88.0.4 }
  }
  set s1 {
    type ipv4_addr
    elements = { 10.88.0.2, 10.88.0.3 }
  }
  set n0 {
    type ipv4_addr . inet_service
    elements = { 10.88.0.2 . 8080, 10.88.0.3 . 9000 }
  }
  set ingress_isolated {
    type ipv4_addr
    elements = { 10.88.0.2, 10.88.0.3 }
  }
  set egress_isolated {
    type ipv4_addr
    elements = { 10.88.0.4 }
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    ct state established,related accept
    ip saddr @egress_isolated jump egress
    ip daddr @ingress_isolated jump ingress
  }
  chain input {
    type filter hook input priority filter; policy accept;
    ct state established,related accept
    ip saddr @egress_isolated jump egress
  }
  chain ingress {
    ip daddr @s1 ip saddr @s0 meta l4proto tcp ip daddr . th dport @n0 accept comment "default/web ingress[0]"
    ip daddr @s1 ip saddr @s0 meta l4proto udp th dport 7000-7010 accept comment "default/web ingress[0]"
    ip daddr @s1 ip saddr 192.0.2.0/24 ip saddr != 192.0.2.128/25 meta l4proto tcp ip daddr . th dport @n0 accept comment "default/web ingress[0]"
    ip daddr @s1 ip saddr 192.0.2.0/24 ip saddr != 192.0.2.128/25 meta l4proto udp th dport 7000-7010 accept comment "default/web ingress[0]"
    drop comment "no policy allows this ingress"
  }
  chain egress {
    ip saddr @s0 meta l4proto udp th dport 53 return comment "default/out egress[0]"
    drop comment "no policy allows this egress"
  }
}
`);
  });
});

describe('a delta', () => {
  it('is element changes alone when only pods moved in or out of sets, else undefined (write whole)', () => {
    const policies = [np('web', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ from: [{ podSelector: { matchLabels: { role: 'client' } } }], ports: [{ port: 80 }] }] })];
    const before = buildModel(policies, PODS, NAMESPACES);
    const moved = PODS.map((p) => (p.name === 'web2' ? { ...p, labels: { role: 'client' } } : p));
    const delta = renderDelta(before, buildModel(policies, moved, NAMESPACES))!;
    expect(delta.trim().split('\n').sort()).toEqual([
      'add element inet skiff-netpol s1 { 10.88.0.3 }',
      'delete element inet skiff-netpol ingress_isolated { 10.88.0.3 }',
      'delete element inet skiff-netpol s0 { 10.88.0.3 }',
    ]);
    expect(renderDelta(before, before)).toBe('');
    // A pod moving into a named port's selection is an element of the port's set, not another rule.
    const named = [np('web', { podSelector: { matchLabels: { app: 'web' } }, ingress: [{ ports: [{ port: 'http' }] }] })];
    const noWeb = PODS.map((p) => (p.name === 'web2' ? { ...p, labels: {} } : p));
    const namedDelta = renderDelta(buildModel(named, noWeb, NAMESPACES), buildModel(named, PODS, NAMESPACES))!;
    expect(namedDelta.trim().split('\n').sort()).toEqual([
      'add element inet skiff-netpol ingress_isolated { 10.88.0.3 }',
      'add element inet skiff-netpol n0 { 10.88.0.3 . 9000 }',
      'add element inet skiff-netpol s0 { 10.88.0.3 }',
    ]);
    // Another rule: not a delta.
    expect(renderDelta(before, buildModel([...policies, np('x', { podSelector: {} })], PODS, NAMESPACES))).toBeUndefined();
  });
});

describe('the applier', () => {
  it('writes with one nft -f, coalescing a burst into the newest state, and reports a failure', async () => {
    const calls: string[] = [];
    let release!: () => void;
    let first = true;
    const runner = async (cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> => {
      calls.push(`${cmd} ${args.join(' ')}\n${String(opts?.input)}`);
      if (first) {
        first = false;
        await new Promise<void>((r) => (release = r));
      }
      const bad = String(opts?.input).includes('bad');
      return { code: bad ? 1 : 0, signal: null, stdout: '', stderr: bad ? 'Error: syntax error' : '', timedOut: false };
    };
    const a = new NftApplier(runner);
    const w = (text: string) => () => ({ text, model: undefined });
    const p1 = a.apply(w('one'));
    const p2 = a.apply(w('two'));
    const p3 = a.apply(w('three'));
    await new Promise((r) => setImmediate(r));
    release();
    await Promise.all([p1, p2, p3]);
    expect(calls).toEqual(['nft -f -\none', 'nft -f -\nthree']);
    await expect(a.apply(w('bad'))).rejects.toThrow('nft -f failed (exit 1): Error: syntax error');
    // A delta that fails is followed by the whole table, in the same apply.
    calls.length = 0;
    await a.apply(() => ({ text: 'bad delta', model: undefined, full: () => 'whole' }));
    expect(calls).toEqual(['nft -f -\nbad delta', 'nft -f -\nwhole']);
  });

  it('hands the next render the model the last write put in force, and none after a failure', async () => {
    let fail = false;
    const runner = async (): Promise<RunResult> => ({ code: fail ? 1 : 0, signal: null, stdout: '', stderr: '', timedOut: false });
    const a = new NftApplier(runner);
    const m = buildModel([], PODS, NAMESPACES);
    const seen: unknown[] = [];
    await a.apply((applied) => (seen.push(applied), { text: 'x', model: m }));
    await a.apply((applied) => (seen.push(applied), { text: 'y', model: m }));
    fail = true;
    await a.apply((applied) => (seen.push(applied), { text: 'z', model: m })).catch(() => undefined);
    fail = false;
    await a.apply((applied) => (seen.push(applied), { text: 'w', model: m }));
    expect(seen).toEqual([undefined, m, m, undefined]);
  });
});

describe('the NetworkPolicy kind', () => {
  const store = new Store({ kinds: nodeKinds('node-a'), now: () => Date.parse('2026-01-01T00:00:00Z') });
  const kind = store.kind('networkpolicies.networking.k8s.io')!;
  const create = (name: string, spec: Obj) => store.create(kind, 'default', { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name }, spec });
  const error = (f: () => unknown) => {
    try {
      f();
    } catch (err) {
      if (err instanceof ApiError) return err.message;
      throw err;
    }
    return 'no error';
  };

  it('defaults policyTypes and TCP, as the API server does', () => {
    const a = create('a', { podSelector: {}, ingress: [{ ports: [{ port: 80 }] }] });
    expect(a.spec).toEqual({ podSelector: {}, policyTypes: ['Ingress'], ingress: [{ ports: [{ port: 80, protocol: 'TCP' }] }] });
    expect((create('b', { podSelector: {}, egress: [{}] }).spec as Obj).policyTypes).toEqual(['Ingress', 'Egress']);
    expect((create('c', {}).spec as Obj).podSelector).toEqual({});
  });

  it('refuses what the API server refuses, with its messages', () => {
    expect(error(() => create('d', { podSelector: {}, policyTypes: ['Ingress', 'Egress', 'Ingress'] }))).toContain('spec.policyTypes: Invalid value: ["Ingress","Egress","Ingress"]: may not specify more than two policyTypes');
    expect(error(() => create('e', { podSelector: {}, ingress: [{ from: [{}] }] }))).toContain('spec.ingress[0].from[0]: Required value: must specify a peer');
    expect(error(() => create('f', { podSelector: {}, egress: [{ to: [{ ipBlock: { cidr: 'ten/8' } }] }] }))).toContain('spec.egress[0].to[0].ipBlock.cidr: Invalid value: "ten/8": not a valid CIDR');
    expect(error(() => create('g', { podSelector: {}, ingress: [{ ports: [{ endPort: 9 }] }] }))).toContain('spec.ingress[0].ports[0].endPort: Invalid value: 9: may not be specified when `port` is not specified');
    expect(error(() => create('h', { podSelector: {}, ingress: [{ ports: [{ port: 'Not_A_Name' }] }] }))).toContain('spec.ingress[0].ports[0].port: Invalid value: "Not_A_Name"');
    expect(error(() => create('i', { podSelector: {}, ingress: [{ ports: [{ port: 70000 }] }] }))).toContain('spec.ingress[0].ports[0].port: Invalid value: 70000: must be between 1 and 65535, inclusive');
    expect(error(() => create('j', { podSelector: { matchExpressions: [{ key: 'a', operator: 'Near' }] } }))).toContain('spec.podSelector.matchExpressions[0].operator: Invalid value: "Near": not a valid selector operator');
  });

  it('decodes a protobuf body (networking/v1 field numbers)', () => {
    const lenDelim = (no: number, b: Buffer) => Buffer.concat([Buffer.from([(no << 3) | 2, b.length]), b]);
    const str = (no: number, t: string) => lenDelim(no, Buffer.from(t));
    const varint = (no: number, n: number) => Buffer.from([(no << 3) | 0, n]);
    // NetworkPolicy{metadata{name:"pb"}, spec{ingress[{ports[{protocol:"UDP", port:{intVal:53}, endPort:60}], from[{ipBlock{cidr:"10.0.0.0/8", except:["10.1.0.0/16"]}}]}], policyTypes:["Ingress"]}}
    const port = Buffer.concat([str(1, 'UDP'), lenDelim(2, varint(2, 53)), varint(3, 60)]);
    const peer = lenDelim(3, Buffer.concat([str(1, '10.0.0.0/8'), str(2, '10.1.0.0/16')]));
    const spec = Buffer.concat([lenDelim(2, Buffer.concat([lenDelim(1, port), lenDelim(2, peer)])), str(4, 'Ingress')]);
    const body = Buffer.concat([lenDelim(1, str(1, 'pb')), lenDelim(2, spec)]);
    const unknown = Buffer.concat([lenDelim(1, Buffer.concat([str(1, 'networking.k8s.io/v1'), str(2, 'NetworkPolicy')])), lenDelim(2, body)]);
    expect(decodeProtobuf(Buffer.concat([Buffer.from([0x6b, 0x38, 0x73, 0x00]), unknown]))).toEqual({
      apiVersion: 'networking.k8s.io/v1',
      kind: 'NetworkPolicy',
      metadata: { name: 'pb' },
      spec: { ingress: [{ ports: [{ protocol: 'UDP', port: 53, endPort: 60 }], from: [{ ipBlock: { cidr: '10.0.0.0/8', except: ['10.1.0.0/16'] } }] }], policyTypes: ['Ingress'] },
    });
  });

  it("shows kubectl get netpol's columns", () => {
    const o = create('web', { podSelector: { matchLabels: { app: 'web' } } });
    const t = toTable(kind, [o, store.get(kind, 'default', 'a')!], {}, 'None', Date.parse('2026-01-01T00:05:00Z')) as { columnDefinitions: Array<{ name: string }>; rows: Array<{ cells: unknown[] }> };
    expect(t.columnDefinitions.map((c) => c.name)).toEqual(['Name', 'Pod-Selector', 'Age']);
    expect(t.rows.map((r) => r.cells)).toEqual([['web', 'app=web', '5m'], ['a', '<none>', '5m']]);
  });
});

describe('hostile policies', () => {
  it('leaves out a rule whose peers × ports would be too many nft rules, so it allows nothing, and says why', () => {
    const peers = Array.from({ length: 200 }, (_, i) => ({ ipBlock: { cidr: `10.${i}.0.0/24` } }));
    const ports = Array.from({ length: 100 }, (_, i) => ({ protocol: 'TCP', port: 1000 + i }));
    const model = buildModel([np('huge', { podSelector: {}, ingress: [{ from: peers, ports }] })], PODS, NAMESPACES);
    expect(model.rules).toEqual([]);
    expect(model.problems).toEqual([{ policy: 'default/huge', message: 'ingress[0] would be 20000 nft rules (peers × ports), more than 10000: not enforced, so it allows nothing' }]);
    // Its pods are isolated all the same: the policy still fences them.
    expect(model.isolated.ingress.length).toBeGreaterThan(0);
  });

  it('cuts a rule comment to the 128 characters nft takes, whatever the namespace and policy names', () => {
    const model = buildModel([np('p'.repeat(253), { podSelector: {}, ingress: [{ from: [{ podSelector: {} }] }] }, 'n'.repeat(63))], PODS, [...NAMESPACES, { name: 'n'.repeat(63), labels: {} }]);
    const comments = [...renderRules(model).matchAll(/comment "([^"]*)"/g)].map((m) => m[1]!);
    expect(comments.length).toBeGreaterThan(0);
    for (const c of comments) expect(c.length).toBeLessThanOrEqual(128);
    expect(comments.some((c) => c.endsWith('...'))).toBe(true);
  });
});
