/**
 * Writes a set of files into a volume directory so that a reader sees either
 * the whole old set or the whole new one, as the kubelet's AtomicWriter does:
 *
 *   <dir>/..2026_11_30_06_40_01.123456789/   the files of one version
 *   <dir>/..data -> ..2026_11_30_06_40_01.123456789
 *   <dir>/key -> ..data/key                   what the container sees
 *
 * A new version goes into a new timestamped directory; `..data` is swapped
 * with one rename(2); the visible names never change, they resolve through
 * `..data`. The old version's directory is removed afterwards.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { isErrno } from '../errors.js';

export interface FileProjection {
  data: Buffer;
  /** Permission bits, e.g. 0o644. */
  mode: number;
}

export type Payload = Map<string, FileProjection>;

const DATA_DIR = '..data';
const DATA_DIR_TMP = '..data_tmp';
const MAX_PATH = 4096;
const MAX_SEGMENT = 255;

export class PayloadPathError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PayloadPathError';
  }
}

/** A payload path must stay inside the volume and not collide with the writer's own `..` entries. */
export function validatePayloadPath(p: string): string {
  if (p === '') throw new PayloadPathError('target path must not be empty');
  if (p.length > MAX_PATH) throw new PayloadPathError(`target path ${p} is too long: ${p.length} > ${MAX_PATH}`);
  if (path.posix.isAbsolute(p)) throw new PayloadPathError(`target path ${p} is absolute`);
  const items = p.split('/');
  for (const item of items) {
    if (item === '..') throw new PayloadPathError(`target path ${p} contains '..'`);
    if (item.length > MAX_SEGMENT) throw new PayloadPathError(`target path ${p} has a segment longer than ${MAX_SEGMENT}`);
  }
  if (items[0].startsWith('..')) throw new PayloadPathError(`target path ${p} begins with '..'`);
  const clean = path.posix.normalize(p).replace(/\/+$/, '');
  if (clean === '.' || clean === '') throw new PayloadPathError(`target path ${p} names the volume itself`);
  return clean;
}

function timestampName(now: Date): string {
  const p = (n: number, w = 2) => String(n).padStart(w, '0');
  const ts = `${now.getUTCFullYear()}_${p(now.getUTCMonth() + 1)}_${p(now.getUTCDate())}_${p(now.getUTCHours())}_${p(now.getUTCMinutes())}_${p(now.getUTCSeconds())}`;
  return `..${ts}.${randomBytes(5).toString('hex')}`;
}

/** Every file under `dir`, by relative path (symlinks inside a version dir are never written, so not followed). */
async function listFiles(dir: string, rel = ''): Promise<string[]> {
  const out: string[] = [];
  for (const e of await fs.readdir(path.join(dir, rel), { withFileTypes: true })) {
    const r = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...(await listFiles(dir, r)));
    else out.push(r);
  }
  return out;
}

async function currentVersion(dir: string): Promise<string | undefined> {
  try {
    const target = await fs.readlink(path.join(dir, DATA_DIR));
    // Only ever a sibling name written by us; anything else is not ours to read.
    return target.includes('/') ? undefined : target;
  } catch (err) {
    if (isErrno(err, 'ENOENT') || isErrno(err, 'EINVAL')) return undefined;
    throw err;
  }
}

async function sameContent(versionDir: string, files: string[], payload: Payload, gid: number | undefined): Promise<boolean> {
  if (files.length !== payload.size) return false;
  for (const f of files) {
    const want = payload.get(f);
    if (!want) return false;
    const full = path.join(versionDir, f);
    const st = await fs.lstat(full);
    if (!st.isFile() || (st.mode & 0o7777) !== want.mode) return false;
    if (gid !== undefined && st.gid !== gid) return false;
    if (!(await fs.readFile(full)).equals(want.data)) return false;
  }
  return true;
}

function topLevel(p: string): string {
  return p.split('/')[0];
}

export interface WriteResult {
  /** False when the directory already held exactly this payload. */
  changed: boolean;
}

export interface WriteOptions {
  /** The group every file and directory of the version gets (the pod's fsGroup), so non-root users can read them. */
  gid?: number;
  now?: () => Date;
}

/** Makes `dir` show exactly `payload`, atomically. Creates `dir` if needed. */
export async function writeAtomic(dir: string, input: Payload, opts: WriteOptions = {}): Promise<WriteResult> {
  const { gid, now = () => new Date() } = opts;
  const payload: Payload = new Map();
  for (const [p, f] of input) payload.set(validatePayloadPath(p), f);
  await fs.mkdir(dir, { recursive: true, mode: 0o755 });

  const old = await currentVersion(dir);
  const oldFiles = old ? await listFiles(path.join(dir, old)).catch(() => undefined) : undefined;
  if (old && oldFiles && (await sameContent(path.join(dir, old), oldFiles, payload, gid))) {
    await createVisible(dir, payload);
    return { changed: false };
  }

  const version = timestampName(now());
  const versionDir = path.join(dir, version);
  await fs.mkdir(versionDir, { mode: 0o755 });
  await fs.chmod(versionDir, 0o755);
  for (const [p, f] of payload) {
    const full = path.join(versionDir, p);
    await fs.mkdir(path.dirname(full), { recursive: true, mode: 0o755 });
    await fs.writeFile(full, f.data, { mode: f.mode, flag: 'wx' });
    await fs.chmod(full, f.mode);
  }
  if (gid !== undefined) await chownTree(versionDir, gid);

  const tmpLink = path.join(dir, DATA_DIR_TMP);
  await fs.rm(tmpLink, { force: true });
  await fs.symlink(version, tmpLink);
  await fs.rename(tmpLink, path.join(dir, DATA_DIR));

  await createVisible(dir, payload);
  const wanted = new Set([...payload.keys()].map(topLevel));
  for (const name of new Set((oldFiles ?? []).map(topLevel))) {
    if (wanted.has(name)) continue;
    const visible = path.join(dir, name);
    const st = await fs.lstat(visible).catch(() => undefined);
    if (st?.isSymbolicLink()) await fs.unlink(visible);
  }
  // The old version, and any a crash left behind.
  for (const e of await fs.readdir(dir)) {
    if (e.startsWith('..') && e !== DATA_DIR && e !== version && e !== DATA_DIR_TMP) await fs.rm(path.join(dir, e), { recursive: true, force: true });
  }
  return { changed: true };
}

/** Group-owns a version dir we just wrote (nothing in it is a symlink), setgid on its directories as the kubelet does. */
async function chownTree(dir: string, gid: number): Promise<void> {
  const st = await fs.lstat(dir);
  await fs.lchown(dir, st.uid, gid);
  await fs.chmod(dir, (st.mode & 0o7777) | 0o2000 | 0o110 | 0o440);
  for (const e of await fs.readdir(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) await chownTree(p, gid);
    else await fs.lchown(p, (await fs.lstat(p)).uid, gid);
  }
}

async function createVisible(dir: string, payload: Payload): Promise<void> {
  for (const name of new Set([...payload.keys()].map(topLevel))) {
    const visible = path.join(dir, name);
    try {
      await fs.symlink(path.join(DATA_DIR, name), visible);
    } catch (err) {
      if (!isErrno(err, 'EEXIST')) throw err;
    }
  }
}
