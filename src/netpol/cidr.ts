/** CIDRs as NetworkPolicy's ipBlock names them, IPv4 and IPv6: parsed, normalized, compared. */
import net from 'node:net';

/** A CIDR with its host bits cleared (the API accepts 10.0.0.1/8 as 10.0.0.0/8), or undefined when it is not one. */
export function normalizeCidr(cidr: string): { text: string; v6: boolean; base: bigint; bits: number } | undefined {
  const slash = cidr.indexOf('/');
  if (slash < 0) return undefined;
  const addr = cidr.slice(0, slash);
  const bits = Number(cidr.slice(slash + 1));
  const family = net.isIP(addr);
  if (family === 0 || !/^\d{1,3}$/.test(cidr.slice(slash + 1))) return undefined;
  const width = family === 4 ? 32 : 128;
  if (bits > width) return undefined;
  const value = family === 4 ? ipv4ToBig(addr) : ipv6ToBig(addr);
  const mask = bits === 0 ? 0n : ((1n << BigInt(bits)) - 1n) << BigInt(width - bits);
  const base = value & mask;
  return { text: `${family === 4 ? bigToIpv4(base) : bigToIpv6(base)}/${bits}`, v6: family === 6, base, bits };
}

function ipv4ToBig(a: string): bigint {
  return a.split('.').reduce((n, o) => (n << 8n) | BigInt(Number(o)), 0n);
}
function bigToIpv4(n: bigint): string {
  return [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 255n)).join('.');
}
function ipv6ToBig(a: string): bigint {
  let s = a;
  // An embedded IPv4 tail (::ffff:1.2.3.4) as two groups.
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(s);
  if (v4) {
    const n = ipv4ToBig(v4[1]!);
    s = `${s.slice(0, -v4[1]!.length)}${(n >> 16n).toString(16)}:${(n & 0xffffn).toString(16)}`;
  }
  const [head, tail] = s.includes('::') ? s.split('::') : [s, undefined];
  const h = head ? head.split(':') : [];
  const t = tail !== undefined && tail !== '' ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array(8 - h.length - t.length).fill('0'), ...t];
  return groups.reduce((n, g) => (n << 16n) | BigInt(parseInt(g, 16)), 0n);
}
function bigToIpv6(n: bigint): string {
  const groups: string[] = [];
  for (let i = 7; i >= 0; i--) groups.push(((n >> BigInt(i * 16)) & 0xffffn).toString(16));
  return groups.join(':').replace(/(^|:)0(:0)+(:|$)/, '::').replace(/^:::/, '::');
}

/** Whether an address lies in a normalized CIDR. */
export function cidrHas(cidr: string, ip: string): boolean {
  const c = normalizeCidr(cidr);
  const family = net.isIP(ip);
  if (!c || family === 0 || (family === 6) !== c.v6) return false;
  const probe = normalizeCidr(`${ip}/${c.bits}`);
  return probe !== undefined && probe.base === c.base;
}

/** Whether `inner` is a strict subset of `outer` (the API's rule for an ipBlock's except). */
export function strictSubset(outer: string, inner: string): boolean {
  const o = normalizeCidr(outer);
  const i = normalizeCidr(inner);
  if (!o || !i || o.v6 !== i.v6 || i.bits <= o.bits) return false;
  const width = o.v6 ? 128 : 32;
  const mask = o.bits === 0 ? 0n : ((1n << BigInt(o.bits)) - 1n) << BigInt(width - o.bits);
  return (i.base & mask) === o.base;
}
