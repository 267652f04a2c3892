/**
 * Server-side apply (PATCH with application/apply-patch+yaml), as
 * kube-apiserver's field manager does it: the applied configuration is
 * merged into the live object over the kind's list semantics
 * (list-types.ts); fields this manager applied before and no longer does
 * are removed unless someone else owns them; fields another manager owns
 * and this apply changes are conflicts (409, one cause each) unless forced,
 * when they change hands. The applier then owns exactly what it applied.
 */
import { isAlias, isCollection, isMap, isPair, isNode, isScalar, Lexer, parseDocument, type Document } from 'yaml';
import { ApiError, badRequest, notFound } from './errors.js';
import { fieldType, listKind, typeOf, type FieldType } from './list-types.js';
import {
  capUpdates, compare, decodeEntries, encodeEntries, fieldSetOf, FieldSet, identity, itemElement, ownable, pathString, strip, takeOwnership,
  type ManagerEntry, type Scope,
} from './managed-fields.js';
import { checkDepth } from './patch.js';
import type { Store } from './store.js';
import { groupVersionOf, type ApiObject, type Kind, type Obj } from './types.js';

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export const APPLY_PATCH_TYPE = 'application/apply-patch+yaml';
/** The same bounds the manifest reader puts on YAML (kubelet-lite/manifests.ts): aliases, and what they may expand to. */
const MAX_ALIAS_COUNT = 100;
const ALIAS_EXPANSION_SLACK = 10_000;
/** No object has more fields than this; an apply body with more is refused before it is walked. */
const MAX_NODES = 200_000;
/**
 * Tokens of a YAML body (JSON bodies do not count: JSON.parse is fast). The yaml
 * library composes a document at a few microseconds a token, and slower the
 * larger it grows (3 MiB of `[` held the event loop for a minute and 2.8 GB);
 * 200,000 tokens are about 25,000 fields and under half a second. kubectl and
 * helm send apply bodies as JSON, so only hand-written YAML meets this bound.
 */
const MAX_YAML_TOKENS = 200_000;
/** Flow collections nested deeper than any object's fields: the composer recurses once a level. */
const MAX_FLOW_DEPTH = 100;

export const LAST_APPLIED = 'kubectl.kubernetes.io/last-applied-configuration';

/** The body of an apply patch: YAML (JSON is YAML), one object, bounded as the manifest reader bounds files. */
export function parseApplyBody(text: string, strict: boolean): Obj {
  let v: unknown;
  const t = text.trimStart();
  if (t.startsWith('{')) {
    try {
      v = JSON.parse(t);
    } catch {
      v = undefined;
    }
  }
  if (v === undefined) {
    checkYamlSize(text);
    let doc: Document.Parsed;
    try {
      // Duplicate keys are found by uniqueKeysOf, in linear time: the library's own check compares every pair of a map's keys.
      doc = parseDocument(text, { version: '1.1', uniqueKeys: false, strict: false });
    } catch (err) {
      throw badRequest(`error decoding YAML: ${(err as Error).message}`);
    }
    if (doc.errors.length > 0) throw badRequest(`error decoding YAML: ${doc.errors[0]!.message.split('\n')[0]}`);
    const written = nodes(doc, false, MAX_NODES);
    if (strict) uniqueKeysOf(doc);
    if (written > MAX_NODES) throw new ApiError('RequestEntityTooLarge', `the apply configuration has more than ${MAX_NODES} fields`);
    const budget = Math.min(2 * written + ALIAS_EXPANSION_SLACK, MAX_NODES);
    if (nodes(doc, true, budget) > budget) throw new ApiError('RequestEntityTooLarge', `the apply configuration's aliases expand it to more than ${budget} fields (${written} as written)`);
    try {
      v = doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT });
    } catch (err) {
      throw badRequest(`error decoding YAML: ${(err as Error).message}`);
    }
  }
  checkDepth(v);
  if (!isObj(v)) throw badRequest('the apply configuration must be an object');
  return v;
}

/** One pass of the lexer, which is linear and stops at the bound: a body too large to compose is refused before it is. */
function checkYamlSize(text: string): void {
  let tokens = 0;
  let depth = 0;
  for (const tok of new Lexer().lex(text)) {
    if (++tokens > MAX_YAML_TOKENS) throw new ApiError('RequestEntityTooLarge', `the apply configuration has more than ${MAX_YAML_TOKENS} YAML tokens; send it as JSON`);
    if (tok === '[' || tok === '{') {
      if (++depth > MAX_FLOW_DEPTH) throw badRequest(`error decoding YAML: flow collections nested more than ${MAX_FLOW_DEPTH} levels deep`);
    } else if ((tok === ']' || tok === '}') && depth > 0) depth--;
  }
}

