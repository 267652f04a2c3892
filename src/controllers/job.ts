/**
 * The Job controller. Counts come from the pods themselves (Succeeded and
 * Failed pods stay in the desired set, unchanged, until the Job's
 * ttlSecondsAfterFinished passes or the Job goes away), and what must be
 * remembered — start time, how it finished, whether the ttl passed — lives in
 * ControllerState, so a finished Job stays finished.
 *
 * Work-queue mode (completions unset): up to `parallelism` pods run; once one
 * succeeds no new pod starts, and the Job completes when the others have ended.
 */
import type { JobSpec, JobStatus } from 'kubernetes-types/batch/v1.js';
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import {
  condition,
  desiredCopy,
  generateName,
  isReady,
  isTerminating,
  iso,
  parseTime,
  podFromTemplate,
  removalOrder,
  restartCount,
  templateHash,
  type Ctx,
} from './common.js';
import type { JobMemory } from './types.js';

export const JOB_NAME_LABEL = 'batch.kubernetes.io/job-name';
export const LEGACY_JOB_NAME_LABEL = 'job-name';
export const CONTROLLER_UID_LABEL = 'batch.kubernetes.io/controller-uid';
export const LEGACY_CONTROLLER_UID_LABEL = 'controller-uid';

/** The Job controller's pod-failure back-off: 10 s, doubled per failure, at most 6 minutes. */
const FAILURE_BACKOFF_MS = 10_000;
const FAILURE_BACKOFF_MAX_MS = 360_000;

export interface JobInput {
  namespace: string;
  name: string;
  spec: JobSpec;
  /** The uid the Job gets if it is new (a file Job's object uid; derived for a CronJob's Job). */
  uid: string;
  problems: string[];
}

export interface JobResult {
  pods: Pod[];
  status: JobStatus;
  memory: JobMemory;
  /** ttlSecondsAfterFinished passed: its pods are gone; show it as deleted. */
  expired: boolean;
}

function phase(p: Pod): string | undefined {
  return p.status?.phase;
}

/** When a finished pod ended: its containers' latest finishedAt. */
export function finishedAt(p: Pod): number | undefined {
  let t: number | undefined;
  for (const s of [...(p.status?.initContainerStatuses ?? []), ...(p.status?.containerStatuses ?? [])]) {
    const f = parseTime(s?.state?.terminated?.finishedAt);
    if (f !== undefined && (t === undefined || f > t)) t = f;
  }
  return t;
}

export function jobMemoryKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

