/**
 * Where the proxy learns about Services and pods. The proxier only sees these
 * two small interfaces: standalone, Services come from the manifest store and
 * pods from kubelet-lite's status API (watched over HTTP); inside `skiff node`
 * both are fed in-process.
 */
import http from 'node:http';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { StoredObject } from '../stored-object.js';
import { keyOf as podKey } from '../labels.js';
import type { SliceLike } from './endpoints.js';

/** The Services the proxy programs (StoredObjects of kind Service), and a signal when they change. */
export interface ServiceSource {
  list(): StoredObject[];
  /** Called after any change; the proxier re-reads list(). Returns an unsubscribe function. */
  onChange(listener: () => void): () => void;
}

/** One pod's change: the object before (absent: added) and after (absent: deleted). */
export interface PodChange {
  before?: Pod;
  after?: Pod;
}

/** The pods of this node with their status, and a signal when any changes. */
export interface PodSource {
  list(): Pod[];
  /** Called after changes: with them when the source knows them (the array is the listener's to read, not keep), else without (any pod may have changed). */
  onChange(listener: (changes?: PodChange[]) => void): () => void;
  /** False until the first complete list arrived (kube-proxy waits for its informers likewise); absent = always true. */
  hasSynced?(): boolean;
}

export type PodWatchType = 'ADDED' | 'MODIFIED' | 'DELETED';

/**
 * A Service's EndpointSlices (those labelled kubernetes.io/service-name),
 * for a proxy that reads endpoints as kube-proxy does instead of computing
 * them from pods.
 */
export interface EndpointSliceSource {
  slicesOf(namespace: string, name: string): SliceLike[];
  /** Called with the Services (namespace/name) whose slices changed; none given: any may have. */
  onChange(listener: (services?: string[]) => void): () => void;
  hasSynced?(): boolean;
}


/** A pod map that applies watch events and tells listeners; the base of both pod sources. */
class PodCache implements PodSource {
  protected readonly pods = new Map<string, Pod>();
  private readonly listeners = new Set<(changes?: PodChange[]) => void>();
  /** What apply() changed since the last notify(); undefined after a wholesale replace. */
  private changes: PodChange[] | undefined = [];

  list(): Pod[] {
    return [...this.pods.values()];
  }

  onChange(listener: (changes?: PodChange[]) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  protected apply(type: PodWatchType, pod: Pod): void {
    const key = podKey(pod);
    const before = this.pods.get(key);
    if (type === 'DELETED') {
      this.pods.delete(key);
      if (before) this.changes?.push({ before });
    } else {
      this.pods.set(key, pod);
      this.changes?.push(before ? { before, after: pod } : { after: pod });
    }
  }

  protected replaceAll(pods: Iterable<Pod>): void {
    this.pods.clear();
    for (const p of pods) this.pods.set(podKey(p), p);
    this.changes = undefined;
  }

  protected notify(): void {
    const changes = this.changes;
    this.changes = [];
    for (const l of this.listeners) l(changes);
  }
}

/** What the agent offers in-process (kubelet-lite's Agent.watchPods). */
export interface PodWatcher {
  listPods?(): Pod[];
  watchPods(listener: (type: PodWatchType, pod: Pod) => void): () => void;
}

/** Pods fed straight from an agent in the same process. */
export class InProcessPodSource extends PodCache {
  private readonly stop: () => void;

  constructor(agent: PodWatcher) {
    super();
    if (agent.listPods) this.replaceAll(agent.listPods());
    this.stop = agent.watchPods((type, pod) => {
      this.apply(type, pod);
      this.notify();
    });
  }

  close(): void {
    this.stop();
  }
}

/** Longest watch line accepted: one Pod in JSON; anything longer is a broken or hostile server. */
export const MAX_WATCH_LINE = 4 * 1024 * 1024;

export interface HttpPodSourceOptions {
  /** kubelet-lite's status address, e.g. http://127.0.0.1:10255 */
  url: string;
  log: Logger;
  /** Delay before reconnecting after the stream ends or fails (default 1 s). */
  reconnectMs?: number;
  maxLineBytes?: number;
}

/**
 * Pods from kubelet-lite's `GET /pods?watch=true` stream. The stream starts
 * with every current pod as ADDED, so on each (re)connect the cache is
 * rebuilt from that initial burst: pods deleted while disconnected vanish.
 * Never polls; reconnects after a delay when the stream ends.
 */
export class HttpPodSource extends PodCache {
  private req?: http.ClientRequest;
  private timer?: NodeJS.Timeout;
  private closed = false;
  private synced = false;
  private readonly reconnectMs: number;
  private readonly maxLine: number;

