/**
 * Encodes the service DNS's own answers with name compression (RFC 1035
 * 4.1.4). dns-packet writes every name in full, so a headless Service's
 * answer repeats `<svc>.<ns>.svc.<zone>` once per record and 150 endpoints
 * no longer fit a 4096-byte EDNS buffer. Only what the server answers is
 * written here (A, AAAA, CNAME, SRV, PTR, TXT, SOA, OPT); forwarded answers pass
 * through as the upstream sent them.
 */
import net from 'node:net';
import dnsPacket, { type Answer, type Packet } from 'dns-packet';

const TYPE = { A: 1, NS: 2, CNAME: 5, SOA: 6, PTR: 12, TXT: 16, AAAA: 28, SRV: 33, OPT: 41 } as const;
const CLASS_IN = 1;
/** A pointer holds 14 bits: names written past this offset cannot be pointed at. */
const MAX_POINTER = 0x3fff;

/** The question section as the client sent it, so it is echoed byte for byte. */
export interface RawQuestion {
  bytes: Buffer;
  /** Its name's labels as written (latin1), to let answers point into it. */
  labels: string[];
}

/**
 * The question of a one-question query, read from the raw bytes: undefined when its name uses a
 * pointer or runs past the message (then the decoded question is written instead).
 */
export function rawQuestion(raw: Buffer): RawQuestion | undefined {
  let off = 12;
  const labels: string[] = [];
  for (;;) {
    const len = raw[off];
    if (len === undefined || len > 63) return undefined;
    if (len === 0) break;
    if (off + 1 + len > raw.length) return undefined;
    labels.push(raw.toString('latin1', off + 1, off + 1 + len));
    off += 1 + len;
  }
  const end = off + 1 + 4;
  if (end > raw.length) return undefined;
  return { bytes: raw.subarray(12, end), labels };
}

class Writer {
  private buf: Buffer;
  private len = 0;
  /** Case-sensitive suffix ("db.ns1.svc.cluster.local") → where it was written. */
  private readonly names = new Map<string, number>();

  constructor(hint: number) {
    this.buf = Buffer.allocUnsafe(hint);
  }

  get length(): number {
    return this.len;
  }

  private room(n: number): void {
    if (this.len + n <= this.buf.length) return;
    const next = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.len + n));
    this.buf.copy(next, 0, 0, this.len);
    this.buf = next;
  }

  u8(v: number): void {
    this.room(1);
    this.buf[this.len++] = v;
  }

  u16(v: number): void {
    this.room(2);
    this.buf.writeUInt16BE(v, this.len);
    this.len += 2;
  }

  u32(v: number): void {
    this.room(4);
    this.buf.writeUInt32BE(v >>> 0, this.len);
    this.len += 4;
  }

  bytes(b: Buffer): void {
    this.room(b.length);
    b.copy(this.buf, this.len);
    this.len += b.length;
  }

  /** Remembers where each suffix of `labels` starts, written at `at`. */
  learn(labels: string[], at: number, encoding: 'latin1' | 'utf8'): void {
    for (let i = 0; i < labels.length && at <= MAX_POINTER; i++) {
      const key = labels.slice(i).join('.');
      if (!this.names.has(key)) this.names.set(key, at);
      at += 1 + Buffer.byteLength(labels[i]!, encoding);
    }
  }

  /**
   * A domain name, ending in a pointer to the longest suffix already written; or, not `compress`ed,
   * in full (later names may still point into it).
   */
  name(text: string, compress = true): void {
    const trimmed = text.replace(/^\.+|\.+$/g, '');
    const labels = trimmed ? trimmed.split('.') : [];
    for (let i = 0; i < labels.length; i++) {
      const at = compress ? this.names.get(labels.slice(i).join('.')) : undefined;
      if (at !== undefined) {
        this.u16(0xc000 | at);
        return;
      }
      const key = labels.slice(i).join('.');
      if (this.len <= MAX_POINTER && !this.names.has(key)) this.names.set(key, this.len);
      const label = Buffer.from(labels[i]!, 'utf8');
      if (label.length === 0 || label.length > 63) throw new Error(`cannot encode the name "${text}": label "${labels[i]}" is not 1-63 bytes`);
      this.u8(label.length);
      this.bytes(label);
    }
    this.u8(0);
  }

  /** Writes a record's data after a length placeholder, then fills the length in. */
  rdata(write: () => void): void {
    const at = this.len;
    this.u16(0);
    write();
    this.buf.writeUInt16BE(this.len - at - 2, at);
  }

  done(): Buffer {
    return this.buf.subarray(0, this.len);
  }
}

