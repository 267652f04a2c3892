/** coordination.k8s.io/v1 Lease: the node's heartbeat in kube-node-lease, renewed every 10 s. */
import type { Cause } from '../errors.js';
import type { ApiObject, Kind, Obj } from '../types.js';
import { age, ageColumn, isObj, metaCauses, nameColumn } from './common.js';

const spec = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});

export const leaseKind: Kind = {
  group: 'coordination.k8s.io',
  version: 'v1',
  kind: 'Lease',
  plural: 'leases',
  singular: 'lease',
  shortNames: [],
  namespaced: true,
  validate(o) {
    const out: Cause[] = metaCauses(o, true);
    const d = spec(o).leaseDurationSeconds;
    if (d !== undefined && (typeof d !== 'number' || !Number.isInteger(d) || d <= 0)) out.push({ reason: 'FieldValueInvalid', field: 'spec.leaseDurationSeconds', message: `Invalid value: ${JSON.stringify(d)}: must be greater than 0` });
    return out;
  },
  known: { spec: { holderIdentity: true, leaseDurationSeconds: true, acquireTime: true, renewTime: true, leaseTransitions: true, strategy: true, preferredHolder: true } },
  columns: [nameColumn, { name: 'Holder', type: 'string', description: 'The holder of the lease.' }, ageColumn],
  row: (o, now) => [o.metadata.name, spec(o).holderIdentity ?? '<none>', age(o.metadata.creationTimestamp, now)],
};
