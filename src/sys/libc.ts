/**
 * The few libc calls Node lacks, reached through koffi. Each wrapper turns a
 * failing call's errno into a Node-style error with a string code.
 */
import koffi from 'koffi';
import os from 'node:os';

const libc = koffi.load('libc.so.6');
const mknodRaw = libc.func('int mknod(const char *path, uint32_t mode, uint64_t dev)');
const lsetxattrRaw = libc.func('int lsetxattr(const char *path, const char *name, const void *value, size_t size, int flags)');
const lgetxattrRaw = libc.func('intptr_t lgetxattr(const char *path, const char *name, _Out_ uint8_t *value, size_t size)');
const errnoLoc = libc.func('int *__errno_location()');

function lastErrno(): number {
  return koffi.decode(errnoLoc(), 'int') as number;
}

/** The name of an errno value (ENOENT), as Node's errors carry it. */
function errnoName(errno: number): string {
  const entry = Object.entries(os.constants.errno).find(([, v]) => v === errno);
  return entry ? entry[0] : `ERRNO${errno}`;
}

/** The name of the calling thread's last errno (ENOENT), for errors built outside this file. */
export function lastErrnoName(): string {
  return errnoName(lastErrno());
}

function errnoError(syscall: string, path: string): NodeJS.ErrnoException {
  const errno = lastErrno();
  const code = errnoName(errno);
  const err = new Error(`${code}: ${syscall} ${path}`) as NodeJS.ErrnoException;
  err.code = code;
  err.errno = errno;
  err.syscall = syscall;
  err.path = path;
  return err;
}

/** Linux's makedev: the glibc encoding of a major/minor pair. */
export function makedev(major: number, minor: number): bigint {
  const ma = BigInt(major);
  const mi = BigInt(minor);
  return ((ma & 0xfffn) << 8n) | ((ma & ~0xfffn) << 32n) | (mi & 0xffn) | ((mi & ~0xffn) << 12n);
}

export const S_IFCHR = 0o020000;
export const S_IFBLK = 0o060000;
export const S_IFIFO = 0o010000;

export function mknod(path: string, mode: number, major = 0, minor = 0): void {
  if (mknodRaw(path, mode, makedev(major, minor)) !== 0) throw errnoError('mknod', path);
}

export function lsetxattr(path: string, name: string, value: Buffer): void {
  if (lsetxattrRaw(path, name, value, value.length, 0) !== 0) throw errnoError('lsetxattr', path);
}

export function lgetxattr(path: string, name: string): Buffer | undefined {
  const buf = Buffer.alloc(65536);
  const n = Number(lgetxattrRaw(path, name, buf, buf.length));
  if (n < 0) {
    const err = errnoError('lgetxattr', path);
    if (err.code === 'ENODATA') return undefined;
    throw err;
  }
  return buf.subarray(0, n);
}

// --- Receiving a file descriptor (a terminal's master side) over a Unix socket. ---

const socketRaw = libc.func('int socket(int domain, int type, int protocol)');
const bindRaw = libc.func('int bind(int fd, void *addr, uint32_t len)');
const listenRaw = libc.func('int listen(int fd, int backlog)');
const acceptRaw = libc.func('int accept(int fd, void *addr, void *len)');
const recvmsgRaw = libc.func('intptr_t recvmsg(int fd, void *msg, int flags)');
const shutdownRaw = libc.func('int shutdown(int fd, int how)');
const closeRaw = libc.func('int close(int fd)');
const ioctlRaw = libc.func('int ioctl(int fd, unsigned long request, void *arg)');

const AF_UNIX = 1;
const SOCK_STREAM = 1;
const SOL_SOCKET = 1;
const SCM_RIGHTS = 1;
const TIOCSWINSZ = 0x5414;

type AsyncCall = { async: (...args: unknown[]) => void };

/**
 * Listens on `path` for one connection and returns the file descriptor the
 * peer sends with SCM_RIGHTS (how runc hands over a terminal's master side
 * on its --console-socket). The blocking calls run on koffi's worker threads.
 */