function ipv6Bytes(ip: string): Buffer {
  const [head, tail] = ip.includes('::') ? ip.split('::') : [ip, undefined];
  const groups = (s: string | undefined) => (s ? s.split(':') : []);
  const h = groups(head);
  const t = groups(tail);
  const all = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  const out = Buffer.alloc(16);
  all.forEach((g, i) => out.writeUInt16BE(parseInt(g, 16), i * 2));
  return out;
}

function record(w: Writer, a: Answer): void {
  if (a.type === 'OPT') {
    const opt = a as { udpPayloadSize?: number; extendedRcode?: number; ednsVersion?: number; flags?: number };
    w.u8(0); // the root
    w.u16(TYPE.OPT);
    w.u16(opt.udpPayloadSize ?? 4096);
    w.u8(opt.extendedRcode ?? 0);
    w.u8(opt.ednsVersion ?? 0);
    w.u16(opt.flags ?? 0);
    w.u16(0);
    return;
  }
  const type = TYPE[a.type as keyof typeof TYPE];
  if (type === undefined) throw new Error(`cannot encode a ${a.type} record`);
  w.name(a.name);
  w.u16(type);
  w.u16(CLASS_IN);
  w.u32(a.ttl ?? 0);
  const data = (a as { data: unknown }).data;
  w.rdata(() => {
    switch (a.type) {
      case 'A':
        if (!net.isIPv4(data as string)) throw new Error(`not an IPv4 address: ${String(data)}`);
        for (const o of (data as string).split('.')) w.u8(Number(o));
        return;
      case 'AAAA':
        if (!net.isIPv6(data as string)) throw new Error(`not an IPv6 address: ${String(data)}`);
        w.bytes(ipv6Bytes(data as string));
        return;
      case 'PTR':
      case 'NS':
      case 'CNAME':
        w.name(data as string);
        return;
      case 'SRV': {
        const s = data as { priority?: number; weight?: number; port: number; target: string };
        w.u16(s.priority ?? 0);
        w.u16(s.weight ?? 0);
        w.u16(s.port);
        w.name(s.target, false); // RFC 2782: the target is never compressed
        return;
      }
      case 'TXT':
        for (const s of Array.isArray(data) ? data : [data]) {
          const b = Buffer.isBuffer(s) ? s : Buffer.from(String(s), 'utf8');
          if (b.length > 255) throw new Error('a TXT string is at most 255 bytes');
          w.u8(b.length);
          w.bytes(b);
        }
        return;
      case 'SOA': {
        const s = data as { mname: string; rname: string; serial?: number; refresh?: number; retry?: number; expire?: number; minimum?: number };
        w.name(s.mname);
        w.name(s.rname);
        for (const v of [s.serial, s.refresh, s.retry, s.expire, s.minimum]) w.u32(v ?? 0);
        return;
      }
      default:
        throw new Error(`cannot encode a ${a.type} record`);
    }
  });
}

/** The header flags of a response: QR set, the opcode and rcode within their fields. */
function headerFlags(p: Packet): number {
  return 0x8000 | ((p.flags ?? 0) & 0x7fff);
}

/**
 * A response in wire format, names compressed. `question` (from rawQuestion) is echoed as the
 * client wrote it; without it, the packet's question is encoded from its text.
 */
export function encodeResponse(p: Packet, question?: RawQuestion): Buffer {
  const answers = p.answers ?? [];
  const authorities = p.authorities ?? [];
  const additionals = p.additionals ?? [];
  const w = new Writer(512);
  w.u16(p.id ?? 0);
  w.u16(headerFlags(p));
  const qs = p.questions ?? [];
  w.u16(question && qs.length === 1 ? 1 : qs.length);
  w.u16(answers.length);
  w.u16(authorities.length);
  w.u16(additionals.length);
  if (question && qs.length === 1) {
    w.learn(question.labels, w.length, 'latin1');
    w.bytes(question.bytes);
  } else if (qs.length) {
    // dns-packet knows every type's number; the names it writes in full are learnt for pointers.
    const at = w.length;
    w.bytes(dnsPacket.encode({ type: 'query', id: 0, questions: qs }).subarray(12));
    w.learn(qs[0]!.name.replace(/^\.+|\.+$/g, '').split('.').filter(Boolean), at, 'utf8');
  }
  for (const a of answers) record(w, a);
  for (const a of authorities) record(w, a);
  for (const a of additionals) record(w, a);
  return w.done();
}
