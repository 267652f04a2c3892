/**
 * Removing a container's cgroup when the runtime no longer knows the
 * container: a runtime killed mid-create has made the cgroup but not yet
 * written its state, so its own delete finds nothing to remove.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { isErrno } from '../errors.js';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** The hierarchies: the one of cgroup v2, or each v1 controller (and the v2 tree beside them on hybrid hosts). */
async function hierarchies(root: string): Promise<string[]> {
  if (await fs.access(path.join(root, 'cgroup.controllers')).then(() => true, () => false)) return [root];
  const out: string[] = [];
  for (const e of await fs.readdir(root, { withFileTypes: true }).catch(() => [])) {
    // Controllers mounted together appear once as a dir and again as symlinks (cpu → cpu,cpuacct).
    if (e.isDirectory()) out.push(path.join(root, e.name));
  }
  return out;
}

async function pids(dir: string): Promise<number[]> {
  const text = await fs.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '');
  return text.split('\n').filter(Boolean).map(Number);
}

/**
 * Kills what is left in `cgroupsPath` (an OCI cgroupsPath, relative to each
 * hierarchy) and removes it, deepest first, in every hierarchy. Absent is
 * success; the path must name a container's own cgroup, never a parent.
 */
export async function removeCgroup(cgroupsPath: string, root = CGROUP_ROOT): Promise<void> {
  const rel = path.posix.normalize(`/${cgroupsPath}`);
  if (rel === '/' || rel.split('/').includes('..')) return;
  for (const h of await hierarchies(root)) await removeTree(path.join(h, rel));
}

async function removeTree(dir: string): Promise<void> {
  let entries;
  try {
    entries = await fs.readdir(dir, { withFileTypes: true });
  } catch (err) {
    if (isErrno(err, 'ENOENT') || isErrno(err, 'ENOTDIR')) return;
    throw err;
  }
  for (const e of entries) if (e.isDirectory()) await removeTree(path.join(dir, e.name));
  // A frozen task cannot act on SIGKILL (cgroup v1 freezer).
  await fs.writeFile(path.join(dir, 'freezer.state'), 'THAWED').catch(() => undefined);
  const deadline = Date.now() + 5_000;
  for (;;) {
    for (const pid of await pids(dir)) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
    try {
      await fs.rmdir(dir);
      return;
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return;
      // EBUSY while the killed processes are still exiting.
      if (!isErrno(err, 'EBUSY') || Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
}

/** The cgroupsPath in an OCI bundle's config.json, if the bundle and the field are there. */
export async function bundleCgroupsPath(bundle: string): Promise<string | undefined> {
  try {
    const spec = JSON.parse(await fs.readFile(path.join(bundle, 'config.json'), 'utf8')) as { linux?: { cgroupsPath?: unknown } };
    const p = spec.linux?.cgroupsPath;
    return typeof p === 'string' && p ? p : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Everything a runtime may hold for a container that has no record: its
 * state (`delete --force`), and, where a create was cut short before the
 * runtime saved its state, the half-made state dir and the cgroup named in
 * the bundle. Failures are logged: there is no caller to retry them.
 */
export async function removeRuntimeRemains(
  rt: { name: string; root: string; delete(id: string): Promise<void> },
  id: string,
  bundle: string,
  log: { warn(msg: string, fields?: Record<string, unknown>): void },
): Promise<void> {
  await rt.delete(id).catch((err) => log.warn('runtime delete of an orphan failed', { id, runtime: rt.name, error: String(err) }));
  await fs.rm(path.join(rt.root, id), { recursive: true, force: true });
  const cg = await bundleCgroupsPath(bundle);
  if (cg) await removeCgroup(cg).catch((err) => log.warn('could not remove the cgroup of an orphan', { id, cgroup: cg, error: String(err) }));
}
