/**
 * Whether a pod nobody placed may be placed on the node, as the scheduler's
 * NodeUnschedulable and TaintToleration filters decide for a one-node
 * cluster: a cordoned node (spec.unschedulable) takes only pods that
 * tolerate node.kubernetes.io/unschedulable:NoSchedule, and a NoSchedule or
 * NoExecute taint only pods that tolerate it. The refusal is worded as the
 * scheduler words its PodScheduled=False condition.
 */
import type { ApiObject, Obj } from '../types.js';
import { isObj } from './common.js';

export const UNSCHEDULABLE_TAINT = 'node.kubernetes.io/unschedulable';

const list = (v: unknown): Obj[] => (Array.isArray(v) ? v.filter(isObj) : []);

/** v1helper.TolerationsTolerateTaint: the key (or an empty key with Exists), the effect (or none), the value. */
export function tolerates(tolerations: Obj[], taint: Obj): boolean {
  return tolerations.some((t) => {
    if (t.effect !== undefined && t.effect !== '' && t.effect !== taint.effect) return false;
    const key = String(t.key ?? '');
    if (key !== '' && key !== taint.key) return false;
    const op = t.operator ?? 'Equal';
    if (op === 'Exists') return true;
    if (key === '') return false; // an empty key must go with Exists
    return String(t.value ?? '') === String(taint.value ?? '');
  });
}

/** Why the pod cannot go on the node ("0/1 nodes are available: …"), or undefined when it can (or the node has not registered yet). */
export function placementRefusal(node: ApiObject | undefined, pod: ApiObject): string | undefined {
  if (!node) return undefined;
  const spec = isObj(node.spec) ? node.spec : {};
  const podSpec = isObj(pod.spec) ? pod.spec : {};
  const tolerations = list(podSpec.tolerations);
  const why = (reason: string) => `0/1 nodes are available: 1 ${reason}.`;
  if (spec.unschedulable === true && !tolerates(tolerations, { key: UNSCHEDULABLE_TAINT, effect: 'NoSchedule' })) return why('node(s) were unschedulable');
  for (const taint of list(spec.taints)) {
    if (taint.effect !== 'NoSchedule' && taint.effect !== 'NoExecute') continue;
    if (!tolerates(tolerations, taint)) return why(`node(s) had untolerated taint {${String(taint.key ?? '')}: ${String(taint.value ?? '')}}`);
  }
  return undefined;
}
