/**
 * v1 ServiceAccount: stored and listed (charts make one for their pods, and
 * every namespace has `default`). The node issues no tokens: pods run with
 * the account's name and no credentials mounted (docs/api.md says so).
 */
import type { Cause } from '../errors.js';
import type { Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

function refsCauses(list: unknown, field: string, needName: boolean): Cause[] {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) return [{ reason: 'FieldValueTypeInvalid', field, message: 'Invalid value: must be a list' }];
  const out: Cause[] = [];
  list.forEach((r, i) => {
    if (!isObj(r)) out.push({ reason: 'FieldValueTypeInvalid', field: `${field}[${i}]`, message: 'Invalid value: must be an object' });
    else if (needName && (typeof (r as Obj).name !== 'string' || (r as Obj).name === '')) out.push({ reason: 'FieldValueRequired', field: `${field}[${i}].name`, message: 'Required value' });
  });
  return out;
}

export const serviceAccountKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'ServiceAccount',
  plural: 'serviceaccounts',
  singular: 'serviceaccount',
  shortNames: ['sa'],
  namespaced: true,
  validate(o) {
    const out = metaCauses(o, true);
    out.push(...refsCauses(o.secrets, 'secrets', false), ...refsCauses(o.imagePullSecrets, 'imagePullSecrets', true));
    if (o.automountServiceAccountToken !== undefined && o.automountServiceAccountToken !== null && typeof o.automountServiceAccountToken !== 'boolean') {
      out.push({ reason: 'FieldValueTypeInvalid', field: 'automountServiceAccountToken', message: 'Invalid value: must be a boolean' });
    }
    return out;
  },
  known: { secrets: true, imagePullSecrets: true, automountServiceAccountToken: true },
  columns: [nameColumn, { name: 'Secrets', type: 'string', description: 'Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use.' }, ageColumn],
  row: (o, now) => [o.metadata.name, Array.isArray(o.secrets) ? o.secrets.length : 0, age(o.metadata.creationTimestamp, now)],
};
