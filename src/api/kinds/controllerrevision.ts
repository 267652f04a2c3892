/**
 * apps/v1 ControllerRevision: one immutable snapshot of a DaemonSet's or
 * StatefulSet's pod template (`data`, the patch that restores it) with its
 * place in the history (`revision`), as `kubectl rollout history/undo` read
 * them. Its data never changes once written; only its revision moves (a
 * rollback makes an old snapshot the newest again).
 */
import { invalid } from '../errors.js';
import type { Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

/** The controller column as kubectl prints it: `daemonset.apps/fluentd`, `<none>` without one. */
function controllerCell(o: ApiObject): string {
  const ref = (o.metadata.ownerReferences ?? []).find((r) => isObj(r) && r.controller === true) as Obj | undefined;
  if (!ref) return '<none>';
  const apiVersion = String(ref.apiVersion ?? '');
  const group = apiVersion.includes('/') ? apiVersion.slice(0, apiVersion.indexOf('/')) : '';
  return `${String(ref.kind ?? '').toLowerCase()}${group ? `.${group}` : ''}/${String(ref.name ?? '')}`;
}

export const controllerRevisionKind: Kind = {
  group: 'apps',
  version: 'v1',
  kind: 'ControllerRevision',
  plural: 'controllerrevisions',
  singular: 'controllerrevision',
  shortNames: [],
  namespaced: true,
  prepare(o, old) {
    if (!old) return;
    if (JSON.stringify(o.data ?? null) !== JSON.stringify(old.data ?? null)) {
      throw invalid('ControllerRevision', String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'data', message: 'Invalid value: "": field is immutable' }], 'apps');
    }
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    const r = o.revision;
    if (typeof r !== 'number' || !Number.isInteger(r) || r < 0) {
      out.push({ reason: 'FieldValueInvalid', field: 'revision', message: `Invalid value: ${JSON.stringify(r ?? null)}: must be greater than or equal to 0` });
    }
    return out;
  },
  known: { data: 'map', revision: true },
  columns: [
    nameColumn,
    { name: 'Controller', type: 'string', description: 'The controller of this revision (its controller owner reference).' },
    { name: 'Revision', type: 'integer', description: 'Revision indicates the revision of the state represented by Data.' },
    ageColumn,
  ],
  row: (o, now) => [o.metadata.name, controllerCell(o), typeof o.revision === 'number' ? o.revision : 0, age(o.metadata.creationTimestamp, now)],
};
