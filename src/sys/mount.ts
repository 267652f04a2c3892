/** Mounts through util-linux's mount and umount: Node has no mount syscall. */
import fs from 'node:fs/promises';
import { isErrno } from '../errors.js';
import { runChecked, type Runner } from './run.js';

export async function isMountpoint(p: string): Promise<boolean> {
  const mounts = await fs.readFile('/proc/self/mountinfo', 'utf8');
  const esc = p.replace(/ /g, '\\040');
  return mounts.split('\n').some((l) => l.split(' ')[4] === esc);
}

export async function mountOverlay(runner: Runner, lowers: string[], upper: string, work: string, target: string): Promise<void> {
  await runChecked(runner, 'mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers.join(':')},upperdir=${upper},workdir=${work}`, target]);
}

export async function bindMount(runner: Runner, src: string, target: string, opts: { readonly?: boolean; private?: boolean } = {}): Promise<void> {
  await runChecked(runner, 'mount', ['--bind', src, target]);
  if (opts.readonly) await runChecked(runner, 'mount', ['-o', 'remount,bind,ro', target]);
  if (opts.private) await runChecked(runner, 'mount', ['--make-private', target]);
}

/** Unmounts if mounted; a path that is gone or not mounted is fine. */
export async function unmount(runner: Runner, target: string): Promise<void> {
  try {
    await fs.lstat(target);
  } catch (err) {
    if (isErrno(err, 'ENOENT')) return;
    throw err;
  }
  const res = await runner('umount', [target]);
  if (res.code !== 0 && !/not mounted|no mount point|not found/.test(res.stderr)) {
    // Busy: detach it so teardown can go on; the kernel frees it when the last user goes.
    await runChecked(runner, 'umount', ['-l', target]);
  }
}
