/**
 * The generic object store (kube-apiserver's registry.Store): create, get,
 * list, update, delete and watch for every kind, each kind adding only its
 * strategy. One resourceVersion counter for all objects; every committed
 * change is persisted, then published once to the watch cache. Everything
 * runs synchronously between awaits, so a read-modify-write (a patch) is atomic.
 * Objects handed out are copies.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { ApiError, alreadyExists, badRequest, conflict, invalid, notFound, type Cause } from './errors.js';
import { deletionFinalizers, groupOf, ownerCauses, type PropagationOptions } from './owners.js';
import type { Persistence } from './persist.js';
import { parseFieldSelector, parseLabelSelector } from './selectors.js';
import { resourceOf, type ApiObject, type Kind, type Obj } from './types.js';
import { TooManyWatchers, TooOld, WatchCache, type Change, type Watcher, type WatchCacheOptions } from './watch.js';

export interface ListOptions {
  namespace?: string;
  labelSelector?: string;
  fieldSelector?: string;
  limit?: number;
  continue?: string;
}

export interface ListResult {
  items: ApiObject[];
  resourceVersion: string;
  continue?: string;
  remainingItemCount?: number;
}

export interface WriteOptions {
  dryRun?: boolean;
  /** A write to the status subresource: only `status` changes (the kind must have one). */
  status?: boolean;
  /**
   * The metadata.managedFields to store for `next` (after defaults and
   * validation), replacing `prev` (none on create); `given` is what the
   * request's body held there. None: the stored entries stay as they are.
   */
  fields?: (prev: ApiObject | undefined, next: ApiObject, given: unknown) => Obj[] | undefined;
}

export interface DeleteOptions extends WriteOptions, PropagationOptions {
  /** Preconditions as DeleteOptions carries them. */
  uid?: string;
  resourceVersion?: string;
  /** For kinds deleted gracefully (pods): 0 removes at once; none takes the kind's default. */
  gracePeriodSeconds?: number;
}

/** Either gone now, or marked for deletion and waiting for finalizers (or a namespace's contents). */
export type DeleteResult = { removed: true; object: ApiObject } | { removed: false; object: ApiObject };

export interface StoreOptions {
  kinds: Kind[];
  persistence?: Persistence;
  now?: () => number;
  watch?: WatchCacheOptions;
  /** At most this many objects, and bytes of them, in all; a write beyond either is refused. */
  maxObjects?: number;
  maxBytes?: number;
  /**
   * A garbage collector (gc.ts) runs over this store: a delete leaves the
   * foregroundDeletion or orphan finalizer its propagation policy asks for,
   * for the collector to act on. Without one, policies change nothing.
   */
  garbageCollection?: boolean;
}

/** Where an object is, for the store's own parts (the garbage collector): its resource, namespace ('' when cluster-scoped) and name. */
export interface ObjectKey {
  resource: string;
  namespace: string;
  name: string;
}

/** The part of an object's metadata the garbage collector reads, copied. */
export interface MetaView extends ObjectKey {
  uid: string;
  deletionTimestamp?: string;
  finalizers: string[];
  ownerReferences: Obj[];
  /** Who defines it outside the API (a manifest file): never written or deleted through it. */
  file?: string;
}

/** Told synchronously after each committed change; it must only take note (no writes from inside it). */
export type ChangeListener = (type: 'ADDED' | 'MODIFIED' | 'DELETED', at: ObjectKey) => void;

interface Entry {
  object: ApiObject;
  json: string;
  /**
   * Who defines the object outside the API ("the manifest file /etc/…", or
   * the workload whose controller made a pod): readable here, its spec
   * written only there, never in the database.
   */
  file?: string;
}

/** Namespaces that exist from the start and may not be deleted (as the API server keeps them). */
export const SYSTEM_NAMESPACES = ['default', 'kube-system', 'kube-public', 'kube-node-lease'];
const UNDELETABLE = new Set(['default', 'kube-system', 'kube-public']);

const MAX_LIMIT = 500;
/** As the API server's request limit: no stored object is larger than a request may be. */
export const MAX_OBJECT_BYTES = 3 * 1024 * 1024;

