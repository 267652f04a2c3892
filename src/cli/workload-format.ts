/**
 * What `skiff get deployments|daemonsets|jobs|cronjobs` and `skiff rollout
 * status` print, as pure functions of the controllers' statuses, with
 * kubectl's columns and wording; the cells are the API's tables' own
 * (src/api/kinds/workload-rows.ts), so both say the same.
 */
import { humanDuration } from '../api/kinds/common.js';
import { cronJobCells, daemonSetCells, deploymentCells, formatLabels, jobCells, jobState as jobStateOf, selectorString } from '../api/kinds/workload-rows.js';
import type { WorkloadStatus } from '../controllers/types.js';

export { humanDuration };

/** Columns padded as kubectl's tabwriter does: each as wide as its widest cell, three spaces apart. */
export function renderTable(header: string[], rows: string[][]): string {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((c, i) => (i === cells.length - 1 ? c : c.padEnd(widths[i]! + 3)))
      .join('')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n') + '\n';
}

function num(v: unknown): number {
  return typeof v === 'number' && Number.isFinite(v) ? v : 0;
}

function visible(items: WorkloadStatus[], kind: WorkloadStatus['kind']): WorkloadStatus[] {
  return items.filter((s) => s.kind === kind && !s.deleted);
}

export interface TableOptions {
  now: number;
  /** Prefix a NAMESPACE column (kubectl -A). */
  allNamespaces?: boolean;
}

function table(items: WorkloadStatus[], header: string[], row: (s: WorkloadStatus) => string[], opts: TableOptions): string {
  if (items.length === 0) return 'No resources found\n';
  const sorted = [...items].sort((a, b) => (a.namespace + '/' + a.name < b.namespace + '/' + b.name ? -1 : 1));
  return renderTable(
    opts.allNamespaces ? ['NAMESPACE', ...header] : header,
    sorted.map((s) => (opts.allNamespaces ? [s.namespace, ...row(s)] : row(s))),
  );
}

function age(s: WorkloadStatus, now: number): string {
  return humanDuration(now - s.createdAt);
}

export function formatDeployments(items: WorkloadStatus[], opts: TableOptions): string {
  return table(
    visible(items, 'Deployment'),
    ['NAME', 'READY', 'UP-TO-DATE', 'AVAILABLE', 'AGE'],
    (s) => [s.name, ...deploymentCells(s.spec, s.status).map(String), age(s, opts.now)],
    opts,
  );
}

function nodeSelector(spec: Record<string, unknown>): string {
  const t = spec.template as { spec?: { nodeSelector?: unknown } } | undefined;
  return formatLabels(t?.spec?.nodeSelector);
}

export function formatDaemonSets(items: WorkloadStatus[], opts: TableOptions): string {
  return table(
    visible(items, 'DaemonSet'),
    ['NAME', 'DESIRED', 'CURRENT', 'READY', 'UP-TO-DATE', 'AVAILABLE', 'NODE SELECTOR', 'AGE'],
    (s) => [s.name, ...daemonSetCells(s.spec, s.status).map(String), age(s, opts.now)],
    opts,
  );
}

interface Cond {
  type?: string;
  status?: string;
  reason?: string;
  message?: string;
}

function conditions(s: WorkloadStatus): Cond[] {
  return Array.isArray(s.status.conditions) ? (s.status.conditions as Cond[]) : [];
}

/** kubectl's Job STATUS column. */
export function jobState(s: WorkloadStatus): string {
  return jobStateOf(s.status, false);
}

export function formatJobs(items: WorkloadStatus[], opts: TableOptions): string {
  return table(visible(items, 'Job'), ['NAME', 'STATUS', 'COMPLETIONS', 'DURATION', 'AGE'], (s) => [s.name, ...jobCells(s.spec, s.status, false, opts.now), age(s, opts.now)], opts);
}

export function formatCronJobs(items: WorkloadStatus[], opts: TableOptions): string {
  return table(
    visible(items, 'CronJob'),
    ['NAME', 'SCHEDULE', 'SUSPEND', 'ACTIVE', 'LAST SCHEDULE', 'AGE'],
    (s) => {
      const [schedule, , , active, last] = cronJobCells(s.spec, s.status, opts.now);
      return [s.name, schedule || '<invalid>', s.spec.suspend === true ? 'True' : 'False', String(active), last, age(s, opts.now)];
    },
    opts,
  );
}

