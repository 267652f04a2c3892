/**
 * v1 PersistentVolumeClaim: defaulted (volumeMode Filesystem, phase
 * Pending) and validated as the API server does, its spec immutable once
 * created but for the volume it is bound to (set once), a class given to a
 * claim that had none, and a storage request that grows while bound; shown
 * with the columns `kubectl get pvc` prints. The class a claim without one
 * gets is the DefaultStorageClass admission's (`admitCreate`).
 */
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn, setDefault } from './common.js';
import {
  addFinalizer,
  BETA_CLASS_ANNOTATION,
  BETA_DEFAULT_CLASS_ANNOTATION,
  DEFAULT_CLASS_ANNOTATION,
  accessModeCauses,
  accessModesText,
  claimClass,
  classNameCauses,
  sameJson,
  specOf,
  statusOf,
  storageBytes,
  storageCauses,
  volumeModeCauses,
} from './volume-common.js';

const requests = (s: Obj): Obj => (isObj(s.resources) && isObj(s.resources.requests) ? s.resources.requests : {});

/** The spec a claim was created with, as it may not change (PersistentVolumeClaim update validation). */
function unchangeable(o: ApiObject, old: ApiObject): Cause[] {
  const was = structuredClone(specOf(old));
  const now = structuredClone(specOf(o));
  // The PV controller binds a claim by naming its volume, once.
  if (!was.volumeName) was.volumeName = now.volumeName;
  // A claim with no class may be given one (the default, retroactively), once.
  if ((was.storageClassName === undefined || was.storageClassName === null) && old.metadata.annotations?.[BETA_CLASS_ANNOTATION] === undefined) was.storageClassName = now.storageClassName;
  // A bound claim may ask for more (expansion); the check below keeps it from asking for less.
  if (statusOf(o).phase === 'Bound' && isObj(now.resources) && isObj(now.resources.requests) && isObj(was.resources)) {
    now.resources.requests.storage = requests(was).storage;
  }
  const out: Cause[] = [];
  if (!sameJson(was, now)) out.push({ reason: 'FieldValueForbidden', field: 'spec', message: 'Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims' });
  const before = storageBytes(requests(specOf(old)).storage);
  const after = storageBytes(requests(specOf(o)).storage);
  if (before !== undefined && after !== undefined && after < before) {
    out.push({ reason: 'FieldValueForbidden', field: 'spec.resources.requests.storage', message: 'Forbidden: field can not be less than previous value' });
  }
  return out;
}

/** A default class's name: the newest of those annotated default, as the DefaultStorageClass admission picks. */
export function defaultClassName(classes: Iterable<ApiObject>): string | undefined {
  let best: ApiObject | undefined;
  for (const c of classes) {
    const a = c.metadata.annotations ?? {};
    if (a[DEFAULT_CLASS_ANNOTATION] !== 'true' && a[BETA_DEFAULT_CLASS_ANNOTATION] !== 'true') continue;
    if (c.metadata.deletionTimestamp) continue;
    const t = String(c.metadata.creationTimestamp ?? '');
    const bt = String(best?.metadata.creationTimestamp ?? '');
    if (!best || t > bt || (t === bt && String(c.metadata.name) < String(best.metadata.name))) best = c;
  }
  return best?.metadata.name;
}

/** The annotations the binder and provisioner write on a claim. */
const BINDING_ANNOTATION = /^(pv\.kubernetes\.io|volume\.kubernetes\.io|volume\.beta\.kubernetes\.io)\//;

/** What the node's storage controller sets on a claim a manifest file defines: its class when the file names none, its volume, the binding annotations. */
function claimNodeSet(from: ApiObject, into: ApiObject): void {
  if (!isObj(from.spec) || !isObj(into.spec)) return;
  for (const f of ['storageClassName', 'volumeName'] as const) {
    if ((into.spec[f] === undefined || into.spec[f] === null) && typeof from.spec[f] === 'string') into.spec[f] = from.spec[f];
  }
  for (const [k, v] of Object.entries(from.metadata.annotations ?? {})) {
    if (BINDING_ANNOTATION.test(k) && into.metadata.annotations?.[k] === undefined) into.metadata.annotations = { ...into.metadata.annotations, [k]: v };
  }
}

