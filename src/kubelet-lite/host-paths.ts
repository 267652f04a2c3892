/**
 * Host paths no PersistentVolume may hand a pod: the whole filesystem, the
 * system's own directories, and the node's root dir (its database, keys,
 * other pods' secrets) or any directory holding it. The API refuses such a
 * PV; the agent checks again before it mounts one, since a PV may have been
 * stored before the rule (or through a store that has no root dir).
 */
import path from 'node:path';

/** Directories that are the system's, by themselves (below them a path may be the user's to give, as /var/data). */
const SYSTEM = new Set(['/', '/bin', '/boot', '/dev', '/etc', '/lib', '/lib32', '/lib64', '/proc', '/root', '/run', '/sbin', '/sys', '/usr', '/var', '/var/run', '/var/lib']);
/** Directories whose whole tree is the system's. */
const SYSTEM_TREES = ['/proc', '/sys', '/dev', '/etc', '/boot'];

const within = (p: string, dir: string) => p === dir || p.startsWith(dir === '/' ? '/' : `${dir}/`);

/**
 * Why `p` may not back a PersistentVolume named `pvName` on a node whose
 * root dir is `rootDir`, or undefined when it may. The provisioner's own
 * directory for this volume, `<rootDir>/volumes/<pvName>`, is the one place
 * under the root dir a PV may name.
 */
export function persistentHostPathRefusal(p: string, pvName: string, rootDir?: string): string | undefined {
  if (!path.isAbsolute(p)) return 'must be an absolute path';
  if (p.split('/').includes('..')) return "must not contain '..'";
  const n = path.resolve(p);
  if (n === '/') return 'may not be the root directory: a volume there would hand a pod the whole filesystem of the node';
  if (SYSTEM.has(n) || SYSTEM_TREES.some((t) => within(n, t))) return `may not be ${n} or a path under the system's own directories`;
  if (rootDir) {
    const root = path.resolve(rootDir);
    const own = path.join(root, 'volumes', pvName);
    if (within(root, n)) return `may not hold the node's root directory ${root}`;
    if (within(n, root) && n !== own) return `may not be under the node's root directory ${root} (only ${own}, the provisioner's directory for this volume)`;
  }
  return undefined;
}
