/**
 * Label selectors (`app=web,tier!=db,env in (a,b),!legacy`) and field
 * selectors (`metadata.name=x`), parsed once into predicates. Lengths and
 * term counts are bounded, so a hostile selector costs little per object.
 */
import { badRequest } from './errors.js';
import type { ApiObject, Kind } from './types.js';

const MAX_SELECTOR = 4096;
const MAX_TERMS = 64;
const KEY = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$/;

type Requirement =
  | { op: 'eq' | 'ne'; key: string; value: string }
  | { op: 'in' | 'notin'; key: string; values: Set<string> }
  | { op: 'exists' | 'notexists'; key: string };

export type LabelSelector = (labels: Record<string, string> | undefined) => boolean;

/** Splits on commas outside parentheses. */
function splitTerms(s: string): string[] {
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    if (s[i] === '(') depth++;
    else if (s[i] === ')') depth--;
    else if (s[i] === ',' && depth === 0) {
      out.push(s.slice(start, i));
      start = i + 1;
    }
  }
  out.push(s.slice(start));
  return out.map((t) => t.trim()).filter((t) => t !== '');
}

function checkKey(key: string, whole: string): string {
  if (!KEY.test(key) || key.length > 316) throw badRequest(`unable to parse requirement: invalid label key "${key}" in "${whole}"`);
  return key;
}

function checkValue(v: string, whole: string): string {
  if (!VALUE.test(v) || v.length > 63) throw badRequest(`unable to parse requirement: invalid label value "${v}" in "${whole}"`);
  return v;
}

export function parseLabelSelector(s: string | undefined): LabelSelector {
  if (!s || s.trim() === '') return () => true;
  if (s.length > MAX_SELECTOR) throw badRequest(`label selector longer than ${MAX_SELECTOR} characters`);
  const terms = splitTerms(s);
  if (terms.length > MAX_TERMS) throw badRequest(`label selector with more than ${MAX_TERMS} requirements`);
  const reqs: Requirement[] = terms.map((t): Requirement => {
    let m = /^(\S+?)\s+(in|notin)\s+\(([^()]*)\)$/.exec(t);
    if (m) {
      const values = m[3]!.split(',').map((v) => checkValue(v.trim(), s));
      return { op: m[2] as 'in' | 'notin', key: checkKey(m[1]!, s), values: new Set(values) };
    }
    m = /^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/.exec(t);
    if (m) return { op: m[2] === '!=' ? 'ne' : 'eq', key: checkKey(m[1]!, s), value: checkValue(m[3]!, s) };
    m = /^!\s*(\S+)$/.exec(t);
    if (m) return { op: 'notexists', key: checkKey(m[1]!, s) };
    if (/^\S+$/.test(t)) return { op: 'exists', key: checkKey(t, s) };
    throw badRequest(`unable to parse requirement: "${t}" in label selector "${s}"`);
  });
  return (labels) => {
    const l = labels ?? {};
    return reqs.every((r) => {
      const has = Object.prototype.hasOwnProperty.call(l, r.key);
      switch (r.op) {
        case 'eq':
          return has && l[r.key] === r.value;
        case 'ne':
          return !has || l[r.key] !== r.value;
        case 'in':
          return has && r.values.has(l[r.key]!);
        case 'notin':
          return !has || !r.values.has(l[r.key]!);
        case 'exists':
          return has;
        case 'notexists':
          return !has;
      }
    });
  };
}

export type FieldSelector = (o: ApiObject) => boolean;

/** Field selectors on the fields a kind supports: metadata.name, metadata.namespace, and the kind's own. */
export function parseFieldSelector(s: string | undefined, kind: Kind): FieldSelector {
  if (!s || s.trim() === '') return () => true;
  if (s.length > MAX_SELECTOR) throw badRequest(`field selector longer than ${MAX_SELECTOR} characters`);
  const terms = s.split(',').map((t) => t.trim()).filter(Boolean);
  if (terms.length > MAX_TERMS) throw badRequest(`field selector with more than ${MAX_TERMS} requirements`);
  const getters: Record<string, (o: ApiObject) => string | undefined> = {
    'metadata.name': (o) => o.metadata.name,
    'metadata.namespace': (o) => o.metadata.namespace ?? '',
    ...kind.fields,
  };
  const reqs = terms.map((t) => {
    const m = /^([^=!]+?)\s*(==|=|!=)\s*(.*)$/.exec(t);
    if (!m) throw badRequest(`invalid selector: '${s}'; can't understand '${t}'`);
    const get = getters[m[1]!];
    if (!get) throw badRequest(`field label not supported: ${m[1]}`);
    return { get, ne: m[2] === '!=', value: m[3]! };
  });
  return (o) => reqs.every((r) => (r.get(o) === r.value) !== r.ne);
}
