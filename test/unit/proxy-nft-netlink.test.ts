/**
 * The netlink encoding of a partial nftables sync: what it refuses (so the
 * sync goes through nft), and the shape of what it writes. That the kernel
 * lists the written rules as nft's own is proxy-nft-sync.test.ts's part.
 */
import { describe, expect, it } from 'vitest';
import { compileRule, encodeOps, NotEncodable } from '../../src/proxy/nft-netlink.js';

describe('nftables ops as netlink messages', () => {
  it('refuses what the proxy writes only through nft (an anonymous set) and anything else unknown', () => {
    for (const rule of ['ip saddr != { 10.0.0.0/8, 192.0.2.0/24 } drop', 'counter', 'ip daddr 10.0.0.300 drop', 'tcp dport 70000 drop', 'ip saddr 10.0.0.0/33 drop']) {
      expect(() => compileRule(rule, new Map()), rule).toThrow(NotEncodable);
    }
    expect(() => encodeOps([{ op: 'add-element', map: 'service-ips', elements: [{ key: '10.0.0.1 . icmp . 1', verdict: 'drop' }] }])).toThrow(NotEncodable);
  });

  it('writes one message per step, elements in pieces, each named for its error', () => {
    const elements = Array.from({ length: 1200 }, (_, i) => ({ key: `10.96.${i >> 8}.${i & 255} . tcp . 80`, verdict: 'goto reject-chain' }));
    const msgs = encodeOps([
      { op: 'add-chain', chain: 'c' },
      { op: 'add-rule', chain: 'c', rule: 'ip saddr 10.88.0.0/20 jump mark-for-masquerade comment "x"' },
      { op: 'add-element', map: 'service-ips', elements },
    ]);
    expect(msgs.map((m) => m.what)).toEqual([
      'add chain c',
      'add rule c ip saddr 10.88.0.0/20 jump mark-for-masquerade comment "x"',
      'add element service-ips { 10.96.0.0 . tcp . 80, … 499 more }',
      'add element service-ips { 10.96.1.244 . tcp . 80, … 499 more }',
      'add element service-ips { 10.96.3.232 . tcp . 80, … 199 more }',
    ]);
    // A prefix that ends inside a byte is masked: the rule carries a bitwise expression; a whole-byte one does not.
    expect(compileRule('ip saddr 10.88.0.0/20 drop', new Map()).exprs.map(([n]) => n)).toEqual(['payload', 'bitwise', 'cmp', 'immediate']);
    expect(compileRule('ip saddr 10.88.0.0/16 drop', new Map()).exprs.map(([n]) => n)).toEqual(['payload', 'cmp', 'immediate']);
  });

  it("splits elements by size too: a message's element list is one attribute, its length 16 bits", () => {
    // Kubernetes-valid names at their longest: namespace 63, name 63, port name 63; chain names of ~200 characters.
    const base = `${'n'.repeat(63)}/${'s'.repeat(63)}/tcp/${'p'.repeat(63)}`;
    const comment = `${'n'.repeat(63)}/${'s'.repeat(63)}:p`.slice(0, 128);
    const elements = Array.from({ length: 500 }, (_, i) => ({ key: `10.96.${i >> 8}.${i & 255} . tcp . 80`, verdict: `goto service-ABCDEFGH-${base}`, comment }));
    const msgs = encodeOps([{ op: 'add-element', map: 'service-ips', elements }]);
    expect(msgs.length).toBeGreaterThan(1);
    let written = 0;
    for (const m of msgs) {
      // table, set, then the element list: each attribute's length field must hold its size.
      let off = 0;
      while (off < m.body.length) {
        const len = m.body.readUInt16LE(off);
        expect(len).toBeGreaterThanOrEqual(4);
        off += (len + 3) & ~3;
      }
      expect(off).toBe(m.body.length);
      written += Number(/… (\d+) more/.exec(m.what)?.[1] ?? 0) + 1;
    }
    expect(written).toBe(500);
  });

  it('refuses a comment nft would refuse (over 128 bytes), so the step goes through nft and fails there alike', () => {
    const el = (comment: string) => [{ op: 'add-element' as const, map: 'no-endpoint-services', elements: [{ key: '10.96.0.1 . tcp . 80', verdict: 'goto reject-chain', comment }] }];
    expect(() => encodeOps(el('x'.repeat(128)))).not.toThrow();
    expect(() => encodeOps(el('x'.repeat(129)))).toThrow(NotEncodable);
  });
});
