/**
 * Keeps the ObjectStore in step with the manifest directory: inotify (via
 * fs.watch) for changes as they happen, a short per-file debounce so an
 * editor's write-temp-and-rename or a writer's pieces give one reload, and a
 * full rescan when the watch cannot be trusted (an error, an event without a
 * file name, the directory removed or replaced) and whenever the agent asks
 * (its periodic safety net: inotify drops events silently on overflow); a
 * rescan parses only the files whose stamp moved since their last read.
 * All store updates run one at a time, in the order they were decided.
 *
 * A file that cannot be read right now (out of file descriptors, EIO, the
 * parser too slow or out of its heap) is not a file that defines nothing:
 * what it defined stays in the store with the failure shown as a problem,
 * and that file alone is read again after 1 s, 2 s, 4 s … A new event for
 * it reads it at once; rescans leave it to its retry. Content the parser
 * always gives up on is in practice invalid, but telling that from a
 * starved parser is guesswork, so its objects stay as last read while the
 * problem says why; its retries back off to once per 5 min (each try may
 * cost a core for the parse timeout, so they also rest nine times the last
 * failed parse and let other work go first), and writing the file ends it.
 * An empty file is one being written: what it defined stays too. At the
 * first load such a file defined nothing yet, so start() waits for its
 * first retries (bounded) before the agent acts on what was loaded.
 */
import { watch } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { errorMessage, isErrno } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import { fileStamp, isManifestName, listManifestFiles, readManifestFile, type ManifestParser, type ReadFailure } from './manifests.js';
import type { ObjectStore } from './store.js';

/** How long a file must be quiet before it is re-read. */
export const DEFAULT_DEBOUNCE_MS = 75;
/** A file written without pause is still re-read at least this often. */
const MAX_WAIT_FACTOR = 10;
/** The first retry of a file that could not be read; each failure in a row doubles it. */
export const DEFAULT_RETRY_MS = 1_000;
/** The longest wait between retries: I/O errors are cheap to retry, a parse that gives up may have cost a core for 10 s. */
const MAX_RETRY_MS: Record<ReadFailure, number> = { io: 30_000, parser: 300_000 };
/**
 * A rescan skips a file whose stamp is what it was when last parsed, unless it changed
 * less than this long before that read began (file times are only as fine as the
 * kernel's clock tick, so a write just after the read could leave the stamp as it was).
 */
const STAMP_SETTLE_MS = 1_000;
/**
 * Retries of files the parser gave up on get at most a tenth of the time: each waits
 * until this many times the last failed parse has passed since it ended, and until
 * nothing else is queued, so many such files neither keep a core busy nor hold up an
 * edit of another file for more than one parse.
 */
export const PARSER_RETRY_REST_FACTOR = 9;
/** How soon a retry put off for the above looks again. */
const DEFERRED_RETRY_MS = 250;
/** start() waits for this many retries of a file it could not read (1 + 2 + 4 s) … */
const FIRST_LOAD_RETRIES = 3;
/** … but at most this many retry delays (10 s) past the first load. */
const FIRST_LOAD_RETRIES_WITHIN = 10;

/** A watch on one directory: what fs.watch returns, as far as the watcher uses it. */
export interface DirWatch {
  on(event: 'error', listener: (err: Error) => void): unknown;
  close(): void;
}
export type WatchFn = (dir: string, onEvent: (event: string, filename: string | null) => void) => DirWatch;

/** inotify through fs.watch; it never keeps the process alive on its own. */
export const inotifyWatch: WatchFn = (dir, onEvent) =>
  watch(dir, { persistent: false }, (event, filename) => onEvent(event, filename === null ? null : filename.toString()));

export interface ManifestWatcherOptions {
  dir: string;
  store: ObjectStore;
  debounceMs?: number;
  log?: Logger;
  /** How the directory is watched; tests wrap the real one to inject failures. */
  watch?: WatchFn;
  /** What parses the files (by default the shared IsolatedParser). */
  parser?: ManifestParser;
  /** The first retry delay of a file that could not be read. */
  retryMs?: number;
  /** Parser retries rest this many times the last failed parse (PARSER_RETRY_REST_FACTOR). */
  parserRetryRest?: number;
}

