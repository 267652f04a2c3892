/**
 * The Job controller. Counts come from the pods themselves (Succeeded and
 * Failed pods stay in the desired set, unchanged, until the Job's
 * ttlSecondsAfterFinished passes or the Job goes away), and what must be
 * remembered — start time, how it finished, whether the ttl passed — lives in
 * ControllerState, so a finished Job stays finished.
 *
 * Work-queue mode (completions unset): up to `parallelism` pods run; once one
 * succeeds no new pod starts, and the Job completes when the others have ended.
 *
 * Indexed mode (completionMode Indexed): each of the indexes 0 … completions-1
 * must succeed once. A pod carries its index (annotation and label
 * batch.kubernetes.io/job-completion-index, env JOB_COMPLETION_INDEX, hostname
 * `<job>-<index>`); the lowest indexes with neither a succeeded nor a running
 * pod start first, and a running pod whose index is done, out of range,
 * unknown or already taken by another running pod is removed.
 *
 * podFailurePolicy: a failed pod is matched against the rules in order; the
 * first whose exit codes or pod conditions match decides. FailJob fails the
 * Job at once (reason PodFailurePolicy), Ignore leaves the failure out of
 * status.failed and the back-off limit, Count (or no match) counts it. Every
 * failure, ignored or not, delays the next pod as the back-off says, so a Job
 * that ignores its every failure cannot churn pods as fast as they fail.
 */
import type { JobSpec, JobStatus, PodFailurePolicy } from 'kubernetes-types/batch/v1.js';
import type { ContainerStatus, Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import {
  BURST_REQUEUE_MS,
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
import { indexedHostnameProblem, isObject } from './validate.js';

export const JOB_NAME_LABEL = 'batch.kubernetes.io/job-name';
export const LEGACY_JOB_NAME_LABEL = 'job-name';
export const CONTROLLER_UID_LABEL = 'batch.kubernetes.io/controller-uid';
export const LEGACY_CONTROLLER_UID_LABEL = 'controller-uid';
/** An Indexed Job's pod's index: an annotation and a label under the same key. */
export const COMPLETION_INDEX_KEY = 'batch.kubernetes.io/job-completion-index';
const COMPLETION_INDEX_ENV = 'JOB_COMPLETION_INDEX';
/** What generateName keeps of a name's base; an index is kept whole within it. */
const MAX_GENERATED_BASE = 58;

/** The Job controller's pod-failure back-off: 10 s, doubled per failure since the last success, at most 6 minutes. */
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

/** An Indexed Job's pod's index (its annotation, else its label), or undefined when it has none that parses. */
export function completionIndex(p: Pod): number | undefined {
  const v = p.metadata?.annotations?.[COMPLETION_INDEX_KEY] ?? p.metadata?.labels?.[COMPLETION_INDEX_KEY];
  if (v === undefined || !/^(0|[1-9][0-9]{0,8})$/.test(v)) return undefined;
  return Number(v);
}

/** Ascending indexes as the API writes completedIndexes: "0-2,4,6,7". */
export function indexRanges(sorted: readonly number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < sorted.length; ) {
    let j = i;
    while (j + 1 < sorted.length && sorted[j + 1] === sorted[j]! + 1) j++;
    const first = sorted[i]!;
    const last = sorted[j]!;
    parts.push(last === first ? `${first}` : last === first + 1 ? `${first},${last}` : `${first}-${last}`);
    i = j + 1;
  }
  return parts.join(',');
}

/**
 * An Indexed Job's running pods that may go on: one per index that is in
 * range and not yet done, the one furthest along (ready longest, …) when
 * there are several.
 */
function onePerPendingIndex(live: Pod[], done: ReadonlySet<number>, completions: number): Pod[] {
  const byIndex = new Map<number, Pod[]>();
  for (const p of live) {
    const ix = completionIndex(p);
    if (ix === undefined || ix >= completions || done.has(ix)) continue;
    const same = byIndex.get(ix);
    if (same) same.push(p);
    else byIndex.set(ix, [p]);
  }
  // removalOrder sorts the pod to remove first; keep the last.
  return [...byIndex.values()].map((same) => same.sort(removalOrder)[same.length - 1]!);
}

/** The `count` lowest indexes below `completions` that are neither done nor running. */
function pendingIndexes(taken: ReadonlySet<number>, completions: number, count: number): number[] {
  const out: number[] = [];
  for (let ix = 0; ix < completions && out.length < count; ix++) if (!taken.has(ix)) out.push(ix);
  return out;
}

/** The name base of an Indexed Job's pod: `<job>-<index>`, the job name cut so the index survives generateName. */
function indexedNameBase(jobName: string, ix: number): string {
  const tail = `-${ix}`;
  return jobName.slice(0, MAX_GENERATED_BASE - tail.length - 1) + tail;
}

/** Gives an Indexed Job's new pod its index: annotation, label, hostname and JOB_COMPLETION_INDEX in each container. */
function stampIndex(pod: Pod, jobName: string, ix: number): void {
  const meta = pod.metadata!;
  meta.annotations = { ...meta.annotations, [COMPLETION_INDEX_KEY]: String(ix) };
  meta.labels = { ...meta.labels, [COMPLETION_INDEX_KEY]: String(ix) };
  const spec = pod.spec!;
  spec.hostname = `${jobName}-${ix}`;
  for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
    if (c.env?.some((e) => e.name === COMPLETION_INDEX_ENV)) continue;
    c.env = [...(c.env ?? []), { name: COMPLETION_INDEX_ENV, valueFrom: { fieldRef: { fieldPath: `metadata.labels['${COMPLETION_INDEX_KEY}']` } } }];
  }
}

