/**
 * A partial sync's steps (NftOp) as nf_tables netlink messages: the
 * expressions nft itself would make of the same text, so `nft list table ip
 * kube-proxy` reads the same whichever way a rule was written. Only the rule
 * shapes the proxy writes are known here (nft-rules.ts); any other throws
 * NotEncodable and the sync goes through nft instead.
 */
import { Attrs, NLM_F_APPEND, NLM_F_CREATE, type NftMessage } from '../sys/nfnetlink.js';
import { NFT_COMMENT_MAX, NFT_TABLE, type NftElement, type NftOp } from './nft-rules.js';

export class NotEncodable extends Error {}

const NFPROTO_IPV4 = 2;

// Message types (NFT_MSG_*).
const NEWCHAIN = 3;
const DELCHAIN = 5;
const NEWRULE = 6;
const DELRULE = 8;
const NEWSET = 9;
const DELSET = 11;
const NEWSETELEM = 12;
const DELSETELEM = 14;

// Attribute numbers, by the object they belong to.
const CHAIN_TABLE = 1;
const CHAIN_NAME = 3;
const RULE_TABLE = 1;
const RULE_CHAIN = 2;
const RULE_EXPRESSIONS = 4;
const RULE_USERDATA = 7;
const SET_TABLE = 1;
const SET_NAME = 2;
const SET_FLAGS = 3;
const SET_KEY_TYPE = 4;
const SET_KEY_LEN = 5;
const SET_ID = 10;
const SET_TIMEOUT = 11;
const ELEMS_TABLE = 1;
const ELEMS_SET = 2;
const ELEMS_ELEMENTS = 3;
const ELEM_KEY = 1;
const ELEM_DATA = 2;
const ELEM_USERDATA = 6;
const LIST_ELEM = 1;
const DATA_VALUE = 1;
const DATA_VERDICT = 2;
const VERDICT_CODE = 1;
const VERDICT_CHAIN = 2;
const EXPR_NAME = 1;
const EXPR_DATA = 2;

const SET_F_TIMEOUT = 0x10;
const SET_F_EVAL = 0x20;
/** nft's datatype number for ipv4_addr. */
const TYPE_IPADDR = 7;

const VERDICTS: Record<string, number> = { drop: 0, accept: 1, continue: -1, return: -5 };
const JUMP = -3;
const GOTO = -4;
const PROTOS: Record<string, number> = { tcp: 6, udp: 17, sctp: 132 };

const REG_VERDICT = 0;
const REG_1 = 1;
const REG_2 = 2;

/** One expression of a rule: its kind and its attributes. */
type Expr = [string, (a: Attrs) => void];

const payload = (base: number, offset: number, len: number): Expr => ['payload', (a) => a.u32(1, REG_1).u32(2, base).u32(3, offset).u32(4, len)];
const cmp = (op: 'eq' | 'neq', data: Buffer): Expr => ['cmp', (a) => a.u32(1, REG_1).u32(2, op === 'eq' ? 0 : 1).nest(3, (d) => d.raw(DATA_VALUE, data))];
const metaL4proto: Expr = ['meta', (a) => a.u32(1, REG_1).u32(2, 16)];
const NETWORK = 1;
const TRANSPORT = 2;

function ipBytes(ip: string): Buffer {
  const parts = ip.split('.');
  if (parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) < 256)) throw new NotEncodable(`not an IPv4 address: ${ip}`);
  return Buffer.from(parts.map(Number));
}

function hostU32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
}

function portBytes(p: string): Buffer {
  if (!/^\d{1,5}$/.test(p) || Number(p) > 65535) throw new NotEncodable(`not a port: ${p}`);
  const b = Buffer.alloc(2);
  b.writeUInt16BE(Number(p));
  return b;
}

function proto(p: string | undefined): number {
  const n = p === undefined ? undefined : PROTOS[p];
  if (n === undefined) throw new NotEncodable(`not a protocol: ${p}`);
  return n;
}