interface Pending {
  timer: NodeJS.Timeout;
  first: number;
}

/** A file whose last reads failed: how many in a row, and its retry while one is due. */
interface Retry {
  failures: number;
  cause: ReadFailure;
  timer: NodeJS.Timeout | undefined;
}

export class ManifestWatcher {
  readonly dir: string;
  private readonly store: ObjectStore;
  private readonly debounceMs: number;
  private readonly log: Logger;
  private readonly watchFn: WatchFn;
  private readonly parser: ManifestParser | undefined;
  private readonly retryMs: number;
  private readonly parserRetryRest: number;
  private watcher: DirWatch | undefined;
  /** dev:ino of the directory being watched, to notice it being replaced. */
  private watchedId: string | undefined;
  private readonly pending = new Map<string, Pending>();
  private readonly retries = new Map<string, Retry>();
  /** The stamp of each file's last successful read, and when that read began. */
  private readonly readStamps = new Map<string, { stamp: string; at: number }>();
  /** A rescan that is queued and has not begun: later requests join it. */
  private queuedRescan: Promise<void> | undefined;
  private queue: Promise<void> = Promise.resolve();
  /** Work queued or running. */
  private queued = 0;
  /** Until when parser retries rest (see PARSER_RETRY_REST_FACTOR). */
  private parserRestUntil = 0;
  private starting = false;
  private closed = false;

  constructor(opts: ManifestWatcherOptions) {
    this.dir = path.resolve(opts.dir);
    this.store = opts.store;
    this.debounceMs = opts.debounceMs ?? DEFAULT_DEBOUNCE_MS;
    this.log = opts.log ?? silentLogger;
    this.watchFn = opts.watch ?? inotifyWatch;
    this.parser = opts.parser;
    this.retryMs = opts.retryMs ?? DEFAULT_RETRY_MS;
    this.parserRetryRest = opts.parserRetryRest ?? PARSER_RETRY_REST_FACTOR;
  }

  /**
   * Creates the directory if needed (the agent owns it), starts watching, and
   * loads everything in it. Rejects if the directory cannot be created or read.
   * A file that could not be read gets its first quick retries (bounded)
   * before this resolves: it defines nothing yet, and the agent's first pass
   * stops whatever no loaded manifest wants.
   */
  async start(): Promise<void> {
    // Until this resolves, retries do not rest (see PARSER_RETRY_REST_FACTOR): a file the parser
    // gave up on at a starved boot must get its quick tries before the controllers first look.
    this.starting = true;
    try {
      await this.rescan();
      const deadline = Date.now() + FIRST_LOAD_RETRIES_WITHIN * this.retryMs;
      while (!this.closed && Date.now() < deadline && [...this.retries.values()].some((r) => r.failures <= FIRST_LOAD_RETRIES)) {
        await new Promise((r) => setTimeout(r, Math.min(50, this.retryMs)));
      }
    } finally {
      this.starting = false;
    }
  }

  /**
   * Re-reads the whole directory: files that appeared or changed are loaded,
   * files that went are removed, and the watch is re-established if the
   * directory was replaced. Resolves when the store is up to date; rejects
   * (and logs) if the directory cannot be read, leaving the store as it was.
   */
  rescan(): Promise<void> {
    // A rescan slower than the agent's period must not pile up behind itself.
    if (this.queuedRescan) return this.queuedRescan;
    const run = this.enqueue(() => {
      this.queuedRescan = undefined;
      return this.doRescan();
    });
    this.queuedRescan = run;
    return run;
  }

  /** Stops watching; pending reloads and retries are dropped. Resolves when nothing of the watcher's runs any more. */
  async close(): Promise<void> {
    this.closed = true;
    for (const p of this.pending.values()) clearTimeout(p.timer);
    this.pending.clear();
    for (const r of this.retries.values()) clearTimeout(r.timer);
    this.retries.clear();
    this.readStamps.clear();
    this.stopWatch();
    await this.queue;
  }