export function receiveFd(path: string, timeoutMs: number): { fd: Promise<number>; cancel(): void } {
  const sock = socketRaw(AF_UNIX, SOCK_STREAM | 0o2000000, 0) as number;
  if (sock < 0) throw errnoError('socket', path);
  const addr = Buffer.alloc(110);
  addr.writeUInt16LE(AF_UNIX, 0);
  addr.write(path, 2);
  if (bindRaw(sock, addr, addr.length) !== 0 || listenRaw(sock, 1) !== 0) {
    const err = errnoError('bind', path);
    closeRaw(sock);
    throw err;
  }
  let done = false;
  const cancel = () => {
    if (done) return;
    done = true;
    // Wakes a thread blocked in accept.
    shutdownRaw(sock, 2);
  };
  const fd = new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => {
      cancel();
    }, timeoutMs);
    (acceptRaw as unknown as AsyncCall).async(sock, null, null, (err: unknown, conn: number) => {
      if (err || conn < 0) {
        clearTimeout(timer);
        closeRaw(sock);
        reject(new Error(`no terminal arrived on ${path}`));
        return;
      }
      const data = Buffer.alloc(256);
      const control = Buffer.alloc(64);
      const iov = Buffer.alloc(16);
      iov.writeBigUInt64LE(BigInt(koffi.address(data) as unknown as bigint), 0);
      iov.writeBigUInt64LE(BigInt(data.length), 8);
      const msg = Buffer.alloc(56);
      msg.writeBigUInt64LE(BigInt(koffi.address(iov) as unknown as bigint), 16);
      msg.writeBigUInt64LE(1n, 24);
      msg.writeBigUInt64LE(BigInt(koffi.address(control) as unknown as bigint), 32);
      msg.writeBigUInt64LE(BigInt(control.length), 40);
      // The received descriptor is close-on-exec from its first moment (MSG_CMSG_CLOEXEC).
      (recvmsgRaw as unknown as AsyncCall).async(conn, msg, 0x40000000, (err2: unknown, n: number) => {
        clearTimeout(timer);
        done = true;
        closeRaw(conn);
        closeRaw(sock);
        const level = control.readInt32LE(8);
        const type = control.readInt32LE(12);
        if (err2 || Number(n) < 0 || level !== SOL_SOCKET || type !== SCM_RIGHTS) {
          reject(new Error(`no file descriptor in the message on ${path}`));
          return;
        }
        resolve(control.readInt32LE(16));
      });
    });
  });
  return { fd, cancel };
}

/** Sets a terminal's size. */
export function setWindowSize(fd: number, cols: number, rows: number): void {
  const ws = Buffer.alloc(8);
  ws.writeUInt16LE(rows & 0xffff, 0);
  ws.writeUInt16LE(cols & 0xffff, 2);
  ioctlRaw(fd, TIOCSWINSZ, ws);
}

export function closeFd(fd: number): void {
  closeRaw(fd);
}

const pthreadSelf = libc.func('uint64_t pthread_self()');
const pthreadSetnameRaw = libc.func('int pthread_setname_np(uint64_t thread, const char *name)');

/** Names the calling thread (at most 15 bytes), as ps -L and /proc/<pid>/task/<tid>/comm show it. */
export function setThreadName(name: string): void {
  pthreadSetnameRaw(pthreadSelf(), name.slice(0, 15));
}

const openptyRaw = libc.func('int openpty(_Out_ int *master, _Out_ int *slave, void *name, void *termios, void *winsize)');

/** A new pseudo-terminal pair. */
export function openpty(): { master: number; slave: number } {
  const m = [0];
  const s = [0];
  if (openptyRaw(m, s, null, null, null) !== 0) throw errnoError('openpty', '/dev/ptmx');
  return { master: m[0]!, slave: s[0]! };
}

// --- conmon's attach socket: a SOCK_SEQPACKET Unix socket Node cannot open. ---

const connectRaw = libc.func('int connect(int fd, void *addr, uint32_t len)');
const recvRaw = libc.func('intptr_t recv(int fd, _Out_ uint8_t *buf, size_t len, int flags)');
const sendRaw = libc.func('intptr_t send(int fd, const uint8_t *buf, size_t len, int flags)');

const SOCK_SEQPACKET = 5;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const MSG_DONTWAIT = 0x40;
const MSG_NOSIGNAL = 0x4000;