export class Store {
  private readonly kinds = new Map<string, Kind>();
  private readonly objects = new Map<string, Map<string, Entry>>();
  private rv: number;
  private readonly cache: WatchCache;
  private readonly persistence?: Persistence;
  private readonly now: () => number;
  private readonly maxObjects: number;
  private readonly maxBytes: number;
  private count = 0;
  private bytes = 0;
  private readonly gc: boolean;
  private readonly listeners = new Set<ChangeListener>();

  constructor(opts: StoreOptions) {
    for (const k of opts.kinds) {
      this.kinds.set(resourceOf(k), k);
      this.objects.set(resourceOf(k), new Map());
    }
    this.persistence = opts.persistence;
    this.now = opts.now ?? Date.now;
    this.maxObjects = opts.maxObjects ?? 20_000;
    this.maxBytes = opts.maxBytes ?? 256 * 1024 * 1024;
    this.gc = opts.garbageCollection ?? false;
    const loaded = opts.persistence?.load() ?? { rv: 0, rows: [] };
    this.rv = loaded.rv;
    for (const row of loaded.rows) {
      const bucket = this.objects.get(row.resource);
      if (!bucket) continue; // a kind this version no longer serves: left in the database
      bucket.set(key(row.namespace, row.name), { object: JSON.parse(row.data) as ApiObject, json: row.data });
      this.count++;
      this.bytes += row.data.length;
    }
    this.cache = new WatchCache(this.rv, opts.watch);
    const namespaces = this.kinds.get('namespaces');
    if (namespaces) {
      for (const name of SYSTEM_NAMESPACES) {
        if (!this.objects.get('namespaces')!.has(key('', name))) this.create(namespaces, '', { apiVersion: 'v1', kind: 'Namespace', metadata: { name } });
      }
    }
  }

  get resourceVersion(): string {
    return String(this.rv);
  }

  get watchers(): number {
    return this.cache.watcherCount;
  }

  kindList(): Kind[] {
    return [...this.kinds.values()];
  }

  /** A kind by its resource: the plural, with its group after a dot for a named group ("deployments.apps"). */
  kind(resource: string): Kind | undefined {
    return this.kinds.get(resource);
  }

  get(kind: Kind, namespace: string, name: string): ApiObject {
    const e = this.entry(kind, namespace, name);
    if (!e) throw notFound(kind.plural, name, kind.group);
    return copy(e);
  }

  list(kind: Kind, opts: ListOptions = {}): ListResult {
    const { entries, ...rest } = this.select(kind, opts);
    return { items: entries.map(copy), ...rest };
  }

  /**
   * A list as the stored JSON of its items, for the server to send without
   * parsing and serialising every object again; `bytes` is their total size.
   */
  listJson(kind: Kind, opts: ListOptions = {}): Omit<ListResult, 'items'> & { items: string[]; bytes: number } {
    const { entries, ...rest } = this.select(kind, opts);
    return { items: entries.map((e) => e.json), bytes: entries.reduce((n, e) => n + e.json.length, 0), ...rest };
  }

  private select(kind: Kind, opts: ListOptions): Omit<ListResult, 'items'> & { entries: Entry[] } {
    const labels = parseLabelSelector(opts.labelSelector);
    const fields = parseFieldSelector(opts.fieldSelector, kind);
    const limit = opts.limit && opts.limit > 0 ? Math.min(opts.limit, MAX_LIMIT) : Infinity;
    let after = '';
    if (opts.continue) {
      try {
        const token = JSON.parse(Buffer.from(opts.continue, 'base64url').toString('utf8')) as { start?: unknown };
        if (typeof token.start !== 'string') throw new Error('no start');
        after = token.start;
      } catch {
        throw badRequest('continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)');
      }
    }
    const ns = kind.namespaced ? opts.namespace : undefined;
    const keys = [...this.objects.get(resourceOf(kind))!.keys()].filter((k) => k > after && (ns === undefined || k.startsWith(`${ns}/`))).sort();
    const entries: Entry[] = [];
    let last = '';
    let i = 0;
    for (; i < keys.length && entries.length < limit; i++) {
      const e = this.objects.get(resourceOf(kind))!.get(keys[i]!)!;
      if (!labels(e.object.metadata.labels) || !fields(e.object)) continue;
      entries.push(e);
      last = keys[i]!;
    }
    const more = i < keys.length && entries.length >= limit;
    return {
      entries,
      resourceVersion: this.resourceVersion,
      ...(more ? { continue: Buffer.from(JSON.stringify({ rv: this.rv, start: last })).toString('base64url') } : {}),
    };
  }

