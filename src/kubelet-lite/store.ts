/**
 * Every object read from the manifest directory, by file. The view the agent
 * sees (one object per kind/namespace/name) is recomputed from all files
 * after each file changes and diffed against the last view, so a change is
 * reported once whichever file caused it, and a duplicate takes over when
 * the file that won is deleted. Everything handed out is a copy.
 */
import { createHash } from 'node:crypto';
import type { ConfigMap, Secret } from 'kubernetes-types/core/v1.js';
import { errorMessage } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import type { ManifestProblem, ObjectChange, ObjectLookup, StoredObject } from './model.js';
import type { ParsedObject } from './manifests.js';
import { API_SOURCE_FILE } from '../stored-object.js';
import { skippedMessage, skipReason, type ManifestKind } from './skipped-kinds.js';
import { normalizeSecret } from './validate.js';

/** New problems logged on one change of the files, at most; the rest are counted in one line. */
const MAX_LOGGED_PER_CHANGE = 20;

export type ChangeListener = (changes: ObjectChange[]) => void;

/** What one file contributes; a file that could not be read has only problems. */
export interface FileContent {
  objects: ParsedObject[];
  problems: ManifestProblem[];
}

export function objectKey(kind: string, namespace: string, name: string): string {
  return `${kind}/${namespace}/${name}`;
}

/** JSON with sorted keys: the same object written differently (key order, YAML vs JSON) hashes the same. */
function canonicalJson(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonicalJson).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const entries = Object.keys(v)
      .sort()
      .filter((k) => (v as Record<string, unknown>)[k] !== undefined)
      .map((k) => `${JSON.stringify(k)}:${canonicalJson((v as Record<string, unknown>)[k])}`);
    return `{${entries.join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/**
 * A UUID-shaped hash of the node, the object's identity and its content.
 * As for the kubelet's static pods, a uid in the manifest is ignored: an
 * edited pod gets a new uid and is replaced.
 */
export function objectUid(nodeName: string, kind: string, namespace: string, name: string, object: Record<string, unknown>): string {
  let content = object;
  const meta = object.metadata;
  if (meta && typeof meta === 'object' && !Array.isArray(meta) && 'uid' in meta) {
    const { uid: _ignored, ...rest } = meta as Record<string, unknown>;
    content = { ...object, metadata: rest };
  }
  const h = createHash('sha256').update(`${nodeName}\0${kind}\0${namespace}\0${name}\0${canonicalJson(content)}`).digest('hex');
  // Version nibble 8 (RFC 9562 custom) and the RFC variant bits, so it parses as a UUID anywhere.
  const variant = ((parseInt(h[16]!, 16) & 0x3) | 0x8).toString(16);
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-8${h.slice(13, 16)}-${variant}${h.slice(17, 20)}-${h.slice(20, 32)}`;
}

export interface ObjectStoreOptions {
  nodeName: string;
  log?: Logger;
  /**
   * The kinds the node serves or runs: an object of any other kind is kept
   * but named in the problems as skipped, with the reason. None: nothing is
   * called skipped (a proxy alone reads only what it needs).
   */
  actsOn?: () => ReadonlyArray<ManifestKind>;
}

export class ObjectStore implements ObjectLookup {
  private readonly nodeName: string;
  private readonly log: Logger;
  /** `unread`: why the file's last read failed, while the objects of the read before still stand. */
  private readonly files = new Map<string, { objects: StoredObject[]; problems: ManifestProblem[]; unread?: ManifestProblem }>();
  private view = new Map<string, StoredObject>();
  private duplicateProblems: ManifestProblem[] = [];
  /** The node API's copies of file objects, with what its controllers set on them (see ObjectSource.amends). */
  private amendments = new Map<string, StoredObject>();
  private skippedProblems: ManifestProblem[] = [];
  private readonly actsOn: (() => ReadonlyArray<ManifestKind>) | undefined;
  /** The problems already in the log, so each is logged once while it lasts. */
  private logged = new Set<string>();
  private readonly listeners = new Set<ChangeListener>();