  /** Runs `work` after everything queued before it; its failure is logged, and rejects only the returned promise. */
  private enqueue(work: () => Promise<void>): Promise<void> {
    this.queued++;
    const run = this.queue.then(() => (this.closed ? undefined : work())).finally(() => this.queued--);
    this.queue = run.catch((err) => {
      this.log.error('manifest directory update failed', { dir: this.dir, error: errorMessage(err) });
    });
    return run;
  }

  /** For work nobody awaits (timers, watch errors): the queue has logged any failure. */
  private enqueueDetached(work: () => Promise<void>): void {
    this.enqueue(work).catch(() => undefined);
  }

  private async doRescan(): Promise<void> {
    await this.ensureWatch();
    let files: string[];
    try {
      files = await listManifestFiles(this.dir);
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
      files = [];
    }
    const present = new Set(files);
    // Only the directory's own files: the store also holds other sources (the node's API).
    for (const f of this.store.fileNames()) if (!present.has(f) && path.dirname(path.resolve(f)) === path.resolve(this.dir)) this.store.removeFile(f);
    for (const f of this.retries.keys()) if (!present.has(f)) this.forgetRetry(f);
    for (const f of this.readStamps.keys()) if (!present.has(f)) this.readStamps.delete(f);
    // A file waiting for its retry is left to it: a rescan must not turn the back-off into a fixed pace.
    // Nor is an unchanged file parsed again: a few MiB of manifests cost seconds of a core each time.
    for (const f of files) if (this.retries.get(f)?.timer === undefined && !(await this.unchanged(f))) await this.loadFile(f);
  }

  /** Whether `file` is, for certain, the version last parsed. */
  private async unchanged(file: string): Promise<boolean> {
    const last = this.readStamps.get(file);
    if (!last) return false;
    try {
      const st = await fs.stat(file, { bigint: true });
      return fileStamp(st) === last.stamp && Number(st.ctimeNs / 1_000_000n) < last.at - STAMP_SETTLE_MS;
    } catch {
      return false; // loadFile finds out what is wrong with it
    }
  }

  private async loadFile(file: string): Promise<void> {
    const retry = this.retries.get(file);
    if (retry) {
      // This read is the retry, or replaces it.
      clearTimeout(retry.timer);
      retry.timer = undefined;
    }
    this.readStamps.delete(file);
    const at = Date.now();
    const r = await readManifestFile(file, this.parser);
    if (this.closed) return;
    if (r.kind === 'unread') {
      if (r.cause === 'parser') this.parserRestUntil = Date.now() + this.parserRetryRest * (Date.now() - at);
      this.store.keepFile(file, r.problem);
      this.scheduleRetry(file, r.cause);
      return;
    }
    this.forgetRetry(file);
    switch (r.kind) {
      case 'gone':
        this.store.removeFile(file);
        break;
      case 'empty':
        // Its write will be an event (or a rescan finds it): nothing to retry.
        this.store.keepFile(file, { file, line: 1, reason: 'the file is empty' });
        break;
      case 'skipped':
        if (r.problem) this.store.replaceFile(file, { objects: [], problems: [r.problem] });
        else this.store.removeFile(file);
        break;
      case 'parsed':
        this.readStamps.set(file, { stamp: r.stamp, at });
        this.store.replaceFile(file, r.manifest);
        break;
    }
  }

  /** Reads `file` again after a delay that doubles with each failure in a row, up to the cap for `cause`. */
  private scheduleRetry(file: string, cause: ReadFailure): void {
    const r = this.retries.get(file) ?? { failures: 0, cause, timer: undefined };
    r.failures++;
    r.cause = cause;
    const delay = Math.min(this.retryMs * 2 ** Math.min(r.failures - 1, 30), MAX_RETRY_MS[cause]);
    this.armRetry(file, r, delay);
    this.retries.set(file, r);
    this.log.warn('cannot read a manifest file now; keeping what it defined, retrying', { file, cause, failures: r.failures, retryInMs: delay });
  }

  private armRetry(file: string, r: Retry, delay: number): void {
    clearTimeout(r.timer);
    r.timer = setTimeout(() => {
      if (this.mustRest(file, r, 0)) return;
      r.timer = undefined;
      this.enqueueDetached(async () => {
        // Read meanwhile (an event), or due again: this try is no longer needed.
        if (this.retries.get(file) !== r || r.timer !== undefined) return;
        // Queued while start() waited, run after: the rest applies now.
        if (this.mustRest(file, r, 1)) return;
        await this.loadFile(file);
      });
    }, delay);
    r.timer.unref();
  }

