/**
 * The three patch types kubectl sends: JSON merge patch (RFC 7386), JSON
 * patch (RFC 6902) and strategic merge patch. For the kinds served here,
 * strategic merge is merge patch plus its directives ($patch, $retainKeys,
 * $deleteFromPrimitiveList, $setElementOrder) and the lists that merge
 * instead of being replaced (by their patchMergeKey, or as sets of values),
 * from the table server-side apply reads too (list-types.ts): without them
 * `kubectl apply` of one changed image would drop the container's other fields.
 * Every function works on its own copies and is bounded by the patch's size
 * (which the server caps) and a nesting depth.
 */
import { ApiError, badRequest } from './errors.js';
import { fieldType, listKind, typeOf, type FieldType } from './list-types.js';
import type { Obj } from './types.js';

export type PatchType = 'merge' | 'json' | 'strategic';

export const PATCH_TYPES: Record<string, PatchType> = {
  'application/merge-patch+json': 'merge',
  'application/json-patch+json': 'json',
  'application/strategic-merge-patch+json': 'strategic',
};

const MAX_DEPTH = 100;
const MAX_OPS = 10_000;
/** What copy operations may add up to: each copies a subtree, so 10,000 of them could otherwise grow without bound. */
const MAX_COPIED = 8 * 1024 * 1024;

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** More values than any object the API stores has: the work a request costs (merging, validating) grows with them. */
export const MAX_VALUES = 100_000;

/** Refuses documents nested deeper, or holding more values, than the API's objects ever do, without recursing to find out. */
export function checkDepth(v: unknown): void {
  const stack: Array<[unknown, number]> = [[v, 0]];
  let values = 0;
  while (stack.length > 0) {
    const [x, d] = stack.pop()!;
    if (d > MAX_DEPTH) throw badRequest(`the document is nested more than ${MAX_DEPTH} levels deep`);
    if (++values > MAX_VALUES) throw new ApiError('RequestEntityTooLarge', `the document holds more than ${MAX_VALUES} values`);
    if (Array.isArray(x)) for (const y of x) stack.push([y, d + 1]);
    else if (isObj(x)) for (const y of Object.values(x)) stack.push([y, d + 1]);
  }
}

export function applyPatch(type: PatchType, current: Obj, patch: unknown): Obj {
  checkDepth(patch);
  switch (type) {
    case 'merge':
      if (!isObj(patch)) throw badRequest('a merge patch must be a JSON object');
      return mergePatch(current, patch) as Obj;
    case 'strategic':
      if (!isObj(patch)) throw badRequest('a strategic merge patch must be a JSON object');
      return strategic(current, patch, schemaOf(current)) as Obj;
    case 'json':
      return jsonPatch(current, patch);
  }
}