const socketpairRaw = libc.func('int socketpair(int domain, int type, int protocol, void *fds)');

/** A connected pair of close-on-exec Unix stream sockets. */
export function socketPair(): [number, number] {
  const fds = Buffer.alloc(8);
  if (socketpairRaw(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) !== 0) throw errnoError('socketpair', '');
  return [fds.readInt32LE(0), fds.readInt32LE(4)];
}

/** A connected, non-blocking SOCK_SEQPACKET socket to `path` (at most 107 bytes). */
export function connectSeqpacket(path: string): number {
  const fd = socketRaw(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) as number;
  if (fd < 0) throw errnoError('socket', path);
  const addr = Buffer.alloc(110);
  addr.writeUInt16LE(AF_UNIX, 0);
  if (Buffer.byteLength(path) > 107) throw new Error(`socket path too long: ${path}`);
  addr.write(path, 2);
  if (connectRaw(fd, addr, addr.length) !== 0) {
    const err = errnoError('connect', path);
    closeRaw(fd);
    throw err;
  }
  return fd;
}

/** One packet, or 'again' when none is waiting, or 'eof' when the peer has gone. */
export function recvPacket(fd: number, buf: Buffer): number | 'again' | 'eof' {
  const n = Number(recvRaw(fd, buf, buf.length, MSG_DONTWAIT));
  if (n > 0) return n;
  if (n === 0) return 'eof';
  const code = lastErrno();
  if (code === os.constants.errno.EAGAIN || code === os.constants.errno.EINTR) return 'again';
  return 'eof';
}

/** Sends `data` as one packet; false when the socket is full for now. */
export function sendPacket(fd: number, data: Buffer): boolean | 'eof' {
  const n = Number(sendRaw(fd, data, data.length, MSG_DONTWAIT | MSG_NOSIGNAL));
  if (n >= 0) return true;
  return lastErrno() === os.constants.errno.EAGAIN ? false : 'eof';
}

export function shutdownWrite(fd: number): void {
  shutdownRaw(fd, 1);
}

// --- mount(2) and umount2(2): no helper process on the container create/remove path. ---

const mountRaw = libc.func('int mount(const char *source, const char *target, const char *fstype, unsigned long flags, const char *data)');
const umount2Raw = libc.func('int umount2(const char *target, int flags)');

export const MNT_DETACH = 2;
/** umount2: do not follow a symlink in the last component of the target. */
export const UMOUNT_NOFOLLOW = 8;

export function mount(source: string, target: string, fstype: string, flags: number, data: string): void {
  if (mountRaw(source, target, fstype, flags, data) !== 0) throw errnoError('mount', target);
}

export function umount2(target: string, flags = 0): void {
  if (umount2Raw(target, flags) !== 0) throw errnoError('umount2', target);
}

// --- Advisory locks: one daemon per state directory. ---

const flockRaw = libc.func('int flock(int fd, int operation)');
const LOCK_EX = 2;
const LOCK_NB = 4;

/** Takes an exclusive lock on `fd` without waiting; false when another open file holds it. */
export function tryLockExclusive(fd: number): boolean {
  if ((flockRaw(fd, LOCK_EX | LOCK_NB) as number) === 0) return true;
  const err = errnoError('flock', `fd ${fd}`);
  if (err.code === 'EWOULDBLOCK' || err.code === 'EAGAIN') return false;
  throw err;
}

// --- Process file descriptors: signal a process, not whatever now holds its pid. ---

const pidfdOpenRaw = libc.func('int pidfd_open(int pid, unsigned int flags)');
const pidfdSendSignalRaw = libc.func('int pidfd_send_signal(int pidfd, int sig, void *info, unsigned int flags)');

/** A pidfd for `pid`; it keeps naming that process even after the pid is reused. */
export function pidfdOpen(pid: number): number {
  const fd = pidfdOpenRaw(pid, 0) as number;
  if (fd < 0) throw errnoError('pidfd_open', String(pid));
  return fd;
}

