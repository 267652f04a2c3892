/**
 * Where a Service's traffic goes, in both of the API's shapes:
 * discovery.k8s.io/v1 EndpointSlice (what kube-proxy and newer kubectls
 * read) and the core v1 Endpoints (what kubectl up to 1.27's `describe
 * service` reads). The node's endpoint-slice controller writes both; a
 * Service without a selector keeps what its user wrote. Validated for the
 * shape the proxy reads, with kubectl's columns.
 */
import type { Cause } from '../errors.js';
import { invalid } from '../errors.js';
import type { ApiObject, Kind } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

const ADDRESS_TYPES = ['IPv4', 'IPv6', 'FQDN'];
const PROTOCOLS = ['TCP', 'UDP', 'SCTP'];
/** As the API server bounds a slice: 1,000 endpoints of at most 100 addresses, 100 ports. */
const MAX_SLICE_ENDPOINTS = 1000;
const MAX_ADDRESSES = 100;
const MAX_SLICE_PORTS = 100;

const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);
const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

/** apimachinery printers' "a,b,c + N more..." with `empty` for none. */
function firstThree(items: string[], empty: string): string {
  if (items.length === 0) return empty;
  const shown = items.slice(0, 3).join(',');
  return items.length > 3 ? `${shown} + ${items.length - 3} more...` : shown;
}

function portCauses(ports: unknown, field: string, named: boolean): Cause[] {
  const out: Cause[] = [];
  list(ports).forEach((p, i) => {
    const at = `${field}[${i}]`;
    if (!isObj(p)) {
      out.push({ reason: 'FieldValueTypeInvalid', field: at, message: 'Invalid value: must be an object' });
      return;
    }
    const port = p.port;
    if (port !== undefined && port !== null && (typeof port !== 'number' || !Number.isInteger(port) || port < (named ? 0 : 1) || port > 65535)) {
      out.push({ reason: 'FieldValueInvalid', field: `${at}.port`, message: `Invalid value: ${JSON.stringify(port)}: must be between ${named ? 0 : 1} and 65535, inclusive` });
    }
    if (!named && (port === undefined || port === null)) out.push({ reason: 'FieldValueRequired', field: `${at}.port`, message: 'Required value' });
    if (p.protocol !== undefined && p.protocol !== null && !PROTOCOLS.includes(String(p.protocol))) {
      out.push({ reason: 'FieldValueNotSupported', field: `${at}.protocol`, message: `Unsupported value: ${JSON.stringify(p.protocol)}: supported values: "SCTP", "TCP", "UDP"` });
    }
    if (p.name !== undefined && p.name !== null && p.name !== '' && (typeof p.name !== 'string' || !/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(p.name) || p.name.length > 63)) {
      out.push({ reason: 'FieldValueInvalid', field: `${at}.name`, message: `Invalid value: ${JSON.stringify(p.name)}: must be a DNS label` });
    }
  });
  return out;
}

function defaultPorts(ports: unknown): void {
  for (const p of list(ports)) if (isObj(p) && (p.protocol === undefined || p.protocol === null)) p.protocol = 'TCP';
}

