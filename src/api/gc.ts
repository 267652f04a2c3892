/**
 * The garbage collector (kube-controller-manager's, over the store in this
 * process): objects whose ownerReferences name owners that are all gone are
 * deleted (background cascading deletion); an owner deleted in the
 * foreground (foregroundDeletion finalizer) stays until its dependents that
 * block it are gone; an owner deleted with the orphan finalizer has its
 * references taken out of its dependents first. Generic over every kind the
 * store serves. Objects a manifest file defines are never written or deleted
 * here; they are only owners.
 *
 * The graph (who references which uid) is kept from the store's change
 * feed; the work is a queue of objects to look at, coalesced, done in
 * batches of bounded time with setImmediate between them, so chains and
 * cycles of any length, or an object with 10,000 owners, never hold the
 * event loop. Everything it acts on is in the stored objects (deletion
 * timestamps and finalizers), so a restart picks up where it stopped.
 */
import type { Logger } from '../log.js';
import { ApiError } from './errors.js';
import { FOREGROUND_FINALIZER, ORPHAN_FINALIZER, ownerRefs, type OwnerRef } from './owners.js';
import type { MetaView, ObjectKey, Store } from './store.js';
import { resourceOf, type Kind, type Obj } from './types.js';

export interface CollectorOptions {
  store: Store;
  log: Logger;
  /** Time a batch may take before the collector yields to the event loop. */
  batchMs?: number;
  /** Dependents an orphaning owner releases per look before it yields. */
  writesPerItem?: number;
  /**
   * Until called (see `ownersShown`), an owner that is not in the store is
   * not yet taken as gone: the manifest files' objects may still be on
   * their way in. False: the store is complete from the start.
   */
  waitForOwners?: boolean;
}

type Key = string;
const SEP = '\u0000';
const keyOf = (at: ObjectKey): Key => `${at.resource}${SEP}${at.namespace}${SEP}${at.name}`;
function atOf(k: Key): ObjectKey {
  const [resource, namespace, name] = k.split(SEP) as [string, string, string];
  return { resource, namespace, name };
}

/** How one reference of a dependent stands. */
type Standing = 'solid' | 'dangling' | 'waiting';

export class GarbageCollector {
  private readonly store: Store;
  private readonly log: Logger;
  private readonly batchMs: number;
  private readonly writesPerItem: number;
  private ownersComplete: boolean;

  /** uid → where the object with it is (every object, file ones too: they own). */
  private readonly byUid = new Map<string, Key>();
  private readonly uidAt = new Map<Key, string>();
  /** An API object's owner uids, each with whether it blocks that owner's foreground deletion. */
  private readonly refsOf = new Map<Key, Map<string, boolean>>();
  /** owner uid → the API objects that reference it, and those that block it. */
  private readonly dependents = new Map<string, Set<Key>>();
  private readonly blockers = new Map<string, Set<Key>>();
  /** Owners being deleted that wait for work here: foregroundDeletion or orphan. */
  private readonly waiting = new Set<Key>();
  private readonly orphaning = new Set<Key>();
  /** A manifest file's object's uids before its file was edited, that dependents still name. */
  private readonly formerUids = new Map<Key, Set<string>>();

  private readonly queue = new Set<Key>();
  private timer: NodeJS.Immediate | undefined;
  private stopped = false;
  private readonly unsubscribe: () => void;
  private idle: Array<() => void> = [];

  constructor(opts: CollectorOptions) {
    this.store = opts.store;
    this.log = opts.log;
    this.batchMs = opts.batchMs ?? 10;
    this.writesPerItem = opts.writesPerItem ?? 50;
    this.ownersComplete = !(opts.waitForOwners ?? false);
    this.unsubscribe = this.store.onChange((type, at) => this.changed(type, at));
    for (const m of this.store.metas()) {
      this.index(m);
      this.queue.add(keyOf(m));
    }
    this.schedule();
  }

  /** The manifest files' objects are all in the store: an owner missing now is gone. */
  ownersShown(): void {
    if (this.ownersComplete) return;
    this.ownersComplete = true;
    for (const k of this.refsOf.keys()) this.queue.add(k);
    this.schedule();
  }

  /** Resolves once the queue is empty (for tests and the bench). */
  settled(): Promise<void> {
    if (this.queue.size === 0) return Promise.resolve();
    return new Promise((r) => this.idle.push(r));
  }

