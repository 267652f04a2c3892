/**
 * The Deployment controller, folded together with the ReplicaSet controller:
 * pods are grouped by their pod-template-hash label (one group per virtual
 * ReplicaSet `<deployment>-<hash>`), and each call moves the groups one step
 * towards "replicas pods of the current template, all available", never
 * further than maxSurge/maxUnavailable allow.
 */
import type { Deployment, DeploymentStatus } from 'kubernetes-types/apps/v1.js';
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import {
  availableAt,
  BURST_REQUEUE_MS,
  CREATED_ANNOTATION,
  condition,
  derivedUid,
  desiredCopy,
  generateName,
  isAvailable,
  isFinished,
  isReady,
  isTerminating,
  iso,
  podFromTemplate,
  removalOrder,
  scaledValue,
  templateHash,
  type Ctx,
} from './common.js';

export const POD_TEMPLATE_HASH_LABEL = 'pod-template-hash';
/** While old pods of a Recreate rollout are still going away, look again this soon. */
const RECREATE_POLL_MS = 1000;

export interface ControllerResult {
  pods: Pod[];
  status: Record<string, unknown>;
}

/** The ReplicaSet name a Deployment's pods of one template belong to. */
export function replicaSetName(deployment: string, hash: string): string {
  return `${deployment}-${hash}`;
}

/** maxSurge and maxUnavailable resolved against `replicas`, as Kubernetes rounds them. */
export function rollingFenceposts(d: Deployment, replicas: number): { maxSurge: number; maxUnavailable: number } {
  const ru = d.spec?.strategy?.rollingUpdate;
  const maxSurge = scaledValue(ru?.maxSurge, replicas, true, '25%') ?? 0;
  let maxUnavailable = scaledValue(ru?.maxUnavailable, replicas, false, '25%') ?? 0;
  if (maxSurge === 0 && maxUnavailable === 0) maxUnavailable = 1;
  return { maxSurge, maxUnavailable };
}

