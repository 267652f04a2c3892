/**
 * One watch source fanned out to bounded watchers (the watch cache's shape):
 * the store hands every committed change to `publish` once; a bounded
 * history (by count and bytes) lets a client resume from a resourceVersion,
 * and one older than the history gets 410 Expired so it re-lists. A watcher
 * that cannot keep up says so from `deliver` and is closed, never buffered.
 */
import type { ApiObject, WatchEventType } from './types.js';

export interface Change {
  type: Exclude<WatchEventType, 'BOOKMARK' | 'ERROR'>;
  resource: string;
  rv: number;
  /** The object after the change (for DELETED, as it was last, with the deletion's resourceVersion). */
  object: ApiObject;
  /** Its JSON, made once for every watcher and the history's byte count. */
  json: string;
  /** For MODIFIED, the object before: a watcher whose selector it leaves sees DELETED, one it enters ADDED. */
  prev?: ApiObject;
}

export interface WatchFilter {
  resource: string;
  namespace?: string;
  matches: (o: ApiObject) => boolean;
}

export interface Watcher {
  filter: WatchFilter;
  /** False: the watcher is too far behind; the cache closes it. `type` is the change as this watcher's selector sees it. */
  deliver(change: Change, type: Change['type']): boolean;
  /** Called once, when the cache drops the watcher (behind, or the cache closed). */
  closed(reason: string): void;
}

export interface WatchCacheOptions {
  maxEvents?: number;
  maxBytes?: number;
  maxWatchers?: number;
}

export class TooOld extends Error {}
export class TooManyWatchers extends Error {}

export class WatchCache {
  private readonly history: Change[] = [];
  private historyBytes = 0;
  /** Every change with a resourceVersion above this is in the history. */
  private complete: number;
  private readonly watchers = new Set<Watcher>();
  private readonly maxEvents: number;
  private readonly maxBytes: number;
  private readonly maxWatchers: number;

  constructor(startRv: number, opts: WatchCacheOptions = {}) {
    this.complete = startRv;
    this.maxEvents = opts.maxEvents ?? 1000;
    this.maxBytes = opts.maxBytes ?? 32 * 1024 * 1024;
    this.maxWatchers = opts.maxWatchers ?? 256;
  }

  get watcherCount(): number {
    return this.watchers.size;
  }

  publish(change: Change): void {
    this.history.push(change);
    this.historyBytes += change.json.length;
    while (this.history.length > this.maxEvents || (this.historyBytes > this.maxBytes && this.history.length > 1)) {
      const old = this.history.shift()!;
      this.historyBytes -= old.json.length;
      this.complete = old.rv;
    }
    for (const w of this.watchers) this.offer(w, change);
  }

  /**
   * Adds a watcher that sees every change after `fromRv`, replaying those
   * in the history first. Throws TooOld when the history no longer reaches back that far.
   */
  add(w: Watcher, fromRv: number): () => void {
    if (fromRv < this.complete) throw new TooOld(`too old resource version: ${fromRv} (${this.complete})`);
    if (this.watchers.size >= this.maxWatchers) throw new TooManyWatchers(`too many watches (at most ${this.maxWatchers})`);
    for (const c of this.history) if (c.rv > fromRv && !this.offer(w, c, false)) break;
    this.watchers.add(w);
    return () => {
      this.watchers.delete(w);
    };
  }

  close(): void {
    for (const w of [...this.watchers]) this.drop(w, 'the API server is stopping');
  }

  private offer(w: Watcher, c: Change, added = true): boolean {
    const type = seenAs(w.filter, c);
    if (type === undefined || w.deliver(c, type)) return true;
    if (added) this.drop(w, 'the watcher fell behind');
    else w.closed('the watcher fell behind');
    return false;
  }

  private drop(w: Watcher, reason: string): void {
    if (!this.watchers.delete(w)) return;
    w.closed(reason);
  }
}

function seenAs(f: WatchFilter, c: Change): Change['type'] | undefined {
  if (c.resource !== f.resource) return undefined;
  if (f.namespace !== undefined && c.object.metadata.namespace !== f.namespace) return undefined;
  const now = f.matches(c.object);
  if (c.type !== 'MODIFIED' || !c.prev) return now ? c.type : undefined;
  const before = f.matches(c.prev);
  if (now) return before ? 'MODIFIED' : 'ADDED';
  return before ? 'DELETED' : undefined;
}
