/** v1 Secret: stringData folded into data (base64) on every write, type Opaque by default and immutable. */
import { secretErrors } from '../../kubelet-lite/validate.js';
import { invalid } from '../errors.js';
import type { Kind, Obj } from '../types.js';
import { age, ageColumn, causes, isObj, nameColumn, size } from './common.js';

export const secretKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Secret',
  plural: 'secrets',
  singular: 'secret',
  shortNames: [],
  namespaced: true,
  prepare(o, old) {
    if (isObj(o.stringData)) {
      const data: Obj = isObj(o.data) ? { ...o.data } : {};
      for (const [k, v] of Object.entries(o.stringData)) if (typeof v === 'string') data[k] = Buffer.from(v, 'utf8').toString('base64');
      o.data = data;
      delete o.stringData;
    }
    if (o.type === undefined || o.type === '') o.type = 'Opaque';
    if (old && old.type !== o.type) {
      throw invalid('Secret', String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'type', message: `Invalid value: ${JSON.stringify(o.type)}: field is immutable` }]);
    }
    if (old?.immutable === true && (JSON.stringify(o.data ?? {}) !== JSON.stringify(old.data ?? {}) || o.immutable !== true)) {
      throw invalid('Secret', String(o.metadata.name), [{ reason: 'FieldValueForbidden', field: 'data', message: 'Forbidden: field is immutable when `immutable` is set' }]);
    }
  },
  validate: (o) => causes(secretErrors(o)),
  fields: { type: (o) => String(o.type ?? '') },
  known: { data: 'map', stringData: 'map', type: true, immutable: true },
  columns: [nameColumn, { name: 'Type', type: 'string', description: 'Used to facilitate programmatic handling of secret data.' }, { name: 'Data', type: 'string', description: 'Data contains the secret data.' }, ageColumn],
  row: (o, now) => [o.metadata.name, o.type ?? '', size(o.data), age(o.metadata.creationTimestamp, now)],
};
