/**
 * Checks a workload object before any controller trusts its shape. Manifests
 * are parsed YAML with no defaults and no schema: anything may be a string, a
 * list or null. Every finding is a sentence naming the field; nothing throws.
 */
import type { StoredObject } from '../stored-object.js';
import { selectorMatches } from './common.js';
import type { WorkloadKind } from './types.js';

/** Kinds the node's API stores and validates though no controller here runs them yet. */
export type StoredWorkloadKind = 'ReplicaSet' | 'StatefulSet';
/** Every kind validateWorkload checks. */
export type ValidatedKind = WorkloadKind | StoredWorkloadKind;

const API_VERSIONS: Record<ValidatedKind, string> = {
  Deployment: 'apps/v1',
  DaemonSet: 'apps/v1',
  Job: 'batch/v1',
  CronJob: 'batch/v1',
  ReplicaSet: 'apps/v1',
  StatefulSet: 'apps/v1',
};

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
/**
 * The most pods a node runs at once (the bound of --max-pods): more replicas or parallelism can
 * never be used. It is also the API's bound on an Indexed Job's completions and parallelism.
 */
export const MAX_PODS_AT_ONCE = 100_000;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

class Findings {
  readonly problems: string[] = [];
  add(msg: string): void {
    this.problems.push(msg);
  }
  optInt(obj: Record<string, unknown>, field: string, path: string, min: number): void {
    const v = obj[field];
    if (v === undefined || v === null) return;
    if (typeof v !== 'number' || !Number.isInteger(v)) this.add(`${path}.${field}: must be an integer, got ${JSON.stringify(v)}`);
    else if (v < min) this.add(`${path}.${field}: must be at least ${min}, got ${v}`);
  }
  optBool(obj: Record<string, unknown>, field: string, path: string): void {
    const v = obj[field];
    if (v !== undefined && v !== null && typeof v !== 'boolean') this.add(`${path}.${field}: must be true or false, got ${JSON.stringify(v)}`);
  }
  optEnum(obj: Record<string, unknown>, field: string, path: string, values: string[]): void {
    const v = obj[field];
    if (v !== undefined && v !== null && (typeof v !== 'string' || !values.includes(v)))
      this.add(`${path}.${field}: must be one of ${values.join(', ')}, got ${JSON.stringify(v)}`);
  }
  intOrPercent(obj: Record<string, unknown>, field: string, path: string): void {
    const v = obj[field];
    if (v === undefined || v === null) return;
    if (typeof v === 'number' && Number.isInteger(v) && v >= 0) return;
    if (typeof v === 'string' && /^\d+%$/.test(v)) return;
    this.add(`${path}.${field}: must be a non-negative integer or a percentage like "25%", got ${JSON.stringify(v)}`);
  }
}

function stringMap(f: Findings, v: unknown, path: string, keyCheck = true): Record<string, string> {
  if (v === undefined || v === null) return {};
  if (!isObject(v)) {
    f.add(`${path}: must be a map of strings`);
    return {};
  }
  const out: Record<string, string> = {};
  for (const [k, x] of Object.entries(v)) {
    if (typeof x !== 'string') f.add(`${path}.${k}: must be a string, got ${JSON.stringify(x)}`);
    else if (keyCheck && (!LABEL_VALUE.test(x) || x.length > 63)) f.add(`${path}.${k}: ${JSON.stringify(x)} is not a valid label value (at most 63 letters, digits, '-', '_' or '.')`);
    else out[k] = x;
  }
  return out;
}