  constructor(private readonly opts: HttpPodSourceOptions) {
    super();
    this.reconnectMs = opts.reconnectMs ?? 1000;
    this.maxLine = opts.maxLineBytes ?? MAX_WATCH_LINE;
  }

  /** True once a watch stream has delivered its initial list. */
  hasSynced(): boolean {
    return this.synced;
  }

  start(): void {
    this.connect();
  }

  close(): void {
    this.closed = true;
    clearTimeout(this.timer);
    this.req?.destroy();
  }

  private connect(): void {
    if (this.closed) return;
    const url = new URL('/pods?watch=true', this.opts.url);
    // A fresh stream replays every pod as ADDED: collect them, then swap the cache once.
    let fresh: Map<string, Pod> | undefined = new Map();
    let settle: NodeJS.Timeout | undefined;
    const commit = () => {
      if (!fresh) return;
      this.replaceAll(fresh.values());
      fresh = undefined;
      this.synced = true;
      this.notify();
    };
    const req = http.get(url, (res) => {
      if (res.statusCode !== 200) {
        this.opts.log.warn('pod watch refused', { url: url.href, status: res.statusCode });
        res.resume();
        req.destroy();
        return;
      }
      res.setEncoding('utf8');
      let buf = '';
      // The initial burst ends when the server pauses; an empty node sends nothing at all.
      settle = setTimeout(commit, 200);
      settle.unref();
      res.on('data', (chunk: string) => {
        buf += chunk;
        let nl: number;
        while ((nl = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, nl).trim();
          buf = buf.slice(nl + 1);
          if (line) this.onLine(line, fresh);
        }
        if (buf.length > this.maxLine) {
          this.opts.log.warn('pod watch line too long; reconnecting', { url: url.href, bytes: buf.length });
          req.destroy();
          return;
        }
        if (fresh) {
          clearTimeout(settle);
          settle = setTimeout(commit, 50);
          settle.unref();
        } else {
          this.notify();
        }
      });
      res.on('end', () => req.destroy());
    });
    this.req = req;
    req.on('error', (err) => {
      if (!this.closed) this.opts.log.debug('pod watch failed', { url: url.href, error: errorMessage(err) });
    });
    req.on('close', () => {
      clearTimeout(settle);
      if (this.closed) return;
      this.timer = setTimeout(() => this.connect(), this.reconnectMs);
      this.timer.unref();
    });
  }

  private onLine(line: string, fresh: Map<string, Pod> | undefined): void {
    let ev: { type?: unknown; object?: unknown };
    try {
      ev = JSON.parse(line) as typeof ev;
    } catch {
      this.opts.log.warn('pod watch sent a line that is not JSON; skipped', { bytes: line.length });
      return;
    }
    const type = ev.type;
    const obj = ev.object as Pod | undefined;
    if ((type !== 'ADDED' && type !== 'MODIFIED' && type !== 'DELETED') || !obj || typeof obj !== 'object' || typeof obj.metadata?.name !== 'string') {
      this.opts.log.warn('pod watch sent an event that is not a pod event; skipped');
      return;
    }
    if (fresh) {
      if (type === 'DELETED') fresh.delete(podKey(obj));
      else fresh.set(podKey(obj), obj);
    } else {
      this.apply(type, obj);
    }
  }
}

/** What the proxy needs of kubelet-lite's ObjectStore (src/kubelet-lite/store.ts). */
export interface ObjectStoreLike {
  list(kind?: string): StoredObject[];
  subscribe(listener: (changes: Array<{ object: StoredObject }>) => void): () => void;
}

/** Services from kubelet-lite's manifest store: standalone, or shared with the agent in `skiff node`. */
export function storeServiceSource(store: ObjectStoreLike): ServiceSource {
  return {
    list: () => store.list('Service'),
    onChange: (listener) =>
      store.subscribe((changes) => {
        if (changes.some((c) => c.object.kind === 'Service')) listener();
      }),
  };
}

/** Services held in memory: for tests, and for callers that feed objects themselves. */
export class MemoryServiceSource implements ServiceSource {
  private readonly items = new Map<string, StoredObject>();
  private readonly listeners = new Set<() => void>();

  list(): StoredObject[] {
    return [...this.items.values()];
  }

  onChange(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  set(obj: StoredObject): void {
    this.items.set(`${obj.namespace}/${obj.name}`, obj);
    for (const l of this.listeners) l();
  }

  delete(namespace: string, name: string): void {
    if (this.items.delete(`${namespace}/${name}`)) for (const l of this.listeners) l();
  }
}

/** Pods held in memory: for tests. */
export class MemoryPodSource extends PodCache {
  set(pod: Pod): void {
    this.apply('MODIFIED', pod);
    this.notify();
  }

  delete(pod: Pod): void {
    this.apply('DELETED', pod);
    this.notify();
  }
}
