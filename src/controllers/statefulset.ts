/**
 * The StatefulSet controller, as a pure function over one set: given the
 * set (its template already normalized), the pods it owns, its revisions
 * and the claims that exist, it says which revision, claims and pods to
 * make, which pods to delete, and the status — one step of upstream's
 * StatefulSet control loop each call:
 *
 * - pods are `<set>-<ordinal>` for ordinals [start, start+replicas), with
 *   the pod-name, pod-index and controller-revision-hash labels, hostname =
 *   pod name and subdomain = serviceName;
 * - each volumeClaimTemplate gives the pod a claim `<template>-<set>-<ordinal>`
 *   (made before the pod, never deleted with it), mounted as a
 *   persistentVolumeClaim volume of the template's name;
 * - OrderedReady makes one pod at a time in ordinal order, each Running and
 *   Ready before the next, and removes from the highest ordinal one at a
 *   time; Parallel makes and removes all at once (at most `burst` a call);
 * - RollingUpdate replaces pods from the highest ordinal down to
 *   `partition`, one at a time, each Ready before the next; OnDelete makes
 *   a pod at the new revision only when one is deleted;
 * - persistentVolumeClaimRetentionPolicy: a claim is owned by the set
 *   (whenDeleted: Delete, so the garbage collector takes it with the set)
 *   and by its pod once scaled away (whenScaled: Delete), as upstream marks them.
 */
import type { Pod, PodTemplateSpec } from 'kubernetes-types/core/v1.js';
import { availableAt, CREATED_ANNOTATION, isAvailable, isFinished, isReady, isTerminating } from './common.js';
import { CONTROLLER_REVISION_HASH, planRevisions, templateOfData, type Revision, type RevisionPlan } from './history.js';

export const POD_NAME_LABEL = 'statefulset.kubernetes.io/pod-name';
export const POD_INDEX_LABEL = 'apps.kubernetes.io/pod-index';