/** Refuses a map that names a key twice (fieldValidation=Strict), with a set per map. */
function uniqueKeysOf(doc: Document): void {
  const stack: unknown[] = [doc.contents];
  const seen = new Set<unknown>();
  while (stack.length > 0) {
    const n = stack.pop();
    if (!isCollection(n) || seen.has(n)) continue;
    seen.add(n);
    const keys = new Set<string>();
    for (const item of n.items) {
      if (isPair(item)) {
        if (isMap(n) && isScalar(item.key)) {
          const k = String(item.key.value);
          if (keys.has(k)) throw badRequest(`error decoding YAML: Map keys must be unique: "${k.slice(0, 100)}"`);
          keys.add(k);
        }
        stack.push(item.key, item.value);
      } else stack.push(item);
    }
  }
}

/** Nodes of the document, each alias one node or its anchor's size; stops past `limit`; a cycle is over it. */
function nodes(doc: Document, expand: boolean, limit: number): number {
  const seen = new Map<unknown, number>();
  let total = 0;
  const count = (n: unknown, depth: number): number => {
    if (depth > 200) return limit + 1;
    if (!isNode(n) && !isPair(n)) return 1;
    const known = seen.get(n);
    if (known !== undefined) return known;
    seen.set(n, limit + 1);
    let size = 1;
    if (isAlias(n)) size = expand ? count(n.resolve(doc), depth + 1) : 1;
    else if (isPair(n)) size = count(n.key, depth + 1) + count(n.value, depth + 1);
    else if (isCollection(n)) {
      for (const item of n.items) {
        size += count(item, depth + 1);
        if (size > limit) break;
      }
    }
    seen.set(n, size);
    return size;
  };
  total = count(doc.contents, 0);
  return total;
}

// ------------------------------------------------------------ merge and prune

/** `config` merged into `live`: maps field by field, keyed lists and sets item by item, anything atomic replaced. */
export function mergeInto(live: unknown, config: unknown, t: FieldType | undefined): unknown {
  if (config === undefined) return live;
  if (isObj(config) && isObj(live) && !t?.atomic) {
    const out: Obj = { ...live };
    for (const [k, v] of Object.entries(config)) {
      if (v === null) delete out[k];
      else out[k] = mergeInto(live[k], v, fieldType(t, k));
    }
    return out;
  }
  if (isObj(config) && !t?.atomic) return mergeInto({}, config, t);
  if (Array.isArray(config) && listKind(t) !== 'atomic') return mergeList(Array.isArray(live) ? live : [], config, t);
  return structuredClone(config);
}

/** structured-merge-diff's list merge: live items keep their places, the config's shared and new items come in its order. */
function mergeList(live: unknown[], config: unknown[], t: FieldType | undefined): unknown[] {
  const lk = live.map((x, i) => itemElement(t, x, i)!);
  const ck = config.map((x, i) => itemElement(t, x, i)!);
  if (new Set(ck).size !== ck.length) {
    const dup = ck.find((k, i) => ck.indexOf(k) !== i)!;
    throw new ApiError('Invalid', `the apply configuration lists the same item twice: ${pathString([dup])}`);
  }
  const inLive = new Map<string, unknown>();
  lk.forEach((k, i) => inLive.has(k) || inLive.set(k, live[i]));
  const inConfig = new Set(ck);
  const shared = ck.filter((k) => inLive.has(k));
  let next = 0;
  const merged = new Set<string>();
  const out: unknown[] = [];
  const item = (k: string, c: unknown) => (listKind(t) === 'set' ? structuredClone(c) : mergeInto(inLive.get(k), c, t?.items));
  for (let li = 0, ri = 0; li < live.length || ri < config.length; ) {
    if (li < live.length && ri < config.length) {
      if (lk[li] === ck[ri]) {
        merged.add(ck[ri]!);
        out.push(item(ck[ri]!, config[ri]));
        if (shared[next] === ck[ri]) next++;
        li++;
        ri++;
        continue;
      }
      if (inConfig.has(lk[li]!) && next < shared.length && shared[next] !== lk[li]) {
        li++;
        continue;
      }
    }
    if (li < live.length) {
      if (!inConfig.has(lk[li]!)) {
        out.push(live[li]);
        li++;
        continue;
      }
      if (merged.has(lk[li]!)) {
        li++;
        continue;
      }
    }
    if (ri < config.length) {
      merged.add(ck[ri]!);
      out.push(item(ck[ri]!, config[ri]));
      if (shared[next] === ck[ri]) next++;
      ri++;
    }
  }
  return out;
}

