/**
 * How the node's parts will talk to the API: one client interface, in the
 * shape client-go gives (get, list, watch from a resourceVersion, create,
 * update, patch, delete). `localClient` serves it from the store in this
 * process; the same interface over HTTPS would let the agent join a real
 * cluster's API server. Watch events arrive asynchronously, never inside the
 * store's write; a consumer that lets more than `maxQueued` pile up is cut
 * off (onClose) and, as a reflector does, lists again.
 */
import { applyPatch, type PatchType } from './patch.js';
import type { DeleteOptions, DeleteResult, ListOptions, ListResult, Store, WriteOptions } from './store.js';
import type { ApiObject, Kind, Obj, WatchEvent } from './types.js';
import { notFound } from './errors.js';

export interface WatchOptions extends ListOptions {
  resourceVersion?: string;
}

export interface ApiClient {
  get(resource: string, namespace: string, name: string): Promise<ApiObject>;
  list(resource: string, opts?: ListOptions): Promise<ListResult>;
  /** Resolves once the watch is running; rejects with Expired (410) for a version too old: list again. */
  watch(resource: string, opts: WatchOptions, onEvent: (e: WatchEvent) => void, onClose?: (reason: string) => void): Promise<{ stop(): void }>;
  create(resource: string, namespace: string, object: Obj, opts?: WriteOptions): Promise<ApiObject>;
  update(resource: string, namespace: string, name: string, object: Obj, opts?: WriteOptions): Promise<ApiObject>;
  patch(resource: string, namespace: string, name: string, type: PatchType, patch: unknown, opts?: WriteOptions): Promise<ApiObject>;
  delete(resource: string, namespace: string, name: string, opts?: DeleteOptions): Promise<DeleteResult>;
}

export function localClient(store: Store, opts: { maxQueued?: number } = {}): ApiClient {
  const maxQueued = opts.maxQueued ?? 1000;
  const kind = (resource: string): Kind => {
    const k = store.kind(resource);
    if (!k) throw notFound('resource', resource);
    return k;
  };
  return {
    get: async (r, ns, name) => store.get(kind(r), ns, name),
    list: async (r, o) => store.list(kind(r), o),
    create: async (r, ns, o, w) => store.create(kind(r), ns, o, w),
    update: async (r, ns, name, o, w) => store.update(kind(r), ns, name, o, w),
    patch: async (r, ns, name, type, p, w) => store.patch(kind(r), ns, name, (cur) => applyPatch(type, cur as Obj, p), w),
    delete: async (r, ns, name, w) => store.delete(kind(r), ns, name, w),
    async watch(r, o, onEvent, onClose) {
      const queue: WatchEvent[] = [];
      let scheduled = false;
      let closed = false;
      const close = (reason: string) => {
        if (closed) return;
        closed = true;
        queue.length = 0;
        stop();
        onClose?.(reason);
      };
      const drain = () => {
        scheduled = false;
        while (!closed && queue.length > 0) onEvent(queue.shift()!);
      };
      let stop: () => void = () => undefined;
      stop = store.watch(kind(r), o, {
        deliver(change, type) {
          if (closed || queue.length >= maxQueued) return false;
          queue.push({ type, object: JSON.parse(change.json) as ApiObject });
          if (!scheduled) {
            scheduled = true;
            setImmediate(drain);
          }
          return true;
        },
        closed: (reason) => setImmediate(() => close(reason)),
      });
      return { stop: () => close('stopped') };
    },
  };
}
