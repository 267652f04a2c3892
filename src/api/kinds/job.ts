/**
 * batch/v1 Job: defaulted as the API server defaults it (one completion at
 * a time, six retries, NonIndexed, not suspended, pods replaced once
 * terminated, a selector of its own uid and the job-name/controller-uid
 * labels on its template), validated by the Job controller's checks, its
 * selector, template and completion mode immutable, with kubectl's columns.
 */
import type { ApiObject, Kind, Obj } from '../types.js';
import { isObj, setDefault } from './common.js';
import { jobCells } from './workload-rows.js';
import { ageColumn, containersColumns, defaultTemplate, keepField, keepSelector, nameColumn, selectorColumn, specOf, statusOf, workloadCauses, workloadRow } from './workload.js';

/** The labels the API server puts on a Job's pods, legacy and prefixed. */
export const JOB_NAME_LABELS = ['job-name', 'batch.kubernetes.io/job-name'];
export const CONTROLLER_UID_LABELS = ['controller-uid', 'batch.kubernetes.io/controller-uid'];

/** SetDefaults_Job's part that lies in the spec (CronJobs' job templates get none of it). */
function defaultJobSpec(spec: Obj): void {
  if ((spec.completions === undefined || spec.completions === null) && (spec.parallelism === undefined || spec.parallelism === null)) {
    spec.completions = 1;
    spec.parallelism = 1;
  }
  setDefault(spec, 'parallelism', 1);
  setDefault(spec, 'backoffLimit', spec.backoffLimitPerIndex !== undefined && spec.backoffLimitPerIndex !== null ? 2147483647 : 6);
  setDefault(spec, 'completionMode', 'NonIndexed');
  setDefault(spec, 'suspend', false);
  setDefault(spec, 'podReplacementPolicy', spec.podFailurePolicy !== undefined && spec.podFailurePolicy !== null ? 'Failed' : 'TerminatingOrFailed');
  setDefault(spec, 'manualSelector', false);
  defaultTemplate(spec.template);
}

/** The job's own selector and its template's labels, unless it asked to choose them (manualSelector). */
function generateSelector(o: ApiObject, spec: Obj): void {
  if (spec.manualSelector === true || !isObj(spec.template)) return;
  const t = spec.template;
  if (!isObj(t.metadata)) t.metadata = {};
  const meta = t.metadata as Obj;
  const labels: Obj = isObj(meta.labels) ? meta.labels : {};
  meta.labels = labels;
  for (const k of JOB_NAME_LABELS) setDefault(labels, k, o.metadata.name);
  for (const k of CONTROLLER_UID_LABELS) setDefault(labels, k, o.metadata.uid);
  if (!isObj(spec.selector)) spec.selector = {};
  const sel = spec.selector as Obj;
  if (!isObj(sel.matchLabels)) sel.matchLabels = {};
  setDefault(sel.matchLabels as Obj, CONTROLLER_UID_LABELS[1]!, o.metadata.uid);
}

export const jobKind: Kind = {
  group: 'batch',
  version: 'v1',
  kind: 'Job',
  plural: 'jobs',
  singular: 'job',
  shortNames: [],
  categories: ['all'],
  namespaced: true,
  status: true,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    const spec = o.spec;
    defaultJobSpec(spec);
    if (!old) {
      generateSelector(o, spec);
      // As a Job read back from storage is defaulted again: no labels of its own, its template's.
      const labels = o.metadata.labels;
      const templateLabels = isObj(spec.template) && isObj(spec.template.metadata) ? spec.template.metadata.labels : undefined;
      if ((!isObj(labels) || Object.keys(labels).length === 0) && isObj(templateLabels)) o.metadata.labels = { ...(templateLabels as Record<string, string>) };
      o.status = {};
      return;
    }
    keepSelector(jobKind, o, old);
    keepField(jobKind, o, old, 'template');
    keepField(jobKind, o, old, 'completionMode');
    if (specOf(o).completionMode !== 'Indexed') keepField(jobKind, o, old, 'completions');
  },
  validate: (o) => workloadCauses(o, 'Job', ['spec', 'template']),
  known: { spec: 'map', status: 'map' },
  fields: { 'status.successful': (o) => String(statusOf(o).succeeded ?? 0) },
  columns: [
    nameColumn,
    { name: 'Status', type: 'string', description: 'Status of the job.' },
    { name: 'Completions', type: 'string', description: 'The desired number of successfully finished pods the job should be run with.' },
    { name: 'Duration', type: 'string', description: 'Time required to complete the job.' },
    ageColumn,
    ...containersColumns,
    { ...selectorColumn, description: 'A label query over pods that should match the pod count.' },
  ],
  row: (o, now) => workloadRow(o, now, jobCells(specOf(o), statusOf(o), Boolean(o.metadata.deletionTimestamp), now), specOf(o).template, true),
};
