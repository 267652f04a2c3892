/**
 * apps/v1 Deployment: defaulted as the API server defaults it (replicas 1,
 * a 25%/25% rolling update, 10 revisions kept, a 600 s progress deadline,
 * pod defaults on the template), validated by the Deployment controller's
 * own checks, its selector immutable, scalable, with kubectl's columns.
 */
import type { Kind } from '../types.js';
import { isObj, setDefault } from './common.js';
import { deploymentCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, keepSelector, nameColumn, replicatedScale, selectorColumn, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

export const deploymentKind: Kind = {
  group: 'apps',
  version: 'v1',
  kind: 'Deployment',
  plural: 'deployments',
  singular: 'deployment',
  shortNames: ['deploy'],
  categories: ['all'],
  namespaced: true,
  status: true,
  scale: replicatedScale,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    setDefault(spec, 'replicas', 1);
    if (!isObj(spec.strategy)) spec.strategy = {};
    const strategy = spec.strategy as Record<string, unknown>;
    setDefault(strategy, 'type', 'RollingUpdate');
    if (strategy.type === 'RollingUpdate') {
      if (!isObj(strategy.rollingUpdate)) strategy.rollingUpdate = {};
      setDefault(strategy.rollingUpdate as Record<string, unknown>, 'maxUnavailable', '25%');
      setDefault(strategy.rollingUpdate as Record<string, unknown>, 'maxSurge', '25%');
    }
    setDefault(spec, 'revisionHistoryLimit', 10);
    setDefault(spec, 'progressDeadlineSeconds', 600);
    defaultTemplate(spec.template);
    if (old) keepSelector(deploymentKind, o, old);
    else o.status = {};
  },
  validate: (o) => workloadCauses(o, 'Deployment', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Ready', type: 'string', description: 'Number of the pod with ready state' },
    { name: 'Up-to-date', type: 'string', description: 'Total number of non-terminated pods targeted by this deployment that have the desired template spec.' },
    { name: 'Available', type: 'string', description: 'Total number of available pods (ready for at least minReadySeconds) targeted by this deployment.' },
    ageColumn,
    ...containersColumns,
    selectorColumn,
  ],
  row: (o, now) => workloadRow(o, now, deploymentCells(specOf(o), statusOf(o)), specOf(o).template, true),
};
