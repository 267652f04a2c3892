/**
 * A local copy of one resource, kept by list and watch as client-go's
 * informers keep theirs: listed once, then followed from the list's
 * resourceVersion, listed again when the watch is lost or too old. Each
 * change is handed on with the object before and after, so a consumer can
 * look at the keys it touches (a pod's old and new labels). Its owner's own
 * writes are put in at once (`wrote`, `removed`), so a pass that runs
 * before their watch events arrive does not act twice; an event older than
 * what the copy holds is ignored.
 */
import type { ApiClient } from '../api/client.js';
import type { ApiObject } from '../api/types.js';
import { errorMessage } from '../errors.js';
import { namespacedKey } from '../labels.js';
import type { Logger } from '../log.js';

const RELIST_MS = 500;

/** An object's key in the cache: `namespace/name`, the namespace empty for cluster-scoped kinds. */
export const keyOf = (o: ApiObject): string => namespacedKey(o.metadata.namespace ?? '', o.metadata.name ?? '');

/** One change: `before` absent for an add, `after` absent for a delete; both absent after a (re)list (anything may have changed). */
export interface CacheChange {
  before?: ApiObject;
  after?: ApiObject;
}

function version(o: ApiObject | undefined): number {
  const n = Number(o?.metadata.resourceVersion);
  return Number.isFinite(n) ? n : 0;
}

export class Informer {
  /** namespace/name (namespace empty for cluster objects) → the object. */
  readonly items = new Map<string, ApiObject>();
  private stopWatch: (() => void) | undefined;
  private relistTimer: NodeJS.Timeout | undefined;
  private stopped = false;
  private synced = false;
  /** Keys removed by the owner, until the watch says so too (a late MODIFIED must not bring them back). */
  private readonly gone = new Map<string, number>();

  constructor(
    private readonly client: ApiClient,
    readonly resource: string,
    private readonly onChange: (c: CacheChange) => void,
    private readonly log: Logger,
  ) {}

  /** Resolves once the first list is in. */
  async start(): Promise<void> {
    await this.relist();
  }

  stop(): void {
    this.stopped = true;
    this.stopWatch?.();
    if (this.relistTimer) clearTimeout(this.relistTimer);
  }

  /** The first list is in. */
  hasSynced(): boolean {
    return this.synced;
  }

  list(): ApiObject[] {
    return [...this.items.values()];
  }

  get(namespace: string, name: string): ApiObject | undefined {
    return this.items.get(`${namespace}/${name}`);
  }

  /** The owner wrote this (the API's answer): held now, before its watch event. */
  wrote(o: ApiObject): void {
    const k = keyOf(o);
    if (version(o) >= version(this.items.get(k))) this.items.set(k, o);
    this.gone.delete(k);
  }

  /** The owner removed this for good. */
  removed(o: ApiObject): void {
    const k = keyOf(o);
    this.items.delete(k);
    this.gone.set(k, version(o));
  }

  private async relist(): Promise<void> {
    this.stopWatch?.();
    this.stopWatch = undefined;
    const listed = await this.client.list(this.resource);
    if (this.stopped) return;
    this.items.clear();
    this.gone.clear();
    for (const o of listed.items) this.items.set(keyOf(o), o);
    const w = await this.client.watch(
      this.resource,
      { resourceVersion: listed.resourceVersion },
      (e) => {
        if (e.type !== 'ADDED' && e.type !== 'MODIFIED' && e.type !== 'DELETED') return;
        const k = keyOf(e.object);
        const had = this.items.get(k);
        if (e.type === 'DELETED') {
          if (version(e.object) < version(had)) return;
          this.items.delete(k);
          this.gone.delete(k);
          this.onChange({ before: had ?? e.object });
        } else {
          if (had && version(e.object) <= version(had)) return;
          const goneAt = this.gone.get(k);
          if (goneAt !== undefined && version(e.object) <= goneAt) return;
          this.gone.delete(k);
          this.items.set(k, e.object);
          this.onChange({ ...(had ? { before: had } : {}), after: e.object });
        }
      },
      (reason) => {
        if (this.stopped) return;
        this.log.debug('an informer lost its watch; listing again', { resource: this.resource, reason });
        this.scheduleRelist();
      },
    );
    if (this.stopped) {
      w.stop();
      return;
    }
    this.stopWatch = () => w.stop();
    this.synced = true;
    this.onChange({});
  }

  private scheduleRelist(): void {
    if (this.relistTimer || this.stopped) return;
    this.relistTimer = setTimeout(() => {
      this.relistTimer = undefined;
      this.relist().catch((err) => {
        this.log.warn('an informer could not list again; trying later', { resource: this.resource, error: errorMessage(err) });
        this.scheduleRelist();
      });
    }, RELIST_MS);
    this.relistTimer.unref();
  }
}
