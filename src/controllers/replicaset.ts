/**
 * The ReplicaSet controller for a ReplicaSet no Deployment owns, and for a
 * ReplicationController (the same controller upstream, with a plain label
 * map for a selector): keeps `replicas` live pods of the template, named
 * `<owner>-<5 random>`, making at most `burst` in one call and removing the
 * least useful first (removalOrder); failed pods are replaced. Pure.
 */
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import { availableAt, generateName, isAvailable, isFinished, isReady, isTerminating, podFromTemplate, removalOrder } from './common.js';

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export interface ReplicaSetInput {
  owner: { apiVersion: string; kind: 'ReplicaSet' | 'ReplicationController'; name: string; namespace: string; uid: string; generation?: number };
  spec: Obj;
  /** Pods the owner controls. */
  pods: Pod[];
  nodeName: string;
  now: number;
  random: () => number;
  /** Every pod name in use ("namespace/name"). */
  taken: Set<string>;
  burst: number;
}

export interface ReplicaSetOutput {
  createPods: Pod[];
  deletePods: Pod[];
  status: Obj;
  /** More to make than one call may: call again soon. */
  more: boolean;
  requeueAt?: number;
}

export function reconcileReplicaSet(input: ReplicaSetInput): ReplicaSetOutput {
  const { owner, spec, now } = input;
  const replicas = typeof spec.replicas === 'number' ? spec.replicas : 1;
  const minReady = typeof spec.minReadySeconds === 'number' ? spec.minReadySeconds : 0;
  const failed = input.pods.filter((p) => isFinished(p) && !isTerminating(p));
  const live = input.pods.filter((p) => !isTerminating(p) && !isFinished(p));
  const out: ReplicaSetOutput = { createPods: [], deletePods: [...failed], status: {}, more: false };
  if (live.length > replicas) {
    out.deletePods.push(...[...live].sort(removalOrder).slice(0, live.length - replicas));
  } else if (live.length < replicas) {
    const want = replicas - live.length;
    const n = Math.min(want, input.burst);
    out.more = n < want;
    const template = (isObj(spec.template) ? spec.template : {}) as PodTemplateSpec;
    for (let i = 0; i < n; i++) {
      out.createPods.push(
        podFromTemplate({
          template,
          name: generateName(owner.name, owner.namespace, input.random, input.taken),
          namespace: owner.namespace,
          labels: {},
          owner: { apiVersion: owner.apiVersion, kind: owner.kind, name: owner.name, uid: owner.uid },
          now,
          nodeName: input.nodeName,
        }),
      );
    }
  }
  const kept = live.filter((p) => !out.deletePods.includes(p));
  for (const p of kept) {
    const at = availableAt(p, minReady, now);
    if (at !== undefined && (out.requeueAt === undefined || at < out.requeueAt)) out.requeueAt = at;
  }
  const status: Obj = {
    replicas: live.length,
    fullyLabeledReplicas: live.length,
    readyReplicas: live.filter(isReady).length,
    availableReplicas: live.filter((p) => isAvailable(p, minReady, now)).length,
    observedGeneration: owner.generation ?? 1,
  };
  for (const k of ['readyReplicas', 'availableReplicas', 'fullyLabeledReplicas']) if (status[k] === 0) delete status[k];
  out.status = status;
  return out;
}
