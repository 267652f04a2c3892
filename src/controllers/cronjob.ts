/**
 * The CronJob controller. The Jobs it makes are not files: each lives in
 * ControllerState as a VirtualJob (the jobTemplate as it was when the Job was
 * made) and is run by the Job controller in the same call, named
 * `<cronjob>-<scheduled time in minutes since the epoch>` as Kubernetes names them.
 */
import type { CronJob, CronJobStatus, JobSpec } from 'kubernetes-types/batch/v1.js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import { append, derivedUid, iso, type Ctx } from './common.js';
import { mostRecent, parseCron } from './cron.js';
import { jobMemoryKey, reconcileJob, type JobResult } from './job.js';
import type { ControllerState, VirtualJob, WorkloadStatus } from './types.js';
import { validateJobSpec } from './validate.js';

export interface CronJobResult {
  pods: Pod[];
  status: CronJobStatus;
  problems: string[];
  /** The status of each Job it owns, for `skiff get jobs`. */
  jobs: WorkloadStatus[];
}

export function cronJobName(cronJob: string, scheduledTime: number): string {
  return `${cronJob}-${Math.floor(scheduledTime / 60_000)}`;
}

/** The Jobs a CronJob made (namespace/name keys of state.virtualJobs). */
function jobsOf(ctx: Ctx, namespace: string, cronJob: string): VirtualJob[] {
  return Object.values(ctx.state.virtualJobs).filter((j) => j.namespace === namespace && j.cronJob === cronJob);
}

function runVirtualJob(ctx: Ctx, j: VirtualJob, podsByJob: Map<string, Pod[]>): JobResult {
  const spec = j.template.spec as unknown as JobSpec;
  return reconcileJob(
    ctx,
    { namespace: j.namespace, name: j.name, spec, uid: j.uid ?? derivedUid(`${j.namespace}/${j.name}/${j.scheduledTime}`), problems: validateJobSpec(spec) },
    podsByJob.get(`${j.namespace}/${j.name}`) ?? [],
  );
}

export function forgetJob(state: ControllerState, namespace: string, name: string): void {
  delete state.virtualJobs[`${namespace}/${name}`];
  delete state.jobs[jobMemoryKey(namespace, name)];
}

/**
 * `podsByJob` maps "namespace/jobName" to the pods owned by that Job;
 * `fileJobs` are names of Jobs that exist as files (never shadowed).
 */
