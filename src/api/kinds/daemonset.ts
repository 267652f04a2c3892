/**
 * apps/v1 DaemonSet: defaulted (a rolling update of 1 unavailable, 0
 * surge; 10 revisions; pod defaults on the template), validated by the
 * DaemonSet controller's checks, its selector immutable, with kubectl's columns.
 */
import type { Kind } from '../types.js';
import { isObj, setDefault } from './common.js';
import { daemonSetCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, keepSelector, nameColumn, selectorColumn, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

export const daemonSetKind: Kind = {
  group: 'apps',
  version: 'v1',
  kind: 'DaemonSet',
  plural: 'daemonsets',
  singular: 'daemonset',
  shortNames: ['ds'],
  categories: ['all'],
  namespaced: true,
  status: true,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    if (!isObj(spec.updateStrategy)) spec.updateStrategy = {};
    const us = spec.updateStrategy as Record<string, unknown>;
    setDefault(us, 'type', 'RollingUpdate');
    if (us.type === 'RollingUpdate') {
      if (!isObj(us.rollingUpdate)) us.rollingUpdate = {};
      setDefault(us.rollingUpdate as Record<string, unknown>, 'maxUnavailable', 1);
      setDefault(us.rollingUpdate as Record<string, unknown>, 'maxSurge', 0);
    }
    setDefault(spec, 'revisionHistoryLimit', 10);
    defaultTemplate(spec.template);
    if (old) keepSelector(daemonSetKind, o, old);
    else o.status = { currentNumberScheduled: 0, desiredNumberScheduled: 0, numberMisscheduled: 0, numberReady: 0 };
  },
  validate: (o) => workloadCauses(o, 'DaemonSet', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Desired', type: 'integer', description: 'The total number of nodes that should be running the daemon pod (including nodes correctly running the daemon pod).' },
    { name: 'Current', type: 'integer', description: 'The number of nodes that are running at least 1 daemon pod and are supposed to run the daemon pod.' },
    { name: 'Ready', type: 'integer', description: 'The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and ready.' },
    { name: 'Up-to-date', type: 'integer', description: 'The total number of nodes that are running updated daemon pod' },
    { name: 'Available', type: 'integer', description: 'The number of nodes that should be running the daemon pod and have one or more of the daemon pod running and available (ready for at least spec.minReadySeconds)' },
    { name: 'Node Selector', type: 'string', description: 'NodeSelector is a selector which must be true for the pod to fit on a node. Selector which must match a node\'s labels for the pod to be scheduled on that node.' },
    ageColumn,
    ...containersColumns,
    { ...selectorColumn, description: 'A label query over pods that are managed by the daemon set.' },
  ],
  row: (o, now) => workloadRow(o, now, daemonSetCells(specOf(o), statusOf(o)), specOf(o).template, true),
};
