/**
 * The node's IPv4 addresses, read with one rtnetlink dump (RTM_GETADDR) in
 * the calling thread's network namespace: what `ip -4 addr show` prints,
 * down and carrier-less interfaces included, without spawning it (a spawn
 * cost about 5 ms of each RunPodSandbox here).
 */
import koffi from 'koffi';
import { lastErrnoName } from './libc.js';

const libc = koffi.load('libc.so.6');
const socketRaw = libc.func('int socket(int domain, int type, int protocol)');
const sendRaw = libc.func('intptr_t send(int fd, const uint8_t *buf, size_t len, int flags)');
const recvRaw = libc.func('intptr_t recv(int fd, _Out_ uint8_t *buf, size_t len, int flags)');
const closeRaw = libc.func('int close(int fd)');
const indexToNameRaw = libc.func('char *if_indextoname(unsigned int index, _Out_ uint8_t *name)');

const AF_NETLINK = 16;
const AF_INET = 2;
const SOCK_RAW = 3;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_ROUTE = 0;
const RTM_NEWADDR = 20;
const RTM_GETADDR = 22;
const NLM_F_REQUEST = 0x1;
const NLM_F_DUMP = 0x300;
const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
const IFA_ADDRESS = 1;
const IFA_LOCAL = 2;

export interface Ipv4Address {
  ifname: string;
  local: string;
  prefixlen: number;
}

function fail(what: string): never {
  throw new Error(`netlink ${what}: ${lastErrnoName()}`);
}

const align4 = (n: number) => (n + 3) & ~3;

/** Every IPv4 address of the calling thread's network namespace, with its interface's name. */
export function ipv4Addresses(): Ipv4Address[] {
  const fd = socketRaw(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE) as number;
  if (fd < 0) fail('socket');
  try {
    // struct nlmsghdr (16 bytes), then struct ifaddrmsg (8 bytes) asking for AF_INET only.
    const req = Buffer.alloc(24);
    req.writeUInt32LE(24, 0);
    req.writeUInt16LE(RTM_GETADDR, 4);
    req.writeUInt16LE(NLM_F_REQUEST | NLM_F_DUMP, 6);
    req.writeUInt32LE(1, 8);
    req.writeUInt8(AF_INET, 16);
    if (Number(sendRaw(fd, req, req.length, 0)) !== req.length) fail('send');
    const names = new Map<number, string>();
    const nameOf = (index: number) => {
      let n = names.get(index);
      if (n === undefined) {
        const b = Buffer.alloc(16);
        n = indexToNameRaw(index, b) ? b.toString('latin1', 0, Math.max(0, b.indexOf(0))) : `if${index}`;
        names.set(index, n);
      }
      return n;
    };
    const out: Ipv4Address[] = [];
    const buf = Buffer.alloc(64 * 1024);
    // The kernel answers a dump in batches, each read by one recv; it ends with NLMSG_DONE.
    for (;;) {
      const n = Number(recvRaw(fd, buf, buf.length, 0));
      if (n < 0) fail('recv');
      if (n === 0) throw new Error('netlink recv: the dump ended early');
      for (let off = 0; off + 16 <= n; ) {
        const len = buf.readUInt32LE(off);
        const type = buf.readUInt16LE(off + 4);
        if (len < 16 || off + len > n) throw new Error('netlink: a message overruns its datagram');
        if (type === NLMSG_DONE) return out;
        if (type === NLMSG_ERROR) {
          const err = buf.readInt32LE(off + 16);
          throw new Error(`netlink RTM_GETADDR: error ${-err}`);
        }
        if (type === RTM_NEWADDR && len >= 24 && buf.readUInt8(off + 16) === AF_INET) {
          const prefixlen = buf.readUInt8(off + 17);
          const index = buf.readUInt32LE(off + 20);
          let local: string | undefined;
          let address: string | undefined;
          for (let a = off + 24; a + 4 <= off + len; ) {
            const alen = buf.readUInt16LE(a);
            const atype = buf.readUInt16LE(a + 2) & 0x3fff;
            if (alen < 4) break;
            if (alen === 8 && (atype === IFA_LOCAL || atype === IFA_ADDRESS)) {
              const ip = `${buf[a + 4]}.${buf[a + 5]}.${buf[a + 6]}.${buf[a + 7]}`;
              if (atype === IFA_LOCAL) local = ip;
              else address = ip;
            }
            a += align4(alen);
          }
          // As ip(8) shows it: the local address, or the only one a broadcast link has.
          const ip = local ?? address;
          if (ip) out.push({ ifname: nameOf(index), local: ip, prefixlen });
        }
        off += align4(len);
      }
    }
  } finally {
    closeRaw(fd);
  }
}
