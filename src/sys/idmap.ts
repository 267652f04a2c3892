/**
 * User namespaces and idmapped mounts for pods whose root is not the host's.
 *
 * A user namespace with arbitrary ranges needs a process to live in while its
 * maps are written (util-linux's unshare would need newuidmap for ranges, and
 * a multi-threaded Node process cannot unshare itself): a short `unshare`
 * child creates it, skiff writes its maps from outside and pins it (and any
 * namespaces made with it, which it then owns) to files by bind mounts.
 *
 * Idmapped mounts make files owned by host uid N appear owned by N + hostId
 * to the mount's readers, so the pod's root (host uid hostId) owns what the
 * host's root owns, without a single chown.
 */
import { spawn } from 'node:child_process';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { errorMessage } from '../errors.js';
import { closeFd, mount, moveMount, mountSetIdmap, mountSetReadonly, openTreeClone } from './libc.js';
import { isMountpoint, unmount } from './mount.js';
import type { Runner } from './run.js';

export interface IdMap {
  containerId: number;
  hostId: number;
  length: number;
}

/** /proc/<pid>/uid_map text: one "inside outside length" line per range. */
export function mapText(maps: IdMap[]): string {
  return maps.map((m) => `${m.containerId} ${m.hostId} ${m.length}\n`).join('');
}

const MS_BIND = 4096;

export type NsKind = 'user' | 'net' | 'ipc' | 'uts';

/**
 * Makes a user namespace with `uids`/`gids`, together with the other kinds in
 * `pins` (owned by it), and bind-mounts each onto its pin file (which must
 * exist). Nothing keeps running afterwards.
 */