/** Signals the process behind `pidfd`; false when it has already exited (ESRCH). */
export function pidfdSendSignal(pidfd: number, signal: NodeJS.Signals | number): boolean {
  const sig = typeof signal === 'number' ? signal : os.constants.signals[signal];
  if (pidfdSendSignalRaw(pidfd, sig, null, 0) === 0) return true;
  const err = errnoError('pidfd_send_signal', String(pidfd));
  if (err.code === 'ESRCH') return false;
  throw err;
}

// --- Resolving paths that must stay inside a directory (layer unpack, image user lookup). ---
// openat2(2) (Linux 5.6+) has no glibc wrapper, so it goes through syscall(2).

const syscallRaw = libc.func('long syscall(long number, ...)');
const fsetxattrRaw = libc.func('int fsetxattr(int fd, const char *name, const void *value, size_t size, int flags)');

/** openat2's number is the same on every architecture (the unified table since 5.6). */
const SYS_openat2 = 437;

export const AT_FDCWD = -100;
export const O_PATH = 0o10000000;
export const O_CLOEXEC = 0o2000000;
export const RESOLVE_NO_XDEV = 0x01;
export const RESOLVE_NO_MAGICLINKS = 0x02;
export const RESOLVE_NO_SYMLINKS = 0x04;
export const RESOLVE_BENEATH = 0x08;
export const RESOLVE_IN_ROOT = 0x10;

/**
 * openat2(2): opens `path` relative to `dirfd` under the `resolve` rules
 * (RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS, RESOLVE_IN_ROOT, ...). Returns the
 * new file descriptor; the caller closes it.
 */
export function openat2(dirfd: number, path: string, flags: number, resolve: number, mode = 0): number {
  const how = Buffer.alloc(24);
  how.writeBigUInt64LE(BigInt(flags), 0);
  how.writeBigUInt64LE(BigInt(mode), 8);
  how.writeBigUInt64LE(BigInt(resolve), 16);
  const fd = Number(syscallRaw(SYS_openat2, 'int', dirfd, 'const char *', path, 'void *', how, 'size_t', how.length));
  if (fd < 0) throw errnoError('openat2', path);
  return fd;
}

/** fsetxattr(2): sets an xattr on the file an open descriptor refers to. */
export function fsetxattr(fd: number, name: string, value: Buffer): void {
  if (fsetxattrRaw(fd, name, value, value.length, 0) !== 0) throw errnoError('fsetxattr', `fd ${fd}`);
}

// --- Streaming: terminal descriptors on the event loop, never on the thread pool. ---

const fcntlRaw = libc.func('int fcntl(int fd, int cmd, int arg)');
const writeRaw = libc.func('intptr_t write(int fd, const uint8_t *buf, size_t len)');

const F_GETFD = 1;
const F_SETFD = 2;
const F_GETFL = 3;
const F_SETFL = 4;
const FD_CLOEXEC = 1;
const O_NONBLOCK = 0o4000;

/** Marks `fd` close-on-exec, so no child process inherits it by accident. */
export function setCloexec(fd: number): void {
  const flags = fcntlRaw(fd, F_GETFD, 0) as number;
  if (flags < 0 || (fcntlRaw(fd, F_SETFD, flags | FD_CLOEXEC) as number) < 0) throw errnoError('fcntl(F_SETFD)', `fd ${fd}`);
}

/** Puts `fd` in non-blocking mode: reads and writes return EAGAIN instead of waiting. */
export function setNonBlocking(fd: number): void {
  const flags = fcntlRaw(fd, F_GETFL, 0) as number;
  if (flags < 0 || (fcntlRaw(fd, F_SETFL, flags | O_NONBLOCK) as number) < 0) throw errnoError('fcntl(F_SETFL)', `fd ${fd}`);
}

/** True when `fd` is close-on-exec (for tests and checks). */
export function isCloexec(fd: number): boolean {
  const flags = fcntlRaw(fd, F_GETFD, 0) as number;
  return flags >= 0 && (flags & FD_CLOEXEC) !== 0;
}

/** One write(2) on a non-blocking descriptor: bytes written, 'again' when full for now, 'eof' when the other side is gone. */
export function writeNonBlocking(fd: number, data: Buffer): number | 'again' | 'eof' {
  const n = Number(writeRaw(fd, data, data.length));
  if (n >= 0) return n;
  const code = lastErrno();
  if (code === os.constants.errno.EAGAIN || code === os.constants.errno.EINTR) return 'again';
  return 'eof';
}

