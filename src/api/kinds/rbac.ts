/**
 * rbac.authorization.k8s.io/v1 Role, ClusterRole, RoleBinding and
 * ClusterRoleBinding: stored, validated and shown as the API server does,
 * and not enforced. The node's API has one user, in system:masters, whom a
 * cluster's RBAC allows everything too, and pods get no API credentials; so
 * the charts and manifests that carry RBAC apply whole, and nothing anyone
 * can do here changes. A ClusterRole's aggregationRule is kept, not acted on.
 */
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind, Obj, TableColumn } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';
import { labelSelectorCauses } from './selector-causes.js';

const GROUP = 'rbac.authorization.k8s.io';

/** An RBAC object's name is a path segment (ValidatePathSegmentName): "system:controller:x" is one. */
function nameCauses(o: ApiObject, namespaced: boolean): Cause[] {
  const name = o.metadata.name;
  // The rest of the metadata as every kind checks it; the name by the path-segment rule below.
  const out = metaCauses({ ...o, metadata: { ...o.metadata, name: typeof name === 'string' && name !== '' ? 'x' : name } }, namespaced);
  if (typeof name !== 'string' || name === '') return out;
  if (name === '.' || name === '..') out.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(name)}: may not be '${name}'` });
  for (const bad of ['/', '%']) if (name.includes(bad)) out.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(name)}: may not contain '${bad}'` });
  return out;
}

/** What every RBAC kind says of itself: the group, v1, its names, its scope. */
const identity = (kind: string, plural: string, namespaced: boolean) => ({ group: GROUP, version: 'v1', kind, plural, singular: kind.toLowerCase(), shortNames: [], namespaced });

const strings = (v: unknown): v is string[] => Array.isArray(v) && v.every((x) => typeof x === 'string');
const count = (v: unknown) => (Array.isArray(v) ? v.length : 0);

function ruleCauses(rules: unknown, namespaced: boolean): Cause[] {
  if (rules === undefined || rules === null) return [];
  if (!Array.isArray(rules)) return [{ reason: 'FieldValueTypeInvalid', field: 'rules', message: 'Invalid value: must be a list' }];
  const out: Cause[] = [];
  rules.forEach((r, i) => {
    const f = `rules[${i}]`;
    if (!isObj(r)) return void out.push({ reason: 'FieldValueTypeInvalid', field: f, message: 'Invalid value: must be an object' });
    for (const k of ['verbs', 'apiGroups', 'resources', 'resourceNames', 'nonResourceURLs']) {
      if (r[k] !== undefined && r[k] !== null && !strings(r[k])) out.push({ reason: 'FieldValueTypeInvalid', field: `${f}.${k}`, message: 'Invalid value: must be a list of strings' });
    }
    if (count(r.verbs) === 0) out.push({ reason: 'FieldValueRequired', field: `${f}.verbs`, message: 'Required value: verbs must contain at least one value' });
    if (count(r.nonResourceURLs) > 0) {
      if (namespaced) out.push({ reason: 'FieldValueInvalid', field: `${f}.nonResourceURLs`, message: `Invalid value: ${JSON.stringify(r.nonResourceURLs)}: namespaced rules cannot apply to non-resource URLs` });
      if (count(r.apiGroups) > 0 || count(r.resources) > 0 || count(r.resourceNames) > 0) {
        out.push({ reason: 'FieldValueInvalid', field: `${f}.nonResourceURLs`, message: `Invalid value: ${JSON.stringify(r.nonResourceURLs)}: rules cannot apply to both regular resources and non-resource URLs` });
      }
      return;
    }
    if (count(r.apiGroups) === 0) out.push({ reason: 'FieldValueRequired', field: `${f}.apiGroups`, message: 'Required value: resource rules must supply at least one api group' });
    if (count(r.resources) === 0) out.push({ reason: 'FieldValueRequired', field: `${f}.resources`, message: 'Required value: resource rules must supply at least one resource' });
  });
  return out;
}

function makeRoleKind(kind: 'Role' | 'ClusterRole', plural: string, namespaced: boolean): Kind {
  return {
    ...identity(kind, plural, namespaced),
    validate(o) {
      const out = [...nameCauses(o, namespaced), ...ruleCauses(o.rules, namespaced)];
      if (!namespaced && o.aggregationRule !== undefined && o.aggregationRule !== null) {
        const sel = isObj(o.aggregationRule) ? o.aggregationRule.clusterRoleSelectors : undefined;
        if (!Array.isArray(sel) || sel.length === 0) out.push({ reason: 'FieldValueRequired', field: 'aggregationRule.clusterRoleSelectors', message: 'Required value' });
        else sel.forEach((x, i) => out.push(...labelSelectorCauses(x, `aggregationRule.clusterRoleSelectors[${i}]`)));
      }
      return out;
    },
    known: namespaced ? { rules: true } : { rules: true, aggregationRule: true },
    columns: [nameColumn, { name: 'Created At', type: 'date' }],
    row: (o) => [o.metadata.name, o.metadata.creationTimestamp],
  };
}