export type RolloutStatus = { done: boolean; message: string } | { error: string };

/** `skiff rollout status deployment/NAME`: kubectl's messages, one status at a time. */
export function rolloutStatus(s: WorkloadStatus): RolloutStatus {
  if (s.kind !== 'Deployment') return { error: `rollout status is only available for deployments here, not ${s.kind}` };
  if (s.problems.length) return { error: `deployment "${s.name}" cannot be rolled out: ${s.problems.join('; ')}` };
  const progressing = conditions(s).find((c) => c.type === 'Progressing');
  if (progressing?.reason === 'ProgressDeadlineExceeded') return { error: `deployment "${s.name}" exceeded its progress deadline` };
  const replicas = typeof s.spec.replicas === 'number' ? s.spec.replicas : 1;
  const updated = num(s.status.updatedReplicas);
  const current = num(s.status.replicas);
  const available = num(s.status.availableReplicas);
  const wait = (what: string) => ({ done: false, message: `Waiting for deployment "${s.name}" rollout to finish: ${what}...` });
  if (updated < replicas) return wait(`${updated} out of ${replicas} new replicas have been updated`);
  if (current > updated) return wait(`${current - updated} old replicas are pending termination`);
  if (available < updated) return wait(`${available} of ${updated} updated replicas are available`);
  return { done: true, message: `deployment "${s.name}" successfully rolled out` };
}

// ---------------------------------------------------------------- describe

function selectorText(sel: unknown): string {
  return selectorString(sel) || '<none>';
}

function containersText(template: unknown): string[] {
  const t = template as { spec?: { containers?: Array<{ name?: string; image?: string }> } } | undefined;
  const cs = Array.isArray(t?.spec?.containers) ? t!.spec!.containers! : [];
  return ['Pod Template:', '  Containers:', ...cs.flatMap((c) => [`   ${c?.name ?? '?'}:`, `    Image:  ${c?.image ?? '<none>'}`])];
}

function conditionsText(s: WorkloadStatus): string[] {
  const cs = conditions(s);
  if (!cs.length) return [];
  const rows = cs.map((c) => [c.type ?? '', c.status ?? '', c.reason ?? '']);
  return ['Conditions:', ...renderTable(['Type', 'Status', 'Reason'], [['----', '------', '------'], ...rows]).trimEnd().split('\n').map((l) => `  ${l}`)];
}

function fields(pairs: Array<[string, string]>): string[] {
  const w = Math.max(...pairs.map(([k]) => k.length)) + 3;
  return pairs.map(([k, v]) => `${`${k}:`.padEnd(w)}${v}`);
}