  create(kind: Kind, namespace: string, input: Obj, opts: WriteOptions = {}): ApiObject {
    const o = this.shape(kind, namespace, input);
    const meta = o.metadata;
    const given = meta.managedFields;
    if (!meta.name && typeof meta.generateName === 'string' && meta.generateName !== '') meta.name = `${meta.generateName}${suffix()}`;
    for (const f of ['uid', 'resourceVersion', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'generation', 'creationTimestamp', 'managedFields'] as const) delete meta[f];
    if (kind.status) delete o.status;
    // Before the strategy, as the API server fills it in: a Job's generated selector names it.
    meta.uid = randomUUID();
    kind.prepare?.(o);
    kind.admitCreate?.(o, (resource) => this.stored(resource));
    this.check(kind, o);
    const name = meta.name!;
    if (this.entry(kind, namespace, name)) throw alreadyExists(kind.plural, name);
    if (kind.namespaced) this.checkNamespaceOpen(namespace);
    if (this.count >= this.maxObjects) throw new ApiError('Forbidden', `the node's API holds at most ${this.maxObjects} objects`);
    meta.creationTimestamp = timestamp(this.now());
    if (kind.spec) meta.generation = 1;
    const managed = opts.fields?.(undefined, o, given);
    if (managed) meta.managedFields = managed;
    if (opts.dryRun) return o;
    return this.commit(kind, 'ADDED', o);
  }

  update(kind: Kind, namespace: string, name: string, input: Obj, opts: WriteOptions = {}): ApiObject {
    const old = this.entry(kind, namespace, name);
    if (!old) throw notFound(kind.plural, name, kind.group);
    let o = this.shape(kind, namespace, input);
    // The node's own parts write the status of the objects a file defines, and the fields the kind lets them set; the rest stays the file's.
    if (!opts.status && old.file && !onlyNodeSet(kind, old.object, o)) refuseFileOwned(kind, name, old);
    const given = o.metadata.managedFields;
    if (opts.status) {
      // The status strategy: everything but status (and the precondition) is the stored object's.
      const next = copy(old);
      next.metadata.resourceVersion = o.metadata.resourceVersion;
      if (o.metadata.uid !== undefined) next.metadata.uid = o.metadata.uid;
      if (o.status === undefined) delete next.status;
      else next.status = o.status;
      o = next;
    } else if (kind.status) {
      if (old.object.status === undefined) delete o.status;
      else o.status = structuredClone(old.object.status);
    }
    if (o.metadata.name !== undefined && o.metadata.name !== name) throw badRequest(`the name of the object (${o.metadata.name}) does not match the name on the URL (${name})`);
    o.metadata.name = name;
    const was = old.object.metadata;
    if (o.metadata.resourceVersion !== undefined && o.metadata.resourceVersion !== '' && o.metadata.resourceVersion !== was.resourceVersion) {
      throw conflict(kind.plural, name, 'the object has been modified; please apply your changes to the latest version and try again');
    }
    if (o.metadata.uid !== undefined && o.metadata.uid !== '' && o.metadata.uid !== was.uid) {
      throw conflict(kind.plural, name, `Precondition failed: UID in precondition: ${o.metadata.uid}, UID in object meta: ${was.uid}`);
    }
    for (const f of ['uid', 'creationTimestamp', 'deletionTimestamp', 'deletionGracePeriodSeconds', 'generation'] as const) {
      if (was[f] === undefined) delete o.metadata[f];
      else (o.metadata as Obj)[f] = was[f];
    }
    delete o.metadata.managedFields;
    if (!opts.status) kind.prepare?.(o, old.object);
    this.check(kind, o);
    if (was.deletionTimestamp && !opts.status) {
      const before = new Set(was.finalizers ?? []);
      const added = (o.metadata.finalizers ?? []).filter((f) => !before.has(f));
      if (added.length > 0) throw invalid(kind.kind, name, [{ reason: 'FieldValueForbidden', field: 'metadata.finalizers', message: 'Forbidden: no new finalizers can be added if the object is being deleted' }]);
    }
    if (kind.spec && JSON.stringify(kind.spec(o)) !== JSON.stringify(kind.spec(old.object))) o.metadata.generation = (was.generation ?? 0) + 1;
    const managed = opts.fields ? opts.fields(old.object, o, given) : was.managedFields;
    if (managed) o.metadata.managedFields = managed;
    o.metadata.resourceVersion = was.resourceVersion;
    if (canonical(o) === canonical(old.object)) return copy(old); // a no-op write keeps its resourceVersion
    if (opts.dryRun) return o;
    if (was.deletionTimestamp && (o.metadata.finalizers ?? []).length === 0 && !this.waitsForContents(kind, o) && !opts.status && (!kind.graceful || was.deletionGracePeriodSeconds === 0)) return this.remove(kind, o);
    return this.commit(kind, 'MODIFIED', o, old.object, old.file);
  }

