/**
 * v1 PersistentVolume (cluster-scoped): defaulted (reclaim policy Retain,
 * volumeMode Filesystem, phase Pending) and validated as the API server
 * does (a capacity, access modes, exactly one volume source, local volumes
 * with node affinity), its source and node affinity immutable; shown with
 * the columns `kubectl get pv` prints. hostPath and local PVs on the
 * node's system directories or its root dir are refused (host-paths.ts):
 * upstream takes them, but here a PV is always on the node itself.
 */
import { persistentHostPathRefusal } from '../../kubelet-lite/host-paths.js';
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn, setDefault } from './common.js';
import { accessModeCauses, addFinalizer, accessModesText, classNameCauses, sameJson, specOf, statusOf, storageCauses, volumeClass, volumeModeCauses } from './volume-common.js';

/** The fields of a PersistentVolumeSource, inline in the spec: a PV has exactly one. */
export const PV_SOURCES = [
  'gcePersistentDisk', 'awsElasticBlockStore', 'hostPath', 'glusterfs', 'nfs', 'rbd', 'iscsi', 'cinder', 'cephfs', 'fc', 'flocker', 'flexVolume',
  'azureFile', 'vsphereVolume', 'quobyte', 'azureDisk', 'photonPersistentDisk', 'portworxVolume', 'scaleIO', 'local', 'storageos', 'csi',
];
export const RECLAIM_POLICIES = ['Delete', 'Recycle', 'Retain'];

const sourceOf = (s: Obj) => PV_SOURCES.filter((k) => s[k] !== undefined && s[k] !== null);

