/**
 * The DaemonSet controller for the one node this agent runs: one pod here when
 * the template's nodeSelector fits the node, replaced when the template changes
 * (RollingUpdate with one node is "remove, wait until gone, create") or only
 * when removed by hand (OnDelete), and replaced when it fails.
 */
import type { DaemonSet, DaemonSetStatus } from 'kubernetes-types/apps/v1.js';
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../stored-object.js';
import {
  availableAt,
  derivedUid,
  desiredCopy,
  generateName,
  isAvailable,
  isFinished,
  isReady,
  isTerminating,
  podFromTemplate,
  removalOrder,
  scaledValue,
  selectorMatches,
  templateHash,
  type Ctx,
} from './common.js';
import { cond, type ControllerResult } from './deployment.js';

export const CONTROLLER_REVISION_HASH_LABEL = 'controller-revision-hash';
const REPLACE_POLL_MS = 1000;

/** The labels this node is taken to carry, for a DaemonSet's nodeSelector. */
export function nodeLabels(nodeName: string): Record<string, string> {
  return { 'kubernetes.io/hostname': nodeName, 'kubernetes.io/os': 'linux', 'kubernetes.io/arch': process.arch === 'x64' ? 'amd64' : process.arch };
}

export function reconcileDaemonSet(ctx: Ctx, o: StoredObject, owned: Pod[], problems: string[]): ControllerResult {
  const key = `DaemonSet/${o.namespace}/${o.name}`;
  const ds = o.object as DaemonSet;
  const live = owned.filter((p) => !isTerminating(p) && !isFinished(p));
  if (problems.length) {
    const status: DaemonSetStatus = {
      currentNumberScheduled: live.length,
      desiredNumberScheduled: 0,
      numberMisscheduled: 0,
      numberReady: live.filter(isReady).length,
      conditions: [cond(ctx, key, 'ReplicaFailure', 'True', 'InvalidSpec', `the DaemonSet cannot be used as written: ${problems.join('; ')}`)],
    };
    return { pods: live.map(desiredCopy), status: status as unknown as Record<string, unknown> };
  }
  const spec = ds.spec!;
  const template = spec.template as PodTemplateSpec;
  const hash = templateHash(template);
  const minReady = spec.minReadySeconds ?? 0;
  const onDelete = spec.updateStrategy?.type === 'OnDelete';
  const fits = selectorMatches({ matchLabels: template.spec?.nodeSelector ?? {} }, nodeLabels(ctx.nodeName));
  const isNew = (p: Pod) => p.metadata?.labels?.[CONTROLLER_REVISION_HASH_LABEL] === hash;

  // maxSurge on one node: the new pod starts beside the old one, which goes once the new one is available.
  const surge = !onDelete && (scaledValue(spec.updateStrategy?.rollingUpdate?.maxSurge, 1, true, '0') ?? 0) > 0;
  const best = (pods: Pod[]) => [...pods].sort((a, b) => Number(isReady(b)) - Number(isReady(a)) || removalOrder(b, a))[0];
  const newest = best(live.filter(isNew));
  const oldest = best(live.filter((p) => !isNew(p)));
  let keep: Pod[] = [];
  const created: Pod[] = [];
  const create = () => {
    const name = generateName(o.name, o.namespace, ctx.random, ctx.taken);
    created.push(
      podFromTemplate({
        template,
        name,
        namespace: o.namespace,
        labels: { [CONTROLLER_REVISION_HASH_LABEL]: hash },
        owner: { apiVersion: 'apps/v1', kind: 'DaemonSet', name: o.name, uid: derivedUid(key) },
        now: ctx.now,
        nodeName: ctx.nodeName,
      }),
    );
  };
  if (fits) {
    // One pod per node; any extra is removed.
    if (newest) {
      keep = [newest];
      if (surge && oldest && !isAvailable(newest, minReady, ctx.now)) keep.push(oldest);
    } else if (oldest && onDelete) {
      keep = [oldest];
    } else if (oldest && surge) {
      keep = [oldest];
      create();
    } else if (oldest || owned.some(isTerminating)) {
      // Out of date (or still going away): removed first, the new one starts once the agent no longer reports it.
      ctx.requeueAt(ctx.now + REPLACE_POLL_MS);
    } else {
      create();
    }
  }
  for (const p of keep) {
    const at = availableAt(p, minReady, ctx.now);
    if (at !== undefined) ctx.requeueAt(at);
  }
  // Counted per node, as the DaemonSet controller does: this node counts once, whatever it runs.
  const desired = fits ? 1 : 0;
  const running = [...keep, ...created];
  const available = keep.some((p) => isAvailable(p, minReady, ctx.now)) ? 1 : 0;
  const status: DaemonSetStatus = {
    desiredNumberScheduled: desired,
    currentNumberScheduled: running.length ? 1 : 0,
    numberMisscheduled: 0,
    numberReady: keep.some(isReady) ? 1 : 0,
    updatedNumberScheduled: running.some(isNew) ? 1 : 0,
    numberAvailable: available,
    numberUnavailable: Math.max(0, desired - available),
  };
  return { pods: [...keep.map(desiredCopy), ...created], status: status as unknown as Record<string, unknown> };
}