export function reconcileJob(ctx: Ctx, job: JobInput, owned: Pod[]): JobResult {
  const { now, state } = ctx;
  const key = jobMemoryKey(job.namespace, job.name);
  const spec = job.spec;
  const template = (spec?.template ?? {}) as PodTemplateSpec;
  const th = templateHash(template);
  let mem = state.jobs[key];
  // An invalid edit does not restart the Job (the API server would have refused it): keep what it was.
  if (!mem || (mem.templateHash !== th && job.problems.length === 0)) {
    // A Job's template cannot change: a new one means a new Job under the same name, which starts over.
    mem = { uid: job.uid, templateHash: th, createdAt: mem?.createdAt ?? now };
    state.jobs[key] = mem;
  }
  const uid = mem.uid;
  const mine = owned.filter((p) => p.metadata?.labels?.[CONTROLLER_UID_LABEL] === uid && !isTerminating(p));
  const succeededPods = mine.filter((p) => phase(p) === 'Succeeded');
  const failedPods = mine.filter((p) => phase(p) === 'Failed');
  let live = mine.filter((p) => phase(p) !== 'Succeeded' && phase(p) !== 'Failed');
  const finishedPods = [...succeededPods, ...failedPods];
  const succeeded = succeededPods.length;
  const failed = failedPods.length;

  const conditions: NonNullable<JobStatus['conditions']> = [];
  /** A condition whose time is remembered across calls (for ones that hold while a state lasts). */
  const heldCondition = (type: string, reason: string, message: string) =>
    jobCondition(type, reason, message, condition(state, `Job/${key}`, type, 'True', reason, message, now).lastTransitionTime);
  const jobCondition = (type: string, reason: string, message: string, at: number) => ({
    type,
    status: 'True',
    reason,
    message,
    lastProbeTime: iso(at),
    lastTransitionTime: iso(at),
  });
  const statusOf = (active: Pod[]): JobStatus => ({
    ...(mem!.startTime !== undefined ? { startTime: iso(mem!.startTime) } : {}),
    ...(mem!.finished?.type === 'Complete' ? { completionTime: iso(mem!.finished.at) } : {}),
    active: active.length,
    succeeded,
    failed,
    ready: active.filter(isReady).length,
    ...(conditions.length ? { conditions } : {}),
  });

  if (mem.expired) return { pods: [], status: finishedStatus(mem), memory: mem, expired: true };
  if (mine.length) mem.counts = { succeeded, failed };

  if (job.problems.length) {
    // Refused as written: nothing new starts; what was made before is left as it is.
    conditions.push(heldCondition('Failed', 'InvalidSpec', `the Job cannot be used as written: ${job.problems.join('; ')}`));
    return { pods: mine.map(desiredCopy), status: statusOf(live), memory: mem, expired: false };
  }

  delete state.conditions[`Job/${key}/Failed`];
  if (!spec.suspend) delete state.conditions[`Job/${key}/Suspended`];
  const parallelism = spec.parallelism ?? 1;
  const completions = spec.completions ?? undefined;
  const backoffLimit = spec.backoffLimit ?? 6;
  const onFailure = template.spec?.restartPolicy === 'OnFailure';
  const created: Pod[] = [];

  if (!mem.finished) {
    if (spec.suspend) {
      // Suspended: running pods stop, the clock stops (startTime is cleared as the API does).
      delete mem.startTime;
      conditions.push(heldCondition('Suspended', 'JobSuspended', 'Job suspended'));
      return { pods: finishedPods.map(desiredCopy), status: statusOf([]), memory: mem, expired: false };
    }
    mem.startTime ??= now;
    const restarts = live.reduce((n, p) => n + restartCount(p), 0);
    const pastOnFailure = onFailure && (backoffLimit === 0 ? restarts > 0 : restarts >= backoffLimit);
    const deadline = spec.activeDeadlineSeconds;
    if (failed > backoffLimit || pastOnFailure) {
      mem.finished = { type: 'Failed', reason: 'BackoffLimitExceeded', message: 'Job has reached the specified backoff limit', at: now };
    } else if (deadline !== undefined && deadline !== null && now - mem.startTime >= deadline * 1000) {
      mem.finished = { type: 'Failed', reason: 'DeadlineExceeded', message: 'Job was active longer than specified deadline', at: now };
    } else if (completions !== undefined ? succeeded >= completions : succeeded > 0 && live.length === 0) {
      mem.finished = { type: 'Complete', reason: 'CompletionsReached', message: 'Reached expected number of succeeded pods', at: now };
    } else {
      if (deadline !== undefined && deadline !== null) ctx.requeueAt(mem.startTime + deadline * 1000);
      const wantActive = completions !== undefined ? Math.min(parallelism, completions - succeeded) : succeeded > 0 ? live.length : parallelism;
      if (live.length > wantActive) {
        const victims = new Set([...live].sort(removalOrder).slice(0, live.length - wantActive));
        live = live.filter((p) => !victims.has(p));
      } else if (live.length < wantActive) {
        const notBefore = failureBackoffUntil(failedPods);
        if (notBefore !== undefined && now < notBefore) ctx.requeueAt(notBefore);
        else {
          for (let i = live.length; i < wantActive; i++) {
            const name = generateName(job.name, job.namespace, ctx.random, ctx.taken);
            created.push(
              podFromTemplate({
                template,
                name,
                namespace: job.namespace,
                labels: {
                  [CONTROLLER_UID_LABEL]: uid,
                  [LEGACY_CONTROLLER_UID_LABEL]: uid,
                  [JOB_NAME_LABEL]: job.name,
                  [LEGACY_JOB_NAME_LABEL]: job.name,
                },
                owner: { apiVersion: 'batch/v1', kind: 'Job', name: job.name, uid },
                now,
                nodeName: ctx.nodeName,
              }),
            );
          }
        }
      }
      return { pods: [...finishedPods, ...live].map(desiredCopy).concat(created), status: statusOf([...live, ...created]), memory: mem, expired: false };
    }
  }

  // Finished: running pods are removed; finished ones stay until the ttl passes.
  const fin = mem.finished!;
  const ttl = spec.ttlSecondsAfterFinished;
  if (ttl !== undefined && ttl !== null) {
    const at = fin.at + ttl * 1000;
    if (now >= at) {
      mem.expired = true;
      return { pods: [], status: finishedStatus(mem, succeeded, failed), memory: mem, expired: true };
    }
    ctx.requeueAt(at);
  }
  conditions.push(jobCondition(fin.type, fin.reason, fin.message, fin.at));
  return { pods: finishedPods.map(desiredCopy), status: statusOf([]), memory: mem, expired: false };
}

/** A finished Job's status once its pods are gone (counts as last seen, or 0). */
function finishedStatus(mem: JobMemory, succeeded = 0, failed = 0): JobStatus {
  const fin = mem.finished;
  return {
    ...(mem.startTime !== undefined ? { startTime: iso(mem.startTime) } : {}),
    ...(fin?.type === 'Complete' ? { completionTime: iso(fin.at) } : {}),
    active: 0,
    succeeded: Math.max(succeeded, mem.counts?.succeeded ?? 0),
    failed: Math.max(failed, mem.counts?.failed ?? 0),
    ...(fin
      ? { conditions: [{ type: fin.type, status: 'True', reason: fin.reason, message: fin.message, lastProbeTime: iso(fin.at), lastTransitionTime: iso(fin.at) }] }
      : {}),
  };
}

/** After failed pods, the next one waits 10 s × 2^(failures-1) (at most 6 min) from the last failure. */
function failureBackoffUntil(failedPods: Pod[]): number | undefined {
  if (failedPods.length === 0) return undefined;
  let last: number | undefined;
  for (const p of failedPods) {
    const t = finishedAt(p);
    if (t !== undefined && (last === undefined || t > last)) last = t;
  }
  if (last === undefined) return undefined;
  const delay = Math.min(FAILURE_BACKOFF_MAX_MS, FAILURE_BACKOFF_MS * 2 ** Math.min(30, failedPods.length - 1));
  return last + delay;
}