function checkSelector(f: Findings, sel: unknown, path: string): boolean {
  if (!isObject(sel)) {
    f.add(`${path}: required (a label selector with matchLabels or matchExpressions)`);
    return false;
  }
  const before = f.problems.length;
  stringMap(f, sel.matchLabels, `${path}.matchLabels`);
  const exprs = sel.matchExpressions;
  if (exprs !== undefined && exprs !== null) {
    if (!Array.isArray(exprs)) f.add(`${path}.matchExpressions: must be a list`);
    else
      exprs.forEach((e, i) => {
        const p = `${path}.matchExpressions[${i}]`;
        if (!isObject(e) || typeof e.key !== 'string') return f.add(`${p}: needs a string key`);
        if (!['In', 'NotIn', 'Exists', 'DoesNotExist'].includes(e.operator as string))
          return f.add(`${p}.operator: must be In, NotIn, Exists or DoesNotExist, got ${JSON.stringify(e.operator)}`);
        const values = e.values;
        if (e.operator === 'In' || e.operator === 'NotIn') {
          if (!Array.isArray(values) || values.length === 0 || values.some((x) => typeof x !== 'string'))
            f.add(`${p}.values: ${e.operator} needs a non-empty list of strings`);
        } else if (Array.isArray(values) && values.length > 0) f.add(`${p}.values: must be empty for ${e.operator}`);
      });
  }
  if (f.problems.length === before && !isObject(sel.matchLabels) && !(Array.isArray(exprs) && exprs.length)) {
    f.add(`${path}: empty selector; it must name at least one label`);
  }
  return f.problems.length === before;
}

function checkTemplate(f: Findings, t: unknown, path: string): void {
  if (!isObject(t)) return f.add(`${path}: required (a pod template with metadata and spec)`);
  if (t.metadata !== undefined && t.metadata !== null && !isObject(t.metadata)) f.add(`${path}.metadata: must be an object`);
  else if (isObject(t.metadata)) {
    stringMap(f, t.metadata.labels, `${path}.metadata.labels`);
    stringMap(f, t.metadata.annotations, `${path}.metadata.annotations`, false);
  }
  const spec = t.spec;
  if (!isObject(spec)) return f.add(`${path}.spec: required`);
  const containers = spec.containers;
  if (!Array.isArray(containers) || containers.length === 0) return f.add(`${path}.spec.containers: required (at least one container)`);
  const names = new Set<string>();
  containers.forEach((c, i) => {
    const p = `${path}.spec.containers[${i}]`;
    if (!isObject(c)) return f.add(`${p}: must be an object`);
    if (typeof c.name !== 'string' || !DNS_LABEL.test(c.name)) f.add(`${p}.name: must be a DNS label, got ${JSON.stringify(c.name)}`);
    else if (names.has(c.name)) f.add(`${p}.name: ${c.name} is used twice`);
    else names.add(c.name);
    if (typeof c.image !== 'string' || c.image === '') f.add(`${p}.image: required`);
  });
  for (const list of ['initContainers', 'volumes']) {
    if (spec[list] !== undefined && spec[list] !== null && !Array.isArray(spec[list])) f.add(`${path}.spec.${list}: must be a list`);
  }
  f.optEnum(spec, 'restartPolicy', `${path}.spec`, ['Always', 'OnFailure', 'Never']);
  if (spec.nodeSelector !== undefined) stringMap(f, spec.nodeSelector, `${path}.spec.nodeSelector`);
}

function templateLabels(t: unknown): Record<string, string> {
  if (!isObject(t) || !isObject(t.metadata) || !isObject(t.metadata.labels)) return {};
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(t.metadata.labels)) if (typeof v === 'string') out[k] = v;
  return out;
}

function checkSelectsTemplate(f: Findings, spec: Record<string, unknown>, path: string): void {
  if (!checkSelector(f, spec.selector, `${path}.selector`)) return;
  if (!isObject(spec.template)) return;
  if (!selectorMatches(spec.selector as never, templateLabels(spec.template)))
    f.add(`${path}.selector: does not match the template's labels (${path}.template.metadata.labels)`);
}