type Obj = Record<string, unknown>;
const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export interface OwnerRef {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface StatefulSetInput {
  /** The StatefulSet as stored (metadata with uid and generation, spec with a normalized template, status). */
  set: { metadata: { name: string; namespace: string; uid: string; generation?: number }; spec: Obj; status?: Obj };
  /** Pods owned by the set (with status). */
  pods: Pod[];
  /** Its ControllerRevisions (name, revision, data). */
  revisions: Array<{ name: string; revision: number; data: unknown }>;
  /** Claims that exist in the set's namespace: name → their ownerReferences. Undefined: claims cannot be made here. */
  claims: Map<string, OwnerRef[]> | undefined;
  nodeName: string;
  now: number;
  /** New pods (and claims) at most in one call. */
  burst: number;
}

export interface StatefulSetOutput {
  revisions: RevisionPlan;
  createClaims: Obj[];
  /** Claims whose ownerReferences change (retention policy). */
  claimOwners: Array<{ name: string; ownerReferences: OwnerRef[] }>;
  createPods: Pod[];
  deletePods: Pod[];
  status: Obj;
  /** When to look again (minReadySeconds). */
  requeueAt?: number;
  /** Pods wait for claims this controller cannot make (no claims served): why. */
  waiting?: string;
}

const ordinalOf = (setName: string, p: Pod): number | undefined => {
  const n = p.metadata?.name ?? '';
  if (!n.startsWith(`${setName}-`)) return undefined;
  const tail = n.slice(setName.length + 1);
  return /^(0|[1-9]\d{0,9})$/.test(tail) ? Number(tail) : undefined;
};

export const claimName = (template: string, set: string, ordinal: number) => `${template}-${set}-${ordinal}`;

function claimTemplates(spec: Obj): Obj[] {
  return Array.isArray(spec.volumeClaimTemplates) ? spec.volumeClaimTemplates.filter(isObj) : [];
}
const templateName = (t: Obj) => String(isObj(t.metadata) ? (t.metadata.name ?? '') : '');

export function reconcileStatefulSet(input: StatefulSetInput): StatefulSetOutput {
  const { set, now } = input;
  const name = set.metadata.name;
  const ns = set.metadata.namespace;
  const spec = set.spec;
  const replicas = typeof spec.replicas === 'number' ? spec.replicas : 1;
  const start = isObj(spec.ordinals) && typeof spec.ordinals.start === 'number' ? spec.ordinals.start : 0;
  const parallel = spec.podManagementPolicy === 'Parallel';
  const monotonic = !parallel;
  const strategy = isObj(spec.updateStrategy) ? spec.updateStrategy : {};
  const onDelete = strategy.type === 'OnDelete';
  const partition = !onDelete && isObj(strategy.rollingUpdate) && typeof strategy.rollingUpdate.partition === 'number' ? strategy.rollingUpdate.partition : 0;
  const minReady = typeof spec.minReadySeconds === 'number' ? spec.minReadySeconds : 0;
  const serviceName = typeof spec.serviceName === 'string' && spec.serviceName !== '' ? spec.serviceName : undefined;
  const retention = isObj(spec.persistentVolumeClaimRetentionPolicy) ? spec.persistentVolumeClaimRetentionPolicy : {};
  const owner: OwnerRef = { apiVersion: 'apps/v1', kind: 'StatefulSet', name, uid: set.metadata.uid };
  const template = (isObj(spec.template) ? spec.template : {}) as Obj;
  const status = isObj(set.status) ? set.status : {};

  // Revisions: the current template's is the update revision; the status's current one stays until the roll is done.
  const existing: Revision[] = input.revisions.map((r) => ({ name: r.name, revision: r.revision, template: templateOfData(r.data) ?? {} }));
  const inUse = new Set<string>();
  for (const p of input.pods) {
    const h = p.metadata?.labels?.[CONTROLLER_REVISION_HASH];
    if (h) inUse.add(h);
  }
  if (typeof status.currentRevision === 'string') inUse.add(status.currentRevision);
  const limit = typeof spec.revisionHistoryLimit === 'number' ? spec.revisionHistoryLimit : 10;
  const plan = planRevisions(name, template, existing, limit, inUse);
  const updateRevision = plan.update.name;
  const currentRev = existing.find((r) => r.name === status.currentRevision) ?? plan.update;
  const currentRevision = currentRev.name;
  const templateOf = (rev: string) => (rev === updateRevision ? template : currentRev.template);

  const byOrdinal = new Map<number, Pod>();
  const condemned: Pod[] = [];
  for (const p of input.pods) {
    const ord = ordinalOf(name, p);
    if (ord === undefined) continue;
    if (ord >= start && ord < start + replicas) byOrdinal.set(ord, p);
    else condemned.push(p);
  }
  condemned.sort((a, b) => ordinalOf(name, b)! - ordinalOf(name, a)!);

  const out: StatefulSetOutput = { revisions: plan, createClaims: [], claimOwners: [], createPods: [], deletePods: [], status: {} };
  const healthy = (p: Pod) => isReady(p) && !isTerminating(p);
  const revisionFor = (ord: number) => (!onDelete && ord < start + partition ? currentRevision : updateRevision);
  let blocked = false;
  let made = 0;

  // Claims first (all of a pod's claims exist before the pod), with the owners the retention policy asks.
  const claimOwnersFor = (ord: number, pod: Pod | undefined, scaledAway: boolean): OwnerRef[] => {
    const refs: OwnerRef[] = [];
    if (retention.whenDeleted === 'Delete') refs.push({ ...owner, controller: true, blockOwnerDeletion: true });
    if (scaledAway && retention.whenScaled === 'Delete' && pod?.metadata?.uid) refs.push({ apiVersion: 'v1', kind: 'Pod', name: pod.metadata.name!, uid: pod.metadata.uid });
    return refs;
  };
  const ensureClaims = (ord: number): boolean => {
    const tpls = claimTemplates(spec);
    if (tpls.length === 0) return true;
    if (!input.claims) {
      out.waiting = 'PersistentVolumeClaims are not served by this node\'s API: the pods of volumeClaimTemplates wait';
      return false;
    }
    for (const t of tpls) {
      const cn = claimName(templateName(t), name, ord);
      if (input.claims.has(cn)) continue;
      const meta = isObj(t.metadata) ? t.metadata : {};
      const labels = { ...(isObj(meta.labels) ? (meta.labels as Record<string, string>) : {}), ...(isObj(spec.selector) && isObj(spec.selector.matchLabels) ? (spec.selector.matchLabels as Record<string, string>) : {}) };
      const refs = claimOwnersFor(ord, undefined, false);
      out.createClaims.push({
        apiVersion: 'v1',
        kind: 'PersistentVolumeClaim',
        metadata: { name: cn, namespace: ns, labels, ...(isObj(meta.annotations) ? { annotations: meta.annotations } : {}), ...(refs.length ? { ownerReferences: refs } : {}) },
        spec: structuredClone(isObj(t.spec) ? t.spec : {}),
      });
    }
    // Made before the pod in the same step (the caller writes claims first and no pod if one fails).
    return true;
  };

  const newPod = (ord: number): Pod => {
    const rev = revisionFor(ord);
    const t = structuredClone(templateOf(rev)) as PodTemplateSpec;
    const podName = `${name}-${ord}`;
    const podSpec = { ...(t.spec ?? { containers: [] }) } as Obj;
    const claimVolumes = claimTemplates(spec).map((c) => ({ name: templateName(c), persistentVolumeClaim: { claimName: claimName(templateName(c), name, ord) } }));
    if (claimVolumes.length) {
      const taken = new Set(claimVolumes.map((v) => v.name));
      podSpec.volumes = [...(Array.isArray(podSpec.volumes) ? (podSpec.volumes as Obj[]).filter((v) => !taken.has(String(v.name))) : []), ...claimVolumes];
    }
    podSpec.hostname = podName;
    if (serviceName) podSpec.subdomain = serviceName;
    podSpec.nodeName = input.nodeName;
    return {
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: {
        name: podName,
        namespace: ns,
        labels: { ...(t.metadata?.labels ?? {}), [POD_NAME_LABEL]: podName, [POD_INDEX_LABEL]: String(ord), [CONTROLLER_REVISION_HASH]: rev },
        annotations: { ...(t.metadata?.annotations ?? {}), [CREATED_ANNOTATION]: String(now) },
        ownerReferences: [{ ...owner, controller: true, blockOwnerDeletion: true }],
      },
      spec: podSpec as unknown as Pod['spec'],
    };
  };

  // 1. Every ordinal in range: failed pods go, missing ones come (in order, one at a time when OrderedReady).
  for (let ord = start; ord < start + replicas && !blocked; ord++) {
    const p = byOrdinal.get(ord);
    if (p && isFinished(p) && !isTerminating(p)) {
      out.deletePods.push(p);
      if (monotonic) blocked = true;
      continue;
    }
    if (!p) {
      if (made >= input.burst) {
        blocked = true;
        break;
      }
      if (!ensureClaims(ord)) {
        if (monotonic || !input.claims) blocked = true;
        continue;
      }
      out.createPods.push(newPod(ord));
      made++;
      if (monotonic) blocked = true;
      continue;
    }
    if (monotonic && !healthy(p)) blocked = true;
  }

  // 2. Ordinals out of range go, highest first (one at a time, once the rest are healthy, when OrderedReady).
  if (!blocked) {
    const unhealthyInRange = [...byOrdinal.values()].some((p) => !healthy(p));
    for (const p of condemned) {
      if (isTerminating(p)) {
        if (monotonic) break;
        continue;
      }
      if (monotonic && unhealthyInRange) break;
      out.deletePods.push(p);
      if (monotonic) break;
    }
    if (condemned.length > 0 && monotonic) blocked = true;
  }

  // 3. A rolling update: from the highest ordinal down to the partition, one pod at a time.
  if (!blocked && !onDelete) {
    for (let ord = start + replicas - 1; ord >= start + partition; ord--) {
      const p = byOrdinal.get(ord);
      if (!p) break;
      if (p.metadata?.labels?.[CONTROLLER_REVISION_HASH] !== updateRevision && !isTerminating(p)) {
        out.deletePods.push(p);
        break;
      }
      if (!healthy(p) || !isAvailable(p, minReady, now)) break;
    }
  }

  // Claims of scaled-away ordinals are owned by their pod when whenScaled is Delete (so they go with it).
  if (input.claims && retention.whenScaled === 'Delete') {
    for (const p of condemned) {
      const ord = ordinalOf(name, p)!;
      for (const t of claimTemplates(spec)) {
        const cn = claimName(templateName(t), name, ord);
        const refs = input.claims.get(cn);
        if (!refs || !p.metadata?.uid || refs.some((r) => r.kind === 'Pod' && r.uid === p.metadata!.uid)) continue;
        out.claimOwners.push({ name: cn, ownerReferences: [...refs.filter((r) => r.kind !== 'Pod'), { apiVersion: 'v1', kind: 'Pod', name: p.metadata.name!, uid: p.metadata.uid }] });
      }
    }
  }
  // whenDeleted: Delete: every claim of the set is owned by it (the garbage collector deletes them with the set).
  if (input.claims) {
    for (let ord = start; ord < start + replicas; ord++) {
      for (const t of claimTemplates(spec)) {
        const cn = claimName(templateName(t), name, ord);
        const refs = input.claims.get(cn);
        if (!refs) continue;
        const has = refs.some((r) => r.kind === 'StatefulSet' && r.uid === owner.uid);
        const want = retention.whenDeleted === 'Delete';
        const podRefs = refs.filter((r) => r.kind === 'Pod');
        // Scaled back up: a claim a scale-down had handed to its pod belongs to the set again.
        if (has === want && podRefs.length === 0) continue;
        const others = refs.filter((r) => r.kind !== 'Pod' && !(r.kind === 'StatefulSet' && r.uid === owner.uid));
        out.claimOwners.push({ name: cn, ownerReferences: [...others, ...(want ? [{ ...owner, controller: true, blockOwnerDeletion: true }] : [])] });
      }
    }
  }

  // Status, as upstream counts it.
  let created = 0, ready = 0, available = 0, current = 0, updated = 0;
  for (const p of input.pods) {
    if (ordinalOf(name, p) === undefined) continue;
    created++;
    if (isReady(p)) {
      ready++;
      if (isAvailable(p, minReady, now)) available++;
      else {
        const at = availableAt(p, minReady, now);
        if (at !== undefined && (out.requeueAt === undefined || at < out.requeueAt)) out.requeueAt = at;
      }
    }
    if (isTerminating(p)) continue;
    const rev = p.metadata?.labels?.[CONTROLLER_REVISION_HASH];
    if (rev === currentRevision) current++;
    if (rev === updateRevision) updated++;
  }
  const st: Obj = {
    observedGeneration: set.metadata.generation ?? 1,
    replicas: created,
    readyReplicas: ready,
    currentReplicas: current,
    updatedReplicas: updated,
    availableReplicas: available,
    currentRevision,
    updateRevision,
    collisionCount: typeof status.collisionCount === 'number' ? status.collisionCount : 0,
  };
  // The roll is done once every wanted pod runs the update revision and is ready.
  if (updated === replicas && ready === replicas && created === replicas) {
    st.currentRevision = updateRevision;
    st.currentReplicas = updated;
  }
  if (out.waiting) {
    // No time in it: the same wait writes the same status on every pass.
    st.conditions = [{ type: 'PodsWaiting', status: 'True', reason: 'ClaimsNotServed', message: out.waiting }];
  }
  out.status = st;
  return out;
}
