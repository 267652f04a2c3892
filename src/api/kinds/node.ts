/** v1 Node (cluster-scoped): the node registers it and keeps its status; the columns `kubectl get nodes` prints. */
import { dnsSubdomainError } from '../../kubelet-lite/validate.js';
import type { Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

const status = (o: ApiObject): Obj => (isObj(o.status) ? o.status : {});
const list = (v: unknown): Obj[] => (Array.isArray(v) ? v.filter(isObj) : []);

function readyText(o: ApiObject): string {
  const ready = list(status(o).conditions).find((c) => c.type === 'Ready');
  const text = ready?.status === 'True' ? 'Ready' : ready?.status === 'False' ? 'NotReady' : 'Unknown';
  return isObj(o.spec) && o.spec.unschedulable === true ? `${text},SchedulingDisabled` : text;
}

/** The ROLES column: node-role.kubernetes.io/<role> labels, and kubernetes.io/role. */
function roles(o: ApiObject): string {
  const out = new Set<string>();
  for (const [k, v] of Object.entries(o.metadata.labels ?? {})) {
    if (k.startsWith('node-role.kubernetes.io/')) out.add(k.slice('node-role.kubernetes.io/'.length));
    else if (k === 'kubernetes.io/role' && v) out.add(v);
  }
  return out.size > 0 ? [...out].sort().join(',') : '<none>';
}

const address = (o: ApiObject, type: string) => String(list(status(o).addresses).find((a) => a.type === type)?.address ?? '<none>');
const info = (o: ApiObject, f: string) => String((isObj(status(o).nodeInfo) ? (status(o).nodeInfo as Obj)[f] : undefined) ?? '<unknown>');

export const nodeKind: Kind = {
  group: '',
  version: 'v1',
  kind: 'Node',
  plural: 'nodes',
  singular: 'node',
  shortNames: ['no'],
  namespaced: false,
  status: true,
  validate(o) {
    const out: Cause[] = metaCauses(o, false);
    const bad = dnsSubdomainError(String(o.metadata.name ?? ''));
    if (bad && out.length === 0) out.push({ reason: 'FieldValueInvalid', field: 'metadata.name', message: `Invalid value: ${JSON.stringify(o.metadata.name)}: ${bad}` });
    return out;
  },
  known: { spec: { podCIDR: true, podCIDRs: true, providerID: true, unschedulable: true, taints: 'map', configSource: 'map', externalID: true }, status: 'map' },
  fields: { 'spec.unschedulable': (o) => String(isObj(o.spec) && o.spec.unschedulable === true) },
  columns: [
    nameColumn,
    { name: 'Status', type: 'string', description: 'The status of the node' },
    { name: 'Roles', type: 'string', description: 'The roles of the node' },
    ageColumn,
    { name: 'Version', type: 'string', description: 'Kubelet Version reported by the node.' },
    { name: 'Internal-IP', type: 'string', priority: 1, description: 'List of addresses reachable to the node.' },
    { name: 'External-IP', type: 'string', priority: 1, description: 'List of addresses reachable to the node.' },
    { name: 'OS-Image', type: 'string', priority: 1, description: 'OS Image reported by the node from /etc/os-release.' },
    { name: 'Kernel-Version', type: 'string', priority: 1, description: 'Kernel Version reported by the node.' },
    { name: 'Container-Runtime', type: 'string', priority: 1, description: 'Container Runtime Version reported by the node.' },
  ],
  row: (o, now) => [
    o.metadata.name,
    readyText(o),
    roles(o),
    age(o.metadata.creationTimestamp, now),
    info(o, 'kubeletVersion'),
    address(o, 'InternalIP'),
    address(o, 'ExternalIP'),
    info(o, 'osImage'),
    info(o, 'kernelVersion'),
    info(o, 'containerRuntimeVersion'),
  ],
};
