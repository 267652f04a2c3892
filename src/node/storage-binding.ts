/**
 * The PV controller's decisions, pure: which PersistentVolume a claim
 * binds to (the smallest available one of its class that has its access
 * modes, volume mode, capacity and labels, and fits this node; one bound
 * to it by name first), which claims a pod needs, and what phase a volume
 * is in from its claim. The storage controller (storage.ts) acts on them.
 */
import { parseLabelSelector } from '../api/selectors.js';
import { claimClass, listOf, specOf, statusOf, storageBytes, volumeClass } from '../api/kinds/volume-common.js';
import { selectorString } from '../api/kinds/workload-rows.js';
import type { ApiObject, Obj } from '../api/types.js';

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

export const requestOf = (claim: ApiObject): number => {
  const r = specOf(claim).resources;
  return storageBytes(isObj(r) && isObj(r.requests) ? r.requests.storage : undefined) ?? 0;
};
export const capacityOf = (pv: ApiObject): number => storageBytes(isObj(specOf(pv).capacity) ? (specOf(pv).capacity as Obj).storage : undefined) ?? 0;

/** Whether the volume's required node affinity lets it be used on `node` (labels of the Node). */
export function fitsNode(pv: ApiObject, nodeLabels: Record<string, string>): boolean {
  const aff = specOf(pv).nodeAffinity;
  const req = isObj(aff) && isObj(aff.required) ? aff.required : undefined;
  if (!req) return true;
  const terms = listOf(req.nodeSelectorTerms).filter(isObj);
  // Terms are ORed, a term's expressions ANDed (a term with none matches nothing, as upstream).
  return terms.some((t) => {
    const exprs = listOf(t.matchExpressions).filter(isObj);
    if (exprs.length === 0) return false;
    return exprs.every((e) => {
      const has = Object.prototype.hasOwnProperty.call(nodeLabels, String(e.key));
      const v = nodeLabels[String(e.key)];
      const values = listOf(e.values).map(String);
      switch (e.operator) {
        case 'In':
          return has && values.includes(v!);
        case 'NotIn':
          return !has || !values.includes(v!);
        case 'Exists':
          return has;
        case 'DoesNotExist':
          return !has;
        case 'Gt':
          return has && Number(v) > Number(values[0]);
        case 'Lt':
          return has && Number(v) < Number(values[0]);
        default:
          return false;
      }
    });
  });
}

/** The claim the volume's claimRef names is this one (by uid when the ref has one). */
export function refersTo(pv: ApiObject, claim: ApiObject): boolean {
  const ref = specOf(pv).claimRef;
  if (!isObj(ref)) return false;
  if (ref.name !== claim.metadata.name || (ref.namespace ?? '') !== (claim.metadata.namespace ?? '')) return false;
  return ref.uid === undefined || ref.uid === '' || ref.uid === claim.metadata.uid;
}

/** Why the volume cannot serve the claim, or undefined when it can. */
export function mismatch(pv: ApiObject, claim: ApiObject, nodeLabels: Record<string, string>): string | undefined {
  const s = specOf(pv);
  const c = specOf(claim);
  if (pv.metadata.deletionTimestamp) return 'is being deleted';
  if (volumeClass(pv) !== claimClass(claim)) return `is of class "${volumeClass(pv)}"`;
  const have = new Set(listOf(s.accessModes).map(String));
  const missing = listOf(c.accessModes).map(String).filter((m) => !have.has(m));
  if (missing.length > 0) return `has no access mode ${missing.join(', ')}`;
  if ((s.volumeMode ?? 'Filesystem') !== (c.volumeMode ?? 'Filesystem')) return `has volume mode ${String(s.volumeMode ?? 'Filesystem')}`;
  if (capacityOf(pv) < requestOf(claim)) return 'is too small';
  if (isObj(c.selector)) {
    let matches = false;
    try {
      matches = parseLabelSelector(selectorString(c.selector))(pv.metadata.labels);
    } catch {
      matches = false;
    }
    if (!matches) return "does not match the claim's selector";
  }
  if (!fitsNode(pv, nodeLabels)) return 'is for another node';
  return undefined;
}