  /** Read, change, write in one step: the patch verbs. `change` gets a copy and returns the new object. */
  patch(kind: Kind, namespace: string, name: string, change: (current: ApiObject) => Obj, opts: WriteOptions = {}): ApiObject {
    const current = this.get(kind, namespace, name);
    const next = change(structuredClone(current));
    const meta = (next.metadata ?? {}) as Obj;
    // A patch that names no resourceVersion applies to the current one; one that does is a precondition.
    if (meta.resourceVersion === undefined || meta.resourceVersion === null) next.metadata = { ...meta, resourceVersion: current.metadata.resourceVersion };
    return this.update(kind, namespace, name, next, opts);
  }

  delete(kind: Kind, namespace: string, name: string, opts: DeleteOptions = {}): DeleteResult {
    const e = this.entry(kind, namespace, name);
    if (!e) throw notFound(kind.plural, name, kind.group);
    // An object shown for its owner may still be deletable through it (a controller's pod is stopped and replaced).
    if (e.file && this.ownedDelete?.(kind, copy(e), opts.dryRun)) return { removed: false, object: copy(e) };
    refuseFileOwned(kind, name, e);
    const was = e.object.metadata;
    if (opts.uid && opts.uid !== was.uid) throw conflict(kind.plural, name, `Precondition failed: UID in precondition: ${opts.uid}, UID in object meta: ${was.uid}`);
    if (opts.resourceVersion && opts.resourceVersion !== was.resourceVersion) {
      throw conflict(kind.plural, name, `Precondition failed: ResourceVersion in precondition: ${opts.resourceVersion}, ResourceVersion in object meta: ${was.resourceVersion}`);
    }
    if (kind.plural === 'namespaces' && UNDELETABLE.has(name)) throw new ApiError('Forbidden', `namespaces "${name}" is forbidden: this namespace may not be deleted`, { name, kind: 'namespaces' });
    const o = copy(e);
    // Graceful deletion (pods): marked with the time it is due, for the node to stop it and then delete it with 0.
    const grace = kind.graceful ? opts.gracePeriodSeconds ?? kind.graceful(o) : 0;
    // The garbage collector's finalizers as the policy asks (only where one runs to remove them).
    const before = Array.isArray(was.finalizers) ? was.finalizers : [];
    const finalizers = this.gc ? deletionFinalizers(before, opts) : before;
    const refinalized = finalizers.length !== before.length || finalizers.some((f, i) => f !== before[i]);
    if (refinalized) {
      if (finalizers.length > 0) o.metadata.finalizers = finalizers;
      else delete o.metadata.finalizers;
    }
    if (kind.graceful && grace > 0) {
      if (opts.dryRun) return { removed: false, object: o };
      const due = this.now() + grace * 1000;
      if (was.deletionTimestamp && Date.parse(was.deletionTimestamp) <= due) {
        return { removed: false, object: refinalized ? this.commit(kind, 'MODIFIED', o, e.object) : o };
      }
      o.metadata.deletionTimestamp = timestamp(due);
      o.metadata.deletionGracePeriodSeconds = grace;
      return { removed: false, object: this.commit(kind, 'MODIFIED', o, e.object) };
    }
    if (kind.graceful && opts.gracePeriodSeconds === 0 && !was.deletionTimestamp) {
      // Removed at once (kubectl delete --force): marked as kube-apiserver's BeforeDelete marks it, so watchers see the grace.
      o.metadata.deletionTimestamp = timestamp(this.now());
      o.metadata.deletionGracePeriodSeconds = 0;
    }
    const waits = finalizers.length > 0 || kind.plural === 'namespaces';
    if (!waits) return opts.dryRun ? { removed: true, object: o } : { removed: true, object: this.remove(kind, o) };
    if (opts.dryRun) return { removed: false, object: o };
    let marked = o;
    if (!was.deletionTimestamp || (kind.graceful && was.deletionGracePeriodSeconds !== 0)) {
      marked.metadata.deletionTimestamp = timestamp(this.now());
      marked.metadata.deletionGracePeriodSeconds = 0;
      if (kind.plural === 'namespaces') marked.status = { ...(marked.status as Obj), phase: 'Terminating' };
      marked = this.commit(kind, 'MODIFIED', marked, e.object);
    } else if (refinalized) marked = this.commit(kind, 'MODIFIED', marked, e.object);
    if (kind.plural === 'namespaces') return this.sweepNamespace(name) ?? { removed: false, object: marked };
    return { removed: false, object: marked };
  }