export async function createPinnedUserns(pins: Partial<Record<NsKind, string>> & { user: string }, uids: IdMap[], gids: IdMap[], timeoutMs = 10_000): Promise<void> {
  const flags = (['net', 'ipc', 'uts'] as const).filter((k) => pins[k]).map((k) => `--${k}`);
  // `echo` runs once the namespaces exist; `read` holds the process until they are pinned.
  const child = spawn('unshare', ['--user', ...flags, '--', 'sh', '-c', 'echo ready; read _'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
  const exited = new Promise<number | null>((resolve) => {
    child.once('error', () => resolve(-1));
    child.once('close', (code) => resolve(code));
  });
  try {
    const ready = await Promise.race([
      new Promise<boolean>((resolve) => child.stdout.once('data', () => resolve(true))),
      exited.then(() => false),
      new Promise<boolean>((resolve) => setTimeout(() => resolve(false), timeoutMs).unref()),
    ]);
    if (!ready) throw new Error(`unshare did not make a user namespace: ${stderr.trim() || 'no answer'}`);
    const pid = child.pid!;
    await fsp.writeFile(`/proc/${pid}/uid_map`, mapText(uids));
    await fsp.writeFile(`/proc/${pid}/gid_map`, mapText(gids));
    for (const [kind, pin] of Object.entries(pins) as Array<[NsKind, string]>) mount(`/proc/${pid}/ns/${kind}`, pin, '', MS_BIND, '');
  } finally {
    child.stdin.end();
    const code = await Promise.race([exited, new Promise<'late'>((resolve) => setTimeout(() => resolve('late'), 2_000).unref())]);
    if (code === 'late') child.kill('SIGKILL');
    await exited;
  }
}

/** Runs `fn` with a descriptor of the user namespace pinned at `pin`. */
export async function withUsernsFd<T>(pin: string, fn: (fd: number) => T | Promise<T>): Promise<T> {
  const fh = await fsp.open(pin, 'r');
  try {
    return await fn(fh.fd);
  } finally {
    await fh.close();
  }
}

/** A detached, idmapped copy of the tree at `src` (recursive): a descriptor the caller closes. */
export function idmappedTree(src: string, usernsFd: number): number {
  const fd = openTreeClone(src, true);
  try {
    mountSetIdmap(fd, usernsFd, true);
    return fd;
  } catch (err) {
    closeFd(fd);
    throw err;
  }
}

/**
 * Mounts an idmapped copy of `src` at `target` (a file or directory that exists).
 * `readonly` makes the copy itself read-only (its submounts too when
 * `recursive`), as the host's root: a mount namespace the pod's user namespace
 * owns then inherits it locked, and not even the pod's root with CAP_SYS_ADMIN
 * can remount its bind of it read-write (it could, were only that bind made
 * read-only, by runc inside the pod's user namespace).
 */
export function idmappedBind(src: string, target: string, usernsFd: number, readonly?: { recursive: boolean }): void {
  const fd = idmappedTree(src, usernsFd);
  try {
    if (readonly) mountSetReadonly(fd, readonly.recursive);
    moveMount(fd, target);
  } finally {
    closeFd(fd);
  }
}

/**
 * Whether this kernel gives an overlay idmapped lower layers (what a pod in a
 * user namespace stands on): tried once on a temporary directory. Returns the
 * reason when it does not.
 */
export async function probeIdmappedOverlay(tmpDir: string, runner: Runner): Promise<{ ok: true } | { ok: false; reason: string }> {
  // What a probe cut short (a crash) left behind goes first.
  for (const old of await fsp.readdir(tmpDir).catch(() => [] as string[])) {
    if (!old.startsWith('idmap-probe-')) continue;
    for (const m of ['merged', 'userns']) await unmount(runner, path.join(tmpDir, old, m)).catch(() => undefined);
    if (!(await isMountpoint(path.join(tmpDir, old, 'merged'))) && !(await isMountpoint(path.join(tmpDir, old, 'userns')))) {
      await fsp.rm(path.join(tmpDir, old), { recursive: true, force: true });
    }
  }
  const dir = await fsp.mkdtemp(path.join(tmpDir, 'idmap-probe-'));
  const pin = path.join(dir, 'userns');
  const merged = path.join(dir, 'merged');
  try {
    for (const d of ['lower', 'upper', 'work', 'merged']) await fsp.mkdir(path.join(dir, d));
    await fsp.writeFile(path.join(dir, 'lower', 'f'), '');
    await fsp.writeFile(pin, '');
    await createPinnedUserns({ user: pin }, [{ containerId: 0, hostId: 1_000_000, length: 1 }], [{ containerId: 0, hostId: 1_000_000, length: 1 }]);
    await withUsernsFd(pin, (u) => {
      const lower = idmappedTree(path.join(dir, 'lower'), u);
      try {
        mount('overlay', merged, 'overlay', 0, `lowerdir=/proc/self/fd/${lower},upperdir=${path.join(dir, 'upper')},workdir=${path.join(dir, 'work')}`);
      } finally {
        closeFd(lower);
      }
    });
    const st = await fsp.stat(path.join(merged, 'f'));
    if (st.uid !== 1_000_000) return { ok: false, reason: `an idmapped layer showed uid ${st.uid}, not 1000000` };
    return { ok: true };
  } catch (err) {
    return { ok: false, reason: errorMessage(err) };
  } finally {
    await unmount(runner, merged).catch(() => undefined);
    await unmount(runner, pin).catch(() => undefined);
    // Never removed through a mount that stayed (the next start retries).
    if (!(await isMountpoint(merged)) && !(await isMountpoint(pin))) await fsp.rm(dir, { recursive: true, force: true }).catch(() => undefined);
  }
}

/**
 * Makes `dir` passable by the pod's root alone: owner root, group the pod's
 * root group (`hostGid`), mode 0710. runc, inside the pod's user namespace,
 * must pass through it to the rootfs, volumes and pod files below; with the
 * state dir open to others (o+x) every other host user must not (a pod's
 * idmapped volume clones would otherwise be readable by all).
 */
export async function passableByPodRoot(dir: string, hostGid: number): Promise<void> {
  await fsp.chown(dir, 0, hostGid);
  await fsp.chmod(dir, 0o710);
}

/**
 * The first directory on the way to `dir` (itself included) that other users
 * cannot pass through, or undefined. The pod's root is one of them: runc,
 * inside the pod's user namespace, must reach the rootfs and mounts under it.
 */
export async function unsearchableAncestor(dir: string): Promise<string | undefined> {
  let cur = path.resolve(dir);
  const chain: string[] = [];
  for (;;) {
    chain.unshift(cur);
    const up = path.dirname(cur);
    if (up === cur) break;
    cur = up;
  }
  for (const d of chain) {
    const st = await fsp.stat(d);
    if ((st.mode & 0o001) === 0) return d;
  }
  return undefined;
}