  constructor(opts: ObjectStoreOptions) {
    this.nodeName = opts.nodeName;
    this.log = opts.log ?? silentLogger;
    this.actsOn = opts.actsOn;
  }

  /** Sets what `file` defines now; returns (and tells listeners) what changed in the view. */
  replaceFile(file: string, content: FileContent): ObjectChange[] {
    const objects = content.objects.map((o) => ({
      apiVersion: o.apiVersion,
      kind: o.kind,
      namespace: o.namespace,
      name: o.name,
      uid: o.uid ?? objectUid(this.nodeName, o.kind, o.namespace, o.name, o.object),
      object: structuredClone(o.object),
      source: { ...o.source },
      ...(o.revision !== undefined ? { revision: o.revision } : {}),
    }));
    const before = JSON.stringify(this.problems());
    this.files.set(file, { objects, problems: content.problems.map((p) => ({ ...p })) });
    return this.recompute(before);
  }

  /**
   * `file` could not be read just now (an I/O error, the parser gave up):
   * that says nothing about its content, so what it defined stays as it is,
   * and `problem` is shown beside the file's own problems until the next
   * replaceFile or removeFile. A file the store has no objects from gets
   * only the problem, as replaceFile would give it.
   */
  keepFile(file: string, problem: ManifestProblem): ObjectChange[] {
    const f = this.files.get(file);
    if (!f || f.objects.length === 0) return this.replaceFile(file, { objects: [], problems: [problem] });
    const before = JSON.stringify(this.problems());
    const n = f.objects.length;
    f.unread = { ...problem, reason: `${problem.reason}; keeping the ${n === 1 ? 'object' : `${n} objects`} it defined when last read` };
    return this.recompute(before);
  }

  /** Forgets `file` (deleted or renamed away); an object it won may pass to a duplicate in another file. */
  removeFile(file: string): ObjectChange[] {
    const before = JSON.stringify(this.problems());
    if (!this.files.delete(file)) return [];
    return this.recompute(before);
  }

  /** The files the store has content for, sorted. */
  fileNames(): string[] {
    return [...this.files.keys()].sort(compareNames);
  }

  get(kind: string, namespace: string, name: string): StoredObject | undefined {
    const key = objectKey(kind, namespace, name);
    let o = this.view.get(key);
    const a = this.amendments.get(key);
    if (o && a && a.source.amends === o.source.file) o = a;
    return o && structuredClone(o);
  }

  list(kind?: string): StoredObject[] {
    const out: StoredObject[] = [];
    for (const o of this.view.values()) if (kind === undefined || o.kind === kind) out.push(structuredClone(o));
    return out;
  }

  configMap(namespace: string, name: string): ConfigMap | undefined {
    const o = this.view.get(objectKey('ConfigMap', namespace, name));
    if (!o || o.apiVersion !== 'v1') return undefined;
    const cm = structuredClone(o.object) as ConfigMap & Record<string, unknown>;
    cm.metadata = { ...(cm.metadata ?? {}), namespace: o.namespace, uid: o.uid };
    if (cm.data === undefined || cm.data === null) cm.data = {};
    return cm;
  }

  /** The Secret as the API would return it: `data` base64, `stringData` merged into it, type Opaque by default. */
  secret(namespace: string, name: string): Secret | undefined {
    const o = this.view.get(objectKey('Secret', namespace, name));
    if (!o || o.apiVersion !== 'v1') return undefined;
    return normalizeSecret(o);
  }

  /** Every current problem: unreadable files and documents, and duplicates, by file and line. */
  problems(): ManifestProblem[] {
    const all: ManifestProblem[] = [];
    for (const f of this.files.values()) {
      if (f.unread) all.push({ ...f.unread });
      for (const p of f.problems) all.push({ ...p });
    }
    for (const p of this.duplicateProblems) all.push({ ...p });
    for (const p of this.skippedProblems) all.push({ ...p });
    return all.sort((a, b) => compareNames(a.file, b.file) || a.line - b.line);
  }