  deleteCollection(kind: Kind, opts: ListOptions & DeleteOptions): ApiObject[] {
    const { items } = this.list(kind, { namespace: opts.namespace, labelSelector: opts.labelSelector, fieldSelector: opts.fieldSelector });
    const out: ApiObject[] = [];
    for (const o of items) {
      try {
        out.push(this.delete(kind, o.metadata.namespace ?? '', o.metadata.name!, { dryRun: opts.dryRun, propagationPolicy: opts.propagationPolicy, orphanDependents: opts.orphanDependents }).object);
      } catch (err) {
        if (!(err instanceof ApiError && (err.reason === 'NotFound' || err.reason === 'Forbidden' || err.reason === 'Conflict'))) throw err;
      }
    }
    return out;
  }

  /**
   * Starts a watch: from `resourceVersion` (every change after it), or with
   * none or "0" the current objects as ADDED first. Throws Gone (as an
   * ApiError, reason Expired, code 410) for a version the history no longer has.
   */
  watch(kind: Kind, opts: ListOptions & { resourceVersion?: string }, w: Omit<Watcher, 'filter'>): () => void {
    const labels = parseLabelSelector(opts.labelSelector);
    const fields = parseFieldSelector(opts.fieldSelector, kind);
    const watcher: Watcher = { ...w, filter: { resource: resourceOf(kind), namespace: kind.namespaced ? opts.namespace : undefined, matches: (o) => labels(o.metadata.labels) && fields(o) } };
    const rvText = opts.resourceVersion ?? '';
    let from: number;
    if (rvText === '' || rvText === '0') {
      from = this.rv;
      for (const o of this.list(kind, { namespace: opts.namespace, labelSelector: opts.labelSelector, fieldSelector: opts.fieldSelector }).items) {
        if (!w.deliver({ type: 'ADDED', resource: resourceOf(kind), rv: Number(o.metadata.resourceVersion), object: o, json: JSON.stringify(o) }, 'ADDED')) {
          w.closed('the watcher fell behind');
          return () => undefined;
        }
      }
    } else {
      from = Number(rvText);
      if (!/^\d{1,15}$/.test(rvText)) throw badRequest(`invalid resource version "${rvText}"`);
    }
    try {
      return this.cache.add(watcher, from);
    } catch (err) {
      if (err instanceof TooOld) throw new ApiError('Expired', err.message);
      if (err instanceof TooManyWatchers) throw new ApiError('TooManyRequests', err.message);
      throw err;
    }
  }