export function reconcileDeployment(ctx: Ctx, o: StoredObject, owned: Pod[], problems: string[]): ControllerResult {
  const { now, state } = ctx;
  const key = `Deployment/${o.namespace}/${o.name}`;
  const d = o.object as Deployment;
  const live = owned.filter((p) => !isTerminating(p) && !isFinished(p));
  const terminating = owned.filter(isTerminating);

  if (problems.length) {
    // An edit the API server would have refused: what runs keeps running, nothing new starts.
    const status: DeploymentStatus = {
      replicas: live.length,
      readyReplicas: live.filter(isReady).length,
      conditions: [
        cond(ctx, key, 'ReplicaFailure', 'True', 'InvalidSpec', `the Deployment cannot be used as written: ${problems.join('; ')}`),
      ],
    };
    return { pods: live.map(desiredCopy), status: status as unknown as Record<string, unknown> };
  }

  const spec = d.spec!;
  const replicas = spec.replicas ?? 1;
  const minReady = spec.minReadySeconds ?? 0;
  const recreate = spec.strategy?.type === 'Recreate';
  const template = spec.template as PodTemplateSpec;
  const hash = templateHash(template);
  const rsName = replicaSetName(o.name, hash);
  const owner = { apiVersion: 'apps/v1', kind: 'ReplicaSet', name: rsName, uid: derivedUid(`${o.namespace}/${rsName}`) };
  const available = (p: Pod) => isAvailable(p, minReady, now);
  const isNew = (p: Pod) => p.metadata?.labels?.[POD_TEMPLATE_HASH_LABEL] === hash;

  let newPods = live.filter(isNew);
  let oldPods = live.filter((p) => !isNew(p));
  const created: Pod[] = [];
  const create = (wanted: number) => {
    const n = Math.min(wanted, ctx.burst);
    if (n < wanted) ctx.requeueAt(now + BURST_REQUEUE_MS);
    for (let i = 0; i < n; i++) {
      const name = generateName(rsName, o.namespace, ctx.random, ctx.taken);
      created.push(
        podFromTemplate({
          template,
          name,
          namespace: o.namespace,
          labels: { [POD_TEMPLATE_HASH_LABEL]: hash },
          owner,
          now,
          nodeName: ctx.nodeName,
        }),
      );
    }
  };
  const removeFrom = (pods: Pod[], n: number, only: (p: Pod) => boolean = () => true): Pod[] => {
    const victims = new Set(pods.filter(only).sort(removalOrder).slice(0, Math.max(0, n)));
    return pods.filter((p) => !victims.has(p));
  };
  const { maxSurge, maxUnavailable } = recreate ? { maxSurge: 0, maxUnavailable: replicas } : rollingFenceposts(d, replicas);

  if (spec.paused) {
    // Paused: nothing rolls out, but a Deployment whose pods all share one template still scales (as Kubernetes
    // scales a paused Deployment's only ReplicaSet); more pods are copies of one it has, since the template
    // in the file may already be the next one.
    const hashes = new Set(live.map((p) => p.metadata?.labels?.[POD_TEMPLATE_HASH_LABEL]));
    if (hashes.size === 1) {
      const group = isNew(live[0]!) ? newPods : oldPods;
      if (group.length > replicas) {
        const kept = removeFrom(group, group.length - replicas);
        if (group === newPods) newPods = kept;
        else oldPods = kept;
      } else {
        const n = Math.min(replicas - group.length, ctx.burst);
        if (n < replicas - group.length) ctx.requeueAt(now + BURST_REQUEUE_MS);
        for (let i = 0; i < n; i++) created.push(copyOf(ctx, group[0]!, o.namespace));
      }
    }
  } else if (oldPods.length === 0) {
    if (recreate && terminating.some((p) => !isNew(p))) {
      ctx.requeueAt(now + RECREATE_POLL_MS);
    } else if (newPods.length > replicas) newPods = removeFrom(newPods, newPods.length - replicas);
    else create(replicas - newPods.length);
  } else if (recreate) {
    // Every old pod goes first; the new ones start once the agent no longer reports any.
    oldPods = [];
    ctx.requeueAt(now + RECREATE_POLL_MS);
  } else {
    // A scale-down in the middle of a rollout: shed what exceeds replicas + maxSurge, old pods first.
    let excess = oldPods.length + newPods.length - (replicas + maxSurge);
    if (excess > 0) {
      const fromOld = Math.min(excess, oldPods.length);
      oldPods = removeFrom(oldPods, fromOld);
      excess -= fromOld;
      newPods = removeFrom(newPods, excess);
    }
    // The new group grows as far as the surge allows.
    if (newPods.length > replicas) newPods = removeFrom(newPods, newPods.length - replicas);
    else {
      const room = replicas + maxSurge - (oldPods.length + newPods.length);
      create(Math.max(0, Math.min(room, replicas - newPods.length)));
    }
    // Old pods go as far as availability allows: unavailable ones first, then available ones down to minAvailable.
    const minAvailable = replicas - maxUnavailable;
    const allNew = [...newPods, ...created];
    const newUnavailable = allNew.filter((p) => !available(p)).length;
    const maxScaledDown = oldPods.length + allNew.length - minAvailable - newUnavailable;
    if (maxScaledDown > 0) {
      const unhealthy = oldPods.filter((p) => !available(p)).length;
      const cleanup = Math.min(maxScaledDown, unhealthy);
      oldPods = removeFrom(oldPods, cleanup, (p) => !available(p));
      const availableCount = oldPods.filter(available).length + allNew.filter(available).length;
      if (availableCount > minAvailable) oldPods = removeFrom(oldPods, availableCount - minAvailable);
    }
  }

  const result = [...oldPods.map(desiredCopy), ...newPods.map(desiredCopy), ...created];
  const observed = [...oldPods, ...newPods];
  for (const p of observed) {
    const at = availableAt(p, minReady, now);
    if (at !== undefined) ctx.requeueAt(at);
  }

  const updated = newPods.length + created.filter(isNew).length;
  const ready = observed.filter(isReady).length;
  const availableN = observed.filter(available).length;
  const total = result.length;
  const status: DeploymentStatus = {
    replicas: total,
    updatedReplicas: updated,
    readyReplicas: ready,
    availableReplicas: availableN,
    unavailableReplicas: Math.max(0, Math.max(total, replicas) - availableN),
    conditions: [],
  };
  const minAvailable = replicas - (recreate ? 0 : maxUnavailable);
  status.conditions!.push(
    availableN >= minAvailable
      ? cond(ctx, key, 'Available', 'True', 'MinimumReplicasAvailable', 'Deployment has minimum availability.')
      : cond(ctx, key, 'Available', 'False', 'MinimumReplicasUnavailable', 'Deployment does not have minimum availability.'),
  );
  const complete = updated === replicas && total === replicas && availableN === replicas;
  const deadline = spec.progressDeadlineSeconds ?? 600;
  const progressKey = `${o.namespace}/${o.name}`;
  const signature = `${hash}:${total}:${updated}:${ready}:${availableN}`;
  const prev = state.progress[progressKey];
  const lastProgress = prev && prev.signature === signature ? prev.at : now;
  state.progress[progressKey] = { signature, at: lastProgress };
  if (spec.paused) {
    status.conditions!.push(cond(ctx, key, 'Progressing', 'Unknown', 'DeploymentPaused', 'Deployment is paused'));
  } else if (complete) {
    status.conditions!.push(cond(ctx, key, 'Progressing', 'True', 'NewReplicaSetAvailable', `ReplicaSet "${rsName}" has successfully progressed.`));
  } else if (now - lastProgress >= deadline * 1000) {
    status.conditions!.push(cond(ctx, key, 'Progressing', 'False', 'ProgressDeadlineExceeded', `ReplicaSet "${rsName}" has timed out progressing.`));
  } else {
    status.conditions!.push(cond(ctx, key, 'Progressing', 'True', 'ReplicaSetUpdated', `ReplicaSet "${rsName}" is progressing.`));
    ctx.requeueAt(lastProgress + deadline * 1000);
  }
  return { pods: result, status: status as unknown as Record<string, unknown> };
}

/** A new pod made like `p` (same labels, owner and spec) under a new name. */
function copyOf(ctx: Ctx, p: Pod, namespace: string): Pod {
  const owner = p.metadata!.ownerReferences![0]!;
  const d = desiredCopy(p);
  return {
    ...d,
    metadata: {
      ...d.metadata,
      name: generateName(owner.name, namespace, ctx.random, ctx.taken),
      annotations: { ...(d.metadata?.annotations ?? {}), [CREATED_ANNOTATION]: String(ctx.now) },
    },
  };
}

/** A condition in the Deployment/DaemonSet shape (with lastUpdateTime). */
export function cond(ctx: Ctx, owner: string, type: string, status: 'True' | 'False' | 'Unknown', reason: string, message: string) {
  const c = condition(ctx.state, owner, type, status, reason, message, ctx.now);
  return {
    type,
    status,
    reason,
    message,
    lastUpdateTime: iso(c.lastUpdateTime),
    lastTransitionTime: iso(c.lastTransitionTime),
  };
}
