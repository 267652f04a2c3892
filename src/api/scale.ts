/**
 * The scale subresource (autoscaling/v1 Scale), generic over the kinds that
 * declare `scale`: a Scale is read out of the object, and a Scale written
 * changes only the object's wanted replicas (its resourceVersion, if given,
 * a precondition), so the kind's own strategy validates the result.
 */
import { invalid } from './errors.js';
import type { ApiObject, Kind, Obj } from './types.js';

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

function at(o: unknown, path: string): unknown {
  let cur = o;
  for (const k of path.split('.')) cur = isObj(cur) ? cur[k] : undefined;
  return cur;
}

function setAt(o: Obj, path: string, v: unknown): void {
  const keys = path.split('.');
  let cur = o;
  for (const k of keys.slice(0, -1)) {
    if (!isObj(cur[k])) cur[k] = {};
    cur = cur[k] as Obj;
  }
  cur[keys[keys.length - 1]!] = v;
}

export function toScale(kind: Kind, o: ApiObject): ApiObject {
  const s = kind.scale!;
  const m = o.metadata;
  const replicas = at(o, s.specReplicasPath);
  const current = at(o, s.statusReplicasPath);
  return {
    kind: 'Scale',
    apiVersion: 'autoscaling/v1',
    metadata: { name: m.name, namespace: m.namespace, uid: m.uid, resourceVersion: m.resourceVersion, creationTimestamp: m.creationTimestamp },
    spec: { replicas: typeof replicas === 'number' ? replicas : 0 },
    status: { replicas: typeof current === 'number' ? current : 0, selector: s.selector(o) },
  };
}

/** The object with the Scale's replicas in it; Invalid (as the API server words it) for a Scale that is not one. */
export function fromScale(kind: Kind, current: ApiObject, scale: Obj): Obj {
  const name = String(current.metadata.name);
  if (scale.kind !== undefined && scale.kind !== 'Scale') throw invalid('Scale', name, [{ reason: 'FieldValueInvalid', field: 'kind', message: `Invalid value: ${JSON.stringify(scale.kind)}: must be Scale` }], 'autoscaling');
  const meta = isObj(scale.metadata) ? scale.metadata : {};
  if (meta.name !== undefined && meta.name !== name) throw invalid('Scale', name, [{ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(meta.name)}: must match the name of the ${kind.kind}` }], 'autoscaling');
  const replicas = isObj(scale.spec) ? scale.spec.replicas : undefined;
  if (typeof replicas !== 'number' || !Number.isInteger(replicas) || replicas > 2147483647) {
    throw invalid('Scale', name, [{ reason: 'FieldValueInvalid', field: 'spec.replicas', message: `Invalid value: ${JSON.stringify(replicas ?? null)}: must be a whole number` }], 'autoscaling');
  }
  if (replicas < 0) throw invalid('Scale', name, [{ reason: 'FieldValueInvalid', field: 'spec.replicas', message: `Invalid value: ${replicas}: must be greater than or equal to 0` }], 'autoscaling');
  const next = structuredClone(current) as Obj;
  setAt(next, kind.scale!.specReplicasPath, replicas);
  const rv = meta.resourceVersion;
  (next.metadata as Obj).resourceVersion = typeof rv === 'string' && rv !== '' ? rv : current.metadata.resourceVersion;
  return next;
}