export const persistentVolumeClaimKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'PersistentVolumeClaim',
  plural: 'persistentvolumeclaims',
  singular: 'persistentvolumeclaim',
  shortNames: ['pvc'],
  namespaced: true,
  status: true,
  nodeSet: claimNodeSet,
  prepare(o, old) {
    if (!isObj(o.spec)) return;
    setDefault(o.spec, 'volumeMode', 'Filesystem');
    if (!old) {
      o.status = { phase: 'Pending' };
      // The StorageObjectInUseProtection admission: the claim outlives the pods using it (the node's storage controller lifts it).
      addFinalizer(o, 'kubernetes.io/pvc-protection');
      return;
    }
    const bad = unchangeable(o, old);
    if (bad.length > 0) throw invalid('PersistentVolumeClaim', String(o.metadata.name), bad);
  },
  admitCreate(o, others) {
    // DefaultStorageClass admission: a claim that names no class (not even "") gets the default one.
    if (!isObj(o.spec) || o.metadata.annotations?.[BETA_CLASS_ANNOTATION] !== undefined) return;
    if (o.spec.storageClassName !== undefined && o.spec.storageClassName !== null) return;
    const name = defaultClassName(others('storageclasses.storage.k8s.io'));
    if (name) o.spec.storageClassName = name;
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    if (!isObj(o.spec)) return [...out, { reason: 'FieldValueRequired', field: 'spec', message: 'Required value' }];
    const s = o.spec;
    out.push(...accessModeCauses(s.accessModes, 'spec.accessModes', 'at least 1 access mode is required'));
    out.push(...storageCauses(requests(s).storage, 'spec.resources[storage]'));
    out.push(...classNameCauses(s.storageClassName, 'spec.storageClassName'));
    out.push(...volumeModeCauses(s.volumeMode, 'spec.volumeMode'));
    // A volume's name, never a path: the node looks the PV up by it.
    if (s.volumeName !== undefined && s.volumeName !== null && s.volumeName !== '') out.push(...classNameCauses(s.volumeName, 'spec.volumeName'));
    return out;
  },
  known: {
    spec: {
      accessModes: true,
      selector: 'map',
      resources: { requests: 'map', limits: 'map' },
      volumeName: true,
      storageClassName: true,
      volumeMode: true,
      dataSource: 'map',
      dataSourceRef: 'map',
      volumeAttributesClassName: true,
    },
    status: 'map',
  },
  fields: { 'spec.volumeName': (o) => String(specOf(o).volumeName ?? ''), 'status.phase': (o) => String(statusOf(o).phase ?? '') },
  columns: [
    nameColumn,
    { name: 'Status', type: 'string', description: 'phase represents the current phase of PersistentVolumeClaim.' },
    { name: 'Volume', type: 'string', description: 'volumeName is the binding reference to the PersistentVolume backing this claim.' },
    { name: 'Capacity', type: 'string', description: 'capacity represents the actual resources of the underlying volume.' },
    { name: 'Access Modes', type: 'string', description: 'accessModes contains the actual access modes the volume backing the PVC has.' },
    { name: 'StorageClass', type: 'string', description: 'StorageClass of the pvc' },
    { name: 'VolumeAttributesClass', type: 'string', description: 'VolumeAttributesClass of the pvc' },
    ageColumn,
    { name: 'VolumeMode', type: 'string', priority: 1, description: 'volumeMode defines what type of volume is required by the claim.' },
  ],
  row(o, now) {
    const s = specOf(o);
    const st = statusOf(o);
    const bound = typeof s.volumeName === 'string' && s.volumeName !== '';
    const cap = isObj(st.capacity) ? st.capacity.storage : undefined;
    return [
      o.metadata.name,
      o.metadata.deletionTimestamp ? 'Terminating' : String(st.phase ?? ''),
      bound ? s.volumeName : '',
      bound ? String(cap ?? '0') : '',
      bound ? accessModesText(st.accessModes) : '',
      claimClass(o),
      typeof s.volumeAttributesClassName === 'string' && s.volumeAttributesClassName !== '' ? s.volumeAttributesClassName : '<unset>',
      age(o.metadata.creationTimestamp, now),
      typeof s.volumeMode === 'string' ? s.volumeMode : '<unset>',
    ];
  },
};