  get pending(): number {
    return this.queue.size;
  }

  stop(): void {
    this.stopped = true;
    this.unsubscribe();
    if (this.timer) clearImmediate(this.timer);
    this.timer = undefined;
    this.queue.clear();
    for (const r of this.idle.splice(0)) r();
  }

  // ------------------------------------------------------------ the graph

  private changed(type: 'ADDED' | 'MODIFIED' | 'DELETED', at: ObjectKey): void {
    const k = keyOf(at);
    const oldRefs = this.refsOf.get(k);
    if (type === 'DELETED') {
      const uid = this.uidAt.get(k);
      this.unindex(k);
      // Owners waiting for it look again; what it owned may now be garbage.
      if (oldRefs) for (const u of oldRefs.keys()) this.wake(u);
      const former = this.formerUids.get(k);
      this.formerUids.delete(k);
      for (const u of [...(uid !== undefined ? [uid] : []), ...(former ?? [])]) for (const d of this.dependents.get(u) ?? []) this.queue.add(d);
    } else {
      const m = this.store.meta(at);
      if (!m) return;
      const wasWaiting = this.waiting.has(k);
      const oldUid = this.uidAt.get(k);
      this.index(m);
      const newRefs = this.refsOf.get(k);
      if (oldRefs) for (const u of oldRefs.keys()) if (!newRefs?.has(u)) this.wake(u);
      if (newRefs) for (const u of newRefs.keys()) this.wake(u);
      // Upstream's "starts waiting for its dependents' deletion": every dependent is looked at.
      if (!wasWaiting && this.waiting.has(k)) for (const d of this.dependents.get(m.uid) ?? []) this.queue.add(d);
      if (oldUid !== undefined && oldUid !== m.uid) for (const d of this.dependents.get(oldUid) ?? []) this.queue.add(d);
      this.queue.add(k);
    }
    this.schedule();
  }

  /** An owner that waits for its dependents (foreground or orphan) looks again. */
  private wake(uid: string): void {
    const owner = this.byUid.get(uid);
    if (owner !== undefined && (this.waiting.has(owner) || this.orphaning.has(owner))) this.queue.add(owner);
  }

  private index(m: MetaView): void {
    const k = keyOf(m);
    const oldUid = this.uidAt.get(k);
    if (oldUid !== undefined && oldUid !== m.uid && this.byUid.get(oldUid) === k) this.byUid.delete(oldUid);
    if (m.file && oldUid !== undefined && oldUid !== m.uid) {
      // Kept only while something still names them (at most what the dependents hold).
      const former = new Set([...(this.formerUids.get(k) ?? []), oldUid].filter((u) => this.dependents.has(u)));
      if (former.size > 0) this.formerUids.set(k, former);
      else this.formerUids.delete(k);
    }
    this.uidAt.set(k, m.uid);
    this.byUid.set(m.uid, k);
    const deleting = m.deletionTimestamp !== undefined;
    if (deleting && m.finalizers.includes(FOREGROUND_FINALIZER)) this.waiting.add(k);
    else this.waiting.delete(k);
    if (deleting && m.finalizers.includes(ORPHAN_FINALIZER)) this.orphaning.add(k);
    else this.orphaning.delete(k);
    // A file's object is nobody's dependent here: it is never deleted or changed by the collector.
    const next = new Map<string, boolean>();
    if (!m.file) for (const r of ownerRefs({ ownerReferences: m.ownerReferences })) next.set(r.uid, (next.get(r.uid) ?? false) || r.blockOwnerDeletion === true);
    const prev = this.refsOf.get(k);
    if (prev) {
      for (const [u, block] of prev) {
        if (next.get(u) === block) continue;
        if (!next.has(u)) drop(this.dependents, u, k);
        if (block) drop(this.blockers, u, k);
      }
    }
    for (const [u, block] of next) {
      if (prev?.get(u) === block) continue;
      add(this.dependents, u, k);
      if (block) add(this.blockers, u, k);
    }
    if (next.size > 0) this.refsOf.set(k, next);
    else this.refsOf.delete(k);
  }

