/**
 * v1 Service: defaulted as the API server defaults it (ClusterIP, no
 * affinity, TCP ports that target themselves, cluster-wide traffic
 * policies, one IPv4 family), validated as the API server validates it
 * (service-validation.ts, shared with the proxy's manifest files), a
 * clusterIP immutable once set, with kubectl's columns. The API allocates
 * no cluster IP (the proxy picks one for a Service that names none) but
 * does allocate a LoadBalancer's health-check node port.
 */
import { NODE_PORT_MAX, NODE_PORT_MIN, serviceProblem } from '../../proxy/service.js';
import { applyServiceDefaults, needsHealthCheck, serviceErrors } from '../../proxy/service-validation.js';
import { invalid, type Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';
import { formatLabels, serviceCells } from './workload-rows.js';

const specOf = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});
const statusOf = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});
const ipOf = (spec: Obj): string => (typeof spec.clusterIP === 'string' ? spec.clusterIP : '');

const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);
const externallyAccessible = (spec: Obj) => spec.type === 'LoadBalancer' || spec.type === 'NodePort' || ((spec.type ?? 'ClusterIP') === 'ClusterIP' && Array.isArray(spec.externalIPs) && spec.externalIPs.length > 0);

/**
 * As the API server's strategy does when a Service changes type: the fields
 * the old type needed and the new one refuses go, if the write left them as
 * they were (a client that reads, edits `type` and writes back need not know
 * them all); a value the client changed is its own, and is validated.
 */
function dropTypeDependentFields(spec: Obj, was: Obj): void {
  const type = spec.type ?? 'ClusterIP';
  if (type === was.type) return;
  if (type === 'ExternalName') {
    for (const f of ['clusterIP', 'clusterIPs', 'ipFamilies', 'ipFamilyPolicy', 'internalTrafficPolicy']) if (spec[f] !== undefined && same(spec[f], was[f])) delete spec[f];
  }
  if (type !== 'NodePort' && type !== 'LoadBalancer' && Array.isArray(spec.ports)) {
    const old = Array.isArray(was.ports) ? (was.ports as Obj[]) : [];
    for (const p of spec.ports as Obj[]) {
      if (!isObj(p) || p.nodePort === undefined) continue;
      if (old.some((q) => isObj(q) && q.port === p.port && q.nodePort === p.nodePort)) delete p.nodePort;
    }
  }
  if (type !== 'LoadBalancer') {
    for (const f of ['allocateLoadBalancerNodePorts', 'loadBalancerClass', 'loadBalancerSourceRanges']) if (spec[f] !== undefined && same(spec[f], was[f])) delete spec[f];
  }
  if (!externallyAccessible(spec) && spec.externalTrafficPolicy !== undefined && same(spec.externalTrafficPolicy, was.externalTrafficPolicy)) delete spec.externalTrafficPolicy;
}