  /** Whether a parser retry must wait (then it is armed again): `ahead` is the queued work that is this retry's own. */
  private mustRest(file: string, r: Retry, ahead: number): boolean {
    const rest = this.parserRestUntil - Date.now();
    if (r.cause !== 'parser' || this.starting || (rest <= 0 && this.queued <= ahead)) return false;
    this.armRetry(file, r, Math.max(rest, DEFERRED_RETRY_MS));
    return true;
  }

  private forgetRetry(file: string): void {
    clearTimeout(this.retries.get(file)?.timer);
    this.retries.delete(file);
  }

  /** Makes sure the directory exists and the watch is on the directory that is there now. */
  private async ensureWatch(): Promise<void> {
    await fs.mkdir(this.dir, { recursive: true, mode: 0o755 });
    const st = await fs.stat(this.dir);
    const id = `${st.dev}:${st.ino}`;
    if (this.watcher && this.watchedId === id) return;
    this.stopWatch();
    if (this.closed) return;
    let w: DirWatch;
    try {
      w = this.watchFn(this.dir, (event, filename) => this.onEvent(event, filename));
    } catch (err) {
      // Out of inotify watches (ENOSPC) and the like: the directory is still read, and
      // the next rescan (the agent's periodic one) tries to watch again.
      this.log.warn('cannot watch the manifest directory; relying on rescans', { dir: this.dir, error: errorMessage(err) });
      return;
    }
    w.on('error', (err) => {
      this.log.warn('manifest directory watch failed; rescanning', { dir: this.dir, error: errorMessage(err) });
      if (this.watcher === w) this.stopWatch();
      this.enqueueDetached(() => this.doRescan());
    });
    this.watcher = w;
    this.watchedId = id;
    this.log.debug('watching manifest directory', { dir: this.dir });
  }

  private stopWatch(): void {
    const w = this.watcher;
    this.watcher = undefined;
    this.watchedId = undefined;
    if (w) {
      try {
        w.close();
      } catch {
        // Already closed by the error that brought us here.
      }
    }
  }

  private onEvent(event: string, name: string | null): void {
    if (this.closed) return;
    if (name === null || name === '' || name.includes('/')) {
      // Without a name there is no telling what changed.
      this.schedule('\0rescan', () => this.doRescan());
      return;
    }
    if (isManifestName(name)) {
      const file = path.join(this.dir, name);
      this.schedule(file, () => this.loadFile(file));
    } else if (name.startsWith('..')) {
      // A ConfigMap-style atomic update (manifests symlinked through `..data`,
      // which is swapped): the manifests' own names see no event at all.
      this.schedule('\0rescan', () => this.doRescan());
    }
    // The directory itself moved or was removed (inotify names it by its basename).
    if (event === 'rename' && name === path.basename(this.dir)) {
      this.schedule('\0dir', () => this.checkDir());
    }
  }

  private async checkDir(): Promise<void> {
    let id: string | undefined;
    try {
      const st = await fs.stat(this.dir);
      id = `${st.dev}:${st.ino}`;
    } catch (err) {
      if (!isErrno(err, 'ENOENT')) throw err;
    }
    if (id === undefined || id !== this.watchedId) {
      this.log.info('manifest directory was removed or replaced; rescanning', { dir: this.dir });
      this.stopWatch();
      await this.doRescan();
    }
  }

  /** Runs `work` (queued) once `key` has been quiet for the debounce time, or at the latest after the max wait. */
  private schedule(key: string, work: () => Promise<void>): void {
    const now = Date.now();
    const existing = this.pending.get(key);
    if (existing && now - existing.first >= this.debounceMs * MAX_WAIT_FACTOR) return; // it fires soon anyway
    if (existing) clearTimeout(existing.timer);
    const timer = setTimeout(() => {
      this.pending.delete(key);
      this.enqueueDetached(work);
    }, this.debounceMs);
    timer.unref();
    this.pending.set(key, { timer, first: existing?.first ?? now });
  }
}
