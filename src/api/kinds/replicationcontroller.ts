/**
 * v1 ReplicationController: the ReplicaSet's predecessor, whose selector is
 * a plain label map. Defaulted as the API server does (the selector and the
 * object's labels from the template's labels, one replica), validated by
 * the ReplicaSet checks on the same object with the map read as
 * matchLabels, scalable, with kubectl's columns.
 */
import type { Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { isObj, setDefault } from './common.js';
import { formatLabels, replicaSetCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, nameColumn, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

/** The selector map as a Scale's selector and the wide column write it: `a=b,c=d`. */
export function rcSelector(o: ApiObject): string {
  const sel = specOf(o).selector;
  return isObj(sel) && Object.keys(sel).length > 0 ? formatLabels(sel) : '';
}

/** The same object as a ReplicaSet, for the ReplicaSet's checks. */
function asReplicaSet(o: ApiObject): ApiObject {
  const spec = specOf(o);
  return { ...o, apiVersion: 'apps/v1', kind: 'ReplicaSet', spec: { ...spec, selector: isObj(spec.selector) ? { matchLabels: spec.selector } : spec.selector } };
}

export const replicationControllerKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'ReplicationController',
  plural: 'replicationcontrollers',
  singular: 'replicationcontroller',
  shortNames: ['rc'],
  categories: ['all'],
  namespaced: true,
  status: true,
  scale: { specReplicasPath: 'spec.replicas', statusReplicasPath: 'status.replicas', selector: rcSelector },
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    const t = isObj(spec.template) ? spec.template : undefined;
    const labels = t && isObj(t.metadata) && isObj(t.metadata.labels) ? (t.metadata.labels as Obj) : undefined;
    if (labels && Object.keys(labels).length > 0) {
      if (!isObj(spec.selector) || Object.keys(spec.selector).length === 0) spec.selector = { ...labels };
      if (!isObj(o.metadata.labels) || Object.keys(o.metadata.labels).length === 0) o.metadata.labels = { ...(labels as Record<string, string>) };
    }
    setDefault(spec, 'replicas', 1);
    defaultTemplate(spec.template);
    if (!old) o.status = { replicas: 0 };
  },
  validate(o) {
    const out: Cause[] = [];
    const sel = specOf(o).selector;
    if (sel !== undefined && sel !== null && (!isObj(sel) || Object.values(sel).some((v) => typeof v !== 'string'))) {
      out.push({ reason: 'FieldValueInvalid', field: 'spec.selector', message: 'Invalid value: must be a map of label keys to values' });
      return out;
    }
    return workloadCauses(asReplicaSet(o), 'ReplicaSet', ['spec', 'template']).map((c) => (c.field?.startsWith('spec.selector.matchLabels') ? { ...c, field: `spec.selector${c.field.slice('spec.selector.matchLabels'.length)}` } : c));
  },
  known: { spec: 'map', status: 'map' },
  fields: { 'status.replicas': (o) => String(statusOf(o).replicas ?? 0) },
  columns: [
    nameColumn,
    { name: 'Desired', type: 'integer', description: 'Replicas is the number of desired replicas.' },
    { name: 'Current', type: 'integer', description: 'Replicas is the most recently observed number of replicas.' },
    { name: 'Ready', type: 'integer', description: 'The number of ready replicas for this replication controller.' },
    ageColumn,
    ...containersColumns,
    { name: 'Selector', type: 'string', priority: 1, description: 'Selector is a label query over pods that should match the Replicas count.' },
  ],
  row: (o, now) => [...workloadRow(o, now, replicaSetCells(specOf(o), statusOf(o)), specOf(o).template, false), rcSelector(o) || '<none>'],
};