function subjectCauses(subjects: unknown, cluster: boolean): Cause[] {
  if (subjects === undefined || subjects === null) return [];
  if (!Array.isArray(subjects)) return [{ reason: 'FieldValueTypeInvalid', field: 'subjects', message: 'Invalid value: must be a list' }];
  const out: Cause[] = [];
  subjects.forEach((s, i) => {
    const f = `subjects[${i}]`;
    if (!isObj(s)) return void out.push({ reason: 'FieldValueTypeInvalid', field: f, message: 'Invalid value: must be an object' });
    if (typeof s.name !== 'string' || s.name === '') out.push({ reason: 'FieldValueRequired', field: `${f}.name`, message: 'Required value' });
    const group = s.apiGroup ?? '';
    switch (s.kind) {
      case 'ServiceAccount':
        if (group !== '') out.push({ reason: 'FieldValueNotSupported', field: `${f}.apiGroup`, message: `Unsupported value: ${JSON.stringify(group)}: supported values: ""` });
        if (cluster && (typeof s.namespace !== 'string' || s.namespace === '')) out.push({ reason: 'FieldValueRequired', field: `${f}.namespace`, message: 'Required value' });
        break;
      case 'User':
      case 'Group':
        if (group !== GROUP) out.push({ reason: 'FieldValueNotSupported', field: `${f}.apiGroup`, message: `Unsupported value: ${JSON.stringify(group)}: supported values: "${GROUP}"` });
        break;
      default:
        out.push({ reason: 'FieldValueNotSupported', field: `${f}.kind`, message: `Unsupported value: ${JSON.stringify(s.kind ?? '')}: supported values: "ServiceAccount", "User", "Group"` });
    }
  });
  return out;
}

const roleRef = (o: ApiObject): Obj => (isObj(o.roleRef) ? o.roleRef : {});
const subjectNames = (o: ApiObject, kind: string) =>
  (Array.isArray(o.subjects) ? o.subjects : [])
    .filter((s): s is Obj => isObj(s) && s.kind === kind)
    .map((s) => (kind === 'ServiceAccount' ? `${String(s.namespace ?? '')}/${String(s.name)}` : String(s.name)))
    .join(', ');

function makeBindingKind(kind: 'RoleBinding' | 'ClusterRoleBinding', plural: string, namespaced: boolean): Kind {
  const roleKinds = namespaced ? ['Role', 'ClusterRole'] : ['ClusterRole'];
  const wide = (name: string, description: string): TableColumn => ({ name, type: 'string', priority: 1, description });
  return {
    ...identity(kind, plural, namespaced),
    prepare(o, old) {
      if (!old) return;
      // The role a binding grants is fixed: a new role is a new binding.
      if (JSON.stringify(roleRef(o)) !== JSON.stringify(roleRef(old))) {
        throw invalid(kind, String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'roleRef', message: `Invalid value: ${JSON.stringify(roleRef(o))}: cannot change roleRef` }], GROUP);
      }
    },
    validate(o) {
      const out = nameCauses(o, namespaced);
      const ref = roleRef(o);
      if (!isObj(o.roleRef)) out.push({ reason: 'FieldValueRequired', field: 'roleRef', message: 'Required value' });
      else {
        if (ref.apiGroup !== GROUP) out.push({ reason: 'FieldValueNotSupported', field: 'roleRef.apiGroup', message: `Unsupported value: ${JSON.stringify(ref.apiGroup ?? '')}: supported values: "${GROUP}"` });
        if (!roleKinds.includes(String(ref.kind))) out.push({ reason: 'FieldValueNotSupported', field: 'roleRef.kind', message: `Unsupported value: ${JSON.stringify(ref.kind ?? '')}: supported values: ${roleKinds.map((k) => `"${k}"`).join(', ')}` });
        if (typeof ref.name !== 'string' || ref.name === '') out.push({ reason: 'FieldValueRequired', field: 'roleRef.name', message: 'Required value' });
        else if (ref.name.includes('/') || ref.name.includes('%') || ref.name === '.' || ref.name === '..') out.push({ reason: 'FieldValueInvalid', field: 'roleRef.name', message: `Invalid value: ${JSON.stringify(ref.name)}: not a valid path segment name` });
      }
      out.push(...subjectCauses(o.subjects, !namespaced));
      return out;
    },
    known: { roleRef: true, subjects: true },
    columns: [
      nameColumn,
      { name: 'Role', type: 'string', description: 'RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace.' },
      ageColumn,
      wide('Users', 'Users in the binding'),
      wide('Groups', 'Groups in the binding'),
      wide('ServiceAccounts', 'ServiceAccounts in the binding'),
    ],
    row: (o, now) => [o.metadata.name, `${String(roleRef(o).kind ?? '')}/${String(roleRef(o).name ?? '')}`, age(o.metadata.creationTimestamp, now), subjectNames(o, 'User'), subjectNames(o, 'Group'), subjectNames(o, 'ServiceAccount')],
  };
}

export const roleKind = makeRoleKind('Role', 'roles', true);
export const clusterRoleKind = makeRoleKind('ClusterRole', 'clusterroles', false);
export const roleBindingKind = makeBindingKind('RoleBinding', 'rolebindings', true);
export const clusterRoleBindingKind = makeBindingKind('ClusterRoleBinding', 'clusterrolebindings', false);