interface PolicyMatch {
  action: 'FailJob' | 'Ignore' | 'Count';
  message: string;
}

/** The first terminated container of `statuses` that failed with an exit code the requirement names. */
function failedContainer(statuses: ContainerStatus[] | undefined, req: NonNullable<PodFailurePolicy['rules'][number]['onExitCodes']>): ContainerStatus | undefined {
  for (const cs of statuses ?? []) {
    const code = cs.state?.terminated?.exitCode;
    if (code === undefined || code === 0) continue;
    if (req.containerName && req.containerName !== cs.name) continue;
    const listed = Array.isArray(req.values) && req.values.includes(code);
    if (req.operator === 'In' ? listed : req.operator === 'NotIn' ? !listed : false) return cs;
  }
  return undefined;
}

/**
 * What a failed pod means under the Job's podFailurePolicy: the first rule that matches it, if any.
 * It is also asked while an edit of the Job does not validate (for the counts it shows), so a rule
 * of the wrong shape matches nothing rather than throwing.
 */
export function matchPodFailurePolicy(policy: PodFailurePolicy | undefined, pod: Pod): PolicyMatch | undefined {
  const who = `${pod.metadata?.namespace}/${pod.metadata?.name}`;
  const rules: unknown[] = Array.isArray(policy?.rules) ? policy.rules : [];
  for (const [i, r] of rules.entries()) {
    if (!isObject(r)) continue;
    const rule = r as unknown as PodFailurePolicy['rules'][number];
    const action = rule.action as PolicyMatch['action'];
    if (isObject(rule.onExitCodes)) {
      const cs = failedContainer(pod.status?.containerStatuses, rule.onExitCodes) ?? failedContainer(pod.status?.initContainerStatuses, rule.onExitCodes);
      if (cs) return { action, message: `container ${cs.name} of pod ${who} exited with code ${cs.state!.terminated!.exitCode}, which matches podFailurePolicy rule ${i} (${action})` };
    } else if (Array.isArray(rule.onPodConditions)) {
      const patterns = rule.onPodConditions.filter(isObject);
      const c = (pod.status?.conditions ?? []).find((c) => patterns.some((want) => want.type === c.type && (want.status ?? 'True') === c.status));
      if (c) return { action, message: `pod ${who} has condition ${c.type}=${c.status}, which matches podFailurePolicy rule ${i} (${action})` };
    }
  }
  return undefined;
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
  const allFailed = mine.filter((p) => phase(p) === 'Failed');
  let live = mine.filter((p) => phase(p) !== 'Succeeded' && phase(p) !== 'Failed');
  const finishedPods = [...succeededPods, ...allFailed];
  // Under a podFailurePolicy, Ignore'd failures do not count, and a FailJob match ends the Job (the earliest one says why).
  const policyMatches = new Map(allFailed.map((p) => [p, matchPodFailurePolicy(spec?.podFailurePolicy, p)]));
  const failedPods = allFailed.filter((p) => policyMatches.get(p)?.action !== 'Ignore');
  const failJob = [...allFailed]
    .sort((a, b) => (finishedAt(a) ?? 0) - (finishedAt(b) ?? 0))
    .map((p) => policyMatches.get(p))
    .find((m) => m?.action === 'FailJob');
  const indexed = spec?.completionMode === 'Indexed';
  /** An Indexed Job's indexes that have a succeeded pod: what it counts as succeeded. */
  const done = new Set<number>();
  if (indexed) {
    for (const p of succeededPods) {
      const ix = completionIndex(p);
      if (ix !== undefined && ix < (spec.completions ?? 0)) done.add(ix);
    }
  }
  const completedIndexes = indexed ? indexRanges([...done].sort((a, b) => a - b)) : '';
  const succeeded = indexed ? done.size : succeededPods.length;
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
    ...(completedIndexes ? { completedIndexes } : {}),
    ready: active.filter(isReady).length,
    ...(conditions.length ? { conditions } : {}),
  });

  if (mem.expired) return { pods: [], status: finishedStatus(mem), memory: mem, expired: true };
  if (mine.length) mem.counts = { succeeded, failed, ...(completedIndexes ? { completedIndexes } : {}) };

  const problems = [...job.problems];
  // A CronJob's Jobs are named here, after validation: check their pods' hostnames too.
  const hostname = indexedHostnameProblem(job.name, spec);
  if (hostname && !problems.includes(hostname)) problems.push(hostname);
  if (problems.length) {
    // Refused as written: nothing new starts; what was made before is left as it is.
    conditions.push(heldCondition('Failed', 'InvalidSpec', `the Job cannot be used as written: ${problems.join('; ')}`));
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
    if (failJob) {
      mem.finished = { type: 'Failed', reason: 'PodFailurePolicy', message: failJob.message, at: now };
    } else if (failed > backoffLimit || pastOnFailure) {
      mem.finished = { type: 'Failed', reason: 'BackoffLimitExceeded', message: 'Job has reached the specified backoff limit', at: now };
    } else if (deadline !== undefined && deadline !== null && now - mem.startTime >= deadline * 1000) {
      mem.finished = { type: 'Failed', reason: 'DeadlineExceeded', message: 'Job was active longer than specified deadline', at: now };
    } else if (completions !== undefined ? succeeded >= completions : succeeded > 0 && live.length === 0) {
      mem.finished = { type: 'Complete', reason: 'CompletionsReached', message: 'Reached expected number of succeeded pods', at: now };
    } else {
      if (deadline !== undefined && deadline !== null) ctx.requeueAt(mem.startTime + deadline * 1000);
      if (indexed) live = onePerPendingIndex(live, done, completions!);
      const wantActive = completions !== undefined ? Math.min(parallelism, completions - succeeded) : succeeded > 0 ? live.length : parallelism;
      if (live.length > wantActive) {
        const victims = new Set([...live].sort(removalOrder).slice(0, live.length - wantActive));
        live = live.filter((p) => !victims.has(p));
      } else if (live.length < wantActive) {
        const notBefore = failureBackoffUntil(allFailed, succeededPods);
        if (notBefore !== undefined && now < notBefore) ctx.requeueAt(notBefore);
        else {
          const count = Math.min(wantActive - live.length, ctx.burst);
          if (count < wantActive - live.length) ctx.requeueAt(now + BURST_REQUEUE_MS);
          const indexes = indexed
            ? pendingIndexes(new Set([...done, ...live.map((p) => completionIndex(p)!)]), completions!, count)
            : Array.from({ length: count }, () => undefined);
          for (const ix of indexes) {
            const base = ix === undefined ? job.name : indexedNameBase(job.name, ix);
            const pod = podFromTemplate({
              template,
              name: generateName(base, job.namespace, ctx.random, ctx.taken),
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
            });
            if (ix !== undefined) stampIndex(pod, job.name, ix);
            created.push(pod);
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
    ...(mem.counts?.completedIndexes ? { completedIndexes: mem.counts.completedIndexes } : {}),
    ...(fin
      ? { conditions: [{ type: fin.type, status: 'True', reason: fin.reason, message: fin.message, lastProbeTime: iso(fin.at), lastTransitionTime: iso(fin.at) }] }
      : {}),
  };
}

/**
 * After failed pods, the next one waits 10 s × 2^(failures-1) (at most 6 min) from the last
 * failure, counting only the failures since the latest success, as the Job controller does:
 * otherwise a long Indexed Job with a few failures scattered among its successes would wait
 * six minutes after each new one.
 */
function failureBackoffUntil(failedPods: Pod[], succeededPods: Pod[]): number | undefined {
  let lastSuccess: number | undefined;
  for (const p of succeededPods) {
    const t = finishedAt(p);
    if (t !== undefined && (lastSuccess === undefined || t > lastSuccess)) lastSuccess = t;
  }
  let last: number | undefined;
  let failures = 0;
  for (const p of failedPods) {
    const t = finishedAt(p);
    // A failure with no time (its containers never ran) counts until some pod succeeds.
    if (t === undefined ? lastSuccess !== undefined : lastSuccess !== undefined && t <= lastSuccess) continue;
    failures++;
    if (t !== undefined && (last === undefined || t > last)) last = t;
  }
  if (last === undefined) return undefined;
  const delay = Math.min(FAILURE_BACKOFF_MAX_MS, FAILURE_BACKOFF_MS * 2 ** Math.min(30, failures - 1));
  return last + delay;
}