  /**
   * Shows an object defined outside the API, by a manifest file or by the
   * node's controllers (read-only: writes to its spec are refused, naming
   * `owner`, as "the manifest file /etc/skiff/web.yaml"). An object written
   * through the API under the same name keeps it; false then, and this one
   * is not shown.
   */
  mirror(kind: Kind, input: ApiObject, owner: string): boolean {
    const file = owner;
    const namespace = kind.namespaced ? String(input.metadata?.namespace || 'default') : '';
    const name = String(input.metadata?.name ?? '');
    const old = this.entry(kind, namespace, name);
    if (old && !old.file) return false;
    const o = this.shape(kind, namespace, { ...input, metadata: { ...input.metadata, namespace } });
    if (kind.status) delete o.status;
    kind.prepare?.(o);
    o.metadata.creationTimestamp = old?.object.metadata.creationTimestamp ?? timestamp(this.now());
    if (kind.spec) o.metadata.generation = 1;
    o.metadata.resourceVersion = old?.object.metadata.resourceVersion;
    // The status the node wrote stays, and what its controllers set (a claim's binding); the file says only what it wants.
    if (kind.status && old?.object.status !== undefined) o.status = structuredClone(old.object.status);
    if (old) kind.nodeSet?.(old.object, o);
    if (old && old.file === file && canonical(o) === canonical(old.object)) return true;
    this.commit(kind, old ? 'MODIFIED' : 'ADDED', o, old?.object, file);
    return true;
  }

  /**
   * Asked when a client deletes an object shown for its owner (see mirror):
   * true when the owner takes the deletion (the object stays until the owner
   * removes it); false, and the delete is refused naming the owner. With
   * `dryRun` it only says whether it would.
   */
  ownedDelete: ((kind: Kind, object: ApiObject, dryRun?: boolean) => boolean) | undefined;

  /** Who defines the object outside the API (as given to mirror), or undefined for one written through it. */
  ownerOf(kind: Kind, namespace: string, name: string): string | undefined {
    return this.entry(kind, kind.namespaced ? namespace || 'default' : '', name)?.file;
  }

  /** The file that defined the object no longer does. */
  unmirror(kind: Kind, namespace: string, name: string): void {
    const e = this.entry(kind, kind.namespaced ? namespace || 'default' : '', name);
    if (e?.file) this.remove(kind, copy(e), e.file);
  }

  // ------------------------------------------- for the garbage collector

  /** Told of every committed change from now on, until the returned function is called. */
  onChange(listener: ChangeListener): () => void {
    this.listeners.add(listener);
    return () => void this.listeners.delete(listener);
  }

  /** The kind objects of `apiVersion` and `kind` are (the version aside: one is served per group), as an ownerReference names it. */
  kindOf(apiVersion: string, kindName: string): Kind | undefined {
    const group = groupOf(apiVersion);
    for (const k of this.kinds.values()) if (k.kind === kindName && k.group === group) return k;
    return undefined;
  }

  /** The GC-relevant metadata of one object, copied; undefined when there is none. */
  meta(at: ObjectKey): MetaView | undefined {
    const e = this.objects.get(at.resource)?.get(key(at.namespace, at.name));
    return e ? view(at.resource, e) : undefined;
  }

  /** uid, deletion and finalizers of an object (no references: cheap, for looking at owners). */
  peek(at: ObjectKey): Omit<MetaView, 'ownerReferences'> | undefined {
    const e = this.objects.get(at.resource)?.get(key(at.namespace, at.name));
    if (!e) return undefined;
    const m = e.object.metadata;
    return { ...at, uid: String(m.uid ?? ''), deletionTimestamp: m.deletionTimestamp, finalizers: Array.isArray(m.finalizers) ? [...m.finalizers] : [], ...(e.file ? { file: e.file } : {}) };
  }

  /** Every object's GC-relevant metadata, copied one at a time. */
  *metas(): Generator<MetaView> {
    for (const [resource, bucket] of this.objects) for (const e of [...bucket.values()]) yield view(resource, e);
  }

  close(): void {
    this.listeners.clear();
    this.cache.close();
    this.persistence?.close();
  }

  // ------------------------------------------------------------ internals

  private entry(kind: Kind, namespace: string, name: string): Entry | undefined {
    return this.objects.get(resourceOf(kind))!.get(key(kind.namespaced ? namespace : '', name));
  }

