/**
 * The container log file conmon writes, made ready before conmon opens it.
 *
 * conmon (2.1.x) opens `--log-path` with a plain open(O_CREAT|O_APPEND) and,
 * on a reopen, `<log>.tmp` with open(O_CREAT|O_TRUNC): both follow symlinks,
 * as root. A pod whose hostPath reaches its own log directory could leave a
 * symlink (or a hard link) there to a host file and have its output written
 * into it. So before conmon starts, and before each reopen, the runtime
 * walks the log directory with no symlink followed, removes whatever is at
 * the log path that is not a plain file of its own, and creates the file
 * itself. What is left is the moment between this and conmon's own open.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { failedPrecondition, isErrno } from '../errors.js';
import { AT_FDCWD, O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS } from '../sys/libc.js';

const STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
const fstat = promisify(fs.fstat);

/** An O_PATH descriptor of `<logDirectory>/<dirname(rel)>`, made as needed, with no symlink followed past logDirectory's parent. */
async function openLogSubdir(logDirectory: string, rel: string): Promise<number> {
  let fd = openat2(AT_FDCWD, path.dirname(logDirectory), O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  const parts = [path.basename(logDirectory), ...path.posix.dirname(rel).split('/').filter((p) => p && p !== '.')];
  try {
    for (const part of parts) {
      await fsp.mkdir(`/proc/self/fd/${fd}/${part}`, { mode: 0o755 }).catch((err: unknown) => (isErrno(err, 'EEXIST') ? undefined : Promise.reject(err)));
      let next: number;
      try {
        next = openat2(fd, part, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT);
      } catch (err) {
        if (isErrno(err, 'ELOOP') || isErrno(err, 'ENOTDIR') || isErrno(err, 'EXDEV')) throw failedPrecondition(`the log directory ${path.join(logDirectory, rel)}: ${part} is not a directory of its own (a symlink?)`);
        throw err;
      }
      fs.closeSync(fd);
      fd = next;
    }
    return fd;
  } catch (err) {
    fs.closeSync(fd);
    throw err;
  }
}

/** Removes `name` unless it is a regular file with one link (`keepRegular`), or whatever it is (not a directory). */
async function clearEntry(dirFd: number, name: string, keepRegular: boolean): Promise<boolean> {
  let fd: number;
  try {
    fd = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return false;
    if (!isErrno(err, 'ELOOP')) throw err;
    // A symlink: unlink(2) removes the link itself.
    await fsp.unlink(`/proc/self/fd/${dirFd}/${name}`);
    return true;
  }
  try {
    const st = await fstat(fd);
    if (keepRegular && st.isFile() && st.nlink === 1) return false;
    if (st.isDirectory()) throw failedPrecondition(`the container log ${name} is a directory`);
  } finally {
    fs.closeSync(fd);
  }
  await fsp.unlink(`/proc/self/fd/${dirFd}/${name}`);
  return true;
}

/**
 * Makes `<logDirectory>/<rel>` a regular file of the runtime's own before
 * conmon opens it (and clears `<rel>.tmp`, which conmon opens on a reopen).
 * Returns what it had to remove, for the log.
 */
export async function prepareContainerLog(logDirectory: string, rel: string): Promise<string[]> {
  const dirFd = await openLogSubdir(logDirectory, rel);
  const name = path.posix.basename(rel);
  const removed: string[] = [];
  try {
    if (await clearEntry(dirFd, name, true)) removed.push(name);
    if (await clearEntry(dirFd, `${name}.tmp`, false)) removed.push(`${name}.tmp`);
    const fd = openat2(dirFd, name, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_APPEND | fs.constants.O_NONBLOCK | O_CLOEXEC, STRICT, 0o600);
    fs.closeSync(fd);
    return removed;
  } finally {
    fs.closeSync(dirFd);
  }
}

/** Before conmon reopens the log: nothing may be at `<rel>.tmp`, which it opens with O_TRUNC following links. */
export async function clearReopenTarget(logDirectory: string, rel: string): Promise<boolean> {
  const dirFd = await openLogSubdir(logDirectory, rel);
  try {
    return await clearEntry(dirFd, `${path.posix.basename(rel)}.tmp`, false);
  } finally {
    fs.closeSync(dirFd);
  }
}
