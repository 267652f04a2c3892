/**
 * The air-gap images directory (k3s's agent/images): every image archive in
 * it is imported when the daemon starts and whenever one is added. An archive
 * is imported once: its path, size, mtime and digest are remembered in a
 * small state file, so a restart does not import it again (and a copy of an
 * archive already imported under another name is recognised by its digest).
 * A bad archive is logged and skipped; it never stops the daemon.
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { errorMessage, isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import type { ImportedImage } from './service.js';

export const ARCHIVE_SUFFIXES = ['.tar', '.tar.gz', '.tgz', '.tar.zst', '.tar.zstd'];

interface Seen {
  size: number;
  mtimeMs: number;
}

interface Imported extends Seen {
  digest: string;
}

interface State {
  version: 1;
  archives: Record<string, Imported>;
}

export interface ImagesDirOptions {
  dir: string;
  /** Where what was imported is remembered. */
  stateFile: string;
  importArchive: (file: string, opts: { signal?: AbortSignal }) => Promise<ImportedImage[]>;
  log: Logger;
  /** A file is imported once it has not changed for this long (default 2 s). */
  settleMs?: number;
}

export function isArchiveName(name: string): boolean {
  return !name.startsWith('.') && ARCHIVE_SUFFIXES.some((s) => name.endsWith(s));
}

async function fileDigest(file: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of fs.createReadStream(file, { highWaterMark: 1 << 20 }) as AsyncIterable<Buffer>) h.update(c);
  return `sha256:${h.digest('hex')}`;
}

const same = (a: Seen | undefined, b: Seen): boolean => !!a && a.size === b.size && a.mtimeMs === b.mtimeMs;

export class ImagesDir {
  private state: State = { version: 1, archives: {} };
  /** Files seen changing: imported once they have stayed the same for settleMs. */
  private readonly changing = new Map<string, Seen & { since: number }>();
  /** Archives that failed, as they were: tried again only once they change. */
  private readonly failed = new Map<string, Seen>();
  private watcher?: fs.FSWatcher;
  private timer?: NodeJS.Timeout;
  private scanning: Promise<void> = Promise.resolve();
  private rescanWanted = false;
  private closed = false;
  private readonly stop = new AbortController();
  private readonly settleMs: number;

  constructor(private readonly o: ImagesDirOptions) {
    this.settleMs = o.settleMs ?? 2000;
  }

  /** Imports what is there now, then watches for more. */
  async start(): Promise<void> {
    try {
      await fsp.mkdir(this.o.dir, { recursive: true, mode: 0o700 });
    } catch (err) {
      // The runtime works without it: say why, and serve.
      this.o.log.error('images dir: unusable, no archives will be imported', { dir: this.o.dir, error: errorMessage(err) });
      return;
    }
    try {
      const parsed = JSON.parse(await fsp.readFile(this.o.stateFile, 'utf8')) as State;
      if (parsed?.version === 1 && parsed.archives && typeof parsed.archives === 'object') this.state = parsed;
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) this.o.log.warn('images dir: unreadable state file, starting afresh', { file: this.o.stateFile, error: errorMessage(err) });
    }
    try {
      this.watcher = fs.watch(this.o.dir, () => this.schedule(200));
      this.watcher.on('error', (err) => this.o.log.warn('images dir: watching stopped', { dir: this.o.dir, error: errorMessage(err) }));
    } catch (err) {
      this.o.log.warn('images dir: cannot watch; archives added later need a restart', { dir: this.o.dir, error: errorMessage(err) });
    }
    await this.rescan(true);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.stop.abort(new Error('the daemon is stopping'));
    this.watcher?.close();
    if (this.timer) clearTimeout(this.timer);
    await this.scanning.catch(() => undefined);
  }

  private schedule(ms: number): void {
    if (this.closed) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timer = undefined;
      void this.rescan(false);
    }, ms);
    this.timer.unref();
  }

  /** Scans one at a time; a scan asked for while one runs runs after it. */
  private rescan(first: boolean): Promise<void> {
    if (this.rescanWanted) return this.scanning;
    this.rescanWanted = true;
    this.scanning = this.scanning.then(async () => {
      this.rescanWanted = false;
      if (this.closed) return;
      await this.scan(first).catch((err) => this.o.log.error('images dir: scan failed', { dir: this.o.dir, error: errorMessage(err) }));
    });
    return this.scanning;
  }

  private async scan(first: boolean): Promise<void> {
    const names = (await fsp.readdir(this.o.dir)).filter(isArchiveName).sort();
    let waiting = false;
    for (const name of names) {
      if (this.closed) return;
      const file = path.join(this.o.dir, name);
      const st = await fsp.stat(file).catch(() => undefined);
      if (!st?.isFile()) continue;
      const now: Seen = { size: st.size, mtimeMs: st.mtimeMs };
      if (same(this.state.archives[file], now) || same(this.failed.get(file), now)) continue;
      // At start, a file untouched for a while is complete; otherwise it must stay the same for settleMs.
      const settled = first ? Date.now() - st.mtimeMs >= this.settleMs : false;
      if (!settled) {
        const c = this.changing.get(file);
        if (!same(c, now)) {
          this.changing.set(file, { ...now, since: Date.now() });
          waiting = true;
          continue;
        }
        if (Date.now() - c!.since < this.settleMs) {
          waiting = true;
          continue;
        }
      }
      this.changing.delete(file);
      await this.importOne(file, now);
    }
    for (const f of this.changing.keys()) if (!names.includes(path.basename(f))) this.changing.delete(f);
    if (waiting) this.schedule(Math.max(100, Math.floor(this.settleMs / 2)));
  }

  private async importOne(file: string, seen: Seen): Promise<void> {
    try {
      const digest = await fileDigest(file);
      const twin = Object.entries(this.state.archives).find(([, r]) => r.digest === digest);
      if (!twin) {
        const images = await this.o.importArchive(file, { signal: this.stop.signal });
        this.o.log.info('images dir: archive imported', { archive: file, images: images.map((i) => i.repoTags.join(',') || i.id) });
      } else {
        this.o.log.info('images dir: archive already imported under another name', { archive: file, as: twin[0] });
      }
      this.failed.delete(file);
      this.state.archives[file] = { ...seen, digest };
      await this.save();
    } catch (err) {
      if (this.closed) return;
      this.failed.set(file, seen);
      this.o.log.error('images dir: archive refused, skipped', { archive: file, error: errorMessage(err) });
    }
  }

  private async save(): Promise<void> {
    // Archives no longer there are forgotten: one put back later is imported again.
    for (const f of Object.keys(this.state.archives)) {
      if (!(await fsp.stat(f).catch(() => undefined))) delete this.state.archives[f];
    }
    const tmp = `${this.o.stateFile}.tmp`;
    await fsp.writeFile(tmp, JSON.stringify(this.state, null, 1), { mode: 0o600 });
    await fsp.rename(tmp, this.o.stateFile);
  }
}
