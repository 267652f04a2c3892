/**
 * metadata.managedFields: which field manager owns which fields, as
 * structured-merge-diff keeps it. A FieldSet is a tree of path elements in
 * the FieldsV1 spelling ("f:spec", "k:{\"name\":\"web\"}", "v:\"a\"",
 * "i:0"), each node a member or only a parent of members. Here: the sets an
 * object's fields make, the difference two versions make (what an Update
 * takes), the entries' wire form, and the tracker the store calls on every
 * create and update to record the writer's manager.
 */
import { ApiError, badRequest, invalid } from './errors.js';
import { fieldType, listKind, type FieldType } from './list-types.js';
import type { ApiObject, Obj } from './types.js';

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export class FieldSet {
  member = false;
  readonly children = new Map<string, FieldSet>();

  static of(paths: string[][]): FieldSet {
    const s = new FieldSet();
    for (const p of paths) s.insert(p);
    return s;
  }

  insert(path: string[]): void {
    let n: FieldSet = this;
    for (const pe of path) {
      let c = n.children.get(pe);
      if (!c) n.children.set(pe, (c = new FieldSet()));
      n = c;
    }
    if (path.length > 0) n.member = true;
  }

  at(path: string[]): FieldSet | undefined {
    let n: FieldSet | undefined = this;
    for (const pe of path) n = n?.children.get(pe);
    return n;
  }

  has(path: string[]): boolean {
    return this.at(path)?.member === true;
  }

  get empty(): boolean {
    return !this.member && this.children.size === 0;
  }

  union(o: FieldSet): FieldSet {
    const out = this.clone();
    merge(out, o);
    return out;
  }

  /** Members of this set that are not members of `o` (node by node, as structured-merge-diff's Difference). */
  difference(o: FieldSet): FieldSet {
    const out = new FieldSet();
    out.member = this.member && !o.member;
    for (const [pe, c] of this.children) {
      const oc = o.children.get(pe);
      const d = oc ? c.difference(oc) : c.clone();
      if (!d.empty) out.children.set(pe, d);
    }
    return out;
  }

  intersection(o: FieldSet): FieldSet {
    const out = new FieldSet();
    out.member = this.member && o.member;
    for (const [pe, c] of this.children) {
      const oc = o.children.get(pe);
      if (!oc) continue;
      const i = c.intersection(oc);
      if (!i.empty) out.children.set(pe, i);
    }
    return out;
  }

  /** This set without the subtrees rooted at members of `o` (RecursiveDifference). */
  without(o: FieldSet): FieldSet {
    const out = new FieldSet();
    out.member = this.member;
    for (const [pe, c] of this.children) {
      const oc = o.children.get(pe);
      if (oc?.member) continue;
      const d = oc ? c.without(oc) : c.clone();
      if (!d.empty) out.children.set(pe, d);
    }
    return out;
  }

  /** Only the subtree under `pe` (kept at its place). */
  only(pe: string): FieldSet {
    const out = new FieldSet();
    const c = this.children.get(pe);
    if (c) out.children.set(pe, c.clone());
    return out;
  }

  clone(): FieldSet {
    const out = new FieldSet();
    out.member = this.member;
    for (const [pe, c] of this.children) out.children.set(pe, c.clone());
    return out;
  }

  /** Every member's path, in the set's order. */
  paths(prefix: string[] = [], out: string[][] = []): string[][] {
    for (const pe of sortedKeys(this.children)) {
      const c = this.children.get(pe)!;
      const p = [...prefix, pe];
      if (c.member) out.push(p);
      c.paths(p, out);
    }
    return out;
  }

  equals(o: FieldSet): boolean {
    return this.difference(o).empty && o.difference(this).empty;
  }

  /** The FieldsV1 object: a member with children also holds "." . */
  toJSON(): Obj {
    const out: Obj = {};
    if (this.member && this.children.size > 0) out['.'] = {};
    for (const pe of sortedKeys(this.children)) out[pe] = this.children.get(pe)!.toJSON();
    return out;
  }

  static fromJSON(v: unknown, budget = { nodes: 100_000 }): FieldSet {
    const s = new FieldSet();
    if (!isObj(v)) throw new Error('fieldsV1 must be an object');
    for (const [pe, c] of Object.entries(v)) {
      if (--budget.nodes < 0) throw new Error('fieldsV1 has too many fields');
      if (pe === '.') {
        s.member = true;
        continue;
      }
      if (!/^[fkvi]:/.test(pe)) throw new Error(`invalid path element ${JSON.stringify(pe)}`);
      const child = FieldSet.fromJSON(c, budget);
      if (child.children.size === 0) child.member = true;
      s.children.set(pe, child);
    }
    return s;
  }
}