/** Job fields whose meaning skiff does not implement: refused rather than run with other semantics. */
const UNSUPPORTED_JOB_FIELDS: Record<string, string> = {
  backoffLimitPerIndex: 'per-index back-off limits are not supported; use backoffLimit',
  maxFailedIndexes: 'it needs backoffLimitPerIndex, which is not supported',
  successPolicy: 'success policies are not supported; the Job succeeds when every completion has',
};
const MAX_POLICY_RULES = 20;
const MAX_EXIT_CODES = 255;

function containerNames(template: unknown): Set<string> {
  const names = new Set<string>();
  if (!isObject(template) || !isObject(template.spec)) return names;
  for (const list of [template.spec.containers, template.spec.initContainers])
    if (Array.isArray(list)) for (const c of list) if (isObject(c) && typeof c.name === 'string') names.add(c.name);
  return names;
}

/** spec.podFailurePolicy: rules of FailJob, Ignore or Count on exit codes or pod conditions. */
function checkPodFailurePolicy(f: Findings, spec: Record<string, unknown>, path: string): void {
  const policy = spec.podFailurePolicy;
  if (policy === undefined || policy === null) return;
  const pp = `${path}.podFailurePolicy`;
  if (!isObject(policy) || !Array.isArray(policy.rules)) return f.add(`${pp}.rules: required (a list of rules)`);
  if (policy.rules.length > MAX_POLICY_RULES) f.add(`${pp}.rules: at most ${MAX_POLICY_RULES} rules, got ${policy.rules.length}`);
  if (isObject(spec.template) && isObject(spec.template.spec) && spec.template.spec.restartPolicy !== 'Never')
    f.add(`${path}.template.spec.restartPolicy: must be Never when podFailurePolicy is set`);
  const names = containerNames(spec.template);
  policy.rules.forEach((r, i) => {
    const rp = `${pp}.rules[${i}]`;
    if (!isObject(r)) return f.add(`${rp}: must be an object`);
    if (r.action === 'FailIndex') f.add(`${rp}.action: FailIndex needs backoffLimitPerIndex, which is not supported`);
    else f.optEnum(r, 'action', rp, ['FailJob', 'Ignore', 'Count']);
    if (r.action === undefined || r.action === null) f.add(`${rp}.action: required`);
    const onExit = r.onExitCodes;
    const onCond = r.onPodConditions;
    const hasExit = onExit !== undefined && onExit !== null;
    const hasCond = onCond !== undefined && onCond !== null && !(Array.isArray(onCond) && onCond.length === 0);
    if (hasExit === hasCond) return f.add(`${rp}: needs exactly one of onExitCodes and onPodConditions`);
    if (hasExit) {
      const ep = `${rp}.onExitCodes`;
      if (!isObject(onExit)) return f.add(`${ep}: must be an object`);
      if (onExit.containerName !== undefined && onExit.containerName !== null) {
        if (typeof onExit.containerName !== 'string' || !names.has(onExit.containerName))
          f.add(`${ep}.containerName: must name one of the template's containers, got ${JSON.stringify(onExit.containerName)}`);
      }
      if (onExit.operator !== 'In' && onExit.operator !== 'NotIn') f.add(`${ep}.operator: must be In or NotIn, got ${JSON.stringify(onExit.operator)}`);
      const values = onExit.values;
      if (!Array.isArray(values) || values.length === 0 || values.length > MAX_EXIT_CODES || values.some((v) => typeof v !== 'number' || !Number.isInteger(v) || v < -2147483648 || v > 2147483647))
        f.add(`${ep}.values: must be a list of 1 to ${MAX_EXIT_CODES} integer exit codes`);
      else {
        if (new Set(values).size !== values.length) f.add(`${ep}.values: must not repeat a value`);
        if (onExit.operator === 'In' && values.includes(0)) f.add(`${ep}.values: 0 is not a failure and may not be listed with In`);
      }
    } else {
      const cp = `${rp}.onPodConditions`;
      if (!Array.isArray(onCond) || onCond.length > MAX_POLICY_RULES) return f.add(`${cp}: must be a list of at most ${MAX_POLICY_RULES} patterns`);
      onCond.forEach((c, j) => {
        if (!isObject(c) || typeof c.type !== 'string' || c.type === '') return f.add(`${cp}[${j}].type: required`);
        if (c.status !== undefined && c.status !== null) f.optEnum(c, 'status', `${cp}[${j}]`, ['True', 'False', 'Unknown']);
      });
    }
  });
}