  /** `listener` is called with the changes of each file event that changed the view; returns an unsubscribe. */
  subscribe(listener: ChangeListener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** `problemsBefore`: the problems before the edit, so that a change of problems alone still tells the listeners (with no object changes). */
  private recompute(problemsBefore: string): ObjectChange[] {
    const next = new Map<string, StoredObject>();
    const amendments = new Map<string, StoredObject>();
    const duplicates: ManifestProblem[] = [];
    for (const file of this.fileNames()) {
      for (const o of this.files.get(file)!.objects) {
        const key = objectKey(o.kind, o.namespace, o.name);
        const winner = next.get(key);
        // The API's copy of a file's object is read in its place (get), but the view, and its changes, stay the file's.
        if (o.source.amends !== undefined) {
          amendments.set(key, o);
          continue;
        }
        if (winner) {
          duplicates.push({
            file,
            line: o.source.line,
            object: key,
            reason: `duplicate of ${key} in file ${winner.source.file} (line ${winner.source.line}); ignored`,
          });
        } else {
          next.set(key, o);
        }
      }
    }
    const changes: ObjectChange[] = [];
    for (const [key, old] of this.view) {
      if (!next.has(key)) changes.push({ type: 'deleted', object: structuredClone(old) });
    }
    for (const [key, o] of next) {
      const old = this.view.get(key);
      if (!old) changes.push({ type: 'added', object: structuredClone(o) });
      else if (old.uid !== o.uid || old.apiVersion !== o.apiVersion || old.revision !== o.revision) changes.push({ type: 'modified', object: structuredClone(o) });
    }
    this.view = next;
    this.amendments = amendments;
    this.duplicateProblems = duplicates;
    this.skippedProblems = this.skipped(next);
    this.logNewProblems();
    if (changes.length > 0 || JSON.stringify(this.problems()) !== problemsBefore) this.emit(changes);
    return changes;
  }

  /** A problem for each object of the view that the node does not act on, with why. */
  private skipped(view: Map<string, StoredObject>): ManifestProblem[] {
    if (!this.actsOn) return [];
    const acts = this.actsOn();
    const reasons = new Map<string, string | undefined>();
    const out: ManifestProblem[] = [];
    for (const [key, o] of view) {
      if (o.source.file === API_SOURCE_FILE) continue; // the API's own objects, handed to the agent
      const k = `${o.apiVersion}\0${o.kind}`;
      if (!reasons.has(k)) reasons.set(k, skipReason(o, acts));
      const why = reasons.get(k);
      if (why !== undefined) out.push({ file: o.source.file, line: o.source.line, object: key, reason: skippedMessage(o.kind, why) });
    }
    return out;
  }

  /** Logs each problem of the files once, when it appears (a skipped object as info, the rest as warnings). */
  private logNewProblems(): void {
    const now = new Set<string>();
    let told = 0;
    let untold = 0;
    const each = (p: ManifestProblem, skipped: boolean) => {
      const key = `${p.file}\0${p.line}\0${p.object ?? ''}\0${p.reason}`;
      now.add(key);
      if (this.logged.has(key)) return;
      if (told >= MAX_LOGGED_PER_CHANGE) {
        untold++;
        return;
      }
      told++;
      const fields = { file: p.file, line: p.line, ...(p.object ? { object: p.object } : {}) };
      if (skipped) this.log.info(p.reason, fields);
      else this.log.warn('manifest problem', { ...fields, reason: p.reason });
    };
    for (const f of this.files.values()) for (const p of f.problems) each(p, false);
    for (const p of this.duplicateProblems) each(p, false);
    for (const p of this.skippedProblems) each(p, true);
    if (untold > 0) this.log.warn('more manifest problems than are logged at once; all of them are on the status port at /manifests', { more: untold });
    this.logged = now;
  }

  private emit(changes: ObjectChange[]): void {
    for (const l of [...this.listeners]) {
      try {
        l(structuredClone(changes));
      } catch (err) {
        // One listener's bug must not hide the change from the others or corrupt the store.
        this.log.error('manifest change listener failed', { error: errorMessage(err) });
      }
    }
  }
}

/** Byte order, as the kubelet's sorted directory listing (not the locale's). */
function compareNames(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