  private unindex(k: Key): void {
    const uid = this.uidAt.get(k);
    if (uid !== undefined && this.byUid.get(uid) === k) this.byUid.delete(uid);
    this.uidAt.delete(k);
    this.waiting.delete(k);
    this.orphaning.delete(k);
    for (const [u, block] of this.refsOf.get(k) ?? []) {
      drop(this.dependents, u, k);
      if (block) drop(this.blockers, u, k);
    }
    this.refsOf.delete(k);
  }

  // ------------------------------------------------------------- the work

  private schedule(): void {
    if (this.stopped || this.timer || this.queue.size === 0) return;
    this.timer = setImmediate(() => this.pump());
  }

  private pump(): void {
    this.timer = undefined;
    const end = performance.now() + this.batchMs;
    while (this.queue.size > 0 && !this.stopped) {
      const k = this.queue.values().next().value as Key;
      this.queue.delete(k);
      try {
        this.process(k);
      } catch (err) {
        // One object that cannot be written (it no longer validates, the store is full) stops only itself.
        this.log.warn('the garbage collector could not handle an object', { object: atOf(k), error: (err as Error).message });
      }
      if (performance.now() >= end) break;
    }
    if (this.queue.size > 0) this.schedule();
    else for (const r of this.idle.splice(0)) r();
  }

  private process(k: Key): void {
    const at = atOf(k);
    const m = this.store.meta(at);
    if (!m || m.file) return;
    const kind = this.store.kind(at.resource);
    if (!kind) return;
    if (m.deletionTimestamp !== undefined) {
      if (m.finalizers.includes(ORPHAN_FINALIZER)) return this.orphan(k, kind, m);
      if (m.finalizers.includes(FOREGROUND_FINALIZER)) return this.finishForeground(kind, m);
      return; // being deleted on its own (a pod stopping, another finalizer): not the collector's
    }
    this.collect(k, kind, m);
  }

  /** Takes the owner's references out of its dependents, some at a time, then its orphan finalizer off. */
  private orphan(k: Key, kind: Kind, m: MetaView): void {
    const deps = [...(this.dependents.get(m.uid) ?? [])].slice(0, this.writesPerItem);
    for (const d of deps) {
      const dm = this.store.meta(atOf(d));
      const dkind = dm && this.store.kind(dm.resource);
      if (!dm || !dkind) continue;
      try {
        this.write(dkind, dm, (o) => setRefs(o, (((o.metadata as Obj).ownerReferences as Obj[] | undefined) ?? []).filter((r) => r?.uid !== m.uid)));
      } catch (err) {
        // Tried again and again it would hold the owner for ever: it is let go of, and the owner goes.
        this.log.warn('the garbage collector could not orphan a dependent', { object: atOf(d), owner: m.uid, error: (err as Error).message });
        drop(this.dependents, m.uid, d);
      }
    }
    if ((this.dependents.get(m.uid)?.size ?? 0) > 0) {
      this.queue.add(k);
      return;
    }
    this.removeFinalizer(kind, m, ORPHAN_FINALIZER);
  }

  /** A foreground owner goes once nothing that blocks it remains. */
  private finishForeground(kind: Kind, m: MetaView): void {
    const blockers = this.blockers.get(m.uid);
    // An object that names itself as its owner does not wait for itself.
    if (blockers && (blockers.size > 1 || (blockers.size === 1 && !blockers.has(keyOf(m))))) return;
    this.removeFinalizer(kind, m, FOREGROUND_FINALIZER);
  }