  /** A copy of the input with apiVersion, kind and namespace as the URL says, or BadRequest. */
  private shape(kind: Kind, namespace: string, input: Obj): ApiObject {
    const apiVersion = kind.group ? `${kind.group}/${kind.version}` : kind.version;
    if (input.kind !== undefined && input.kind !== kind.kind) throw badRequest(`the kind of the object (${String(input.kind)}) does not match the resource (${kind.kind})`);
    if (input.apiVersion !== undefined && input.apiVersion !== apiVersion) throw badRequest(`the API version in the data (${String(input.apiVersion)}) does not match the expected API version (${apiVersion})`);
    const o = structuredClone(input) as ApiObject;
    if (typeof o.metadata !== 'object' || o.metadata === null || Array.isArray(o.metadata)) o.metadata = {};
    o.apiVersion = apiVersion;
    o.kind = kind.kind;
    if (kind.namespaced) {
      if (o.metadata.namespace !== undefined && o.metadata.namespace !== '' && o.metadata.namespace !== namespace) {
        throw badRequest('the namespace of the provided object does not match the namespace sent on the request');
      }
      o.metadata.namespace = namespace;
    } else delete o.metadata.namespace;
    return o;
  }

  private check(kind: Kind, o: ApiObject): void {
    let causes: Cause[] = [...kind.validate(o), ...ownerCauses(o.metadata)];
    if (causes.length === 0 && kind.admit) {
      causes = kind.admit(o, (resource) => this.stored(resource));
    }
    if (causes.length > 0) throw invalid(kind.kind, String(o.metadata.name ?? ''), causes, kind.group);
  }

  /** The stored objects of a resource, read-only, for a kind's admission. */
  private stored(resource: string): ApiObject[] {
    return [...(this.objects.get(resource)?.values() ?? [])].map((e) => e.object);
  }

  private checkNamespaceOpen(namespace: string): void {
    const ns = this.objects.get('namespaces')?.get(key('', namespace));
    if (!ns) throw notFound('namespaces', namespace);
    if (ns.object.metadata.deletionTimestamp) {
      throw new ApiError('Forbidden', `unable to create new content in namespace ${namespace} because it is being terminated`, { name: namespace, kind: 'namespaces' });
    }
  }

  private commit(kind: Kind, type: 'ADDED' | 'MODIFIED', o: ApiObject, prev?: ApiObject, file?: string): ApiObject {
    const rv = this.rv + 1;
    o.metadata.resourceVersion = String(rv);
    const json = JSON.stringify(o);
    if (json.length > MAX_OBJECT_BYTES) throw new ApiError('RequestEntityTooLarge', `the object is larger than the ${MAX_OBJECT_BYTES} bytes an object may be`);
    const ns = kind.namespaced ? o.metadata.namespace! : '';
    const bucket = this.objects.get(resourceOf(kind))!;
    const k = key(ns, o.metadata.name!);
    const before = bucket.get(k);
    const grows = file ? 0 : json.length - (before && !before.file ? before.json.length : 0);
    if (grows > 0 && this.bytes + grows > this.maxBytes) throw new ApiError('Forbidden', `the node's API holds at most ${this.maxBytes} bytes of objects`);
    if (file) this.persistence?.count(rv);
    else this.persistence?.put({ resource: resourceOf(kind), namespace: ns, name: o.metadata.name!, data: json }, rv);
    this.rv = rv;
    this.bytes += grows;
    if (!before && !file) this.count++;
    bucket.set(k, { object: o, json, file });
    this.cache.publish({ type, resource: resourceOf(kind), rv, object: o, json, prev });
    this.tell(type, resourceOf(kind), ns, o.metadata.name!);
    return JSON.parse(json) as ApiObject;
  }

  private remove(kind: Kind, o: ApiObject, file?: string): ApiObject {
    const rv = this.rv + 1;
    const ns = kind.namespaced ? o.metadata.namespace! : '';
    if (file) this.persistence?.count(rv);
    else this.persistence?.remove(resourceOf(kind), ns, o.metadata.name!, rv);
    this.rv = rv;
    const gone = this.objects.get(resourceOf(kind))!.get(key(ns, o.metadata.name!));
    this.objects.get(resourceOf(kind))!.delete(key(ns, o.metadata.name!));
    if (!file) {
      this.count--;
      this.bytes -= gone?.json.length ?? 0;
    }
    o.metadata.resourceVersion = String(rv);
    const json = JSON.stringify(o);
    this.cache.publish({ type: 'DELETED', resource: resourceOf(kind), rv, object: o, json } satisfies Change);
    this.tell('DELETED', resourceOf(kind), ns, o.metadata.name!);
    if (kind.namespaced) this.sweepNamespace(ns);
    return JSON.parse(json) as ApiObject;
  }

