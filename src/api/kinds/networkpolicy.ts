/**
 * networking.k8s.io/v1 NetworkPolicy: defaulted and validated as the API
 * server does (policyTypes from the rules when absent, TCP for a port
 * without a protocol; peers with exactly one of ipBlock or selectors, an
 * ipBlock's exceptions strictly inside its CIDR, ports by number or IANA
 * name, endPort only after a numeric port and not below it), shown with
 * `kubectl get netpol`'s columns. The node enforces them (src/netpol/).
 */
import type { Cause } from '../errors.js';
import { portNameError } from '../../kubelet-lite/validate.js';
import { normalizeCidr, strictSubset } from '../../netpol/cidr.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';
import { labelSelectorCauses } from './selector-causes.js';
import { selectorString } from './workload-rows.js';

const spec = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
const show = (v: unknown) => JSON.stringify(v);
const invalid = (field: string, v: unknown, why: string): Cause => ({ reason: 'FieldValueInvalid', field, message: `Invalid value: ${show(v)}: ${why}` });
const typeInvalid = (field: string, what: string): Cause => ({ reason: 'FieldValueTypeInvalid', field, message: `Invalid value: must be ${what}` });

const isPortNumber = (n: number) => Number.isInteger(n) && n >= 1 && n <= 65535;

function portCauses(p: unknown, field: string): Cause[] {
  if (!isObj(p)) return [typeInvalid(field, 'an object')];
  const out: Cause[] = [];
  if (p.protocol !== undefined && p.protocol !== null && !['TCP', 'UDP', 'SCTP'].includes(p.protocol as string)) {
    out.push({ reason: 'FieldValueNotSupported', field: `${field}.protocol`, message: `Unsupported value: ${show(p.protocol)}: supported values: "TCP", "UDP", "SCTP"` });
  }
  const hasEnd = p.endPort !== undefined && p.endPort !== null;
  if (hasEnd && (typeof p.endPort !== 'number' || !Number.isInteger(p.endPort))) out.push(typeInvalid(`${field}.endPort`, 'an integer'));
  if (p.port === undefined || p.port === null) {
    if (hasEnd) out.push(invalid(`${field}.endPort`, p.endPort, 'may not be specified when `port` is not specified'));
  } else if (typeof p.port === 'number') {
    if (!isPortNumber(p.port)) out.push(invalid(`${field}.port`, p.port, 'must be between 1 and 65535, inclusive'));
    if (hasEnd && typeof p.endPort === 'number') {
      if (p.endPort < p.port) out.push(invalid(`${field}.endPort`, p.port, 'must be greater than or equal to `port`'));
      if (!isPortNumber(p.endPort)) out.push(invalid(`${field}.endPort`, p.endPort, 'must be between 1 and 65535, inclusive'));
    }
  } else if (typeof p.port === 'string') {
    if (hasEnd) out.push(invalid(`${field}.endPort`, p.endPort, 'may not be specified when `port` is non-numeric'));
    const why = portNameError(p.port);
    if (why) out.push(invalid(`${field}.port`, p.port, why));
  } else out.push(typeInvalid(`${field}.port`, 'an integer or a port name'));
  return out;
}

function ipBlockCauses(b: unknown, field: string): Cause[] {
  if (!isObj(b)) return [typeInvalid(field, 'an object')];
  if (typeof b.cidr !== 'string' || b.cidr === '') return [{ reason: 'FieldValueRequired', field: `${field}.cidr`, message: 'Required value' }];
  if (!normalizeCidr(b.cidr)) return [invalid(`${field}.cidr`, b.cidr, 'not a valid CIDR')];
  if (b.except === undefined || b.except === null) return [];
  if (!Array.isArray(b.except)) return [typeInvalid(`${field}.except`, 'a list of CIDRs')];
  for (const [i, e] of b.except.entries()) {
    if (typeof e !== 'string' || !normalizeCidr(e)) return [invalid(`${field}.except[${i}]`, e, 'not a valid CIDR')];
    if (!strictSubset(b.cidr, e)) return [invalid(`${field}.except[${i}]`, e, 'must be a strict subset of `cidr`')];
  }
  return [];
}

function peerCauses(p: unknown, field: string): Cause[] {
  if (!isObj(p)) return [typeInvalid(field, 'an object')];
  const out: Cause[] = [];
  const given = (['podSelector', 'namespaceSelector', 'ipBlock'] as const).filter((k) => p[k] !== undefined && p[k] !== null);
  if (given.includes('podSelector')) out.push(...labelSelectorCauses(p.podSelector, `${field}.podSelector`));
  if (given.includes('namespaceSelector')) out.push(...labelSelectorCauses(p.namespaceSelector, `${field}.namespaceSelector`));
  if (given.includes('ipBlock')) out.push(...ipBlockCauses(p.ipBlock, `${field}.ipBlock`));
  if (given.length === 0) out.push({ reason: 'FieldValueRequired', field, message: 'Required value: must specify a peer' });
  else if (given.length > 1 && given.includes('ipBlock')) out.push({ reason: 'FieldValueForbidden', field, message: 'Forbidden: may not specify both ipBlock and another peer' });
  return out;
}