/** `ip saddr|daddr [!=] ADDR[/LEN]`, as nft matches it: only the prefix's whole bytes when it ends on one. */
function addressMatch(field: string, negate: boolean, value: string): Expr[] {
  const offset = field === 'saddr' ? 12 : field === 'daddr' ? 16 : -1;
  if (offset < 0) throw new NotEncodable(`ip ${field}`);
  const [ip, lenText] = value.split('/');
  const len = lenText === undefined ? 32 : Number(lenText);
  if (!Number.isInteger(len) || len < 1 || len > 32) throw new NotEncodable(`a prefix length: ${value}`);
  const addr = ipBytes(ip!);
  const op = negate ? 'neq' : 'eq';
  if (len % 8 === 0) return [payload(NETWORK, offset, len / 8), cmp(op, addr.subarray(0, len / 8))];
  const mask = Buffer.alloc(4);
  mask.writeUInt32BE(len === 32 ? 0xffffffff : (0xffffffff << (32 - len)) >>> 0);
  const net = Buffer.from(addr.map((b, i) => b & mask[i]!));
  return [payload(NETWORK, offset, 4), ['bitwise', (a) => a.u32(1, REG_1).u32(2, REG_1).u32(3, 4).nest(4, (d) => d.raw(DATA_VALUE, mask)).nest(5, (d) => d.raw(DATA_VALUE, Buffer.alloc(4)))], cmp(op, net)];
}

function verdict(code: number, chain?: string): (a: Attrs) => void {
  return (a) =>
    a.nest(DATA_VERDICT, (v) => {
      v.u32(VERDICT_CODE, code);
      if (chain !== undefined) v.str(VERDICT_CHAIN, chain);
    });
}

/** `drop`, `jump C`, `goto C`…: the verdict's code and chain. */
function parseVerdict(words: string[]): { code: number; chain?: string } {
  if (words.length === 1 && VERDICTS[words[0]!] !== undefined) return { code: VERDICTS[words[0]!]! };
  if (words.length === 2 && (words[0] === 'jump' || words[0] === 'goto')) return { code: words[0] === 'jump' ? JUMP : GOTO, chain: words[1]! };
  throw new NotEncodable(`a verdict: ${words.join(' ')}`);
}