const MAX_HOSTNAME = 63;

/** An Indexed Job's pods get the hostname `<job>-<index>`, which must stay a DNS label. */
export function indexedHostnameProblem(name: string, spec: { completionMode?: unknown; completions?: unknown } | undefined): string | undefined {
  if (spec?.completionMode !== 'Indexed' || typeof spec.completions !== 'number' || spec.completions < 1) return undefined;
  const last = `${name}-${spec.completions - 1}`;
  if (last.length <= MAX_HOSTNAME) return undefined;
  return `metadata.name: an Indexed Job's pods get the hostname "<job name>-<index>", at most ${MAX_HOSTNAME} characters; ${JSON.stringify(last)} is longer`;
}

function checkJobSpec(f: Findings, spec: unknown, path: string): void {
  if (!isObject(spec)) return f.add(`${path}: required`);
  f.optInt(spec, 'parallelism', path, 0);
  f.optInt(spec, 'completions', path, 0);
  f.optInt(spec, 'backoffLimit', path, 0);
  f.optInt(spec, 'activeDeadlineSeconds', path, 1);
  f.optInt(spec, 'ttlSecondsAfterFinished', path, 0);
  f.optBool(spec, 'suspend', path);
  f.optBool(spec, 'manualSelector', path);
  for (const [field, why] of Object.entries(UNSUPPORTED_JOB_FIELDS))
    if (spec[field] !== undefined && spec[field] !== null) f.add(`${path}.${field}: ${why}`);
  checkPodFailurePolicy(f, spec, path);
  f.optEnum(spec, 'completionMode', path, ['NonIndexed', 'Indexed']);
  // Each pod the Job wants is made at once: an unbounded parallelism (the API allows 2^31-1 for
  // a NonIndexed Job) would have the controller build that many pods and exhaust the agent's memory.
  if (spec.completionMode !== 'Indexed' && typeof spec.parallelism === 'number' && spec.parallelism > MAX_PODS_AT_ONCE)
    f.add(`${path}.parallelism: must be at most ${MAX_PODS_AT_ONCE} (no node runs more pods at once), got ${spec.parallelism}`);
  if (spec.completionMode === 'Indexed') {
    if (spec.completions === undefined || spec.completions === null) f.add(`${path}.completions: required when completionMode is Indexed`);
    for (const field of ['completions', 'parallelism'] as const) {
      const v = spec[field];
      if (typeof v === 'number' && v > MAX_PODS_AT_ONCE)
        f.add(`${path}.${field}: must be at most ${MAX_PODS_AT_ONCE} when completionMode is Indexed, got ${v}`);
    }
  }
  checkTemplate(f, spec.template, `${path}.template`);
  if (isObject(spec.template) && isObject(spec.template.spec)) {
    const rp = spec.template.spec.restartPolicy;
    if (rp !== 'OnFailure' && rp !== 'Never')
      f.add(`${path}.template.spec.restartPolicy: a Job's pods need restartPolicy OnFailure or Never, got ${JSON.stringify(rp ?? 'Always (the default)')}`);
  }
}