function rulesCauses(list: unknown, field: string, peersField: 'from' | 'to'): Cause[] {
  if (list === undefined || list === null) return [];
  if (!Array.isArray(list)) return [typeInvalid(field, 'a list')];
  const out: Cause[] = [];
  list.forEach((r, i) => {
    const f = `${field}[${i}]`;
    if (!isObj(r)) return void out.push(typeInvalid(f, 'an object'));
    for (const [key, check] of [['ports', portCauses], [peersField, peerCauses]] as const) {
      const items = r[key];
      if (items === undefined || items === null) continue;
      if (!Array.isArray(items)) out.push(typeInvalid(`${f}.${key}`, 'a list'));
      else items.forEach((x, j) => out.push(...check(x, `${f}.${key}[${j}]`)));
    }
  });
  return out;
}

/** kubectl's POD-SELECTOR: the selector as text, `<none>` when it selects every pod. */
function podSelectorColumn(o: ApiObject): string {
  const sel = spec(o).podSelector;
  if (!isObj(sel)) return '<none>';
  const text = selectorString(sel);
  return text === '' ? '<none>' : text;
}

export const networkPolicyKind: Kind = {
  group: 'networking.k8s.io',
  version: 'v1',
  kind: 'NetworkPolicy',
  plural: 'networkpolicies',
  singular: 'networkpolicy',
  shortNames: ['netpol'],
  namespaced: true,
  spec: (o) => o.spec,
  prepare(o) {
    if (!isObj(o.spec)) o.spec = {};
    const s = o.spec as Obj;
    if (s.podSelector === undefined || s.podSelector === null) s.podSelector = {};
    // The API server's defaults: TCP for a port without a protocol; Ingress always and Egress with egress rules.
    for (const key of ['ingress', 'egress'] as const) {
      const rules = s[key];
      if (!Array.isArray(rules)) continue;
      for (const r of rules) {
        if (!isObj(r) || !Array.isArray(r.ports)) continue;
        for (const p of r.ports) if (isObj(p) && (p.protocol === undefined || p.protocol === null)) p.protocol = 'TCP';
      }
    }
    if (!Array.isArray(s.policyTypes) || s.policyTypes.length === 0) s.policyTypes = Array.isArray(s.egress) && s.egress.length > 0 ? ['Ingress', 'Egress'] : ['Ingress'];
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    if (o.spec !== undefined && !isObj(o.spec)) return [...out, typeInvalid('spec', 'an object')];
    const s = spec(o);
    out.push(...labelSelectorCauses(s.podSelector ?? {}, 'spec.podSelector'));
    out.push(...rulesCauses(s.ingress, 'spec.ingress', 'from'), ...rulesCauses(s.egress, 'spec.egress', 'to'));
    const types = s.policyTypes;
    if (types !== undefined && types !== null) {
      if (!Array.isArray(types)) out.push(typeInvalid('spec.policyTypes', 'a list'));
      else if (types.length > 2) out.push(invalid('spec.policyTypes', types, 'may not specify more than two policyTypes'));
      else {
        types.forEach((t, i) => {
          if (t !== 'Ingress' && t !== 'Egress') out.push({ reason: 'FieldValueNotSupported', field: `spec.policyTypes[${i}]`, message: `Unsupported value: ${show(t)}: supported values: "Ingress", "Egress"` });
        });
      }
    }
    return out;
  },
  known: {
    spec: {
      podSelector: 'map',
      policyTypes: true,
      ingress: { list: { from: { list: { podSelector: 'map', namespaceSelector: 'map', ipBlock: { cidr: true, except: true } } }, ports: { list: { protocol: true, port: true, endPort: true } } } },
      egress: { list: { to: { list: { podSelector: 'map', namespaceSelector: 'map', ipBlock: { cidr: true, except: true } } }, ports: { list: { protocol: true, port: true, endPort: true } } } },
    },
  },
  columns: [
    nameColumn,
    { name: 'Pod-Selector', type: 'string', description: 'podSelector selects the pods to which this NetworkPolicy object applies.' },
    ageColumn,
  ],
  row: (o, now) => [o.metadata.name, podSelectorColumn(o), age(o.metadata.creationTimestamp, now)],
};
