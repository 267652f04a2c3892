/**
 * Directories under the agent's root that a pod may reach (a hostPath onto
 * its own pod directory): made and opened one component at a time, each
 * through the descriptor of the one before, with no symlink followed. What
 * the agent then does to the directory (chmod, chown, mount) goes through
 * the descriptor's /proc/self/fd path, so it lands on the directory that was
 * checked, never on a symlink's target put there before or since.
 */
import fs from 'node:fs';
import path from 'node:path';
import { isErrno } from '../errors.js';
import { AT_FDCWD, O_CLOEXEC, O_PATH, openat2, RESOLVE_BENEATH, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_SYMLINKS } from '../sys/libc.js';

export const STRICT = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;

/** A directory on the way is a symlink (or not a directory): the path is not the agent's to use. */
export class NotOwnDirectoryError extends Error {
  constructor(readonly dir: string) {
    super(`${dir} is not a directory of its own (a symlink?)`);
    this.name = 'NotOwnDirectoryError';
  }
}

/**
 * An O_PATH descriptor of `<root>/<rel>`, each component of `rel` made (with
 * `mode`) when missing and entered with no symlink followed; `root` itself
 * is the agent's and is opened as it is (made 0700 when missing). The
 * caller closes it.
 */
export function openDirBeneath(root: string, rel: string, mode = 0o750): number {
  const parts = rel.split('/').filter((p) => p !== '' && p !== '.');
  if (path.isAbsolute(rel) || parts.includes('..')) throw new NotOwnDirectoryError(path.join(root, rel));
  let fd: number;
  try {
    fd = openat2(AT_FDCWD, root, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  } catch (err) {
    if (!isErrno(err, 'ENOENT')) throw err;
    // The agent's own root, not made yet: only its user may enter it.
    fs.mkdirSync(root, { recursive: true, mode: 0o700 });
    fd = openat2(AT_FDCWD, root, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
  }
  try {
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i]!;
      try {
        // mkdir(2) never follows a symlink in its last component: one there is EEXIST, and refused below.
        fs.mkdirSync(`/proc/self/fd/${fd}/${part}`, { mode });
      } catch (err) {
        if (!isErrno(err, 'EEXIST')) throw err;
      }
      let next: number;
      try {
        next = openat2(fd, part, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, STRICT);
      } catch (err) {
        if (isErrno(err, 'ELOOP') || isErrno(err, 'ENOTDIR') || isErrno(err, 'EXDEV')) throw new NotOwnDirectoryError(path.join(root, ...parts.slice(0, i + 1)));
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
