/**
 * storage.k8s.io/v1 StorageClass (cluster-scoped): defaulted (reclaim
 * Delete, binding Immediate) and validated as the API server does, its
 * provisioner, parameters, reclaim policy and binding mode fixed once
 * created; shown with the columns `kubectl get sc` prints, the default
 * class named "(default)".
 */
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn, setDefault } from './common.js';
import { BETA_DEFAULT_CLASS_ANNOTATION, DEFAULT_CLASS_ANNOTATION, sameJson } from './volume-common.js';

export const BINDING_MODES = ['Immediate', 'WaitForFirstConsumer'];
const MAX_PARAMETERS = 512;
const MAX_PARAMETERS_BYTES = 256 * 1024;
/** A qualified name as IsQualifiedName takes it: an optional DNS-subdomain prefix and a name of 63 at most. */
const QUALIFIED = /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;

export const isDefaultClass = (o: ApiObject) => o.metadata.annotations?.[DEFAULT_CLASS_ANNOTATION] === 'true' || o.metadata.annotations?.[BETA_DEFAULT_CLASS_ANNOTATION] === 'true';

export const storageClassKind: Kind = {
  group: 'storage.k8s.io',
  version: 'v1',
  kind: 'StorageClass',
  plural: 'storageclasses',
  singular: 'storageclass',
  shortNames: ['sc'],
  namespaced: false,
  prepare(o, old) {
    setDefault(o, 'reclaimPolicy', 'Delete');
    setDefault(o, 'volumeBindingMode', 'Immediate');
    if (!old) return;
    const bad: Cause[] = [];
    if (!sameJson(o.parameters ?? {}, old.parameters ?? {})) bad.push({ reason: 'FieldValueForbidden', field: 'parameters', message: 'Forbidden: updates to parameters are forbidden.' });
    if (o.provisioner !== old.provisioner) bad.push({ reason: 'FieldValueForbidden', field: 'provisioner', message: 'Forbidden: updates to provisioner are forbidden.' });
    if (o.reclaimPolicy !== old.reclaimPolicy) bad.push({ reason: 'FieldValueForbidden', field: 'reclaimPolicy', message: 'Forbidden: updates to reclaimPolicy are forbidden.' });
    if (o.volumeBindingMode !== old.volumeBindingMode) bad.push({ reason: 'FieldValueInvalid', field: 'volumeBindingMode', message: `Invalid value: ${JSON.stringify(o.volumeBindingMode)}: field is immutable` });
    if (bad.length > 0) throw invalid('StorageClass', String(o.metadata.name), bad, 'storage.k8s.io');
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, false);
    const p = o.provisioner;
    if (p === undefined || p === null || p === '') out.push({ reason: 'FieldValueRequired', field: 'provisioner', message: 'Required value' });
    else if (typeof p !== 'string' || !QUALIFIED.test(p.toLowerCase())) {
      out.push({ reason: 'FieldValueInvalid', field: 'provisioner', message: `Invalid value: ${JSON.stringify(p)}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character` });
    }
    if (o.parameters !== undefined && o.parameters !== null) {
      if (!isObj(o.parameters)) out.push({ reason: 'FieldValueTypeInvalid', field: 'parameters', message: 'Invalid value: must be a map of strings' });
      else {
        const entries = Object.entries(o.parameters);
        let bytes = 0;
        for (const [k, v] of entries) {
          if (typeof v !== 'string') out.push({ reason: 'FieldValueTypeInvalid', field: `parameters[${k}]`, message: 'Invalid value: must be a string' });
          bytes += k.length + String(v).length;
        }
        if (entries.length > MAX_PARAMETERS) out.push({ reason: 'FieldValueTooLong', field: 'parameters', message: `Too long: must have at most ${MAX_PARAMETERS} items` });
        if (bytes > MAX_PARAMETERS_BYTES) out.push({ reason: 'FieldValueTooLong', field: 'parameters', message: `Too long: must have at most ${MAX_PARAMETERS_BYTES} bytes` });
      }
    }
    if (!['Delete', 'Retain'].includes(o.reclaimPolicy as string)) {
      out.push({ reason: 'FieldValueNotSupported', field: 'reclaimPolicy', message: `Unsupported value: ${JSON.stringify(o.reclaimPolicy)}: supported values: "Delete", "Retain"` });
    }
    if (!BINDING_MODES.includes(o.volumeBindingMode as string)) {
      out.push({ reason: 'FieldValueNotSupported', field: 'volumeBindingMode', message: `Unsupported value: ${JSON.stringify(o.volumeBindingMode)}: supported values: "Immediate", "WaitForFirstConsumer"` });
    }
    if (o.allowVolumeExpansion !== undefined && o.allowVolumeExpansion !== null && typeof o.allowVolumeExpansion !== 'boolean') {
      out.push({ reason: 'FieldValueTypeInvalid', field: 'allowVolumeExpansion', message: 'Invalid value: must be a boolean' });
    }
    return out;
  },
  known: { provisioner: true, parameters: 'map', reclaimPolicy: true, mountOptions: true, allowVolumeExpansion: true, volumeBindingMode: true, allowedTopologies: { list: 'map' } },
  columns: [
    nameColumn,
    { name: 'Provisioner', type: 'string', description: 'Indicates the type of the provisioner.' },
    { name: 'ReclaimPolicy', type: 'string', description: 'Dynamically provisioned PersistentVolumes of this storage class are created with this reclaimPolicy. Defaults to Delete.' },
    { name: 'VolumeBindingMode', type: 'string', description: 'VolumeBindingMode indicates how PersistentVolumeClaims should be provisioned and bound. When unset, VolumeBindingImmediate is used.' },
    { name: 'AllowVolumeExpansion', type: 'string', description: 'AllowVolumeExpansion shows whether the storage class allow volume expand.' },
    ageColumn,
  ],
  row: (o, now) => [
    isDefaultClass(o) ? `${o.metadata.name} (default)` : o.metadata.name,
    String(o.provisioner ?? ''),
    String(o.reclaimPolicy ?? 'Delete'),
    String(o.volumeBindingMode ?? 'Immediate'),
    o.allowVolumeExpansion === true,
    age(o.metadata.creationTimestamp, now),
  ],
};
