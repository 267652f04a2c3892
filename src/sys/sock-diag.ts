/**
 * Who owns the other end of a TCP connection on this host: one exact
 * NETLINK_SOCK_DIAG lookup (SOCK_DIAG_BY_FAMILY, no dump) of the peer's
 * socket by its 4-tuple, whose reply carries the uid that created it. The
 * kernel answers within the send, so the lookup costs two short syscalls
 * on the calling thread whatever the number of sockets on the host (unlike
 * reading /proc/net/tcp, which grows with every TIME_WAIT entry).
 */
import koffi from 'koffi';
import net from 'node:net';

const libc = koffi.load('libc.so.6');
const socketRaw = libc.func('int socket(int domain, int type, int protocol)');
const sendRaw = libc.func('intptr_t send(int fd, const uint8_t *buf, size_t len, int flags)');
const recvRaw = libc.func('intptr_t recv(int fd, _Out_ uint8_t *buf, size_t len, int flags)');
const closeRaw = libc.func('int close(int fd)');

const AF_NETLINK = 16;
const AF_INET = 2;
const AF_INET6 = 10;
const IPPROTO_TCP = 6;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_SOCK_DIAG = 4;
const SOCK_DIAG_BY_FAMILY = 20;
const NLM_F_REQUEST = 0x1;
const NLMSG_ERROR = 2;
const MSG_DONTWAIT = 0x40;
const NLMSG_HDRLEN = 16;
/** struct inet_diag_req_v2: family, protocol, ext, pad, states, then struct inet_diag_sockid (48 bytes). */
const REQ_LEN = NLMSG_HDRLEN + 56;
/** struct inet_diag_msg: family, state, timer, retrans, sockid, expires, rqueue, wqueue, uid, inode. */
const MSG_LEN = 72;

/**
 * The states of a socket that still has its owner: the kernel reports uid 0
 * for TIME_WAIT and request sockets, and a listener found by the lookup's
 * fallback is not the peer, so none of those may name an owner.
 */
const OWNED_STATES = new Set([1 /* ESTABLISHED */, 4 /* FIN_WAIT1 */, 5 /* FIN_WAIT2 */, 8 /* CLOSE_WAIT */, 9 /* LAST_ACK */, 11 /* CLOSING */]);

export interface TcpEnds {
  /** The peer's end: the socket whose owner is wanted. */
  address: string;
  port: number;
  /** Our end of the connection. */
  localAddress: string;
  localPort: number;
}

/** An IPv4-mapped IPv6 address (as a dual-stack listener reports IPv4 peers) as plain IPv4. */
function unmap(address: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return m ? m[1]! : address;
}

function writeAddress(buf: Buffer, offset: number, address: string, family: 4 | 6): void {
  if (family === 4) {
    const parts = address.split('.').map(Number);
    for (let i = 0; i < 4; i++) buf[offset + i] = parts[i]!;
    return;
  }
  // Eight 16-bit groups, "::" standing for the zero groups it hides; a zone ("%eth0") is not part of the address.
  const [head, tail] = address.split('%')[0]!.split('::') as [string, string | undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const groups = tail === undefined ? h : [...h, ...Array<string>(8 - h.length - t.length).fill('0'), ...t];
  groups.forEach((g, i) => buf.writeUInt16BE(parseInt(g, 16), offset + 2 * i));
}

/** A netlink socket for exact sock_diag lookups; one per user, reopened after a failure. */
export class SockDiag {
  private fd = -1;
  private seq = 0;
  private readonly req = Buffer.alloc(REQ_LEN);
  private readonly reply = Buffer.alloc(1024);

  /**
   * The uid that owns the peer's socket, or undefined when the kernel does
   * not name a live owned socket for exactly these ends (a peer in another
   * network namespace or on another host, one already closed, a failure).
   */
  peerUid(ends: TcpEnds): number | undefined {
    const address = unmap(ends.address);
    const localAddress = unmap(ends.localAddress);
    const family = net.isIPv4(address) ? 4 : net.isIPv6(address) ? 6 : 0;
    if (!family || (family === 4 ? !net.isIPv4(localAddress) : !net.isIPv6(localAddress))) return undefined;
    if (this.fd < 0) {
      this.fd = socketRaw(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as number;
      if (this.fd < 0) return undefined;
    }
    const seq = (this.seq = (this.seq + 1) >>> 0);
    const r = this.req.fill(0);
    r.writeUInt32LE(REQ_LEN, 0);
    r.writeUInt16LE(SOCK_DIAG_BY_FAMILY, 4);
    r.writeUInt16LE(NLM_F_REQUEST, 6);
    r.writeUInt32LE(seq, 8);
    const q = NLMSG_HDRLEN;
    r.writeUInt8(family === 4 ? AF_INET : AF_INET6, q);
    r.writeUInt8(IPPROTO_TCP, q + 1);
    r.writeUInt32LE(0xffffffff, q + 4);
    // The peer's socket sees the connection from the other side: its source is the peer.
    r.writeUInt16BE(ends.port, q + 8);
    r.writeUInt16BE(ends.localPort, q + 10);
    writeAddress(r, q + 12, address, family);
    writeAddress(r, q + 28, localAddress, family);
    // No cookie: INET_DIAG_NOCOOKIE.
    r.writeUInt32LE(0xffffffff, q + 48);
    r.writeUInt32LE(0xffffffff, q + 52);
    if (Number(sendRaw(this.fd, r, REQ_LEN, 0)) !== REQ_LEN) return this.fail();
    // The kernel queued its answer before send returned; a stale answer (a lookup whose
    // reply was never read) is skipped by its sequence number.
    for (let tries = 0; tries < 4; tries++) {
      const n = Number(recvRaw(this.fd, this.reply, this.reply.length, MSG_DONTWAIT));
      if (n < NLMSG_HDRLEN) return this.fail();
      const b = this.reply;
      if (b.readUInt32LE(8) !== seq) continue;
      const type = b.readUInt16LE(4);
      if (type === NLMSG_ERROR || type !== SOCK_DIAG_BY_FAMILY || n < NLMSG_HDRLEN + MSG_LEN) return undefined;
      const m = NLMSG_HDRLEN;
      const state = b.readUInt8(m + 1);
      const sameEnds = b.readUInt16BE(m + 4) === ends.port && b.readUInt16BE(m + 6) === ends.localPort && b.compare(r, q + 12, q + 44, m + 8, m + 40) === 0;
      const inode = b.readUInt32LE(m + 68);
      if (!sameEnds || !OWNED_STATES.has(state) || inode === 0) return undefined;
      return b.readUInt32LE(m + 64);
    }
    return this.fail();
  }

  close(): void {
    if (this.fd >= 0) closeRaw(this.fd);
    this.fd = -1;
  }

  private fail(): undefined {
    this.close();
    return undefined;
  }
}
