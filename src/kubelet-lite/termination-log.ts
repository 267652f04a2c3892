/**
 * The termination-log files under a pod directory
 * (`<pod>/containers/<name>/<N>.termination-log`): made before the container
 * starts, read when it has exited, removed with it.
 *
 * A pod whose hostPath reaches its own pod directory can put anything on
 * that path: a symlink to a host file (whose first bytes would become the
 * container's termination message, shown to anyone on the host), a FIFO
 * (whose open would hold one of the agent's file-system threads), or a
 * symlinked `containers/<name>` (so the agent would make a world-writable
 * file in a host directory of the pod's choosing and mount it into the
 * container). So every step is taken beneath the pod directory with no
 * symlink followed, and the file is read only as a regular file with one
 * link, as the container logs are (log-files.ts).
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { isErrno } from '../errors.js';
import { O_CLOEXEC, O_PATH, openat2 } from '../sys/libc.js';
import { NotOwnDirectoryError, openDirBeneath, STRICT } from './beneath.js';
import { openLogDir, openLogFile, UnsafeLogError } from './log-files.js';
import { ContainerConfigError } from './model.js';

/**
 * The agent's root (`<root>/pods/<uid>` is the pod directory, which the pod
 * may itself have swapped for a link), and the file's place beneath it.
 */
function parts(podDir: string, file: string): { root: string; dirs: string[]; name: string } {
  const root = path.dirname(path.dirname(podDir));
  const rel = path.relative(root, file);
  const segs = rel.split(path.sep);
  if (rel.startsWith('..') || path.isAbsolute(rel) || segs.some((s) => s === '' || s === '.' || s === '..')) {
    throw new Error(`termination log ${file} is not beneath the pod directory ${podDir}`);
  }
  return { root, dirs: segs.slice(0, -1), name: segs[segs.length - 1]! };
}

/**
 * Makes `file` (beneath `podDir`) an empty regular file of the agent's,
 * writable by any user the container runs as, and returns its path. Whatever
 * was at the name that is not such a file (a symlink, a FIFO, a hard link
 * to elsewhere) is removed first; a directory on the way that is a symlink
 * fails the container's start.
 */
export function createTerminationLog(podDir: string, file: string): string {
  const { root, dirs, name } = parts(podDir, file);
  let dirFd: number;
  try {
    dirFd = openDirBeneath(root, dirs.join('/'));
  } catch (err) {
    if (err instanceof NotOwnDirectoryError) throw new ContainerConfigError(`the termination log directory ${err.dir} is not a directory of its own (a symlink?)`);
    throw err;
  }
  try {
    // Not a plain file of ours: removed (unlink(2) removes a symlink itself, never its target).
    let old: number | undefined;
    try {
      old = openat2(dirFd, name, O_PATH | O_CLOEXEC, STRICT);
    } catch (err) {
      if (isErrno(err, 'ELOOP')) fs.unlinkSync(`/proc/self/fd/${dirFd}/${name}`);
      else if (!isErrno(err, 'ENOENT')) throw err;
    }
    if (old !== undefined) {
      try {
        const st = fs.fstatSync(old);
        if (st.isDirectory()) throw new ContainerConfigError(`the termination log ${file} is a directory`);
        if (!st.isFile() || st.nlink !== 1) fs.unlinkSync(`/proc/self/fd/${dirFd}/${name}`);
      } finally {
        fs.closeSync(old);
      }
    }
    const fd = openat2(dirFd, name, fs.constants.O_WRONLY | fs.constants.O_CREAT | fs.constants.O_TRUNC | fs.constants.O_NONBLOCK | O_CLOEXEC, STRICT, 0o666);
    try {
      // Writable by whatever user the container runs as; umask would take that away.
      fs.fchmodSync(fd, 0o666);
    } finally {
      fs.closeSync(fd);
    }
    return file;
  } finally {
    fs.closeSync(dirFd);
  }
}

/**
 * The first `max` bytes of the termination log, or '' when there is none or
 * it is not a regular file of its own (a symlink, a FIFO, a hard link): those
 * are never opened for reading.
 */
export async function readTerminationLog(podDir: string, file: string, max: number): Promise<string> {
  const { root, dirs, name } = parts(podDir, file);
  let dirFd: number;
  try {
    ({ dirFd } = openLogDir({ root, path: path.join(...dirs, name) }));
  } catch {
    return '';
  }
  try {
    const { fh } = await openLogFile(dirFd, name);
    try {
      const buf = Buffer.alloc(max);
      const { bytesRead } = await fh.read(buf, 0, max, 0);
      return buf.subarray(0, bytesRead).toString('utf8');
    } finally {
      await fh.close();
    }
  } catch (err) {
    if (err instanceof UnsafeLogError || isErrno(err, 'ENOENT')) return '';
    throw err;
  } finally {
    fs.closeSync(dirFd);
  }
}

/** Removes the termination log (when it is there), never through a symlinked directory. */
export async function removeTerminationLog(podDir: string, file: string): Promise<void> {
  const { root, dirs, name } = parts(podDir, file);
  let dirFd: number;
  try {
    ({ dirFd } = openLogDir({ root, path: path.join(...dirs, name) }));
  } catch {
    return;
  }
  try {
    await fsp.unlink(`/proc/self/fd/${dirFd}/${name}`).catch((err: unknown) => (isErrno(err, 'ENOENT') ? undefined : Promise.reject(err)));
  } finally {
    fs.closeSync(dirFd);
  }
}