function merge(into: FieldSet, o: FieldSet): void {
  into.member ||= o.member;
  for (const [pe, c] of o.children) {
    const mine = into.children.get(pe);
    if (mine) merge(mine, c);
    else into.children.set(pe, c.clone());
  }
}

/** Path elements in structured-merge-diff's order: fields, then keys, then values, then indexes. */
function sortedKeys(m: Map<string, FieldSet>): string[] {
  const rank = (pe: string) => 'fkvi'.indexOf(pe[0]!);
  return [...m.keys()].sort((a, b) => rank(a) - rank(b) || (a < b ? -1 : a > b ? 1 : 0));
}

// ------------------------------------------------------------ path elements

export const field = (name: string): string => `f:${name}`;

/** The element naming one item of a list of kind `t`, or undefined for an atomic list. */
export function itemElement(t: FieldType | undefined, item: unknown, index: number): string | undefined {
  const lk = listKind(t);
  if (lk === 'atomic') return undefined;
  if (lk === 'set') return `v:${JSON.stringify(item)}`;
  const key: Obj = {};
  for (const k of [...lk.keys].sort()) {
    const v = isObj(item) && item[k] !== undefined ? item[k] : lk.defaults?.[k];
    if (v !== undefined) key[k] = v;
  }
  return Object.keys(key).length > 0 ? `k:${JSON.stringify(key)}` : `i:${index}`;
}

/** A path as the API's messages print it: `.spec.containers[name="web"].image`. */
export function pathString(path: string[]): string {
  return path
    .map((pe) => {
      const body = pe.slice(2);
      switch (pe[0]) {
        case 'f':
          return `.${body}`;
        case 'k': {
          const key = JSON.parse(body) as Obj;
          return `[${Object.entries(key).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(',')}]`;
        }
        case 'v':
          return `[=${body}]`;
        default:
          return `[${body}]`;
      }
    })
    .join('');
}

// ------------------------------------------------------------ sets of values

/** The fields a value sets (structured-merge-diff's ToFieldSet): its leaves, list items, empty maps, atomic values. */
export function fieldSetOf(v: unknown, t: FieldType | undefined, out = new FieldSet(), path: string[] = []): FieldSet {
  if (isObj(v)) {
    if (t?.atomic) {
      if (path.length > 0) out.insert(path);
      return out;
    }
    for (const [k, c] of Object.entries(v)) {
      const sub = [...path, field(k)];
      const ct = fieldType(t, k);
      fieldSetOf(c, ct, out, sub);
      if (c === null || (isObj(c) && Object.keys(c).length === 0) || (t?.values !== undefined && !t.fields?.[k])) out.insert(sub);
    }
    return out;
  }
  if (Array.isArray(v)) {
    if (listKind(t) === 'atomic') {
      out.insert(path);
      return out;
    }
    v.forEach((item, i) => {
      const sub = [...path, itemElement(t, item, i)!];
      fieldSetOf(item, t?.items, out, sub);
      out.insert(sub);
    });
    return out;
  }
  if (path.length > 0) out.insert(path);
  return out;
}

export interface Comparison {
  added: FieldSet;
  modified: FieldSet;
  removed: FieldSet;
}

/** What changed from `a` to `b`, field by field (structured-merge-diff's Compare). */
export function compare(a: unknown, b: unknown, t: FieldType | undefined): Comparison {
  const c: Comparison = { added: new FieldSet(), modified: new FieldSet(), removed: new FieldSet() };
  walk(a, b, t, [], c);
  return c;
}

