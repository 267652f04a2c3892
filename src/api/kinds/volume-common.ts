/**
 * What the storage kinds share: access modes (their validation and the
 * short form kubectl prints), storage quantities, class names, and the
 * annotations the API server and the PV controller read.
 */
import { dnsSubdomainError, tryParseQuantity } from '../../kubelet-lite/validate.js';
import type { Cause } from '../errors.js';
import type { ApiObject, Obj } from '../types.js';
import { isObj } from './common.js';

export const ACCESS_MODES = ['ReadWriteOnce', 'ReadOnlyMany', 'ReadWriteMany', 'ReadWriteOncePod'] as const;
const SHORT: Record<string, string> = { ReadWriteOnce: 'RWO', ReadOnlyMany: 'ROX', ReadWriteMany: 'RWX', ReadWriteOncePod: 'RWOP' };
export const VOLUME_MODES = ['Block', 'Filesystem'];

/** The annotation that names a default StorageClass (and its beta spelling, which the API server still reads). */
export const DEFAULT_CLASS_ANNOTATION = 'storageclass.kubernetes.io/is-default-class';
export const BETA_DEFAULT_CLASS_ANNOTATION = 'storageclass.beta.kubernetes.io/is-default-class';
/** The claim's class in its pre-storageClassName form, which wins over the field as upstream reads it. */
export const BETA_CLASS_ANNOTATION = 'volume.beta.kubernetes.io/storage-class';

export const specOf = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
export const statusOf = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});
export const listOf = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

/** "RWO,RWX" as kubectl's GetAccessModesAsString prints them: each once, in a fixed order. */
export function accessModesText(modes: unknown): string {
  const have = new Set(listOf(modes).map(String));
  return ACCESS_MODES.filter((m) => have.has(m)).map((m) => SHORT[m]).join(',');
}

export function accessModeCauses(modes: unknown, field: string, required: string): Cause[] {
  const list = listOf(modes);
  if (modes !== undefined && modes !== null && !Array.isArray(modes)) return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a list of access modes' }];
  if (list.length === 0) return [{ reason: 'FieldValueRequired', field, message: `Required value: ${required}` }];
  const out: Cause[] = [];
  for (const m of list) {
    if (!(ACCESS_MODES as readonly unknown[]).includes(m)) {
      out.push({ reason: 'FieldValueNotSupported', field, message: `Unsupported value: ${JSON.stringify(m)}: supported values: ${ACCESS_MODES.map((x) => `"${x}"`).join(', ')}` });
    }
  }
  if (list.includes('ReadWriteOncePod') && list.length > 1) out.push({ reason: 'FieldValueForbidden', field, message: 'Forbidden: may not use ReadWriteOncePod with other access modes' });
  return out;
}

/** A storage quantity's bytes, or undefined when it is not a quantity. */
export function storageBytes(q: unknown): number | undefined {
  return typeof q === 'string' || typeof q === 'number' ? tryParseQuantity(q) : undefined;
}

/** A positive storage quantity at `field`, required there. */
export function storageCauses(q: unknown, field: string): Cause[] {
  if (q === undefined || q === null || q === '') return [{ reason: 'FieldValueRequired', field, message: 'Required value' }];
  const bytes = storageBytes(q);
  if (bytes === undefined) {
    return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(q)}: quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'` }];
  }
  return bytes > 0 ? [] : [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(String(q))}: must be greater than zero` }];
}

export function classNameCauses(v: unknown, field: string): Cause[] {
  if (v === undefined || v === null || v === '') return [];
  if (typeof v !== 'string') return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a string' }];
  const why = dnsSubdomainError(v);
  return why ? [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(v)}: ${why}` }] : [];
}

export function volumeModeCauses(v: unknown, field: string): Cause[] {
  if (v === undefined || v === null || VOLUME_MODES.includes(v as string)) return [];
  return [{ reason: 'FieldValueNotSupported', field, message: `Unsupported value: ${JSON.stringify(v)}: supported values: "Block", "Filesystem"` }];
}

/** The claim's class as upstream's GetPersistentVolumeClaimClass reads it: the beta annotation, else the field. */
export function claimClass(o: ApiObject): string {
  const a = o.metadata.annotations?.[BETA_CLASS_ANNOTATION];
  if (a !== undefined) return a;
  const c = specOf(o).storageClassName;
  return typeof c === 'string' ? c : '';
}

/** The volume's class, read the same way (the beta annotation on a PV, else the field). */
export function volumeClass(o: ApiObject): string {
  const a = o.metadata.annotations?.[BETA_CLASS_ANNOTATION];
  if (a !== undefined) return a;
  const c = specOf(o).storageClassName;
  return typeof c === 'string' ? c : '';
}

/** Key order aside, the same JSON: what kubectl apply sends back may order a spec's keys otherwise. */
export function sameJson(a: unknown, b: unknown): boolean {
  return stable(a) === stable(b);
}

function stable(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(stable).join(',')}]`;
  if (isObj(v)) {
    return `{${Object.keys(v)
      .filter((k) => v[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${stable(v[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/** A finalizer put on at creation, as the API server's admission puts it (once). */
export function addFinalizer(o: ApiObject, f: string): void {
  const list = Array.isArray(o.metadata.finalizers) ? o.metadata.finalizers : [];
  if (!list.includes(f)) o.metadata.finalizers = [...list, f];
}