/**
 * Removes from `v` the members of `drop`, except where `keep` (what anyone
 * still owns) has fields inside them: those stay, and only the dropped
 * fields within go.
 */
export function removeFields(v: unknown, drop: FieldSet, keep: FieldSet | undefined, t: FieldType | undefined): unknown {
  if (isObj(v)) {
    const out: Obj = { ...v };
    for (const [pe, d] of drop.children) {
      if (!pe.startsWith('f:')) continue;
      const k = pe.slice(2);
      if (!(k in out)) continue;
      const kept = keep?.children.get(pe);
      if (d.member && !(kept && kept.children.size > 0)) delete out[k];
      else out[k] = removeFields(out[k], d, kept, fieldType(t, k));
    }
    return out;
  }
  if (Array.isArray(v)) {
    const out: unknown[] = [];
    v.forEach((x, i) => {
      const pe = itemElement(t, x, i);
      const d = pe === undefined ? undefined : drop.children.get(pe);
      if (!d) return out.push(x);
      const kept = keep?.children.get(pe!);
      if (d.member && !(kept && kept.children.size > 0)) return;
      out.push(removeFields(x, d, kept, t?.items));
    });
    return out;
  }
  return v;
}

// ------------------------------------------------------------ conflicts

export interface Conflict {
  manager: ManagerEntry;
  path: string[];
}

function printManager(e: ManagerEntry): string {
  let s = JSON.stringify(e.manager);
  if (e.subresource) s += ` with subresource ${JSON.stringify(e.subresource)}`;
  if (e.operation === 'Update') s += ` using ${e.apiVersion}`;
  return s;
}

/** 409 Conflict in the API server's words, one cause per field. */
export function conflictError(conflicts: Conflict[]): ApiError {
  const causes = conflicts.map((c) => ({ reason: 'FieldManagerConflict', message: `conflict with ${printManager(c.manager)}`, field: pathString(c.path) }));
  let message: string;
  if (conflicts.length === 1) message = `Apply failed with 1 conflict: conflict with ${printManager(conflicts[0]!.manager)}: ${pathString(conflicts[0]!.path)}`;
  else {
    const by = new Map<string, string[]>();
    for (const c of conflicts) {
      const m = printManager(c.manager);
      by.set(m, [...(by.get(m) ?? []), pathString(c.path)]);
    }
    const lines: string[] = [];
    for (const m of [...by.keys()].sort()) {
      lines.push(`conflicts with ${m}:`);
      for (const p of by.get(m)!) lines.push(`- ${p}`);
    }
    message = `Apply failed with ${conflicts.length} conflicts: ${lines.join('\n')}`;
  }
  return new ApiError('Conflict', message, { causes });
}

// ------------------------------------------------------------ apply

export interface ApplyOptions {
  manager: string;
  force: boolean;
  dryRun: boolean;
  /** An apply to the status subresource. */
  status: boolean;
  now: () => string;
}

/**
 * Applies `config` to the object at namespace/name: creates it when it does
 * not exist (created: true, for a 201), else merges, prunes, checks
 * conflicts and writes through the store as any update, so the kind's
 * defaults and validation run on the result.
 */