// --- Idmapped mounts (user namespaces): the new mount API has no glibc wrappers, so syscall(2). ---
// The numbers are those of the unified table, the same on every architecture.

const SYS_open_tree = 428;
const SYS_move_mount = 429;
const SYS_mount_setattr = 442;
const OPEN_TREE_CLONE = 1;
const AT_RECURSIVE = 0x8000;
const AT_EMPTY_PATH = 0x1000;
const MOVE_MOUNT_F_EMPTY_PATH = 0x4;
const MOUNT_ATTR_IDMAP = 0x100000;

/**
 * open_tree(2) with OPEN_TREE_CLONE: a detached copy of the mount tree at
 * `path` (with its submounts when `recursive`), as a close-on-exec descriptor.
 */
export function openTreeClone(path: string, recursive: boolean): number {
  const flags = OPEN_TREE_CLONE | O_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
  const fd = Number(syscallRaw(SYS_open_tree, 'int', AT_FDCWD, 'const char *', path, 'unsigned int', flags));
  if (fd < 0) throw errnoError('open_tree', path);
  return fd;
}

/**
 * mount_setattr(2) with MOUNT_ATTR_IDMAP: the detached mount behind `fd`
 * (and its submounts when `recursive`) shows owners through the mapping of
 * the user namespace `usernsFd`. The kernel refuses a mount already attached.
 */
export function mountSetIdmap(fd: number, usernsFd: number, recursive: boolean): void {
  // struct mount_attr { u64 attr_set, attr_clr, propagation, userns_fd; }
  const attr = Buffer.alloc(32);
  attr.writeBigUInt64LE(BigInt(MOUNT_ATTR_IDMAP), 0);
  attr.writeBigUInt64LE(BigInt(usernsFd), 24);
  const flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
  const r = Number(syscallRaw(SYS_mount_setattr, 'int', fd, 'const char *', '', 'unsigned int', flags, 'void *', attr, 'size_t', attr.length));
  if (r < 0) throw errnoError('mount_setattr', `fd ${fd}`);
}

const MOUNT_ATTR_RDONLY = 0x1;

/**
 * mount_setattr(2) with MOUNT_ATTR_RDONLY: the mount behind `fd` (and its
 * submounts when `recursive`) is read-only.
 */
export function mountSetReadonly(fd: number, recursive: boolean): void {
  const attr = Buffer.alloc(32);
  attr.writeBigUInt64LE(BigInt(MOUNT_ATTR_RDONLY), 0);
  const flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
  const r = Number(syscallRaw(SYS_mount_setattr, 'int', fd, 'const char *', '', 'unsigned int', flags, 'void *', attr, 'size_t', attr.length));
  if (r < 0) throw errnoError('mount_setattr', `fd ${fd}`);
}

/** move_mount(2): attaches the detached mount behind `fd` at `target`. */
export function moveMount(fd: number, target: string): void {
  const r = Number(syscallRaw(SYS_move_mount, 'int', fd, 'const char *', '', 'int', AT_FDCWD, 'const char *', target, 'unsigned int', MOVE_MOUNT_F_EMPTY_PATH));
  if (r < 0) throw errnoError('move_mount', target);
}

// --- The calling thread's net, IPC and UTS namespaces: per thread, so a multi-threaded process may change them. ---

const unshareRaw = libc.func('int unshare(int flags)');
const setnsRaw = libc.func('int setns(int fd, int nstype)');
const sethostnameRaw = libc.func('int sethostname(const char *name, size_t len)');

export const CLONE_NEWUTS = 0x04000000;
export const CLONE_NEWIPC = 0x08000000;
export const CLONE_NEWNET = 0x40000000;

export function unshare(flags: number): void {
  if (unshareRaw(flags) !== 0) throw errnoError('unshare', `flags 0x${flags.toString(16)}`);
}

export function setns(fd: number, nstype: number): void {
  if (setnsRaw(fd, nstype) !== 0) throw errnoError('setns', `fd ${fd}`);
}

export function sethostname(name: string | Buffer): void {
  const b = Buffer.from(name);
  if (sethostnameRaw(b, b.length) !== 0) throw errnoError('sethostname', b.toString());
}

