/**
 * Opening container log files without trusting the directories they are in.
 *
 * A pod whose hostPath reaches its own log directory can put anything at
 * `<container>/<N>.log`: a symlink to a host file, a FIFO, a device, a hard
 * link. The agent serves these files to anyone on the host, so every file is
 * opened beneath the log directory with no symlink followed in any
 * component, first as O_PATH (opening a FIFO or device has effects and may
 * block), checked to be a regular file with one link, and only then
 * reopened for reading through /proc/self/fd: the very inode checked.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { isErrno } from '../errors.js';
import { AT_FDCWD, O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS } from '../sys/libc.js';

/** A log file: `root` is opened as it is (the agent's own directory), every component of `path` beneath it strictly. */
export interface LogRef {
  root: string;
  /** Relative to root, e.g. `pods/<uid>/logs/<container>/<N>.log`. */
  path: string;
  /**
   * Whether the container that writes this log may still write to it (not
   * exited, not removed). A follow ends once it says no and the file is
   * drained, as the kubelet's does; without it, a follow ends only when the
   * file has been missing past the grace.
   */
  running?: () => Promise<boolean>;
}

const STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
const fstat = promisify(fs.fstat);

/** A log file the agent refuses to read: a symlink, not a regular file, or linked elsewhere too. */
export class UnsafeLogError extends Error {
  constructor(
    readonly file: string,
    readonly why: string,
  ) {
    super(`${file} ${why}; refusing to read it`);
  }
}

function kindOf(st: fs.Stats): string {
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  if (st.isSocket()) return 'a socket';
  if (st.isDirectory()) return 'a directory';
  if (st.isSymbolicLink()) return 'a symlink';
  return 'not a regular file';
}

function strictError(err: unknown, file: string): unknown {
  // ELOOP: a symlink on the way (RESOLVE_NO_SYMLINKS); EXDEV: a `..` or absolute link out (RESOLVE_BENEATH).
  if (isErrno(err, 'ELOOP') || isErrno(err, 'EXDEV')) return new UnsafeLogError(file, 'is or passes through a symlink');
  if (isErrno(err, 'ENOTDIR')) return new UnsafeLogError(file, 'passes through something that is not a directory');
  return err;
}

/**
 * An O_PATH descriptor of the directory holding the log (the caller closes
 * it with fs.closeSync), and the file's name in it.
 */
export function openLogDir(ref: LogRef): { dirFd: number; name: string } {
  const rel = path.posix.normalize(ref.path);
  if (rel.startsWith('/') || rel === '..' || rel.startsWith('../') || rel === '.') throw new UnsafeLogError(ref.path, 'is not a path under the log root');
  const rootFd = openat2(AT_FDCWD, ref.root, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  const dir = path.posix.dirname(rel);
  if (dir === '.') return { dirFd: rootFd, name: rel };
  try {
    return { dirFd: openat2(rootFd, dir, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT), name: path.posix.basename(rel) };
  } catch (err) {
    throw strictError(err, path.join(ref.root, dir));
  } finally {
    fs.closeSync(rootFd);
  }
}

/** The identity of what is at `name` now (without opening it for reading), or undefined when nothing is. */
export async function probeLogFile(dirFd: number, name: string): Promise<{ dev: number; ino: number } | undefined> {
  let fd: number;
  try {
    fd = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return undefined;
    throw strictError(err, name);
  }
  try {
    const st = await fstat(fd);
    return { dev: st.dev, ino: st.ino };
  } finally {
    fs.closeSync(fd);
  }
}

/** Opens `name` in the directory for reading, if it is a regular file with no other links. */
export async function openLogFile(dirFd: number, name: string): Promise<{ fh: fsp.FileHandle; st: fs.Stats }> {
  let fd: number;
  try {
    fd = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
  } catch (err) {
    throw strictError(err, name);
  }
  try {
    const st = await fstat(fd);
    if (!st.isFile()) throw new UnsafeLogError(name, `is ${kindOf(st)}`);
    // A hard link to a host file the pod could reach reads as a regular file: the runtime's logs have one link.
    if (st.nlink !== 1) throw new UnsafeLogError(name, `has ${st.nlink} hard links`);
    const fh = await fsp.open(`/proc/self/fd/${fd}`, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK | O_CLOEXEC);
    return { fh, st };
  } finally {
    fs.closeSync(fd);
  }
}

/** The suffix rotation gives a file: `<N>.log.<YYYYMMDD-HHMMSS.mmm>` (sorts by time as text). */
export function rotationSuffix(at: Date): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  return `${at.getUTCFullYear()}${p(at.getUTCMonth() + 1)}${p(at.getUTCDate())}-${p(at.getUTCHours())}${p(at.getUTCMinutes())}${p(at.getUTCSeconds())}.${p(at.getUTCMilliseconds(), 3)}`;
}

const ROTATED = /^\d{8}-\d{6}(\.\d{3})?$/;

/** The rotated files of `name` in the directory, oldest first. */
export async function rotatedLogs(dirFd: number, name: string): Promise<string[]> {
  const entries = await fsp.readdir(`/proc/self/fd/${dirFd}`);
  return entries.filter((e) => e.startsWith(`${name}.`) && ROTATED.test(e.slice(name.length + 1))).sort();
}
