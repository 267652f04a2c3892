/**
 * batch/v1 CronJob: defaulted (Allow, not suspended, 3 successful and 1
 * failed Jobs kept; pod defaults on the job template's pod template),
 * validated by the CronJob controller's checks, with kubectl's columns.
 */
import type { Kind, Obj } from '../types.js';
import { age, isObj, setDefault } from './common.js';
import { cronJobCells, selectorString, templateCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, nameColumn, selectorColumn, specOf, statusOf, workloadCauses } from './workload.js';

const jobSpec = (spec: Obj): Obj => (isObj(spec.jobTemplate) && isObj(spec.jobTemplate.spec) ? spec.jobTemplate.spec : {});

export const cronJobKind: Kind = {
  group: 'batch',
  version: 'v1',
  kind: 'CronJob',
  plural: 'cronjobs',
  singular: 'cronjob',
  shortNames: ['cj'],
  categories: ['all'],
  namespaced: true,
  status: true,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    setDefault(spec, 'concurrencyPolicy', 'Allow');
    setDefault(spec, 'suspend', false);
    setDefault(spec, 'successfulJobsHistoryLimit', 3);
    setDefault(spec, 'failedJobsHistoryLimit', 1);
    defaultTemplate(jobSpec(spec).template);
    if (!old) o.status = {};
  },
  validate: (o) => workloadCauses(o, 'CronJob', ['spec', 'jobTemplate', 'spec', 'template']),
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Schedule', type: 'string', description: 'The schedule in Cron format, see https://en.wikipedia.org/wiki/Cron.' },
    { name: 'Timezone', type: 'string', description: 'The time zone name for the given schedule, see https://en.wikipedia.org/wiki/List_of_tz_database_time_zones.' },
    { name: 'Suspend', type: 'boolean', description: 'This flag tells the controller to suspend subsequent executions, it does not apply to already started executions.' },
    { name: 'Active', type: 'integer', description: 'A list of pointers to currently running jobs.' },
    { name: 'Last Schedule', type: 'string', description: 'Information when was the last time the job was successfully scheduled.' },
    ageColumn,
    ...containersColumns,
    { ...selectorColumn, description: 'A label query over pods that should match the pod count.' },
  ],
  row(o, now) {
    const js = jobSpec(specOf(o));
    return [o.metadata.name, ...cronJobCells(specOf(o), statusOf(o), now), age(o.metadata.creationTimestamp, now), ...templateCells(js.template), isObj(js.selector) ? selectorString(js.selector) : '<none>'];
  },
};
