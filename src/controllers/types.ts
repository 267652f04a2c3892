/**
 * The contract between the workload controllers and the node agent.
 *
 * The controllers are one pure function, `reconcile`: given every workload
 * object read from the manifests, the pods they made earlier (with the agent's
 * current status) and a small memory they keep between calls, it returns the
 * complete set of pods that should exist and each workload's status. The agent
 * creates what is new and removes what is missing; nothing else crosses.
 *
 * What the agent can rely on:
 * - A pod's identity is its namespace/name. A pod that already exists is
 *   returned with the metadata (name, namespace, labels, annotations,
 *   ownerReferences) and spec it came in with, never regenerated, so an
 *   unchanged pod compares equal from call to call. New pods carry
 *   spec.nodeName = the node and the annotation controllers.skiff.io/created.
 * - Finished pods (phase Succeeded or Failed) of a Job stay in the desired
 *   set, unchanged, until the Job's ttlSecondsAfterFinished passes or the Job
 *   goes away; the agent must not restart a Succeeded/Failed pod whose
 *   restartPolicy is Never/OnFailure. Deployments and DaemonSets drop their
 *   failed pods and make new ones.
 * - A pod the agent reports with metadata.deletionTimestamp is being removed:
 *   it is never put back in the desired set, but a Recreate rollout (and a
 *   DaemonSet update) waits until the agent no longer reports it.
 * - Pods are matched to workloads by their controller ownerReference: kind
 *   ReplicaSet `<deployment>-<pod-template-hash>` (with that label), DaemonSet
 *   or Job, by name. A pod whose owner is gone is left out (removed).
 * - A workload that does not validate gets `problems` (and a condition);
 *   what it already runs keeps running — as when the API server refuses an
 *   edit — and nothing new starts.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';

export type WorkloadKind = 'Deployment' | 'DaemonSet' | 'Job' | 'CronJob';
export const WORKLOAD_KINDS: readonly WorkloadKind[] = ['Deployment', 'DaemonSet', 'Job', 'CronJob'];

/** What the Job controller remembers about one Job between calls. */
export interface JobMemory {
  /** Becomes the pods' controller-uid label; a new one when the pod template changes (the Job starts over). */
  uid: string;
  templateHash: string;
  /** When the controller first saw the Job (its AGE). */
  createdAt: number;
  /** When the first pod was made (status.startTime); reset while suspended. */
  startTime?: number;
  finished?: { type: 'Complete' | 'Failed'; reason: string; message: string; at: number };
  /** ttlSecondsAfterFinished passed: the pods are gone and the Job is reported as deleted. */
  expired?: boolean;
  /** The counts last seen, so a Job whose pods are gone still reports them. */
  counts?: { succeeded: number; failed: number; completedIndexes?: string };
}

/** A Job made by a CronJob: it exists only here, not in a file. */
export interface VirtualJob {
  namespace: string;
  name: string;
  cronJob: string;
  /** The schedule time it was made for (ms since the epoch). */
  scheduledTime: number;
  /** The uid of the Job object that stands for it in an API, once made there (see ControllerDriver.adoptJobUid). */
  uid?: string;
  /** The CronJob's jobTemplate as it was when the Job was made (metadata + spec). */
  template: { metadata?: Record<string, unknown>; spec: Record<string, unknown> };
}

export interface CronJobMemory {
  createdAt: number;
  lastScheduleTime?: number;
  /** The completion time of the latest Job that succeeded. */
  lastSuccessfulTime?: number;
}

/** Conditions remembered so that lastTransitionTime only moves when the status flips. */
export interface ConditionMemory {
  status: string;
  reason: string;
  lastTransitionTime: number;
  lastUpdateTime: number;
}

/**
 * Everything the controllers keep between calls. Plain JSON: the driver may
 * write it to disk and hand it back after a restart. Keys are "namespace/name".
 */
export interface ControllerState {
  version: 1;
  /** First time each workload (kind/namespace/name) was seen: its AGE, and a CronJob's earliest schedule. */
  firstSeen: Record<string, number>;
  jobs: Record<string, JobMemory>;
  cronJobs: Record<string, CronJobMemory>;
  virtualJobs: Record<string, VirtualJob>;
  /** kind/namespace/name/type → condition. */
  conditions: Record<string, ConditionMemory>;
  /** Deployment (namespace/name) → the counts last seen and when they last changed (progressDeadlineSeconds). */
  progress: Record<string, { signature: string; at: number }>;
}

export function emptyState(): ControllerState {
  return { version: 1, firstSeen: {}, jobs: {}, cronJobs: {}, virtualJobs: {}, conditions: {}, progress: {} };
}

export interface ReconcileInput {
  /** Objects of kinds Deployment, DaemonSet, Job and CronJob (others are ignored). */
  workloads: StoredObject[];
  /** Pods the controllers made earlier, with the agent's current status. */
  pods: Pod[];
  nodeName: string;
  /** ms since the epoch. */
  now: number;
  state: ControllerState;
  /** [0, 1): the source of pod-name suffixes. Math.random when absent. */
  random?: () => number;
  /** New pods one workload may make in one call; CREATE_BURST when absent (tests fill large workloads faster). */
  createBurst?: number;
  /** "namespace/name" of pods from elsewhere (the manifests' own Pods): never used for a new pod. */
  reservedPodNames?: string[];
}

export interface WorkloadStatus {
  kind: WorkloadKind;
  namespace: string;
  name: string;
  /** In the API's shape (DeploymentStatus, DaemonSetStatus, JobStatus, CronJobStatus). */
  status: Record<string, unknown>;
  /** The workload's spec as the controller used it (for `skiff get`'s columns). */
  spec: Record<string, unknown>;
  /** Why the object cannot be used as written; empty when it is fine. */
  problems: string[];
  /** When the controller first saw it (ms): the AGE column. */
  createdAt: number;
  /** A Job whose ttlSecondsAfterFinished passed: as deleted; the agent should hide it. */
  deleted?: boolean;
  /** For Jobs a CronJob made: the CronJob's name. */
  ownerCronJob?: string;
}

export interface ReconcileOutput {
  /** The COMPLETE set of controller-owned pods that should exist. */
  pods: Pod[];
  statuses: WorkloadStatus[];
  state: ControllerState;
  /** When something timed happens next (minReadySeconds, deadlines, schedules, ttl). */
  requeueAfterMs?: number;
}