export const endpointSliceKind: Kind = {
  group: 'discovery.k8s.io',
  version: 'v1',
  kind: 'EndpointSlice',
  plural: 'endpointslices',
  singular: 'endpointslice',
  shortNames: [],
  namespaced: true,
  prepare(o, old) {
    defaultPorts(o.ports);
    for (const e of list(o.endpoints)) {
      if (!isObj(e)) continue;
      // As the API server's defaulting leaves them: conditions present, even if empty.
      if (!isObj(e.conditions)) e.conditions = {};
    }
    if (old && old.addressType !== o.addressType) {
      throw invalid('EndpointSlice', String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'addressType', message: `Invalid value: ${JSON.stringify(o.addressType)}: field is immutable` }], 'discovery.k8s.io');
    }
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    if (o.addressType === undefined || o.addressType === null || o.addressType === '') out.push({ reason: 'FieldValueRequired', field: 'addressType', message: 'Required value' });
    else if (!ADDRESS_TYPES.includes(String(o.addressType))) out.push({ reason: 'FieldValueNotSupported', field: 'addressType', message: `Unsupported value: ${JSON.stringify(o.addressType)}: supported values: "FQDN", "IPv4", "IPv6"` });
    const eps = list(o.endpoints);
    if (eps.length > MAX_SLICE_ENDPOINTS) out.push({ reason: 'FieldValueTooMany', field: 'endpoints', message: `Too many: ${eps.length}: must have at most ${MAX_SLICE_ENDPOINTS} items` });
    else {
      eps.forEach((e, i) => {
        const at = `endpoints[${i}]`;
        if (!isObj(e)) {
          out.push({ reason: 'FieldValueTypeInvalid', field: at, message: 'Invalid value: must be an object' });
          return;
        }
        const addrs = list(e.addresses);
        if (addrs.length === 0) out.push({ reason: 'FieldValueRequired', field: `${at}.addresses`, message: 'Required value: must contain at least 1 address' });
        if (addrs.length > MAX_ADDRESSES) out.push({ reason: 'FieldValueTooMany', field: `${at}.addresses`, message: `Too many: ${addrs.length}: must have at most ${MAX_ADDRESSES} items` });
        addrs.slice(0, MAX_ADDRESSES).forEach((a, j) => {
          if (typeof a !== 'string' || a === '') out.push({ reason: 'FieldValueInvalid', field: `${at}.addresses[${j}]`, message: `Invalid value: ${JSON.stringify(a)}: must be a valid address` });
        });
        for (const c of ['ready', 'serving', 'terminating']) {
          const v = isObj(e.conditions) ? e.conditions[c] : undefined;
          if (v !== undefined && v !== null && typeof v !== 'boolean') out.push({ reason: 'FieldValueTypeInvalid', field: `${at}.conditions.${c}`, message: 'Invalid value: must be a boolean' });
        }
      });
    }
    const ports = list(o.ports);
    if (ports.length > MAX_SLICE_PORTS) out.push({ reason: 'FieldValueTooMany', field: 'ports', message: `Too many: ${ports.length}: must have at most ${MAX_SLICE_PORTS} items` });
    else out.push(...portCauses(ports, 'ports', true));
    return out;
  },
  known: {
    addressType: true,
    endpoints: { list: { addresses: true, conditions: { ready: true, serving: true, terminating: true }, hostname: true, targetRef: 'map', deprecatedTopology: 'map', nodeName: true, zone: true, hints: 'map' } },
    ports: { list: { name: true, protocol: true, port: true, appProtocol: true } },
  },
  fields: {
    addressType: (o) => str(o.addressType),
  },
  columns: [
    nameColumn,
    { name: 'AddressType', type: 'string', description: 'addressType specifies the type of address carried by this EndpointSlice.' },
    { name: 'Ports', type: 'string', description: 'ports specifies the list of network ports exposed by each endpoint in this slice.' },
    { name: 'Endpoints', type: 'string', description: 'endpoints is a list of unique endpoints in this slice.' },
    ageColumn,
  ],
  row(o, now) {
    const ports = list(o.ports).map((p) => (isObj(p) && typeof p.port === 'number' ? String(p.port) : isObj(p) && typeof p.name === 'string' && p.name ? p.name : '*'));
    const addrs = list(o.endpoints).flatMap((e) => (isObj(e) ? list(e.addresses).map(String) : []));
    return [o.metadata.name, o.addressType ?? '', firstThree(ports, '<unset>'), firstThree(addrs, '<unset>'), age(o.metadata.creationTimestamp, now)];
  },
};

/** Endpoints' "ip:port" pairs as `kubectl get endpoints` prints them. */
function endpointsCell(o: ApiObject): string {
  const pairs: string[] = [];
  for (const s of list(o.subsets)) {
    if (!isObj(s)) continue;
    const ips = list(s.addresses).map((a) => (isObj(a) ? String(a.ip ?? '') : ''));
    const ports = list(s.ports).filter(isObj);
    if (ports.length === 0) pairs.push(...ips);
    else for (const p of ports) for (const ip of ips) pairs.push(ip.includes(':') ? `[${ip}]:${String(p.port)}` : `${ip}:${String(p.port)}`);
  }
  return firstThree(pairs, '<none>');
}

function addressCauses(addrs: unknown, field: string): Cause[] {
  const out: Cause[] = [];
  list(addrs).forEach((a, i) => {
    if (!isObj(a) || typeof a.ip !== 'string' || a.ip === '') out.push({ reason: 'FieldValueRequired', field: `${field}[${i}].ip`, message: 'Required value' });
  });
  return out;
}

export const endpointsKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Endpoints',
  plural: 'endpoints',
  singular: 'endpoints',
  shortNames: ['ep'],
  namespaced: true,
  prepare(o) {
    for (const s of list(o.subsets)) if (isObj(s)) defaultPorts(s.ports);
  },
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    list(o.subsets).forEach((s, i) => {
      const at = `subsets[${i}]`;
      if (!isObj(s)) {
        out.push({ reason: 'FieldValueTypeInvalid', field: at, message: 'Invalid value: must be an object' });
        return;
      }
      out.push(...addressCauses(s.addresses, `${at}.addresses`), ...addressCauses(s.notReadyAddresses, `${at}.notReadyAddresses`), ...portCauses(s.ports, `${at}.ports`, false));
    });
    return out;
  },
  known: {
    subsets: {
      list: {
        addresses: { list: { ip: true, hostname: true, nodeName: true, targetRef: 'map' } },
        notReadyAddresses: { list: { ip: true, hostname: true, nodeName: true, targetRef: 'map' } },
        ports: { list: { name: true, port: true, protocol: true, appProtocol: true } },
      },
    },
  },
  columns: [nameColumn, { name: 'Endpoints', type: 'string', description: 'Endpoints is the list of endpoints.' }, ageColumn],
  row: (o, now) => [o.metadata.name, endpointsCell(o), age(o.metadata.creationTimestamp, now)],
};

/** The label every slice of a Service carries, and who manages a slice, as kube-controller-manager sets them. */
export const SERVICE_NAME_LABEL = 'kubernetes.io/service-name';
export const MANAGED_BY_LABEL = 'endpointslice.kubernetes.io/managed-by';
