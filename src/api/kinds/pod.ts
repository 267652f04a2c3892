/**
 * v1 Pod: defaulted and validated as the agent validates manifest pods,
 * bound to the node at creation (the node is its own scheduler), its spec
 * immutable but for what the API server lets change, deleted gracefully,
 * and shown with the columns `kubectl get pods` prints.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { applyPodDefaults, podErrors } from '../../kubelet-lite/validate.js';
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { timestamp } from '../store.js';
import { age, ageColumn, causes, isObj, metaCauses, nameColumn } from './common.js';
import { GATED, isGated } from './placement.js';
import { podRow, qosClass } from './pod-row.js';

const spec = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
const status = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});

/** The spec with what an update may change taken out (container images, activeDeadlineSeconds, added tolerations). */
function fixedPart(o: ApiObject, old?: ApiObject): unknown {
  const s = structuredClone(spec(o));
  // A pod left unplaced may be bound once (what pods/binding does upstream).
  if (old && !spec(old).nodeName) delete s.nodeName;
  for (const list of ['containers', 'initContainers', 'ephemeralContainers']) {
    if (Array.isArray(s[list])) for (const c of s[list] as Obj[]) if (isObj(c)) delete c.image;
  }
  delete s.activeDeadlineSeconds;
  delete s.tolerations;
  delete s.schedulingGates;
  return s;
}

/** Every toleration the pod had is still there, unchanged: an update may only add tolerations. */
function onlyAdded(before: unknown, after: unknown): boolean {
  const now = new Set((Array.isArray(after) ? after : []).map((t) => JSON.stringify(t)));
  return (Array.isArray(before) ? before : []).every((t) => now.has(JSON.stringify(t)));
}

/**
 * `refusal` says why a pod nobody placed cannot go on the node now (the
 * node cordoned); such a pod stays Pending and unbound, PodScheduled=False.
 */
export function podKind(nodeName: string, refusal?: (pod: ApiObject) => string | undefined): Kind {
  return {
    group: '',
    version: 'v1',
    kind: 'Pod',
    plural: 'pods',
    singular: 'pod',
    shortNames: ['po'],
    categories: ['all'],
    namespaced: true,
    status: true,
    graceful(o) {
      const phase = status(o).phase;
      if (phase === 'Succeeded' || phase === 'Failed' || !spec(o).nodeName) return 0;
      const g = spec(o).terminationGracePeriodSeconds;
      return typeof g === 'number' && g >= 0 ? g : 30;
    },
    prepare(o, old) {
      if (!isObj(o.spec)) return;
      applyPodDefaults(o);
      if (!old) {
        // The node is the only one there is: a pod nobody placed is placed here, if the node takes it.
        // A gated pod waits unplaced until its gates are removed (the scheduler does not look at it).
        const gated = !o.spec.nodeName && isGated(o);
        const why = o.spec.nodeName || gated ? undefined : refusal?.(o);
        if (!o.spec.nodeName && !why && !gated) o.spec.nodeName = nodeName;
        o.status = { phase: 'Pending', qosClass: qosClass(o as unknown as Pod) };
        const unscheduled = gated ? GATED : why ? { reason: 'Unschedulable', message: why } : undefined;
        if (unscheduled) (o.status as Obj).conditions = [{ type: 'PodScheduled', status: 'False', lastProbeTime: null, lastTransitionTime: timestamp(Date.now()), ...unscheduled }];
        return;
      }
      const gateName = (g: unknown) => (isObj(g) ? String(g.name ?? '') : '');
      const oldGates = new Set((Array.isArray(spec(old).schedulingGates) ? (spec(old).schedulingGates as unknown[]) : []).map(gateName));
      const added = (Array.isArray(spec(o).schedulingGates) ? (spec(o).schedulingGates as unknown[]) : []).map(gateName).find((g) => !oldGates.has(g));
      if (added !== undefined) throw invalid('Pod', String(o.metadata.name), [{ reason: 'FieldValueForbidden', field: 'spec.schedulingGates', message: `Forbidden: only deletion is allowed, but found new scheduling gate '${added}'` }]);
      if (JSON.stringify(fixedPart(o, old)) !== JSON.stringify(fixedPart(old, old)) || !onlyAdded(spec(old).tolerations, spec(o).tolerations)) {
        throw invalid('Pod', String(o.metadata.name), [
          {
            reason: 'FieldValueForbidden',
            field: 'spec',
            message:
              'Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)',
          },
        ]);
      }
    },
    validate(o) {
      const out: Cause[] = metaCauses(o, true);
      if (!isObj(o.spec)) return [...out, { reason: 'FieldValueRequired', field: 'spec', message: 'Required value' }];
      return [...out, ...causes(podErrors(o))];
    },
    // A pod's spec is the kubelet's to read; its many fields are not listed one by one here.
    known: { spec: 'map', status: 'map' },
    fields: {
      'spec.nodeName': (o) => String(spec(o).nodeName ?? ''),
      'spec.restartPolicy': (o) => String(spec(o).restartPolicy ?? ''),
      'spec.schedulerName': (o) => String(spec(o).schedulerName ?? ''),
      'spec.serviceAccountName': (o) => String(spec(o).serviceAccountName ?? ''),
      'spec.hostNetwork': (o) => String(spec(o).hostNetwork === true),
      'status.phase': (o) => String(status(o).phase ?? ''),
      'status.podIP': (o) => String(status(o).podIP ?? ''),
      'status.nominatedNodeName': (o) => String(status(o).nominatedNodeName ?? ''),
    },
    columns: [
      nameColumn,
      { name: 'Ready', type: 'string', description: 'The aggregate readiness state of this pod for accepting traffic.' },
      { name: 'Status', type: 'string', description: 'The aggregate status of the containers in this pod.' },
      { name: 'Restarts', type: 'string', description: 'The number of times the containers in this pod have been restarted and when the last container in this pod has restarted.' },
      ageColumn,
      { name: 'IP', type: 'string', priority: 1, description: 'The IP address assigned to the pod.' },
      { name: 'Node', type: 'string', priority: 1, description: 'The name of the node the pod is assigned to.' },
      { name: 'Nominated Node', type: 'string', priority: 1, description: 'The node the scheduler nominated for the pod.' },
      { name: 'Readiness Gates', type: 'string', priority: 1, description: 'The readiness gates of the pod.' },
    ],
    row(o, now) {
      const r = podRow(o as unknown as Pod, new Date(now));
      return [o.metadata.name, r.ready, r.status, r.restarts, age(o.metadata.creationTimestamp, now), r.ip, r.node, r.nominatedNode, r.readinessGates];
    },
  };
}
