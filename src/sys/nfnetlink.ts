/**
 * A NETLINK_NETFILTER socket for nf_tables batches: the messages `nft -f`
 * would send, written by the caller, sent as one transaction without the nft
 * command. nft fetches the table's whole contents before every command (its
 * cache), which beside 10,000 Services costs about 100 ms of userspace work
 * for a one-element change; the kernel's own part is a few milliseconds.
 *
 * The socket belongs to the network namespace it was made in: `open` makes
 * it in another one by entering that namespace on this thread for the
 * socket(2) call alone.
 */
import fs from 'node:fs';
import koffi from 'koffi';
import { CLONE_NEWNET, lastErrnoName, setns } from './libc.js';

const libc = koffi.load('libc.so.6');
const socketRaw = libc.func('int socket(int domain, int type, int protocol)');
const sendRaw = libc.func('intptr_t send(int fd, const uint8_t *buf, size_t len, int flags)');
const recvRaw = libc.func('intptr_t recv(int fd, _Out_ uint8_t *buf, size_t len, int flags)');
const setsockoptRaw = libc.func('int setsockopt(int fd, int level, int name, const int *value, uint32_t len)');
const closeRaw = libc.func('int close(int fd)');

type AsyncCall = { async: (...args: unknown[]) => void };

const AF_NETLINK = 16;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_NETFILTER = 12;
const SOL_SOCKET = 1;
const SO_SNDBUFFORCE = 32;
const SO_RCVBUFFORCE = 33;
const MSG_DONTWAIT = 0x40;
const NLMSG_ERROR = 2;

/** What one socket sends in one batch at most; larger batches are the caller's to split or send otherwise. */
export const MAX_BATCH_BYTES = 4 * 1024 * 1024;

/**
 * What one answer costs the receive buffer (its skb, not its 36 bytes): the
 * kernel queues an answer to every message before send(2) returns, and drops
 * those that find the buffer full (ENOBUFS) after applying the batch all the
 * same. Measured ~760 (an 8 MiB buffer held 10,000 answers, not 12,000).
 */
const ANSWER_BUFFER_BYTES = 1024;

export const NLM_F_REQUEST = 0x1;
export const NLM_F_ACK = 0x4;
export const NLM_F_CREATE = 0x400;
export const NLM_F_APPEND = 0x800;

const NFNL_MSG_BATCH_BEGIN = 0x10;
const NFNL_MSG_BATCH_END = 0x11;
const NFNL_SUBSYS_NFTABLES = 10;

/** One nf_tables message of a batch: its type (NFT_MSG_*), flags beyond request and ack, family and attributes. */
export interface NftMessage {
  type: number;
  flags: number;
  family: number;
  /** The attributes, already encoded (see Attrs). */
  body: Buffer;
  /** How an error about it is told. */
  what: string;
}

/**
 * The batch was sent but its answers could not all be read: the kernel may
 * have applied it or refused it. Sending the same steps again (through nft)
 * is wrong either way; the caller must learn the state afresh.
 */
export class NfnetlinkUnanswered extends Error {}

/** A kernel refusal of one message of a batch (the whole batch was then undone). */
export class NfnetlinkError extends Error {
  constructor(
    readonly errno: number,
    readonly what: string,
  ) {
    super(`nf_tables refused ${what}: ${errnoText(errno)}`);
  }
}

const ERRNO_TEXT: Record<number, string> = {
  1: 'EPERM (operation not permitted)',
  2: 'ENOENT (no such table, chain, set or element)',
  12: 'ENOMEM',
  16: 'EBUSY (still in use)',
  17: 'EEXIST (already there, with other contents)',
  22: 'EINVAL (malformed)',
  34: 'ERANGE',
  90: 'EMSGSIZE',
  95: 'EOPNOTSUPP',
};
const errnoText = (e: number) => ERRNO_TEXT[e] ?? `errno ${e}`;

export class NfnetlinkSocket {
  private seq = Math.floor(Date.now() / 1000) & 0x7fffffff;
  /** An error's answer carries the refused message back: room for the largest this side sends (500 elements). */
  private readonly reply = Buffer.alloc(256 * 1024);

  /** The receive buffer asked for (the kernel grants twice as much). */
  private rcvbuf = MAX_BATCH_BYTES;

  private constructor(
    private fd: number,
    /** The namespace file's identity (device and inode), when opened by path. */
    private readonly nsId?: string,
  ) {}

