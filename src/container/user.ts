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

export function parsePasswd(text: string): PasswdEntry[] {
  return text
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= 7 && /^\d+$/.test(f[2]!) && /^\d+$/.test(f[3]!))
    .map((f) => ({ name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5]! }));
}

export function parseGroup(text: string): GroupEntry[] {
  return text
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= 4 && /^\d+$/.test(f[2]!))
    .map((f) => ({ name: f[0]!, gid: Number(f[2]), members: f[3]!.split(',').filter(Boolean) }));
}

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
  const passwd = parsePasswd(await readInRoot(rootfs, 'etc/passwd'));
  const groups = parseGroup(await readInRoot(rootfs, 'etc/group'));
  let uid: number;
  let gid: number | undefined;
  let entry: PasswdEntry | undefined;
  let groupPart: string | undefined;
  if (req.runAsUser !== undefined) {
    uid = req.runAsUser;
    entry = passwd.find((p) => p.uid === uid);
  } else if (req.runAsUsername) {
    entry = passwd.find((p) => p.name === req.runAsUsername);
    if (!entry) throw invalidArgument(`user "${req.runAsUsername}" is not in the image's /etc/passwd`);
    uid = entry.uid;
  } else {
    const [u = '', g] = (req.imageUser ?? '').split(':');
    groupPart = g;
    if (u === '') {
      uid = 0;
      entry = passwd.find((p) => p.uid === 0);
    } else if (/^\d+$/.test(u)) {
      uid = Number(u);
      entry = passwd.find((p) => p.uid === uid);
    } else {
      entry = passwd.find((p) => p.name === u);
      if (!entry) throw invalidArgument(`image user "${u}" is not in the image's /etc/passwd`);
      uid = entry.uid;
    }
  }
  if (req.runAsGroup !== undefined) gid = req.runAsGroup;
  else if (groupPart !== undefined && groupPart !== '') {
    if (/^\d+$/.test(groupPart)) gid = Number(groupPart);
    else {
      const g = groups.find((x) => x.name === groupPart);
      if (!g) throw invalidArgument(`image group "${groupPart}" is not in the image's /etc/group`);
      gid = g.gid;
    }
  }
  gid ??= entry?.gid ?? 0;
  const additional = new Set<number>();
  if (entry) for (const g of groups) if (g.members.includes(entry.name) && g.gid !== gid) additional.add(g.gid);
  for (const g of req.supplementalGroups) if (g !== gid) additional.add(g);
  return { uid, gid, additionalGids: [...additional].sort((a, b) => a - b), home: entry?.home };
}
