/**
 * apps/v1 StatefulSet, stored only: defaulted (OrderedReady, a rolling
 * update from partition 0, PVCs retained, replicas 1, 10 revisions),
 * validated, listed, scalable, its spec immutable but for what the API
 * server lets change — but nothing on the node runs one yet.
 */
import { invalid } from '../errors.js';
import type { ApiObject, Kind } from '../types.js';
import { isObj, setDefault } from './common.js';
import { statefulSetCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, nameColumn, replicatedScale, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

const MUTABLE = ['replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy', 'minReadySeconds'];

function fixedPart(o: ApiObject): string {
  const s = { ...specOf(o) };
  for (const k of MUTABLE) delete s[k];
  return JSON.stringify(s);
}

export const statefulSetKind: Kind = {
  group: 'apps',
  version: 'v1',
  kind: 'StatefulSet',
  plural: 'statefulsets',
  singular: 'statefulset',
  shortNames: ['sts'],
  categories: ['all'],
  namespaced: true,
  status: true,
  scale: replicatedScale,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    setDefault(spec, 'podManagementPolicy', 'OrderedReady');
    if (!isObj(spec.updateStrategy)) spec.updateStrategy = {};
    const us = spec.updateStrategy as Record<string, unknown>;
    if (us.type === undefined || us.type === null || us.type === '') {
      us.type = 'RollingUpdate';
      if (!isObj(us.rollingUpdate)) us.rollingUpdate = {};
    }
    if (us.type === 'RollingUpdate' && isObj(us.rollingUpdate)) setDefault(us.rollingUpdate, 'partition', 0);
    if (!isObj(spec.persistentVolumeClaimRetentionPolicy)) spec.persistentVolumeClaimRetentionPolicy = {};
    setDefault(spec.persistentVolumeClaimRetentionPolicy as Record<string, unknown>, 'whenDeleted', 'Retain');
    setDefault(spec.persistentVolumeClaimRetentionPolicy as Record<string, unknown>, 'whenScaled', 'Retain');
    setDefault(spec, 'replicas', 1);
    setDefault(spec, 'revisionHistoryLimit', 10);
    defaultTemplate(spec.template);
    if (!old) {
      o.status = { replicas: 0, availableReplicas: 0 };
      return;
    }
    if (fixedPart(o) !== fixedPart(old)) {
      throw invalid('StatefulSet', String(o.metadata.name), [
        {
          reason: 'FieldValueForbidden',
          field: 'spec',
          message: `Forbidden: updates to statefulset spec for fields other than ${MUTABLE.slice(0, -1).map((k) => `'${k}'`).join(', ')} and '${MUTABLE[MUTABLE.length - 1]}' are forbidden`,
        },
      ], 'apps');
    }
  },
  validate: (o) => workloadCauses(o, 'StatefulSet', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Ready', type: 'string', description: 'Number of the pod with ready state' },
    ageColumn,
    ...containersColumns,
  ],
  row: (o, now) => workloadRow(o, now, statefulSetCells(specOf(o), statusOf(o)), specOf(o).template, false),
};