/** A rule of the proxy's shapes, in `table`: its expressions and its comment (`setIds`: the batch's new sets, by table and name). */
export function compileRule(rule: string, setIds: Map<string, number>, table = NFT_TABLE): { exprs: Expr[]; comment?: string } {
  let text = rule;
  let comment: string | undefined;
  const m = /^(.*?)\s+comment "([^"]*)"$/.exec(text);
  if (m) {
    text = m[1]!;
    comment = m[2]!;
  }
  if (/["{}]/.test(text.replace('{ ip saddr }', ''))) throw new NotEncodable(`a rule with a set or string: ${rule}`);
  const w = text.split(/\s+/).filter(Boolean);
  const exprs: Expr[] = [];
  const setRef = (name: string) => (a: Attrs) => {
    a.str(1, name);
    const id = setIds.get(`${table}\0${name}`);
    if (id !== undefined) a.u32(2, id);
  };
  let i = 0;
  while (i < w.length) {
    const t = w[i]!;
    if (t === 'ip' && (w[i + 1] === 'saddr' || w[i + 1] === 'daddr')) {
      const field = w[i + 1]!;
      const negate = w[i + 2] === '!=';
      const value = w[i + (negate ? 3 : 2)];
      if (value === undefined) throw new NotEncodable(rule);
      if (value.startsWith('@')) {
        if (negate || field !== 'saddr') throw new NotEncodable(rule);
        const name = value.slice(1);
        exprs.push(payload(NETWORK, 12, 4), [
          'lookup',
          (a) => {
            a.str(1, name).u32(2, REG_1);
            const id = setIds.get(`${table}\0${name}`);
            if (id !== undefined) a.u32(4, id);
          },
        ]);
      } else exprs.push(...addressMatch(field, negate, value));
      i += negate ? 4 : 3;
    } else if (PROTOS[t] !== undefined && w[i + 1] === 'dport' && w[i + 2] !== undefined) {
      exprs.push(metaL4proto, cmp('eq', Buffer.from([PROTOS[t]!])), payload(TRANSPORT, 2, 2), cmp('eq', portBytes(w[i + 2]!)));
      i += 3;
    } else if (t === 'meta' && w[i + 1] === 'l4proto') {
      exprs.push(metaL4proto, cmp('eq', Buffer.from([proto(w[i + 2])])));
      i += 3;
    } else if (t === 'fib' && w[i + 1] === 'saddr' && w[i + 2] === 'type' && w[i + 3] === 'local') {
      // RTN_LOCAL, in host order as the fib expression leaves it.
      exprs.push(['fib', (a) => a.u32(1, REG_1).u32(2, 3).u32(3, 1)], cmp('eq', hostU32(2)));
      i += 4;
    } else if (t === 'numgen' && w[i + 1] === 'random' && w[i + 2] === 'mod' && /^\d+$/.test(w[i + 3] ?? '') && /^\d+$/.test(w[i + 4] ?? '')) {
      const mod = Number(w[i + 3]);
      exprs.push(['numgen', (a) => a.u32(1, REG_1).u32(2, mod).u32(3, 1).u32(4, 0)], cmp('eq', hostU32(Number(w[i + 4]))));
      i += 5;
    } else if (t === 'dnat' && w[i + 1] === 'to' && i + 3 === w.length) {
      const [ip, port] = w[i + 2]!.split(':');
      if (port === undefined) throw new NotEncodable(rule);
      const addr = ipBytes(ip!);
      const p = portBytes(port);
      exprs.push(['immediate', (a) => a.u32(1, REG_1).nest(2, (d) => d.raw(DATA_VALUE, addr))], ['immediate', (a) => a.u32(1, REG_2).nest(2, (d) => d.raw(DATA_VALUE, p))]);
      // Type dnat, family ip, address and port from registers 1 and 2, "port given" (NF_NAT_RANGE_PROTO_SPECIFIED).
      exprs.push(['nat', (a) => a.u32(1, 1).u32(2, NFPROTO_IPV4).u32(3, REG_1).u32(5, REG_2).u32(7, 0x2)]);
      i = w.length;
    } else if (t === 'update' && w[i + 1]?.startsWith('@') && w.slice(i + 2).join(' ') === '{ ip saddr }') {
      const name = w[i + 1]!.slice(1);
      exprs.push(payload(NETWORK, 12, 4), [
        'dynset',
        (a) => {
          setRef(name)(a);
          a.u32(3, 1).u32(4, REG_1); // update, the key from register 1
        },
      ]);
      i = w.length;
    } else {
      const v = parseVerdict(w.slice(i));
      exprs.push(['immediate', (a) => a.u32(1, REG_VERDICT).nest(2, verdict(v.code, v.chain))]);
      i = w.length;
    }
  }
  return { exprs, comment };
}

/** nft's user data for a comment (one TLV: type 0, the text with its NUL). */
function commentData(comment: string): Buffer {
  const text = Buffer.concat([Buffer.from(comment, 'utf8'), Buffer.alloc(1)]);
  // The kernel would take up to 254 bytes, nft no more than 128: what nft refuses is not written here either.
  if (text.length > NFT_COMMENT_MAX + 1) throw new NotEncodable(`a comment over ${NFT_COMMENT_MAX} bytes`);
  return Buffer.concat([Buffer.from([0, text.length]), text]);
}

/** A map key as the proxy writes it (`10.96.0.1 . tcp . 80`, `tcp . 30080`): each part in a register's 4 bytes. */
function keyBytes(key: string): Buffer {
  const parts = key.split(' . ');
  const word = (b: Buffer) => Buffer.concat([b, Buffer.alloc(4 - b.length)]);
  if (parts.length === 3) return Buffer.concat([ipBytes(parts[0]!), word(Buffer.from([proto(parts[1])])), word(portBytes(parts[2]!))]);
  if (parts.length === 2) return Buffer.concat([word(Buffer.from([proto(parts[0])])), word(portBytes(parts[1]!))]);
  throw new NotEncodable(`a map key: ${key}`);
}

function elementAttrs(e: NftElement, withData: boolean): (a: Attrs) => void {
  return (a) => {
    a.nest(ELEM_KEY, (k) => k.raw(DATA_VALUE, keyBytes(e.key)));
    if (!withData) return;
    const v = parseVerdict(e.verdict.split(/\s+/));
    a.nest(ELEM_DATA, verdict(v.code, v.chain));
    if (e.comment) a.raw(ELEM_USERDATA, commentData(e.comment));
  };
}

/**
 * What one message carries at most: elements go in pieces of this many, and
 * of no more than this many bytes: the element list is one attribute, whose
 * length field is 16 bits (500 elements with long chain names and comments
 * are well over 64 KiB).
 */
const ELEMENTS_PER_MESSAGE = 500;
const ELEMENT_BYTES_PER_MESSAGE = 60 * 1024;

/** The ops as one batch of messages, each for its table (`ip kube-proxy` when the op names none). */
export function encodeOps(ops: NftOp[]): NftMessage[] {
  const out: NftMessage[] = [];
  /** Sets made in this batch, by table and name: a rule names one by its id. */
  const setIds = new Map<string, number>();
  let nextId = 1;
  const msg = (type: number, flags: number, what: string, fill: (a: Attrs) => void) => {
    const a = new Attrs();
    fill(a);
    out.push({ type, flags, family: NFPROTO_IPV4, body: a.bytes(), what });
  };
  for (const o of ops) {
    const T = o.table ?? NFT_TABLE;
    switch (o.op) {
      case 'add-chain':
        msg(NEWCHAIN, NLM_F_CREATE, `add chain ${o.chain}`, (a) => a.str(CHAIN_TABLE, T).str(CHAIN_NAME, o.chain));
        break;
      case 'flush-chain':
        msg(DELRULE, 0, `flush chain ${o.chain}`, (a) => a.str(RULE_TABLE, T).str(RULE_CHAIN, o.chain));
        break;
      case 'delete-chain':
        msg(DELCHAIN, 0, `delete chain ${o.chain}`, (a) => a.str(CHAIN_TABLE, T).str(CHAIN_NAME, o.chain));
        break;
      case 'add-set': {
        const id = nextId++;
        setIds.set(`${T}\0${o.name}`, id);
        msg(NEWSET, NLM_F_CREATE, `add set ${o.name}`, (a) =>
          a
            .str(SET_TABLE, T)
            .str(SET_NAME, o.name)
            .u32(SET_FLAGS, SET_F_TIMEOUT | SET_F_EVAL)
            .u32(SET_KEY_TYPE, TYPE_IPADDR)
            .u32(SET_KEY_LEN, 4)
            .u32(SET_ID, id)
            .u64(SET_TIMEOUT, BigInt(o.timeout) * 1000n),
        );
        break;
      }
      case 'delete-set':
        msg(DELSET, 0, `delete set ${o.name}`, (a) => a.str(SET_TABLE, T).str(SET_NAME, o.name));
        break;
      case 'add-rule': {
        const { exprs, comment } = compileRule(o.rule, setIds, T);
        msg(NEWRULE, NLM_F_CREATE | NLM_F_APPEND, `add rule ${o.chain} ${o.rule}`, (a) => {
          a.str(RULE_TABLE, T).str(RULE_CHAIN, o.chain);
          a.nest(RULE_EXPRESSIONS, (l) => {
            for (const [name, fill] of exprs) l.nest(LIST_ELEM, (e) => e.str(EXPR_NAME, name).nest(EXPR_DATA, fill));
          });
          if (comment !== undefined) a.raw(RULE_USERDATA, commentData(comment));
        });
        break;
      }
      case 'add-element':
      case 'delete-element': {
        const add = o.op === 'add-element';
        const encoded = o.elements.map((e) => new Attrs().nest(LIST_ELEM, elementAttrs(e, add)).bytes());
        for (let i = 0; i < encoded.length; ) {
          let end = i;
          let bytes = 0;
          while (end < encoded.length && end - i < ELEMENTS_PER_MESSAGE && (end === i || bytes + encoded[end]!.length <= ELEMENT_BYTES_PER_MESSAGE)) bytes += encoded[end++]!.length;
          const count = end - i;
          const list = Buffer.concat(encoded.slice(i, end));
          msg(add ? NEWSETELEM : DELSETELEM, add ? NLM_F_CREATE : 0, `${add ? 'add' : 'delete'} element ${o.map} { ${o.elements[i]!.key}${count > 1 ? `, … ${count - 1} more` : ''} }`, (a) => {
            a.str(ELEMS_TABLE, T).str(ELEMS_SET, o.map).nestBytes(ELEMS_ELEMENTS, list);
          });
          i = end;
        }
        break;
      }
    }
  }
  return out;
}
