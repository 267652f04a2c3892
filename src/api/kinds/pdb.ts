/**
 * policy/v1 PodDisruptionBudget: validated as the API server validates it
 * (at most one of minAvailable and maxUnavailable, each a count or a
 * percentage), its status kept by the node's disruption controller and read
 * by the eviction subresource, shown with the columns `kubectl get pdb`
 * prints. Which pods a budget covers is decided here, once, for both.
 */
import type { Cause } from '../errors.js';
import { parseLabelSelector } from '../selectors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';
import { selectorString } from './workload-rows.js';

const spec = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
const status = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});

export const UNHEALTHY_POLICIES = ['AlwaysAllow', 'IfHealthyBudget'];

/** An int-or-string field as its Go value prints: a number, or the string as given. */
const shown = (v: unknown): string => (v === undefined || v === null ? 'N/A' : String(v));

function intOrPercentCauses(v: unknown, field: string): Cause[] {
  if (v === undefined || v === null) return [];
  if (typeof v === 'number') {
    if (!Number.isInteger(v)) return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${v}: must be an integer` }];
    return v < 0 ? [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${v}: must be greater than or equal to 0` }] : [];
  }
  if (typeof v === 'string') {
    const m = /^(\d+)%$/.exec(v);
    if (!m) {
      return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(v)}: a valid percent string must be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for validation is '[0-9]+%')` }];
    }
    return Number(m[1]) > 100 ? [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(v)}: must not be greater than 100%` }] : [];
  }
  return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be an integer or a percentage string' }];
}

/**
 * Whether the budget covers the pod: same namespace, and its selector
 * matches the pod's labels. As in policy/v1, an empty selector covers every
 * pod of the namespace and a missing one none.
 */
export function budgetSelects(pdb: ApiObject, pod: ApiObject): boolean {
  if ((pdb.metadata.namespace ?? '') !== (pod.metadata.namespace ?? '')) return false;
  const sel = spec(pdb).selector;
  if (!isObj(sel)) return false;
  try {
    return parseLabelSelector(selectorString(sel))(pod.metadata.labels);
  } catch {
    return false; // a selector that does not parse matches no pod, as upstream
  }
}

export const pdbKind: Kind = {
  group: 'policy',
  version: 'v1',
  kind: 'PodDisruptionBudget',
  plural: 'poddisruptionbudgets',
  singular: 'poddisruptionbudget',
  shortNames: ['pdb'],
  namespaced: true,
  status: true,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (!isObj(o.spec)) o.spec = {};
    if (!old) o.status = { disruptionsAllowed: 0, currentHealthy: 0, desiredHealthy: 0, expectedPods: 0 };
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    const s = spec(o);
    if (s.minAvailable !== undefined && s.minAvailable !== null && s.maxUnavailable !== undefined && s.maxUnavailable !== null) {
      out.push({ reason: 'FieldValueInvalid', field: 'spec', message: 'Invalid value: "": minAvailable and maxUnavailable cannot be both set' });
    }
    out.push(...intOrPercentCauses(s.minAvailable, 'spec.minAvailable'), ...intOrPercentCauses(s.maxUnavailable, 'spec.maxUnavailable'));
    if (s.selector !== undefined && s.selector !== null) {
      if (!isObj(s.selector)) out.push({ reason: 'FieldValueTypeInvalid', field: 'spec.selector', message: 'Invalid value: must be a label selector' });
      else {
        try {
          parseLabelSelector(selectorString(s.selector));
        } catch (err) {
          out.push({ reason: 'FieldValueInvalid', field: 'spec.selector', message: `Invalid value: ${(err as Error).message}` });
        }
      }
    }
    const policy = s.unhealthyPodEvictionPolicy;
    if (policy !== undefined && policy !== null && !UNHEALTHY_POLICIES.includes(String(policy))) {
      out.push({ reason: 'FieldValueNotSupported', field: 'spec.unhealthyPodEvictionPolicy', message: `Unsupported value: ${JSON.stringify(policy)}: supported values: "AlwaysAllow", "IfHealthyBudget"` });
    }
    return out;
  },
  known: {
    spec: { minAvailable: true, maxUnavailable: true, selector: 'map', unhealthyPodEvictionPolicy: true },
    status: { observedGeneration: true, disruptedPods: 'map', disruptionsAllowed: true, currentHealthy: true, desiredHealthy: true, expectedPods: true, conditions: { list: 'map' } },
  },
  columns: [
    nameColumn,
    { name: 'Min Available', type: 'string', description: 'The minimum number of pods that must be available.' },
    { name: 'Max Unavailable', type: 'string', description: 'The maximum number of pods that may be unavailable.' },
    { name: 'Allowed Disruptions', type: 'integer', description: 'Calculated number of pods that may be disrupted at this time.' },
    ageColumn,
  ],
  row: (o, now) => [o.metadata.name, shown(spec(o).minAvailable), shown(spec(o).maxUnavailable), Number(status(o).disruptionsAllowed ?? 0), age(o.metadata.creationTimestamp, now)],
};
