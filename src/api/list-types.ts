/**
 * The merge semantics of the served kinds, in place of the OpenAPI schemas
 * kube-apiserver has: which lists are maps keyed by fields
 * (x-kubernetes-list-map-keys; patchMergeKey for a strategic merge patch),
 * which are sets of scalars, which maps are replaced whole, and which
 * structs exist even when empty (Go value structs, which an Update never
 * "adds"). Server-side apply and the strategic merge patch both read this
 * one table. Anything not described is a granular map or an atomic list, as
 * upstream treats a list with no markers.
 */
import type { Kind } from './types.js';

export type ListKind =
  /** Items matched by these fields; `mergeKey` is the strategic merge patch's key (patchMergeKey). */
  | { keys: string[]; mergeKey: string; defaults?: Record<string, unknown> }
  | 'set'
  | 'atomic';

export interface FieldType {
  /** Struct fields with a type of their own. */
  fields?: Record<string, FieldType>;
  /** The type of every value of a map of user keys (labels, data). */
  values?: FieldType;
  list?: ListKind;
  items?: FieldType;
  /** Replaced as a whole by apply, owned as one field. */
  atomic?: boolean;
  /** A value struct: present (empty) in a new object, so never itself added. */
  value?: boolean;
}

const keyed = (keys: string[], items?: FieldType, defaults?: Record<string, unknown>): FieldType => ({ list: { keys, mergeKey: keys[0]!, ...(defaults ? { defaults } : {}) }, ...(items ? { items } : {}) });
const atomic: FieldType = { list: 'atomic' };
const set: FieldType = { list: 'set' };
const conditions = keyed(['type']);

const objectMeta: FieldType = {
  value: true,
  fields: { finalizers: set, ownerReferences: keyed(['uid']) },
};

const container: FieldType = {
  fields: {
    args: atomic,
    command: atomic,
    env: keyed(['name']),
    envFrom: atomic,
    ports: keyed(['containerPort', 'protocol'], undefined, { protocol: 'TCP' }),
    resizePolicy: atomic,
    resources: { value: true },
    volumeMounts: keyed(['mountPath']),
    volumeDevices: keyed(['devicePath']),
    securityContext: { fields: { capabilities: { fields: { add: atomic, drop: atomic } } } },
  },
};

const podSpec: FieldType = {
  value: true,
  fields: {
    containers: keyed(['name'], container),
    initContainers: keyed(['name'], container),
    ephemeralContainers: keyed(['name'], container),
    volumes: keyed(['name']),
    imagePullSecrets: keyed(['name']),
    tolerations: atomic,
    hostAliases: keyed(['ip']),
    topologySpreadConstraints: keyed(['topologyKey', 'whenUnsatisfiable']),
    readinessGates: atomic,
    resourceClaims: keyed(['name']),
    schedulingGates: keyed(['name']),
  },
};

const podTemplate: FieldType = { value: true, fields: { metadata: objectMeta, spec: podSpec } };
/** metav1.LabelSelector is a struct of type atomic. */
const labelSelector: FieldType = { atomic: true };
const workloadStatus: FieldType = { value: true, fields: { conditions } };

const roots: Record<string, FieldType> = {
  Pod: {
    fields: {
      metadata: objectMeta,
      spec: podSpec,
      status: { value: true, fields: { conditions, containerStatuses: atomic, initContainerStatuses: atomic, ephemeralContainerStatuses: atomic, podIPs: keyed(['ip']), hostIPs: keyed(['ip']) } },
    },
  },
  Service: {
    fields: {
      metadata: objectMeta,
      spec: { value: true, fields: { ports: keyed(['port', 'protocol'], undefined, { protocol: 'TCP' }), selector: { atomic: true }, clusterIPs: atomic, externalIPs: atomic, ipFamilies: atomic, loadBalancerSourceRanges: atomic } },
      status: { value: true, fields: { conditions } },
    },
  },
  ReplicationController: { fields: { metadata: objectMeta, spec: { value: true, fields: { selector: { atomic: true }, template: podTemplate } }, status: workloadStatus } },
  'apps/ControllerRevision': { fields: { metadata: objectMeta, data: { atomic: true } } },
  'apps/Deployment': { fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate, strategy: { value: true } } }, status: workloadStatus } },
  'apps/ReplicaSet': { fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate } }, status: workloadStatus } },
  'apps/DaemonSet': { fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate, updateStrategy: { value: true } } }, status: workloadStatus } },
  'apps/StatefulSet': {
    fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate, updateStrategy: { value: true }, volumeClaimTemplates: atomic } }, status: workloadStatus },
  },
  'batch/Job': { fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate } }, status: { value: true, fields: { conditions: atomic } } } },
  'batch/CronJob': {
    fields: {
      metadata: objectMeta,
      spec: { value: true, fields: { jobTemplate: { value: true, fields: { metadata: objectMeta, spec: { value: true, fields: { selector: labelSelector, template: podTemplate } } } } } },
      status: { value: true, fields: { active: atomic } },
    },
  },
  Node: { fields: { metadata: objectMeta, spec: { value: true, fields: { podCIDRs: set, taints: atomic } }, status: { value: true, fields: { conditions, addresses: keyed(['type']), images: atomic, volumesInUse: atomic } } } },
  Namespace: { fields: { metadata: objectMeta, spec: { value: true, fields: { finalizers: atomic } }, status: { value: true, fields: { conditions } } } },
};
const plain: FieldType = { fields: { metadata: objectMeta } };

/** The type of a kind's objects ("Pod", "apps/Deployment"). */
export function typeOf(kind: Pick<Kind, 'group' | 'kind'>): FieldType {
  return roots[kind.group ? `${kind.group}/${kind.kind}` : kind.kind] ?? plain;
}

/** The type of field `name` of a value of type `t`. */
export function fieldType(t: FieldType | undefined, name: string): FieldType | undefined {
  return t?.fields?.[name] ?? t?.values;
}

export function listKind(t: FieldType | undefined): ListKind {
  return t?.list ?? 'atomic';
}