  private tell(type: 'ADDED' | 'MODIFIED' | 'DELETED', resource: string, namespace: string, name: string): void {
    for (const l of this.listeners) l(type, { resource, namespace, name });
  }

  private waitsForContents(kind: Kind, o: ApiObject): boolean {
    return kind.plural === 'namespaces' && this.contents(o.metadata.name!).length > 0;
  }

  private contents(namespace: string): Array<{ kind: Kind; name: string }> {
    const out: Array<{ kind: Kind; name: string }> = [];
    for (const kind of this.kinds.values()) {
      if (!kind.namespaced) continue;
      // A manifest file's objects are not the API's to delete: the namespace goes without them.
      for (const [k, e] of this.objects.get(resourceOf(kind))!) if (k.startsWith(`${namespace}/`) && !e.file) out.push({ kind, name: k.slice(namespace.length + 1) });
    }
    return out;
  }

  /**
   * The namespace controller's work, done in place: a terminating namespace's
   * objects are deleted (those with finalizers wait for them), and the
   * namespace goes once it is empty and has no finalizers of its own.
   */
  private readonly sweeping = new Set<string>();
  private sweepNamespace(namespace: string): DeleteResult | undefined {
    const e = this.objects.get('namespaces')?.get(key('', namespace));
    if (!e || !e.object.metadata.deletionTimestamp || this.sweeping.has(namespace)) return undefined;
    this.sweeping.add(namespace);
    try {
      for (const { kind, name } of this.contents(namespace)) {
        const o = this.entry(kind, namespace, name);
        if (o && !o.object.metadata.deletionTimestamp) this.delete(kind, namespace, name);
      }
    } finally {
      this.sweeping.delete(namespace);
    }
    const now = this.objects.get('namespaces')!.get(key('', namespace));
    if (!now) return undefined;
    if (this.contents(namespace).length > 0 || (now.object.metadata.finalizers ?? []).length > 0) return { removed: false, object: copy(now) };
    return { removed: true, object: this.remove(this.kinds.get('namespaces')!, copy(now)) };
  }
}

/** Whether `next` differs from the stored `was` only in the fields the kind's nodeSet lets the node's controllers set. */
function onlyNodeSet(kind: Kind, was: ApiObject, next: ApiObject): boolean {
  if (!kind.nodeSet) return false;
  const expected = structuredClone(was);
  kind.nodeSet(next, expected);
  const what = (o: ApiObject) => {
    const { status: _status, metadata, ...rest } = o;
    const { labels, annotations, finalizers, ownerReferences } = metadata;
    return canonical({ ...rest, metadata: { labels, annotations, finalizers, ownerReferences } });
  };
  return what(next) === what(expected);
}

function refuseFileOwned(kind: Kind, name: string, e: Entry): void {
  if (e.file) throw new ApiError('Conflict', `${kind.plural} "${name}" is defined by ${e.file}: change or remove it there`, { name, kind: kind.plural });
}

function key(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

function view(resource: string, e: Entry): MetaView {
  const m = e.object.metadata;
  return {
    resource,
    namespace: m.namespace ?? '',
    name: m.name ?? '',
    uid: String(m.uid ?? ''),
    deletionTimestamp: m.deletionTimestamp,
    finalizers: Array.isArray(m.finalizers) ? [...m.finalizers] : [],
    ownerReferences: Array.isArray(m.ownerReferences) ? m.ownerReferences.map((r) => ({ ...r })) : [],
    ...(e.file ? { file: e.file } : {}),
  };
}

function copy(e: Entry): ApiObject {
  return JSON.parse(e.json) as ApiObject;
}

/** RFC 3339 to the second, as metav1.Time marshals. */
export function timestamp(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

function suffix(): string {
  const alphabet = 'bcdfghjklmnpqrstvwxz2456789';
  return [...randomBytes(5)].map((b) => alphabet[b % alphabet.length]).join('');
}

/** JSON with sorted keys, to see whether an update changes anything. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    return `{${Object.keys(v)
      .filter((k) => (v as Obj)[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical((v as Obj)[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}
