/** v1 ConfigMap: validated as the agent validates manifest ConfigMaps; immutable ones keep their data. */
import { configMapErrors } from '../../kubelet-lite/validate.js';
import { invalid } from '../errors.js';
import type { Kind } from '../types.js';
import { age, ageColumn, causes, nameColumn, size } from './common.js';

export const configMapKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'ConfigMap',
  plural: 'configmaps',
  singular: 'configmap',
  shortNames: ['cm'],
  namespaced: true,
  prepare(o, old) {
    if (old?.immutable === true) {
      const same = (k: string) => JSON.stringify(o[k] ?? {}) === JSON.stringify(old[k] ?? {});
      if (!same('data') || !same('binaryData') || o.immutable !== true) {
        throw invalid('ConfigMap', String(o.metadata.name), [{ reason: 'FieldValueForbidden', field: o.immutable !== true ? 'immutable' : 'data', message: 'Forbidden: field is immutable when `immutable` is set' }]);
      }
    }
  },
  validate: (o) => causes(configMapErrors(o)),
  known: { data: 'map', binaryData: 'map', immutable: true },
  columns: [nameColumn, { name: 'Data', type: 'string', description: 'Data contains the configuration data.' }, ageColumn],
  row: (o, now) => [o.metadata.name, size(o.data) + size(o.binaryData), age(o.metadata.creationTimestamp, now)],
};
