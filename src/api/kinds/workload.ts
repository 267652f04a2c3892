/**
 * What the workload kinds' strategies share: validation by the workload
 * controllers' own checks (so the API refuses what the node could not run)
 * plus the agent's pod checks on the template, pod defaults on the
 * template, immutable fields worded as the API server words them, and the
 * scale subresource of the replicated kinds.
 */
import { applyPodDefaults, podErrors, show, formatFieldPath } from '../../kubelet-lite/validate.js';
import { validateWorkload, type ValidatedKind } from '../../controllers/validate.js';
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';
import { selectorString, templateCells } from './workload-rows.js';

export const specOf = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
export const statusOf = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});

/** The API server's pod defaults, applied to a pod template in place. */
export function defaultTemplate(template: unknown): void {
  if (isObj(template) && isObj(template.spec)) applyPodDefaults(template);
}

/** A problem of the controllers' validator ("spec.replicas: must be …") as a Status cause. */
function problemCause(p: string): Cause {
  const at = p.indexOf(': ');
  const field = at > 0 && /^[\w.[\]/-]+$/.test(p.slice(0, at)) ? p.slice(0, at) : undefined;
  return { reason: 'FieldValueInvalid', ...(field ? { field } : {}), message: field ? p.slice(at + 2) : p };
}

/** The agent's pod checks on a template, their paths under `at` (spec.template). */
function templateCauses(o: ApiObject, template: unknown, at: string[]): Cause[] {
  if (!isObj(template) || !isObj(template.spec)) return [];
  const meta = isObj(template.metadata) ? template.metadata : {};
  // A template has no name of its own: its pods are named after the workload.
  const pod = { apiVersion: 'v1', kind: 'Pod', metadata: { ...meta, name: o.metadata.name, namespace: o.metadata.namespace }, spec: template.spec };
  return podErrors(pod)
    .filter((e) => !(e.path[0] === 'metadata' && (e.path[1] === 'name' || e.path[1] === 'namespace')))
    .map((e) => {
      const field = formatFieldPath([...at, ...e.path]);
      const reason = e.message.startsWith('Required value') ? 'FieldValueRequired' : e.message.startsWith('Unsupported value') ? 'FieldValueNotSupported' : e.message.startsWith('Forbidden') ? 'FieldValueForbidden' : 'FieldValueInvalid';
      return { reason, field, message: e.message };
    });
}

/** Metadata, then the controllers' checks, then the pod checks on fields those did not already fault. */
export function workloadCauses(o: ApiObject, kind: ValidatedKind, templatePath: string[]): Cause[] {
  const out = metaCauses(o, true);
  if (out.length > 0) return out;
  const stored = { apiVersion: o.apiVersion, kind: o.kind, namespace: String(o.metadata.namespace ?? ''), name: String(o.metadata.name ?? ''), uid: String(o.metadata.uid ?? ''), object: o, source: { file: '', document: 0, line: 0 } };
  const problems = validateWorkload(stored, kind).map(problemCause);
  let template: unknown = o;
  for (const k of templatePath) template = isObj(template) ? template[k] : undefined;
  const faulted = problems.map((c) => c.field ?? '');
  const pods = templateCauses(o, template, templatePath).filter((c) => !faulted.some((f) => f !== '' && (c.field === f || c.field!.startsWith(`${f}.`) || c.field!.startsWith(`${f}[`))));
  return [...problems, ...pods];
}

/** A LabelSelector as Go's %#v shows it, which is how the API server quotes one it refuses. */
export function goSelector(sel: unknown): string {
  if (!isObj(sel)) return '(*v1.LabelSelector)(nil)';
  const q = (s: unknown) => JSON.stringify(String(s));
  const labels = isObj(sel.matchLabels)
    ? `map[string]string{${Object.keys(sel.matchLabels)
        .sort()
        .map((k) => `${q(k)}:${q((sel.matchLabels as Obj)[k])}`)
        .join(', ')}}`
    : 'map[string]string(nil)';
  const exprs = Array.isArray(sel.matchExpressions)
    ? `[]v1.LabelSelectorRequirement{${sel.matchExpressions
        .map((e) => {
          const x = isObj(e) ? e : {};
          const values = Array.isArray(x.values) ? `[]string{${x.values.map(q).join(', ')}}` : '[]string(nil)';
          return `v1.LabelSelectorRequirement{Key:${q(x.key ?? '')}, Operator:${q(x.operator ?? '')}, Values:${values}}`;
        })
        .join(', ')}}`
    : '[]v1.LabelSelectorRequirement(nil)';
  return `v1.LabelSelector{MatchLabels:${labels}, MatchExpressions:${exprs}}`;
}

const same = (a: unknown, b: unknown) => JSON.stringify(a ?? null) === JSON.stringify(b ?? null);

/** Refuses a change to spec.selector (every workload kind's is immutable once created). */
export function keepSelector(kind: Kind, o: ApiObject, old: ApiObject): void {
  const sel = specOf(o).selector;
  if (!same(sel, specOf(old).selector)) {
    throw invalid(kind.kind, String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'spec.selector', message: `Invalid value: ${goSelector(sel)}: field is immutable` }], kind.group);
  }
}

/** Refuses a change to one immutable spec field; the value is quoted as JSON (cut short), where Go would print its struct. */
export function keepField(kind: Kind, o: ApiObject, old: ApiObject, field: string): void {
  const v = specOf(o)[field];
  if (!same(v, specOf(old)[field])) throw invalid(kind.kind, String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: `spec.${field}`, message: `Invalid value: ${show(v ?? null)}: field is immutable` }], kind.group);
}

/** Replicas in spec.replicas and status.replicas, pods chosen by spec.selector: Deployments, ReplicaSets, StatefulSets. */
export const replicatedScale: NonNullable<Kind['scale']> = {
  specReplicasPath: 'spec.replicas',
  statusReplicasPath: 'status.replicas',
  selector: (o) => selectorString(specOf(o).selector),
};

export const containersColumns = [
  { name: 'Containers', type: 'string' as const, priority: 1, description: 'Names of each container in the template.' },
  { name: 'Images', type: 'string' as const, priority: 1, description: 'Images referenced by each container in the template.' },
];
export const selectorColumn = { name: 'Selector', type: 'string' as const, priority: 1, description: 'Label selector for pods. Existing ReplicaSets whose pods are selected by this will be the ones affected by this deployment.' };

/** NAME, the kind's cells, AGE, then the wide CONTAINERS, IMAGES (and SELECTOR). */
export function workloadRow(o: ApiObject, now: number, cells: unknown[], template: unknown, selector: boolean): unknown[] {
  return [o.metadata.name, ...cells, age(o.metadata.creationTimestamp, now), ...templateCells(template), ...(selector ? [selectorString(specOf(o).selector) || '<none>'] : [])];
}

export { ageColumn, nameColumn };
