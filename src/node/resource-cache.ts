/**
 * A local copy of one resource over the ApiClient, kept as a client-go
 * reflector keeps its store: one list, a watch from the list's
 * resourceVersion, a new list when the watch is lost (fell behind, 410).
 * Each change is handed on with the object before and after, so a
 * consumer can enqueue the keys it touches (a pod's old and new labels).
 */
import type { ApiClient } from '../api/client.js';
import type { ApiObject } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';

const RELIST_MS = 500;

export const objectKey = (o: ApiObject): string => `${o.metadata.namespace ?? ''}/${o.metadata.name ?? ''}`;

/** One change: `before` absent for an add, `after` absent for a delete; both absent after a relist (everything may have changed). */
export interface CacheChange {
  before?: ApiObject;
  after?: ApiObject;
}

const version = (o: ApiObject | undefined): number => {
  const n = Number(o?.metadata.resourceVersion);
  return Number.isFinite(n) ? n : 0;
};

export class ResourceCache {
  private readonly items = new Map<string, ApiObject>();
  private stopWatch: (() => void) | undefined;
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private synced = false;

  constructor(
    private readonly client: ApiClient,
    readonly resource: string,
    private readonly onChange: (c: CacheChange) => void,
    private readonly log: Logger,
  ) {}

  /** Resolves once the first list is in. */
  start(): Promise<void> {
    return this.relist();
  }

  stop(): void {
    this.stopped = true;
    this.stopWatch?.();
    clearTimeout(this.timer);
  }

  hasSynced(): boolean {
    return this.synced;
  }

  list(): ApiObject[] {
    return [...this.items.values()];
  }

  get(namespace: string, name: string): ApiObject | undefined {
    return this.items.get(`${namespace}/${name}`);
  }

  private async relist(): Promise<void> {
    this.stopWatch?.();
    this.stopWatch = undefined;
    const listed = await this.client.list(this.resource);
    if (this.stopped) return;
    this.items.clear();
    for (const o of listed.items) this.items.set(objectKey(o), o);
    const w = await this.client.watch(
      this.resource,
      { resourceVersion: listed.resourceVersion },
      (e) => {
        if (e.type !== 'ADDED' && e.type !== 'MODIFIED' && e.type !== 'DELETED') return;
        const k = objectKey(e.object);
        const before = this.items.get(k);
        if (before && version(e.object) < version(before)) return;
        if (e.type === 'DELETED') {
          this.items.delete(k);
          this.onChange({ before });
        } else {
          this.items.set(k, e.object);
          this.onChange({ before, after: e.object });
        }
      },
      (reason) => {
        if (this.stopped) return;
        this.log.debug('lost a watch; listing again', { resource: this.resource, reason });
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
    if (this.timer || this.stopped) return;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.relist().catch((err) => {
        this.log.warn('could not list again; trying later', { resource: this.resource, error: errorMessage(err) });
        this.scheduleRelist();
      });
    }, RELIST_MS);
    this.timer.unref();
  }
}