function walk(a: unknown, b: unknown, t: FieldType | undefined, path: string[], c: Comparison): void {
  if (a === undefined && b === undefined) return;
  const mapA = isObj(a) && !t?.atomic;
  const mapB = isObj(b) && !t?.atomic;
  const listA = Array.isArray(a) && listKind(t) !== 'atomic';
  const listB = Array.isArray(b) && listKind(t) !== 'atomic';
  if ((mapA || a === undefined) && (mapB || b === undefined) && (mapA || mapB)) {
    if (path.length > 0 && !t?.value) {
      if (a === undefined) c.added.insert(path);
      else if (b === undefined) c.removed.insert(path);
    }
    const ao = (a ?? {}) as Obj;
    const bo = (b ?? {}) as Obj;
    for (const k of new Set([...Object.keys(ao), ...Object.keys(bo)])) walk(ao[k], bo[k], fieldType(t, k), [...path, field(k)], c);
    return;
  }
  if ((listA || a === undefined) && (listB || b === undefined) && (listA || listB)) {
    const index = (l: unknown) => {
      const m = new Map<string, unknown>();
      (Array.isArray(l) ? l : []).forEach((x, i) => {
        const pe = itemElement(t, x, i)!;
        if (!m.has(pe)) m.set(pe, x);
      });
      return m;
    };
    const ia = index(a);
    const ib = index(b);
    for (const pe of new Set([...ia.keys(), ...ib.keys()])) {
      const sub = [...path, pe];
      const x = ia.get(pe);
      const y = ib.get(pe);
      if (!ia.has(pe)) c.added.insert(sub);
      else if (!ib.has(pe)) c.removed.insert(sub);
      if (listKind(t) !== 'set') walk(x, y, t?.items, sub, c);
    }
    return;
  }
  if (path.length === 0) return;
  if (a === undefined) c.added.insert(path);
  else if (b === undefined) c.removed.insert(path);
  else if (JSON.stringify(a) !== JSON.stringify(b)) c.modified.insert(path);
}

// ------------------------------------------------------------ entries

export type Operation = 'Apply' | 'Update';

export interface ManagerEntry {
  manager: string;
  operation: Operation;
  apiVersion: string;
  time?: string;
  subresource?: string;
  set: FieldSet;
}

/** A manager's identity, as the API server keys them: an Update's apiVersion counts, an Apply's does not. */
export function identity(e: Pick<ManagerEntry, 'manager' | 'operation' | 'apiVersion' | 'subresource'>): string {
  return JSON.stringify([e.manager, e.operation, e.operation === 'Update' ? e.apiVersion : '', e.subresource ?? '']);
}

/** Never owned by anyone (the API server's stripped fields). */
export const IGNORED = FieldSet.of([
  ['f:apiVersion'],
  ['f:kind'],
  ['f:metadata', 'f:name'],
  ['f:metadata', 'f:namespace'],
  ['f:metadata', 'f:creationTimestamp'],
  ['f:metadata', 'f:selfLink'],
  ['f:metadata', 'f:uid'],
  ['f:metadata', 'f:generation'],
  ['f:metadata', 'f:managedFields'],
  ['f:metadata', 'f:resourceVersion'],
  ['f:metadata', 'f:deletionTimestamp'],
  ['f:metadata', 'f:deletionGracePeriodSeconds'],
]);

export const MAX_MANAGER_LENGTH = 128;
/** As the API server: at most this many Update entries; the oldest merge into "ancient-changes". */
export const MAX_UPDATE_MANAGERS = 10;
const MAX_ENTRIES = 1000;

/** fieldManager as the request options validate it: 422 naming `options` ("PatchOptions"). */
export function checkManager(name: string, options: string): void {
  const problem = name.length > MAX_MANAGER_LENGTH ? `Too long: may not be more than ${MAX_MANAGER_LENGTH} bytes` : /[\p{C}]/u.test(name) ? `Invalid value: ${JSON.stringify(name)}: invalid character` : undefined;
  if (problem) throw optionsInvalid(options, [{ reason: 'FieldValueInvalid', field: 'fieldManager', message: problem }]);
}

export function optionsInvalid(options: string, causes: Array<{ reason: string; field: string; message: string }>): ApiError {
  const e = invalid(`${options}.meta.k8s.io`, '', causes);
  return new ApiError('Invalid', e.message, { group: 'meta.k8s.io', kind: options, causes });
}