  /**
   * Whether `netnsPath` still names the namespace this socket was made in. A
   * socket keeps its namespace alive after `ip netns del`, and a namespace
   * made again at the same path is another one: writes there would be lost.
   */
  isIn(netnsPath: string): boolean {
    try {
      const st = fs.statSync(netnsPath);
      return this.nsId === `${st.dev}:${st.ino}`;
    } catch {
      return false;
    }
  }

  /** A socket in the namespace at `netnsPath` (a /run/netns or /proc/PID/ns/net path), or in this thread's own. */
  static open(netnsPath?: string): NfnetlinkSocket {
    let fd: number;
    let nsId: string | undefined;
    if (netnsPath === undefined) fd = socketRaw(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER) as number;
    else {
      const home = fs.openSync('/proc/thread-self/ns/net', 'r');
      const there = fs.openSync(netnsPath, 'r');
      try {
        const st = fs.fstatSync(there);
        nsId = `${st.dev}:${st.ino}`;
        setns(there, CLONE_NEWNET);
        try {
          fd = socketRaw(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER) as number;
        } finally {
          // Back home before anything else runs on this thread; failing that, nothing else is safe.
          setns(home, CLONE_NEWNET);
        }
      } finally {
        fs.closeSync(there);
        fs.closeSync(home);
      }
    }
    if (fd < 0) throw new Error(`netlink socket: ${lastErrnoName()}`);
    for (const opt of [SO_SNDBUFFORCE, SO_RCVBUFFORCE]) {
      if ((setsockoptRaw(fd, SOL_SOCKET, opt, [MAX_BATCH_BYTES], 4) as number) !== 0) {
        const e = lastErrnoName();
        closeRaw(fd);
        throw new Error(`netlink setsockopt: ${e}`);
      }
    }
    return new NfnetlinkSocket(fd, nsId);
  }

  /**
   * Sends the messages as one batch, which the kernel applies whole or not
   * at all before send(2) returns, and reads its answer to each. Throws
   * NfnetlinkError naming the first message it refused. The send runs on
   * libuv's thread pool: beside a large table the kernel's validation of it
   * takes tens of milliseconds, which the event loop must not wait out.
   */
  async transact(messages: NftMessage[]): Promise<void> {
    if (this.fd < 0) throw new Error('the netlink socket is closed');
    if (messages.length === 0) return;
    const first = this.seq + 1;
    const parts: Buffer[] = [batchMark(NFNL_MSG_BATCH_BEGIN, ++this.seq)];
    for (const m of messages) parts.push(message(m, ++this.seq));
    parts.push(batchMark(NFNL_MSG_BATCH_END, ++this.seq));
    const batch = Buffer.concat(parts);
    if (batch.length > MAX_BATCH_BYTES) throw new Error(`an nf_tables batch of ${batch.length} bytes is over the ${MAX_BATCH_BYTES} a socket takes`);
    // Room for every answer, and an error's (which carries its message back), before anything is sent.
    const room = messages.length * ANSWER_BUFFER_BYTES + this.reply.length;
    if (room > this.rcvbuf) {
      if ((setsockoptRaw(this.fd, SOL_SOCKET, SO_RCVBUFFORCE, [room], 4) as number) !== 0) throw new Error(`netlink setsockopt SO_RCVBUFFORCE ${room}: ${lastErrnoName()}`);
      this.rcvbuf = room;
    }
    this.drainStale();
    const fd = this.fd;
    const sent = await new Promise<number>((resolve, reject) =>
      (sendRaw as unknown as AsyncCall).async(fd, batch, batch.length, 0, (err: unknown, n: number) => (err ? reject(err instanceof Error ? err : new Error(String(err))) : resolve(Number(n)))),
    );
    if (this.fd !== fd) throw new NfnetlinkUnanswered('the netlink socket was closed during a send');
    // errno belongs to the pool thread: a failed send says only that it failed.
    if (sent !== batch.length) throw new Error(`netlink send: ${sent < 0 ? 'failed' : `${sent} of ${batch.length} bytes`}`);
    // Every message asked for an answer; they are all queued by the time send returns.
    let answered = 0;
    let refused: NfnetlinkError | undefined;
    while (answered < messages.length) {
      const n = Number(recvRaw(this.fd, this.reply, this.reply.length, MSG_DONTWAIT));
      if (n < 0) {
        const e = lastErrnoName();
        if (refused) break; // an undone batch need not answer for every message
        // Sent whole, so applied or refused as a whole: which is not known.
        throw new NfnetlinkUnanswered(`netlink recv after ${answered} of ${messages.length} answers: ${e} (the batch was sent: whether it was applied is not known)`);
      }
      for (let off = 0; off + 16 <= n; ) {
        const len = this.reply.readUInt32LE(off);
        if (len < 16 || off + len > n) throw new NfnetlinkUnanswered('netlink: an answer overruns its datagram');
        if (this.reply.readUInt16LE(off + 4) === NLMSG_ERROR && len >= 36) {
          const errno = -this.reply.readInt32LE(off + 16);
          const seq = this.reply.readUInt32LE(off + 28);
          const i = seq - first - 1;
          if (i >= 0 && i < messages.length) {
            answered++;
            if (errno !== 0 && !refused) refused = new NfnetlinkError(errno, messages[i]!.what);
          }
        }
        off += (len + 3) & ~3;
      }
    }
    if (refused) throw refused;
  }

