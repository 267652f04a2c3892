/**
 * Adoption and release, as kube-controller-manager's controllers claim what
 * they select: an object without a controller (its owner was deleted with
 * `--cascade=orphan`) that a live controller's selector matches becomes that
 * controller's; one whose labels no longer match its controller's selector
 * (`kubectl label pod … app=debug --overwrite`) is let go, and its
 * controller makes a replacement. Pure: the controller manager writes what
 * this plans.
 *
 * Who claims what: ReplicaSets, ReplicationControllers, StatefulSets and
 * DaemonSets their pods; Deployments their ReplicaSets; StatefulSets and
 * DaemonSets their ControllerRevisions. Jobs do not adopt here: their
 * selector is their own uid unless written by hand.
 */
import type { ApiObject, Obj } from '../api/types.js';
import { selectorMatches, type LabelSelector } from '../labels.js';

export interface Claimant {
  object: ApiObject;
  /** What it selects; undefined or empty selects nothing (the API refuses an empty selector for these kinds). */
  selector: LabelSelector | undefined;
  /** Beyond the selector, what it may own (a StatefulSet only pods named as its members); undefined takes whatever the selector matches. */
  accepts?: (dependent: ApiObject) => boolean;
}

export interface OwnershipChange {
  object: ApiObject;
  /** The object's ownerReferences after the change. */
  ownerReferences: Obj[];
  /** Adopted by this controller, or released from it. */
  change: 'adopt' | 'release';
  controller: ApiObject;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const refsOf = (o: ApiObject): Obj[] => (Array.isArray(o.metadata.ownerReferences) ? (o.metadata.ownerReferences as unknown[]).filter(isObj) : []);
const nsOf = (o: ApiObject) => o.metadata.namespace ?? 'default';

/** A workload's spec.selector as a LabelSelector: a ReplicationController's is a plain map. */
export function selectorOf(o: ApiObject): LabelSelector | undefined {
  const sel = isObj(o.spec) ? o.spec.selector : undefined;
  if (!isObj(sel)) return undefined;
  if (o.kind === 'ReplicationController') return { matchLabels: Object.fromEntries(Object.entries(sel).filter(([, v]) => typeof v === 'string')) as Record<string, string> };
  return sel as LabelSelector;
}

/**
 * Whether a pod is named as one of the StatefulSet's (`<set>-<ordinal>`), as
 * upstream's StatefulSet claims only its members: an orphan `debug` pod
 * carrying the set's labels stays the user's, and deleting the set leaves it.
 */
export function isStatefulSetMember(set: ApiObject, pod: ApiObject): boolean {
  const m = /^(.*)-([0-9]+)$/.exec(String(pod.metadata.name ?? ''));
  return !!m && m[1] === set.metadata.name;
}

const claims = (c: Claimant, d: ApiObject, labels: Record<string, string>) => nsOf(c.object) === nsOf(d) && selectorMatches(c.selector!, labels) && (c.accepts?.(d) ?? true);

function selectsAnything(s: LabelSelector | undefined): s is LabelSelector {
  return !!s && (Object.keys(s.matchLabels ?? {}).length > 0 || (s.matchExpressions ?? []).length > 0);
}

/**
 * The adoptions and releases among `dependents` by `claimants` (all of the
 * kinds that claim these dependents). An object being deleted is neither
 * adopted nor released, nor is anything by a controller being deleted; of
 * several controllers matching an orphan, the oldest takes it.
 */
export function planOwnership(claimants: Claimant[], dependents: ApiObject[]): OwnershipChange[] {
  const live = claimants
    .filter((c) => !c.object.metadata.deletionTimestamp && c.object.metadata.uid && selectsAnything(c.selector))
    .sort((a, b) => String(a.object.metadata.creationTimestamp ?? '').localeCompare(String(b.object.metadata.creationTimestamp ?? '')) || String(a.object.metadata.name).localeCompare(String(b.object.metadata.name)));
  const byUid = new Map(claimants.map((c) => [String(c.object.metadata.uid), c]));
  const out: OwnershipChange[] = [];
  for (const d of dependents) {
    if (d.metadata.deletionTimestamp) continue;
    const labels = (isObj(d.metadata.labels) ? d.metadata.labels : {}) as Record<string, string>;
    const refs = refsOf(d);
    const ref = refs.find((r) => r.controller === true);
    if (ref) {
      const owner = byUid.get(String(ref.uid));
      if (!owner || owner.object.metadata.deletionTimestamp || !selectsAnything(owner.selector) || owner.object.kind !== ref.kind) continue;
      if (claims(owner, d, labels)) continue;
      out.push({ object: d, ownerReferences: refs.filter((r) => r !== ref), change: 'release', controller: owner.object });
      continue;
    }
    const owner = live.find((c) => claims(c, d, labels));
    if (!owner) continue;
    const o = owner.object;
    const mine: Obj = { apiVersion: o.apiVersion, kind: o.kind, name: o.metadata.name, uid: o.metadata.uid, controller: true, blockOwnerDeletion: true };
    out.push({ object: d, ownerReferences: [...refs.filter((r) => r.uid !== o.metadata.uid), mine], change: 'adopt', controller: o });
  }
  return out;
}
