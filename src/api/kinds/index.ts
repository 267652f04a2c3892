/** The kinds the node's API serves. Adding one is a strategy file and a line here. */
import type { ApiObject, Kind } from '../types.js';
import { configMapKind } from './configmap.js';
import { controllerRevisionKind } from './controllerrevision.js';
import { cronJobKind } from './cronjob.js';
import { daemonSetKind } from './daemonset.js';
import { deploymentKind } from './deployment.js';
import { endpointSliceKind, endpointsKind } from './endpoints.js';
import { eventKind } from './event.js';
import { jobKind } from './job.js';
import { leaseKind } from './lease.js';
import { namespaceKind } from './namespace.js';
import { networkPolicyKind } from './networkpolicy.js';
import { nodeKind } from './node.js';
import { pdbKind } from './pdb.js';
import { persistentVolumeKind } from './pv.js';
import { persistentVolumeClaimKind } from './pvc.js';
import { podKind } from './pod.js';
import { clusterRoleBindingKind, clusterRoleKind, roleBindingKind, roleKind } from './rbac.js';
import { replicaSetKind } from './replicaset.js';
import { replicationControllerKind } from './replicationcontroller.js';
import { secretKind } from './secret.js';
import { serviceKind } from './service.js';
import { serviceAccountKind } from './serviceaccount.js';
import { statefulSetKind } from './statefulset.js';
import { storageClassKind } from './storageclass.js';

/**
 * Every kind, for the node named `nodeName` (where pods nobody placed are
 * placed, unless `refusal` says why the node takes none now: see podKind).
 * `rootDir` is the node's: no PersistentVolume may name a host path in it
 * but the provisioner's own (see pv.ts).
 */
export function nodeKinds(nodeName: string, refusal?: (pod: ApiObject) => string | undefined, storage: { rootDir?: string } = {}): Kind[] {
  return [
    namespaceKind,
    configMapKind,
    secretKind,
    eventKind,
    podKind(nodeName, refusal),
    replicationControllerKind,
    serviceKind,
    serviceAccountKind,
    endpointsKind,
    // In the API server's order, which `kubectl get all` keeps.
    daemonSetKind,
    deploymentKind,
    replicaSetKind,
    statefulSetKind,
    controllerRevisionKind,
    jobKind,
    cronJobKind,
    nodeKind,
    leaseKind,
    endpointSliceKind,
    pdbKind,
    persistentVolumeClaimKind,
    persistentVolumeKind(storage.rootDir),
    storageClassKind,
    roleKind,
    clusterRoleKind,
    roleBindingKind,
    clusterRoleBindingKind,
    networkPolicyKind,
  ];
}