const AF_INET = 2;
const SOCK_DGRAM = 2;
const SIOCGIFFLAGS = 0x8913;
const SIOCSIFFLAGS = 0x8914;
const IFF_UP = 0x1;

/** Sets the loopback interface of the calling thread's network namespace up (what `ip link set lo up` does). */
export function loopbackUp(): void {
  const fd = socketRaw(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0) as number;
  if (fd < 0) throw errnoError('socket', 'lo');
  try {
    // struct ifreq: the name (16 bytes), then the flags (a short) in the union.
    const ifr = Buffer.alloc(40);
    ifr.write('lo', 0);
    if (ioctlRaw(fd, SIOCGIFFLAGS, ifr) !== 0) throw errnoError('ioctl SIOCGIFFLAGS', 'lo');
    ifr.writeUInt16LE(ifr.readUInt16LE(16) | IFF_UP, 16);
    if (ioctlRaw(fd, SIOCSIFFLAGS, ifr) !== 0) throw errnoError('ioctl SIOCSIFFLAGS', 'lo');
  } finally {
    closeRaw(fd);
  }
}

// --- Starting programs with posix_spawn: the daemon's pages are shared, not copied (see spawn.ts). ---

const posixSpawnRaw = libc.func('int posix_spawn(_Out_ int *pid, const char *path, void *actions, void *attr, const char **argv, const char **envp)');
const actionsInitRaw = libc.func('int posix_spawn_file_actions_init(void *actions)');
const actionsDestroyRaw = libc.func('int posix_spawn_file_actions_destroy(void *actions)');
const actionsDup2Raw = libc.func('int posix_spawn_file_actions_adddup2(void *actions, int fd, int newfd)');
const actionsOpenRaw = libc.func('int posix_spawn_file_actions_addopen(void *actions, int fd, const char *path, int oflag, uint32_t mode)');
const actionsChdirRaw = libc.func('int posix_spawn_file_actions_addchdir_np(void *actions, const char *path)');
const actionsCloseFromRaw = libc.func('int posix_spawn_file_actions_addclosefrom_np(void *actions, int from)');
const attrInitRaw = libc.func('int posix_spawnattr_init(void *attr)');
const attrDestroyRaw = libc.func('int posix_spawnattr_destroy(void *attr)');
const attrSetFlagsRaw = libc.func('int posix_spawnattr_setflags(void *attr, short flags)');
const attrSetSigDefaultRaw = libc.func('int posix_spawnattr_setsigdefault(void *attr, const void *sigset)');
const attrSetSigMaskRaw = libc.func('int posix_spawnattr_setsigmask(void *attr, const void *sigset)');
const sigemptysetRaw = libc.func('int sigemptyset(void *sigset)');
const pipe2Raw = libc.func('int pipe2(void *fds, int flags)');
const waitpidRaw = libc.func('int waitpid(int pid, void *status, int options)');

const POSIX_SPAWN_SETSIGDEF = 0x04;
const POSIX_SPAWN_SETSIGMASK = 0x08;
const POSIX_SPAWN_SETSID = 0x80;
const F_DUPFD_CLOEXEC = 1030;
const WNOHANG = 1;


/** A close-on-exec pipe: [read end, write end]. */
export function pipe(): [number, number] {
  const fds = Buffer.alloc(8);
  if (pipe2Raw(fds, O_CLOEXEC) !== 0) throw errnoError('pipe2', '');
  return [fds.readInt32LE(0), fds.readInt32LE(4)];
}

/** A close-on-exec copy of `fd` numbered `min` or above. */
export function dupAbove(fd: number, min: number): number {
  const copy = fcntlRaw(fd, F_DUPFD_CLOEXEC, min) as number;
  if (copy < 0) throw errnoError('fcntl(F_DUPFD_CLOEXEC)', `fd ${fd}`);
  return copy;
}

/** What the child's descriptor `fd` is: a descriptor of ours to copy there, or /dev/null. */
export type SpawnFd = { fd: number; from: number } | { fd: number; devNull: true };