  /** The dependent side (attemptToDeleteItem): is the object garbage, or are some of its references? */
  private collect(k: Key, kind: Kind, m: MetaView): void {
    const refs = ownerRefs({ ownerReferences: m.ownerReferences });
    if (refs.length === 0) return;
    const standing = new Map<string, Standing>();
    let solid = 0;
    let dangling = 0;
    let waiting = 0;
    for (const r of refs) {
      const s = standing.get(r.uid) ?? this.standing(kind, m, r);
      if (s === undefined) return; // an owner not yet known to be gone: look again once the files are in
      standing.set(r.uid, s);
      if (s === 'solid') solid++;
      else if (s === 'dangling') dangling++;
      else waiting++;
    }
    if (solid > 0) {
      if (dangling === 0 && waiting === 0) return;
      // It stays for its solid owners; the references to the gone and the going are taken out.
      this.write(kind, m, (o) => setRefs(o, ((o.metadata as Obj).ownerReferences as Obj[]).filter((r) => standing.get(String(r?.uid)) === 'solid' || !standing.has(String(r?.uid)))));
      return;
    }
    const ownsAny = (this.dependents.get(m.uid)?.size ?? 0) > 0;
    if (waiting > 0 && ownsAny) {
      // Its owner waits for it and it has dependents of its own: deleted in the foreground too. One of
      // them already waiting for its dependents may be its owner round a cycle: its references stop blocking first.
      for (const d of this.dependents.get(m.uid)!) {
        if (!this.waiting.has(d)) continue;
        this.write(kind, m, (o) => setRefs(o, ((o.metadata as Obj).ownerReferences as Obj[]).map((r) => (r?.blockOwnerDeletion === true ? { ...r, blockOwnerDeletion: false } : r))));
        break;
      }
      this.delete(kind, m, 'Foreground');
      return;
    }
    this.delete(kind, m, undefined);
  }

  /**
   * One reference as the collector sees it: its owner exists and is not
   * going (solid), is gone or was replaced (dangling), or is being deleted
   * in the foreground (waiting); one to a manifest file's object is solid
   * by its name alone. A reference the collector cannot look up
   * (a kind not served, a namespaced owner of a cluster-scoped object) is
   * never taken as gone. Undefined: not known yet.
   */
  private standing(kind: Kind, m: MetaView, r: OwnerRef): Standing | undefined {
    const ownerKind = this.store.kindOf(r.apiVersion, r.kind);
    if (!ownerKind) return 'solid';
    if (ownerKind.namespaced && !kind.namespaced) return 'solid';
    // A namespaced object's owner is in its namespace, or cluster-scoped.
    const owner = this.store.peek({ resource: resourceOf(ownerKind), namespace: ownerKind.namespaced ? m.namespace : '', name: r.name });
    if (!owner) return this.ownersComplete ? 'dangling' : undefined;
    // A manifest file's object gets a new uid with every edit of its file (its uid is a hash of what
    // the file says), yet it is the same object: its dependents stay while its file names it.
    if (owner.uid !== r.uid) return owner.file ? 'solid' : 'dangling';
    if (owner.deletionTimestamp !== undefined && owner.finalizers.includes(FOREGROUND_FINALIZER)) return 'waiting';
    return 'solid';
  }

  private delete(kind: Kind, m: MetaView, policy: 'Foreground' | undefined): void {
    try {
      this.store.delete(kind, m.namespace, m.name, { uid: m.uid, ...(policy ? { propagationPolicy: policy } : {}) });
    } catch (err) {
      if (err instanceof ApiError && (err.reason === 'NotFound' || err.reason === 'Conflict')) return;
      throw err;
    }
  }

  private removeFinalizer(kind: Kind, m: MetaView, finalizer: string): void {
    this.write(kind, m, (o) => {
      const meta = o.metadata as Obj;
      const kept = ((meta.finalizers as string[] | undefined) ?? []).filter((f) => f !== finalizer);
      if (kept.length > 0) meta.finalizers = kept;
      else delete meta.finalizers;
    });
  }

  /** A change to the stored object as it is now (the same uid), through the store's own update. */
  private write(kind: Kind, m: MetaView, change: (o: Obj & { metadata: unknown }) => void): void {
    try {
      this.store.patch(kind, m.namespace, m.name, (cur) => {
        if (cur.metadata.uid !== m.uid) throw new ApiError('Conflict', 'replaced');
        change(cur);
        return cur;
      });
    } catch (err) {
      if (err instanceof ApiError && (err.reason === 'NotFound' || (err.reason === 'Conflict' && err.message === 'replaced'))) return;
      throw err;
    }
  }
}

function setRefs(o: Obj, refs: Obj[]): void {
  const meta = o.metadata as Obj;
  if (refs.length > 0) meta.ownerReferences = refs;
  else delete meta.ownerReferences;
}

function add(m: Map<string, Set<Key>>, u: string, k: Key): void {
  let s = m.get(u);
  if (!s) m.set(u, (s = new Set()));
  s.add(k);
}

function drop(m: Map<string, Set<Key>>, u: string, k: Key): void {
  const s = m.get(u);
  if (!s) return;
  s.delete(k);
  if (s.size === 0) m.delete(u);
}