/** The manager of a request that names none: the User-Agent up to its first "/", printable, at most 128 characters. */
export function managerFromUserAgent(ua: string | undefined): string {
  let out = '';
  for (const ch of (ua ?? '').split('/')[0]!) {
    if (/\p{C}/u.test(ch)) continue;
    if (out.length + ch.length > MAX_MANAGER_LENGTH) break;
    out += ch;
  }
  return out;
}

/** The entries of `list` (metadata.managedFields), or an ApiError for a malformed one. */
export function decodeEntries(list: unknown, at = 'metadata.managedFields'): ManagerEntry[] {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) throw badRequest(`${at} must be a list`);
  if (list.length > MAX_ENTRIES) throw new ApiError('RequestEntityTooLarge', `${at} may hold at most ${MAX_ENTRIES} entries`);
  const budget = { nodes: 100_000 };
  return list.map((raw, i) => {
    const where = `${at}[${i}]`;
    if (!isObj(raw)) throw badRequest(`${where} must be an object`);
    const e = raw;
    if (e.operation !== 'Apply' && e.operation !== 'Update') throw invalidEntry(`${where}.operation`, e.operation, 'must be `Apply` or `Update`');
    if (e.fieldsType !== undefined && e.fieldsType !== '' && e.fieldsType !== 'FieldsV1') throw invalidEntry(`${where}.fieldsType`, e.fieldsType, 'must be `FieldsV1`');
    const manager = typeof e.manager === 'string' ? e.manager : '';
    if (manager.length > MAX_MANAGER_LENGTH) throw invalidEntry(`${where}.manager`, manager, `must be at most ${MAX_MANAGER_LENGTH} characters`);
    let set: FieldSet;
    try {
      set = e.fieldsV1 === undefined || e.fieldsV1 === null ? new FieldSet() : FieldSet.fromJSON(e.fieldsV1, budget);
    } catch (err) {
      throw invalidEntry(`${where}.fieldsV1`, '', (err as Error).message);
    }
    const subresource = typeof e.subresource === 'string' && e.subresource !== '' ? e.subresource : undefined;
    if (subresource && subresource.length > 256) throw invalidEntry(`${where}.subresource`, subresource, 'must be at most 256 characters');
    return { manager, operation: e.operation, apiVersion: typeof e.apiVersion === 'string' ? e.apiVersion : '', time: typeof e.time === 'string' ? e.time : undefined, subresource, set };
  });
}

function invalidEntry(fieldPath: string, value: unknown, why: string): ApiError {
  return new ApiError('Invalid', `${fieldPath}: Invalid value: ${JSON.stringify(value)}: ${why}`, { causes: [{ reason: 'FieldValueInvalid', field: fieldPath, message: `Invalid value: ${JSON.stringify(value)}: ${why}` }] });
}

/** The wire form, sorted as the API server sorts it (Apply first, then by time, manager, version, subresource). */
export function encodeEntries(entries: ManagerEntry[]): Obj[] | undefined {
  const kept = entries.filter((e) => !e.set.empty);
  if (kept.length === 0) return undefined;
  const secs = (t?: string) => (t ? Math.floor(Date.parse(t) / 1000) || 0 : 0);
  const cmp = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);
  kept.sort((a, b) => cmp(a.operation, b.operation) || secs(a.time) - secs(b.time) || cmp(a.manager, b.manager) || cmp(a.apiVersion, b.apiVersion) || cmp(a.subresource ?? '', b.subresource ?? ''));
  return kept.map((e) => ({
    manager: e.manager,
    operation: e.operation,
    apiVersion: e.apiVersion,
    ...(e.time ? { time: e.time } : {}),
    fieldsType: 'FieldsV1',
    fieldsV1: e.set.toJSON(),
    ...(e.subresource ? { subresource: e.subresource } : {}),
  }));
}