export interface SpawnPlan {
  /** An absolute path: posix_spawn does not search PATH. */
  file: string;
  argv: string[];
  /** `NAME=value` strings. */
  env: string[];
  cwd?: string;
  /** The child's descriptors below `closeFrom` that are not listed stay as inherited. */
  fds: SpawnFd[];
  /**
   * Every descriptor from this number up is closed in the child. Everything
   * skiff opens is close-on-exec, but not what the daemon inherited from
   * whoever started it (a shell's, a supervisor's or a test runner's pipe):
   * conmon would hold that open for as long as its container lives.
   */
  closeFrom?: number;
  /** Make the child a session (and process group) leader. */
  setsid?: boolean;
}

/**
 * posix_spawn(3): glibc starts the child with clone(CLONE_VM | CLONE_VFORK),
 * so no page tables are copied and the calling thread waits only until the
 * exec. Every signal is back at its default disposition and unblocked in the
 * child. Returns the pid, or throws with the errno (ENOENT for a missing
 * program or working directory) as the code.
 */
export function posixSpawn(plan: SpawnPlan): number {
  const actions = Buffer.alloc(256);
  const attr = Buffer.alloc(512);
  const sigs = Buffer.alloc(128); // a sigset_t
  actionsInitRaw(actions);
  attrInitRaw(attr);
  try {
    // The copies come first, and every source is numbered above the child's fds (the
    // caller sees to that), so no copy can overwrite the source of a later one.
    let r = 0;
    for (const f of plan.fds) {
      r ||= 'from' in f ? (actionsDup2Raw(actions, f.from, f.fd) as number) : (actionsOpenRaw(actions, f.fd, '/dev/null', 2 /* O_RDWR */, 0) as number);
    }
    if (plan.closeFrom !== undefined) r ||= actionsCloseFromRaw(actions, plan.closeFrom) as number;
    if (plan.cwd !== undefined) r ||= actionsChdirRaw(actions, plan.cwd) as number;
    // Every signal back to its default, glibc's own two (32, 33) too: sigfillset leaves
    // them out, and glibc then ignores them in the child, which an exec keeps.
    sigs.fill(0xff, 0, 8);
    r ||= attrSetSigDefaultRaw(attr, sigs) as number;
    sigemptysetRaw(sigs);
    r ||= attrSetSigMaskRaw(attr, sigs) as number;
    r ||= attrSetFlagsRaw(attr, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK | (plan.setsid ? POSIX_SPAWN_SETSID : 0)) as number;
    const pid = [0];
    r ||= posixSpawnRaw(pid, plan.file, actions, attr, [...plan.argv, null], [...plan.env, null]) as number;
    if (r !== 0) {
      const code = errnoName(r);
      const err = new Error(`spawn ${plan.file} ${code}`) as NodeJS.ErrnoException;
      err.code = code;
      err.errno = -r;
      err.syscall = `spawn ${plan.file}`;
      err.path = plan.file;
      throw err;
    }
    return pid[0]!;
  } finally {
    actionsDestroyRaw(actions);
    attrDestroyRaw(attr);
  }
}

/**
 * waitpid(pid, WNOHANG): undefined while the child runs; its exit code or
 * signal number once it has ended (and is reaped); 'gone' when it is not a
 * child of ours (ECHILD).
 */
export function reapChild(pid: number): { code: number | null; signal: number | null } | 'gone' | undefined {
  const status = Buffer.alloc(4);
  const r = waitpidRaw(pid, status, WNOHANG) as number;
  if (r === 0) return undefined;
  if (r < 0) return lastErrno() === os.constants.errno.EINTR ? undefined : 'gone';
  const st = status.readInt32LE(0);
  const sig = st & 0x7f;
  if (sig === 0) return { code: (st >> 8) & 0xff, signal: null };
  if (sig !== 0x7f) return { code: null, signal: sig };
  return undefined; // stopped, not ended
}

// --- Giving glibc's free pages back when the daemon is idle (src/sys/idle-memory.ts). ---

const mallocTrimRaw = libc.func('int malloc_trim(size_t pad)');

/** glibc's malloc_trim: free pages inside every arena go back to the kernel. True if any did. */
export function mallocTrim(pad = 0): boolean {
  return mallocTrimRaw(pad) === 1;
}