function pathCauses(name: string, source: string, v: unknown, rootDir: string | undefined, requireAbsolute: boolean): Cause[] {
  const field = `spec.${source}.path`;
  const p = isObj(v) ? v.path : undefined;
  if (p === undefined || p === null || p === '') return [{ reason: 'FieldValueRequired', field, message: 'Required value' }];
  if (typeof p !== 'string') return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a string' }];
  if (p.split('/').includes('..')) return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(p)}: must not contain '..'` }];
  if (requireAbsolute && !p.startsWith('/')) return [{ reason: 'FieldValueInvalid', field, message: `Invalid value: ${JSON.stringify(p)}: must be an absolute path` }];
  const why = persistentHostPathRefusal(p.startsWith('/') ? p : `/${p}`, name, rootDir);
  return why ? [{ reason: 'FieldValueForbidden', field, message: `Forbidden: ${JSON.stringify(p)} ${why}` }] : [];
}

function nodeAffinityCauses(a: unknown): Cause[] {
  if (a === undefined || a === null) return [];
  const req = isObj(a) && isObj(a.required) ? a.required : undefined;
  if (!isObj(a) || (a.required !== undefined && !req)) return [{ reason: 'FieldValueTypeInvalid', field: 'spec.nodeAffinity', message: 'Invalid value: must be a volume node affinity' }];
  if (req && (!Array.isArray(req.nodeSelectorTerms) || req.nodeSelectorTerms.length === 0)) {
    return [{ reason: 'FieldValueRequired', field: 'spec.nodeAffinity.required.nodeSelectorTerms', message: 'Required value: must have at least one node selector term' }];
  }
  return [];
}

/**
 * The PV kind, refusing host paths under `rootDir` (the node's root dir)
 * but the provisioner's own `<rootDir>/volumes/<pv>`.
 */
export function persistentVolumeKind(rootDir?: string): Kind {
  return {
    group: '',
    version: 'v1',
    kind: 'PersistentVolume',
    plural: 'persistentvolumes',
    singular: 'persistentvolume',
    shortNames: ['pv'],
    namespaced: false,
    status: true,
    prepare(o, old) {
      if (!isObj(o.spec)) return;
      setDefault(o.spec, 'persistentVolumeReclaimPolicy', 'Retain');
      setDefault(o.spec, 'volumeMode', 'Filesystem');
      if (isObj(o.spec.hostPath)) setDefault(o.spec.hostPath, 'type', '');
      if (!old) {
        o.status = { phase: 'Pending' };
        addFinalizer(o, 'kubernetes.io/pv-protection');
        return;
      }
      const bad: Cause[] = [];
      const s = specOf(o);
      const was = specOf(old);
      const src = (x: Obj) => Object.fromEntries(PV_SOURCES.filter((k) => x[k] !== undefined).map((k) => [k, x[k]]));
      if (!sameJson(src(s), src(was))) bad.push({ reason: 'FieldValueForbidden', field: 'spec.persistentvolumesource', message: 'Forbidden: spec.persistentvolumesource is immutable after creation' });
      if (was.nodeAffinity !== undefined && was.nodeAffinity !== null && !sameJson(was.nodeAffinity, s.nodeAffinity)) {
        bad.push({ reason: 'FieldValueInvalid', field: 'spec.nodeAffinity', message: 'Invalid value: field is immutable' });
      }
      if (bad.length > 0) throw invalid('PersistentVolume', String(o.metadata.name), bad);
    },
    validate(o) {
      const out: Cause[] = metaCauses(o, false);
      if (!isObj(o.spec)) return [...out, { reason: 'FieldValueRequired', field: 'spec', message: 'Required value' }];
      const s = o.spec;
      out.push(...accessModeCauses(s.accessModes, 'spec.accessModes', 'must specify at least 1 access mode'));
      if (!isObj(s.capacity) || Object.keys(s.capacity).length === 0) out.push({ reason: 'FieldValueRequired', field: 'spec.capacity', message: 'Required value' });
      else {
        for (const k of Object.keys(s.capacity)) {
          if (k !== 'storage') out.push({ reason: 'FieldValueNotSupported', field: 'spec.capacity', message: `Unsupported value: ${JSON.stringify(k)}: supported values: "storage"` });
        }
        out.push(...storageCauses(s.capacity.storage, 'spec.capacity[storage]'));
      }
      const policy = s.persistentVolumeReclaimPolicy;
      if (policy !== undefined && !RECLAIM_POLICIES.includes(policy as string)) {
        out.push({ reason: 'FieldValueNotSupported', field: 'spec.persistentVolumeReclaimPolicy', message: `Unsupported value: ${JSON.stringify(policy)}: supported values: "Delete", "Recycle", "Retain"` });
      }
      const sources = sourceOf(s);
      if (sources.length === 0) out.push({ reason: 'FieldValueRequired', field: 'spec', message: 'Required value: must specify a volume type' });
      for (const extra of sources.slice(1)) out.push({ reason: 'FieldValueForbidden', field: `spec.${extra}`, message: 'Forbidden: may not specify more than 1 volume type' });
      const name = String(o.metadata.name ?? '');
      if (sources.includes('hostPath')) {
        out.push(...pathCauses(name, 'hostPath', s.hostPath, rootDir, false));
        if (policy === 'Recycle' && isObj(s.hostPath) && s.hostPath.path === '/') {
          out.push({ reason: 'FieldValueForbidden', field: 'spec.persistentVolumeReclaimPolicy', message: "Forbidden: may not be 'recycle' for a hostPath volume pointing to the root directory" });
        }
      }
      if (sources.includes('local')) {
        out.push(...pathCauses(name, 'local', s.local, rootDir, true));
        if (!isObj(s.nodeAffinity)) out.push({ reason: 'FieldValueRequired', field: 'spec.nodeAffinity', message: 'Required value: Local volume requires node affinity' });
      }
      out.push(...nodeAffinityCauses(s.nodeAffinity));
      out.push(...classNameCauses(s.storageClassName, 'spec.storageClassName'));
      out.push(...volumeModeCauses(s.volumeMode, 'spec.volumeMode'));
      if (s.claimRef !== undefined && s.claimRef !== null && !isObj(s.claimRef)) out.push({ reason: 'FieldValueTypeInvalid', field: 'spec.claimRef', message: 'Invalid value: must be an object reference' });
      return out;
    },
    known: { spec: 'map', status: 'map' },
    fields: { 'spec.storageClassName': (o) => String(specOf(o).storageClassName ?? ''), 'status.phase': (o) => String(statusOf(o).phase ?? '') },
    columns: [
      nameColumn,
      { name: 'Capacity', type: 'string', description: 'capacity is the description of the persistent volume\'s resources and capacity.' },
      { name: 'Access Modes', type: 'string', description: 'accessModes contains all ways the volume can be mounted.' },
      { name: 'Reclaim Policy', type: 'string', description: 'persistentVolumeReclaimPolicy defines what happens to a persistent volume when released from its claim.' },
      { name: 'Status', type: 'string', description: 'phase indicates if a volume is available, bound to a claim, or released by a claim.' },
      { name: 'Claim', type: 'string', description: 'claimRef is part of a bi-directional binding between PersistentVolume and PersistentVolumeClaim.' },
      { name: 'StorageClass', type: 'string', description: 'StorageClass of the pv' },
      { name: 'VolumeAttributesClass', type: 'string', description: 'VolumeAttributesClass of the pv' },
      { name: 'Reason', type: 'string', description: 'reason is a brief CamelCase string that describes any failure and is meant for machine parsing and tidy display in the CLI.' },
      ageColumn,
      { name: 'VolumeMode', type: 'string', priority: 1, description: 'volumeMode defines if a volume is intended to be used with a formatted filesystem or to remain in raw block state.' },
    ],
    row(o, now) {
      const s = specOf(o);
      const st = statusOf(o);
      const ref = isObj(s.claimRef) ? `${String(s.claimRef.namespace ?? '')}/${String(s.claimRef.name ?? '')}` : '';
      return [
        o.metadata.name,
        String((isObj(s.capacity) ? s.capacity.storage : undefined) ?? '0'),
        accessModesText(s.accessModes),
        String(s.persistentVolumeReclaimPolicy ?? ''),
        o.metadata.deletionTimestamp ? 'Terminating' : String(st.phase ?? ''),
        ref,
        volumeClass(o),
        typeof s.volumeAttributesClassName === 'string' && s.volumeAttributesClassName !== '' ? s.volumeAttributesClassName : '<unset>',
        String(st.reason ?? ''),
        age(o.metadata.creationTimestamp, now),
        typeof s.volumeMode === 'string' ? s.volumeMode : '<unset>',
      ];
    },
  };
}
