/**
 * ownerReferences and the deletion policies that act on them, as the API
 * server reads them: which references an object has, whether they are
 * valid, and which of the garbage collector's finalizers a delete leaves on
 * the object (foregroundDeletion: its dependents first; orphan: its
 * dependents stay). The collector that honours them is gc.ts.
 */
import { badRequest, type Cause } from './errors.js';
import { optionsInvalid } from './managed-fields.js';
import type { ObjectMeta, Obj } from './types.js';

export const FOREGROUND_FINALIZER = 'foregroundDeletion';
export const ORPHAN_FINALIZER = 'orphan';

export type Propagation = 'Foreground' | 'Background' | 'Orphan';
const POLICIES: readonly string[] = ['Foreground', 'Background', 'Orphan'];

export interface OwnerRef {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

/** What a delete asks of the object's dependents. */
export interface PropagationOptions {
  propagationPolicy?: Propagation;
  /** Deprecated, and only one of the two may be given. */
  orphanDependents?: boolean;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The object's well-formed references (validation refuses others on write; an old stored object may still hold them). */
export function ownerRefs(meta: ObjectMeta): OwnerRef[] {
  if (!Array.isArray(meta.ownerReferences)) return [];
  const out: OwnerRef[] = [];
  for (const r of meta.ownerReferences as unknown[]) {
    if (!isObj(r) || typeof r.uid !== 'string' || r.uid === '' || typeof r.name !== 'string' || typeof r.kind !== 'string' || typeof r.apiVersion !== 'string') continue;
    out.push({ apiVersion: r.apiVersion, kind: r.kind, name: r.name, uid: r.uid, controller: r.controller === true, blockOwnerDeletion: r.blockOwnerDeletion === true });
  }
  return out;
}

/** The group of an apiVersion ("apps/v1" → "apps", "v1" → ""). */
export function groupOf(apiVersion: string): string {
  const i = apiVersion.indexOf('/');
  return i < 0 ? '' : apiVersion.slice(0, i);
}

/** ValidateOwnerReferences and the finalizer rule of ObjectMeta, with the API server's wording. */
export function ownerCauses(meta: ObjectMeta): Cause[] {
  const out: Cause[] = [];
  const field = 'metadata.ownerReferences';
  const refs = meta.ownerReferences as unknown;
  if (refs !== undefined && refs !== null) {
    if (!Array.isArray(refs)) return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a list of owner references' }];
    let controller = '';
    for (const r of refs as unknown[]) {
      if (!isObj(r)) {
        out.push({ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: each owner reference must be an object' });
        continue;
      }
      for (const f of ['apiVersion', 'kind', 'name', 'uid'] as const) {
        if (r[f] !== undefined && typeof r[f] !== 'string') out.push({ reason: 'FieldValueTypeInvalid', field: `${field}.${f}`, message: `Invalid value: ${JSON.stringify(r[f])}: must be a string` });
      }
      for (const f of ['controller', 'blockOwnerDeletion'] as const) {
        if (r[f] !== undefined && r[f] !== null && typeof r[f] !== 'boolean') out.push({ reason: 'FieldValueTypeInvalid', field: `${field}.${f}`, message: `Invalid value: ${JSON.stringify(r[f])}: must be a boolean` });
      }
      const apiVersion = typeof r.apiVersion === 'string' ? r.apiVersion : '';
      const version = apiVersion.slice(apiVersion.indexOf('/') + 1);
      if (version === '') out.push({ reason: 'FieldValueInvalid', field: `${field}.apiVersion`, message: `Invalid value: ${JSON.stringify(apiVersion)}: version must not be empty` });
      for (const f of ['kind', 'name', 'uid'] as const) {
        if (typeof r[f] !== 'string' || r[f] === '') out.push({ reason: 'FieldValueInvalid', field: `${field}.${f}`, message: `Invalid value: "": ${f} must not be empty` });
      }
      if (apiVersion === 'v1' && r.kind === 'Event') out.push({ reason: 'FieldValueInvalid', field, message: 'Invalid value: "Event": /v1, Kind=Event is disallowed from being an owner' });
      if (r.controller === true) {
        const here = `${String(r.kind)}/${String(r.name)}`;
        if (controller === '') controller = here;
        else out.push({ reason: 'FieldValueInvalid', field, message: `Invalid value: "controller": Only one reference can have Controller set to true. Found "true" in references for ${controller} and ${here}` });
      }
    }
  }
  const fins = Array.isArray(meta.finalizers) ? meta.finalizers : [];
  if (fins.includes(ORPHAN_FINALIZER) && fins.includes(FOREGROUND_FINALIZER)) {
    out.push({ reason: 'FieldValueInvalid', field: 'metadata.finalizers', message: `Invalid value: ${JSON.stringify(fins)}: finalizer ${ORPHAN_FINALIZER} and ${FOREGROUND_FINALIZER} cannot be both set` });
  }
  return out;
}

/** The first of the two GC finalizers the object carries: a delete that names no policy keeps it. */
function standing(finalizers: readonly string[]): Propagation | undefined {
  for (const f of finalizers) {
    if (f === ORPHAN_FINALIZER) return 'Orphan';
    if (f === FOREGROUND_FINALIZER) return 'Foreground';
  }
  return undefined;
}

/**
 * The finalizers an object keeps once deleted with these options
 * (kube-apiserver's deletionFinalizersForGarbageCollection): an explicit
 * policy replaces a standing one, none keeps what the object carries, and
 * the default is Background (no finalizer: the collector takes the
 * dependents after the owner is gone).
 */
export function deletionFinalizers(finalizers: readonly string[], o: PropagationOptions): string[] {
  const policy: Propagation | undefined =
    o.orphanDependents !== undefined ? (o.orphanDependents ? 'Orphan' : 'Background') : o.propagationPolicy ?? standing(finalizers);
  const out = finalizers.filter((f) => f !== ORPHAN_FINALIZER && f !== FOREGROUND_FINALIZER);
  if (policy === 'Orphan') out.push(ORPHAN_FINALIZER);
  if (policy === 'Foreground') out.push(FOREGROUND_FINALIZER);
  // The same set in the object's order: nothing to write.
  if (out.length === finalizers.length && out.every((f) => finalizers.includes(f))) return [...finalizers];
  return out;
}

/**
 * propagationPolicy and orphanDependents of a delete, from its body (a
 * DeleteOptions) or, with an empty body, its query: a value of the wrong
 * type is a BadRequest, an unknown policy or both given is Invalid
 * (ValidateDeleteOptions).
 */
export function propagationOf(body: Obj, query: URLSearchParams, bodyGiven: boolean): PropagationOptions {
  let policy: unknown;
  let orphan: unknown;
  if (bodyGiven) {
    policy = body.propagationPolicy ?? undefined;
    orphan = body.orphanDependents ?? undefined;
    if (policy !== undefined && typeof policy !== 'string') throw badRequest(`json: cannot unmarshal ${typeof policy} into Go struct field DeleteOptions.propagationPolicy of type v1.DeletionPropagation`);
    if (orphan !== undefined && typeof orphan !== 'boolean') throw badRequest(`json: cannot unmarshal ${typeof orphan} into Go struct field DeleteOptions.orphanDependents of type bool`);
  } else {
    policy = query.get('propagationPolicy') ?? undefined;
    const text = query.get('orphanDependents');
    if (text !== null) {
      if (!/^(1|t|T|TRUE|true|True|0|f|F|FALSE|false|False)$/.test(text)) throw badRequest(`strconv.ParseBool: parsing ${JSON.stringify(text)}: invalid syntax`);
      orphan = /^(1|t|T|TRUE|true|True)$/.test(text);
    }
  }
  const causes: Array<{ reason: string; field: string; message: string }> = [];
  if (policy !== undefined && orphan !== undefined) causes.push({ reason: 'FieldValueInvalid', field: 'propagationPolicy', message: `Invalid value: ${JSON.stringify(policy)}: orphanDependents and deletionPropagation cannot be both set` });
  if (policy !== undefined && !POLICIES.includes(policy as string)) {
    causes.push({ reason: 'FieldValueNotSupported', field: 'propagationPolicy', message: `Unsupported value: ${JSON.stringify(policy)}: supported values: "Foreground", "Background", "Orphan", "nil"` });
  }
  if (causes.length > 0) throw optionsInvalid('DeleteOptions', causes);
  return { ...(policy !== undefined ? { propagationPolicy: policy as Propagation } : {}), ...(orphan !== undefined ? { orphanDependents: orphan as boolean } : {}) };
}
