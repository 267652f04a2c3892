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

function errnoError(syscall: string, path: string): NodeJS.ErrnoException {
  const errno = lastErrno();
  const entry = Object.entries(os.constants.errno).find(([, v]) => v === errno);
  const code = entry ? entry[0] : `ERRNO${errno}`;
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
