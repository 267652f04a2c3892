/**
 * apps/v1 ReplicaSet, stored only: validated, listed and shown with
 * kubectl's columns, scalable, but nothing on the node runs one yet (the
 * Deployment controller keeps its ReplicaSets to itself; issue 23's bridge
 * may run them later).
 */
import type { Kind } from '../types.js';
import { isObj, setDefault } from './common.js';
import { replicaSetCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, keepSelector, nameColumn, replicatedScale, selectorColumn, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

export const replicaSetKind: Kind = {
  group: 'apps',
  version: 'v1',
  kind: 'ReplicaSet',
  plural: 'replicasets',
  singular: 'replicaset',
  shortNames: ['rs'],
  categories: ['all'],
  namespaced: true,
  status: true,
  scale: replicatedScale,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    setDefault(o.spec, 'replicas', 1);
    defaultTemplate(o.spec.template);
    if (old) keepSelector(replicaSetKind, o, old);
    else o.status = { replicas: 0 };
  },
  validate: (o) => workloadCauses(o, 'ReplicaSet', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  fields: { 'status.replicas': (o) => String(statusOf(o).replicas ?? 0) },
  columns: [
    nameColumn,
    { name: 'Desired', type: 'integer', description: 'Replicas is the number of desired pods.' },
    { name: 'Current', type: 'integer', description: 'Replicas is the most recently observed number of replicas.' },
    { name: 'Ready', type: 'integer', description: 'The number of non-terminating pods targeted by this ReplicaSet with a Ready Condition.' },
    ageColumn,
    ...containersColumns,
    { ...selectorColumn, description: 'Selector is a label query over pods that should match the replica count.' },
  ],
  row: (o, now) => workloadRow(o, now, replicaSetCells(specOf(o), statusOf(o)), specOf(o).template, true),
};
