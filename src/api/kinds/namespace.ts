/** v1 Namespace: Active until deleted, then Terminating while the store empties it. */
import { dnsLabelError } from '../../kubelet-lite/validate.js';
import type { Cause } from '../errors.js';
import type { Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

export const namespaceKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Namespace',
  plural: 'namespaces',
  singular: 'namespace',
  shortNames: ['ns'],
  namespaced: false,
  spec: (o) => o.spec,
  prepare(o, old) {
    if (old) {
      // Status and spec.finalizers are the store's (the status and finalize subresources), not a client's.
      o.spec = old.spec;
      o.status = old.status;
    } else {
      o.spec = { finalizers: ['kubernetes'] };
      o.status = { phase: 'Active' };
    }
    o.metadata.labels = { ...(isObj(o.metadata.labels) ? o.metadata.labels : {}), 'kubernetes.io/metadata.name': String(o.metadata.name ?? '') };
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, false);
    const name = o.metadata.name;
    if (typeof name === 'string' && name !== '') {
      const why = dnsLabelError(name);
      if (why && !out.some((c) => c.field === 'metadata.name')) out.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(name)}: ${why}` });
    }
    return out;
  },
  fields: { 'status.phase': (o) => (isObj(o.status) ? String((o.status as Obj).phase ?? '') : '') },
  known: { spec: { finalizers: true }, status: { phase: true, conditions: true } },
  columns: [nameColumn, { name: 'Status', type: 'string', description: 'The status of the namespace' }, ageColumn],
  row: (o, now) => [o.metadata.name, isObj(o.status) ? (o.status as Obj).phase ?? '' : '', age(o.metadata.creationTimestamp, now)],
};