export function applyObject(store: Store, kind: Kind, namespace: string, name: string, config: Obj, opts: ApplyOptions): { object: ApiObject; created: boolean } {
  const apiVersion = groupVersionOf(kind);
  if (typeof config.apiVersion !== 'string' || typeof config.kind !== 'string' || config.apiVersion === '' || config.kind === '') {
    throw badRequest(`invalid object type: ${typeof config.apiVersion === 'string' ? config.apiVersion : ''}, Kind=${typeof config.kind === 'string' ? config.kind : ''}`);
  }
  const meta = isObj(config.metadata) ? config.metadata : {};
  if (meta.managedFields !== undefined && meta.managedFields !== null) throw badRequest('metadata.managedFields must be nil');
  if (meta.name !== undefined && meta.name !== name) throw badRequest(`the name of the object (${String(meta.name)}) does not match the name on the URL (${name})`);
  const type = typeOf(kind);
  const scope: Scope = opts.status ? 'status' : kind.status ? 'main' : 'all';
  const self = identity({ manager: opts.manager, operation: 'Apply', apiVersion, subresource: opts.status ? 'status' : undefined });
  const applied = ownable(fieldSetOf(config, type), scope);

  let current: ApiObject | undefined;
  try {
    current = store.get(kind, namespace, name);
  } catch (err) {
    if (!(err instanceof ApiError && err.reason === 'NotFound')) throw err;
  }
  if (!current && opts.status) throw notFound(kind.plural, name, kind.group);

  let entries: ManagerEntry[] = [];
  let refreshed = false;
  const record = (prev: ApiObject | undefined, next: ApiObject): Obj[] | undefined => {
    const diff = compare(strip(prev), strip(next), type);
    // The annotation kept for client-side apply changes after ownership is worked out, as upstream: nobody's field.
    if (refreshed) for (const k of ['added', 'modified', 'removed'] as const) diff[k] = diff[k].difference(FieldSet.of([['f:metadata', 'f:annotations', `f:${LAST_APPLIED}`]]));
    const changed = ownable(diff.added.union(diff.modified), scope);
    const conflicts: Conflict[] = [];
    for (const e of entries) {
      if (identity(e) === self) continue;
      for (const path of e.set.intersection(changed).paths()) conflicts.push({ manager: e, path });
    }
    if (conflicts.length > 0 && !opts.force && !allowedByLastApplied(opts.manager, prev, conflicts, type)) throw conflictError(conflicts);
    let out = takeOwnership(entries.filter((e) => identity(e) !== self), diff, self);
    const was = entries.find((e) => identity(e) === self);
    const unchanged = prev !== undefined && diff.added.empty && diff.modified.empty && diff.removed.empty && was !== undefined && was.set.equals(applied);
    out = [...out, { manager: opts.manager, operation: 'Apply', apiVersion, time: unchanged ? was.time : opts.now(), subresource: opts.status ? 'status' : undefined, set: applied }];
    return encodeEntries(capUpdates(out));
  };

  if (!current) {
    const o = mergeInto({}, config, type) as Obj;
    o.metadata = { ...(o.metadata as Obj), name };
    if (kind.namespaced) (o.metadata as Obj).namespace = namespace;
    return { object: store.create(kind, namespace, o, { dryRun: opts.dryRun, fields: (prev, next) => record(prev, next) }), created: true };
  }
  const object = store.patch(
    kind,
    namespace,
    name,
    (cur) => {
      entries = decodeEntries(cur.metadata.managedFields);
      const live = strip(cur);
      let merged = mergeInto(live, config, type) as Obj;
      const last = entries.find((e) => identity(e) === self)?.set;
      if (last && !last.empty) {
        let owned = applied;
        for (const e of entries) if (identity(e) !== self) owned = owned.union(e.set);
        merged = removeFields(merged, last.difference(owned), owned, type) as Obj;
      }
      refreshed = opts.manager === 'kubectl' && typeof (cur.metadata.annotations as Obj | undefined)?.[LAST_APPLIED] === 'string';
      if (refreshed) keepLastApplied(merged, config);
      return merged;
    },
    { dryRun: opts.dryRun, status: opts.status, fields: (prev, next) => record(prev, next) },
  );
  return { object, created: false };
}

/**
 * kubectl's server-side apply keeps a client-side apply's annotation up to
 * date (the API server's lastAppliedUpdater), so a later client-side apply
 * still computes the right patch.
 */
function keepLastApplied(merged: Obj, config: Obj): void {
  const meta = (isObj(merged.metadata) ? merged.metadata : {}) as Obj;
  const cfg = structuredClone(config);
  const cm = isObj(cfg.metadata) ? cfg.metadata : undefined;
  if (cm && isObj(cm.annotations)) {
    delete cm.annotations[LAST_APPLIED];
    if (Object.keys(cm.annotations).length === 0) delete cm.annotations;
  }
  meta.annotations = { ...(isObj(meta.annotations) ? meta.annotations : {}), [LAST_APPLIED]: JSON.stringify(cfg) };
  merged.metadata = meta;
}

/**
 * The API server's lastAppliedManager: kubectl's first server-side apply
 * after client-side applies may take the fields the client-side apply
 * recorded in its annotation, when the live object still holds them as
 * recorded; conflicts on any other field stand.
 */
function allowedByLastApplied(manager: string, prev: ApiObject | undefined, conflicts: Conflict[], type: FieldType): boolean {
  if (manager !== 'kubectl' || !prev) return false;
  const text = (prev.metadata.annotations as Obj | undefined)?.[LAST_APPLIED];
  if (typeof text !== 'string') return false;
  let last: unknown;
  try {
    last = JSON.parse(text);
  } catch {
    return false;
  }
  if (!isObj(last)) return false;
  const lastSet = ownable(fieldSetOf(last, type), 'all');
  const drift = compare(last, strip(prev), type);
  if (!drift.modified.intersection(lastSet).empty || !drift.removed.intersection(lastSet).empty) return false;
  return conflicts.every((c) => lastSet.has(c.path));
}
