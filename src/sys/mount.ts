/** Mounts: overlay and unmount through the syscalls (libc via koffi); binds through util-linux's mount. */
import fs from 'node:fs/promises';
import { isErrno } from '../errors.js';
import { mount as libcMount, MNT_DETACH, umount2 } from './libc.js';
import { runChecked, type Runner } from './run.js';

export async function isMountpoint(p: string): Promise<boolean> {
  const mounts = await fs.readFile('/proc/self/mountinfo', 'utf8');
  const esc = p.replace(/ /g, '\\040');
  return mounts.split('\n').some((l) => l.split(' ')[4] === esc);
}

/** The mount points strictly below `dir`. */
export async function mountsBelow(dir: string): Promise<string[]> {
  const mounts = await fs.readFile('/proc/self/mountinfo', 'utf8');
  const prefix = `${dir.replace(/ /g, '\\040')}/`;
  return mounts.split('\n').map((l) => l.split(' ')[4] ?? '').filter((m) => m.startsWith(prefix));
}

export async function mountOverlay(_runner: Runner, lowers: string[], upper: string, work: string, target: string): Promise<void> {
  const data = `lowerdir=${lowers.join(':')},upperdir=${upper},workdir=${work}`;
  if (data.length >= 4096) throw new Error(`overlay options for ${target} are longer than a page (${lowers.length} layers)`);
  libcMount('overlay', target, 'overlay', 0, data);
}

export async function bindMount(runner: Runner, src: string, target: string, opts: { readonly?: boolean; private?: boolean } = {}): Promise<void> {
  await runChecked(runner, 'mount', ['--bind', src, target]);
  if (opts.readonly) await runChecked(runner, 'mount', ['-o', 'remount,bind,ro', target]);
  if (opts.private) await runChecked(runner, 'mount', ['--make-private', target]);
}

/** Unmounts if mounted; a path that is gone or not mounted is fine. */
export async function unmount(_runner: Runner, target: string): Promise<void> {
  try {
    await fs.lstat(target);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return;
    throw err;
  }
  try {
    umount2(target);
  } catch (err) {
    if (isErrno(err, 'EINVAL') || isErrno(err, 'ENOENT')) return; // not a mount point (any more)
    if (!isErrno(err, 'EBUSY')) throw err;
    // Busy: detach it so teardown can go on; the kernel frees it when the last user goes.
    umount2(target, MNT_DETACH);
  }
}