/** A volume no claim holds: no claimRef, or one naming this claim (pre-bound), and not Released or Failed. */
function available(pv: ApiObject, claim: ApiObject): boolean {
  const phase = statusOf(pv).phase;
  if (phase === 'Released' || phase === 'Failed') return false;
  const ref = specOf(pv).claimRef;
  return !isObj(ref) || refersTo(pv, claim);
}

/**
 * The volume the claim should bind to, as findBestMatchForClaim picks it:
 * the one the claim names (if it fits), else one pre-bound to the claim,
 * else the smallest fitting available one (by name when sizes tie).
 */
export function bestVolume(claim: ApiObject, pvs: ApiObject[], nodeLabels: Record<string, string>): ApiObject | undefined {
  const named = specOf(claim).volumeName;
  if (typeof named === 'string' && named !== '') {
    const pv = pvs.find((p) => p.metadata.name === named);
    return pv && available(pv, claim) && !mismatchIgnoringClass(pv, claim, nodeLabels) ? pv : undefined;
  }
  const fitting = pvs.filter((p) => available(p, claim) && mismatch(p, claim, nodeLabels) === undefined);
  const prebound = fitting.find((p) => refersTo(p, claim));
  if (prebound) return prebound;
  return fitting
    .filter((p) => !isObj(specOf(p).claimRef))
    .sort((a, b) => capacityOf(a) - capacityOf(b) || String(a.metadata.name).localeCompare(String(b.metadata.name)))[0];
}

/** A claim that names its volume binds to it whatever its class says, as long as the rest fits. */
function mismatchIgnoringClass(pv: ApiObject, claim: ApiObject, nodeLabels: Record<string, string>): string | undefined {
  const why = mismatch(pv, claim, nodeLabels);
  return why?.startsWith('is of class') ? undefined : why;
}

/** The claim names a pod's volumes need, by volume: a claim's own, and an ephemeral volume's `<pod>-<volume>`. */
export function podClaims(pod: ApiObject): Array<{ volume: string; claim: string; ephemeral: boolean }> {
  const out: Array<{ volume: string; claim: string; ephemeral: boolean }> = [];
  for (const v of listOf(specOf(pod).volumes).filter(isObj)) {
    const name = String(v.name ?? '');
    if (isObj(v.persistentVolumeClaim) && typeof v.persistentVolumeClaim.claimName === 'string') out.push({ volume: name, claim: v.persistentVolumeClaim.claimName, ephemeral: false });
    else if (isObj(v.ephemeral)) out.push({ volume: name, claim: `${String(pod.metadata.name)}-${name}`, ephemeral: true });
  }
  return out;
}

/** The pod still holds its volumes: not finished (Succeeded/Failed pods have let go, as the kubelet unmounts them). */
export function podHoldsVolumes(pod: ApiObject): boolean {
  const phase = statusOf(pod).phase;
  return phase !== 'Succeeded' && phase !== 'Failed';
}

export type VolumePhase = 'Pending' | 'Available' | 'Bound' | 'Released' | 'Failed';

/**
 * The volume's phase from its claimRef and the claims there are: Available
 * with no claim (or one pre-bound that does not exist yet), Bound while its
 * claim is there with the uid it was bound to, Released once that claim is
 * gone. A Failed volume stays Failed.
 */
export function volumePhase(pv: ApiObject, claim: ApiObject | undefined): VolumePhase {
  const ref = specOf(pv).claimRef;
  const was = statusOf(pv).phase as VolumePhase | undefined;
  if (!isObj(ref)) return was === 'Failed' ? 'Failed' : 'Available';
  const boundUid = typeof ref.uid === 'string' && ref.uid !== '' ? ref.uid : undefined;
  if (!boundUid) return 'Available'; // pre-bound by name: waiting for its claim
  if (claim && claim.metadata.uid === boundUid) return 'Bound';
  return was === 'Failed' ? 'Failed' : 'Released';
}