/** Folds the oldest Update entries beyond the cap into one "ancient-changes" entry, as the API server does. */
export function capUpdates(entries: ManagerEntry[]): ManagerEntry[] {
  const updates = entries.filter((e) => e.operation === 'Update' && !e.set.empty);
  if (updates.length <= MAX_UPDATE_MANAGERS) return entries;
  const byAge = [...updates].sort((a, b) => (a.time ?? '').localeCompare(b.time ?? ''));
  const fold = new Set(byAge.slice(0, updates.length - MAX_UPDATE_MANAGERS + 1));
  const ancient = entries.find((e) => e.manager === 'ancient-changes' && e.operation === 'Update' && !fold.has(e));
  let set = ancient?.set ?? new FieldSet();
  for (const e of fold) set = set.union(e.set);
  const rest = entries.filter((e) => !fold.has(e) && e !== ancient);
  rest.push({ manager: 'ancient-changes', operation: 'Update', apiVersion: byAge[0]!.apiVersion, time: ancient?.time ?? byAge[0]!.time, set });
  return capUpdates(rest);
}

/**
 * The part of an object a write may own: the status subresource's writes
 * only status; the main resource of a kind with a status subresource
 * everything but status; never the stripped fields.
 */
export function ownable(set: FieldSet, scope: Scope): FieldSet {
  let s = set.without(IGNORED);
  if (scope === 'main') s = s.without(FieldSet.of([['f:status']]));
  if (scope === 'status') s = s.only('f:status');
  return s;
}

/** What a write may change: all of the object, all but status (its kind has a status subresource), or only status. */
export type Scope = 'all' | 'main' | 'status';

export interface Writer {
  manager: string;
  apiVersion: string;
  type: FieldType;
  scope: Scope;
  /** The subresource written through ("status", "scale"), which the entry names. */
  subresource?: string;
  now: () => string;
}

/** The store's `fields` hook for an Update by `w`. */
export function updateTracker(w: Writer): (prev: ApiObject | undefined, next: ApiObject, given: unknown) => Obj[] | undefined {
  return (prev, next, given) => recordUpdate(w, prev, next, given);
}

/**
 * The managed fields after an Update by `w` from `prev` (none: a create) to
 * `next`; `given` is what the client sent in metadata.managedFields: a
 * non-empty valid list replaces the stored entries (as the API server lets
 * a client rewrite them), a list of one empty entry strips them, anything
 * else (none, or an empty list) keeps them.
 */
export function recordUpdate(w: Writer, prev: ApiObject | undefined, next: ApiObject, given: unknown): Obj[] | undefined {
  let entries = decodeEntries(prev?.metadata.managedFields);
  if (w.subresource === undefined && Array.isArray(given) && given.length > 0) {
    // One empty entry is how a client strips them all (an empty list would only mean "not sent").
    if (given.length === 1 && isObj(given[0]) && Object.keys(given[0]).length === 0) return undefined;
    entries = decodeEntries(given);
  }
  const diff = compare(strip(prev), strip(next), w.type);
  const id = identity({ manager: w.manager, operation: 'Update', apiVersion: w.apiVersion, subresource: w.subresource });
  entries = takeOwnership(entries, diff, id);
  const took = ownable(diff.added.union(diff.modified), w.scope);
  const mine = entries.find((e) => identity(e) === id);
  if (!took.empty) {
    if (mine) {
      mine.set = mine.set.union(took);
      mine.time = w.now();
    } else entries.push({ manager: w.manager, operation: 'Update', apiVersion: w.apiVersion, time: w.now(), subresource: w.subresource, set: took });
  }
  return encodeEntries(capUpdates(entries));
}

/** Everyone but `self` loses the fields the change modified, added or removed. */
export function takeOwnership(entries: ManagerEntry[], diff: Comparison, self: string): ManagerEntry[] {
  const changed = diff.added.union(diff.modified).union(diff.removed);
  for (const e of entries) {
    if (identity(e) === self) e.set = e.set.difference(diff.removed);
    else e.set = e.set.difference(changed);
  }
  return entries.filter((e) => !e.set.empty);
}

/** The object as field sets see it: no managedFields (they are not fields anyone owns). */
export function strip(o: ApiObject | undefined): Obj {
  if (!o) return { metadata: {} };
  const { managedFields: _m, ...meta } = o.metadata;
  return { ...o, metadata: meta };
}
