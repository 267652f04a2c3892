/**
 * The cells kubectl prints for workloads and Services, computed from an
 * object's spec and status as kubectl's printers do; shared by the API's
 * tables and skiff's CLI (`skiff get deployments` …), so both say the same.
 */
import { humanDuration, isObj } from './common.js';

type Obj = Record<string, unknown>;

const num = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) ? v : 0);
const obj = (v: unknown): Obj => (isObj(v) ? v : {});
const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

function time(v: unknown): number | undefined {
  if (typeof v !== 'string') return undefined;
  const t = Date.parse(v);
  return Number.isNaN(t) ? undefined : t;
}

/** A label map as labels.FormatLabels writes it: "a=b,c=d" in key order, "<none>" when empty. */
export function formatLabels(m: unknown): string {
  const entries = Object.entries(obj(m)).filter(([, v]) => typeof v === 'string');
  if (entries.length === 0) return '<none>';
  return entries
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => `${k}=${String(v)}`)
    .join(',');
}

/** A LabelSelector as its labels.Selector's String(): requirements in key order, "" for none (everything). */
export function selectorString(sel: unknown): string {
  const s = obj(sel);
  const reqs: Array<[string, string]> = Object.entries(obj(s.matchLabels)).map(([k, v]) => [k, `${k}=${String(v)}`]);
  for (const e of list(s.matchExpressions)) {
    const x = obj(e);
    const key = String(x.key ?? '');
    const values = list(x.values).map(String).sort().join(',');
    switch (x.operator) {
      case 'Exists':
        reqs.push([key, key]);
        break;
      case 'DoesNotExist':
        reqs.push([key, `!${key}`]);
        break;
      case 'NotIn':
        reqs.push([key, `${key} notin (${values})`]);
        break;
      default:
        reqs.push([key, `${key} in (${values})`]);
    }
  }
  return reqs
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([, t]) => t)
    .join(',');
}

/** The wide columns CONTAINERS and IMAGES of a pod template. */
export function templateCells(template: unknown): [string, string] {
  const cs = list(obj(obj(template).spec).containers).map(obj);
  return [cs.map((c) => String(c.name ?? '')).join(','), cs.map((c) => String(c.image ?? '')).join(',')];
}

const replicas = (spec: Obj) => (typeof spec.replicas === 'number' ? spec.replicas : 1);

/** READY, UP-TO-DATE, AVAILABLE. */
export function deploymentCells(spec: Obj, status: Obj): [string, number, number] {
  return [`${num(status.readyReplicas)}/${replicas(spec)}`, num(status.updatedReplicas), num(status.availableReplicas)];
}

/** DESIRED, CURRENT, READY. */
export function replicaSetCells(spec: Obj, status: Obj): [number, number, number] {
  return [replicas(spec), num(status.replicas), num(status.readyReplicas)];
}

/** READY. */
export function statefulSetCells(spec: Obj, status: Obj): [string] {
  return [`${num(status.readyReplicas)}/${replicas(spec)}`];
}

/** DESIRED, CURRENT, READY, UP-TO-DATE, AVAILABLE, NODE SELECTOR. */
export function daemonSetCells(spec: Obj, status: Obj): [number, number, number, number, number, string] {
  return [
    num(status.desiredNumberScheduled),
    num(status.currentNumberScheduled),
    num(status.numberReady),
    num(status.updatedNumberScheduled),
    num(status.numberAvailable),
    formatLabels(obj(obj(spec.template).spec).nodeSelector),
  ];
}

function condition(status: Obj, type: string): boolean {
  return list(status.conditions).some((c) => obj(c).type === type && obj(c).status === 'True');
}

/** kubectl's Job STATUS column. */
export function jobState(status: Obj, deleting: boolean): string {
  if (condition(status, 'Complete')) return 'Complete';
  if (condition(status, 'Failed')) return 'Failed';
  if (deleting) return 'Terminating';
  if (condition(status, 'Suspended')) return 'Suspended';
  if (condition(status, 'FailureTarget')) return 'FailureTarget';
  if (condition(status, 'SuccessCriteriaMet')) return 'SuccessCriteriaMet';
  return 'Running';
}

/** STATUS, COMPLETIONS, DURATION. */
export function jobCells(spec: Obj, status: Obj, deleting: boolean, now: number): [string, string, string] {
  const succeeded = num(status.succeeded);
  const parallelism = typeof spec.parallelism === 'number' ? spec.parallelism : 1;
  const completions =
    typeof spec.completions === 'number' ? `${succeeded}/${spec.completions}` : parallelism > 1 ? `${succeeded}/1 of ${parallelism}` : `${succeeded}/1`;
  const start = time(status.startTime);
  const end = time(status.completionTime) ?? now;
  return [jobState(status, deleting), completions, start === undefined ? '' : humanDuration(end - start)];
}

/** SCHEDULE, TIMEZONE, SUSPEND, ACTIVE, LAST SCHEDULE. */
export function cronJobCells(spec: Obj, status: Obj, now: number): [string, string, string, number, string] {
  const last = time(status.lastScheduleTime);
  return [
    typeof spec.schedule === 'string' ? spec.schedule : '',
    typeof spec.timeZone === 'string' ? spec.timeZone : '<none>',
    spec.suspend === true ? 'True' : spec.suspend === false ? 'False' : '<unset>',
    list(status.active).length,
    last === undefined ? '<none>' : humanDuration(now - last),
  ];
}

/** TYPE, CLUSTER-IP, EXTERNAL-IP, PORT(S): `80:30080/TCP` for a node port, `53/UDP` otherwise. */
export function serviceCells(spec: Obj, status: Obj): [string, string, string, string] {
  const type = typeof spec.type === 'string' && spec.type !== '' ? spec.type : 'ClusterIP';
  const externalIPs = list(spec.externalIPs).map(String);
  let external = externalIPs.length ? externalIPs.join(',') : '<none>';
  if (type === 'ExternalName') external = typeof spec.externalName === 'string' ? spec.externalName : '<none>';
  if (type === 'LoadBalancer') {
    const ingress = list(obj(obj(status).loadBalancer).ingress).map((i) => String(obj(i).ip ?? obj(i).hostname ?? ''));
    const all = [...ingress, ...externalIPs].filter(Boolean);
    external = all.length ? all.join(',') : '<pending>';
  }
  const ports =
    list(spec.ports)
      .map(obj)
      .map((p) => `${num(p.port)}${p.nodePort ? `:${num(p.nodePort)}` : ''}/${typeof p.protocol === 'string' ? p.protocol : 'TCP'}`)
      .join(',') || '<none>';
  const ip = typeof spec.clusterIP === 'string' && spec.clusterIP !== '' ? spec.clusterIP : '<none>';
  return [type, ip, external, ports];
}