export function reconcileCronJob(
  ctx: Ctx,
  o: StoredObject,
  podsByJob: Map<string, Pod[]>,
  fileJobs: Set<string>,
  problems: string[],
): CronJobResult {
  const { now, state } = ctx;
  const key = `${o.namespace}/${o.name}`;
  const cj = o.object as CronJob;
  const mem = (state.cronJobs[key] ??= { createdAt: now });
  const allProblems = [...problems];
  const parsed = problems.length ? undefined : parseCron(cj.spec?.schedule);
  if (parsed && !parsed.ok) allProblems.push(`spec.schedule: ${parsed.error}`);

  // 1. Where every Job it made stands.
  let results = new Map<string, { job: VirtualJob; result: JobResult }>();
  for (const j of jobsOf(ctx, o.namespace, o.name)) results.set(j.name, { job: j, result: runVirtualJob(ctx, j, podsByJob) });
  const finishedType = (r: JobResult) => r.memory.finished?.type;
  for (const { result } of results.values()) {
    const fin = result.memory.finished;
    if (fin?.type === 'Complete' && (mem.lastSuccessfulTime === undefined || fin.at > mem.lastSuccessfulTime)) mem.lastSuccessfulTime = fin.at;
  }

  // 2. Finished Jobs beyond the history limits go, oldest first; so do Jobs whose ttl passed.
  const spec = cj.spec;
  const limits = { Complete: spec?.successfulJobsHistoryLimit ?? 3, Failed: spec?.failedJobsHistoryLimit ?? 1 };
  for (const type of ['Complete', 'Failed'] as const) {
    const done = [...results.values()]
      .filter(({ result }) => finishedType(result) === type)
      .sort((a, b) => b.job.scheduledTime - a.job.scheduledTime);
    for (const { job } of done.slice(Math.max(0, limits[type]))) {
      forgetJob(ctx.state, job.namespace, job.name);
      results.delete(job.name);
    }
  }
  for (const [name, { job, result }] of results) {
    if (result.expired) {
      forgetJob(ctx.state, job.namespace, job.name);
      results.delete(name);
    }
  }

  // 3. A new Job when a schedule time has come.
  if (parsed?.ok && allProblems.length === 0) {
    const schedule = parsed.schedule;
    const deadline = spec?.startingDeadlineSeconds;
    let earliest = mem.lastScheduleTime ?? mem.createdAt;
    if (deadline !== undefined && deadline !== null) earliest = Math.max(earliest, now - deadline * 1000);
    const due = spec?.suspend ? undefined : mostRecent(schedule, earliest, now);
    const active = () => [...results.values()].filter(({ result }) => !result.memory.finished);
    if (due !== undefined) {
      const policy = spec?.concurrencyPolicy ?? 'Allow';
      const name = cronJobName(o.name, due);
      if (results.has(name)) {
        mem.lastScheduleTime = Math.max(mem.lastScheduleTime ?? 0, due);
      } else if (fileJobs.has(`${o.namespace}/${name}`)) {
        allProblems.push(`a Job named ${name} already exists as a file; the run scheduled for ${iso(due)} was not started`);
        mem.lastScheduleTime = due;
      } else if (policy === 'Forbid' && active().length > 0) {
        // Skipped, not lost: the same time is tried again once the running Job ends (unless its deadline passes).
      } else {
        if (policy === 'Replace') {
          for (const { job } of active()) {
            forgetJob(ctx.state, job.namespace, job.name);
            results.delete(job.name);
          }
        }
        const job: VirtualJob = {
          namespace: o.namespace,
          name,
          cronJob: o.name,
          scheduledTime: due,
          template: structuredClone({
            ...(cj.spec!.jobTemplate.metadata ? { metadata: cj.spec!.jobTemplate.metadata as Record<string, unknown> } : {}),
            spec: (cj.spec!.jobTemplate.spec ?? {}) as Record<string, unknown>,
          }),
        };
        state.virtualJobs[`${o.namespace}/${name}`] = job;
        results.set(name, { job, result: runVirtualJob(ctx, job, podsByJob) });
        mem.lastScheduleTime = due;
      }
    }
    if (!spec?.suspend) {
      const next = schedule.next(now);
      if (next !== undefined) ctx.requeueAt(next);
    }
  }

  results = new Map([...results].sort(([, a], [, b]) => a.job.scheduledTime - b.job.scheduledTime));
  const pods: Pod[] = [];
  const jobs: WorkloadStatus[] = [];
  for (const { job, result } of results.values()) {
    append(pods, result.pods);
    jobs.push({
      kind: 'Job',
      namespace: job.namespace,
      name: job.name,
      status: result.status as unknown as Record<string, unknown>,
      spec: job.template.spec,
      problems: [],
      createdAt: result.memory.createdAt,
      ownerCronJob: o.name,
    });
  }
  const activeRefs = [...results.values()]
    .filter(({ result }) => !result.memory.finished)
    .map(({ job, result }) => ({ apiVersion: 'batch/v1', kind: 'Job', name: job.name, namespace: job.namespace, uid: result.memory.uid }));
  const status: CronJobStatus = {
    ...(activeRefs.length ? { active: activeRefs } : {}),
    ...(mem.lastScheduleTime !== undefined ? { lastScheduleTime: iso(mem.lastScheduleTime) } : {}),
    ...(mem.lastSuccessfulTime !== undefined ? { lastSuccessfulTime: iso(mem.lastSuccessfulTime) } : {}),
  };
  return { pods, status, problems: allProblems, jobs };
}
