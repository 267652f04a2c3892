/**
 * The local provisioner's directories: `<root>/volumes/<pv>`, made and
 * removed only through descriptors opened with openat2 beneath the root,
 * never through a symlink, never across a mount. A container had the
 * volume mounted and could leave anything in it (symlinks to /etc, a
 * directory swapped for a link mid-removal): removal opens each directory
 * it descends into with RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH |
 * RESOLVE_NO_XDEV from the one before, and unlinks entries by name in a
 * directory it holds, so what goes is always inside the volume.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { isErrno } from '../errors.js';
import { openDirBeneath } from '../kubelet-lite/beneath.js';
import { O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS, RESOLVE_NO_XDEV } from '../sys/libc.js';

export const VOLUMES_DIR = 'volumes';
const STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV;
/** How deep removal descends: deeper trees are left (and said so), not a stack a container can grow. */
const MAX_DEPTH = 256;

/** A PV name as one path component: a DNS subdomain has no '/' and is never '.' or '..', but it is checked here too. */
export function volumeDirName(pvName: string): string {
  if (!/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(pvName) || pvName.length > 253 || pvName.includes('..')) throw new Error(`${JSON.stringify(pvName)} is not a volume name`);
  return pvName;
}

/** The host path of the provisioner's directory for `pvName`. */
export function volumePath(rootDir: string, pvName: string): string {
  return path.join(path.resolve(rootDir), VOLUMES_DIR, volumeDirName(pvName));
}

/** Makes `<root>/volumes/<pv>` (0777 as local-path makes it: any user in the pod may write) and returns its path. */
export async function makeVolumeDir(rootDir: string, pvName: string): Promise<string> {
  const name = volumeDirName(pvName);
  const parent = openDirBeneath(rootDir, VOLUMES_DIR, 0o711);
  try {
    try {
      await fsp.mkdir(`/proc/self/fd/${parent}/${name}`, { mode: 0o777 });
    } catch (err) {
      if (!isErrno(err, 'EEXIST')) throw err;
    }
    const fd = openat2(parent, name, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT);
    try {
      // The mode past the umask, on the directory the descriptor holds (not what its name may point at now).
      await fsp.chmod(`/proc/self/fd/${fd}`, 0o777);
    } finally {
      fs.closeSync(fd);
    }
  } finally {
    fs.closeSync(parent);
  }
  return volumePath(rootDir, pvName);
}

/** Whether `<root>/volumes/<pv>` is there (a directory of its own, not a link). */
export function volumeDirExists(rootDir: string, pvName: string): boolean {
  let parent: number;
  try {
    parent = openat2(-100, path.join(path.resolve(rootDir), VOLUMES_DIR), O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, RESOLVE_NO_SYMLINKS);
  } catch {
    return false;
  }
  try {
    fs.closeSync(openat2(parent, volumeDirName(pvName), O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT));
    return true;
  } catch {
    return false;
  } finally {
    fs.closeSync(parent);
  }
}

/**
 * Removes `<root>/volumes/<pv>` and what it holds; gone already is done.
 * Symlinks inside are removed, never followed; a mount inside (or a tree
 * deeper than MAX_DEPTH) stops the removal with an error, leaving the rest.
 */
export async function removeVolumeDir(rootDir: string, pvName: string): Promise<void> {
  const name = volumeDirName(pvName);
  let parent: number;
  try {
    parent = openat2(-100, path.join(path.resolve(rootDir), VOLUMES_DIR), O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, RESOLVE_NO_SYMLINKS);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return;
    throw err;
  }
  try {
    await removeEntry(parent, name, 0);
  } finally {
    fs.closeSync(parent);
  }
}

/** Removes `name` in the directory `dirFd` holds: a directory's contents first, through its own descriptor. */
async function removeEntry(dirFd: number, name: string, depth: number): Promise<void> {
  const at = `/proc/self/fd/${dirFd}/${name}`;
  let fd: number;
  try {
    fd = openat2(dirFd, name, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return;
    // Not a directory, or a symlink (to anything): the name itself goes, never what it points at.
    if (isErrno(err, 'ENOTDIR') || isErrno(err, 'ELOOP')) {
      await fsp.unlink(at).catch((e: unknown) => {
        if (!isErrno(e, 'ENOENT')) throw e;
      });
      return;
    }
    if (isErrno(err, 'EXDEV')) throw new Error(`${name} is a mount point inside the volume: not removed`);
    throw err;
  }
  try {
    if (depth >= MAX_DEPTH) throw new Error(`the volume's tree is deeper than ${MAX_DEPTH} directories: not removed past that`);
    // Entries made while this runs (a pod still writing) are found by the next pass.
    for (let pass = 0; pass < 3; pass++) {
      const names = await fsp.readdir(`/proc/self/fd/${fd}`);
      if (names.length === 0) break;
      for (const n of names) await removeEntry(fd, n, depth + 1);
    }
  } finally {
    fs.closeSync(fd);
  }
  await fsp.rmdir(at).catch((e: unknown) => {
    if (!isErrno(e, 'ENOENT')) throw e;
  });
}