  close(): void {
    if (this.fd >= 0) closeRaw(this.fd);
    this.fd = -1;
  }

  /** Answers left from a batch that failed half-read: never taken for the next one's. */
  private drainStale(): void {
    while (Number(recvRaw(this.fd, this.reply, this.reply.length, MSG_DONTWAIT)) > 0);
  }
}

function header(len: number, type: number, flags: number, seq: number, family: number, resId: number): Buffer {
  const b = Buffer.alloc(20);
  b.writeUInt32LE(len, 0);
  b.writeUInt16LE(type, 4);
  b.writeUInt16LE(flags, 6);
  b.writeUInt32LE(seq, 8);
  b.writeUInt32LE(0, 12);
  // struct nfgenmsg: family, version 0, the resource id (big-endian).
  b.writeUInt8(family, 16);
  b.writeUInt8(0, 17);
  b.writeUInt16BE(resId, 18);
  return b;
}

function batchMark(type: number, seq: number): Buffer {
  return header(20, type, NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES);
}

function message(m: NftMessage, seq: number): Buffer {
  const body = m.body;
  const len = 20 + body.length;
  return Buffer.concat([header(len, (NFNL_SUBSYS_NFTABLES << 8) | m.type, NLM_F_REQUEST | NLM_F_ACK | m.flags, seq, m.family, 0), body, Buffer.alloc(((len + 3) & ~3) - len)]);
}

const NLA_F_NESTED = 0x8000;

/** Netlink attributes, appended in order; nested ones through `nest`. */
export class Attrs {
  private readonly parts: Buffer[] = [];

  raw(type: number, value: Buffer): this {
    const len = 4 + value.length;
    // nla_len is 16 bits: a longer attribute cannot be said (the caller must split what it holds).
    if (len > 0xffff) throw new RangeError(`a netlink attribute of ${len} bytes (type ${type & ~NLA_F_NESTED}) is over the 65,535 its length field holds`);
    const h = Buffer.alloc(4);
    h.writeUInt16LE(len, 0);
    h.writeUInt16LE(type, 2);
    this.parts.push(h, value, Buffer.alloc(((len + 3) & ~3) - len));
    return this;
  }

  /** A NUL-terminated string, as nf_tables takes names. */
  str(type: number, s: string): this {
    return this.raw(type, Buffer.concat([Buffer.from(s, 'utf8'), Buffer.alloc(1)]));
  }

  /** A 32-bit number in network order, as nf_tables takes them (negative verdict codes too). */
  u32(type: number, n: number): this {
    const b = Buffer.alloc(4);
    if (n < 0) b.writeInt32BE(n);
    else b.writeUInt32BE(n);
    return this.raw(type, b);
  }

  u64(type: number, n: bigint): this {
    const b = Buffer.alloc(8);
    b.writeBigUInt64BE(n);
    return this.raw(type, b);
  }

  nest(type: number, fill: (a: Attrs) => void): this {
    const inner = new Attrs();
    fill(inner);
    return this.raw(type | NLA_F_NESTED, inner.bytes());
  }

  /** A nested attribute whose contents are attributes already encoded (Attrs.bytes()). */
  nestBytes(type: number, inner: Buffer): this {
    return this.raw(type | NLA_F_NESTED, inner);
  }

  bytes(): Buffer {
    return Buffer.concat(this.parts);
  }
}
