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

/**
 * The object as its pods will be, for validation: each volumeClaimTemplate is
 * a volume of the template (the controller adds it, a claim volume), so the
 * containers' volumeMounts may name it, as the API server validates them.
 */
function withClaimVolumes(o: ApiObject): ApiObject {
  const spec = isObj(o.spec) ? o.spec : undefined;
  const templates = spec && Array.isArray(spec.volumeClaimTemplates) ? spec.volumeClaimTemplates.filter(isObj) : [];
  const template = spec && isObj(spec.template) ? spec.template : undefined;
  const podSpec = template && isObj(template.spec) ? template.spec : undefined;
  if (templates.length === 0 || !podSpec) return o;
  const volumes = Array.isArray(podSpec.volumes) ? [...podSpec.volumes] : [];
  const have = new Set(volumes.filter(isObj).map((v) => v.name));
  for (const t of templates) {
    const name = isObj(t.metadata) ? t.metadata.name : undefined;
    if (typeof name === 'string' && name !== '' && !have.has(name)) volumes.push({ name, persistentVolumeClaim: { claimName: `${name}-${String(o.metadata.name ?? '')}-0` } });
  }
  return { ...o, spec: { ...spec, template: { ...template, spec: { ...podSpec, volumes } } } };
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
  validate: (o) => workloadCauses(withClaimVolumes(o), 'StatefulSet', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Ready', type: 'string', description: 'Number of the pod with ready state' },
    ageColumn,
    ...containersColumns,
  ],
  row: (o, now) => workloadRow(o, now, statefulSetCells(specOf(o), statusOf(o)), specOf(o).template, false),
};
