/**
 * Resolves who a container runs as, from the CRI security context or the
 * image's User, using the image's own /etc/passwd and /etc/group. Those files
 * are found as a process chrooted into the rootfs would find them: every
 * symlink on the way (`/etc -> /host/etc`, `passwd -> ../../../x`) resolves
 * inside the rootfs, so a hostile image cannot point them at the host's.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import { promisify } from 'node:util';
import { invalidArgument, isErrno, SkiffError } from '../errors.js';
import { AT_FDCWD, O_CLOEXEC, O_PATH, openat2, RESOLVE_IN_ROOT, RESOLVE_NO_MAGICLINKS, RESOLVE_NO_XDEV } from '../sys/libc.js';
import type { ResolvedUser } from './spec.js';

interface PasswdEntry {
  name: string;
  uid: number;
  gid: number;
  home: string;
}
interface GroupEntry {
  name: string;
  gid: number;
  members: string[];
}

const fstat = promisify(fs.fstat);

/**
 * The text of `rel` inside `rootfs`, or '' when it is missing, not a regular
 * file or over 4 MiB. openat2's RESOLVE_IN_ROOT treats the rootfs as `/` for
 * every component, `..` and absolute symlink targets included; the file is
 * first opened O_PATH and checked, so a fifo or device is never opened.
 */
export async function readInRoot(rootfs: string, rel: string): Promise<string> {
  let rootFd: number | undefined;
  let fd: number | undefined;
  try {
    rootFd = openat2(AT_FDCWD, rootfs, O_PATH | fs.constants.O_DIRECTORY | O_CLOEXEC, 0);
    fd = openat2(rootFd, rel, O_PATH | O_CLOEXEC, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV);
    const st = await fstat(fd);
    if (!st.isFile() || st.size > 4 << 20) return '';
    // Reopens the very inode checked above, not a path that could have changed.
    return await fsp.readFile(`/proc/self/fd/${fd}`, 'utf8');
  } catch (err) {
    if (isErrno(err, 'ENOSYS')) throw new SkiffError('FailedPrecondition', "reading the image's users safely needs openat2(2): Linux 5.6 or later");
    return '';
  } finally {
    if (fd !== undefined) fs.closeSync(fd);
    if (rootFd !== undefined) fs.closeSync(rootFd);
  }
}

/** The lines of `text`, one at a time: a 4 MiB file of short lines is never held as an array. */
function* lines(text: string): Generator<string> {
  let at = 0;
  while (at < text.length) {
    let nl = text.indexOf('\n', at);
    if (nl < 0) nl = text.length;
    yield text.slice(at, nl);
    at = nl + 1;
  }
}

/**
 * The entries of a passwd file, parsed one line at a time as they are asked
 * for: the file is the image's, and up to 4 MiB of one-line entries parsed
 * all at once took hundreds of MiB of heap.
 */
export function* parsePasswd(text: string): Generator<PasswdEntry> {
  for (const l of lines(text)) {
    const f = l.split(':', 8);
    if (f.length >= 7 && /^\d+$/.test(f[2]!) && /^\d+$/.test(f[3]!)) yield { name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5]! };
  }
}

export function* parseGroup(text: string): Generator<GroupEntry> {
  for (const l of lines(text)) {
    const f = l.split(':', 5);
    if (f.length >= 4 && /^\d+$/.test(f[2]!)) yield { name: f[0]!, gid: Number(f[2]), members: f[3]!.split(',').filter(Boolean) };
  }
}

function first<T>(it: Iterable<T>, pred: (v: T) => boolean): T | undefined {
  for (const v of it) if (pred(v)) return v;
  return undefined;
}

/** The most supplementary groups a Linux process can have (NGROUPS_MAX). */
const NGROUPS_MAX = 65536;

export interface UserRequest {
  /** From the security context. */
  runAsUser?: number;
  runAsUsername?: string;
  runAsGroup?: number;
  supplementalGroups: number[];
  /** The image config's User: `name`, `uid`, `name:group`, `uid:gid`. */
  imageUser?: string;
}

export async function resolveUser(rootfs: string, req: UserRequest): Promise<ResolvedUser> {
  const passwdText = await readInRoot(rootfs, 'etc/passwd');
  const groupText = await readInRoot(rootfs, 'etc/group');
  const passwd = (pred: (p: PasswdEntry) => boolean) => first(parsePasswd(passwdText), pred);
  let uid: number;
  let gid: number | undefined;
  let entry: PasswdEntry | undefined;
  let groupPart: string | undefined;
  const [imageUid = '', imageGroup] = (req.imageUser ?? '').split(':');
  if (req.runAsUser !== undefined || req.runAsUsername) {
    if (req.runAsUser !== undefined) {
      const asked = req.runAsUser;
      uid = asked;
      entry = passwd((p) => p.uid === asked);
    } else {
      entry = passwd((p) => p.name === req.runAsUsername);
      if (!entry) throw invalidArgument(`user "${req.runAsUsername}" is not in the image's /etc/passwd`);
      uid = entry.uid;
    }
    // A kubelet sends the image's own user as run_as_user (it reads only the uid from the image):
    // that user keeps the image's group, never root's group by default.
    const same = /^\d+$/.test(imageUid) ? Number(imageUid) === uid : imageUid !== '' && imageUid === entry?.name;
    if (same) groupPart = imageGroup;
  } else {
    groupPart = imageGroup;
    if (imageUid === '') {
      uid = 0;
      entry = passwd((p) => p.uid === 0);
    } else if (/^\d+$/.test(imageUid)) {
      const asked = Number(imageUid);
      uid = asked;
      entry = passwd((p) => p.uid === asked);
    } else {
      entry = passwd((p) => p.name === imageUid);
      if (!entry) throw invalidArgument(`image user "${imageUid}" is not in the image's /etc/passwd`);
      uid = entry.uid;
    }
  }
  if (req.runAsGroup !== undefined) gid = req.runAsGroup;
  else if (groupPart !== undefined && groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = Number(groupPart);
    else {
      const g = first(parseGroup(groupText), (x) => x.name === groupPart);
      if (!g) throw invalidArgument(`image group "${groupPart}" is not in the image's /etc/group`);
      gid = g.gid;
    }
  }
  gid ??= entry?.gid ?? 0;
  // Ids are 32 bits and (uid_t)-1 means "unchanged": a bigger number from the image is no user at all.
  for (const [what, id] of [['uid', uid], ['gid', gid]] as const) {
    if (!Number.isSafeInteger(id) || id < 0 || id > 0xfffffffe) throw invalidArgument(`${what} ${id} is not a valid Linux ${what}`);
  }
  const additional = new Set<number>();
  if (entry) for (const g of parseGroup(groupText)) if (g.members.includes(entry.name) && g.gid !== gid) additional.add(g.gid);
  for (const g of req.supplementalGroups) if (g !== gid) additional.add(g);
  if (additional.size > NGROUPS_MAX) throw invalidArgument(`the user is in ${additional.size} groups, more than Linux allows a process (${NGROUPS_MAX})`);
  return { uid, gid, additionalGids: [...additional].sort((a, b) => a - b), home: entry?.home };
}
