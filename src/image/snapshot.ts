/**
 * Layer snapshots for overlayfs: one directory per layer, keyed by chain id,
 * stacked as lower dirs. Directories are named by short numeric ids (as
 * containerd does) so that a mount option listing 40 lower dirs stays well
 * under the kernel's one-page limit.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import type { Db } from '../db.js';
import { SkiffError, isErrno } from '../errors.js';
import { lgetxattr } from '../sys/libc.js';

export interface Snapshot {
  id: number;
  chainId: string;
  parent?: string;
  /** The layer's directory, usable as an overlayfs lower dir. */
  dir: string;
  size: number;
  inodes: number;
}

interface Row {
  id: number;
  chain_id: string;
  parent: string | null;
  size: number;
  inodes: number;
}

export interface Snapshotter {
  get(chainId: string): Snapshot | undefined;
  /** An empty private directory to unpack into; hand it to commit or abort. */
  prepare(): Promise<string>;
  commit(chainId: string, parent: string | undefined, work: string, usage: { size: number; inodes: number }): Snapshot;
  abort(work: string): Promise<void>;
  remove(chainId: string): Promise<void>;
  /** The chain's layer dirs, topmost first. */
  lowerDirs(chainId: string): string[];
  list(): Snapshot[];
  usage(): { bytes: number; inodes: number };
  readonly mountpoint: string;
}

export class OverlaySnapshotter implements Snapshotter {
  readonly mountpoint: string;
  private readonly work: string;

  constructor(
    root: string,
    private readonly db: Db,
  ) {
    this.mountpoint = path.join(root, 'snapshots');
    this.work = path.join(root, 'snapshots-work');
  }

  /** Drops unpacks that a dead process left behind, and dirs with no record. */
  async init(): Promise<void> {
    await fsp.rm(this.work, { recursive: true, force: true });
    await fsp.mkdir(this.work, { recursive: true, mode: 0o700 });
    await fsp.mkdir(this.mountpoint, { recursive: true, mode: 0o700 });
    const known = new Set(this.list().map((s) => String(s.id)));
    for (const name of await fsp.readdir(this.mountpoint)) {
      if (!known.has(name)) await fsp.rm(path.join(this.mountpoint, name), { recursive: true, force: true });
    }
  }

  private toSnapshot(r: Row): Snapshot {
    return {
      id: r.id,
      chainId: r.chain_id,
      parent: r.parent ?? undefined,
      dir: path.join(this.mountpoint, String(r.id), 'fs'),
      size: r.size,
      inodes: r.inodes,
    };
  }

  get(chainId: string): Snapshot | undefined {
    const r = this.db.prepare('SELECT * FROM snapshots WHERE chain_id = ?').get(chainId) as Row | undefined;
    return r && this.toSnapshot(r);
  }

  list(): Snapshot[] {
    return (this.db.prepare('SELECT * FROM snapshots ORDER BY id').all() as Row[]).map((r) => this.toSnapshot(r));
  }

  async prepare(): Promise<string> {
    const dir = path.join(this.work, randomBytes(8).toString('hex'));
    await fsp.mkdir(path.join(dir, 'fs'), { recursive: true, mode: 0o700 });
    await fsp.chmod(path.join(dir, 'fs'), 0o755);
    return path.join(dir, 'fs');
  }

  commit(chainId: string, parent: string | undefined, work: string, usage: { size: number; inodes: number }): Snapshot {
    const txn = this.db.transaction(() => {
      if (this.get(chainId)) throw new SkiffError('AlreadyExists', `snapshot ${chainId} already exists`);
      const info = this.db
        .prepare('INSERT INTO snapshots (chain_id, parent, size, inodes) VALUES (?, ?, ?, ?)')
        .run(chainId, parent ?? null, usage.size, usage.inodes);
      // The rename happens inside the transaction: a row never points at a missing dir,
      // and a dir without a row is removed at the next start.
      fs.renameSync(path.dirname(work), path.join(this.mountpoint, String(info.lastInsertRowid)));
      return Number(info.lastInsertRowid);
    });
    const id = txn();
    return this.get(chainId) ?? this.toSnapshot({ id, chain_id: chainId, parent: parent ?? null, ...usage });
  }

  async abort(work: string): Promise<void> {
    await fsp.rm(path.dirname(work), { recursive: true, force: true });
  }

  async remove(chainId: string): Promise<void> {
    const snap = this.get(chainId);
    if (!snap) return;
    this.db.prepare('DELETE FROM snapshots WHERE id = ?').run(snap.id);
    await fsp.rm(path.dirname(snap.dir), { recursive: true, force: true });
  }

  lowerDirs(chainId: string): string[] {
    const out: string[] = [];
    let cur: string | undefined = chainId;
    while (cur) {
      const snap = this.get(cur);
      if (!snap) throw new SkiffError('NotFound', `snapshot ${cur} not found`);
      out.push(snap.dir);
      cur = snap.parent;
    }
    return out;
  }

  usage(): { bytes: number; inodes: number } {
    const r = this.db.prepare('SELECT COALESCE(SUM(size),0) AS b, COALESCE(SUM(inodes),0) AS i FROM snapshots').get() as {
      b: number;
      i: number;
    };
    return { bytes: r.b, inodes: r.i };
  }
}

/**
 * Finds `rel` as overlayfs would show it over `dirs` (a chain's layer dirs,
 * topmost first), for a hardlink whose target lies below the layer being
 * unpacked. Returns the path of a regular file, or undefined when the name
 * is absent, whited out, hidden by an opaque directory or a non-directory
 * above it, not a regular file, or reached through a symlink (which the
 * merged view would follow, possibly onto the host: refused).
 *
 * Committed layer dirs never change, so checking each component with lstat
 * before going on is enough: nothing can swap one between check and use.
 */
export async function findInLowers(dirs: string[], rel: string): Promise<string | undefined> {
  const parts = rel.split('/');
  if (parts.some((p) => p === '' || p === '.' || p === '..')) return undefined;
  for (const dir of dirs) {
    let cur = dir;
    let opaque = false;
    for (let i = 0; i < parts.length; i++) {
      const next = path.join(cur, parts[i]!);
      const st = await fsp.lstat(next).catch((e) => (isErrno(e, 'ENOENT') ? undefined : Promise.reject(e)));
      if (!st) break;
      if (i === parts.length - 1) return st.isFile() ? next : undefined;
      if (!st.isDirectory()) return undefined;
      if (lgetxattr(next, 'trusted.overlay.opaque')?.toString() === 'y') opaque = true;
      cur = next;
    }
    if (opaque) return undefined;
  }
  return undefined;
}