/** `skiff describe deployment|daemonset|job|cronjob NAME`: kubectl's main fields, the conditions and any problems. */
export function describeWorkload(s: WorkloadStatus, opts: { now: number }): string {
  const spec = s.spec;
  const st = s.status;
  const head: Array<[string, string]> = [
    ['Name', s.name],
    ['Namespace', s.namespace],
    ['Age', humanDuration(opts.now - s.createdAt)],
  ];
  let body: Array<[string, string]> = [];
  switch (s.kind) {
    case 'Deployment': {
      const replicas = typeof spec.replicas === 'number' ? spec.replicas : 1;
      const strategy = (spec.strategy ?? {}) as { type?: string; rollingUpdate?: { maxSurge?: unknown; maxUnavailable?: unknown } };
      body = [
        ['Selector', selectorText(spec.selector)],
        ['Replicas', `${replicas} desired | ${num(st.updatedReplicas)} updated | ${num(st.replicas)} total | ${num(st.availableReplicas)} available | ${num(st.unavailableReplicas)} unavailable`],
        ['StrategyType', strategy.type ?? 'RollingUpdate'],
        ['MinReadySeconds', String(typeof spec.minReadySeconds === 'number' ? spec.minReadySeconds : 0)],
        ...(strategy.type === 'Recreate'
          ? []
          : ([['RollingUpdateStrategy', `${String(strategy.rollingUpdate?.maxUnavailable ?? '25%')} max unavailable, ${String(strategy.rollingUpdate?.maxSurge ?? '25%')} max surge`]] as Array<[string, string]>)),
      ];
      break;
    }
    case 'DaemonSet':
      body = [
        ['Selector', selectorText(spec.selector)],
        ['Node-Selector', nodeSelector(spec)],
        ['Desired Number of Nodes Scheduled', String(num(st.desiredNumberScheduled))],
        ['Current Number of Nodes Scheduled', String(num(st.currentNumberScheduled))],
        ['Number of Nodes Scheduled with Up-to-date Pods', String(num(st.updatedNumberScheduled))],
        ['Number of Nodes Scheduled with Available Pods', String(num(st.numberAvailable))],
      ];
      break;
    case 'Job':
      body = [
        ...(s.ownerCronJob ? ([['Controlled By', `CronJob/${s.ownerCronJob}`]] as Array<[string, string]>) : []),
        ['Parallelism', String(typeof spec.parallelism === 'number' ? spec.parallelism : 1)],
        ['Completions', typeof spec.completions === 'number' ? String(spec.completions) : '<unset>'],
        ['Completion Mode', spec.completionMode === 'Indexed' ? 'Indexed' : 'NonIndexed'],
        ...(spec.completionMode === 'Indexed'
          ? ([['Completed Indexes', typeof st.completedIndexes === 'string' && st.completedIndexes ? st.completedIndexes : '<none>']] as Array<[string, string]>)
          : []),
        ['Backoff Limit', String(typeof spec.backoffLimit === 'number' ? spec.backoffLimit : 6)],
        ...(typeof spec.activeDeadlineSeconds === 'number' ? ([['Active Deadline Seconds', `${spec.activeDeadlineSeconds}s`]] as Array<[string, string]>) : []),
        ...(typeof spec.ttlSecondsAfterFinished === 'number' ? ([['TTL Seconds After Finished', String(spec.ttlSecondsAfterFinished)]] as Array<[string, string]>) : []),
        ['Start Time', typeof st.startTime === 'string' ? st.startTime : '<none>'],
        ...(typeof st.completionTime === 'string' ? ([['Completed At', st.completionTime]] as Array<[string, string]>) : []),
        ['Pods Statuses', `${num(st.active)} Active (${num(st.ready)} Ready) / ${num(st.succeeded)} Succeeded / ${num(st.failed)} Failed`],
      ];
      break;
    case 'CronJob': {
      const active = Array.isArray(st.active) ? (st.active as Array<{ name?: string }>).map((a) => a.name ?? '?') : [];
      body = [
        ['Schedule', typeof spec.schedule === 'string' ? spec.schedule : '<invalid>'],
        ['Concurrency Policy', typeof spec.concurrencyPolicy === 'string' ? spec.concurrencyPolicy : 'Allow'],
        ['Suspend', spec.suspend === true ? 'True' : 'False'],
        ['Successful Job History Limit', String(typeof spec.successfulJobsHistoryLimit === 'number' ? spec.successfulJobsHistoryLimit : 3)],
        ['Failed Job History Limit', String(typeof spec.failedJobsHistoryLimit === 'number' ? spec.failedJobsHistoryLimit : 1)],
        ['Starting Deadline Seconds', typeof spec.startingDeadlineSeconds === 'number' ? `${spec.startingDeadlineSeconds}s` : '<unset>'],
        ['Last Schedule Time', typeof st.lastScheduleTime === 'string' ? st.lastScheduleTime : '<unset>'],
        ['Active Jobs', active.length ? active.join(', ') : '<none>'],
      ];
      break;
    }
  }
  const template = s.kind === 'CronJob' ? (spec.jobTemplate as { spec?: { template?: unknown } } | undefined)?.spec?.template : spec.template;
  const lines = [
    ...fields([...head, ...body]),
    ...(s.deleted ? ['Deleted:  its ttlSecondsAfterFinished has passed'] : []),
    ...containersText(template),
    ...conditionsText(s),
    ...(s.problems.length ? ['Problems:', ...s.problems.map((p) => `  ${p}`)] : []),
  ];
  return lines.join('\n') + '\n';
}