export function mergePatch(target: unknown, patch: unknown): unknown {
  if (!isObj(patch)) return structuredClone(patch);
  const out: Obj = isObj(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

/** The type of the object being patched, by its apiVersion and kind: which of its lists merge (list-types.ts). */
function schemaOf(o: Obj): FieldType {
  const av = typeof o.apiVersion === 'string' ? o.apiVersion : '';
  return typeOf({ group: av.includes('/') ? av.slice(0, av.indexOf('/')) : '', kind: typeof o.kind === 'string' ? o.kind : '' });
}

function strategic(target: unknown, patch: Obj, t: FieldType | undefined): unknown {
  const directive = patch.$patch;
  if (directive === 'delete') return undefined;
  if (directive === 'replace') {
    const { $patch: _p, ...rest } = patch;
    return structuredClone(rest);
  }
  if (directive !== undefined) throw badRequest(`unknown patch type: ${String(directive)} in map`);
  const out: Obj = isObj(target) ? { ...target } : {};
  let retain: string[] | undefined;
  for (const [k, v] of Object.entries(patch)) {
    if (k === '$retainKeys') {
      if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) throw badRequest('$retainKeys must be a list of strings');
      retain = v as string[];
      continue;
    }
    if (k.startsWith('$setElementOrder/')) continue; // order only; lists here keep the server's order
    if (k.startsWith('$deleteFromPrimitiveList/')) {
      const field = k.slice('$deleteFromPrimitiveList/'.length);
      if (!Array.isArray(v)) throw badRequest(`${k} must be a list`);
      const drop = new Set(v.map((x) => JSON.stringify(x)));
      if (Array.isArray(out[field])) out[field] = (out[field] as unknown[]).filter((x) => !drop.has(JSON.stringify(x)));
      continue;
    }
    const sub = fieldType(t, k);
    const lk = listKind(sub);
    if (v === null) delete out[k];
    else if (isObj(v)) {
      const merged = strategic(out[k], v, sub);
      if (merged === undefined) delete out[k];
      else out[k] = merged;
    } else if (Array.isArray(v) && lk !== 'atomic') out[k] = mergeList(out[k], v, lk === 'set' ? undefined : lk.mergeKey, sub?.items);
    else out[k] = structuredClone(v);
  }
  if (retain) for (const k of Object.keys(out)) if (!retain.includes(k)) delete out[k];
  return out;
}

function mergeList(target: unknown, patch: unknown[], key: string | undefined, items: FieldType | undefined): unknown[] {
  const cur = Array.isArray(target) ? [...target] : [];
  if (patch.some((x) => isObj(x) && x.$patch === 'replace')) return structuredClone(patch.filter((x) => !(isObj(x) && x.$patch === 'replace')));
  if (key === undefined) {
    const seen = new Set(cur.map((x) => JSON.stringify(x)));
    for (const x of patch) if (!seen.has(JSON.stringify(x))) cur.push(structuredClone(x));
    return cur;
  }
  // Found by key through a map, so a patch of n items into a list of m costs n + m, not n × m.
  const out: Array<unknown> = cur;
  const gone = new Set<number>();
  const at = new Map<unknown, number>();
  out.forEach((y, i) => {
    if (isObj(y) && !at.has(y[key])) at.set(y[key], i);
  });
  for (const x of patch) {
    if (!isObj(x)) throw badRequest(`a list merged by ${key} must hold objects`);
    const i = at.get(x[key]);
    if (x.$patch === 'delete') {
      if (i !== undefined) {
        gone.add(i);
        at.delete(x[key]);
      }
    } else if (i !== undefined) out[i] = strategic(out[i], x, items);
    else {
      at.set(x[key], out.length);
      out.push(strategic({}, x, items));
    }
  }
  return gone.size === 0 ? out : out.filter((_, i) => !gone.has(i));
}

// ---------------------------------------------------------------- JSON patch

function unprocessable(message: string): ApiError {
  return new ApiError('Invalid', `the server rejected our request due to an error in our request: ${message}`);
}

function pointer(p: unknown): string[] {
  if (typeof p !== 'string' || (p !== '' && !p.startsWith('/'))) throw unprocessable(`invalid JSON pointer ${JSON.stringify(p)}`);
  return p === '' ? [] : p.slice(1).split('/').map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

/** The container a pointer's last segment lives in, and that segment. */
function locate(doc: unknown, segs: string[], op: string): { parent: Obj | unknown[]; last: string } {
  let cur = doc;
  for (const s of segs.slice(0, -1)) {
    if (Array.isArray(cur)) cur = cur[index(cur, s, false, op)];
    else if (isObj(cur) && Object.prototype.hasOwnProperty.call(cur, s)) cur = cur[s];
    else throw unprocessable(`${op} operation does not apply: doc is missing path: /${segs.join('/')}`);
  }
  if (!Array.isArray(cur) && !isObj(cur)) throw unprocessable(`${op} operation does not apply: doc is missing path: /${segs.join('/')}`);
  return { parent: cur, last: segs[segs.length - 1]! };
}

function index(list: unknown[], s: string, forAdd: boolean, op: string): number {
  if (forAdd && s === '-') return list.length;
  if (!/^(0|[1-9]\d{0,8})$/.test(s)) throw unprocessable(`${op} operation: invalid array index ${s}`);
  const i = Number(s);
  if (i > list.length || (!forAdd && i === list.length)) throw unprocessable(`${op} operation: array index ${s} out of bounds`);
  return i;
}

function getAt(doc: unknown, segs: string[], op: string): unknown {
  if (segs.length === 0) return doc;
  const { parent, last } = locate(doc, segs, op);
  if (Array.isArray(parent)) return parent[index(parent, last, false, op)];
  if (!Object.prototype.hasOwnProperty.call(parent, last)) throw unprocessable(`${op} operation does not apply: doc is missing path: /${segs.join('/')}`);
  return parent[last];
}

function removeAt(doc: unknown, segs: string[], op: string): unknown {
  const { parent, last } = locate(doc, segs, op);
  if (Array.isArray(parent)) return parent.splice(index(parent, last, false, op), 1)[0];
  if (!Object.prototype.hasOwnProperty.call(parent, last)) throw unprocessable(`${op} operation does not apply: doc is missing path: /${segs.join('/')}`);
  const v = parent[last];
  delete parent[last];
  return v;
}

function addAt(doc: unknown, segs: string[], value: unknown, op: string, replace: boolean): void {
  const { parent, last } = locate(doc, segs, op);
  if (Array.isArray(parent)) {
    const i = index(parent, last, !replace, op);
    parent.splice(i, replace ? 1 : 0, value);
  } else {
    if (replace && !Object.prototype.hasOwnProperty.call(parent, last)) throw unprocessable(`replace operation does not apply: doc is missing key: /${segs.join('/')}`);
    parent[last] = value;
  }
}

export function jsonPatch(current: Obj, ops: unknown): Obj {
  if (!Array.isArray(ops)) throw badRequest('a JSON patch must be a list of operations');
  if (ops.length > MAX_OPS) throw new ApiError('RequestEntityTooLarge', `a JSON patch may hold at most ${MAX_OPS} operations`);
  let doc: unknown = structuredClone(current);
  let copied = 0;
  for (const raw of ops) {
    if (!isObj(raw) || typeof raw.op !== 'string') throw unprocessable('each operation must be an object with an "op"');
    const op = raw.op;
    const segs = pointer(raw.path);
    const needValue = op === 'add' || op === 'replace' || op === 'test';
    if (needValue && !('value' in raw)) throw unprocessable(`${op} operation is missing "value"`);
    const value = structuredClone(raw.value);
    if (segs.length === 0 && op !== 'test') {
      if (op === 'add' || op === 'replace') doc = value;
      else throw unprocessable(`${op} operation on the whole document`);
      continue;
    }
    switch (op) {
      case 'add':
        addAt(doc, segs, value, op, false);
        break;
      case 'replace':
        addAt(doc, segs, value, op, true);
        break;
      case 'remove':
        removeAt(doc, segs, op);
        break;
      case 'test':
        if (JSON.stringify(getAt(doc, segs, op)) !== JSON.stringify(value)) throw unprocessable(`testing value /${segs.join('/')} failed`);
        break;
      case 'move':
      case 'copy': {
        const from = pointer(raw.from);
        if (op === 'move' && segs.join('/').startsWith(from.join('/') + '/')) throw unprocessable('move operation: cannot move a value into itself');
        let v = op === 'move' ? removeAt(doc, from, op) : getAt(doc, from, op);
        if (op === 'copy') {
          const text = JSON.stringify(v) ?? 'null';
          copied += text.length;
          if (copied > MAX_COPIED) throw new ApiError('RequestEntityTooLarge', `a JSON patch may copy at most ${MAX_COPIED} bytes`);
          v = JSON.parse(text);
        }
        addAt(doc, segs, v, op, false);
        break;
      }
      default:
        throw unprocessable(`unexpected operation ${JSON.stringify(op)}`);
    }
  }
  if (!isObj(doc)) throw unprocessable('the patched document is not an object');
  return doc;
}