/** Problems with a workload object; empty when the controller can use it. */
export function validateWorkload(o: StoredObject, kind: ValidatedKind): string[] {
  const f = new Findings();
  const obj = isObject(o.object) ? o.object : {};
  const api = API_VERSIONS[kind];
  if (o.apiVersion !== api) f.add(`apiVersion: ${kind} is served as ${api}, got ${JSON.stringify(o.apiVersion)}`);
  const name = o.name;
  const nameLimit = kind === 'CronJob' ? 52 : kind === 'Job' ? 63 : 253;
  const nameRe = kind === 'Job' || kind === 'CronJob' ? DNS_LABEL : DNS_SUBDOMAIN;
  if (typeof name !== 'string' || !nameRe.test(name) || name.length > nameLimit)
    f.add(`metadata.name: ${JSON.stringify(name)} must be lowercase letters, digits and '-' (at most ${nameLimit} characters for a ${kind})`);
  if (typeof o.namespace !== 'string' || !DNS_LABEL.test(o.namespace) || o.namespace.length > 63)
    f.add(`metadata.namespace: ${JSON.stringify(o.namespace)} is not a valid namespace`);
  const spec = obj.spec;
  if (!isObject(spec)) {
    f.add('spec: required');
    return f.problems;
  }
  switch (kind) {
    case 'Deployment': {
      f.optInt(spec, 'replicas', 'spec', 0);
      // Each wanted pod is built at once: replicas: 2000000000 (valid for the API) would exhaust the agent's memory.
      if (typeof spec.replicas === 'number' && spec.replicas > MAX_PODS_AT_ONCE)
        f.add(`spec.replicas: must be at most ${MAX_PODS_AT_ONCE} (no node runs more pods at once), got ${spec.replicas}`);
      f.optInt(spec, 'minReadySeconds', 'spec', 0);
      f.optInt(spec, 'progressDeadlineSeconds', 'spec', 1);
      f.optBool(spec, 'paused', 'spec');
      checkTemplate(f, spec.template, 'spec.template');
      checkSelectsTemplate(f, spec, 'spec');
      const st = spec.strategy;
      if (st !== undefined && st !== null) {
        if (!isObject(st)) f.add('spec.strategy: must be an object');
        else {
          f.optEnum(st, 'type', 'spec.strategy', ['RollingUpdate', 'Recreate']);
          const ru = st.rollingUpdate;
          if (ru !== undefined && ru !== null) {
            if (st.type === 'Recreate') f.add('spec.strategy.rollingUpdate: may not be set when type is Recreate');
            else if (!isObject(ru)) f.add('spec.strategy.rollingUpdate: must be an object');
            else {
              f.intOrPercent(ru, 'maxSurge', 'spec.strategy.rollingUpdate');
              f.intOrPercent(ru, 'maxUnavailable', 'spec.strategy.rollingUpdate');
            }
          }
        }
      }
      restartAlways(f, spec.template);
      break;
    }
    case 'ReplicaSet':
    case 'StatefulSet': {
      f.optInt(spec, 'replicas', 'spec', 0);
      if (typeof spec.replicas === 'number' && spec.replicas > MAX_PODS_AT_ONCE)
        f.add(`spec.replicas: must be at most ${MAX_PODS_AT_ONCE} (no node runs more pods at once), got ${spec.replicas}`);
      f.optInt(spec, 'minReadySeconds', 'spec', 0);
      checkTemplate(f, spec.template, 'spec.template');
      checkSelectsTemplate(f, spec, 'spec');
      if (kind === 'StatefulSet') {
        f.optEnum(spec, 'podManagementPolicy', 'spec', ['OrderedReady', 'Parallel']);
        if (spec.serviceName !== undefined && spec.serviceName !== null && typeof spec.serviceName !== 'string') f.add(`spec.serviceName: must be a string, got ${JSON.stringify(spec.serviceName)}`);
        const st = spec.updateStrategy;
        if (st !== undefined && st !== null) {
          if (!isObject(st)) f.add('spec.updateStrategy: must be an object');
          else f.optEnum(st, 'type', 'spec.updateStrategy', ['RollingUpdate', 'OnDelete']);
        }
      }
      restartAlways(f, spec.template);
      break;
    }
    case 'DaemonSet': {
      f.optInt(spec, 'minReadySeconds', 'spec', 0);
      checkTemplate(f, spec.template, 'spec.template');
      checkSelectsTemplate(f, spec, 'spec');
      const st = spec.updateStrategy;
      if (st !== undefined && st !== null) {
        if (!isObject(st)) f.add('spec.updateStrategy: must be an object');
        else {
          f.optEnum(st, 'type', 'spec.updateStrategy', ['RollingUpdate', 'OnDelete']);
          if (isObject(st.rollingUpdate)) {
            f.intOrPercent(st.rollingUpdate, 'maxSurge', 'spec.updateStrategy.rollingUpdate');
            f.intOrPercent(st.rollingUpdate, 'maxUnavailable', 'spec.updateStrategy.rollingUpdate');
          }
        }
      }
      restartAlways(f, spec.template);
      break;
    }
    case 'Job': {
      checkJobSpec(f, spec, 'spec');
      const hostname = typeof name === 'string' ? indexedHostnameProblem(name, spec) : undefined;
      if (hostname) f.add(hostname);
      break;
    }
    case 'CronJob': {
      if (typeof spec.schedule !== 'string' || spec.schedule.trim() === '') f.add('spec.schedule: required (a cron schedule such as "*/5 * * * *")');
      if (spec.timeZone !== undefined && spec.timeZone !== null && !['UTC', 'Etc/UTC'].includes(spec.timeZone as string))
        f.add(`spec.timeZone: only UTC is supported, got ${JSON.stringify(spec.timeZone)}`);
      f.optEnum(spec, 'concurrencyPolicy', 'spec', ['Allow', 'Forbid', 'Replace']);
      f.optInt(spec, 'startingDeadlineSeconds', 'spec', 0);
      f.optInt(spec, 'successfulJobsHistoryLimit', 'spec', 0);
      f.optInt(spec, 'failedJobsHistoryLimit', 'spec', 0);
      f.optBool(spec, 'suspend', 'spec');
      const jt = spec.jobTemplate;
      if (!isObject(jt)) f.add('spec.jobTemplate: required');
      else {
        if (isObject(jt.metadata)) {
          stringMap(f, jt.metadata.labels, 'spec.jobTemplate.metadata.labels');
          stringMap(f, jt.metadata.annotations, 'spec.jobTemplate.metadata.annotations', false);
        }
        checkJobSpec(f, jt.spec, 'spec.jobTemplate.spec');
        // Its Jobs are named <cronjob>-<minutes since the epoch> (8 digits until the year 2160): say
        // now, not at each schedule time, when their Indexed pods' hostnames would be too long.
        const jobName = typeof name === 'string' ? `${name}-${'0'.repeat(8)}` : undefined;
        if (jobName && isObject(jt.spec) && indexedHostnameProblem(jobName, jt.spec))
          f.add(
            `metadata.name: this CronJob's Jobs are named "<cronjob name>-<8 digits>" and their Indexed pods get the hostname "<job name>-<index>", at most ${MAX_HOSTNAME} characters; with ${JSON.stringify(name)} and ${jt.spec.completions as number} completions the last one has ${jobName.length + 1 + String((jt.spec.completions as number) - 1).length}`,
          );
      }
      break;
    }
  }
  return f.problems;
}

function restartAlways(f: Findings, t: unknown): void {
  if (isObject(t) && isObject(t.spec) && t.spec.restartPolicy !== undefined && t.spec.restartPolicy !== 'Always')
    f.add(`spec.template.spec.restartPolicy: must be Always for this kind, got ${JSON.stringify(t.spec.restartPolicy)}`);
}

/** Validates a Job spec made from a CronJob's template (already validated as part of the CronJob). */
export function validateJobSpec(spec: unknown): string[] {
  const f = new Findings();
  checkJobSpec(f, spec, 'spec');
  return f.problems;
}