export const serviceKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Service',
  plural: 'services',
  singular: 'service',
  shortNames: ['svc'],
  categories: ['all'],
  namespaced: true,
  status: true,
  prepare(o, old) {
    if (!isObj(o.spec)) o.spec = {};
    const spec = o.spec as Obj;
    if (old) {
      const was = specOf(old);
      dropTypeDependentFields(spec, was);
      // As the API server patches allocated values back in: a write that leaves clusterIP out keeps it.
      if (ipOf(spec) === '' && ipOf(was) !== '' && (spec.type ?? 'ClusterIP') !== 'ExternalName') {
        spec.clusterIP = was.clusterIP;
        if (!Array.isArray(spec.clusterIPs) || spec.clusterIPs.length === 0) spec.clusterIPs = was.clusterIPs;
      }
    }
    applyServiceDefaults(spec);
    if (old) {
      // So is the health-check port it was given while it still wants one; one it no longer wants goes (dropTypeDependentFields).
      const had = specOf(old).healthCheckNodePort;
      if (needsHealthCheck(spec) && (spec.healthCheckNodePort === undefined || spec.healthCheckNodePort === 0) && typeof had === 'number') spec.healthCheckNodePort = had;
      else if (!needsHealthCheck(spec) && spec.healthCheckNodePort === had) delete spec.healthCheckNodePort;
    }
    if (!old) {
      o.status = { loadBalancer: {} };
      return;
    }
    const was = specOf(old);
    const before = Array.isArray(was.clusterIPs) ? (was.clusterIPs as unknown[]) : ipOf(was) ? [ipOf(was)] : [];
    const now = Array.isArray(spec.clusterIPs) ? (spec.clusterIPs as unknown[]) : [];
    if (spec.type !== 'ExternalName' && was.type !== 'ExternalName' && before.length > 0 && JSON.stringify(now[0]) !== JSON.stringify(before[0])) {
      const value = `[]string{${now.map((ip) => JSON.stringify(String(ip))).join(', ')}}`;
      throw invalid('Service', String(o.metadata.name), [{ reason: 'FieldValueInvalid', field: 'spec.clusterIPs[0]', message: `Invalid value: ${now.length ? value : '[]string(nil)'}: ${now.length ? 'may not change once set' : 'primary clusterIP can not be unset'}` }]);
    }
  },
  validate(o) {
    // The name is a DNS-1035 label (checked below), not the subdomain other kinds' names are.
    const out: Cause[] = [...metaCauses(o, true).filter((c) => c.field !== 'metadata.name'), ...serviceErrors(o)];
    if (out.length > 0) return out;
    const problem = serviceProblem({ apiVersion: 'v1', kind: 'Service', namespace: String(o.metadata.namespace ?? ''), name: String(o.metadata.name ?? ''), uid: String(o.metadata.uid ?? ''), object: o, source: { file: '', document: 0, line: 0 } });
    return problem ? [{ reason: 'FieldValueInvalid', field: 'spec', message: `Invalid value: ${problem}` }] : [];
  },
  admit(o, others) {
    // As the API server's allocators refuse them: an address or node port another Service holds, a node port out of range.
    const spec = isObj(o.spec) ? o.spec : {};
    const out: Cause[] = [];
    const takenIPs = new Map<string, string>();
    const takenPorts = new Map<string, string>();
    for (const s of others('services')) {
      if (s.metadata.namespace === o.metadata.namespace && s.metadata.name === o.metadata.name) continue;
      const ss = isObj(s.spec) ? s.spec : {};
      const who = `${s.metadata.namespace}/${s.metadata.name}`;
      if (ipOf(ss) !== '' && ipOf(ss) !== 'None') takenIPs.set(ipOf(ss), who);
      for (const p of Array.isArray(ss.ports) ? (ss.ports as Obj[]) : []) if (typeof p.nodePort === 'number') takenPorts.set(`${p.nodePort}/${String(p.protocol ?? 'TCP')}`, who);
      if (typeof ss.healthCheckNodePort === 'number' && ss.healthCheckNodePort > 0) takenPorts.set(`${ss.healthCheckNodePort}/TCP`, who);
    }
    const ip = ipOf(spec);
    if (ip !== '' && ip !== 'None' && takenIPs.has(ip)) {
      out.push({ reason: 'FieldValueInvalid', field: 'spec.clusterIPs', message: `Invalid value: []string{${JSON.stringify(ip)}}: failed to allocate IP ${ip}: provided IP is already allocated` });
    }
    (Array.isArray(spec.ports) ? (spec.ports as Obj[]) : []).forEach((p, i) => {
      if (typeof p.nodePort !== 'number') return;
      const field = `spec.ports[${i}].nodePort`;
      if (p.nodePort < NODE_PORT_MIN || p.nodePort > NODE_PORT_MAX) out.push({ reason: 'FieldValueInvalid', field, message: `Invalid value: ${p.nodePort}: provided port is not in the valid range. The range of valid ports is ${NODE_PORT_MIN}-${NODE_PORT_MAX}` });
      else if (takenPorts.has(`${p.nodePort}/${String(p.protocol ?? 'TCP')}`)) out.push({ reason: 'FieldValueInvalid', field, message: `Invalid value: ${p.nodePort}: provided port is already allocated` });
    });
    if (needsHealthCheck(spec)) {
      // The API server's node-port allocator gives a LoadBalancer with local external traffic its health-check port.
      const own = new Set((Array.isArray(spec.ports) ? (spec.ports as Obj[]) : []).map((p) => p.nodePort));
      const hc = spec.healthCheckNodePort;
      const field = 'spec.healthCheckNodePort';
      if (typeof hc === 'number' && hc > 0) {
        if (hc < NODE_PORT_MIN || hc > NODE_PORT_MAX) out.push({ reason: 'FieldValueInvalid', field, message: `Invalid value: ${hc}: provided port is not in the valid range. The range of valid ports is ${NODE_PORT_MIN}-${NODE_PORT_MAX}` });
        else if (takenPorts.has(`${hc}/TCP`) || own.has(hc)) out.push({ reason: 'FieldValueInvalid', field, message: `Invalid value: ${hc}: provided port is already allocated` });
      } else if (out.length === 0) {
        const span = NODE_PORT_MAX - NODE_PORT_MIN + 1;
        const start = Math.floor(Math.random() * span);
        let got: number | undefined;
        for (let i = 0; i < span && got === undefined; i++) {
          const np = NODE_PORT_MIN + ((start + i) % span);
          if (!takenPorts.has(`${np}/TCP`) && !takenPorts.has(`${np}/UDP`) && !own.has(np)) got = np;
        }
        if (got === undefined) out.push({ reason: 'FieldValueInvalid', field, message: 'Invalid value: 0: failed to allocate a health-check node port: range is full' });
        else spec.healthCheckNodePort = got;
      }
    } else if (spec.healthCheckNodePort === 0) delete spec.healthCheckNodePort;
    return out;
  },
  known: { spec: 'map', status: 'map' },
  columns: [
    nameColumn,
    { name: 'Type', type: 'string', description: 'type determines how the Service is exposed.' },
    { name: 'Cluster-IP', type: 'string', description: 'clusterIP is the IP address of the service and is usually assigned randomly.' },
    { name: 'External-IP', type: 'string', description: 'externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.' },
    { name: 'Port(s)', type: 'string', description: 'The list of ports that are exposed by this service.' },
    ageColumn,
    { name: 'Selector', type: 'string', priority: 1, description: 'Route service traffic to pods with label keys and values matching this selector.' },
  ],
  row: (o, now) => [o.metadata.name, ...serviceCells(specOf(o), statusOf(o)), age(o.metadata.creationTimestamp, now), formatLabels(specOf(o).selector)],
};
