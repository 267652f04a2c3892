/** Services and pods as manifest objects, for the proxy's tests. */
import { createHash } from 'node:crypto';
import type { Pod, Service } from 'kubernetes-types/core/v1.js';
import type { StoredObject } from '../../src/kubelet-lite/model.js';

export function serviceObject(namespace: string, name: string, spec: Service['spec']): StoredObject {
  const object = { apiVersion: 'v1', kind: 'Service', metadata: { namespace, name }, spec } as Record<string, unknown>;
  return {
    apiVersion: 'v1',
    kind: 'Service',
    namespace,
    name,
    uid: createHash('sha256').update(JSON.stringify(object)).digest('hex').slice(0, 32),
    object,
    source: { file: `/manifests/${name}.yaml`, document: 0, line: 1 },
  };
}

export interface PodOpts {
  ns?: string;
  labels?: Record<string, string>;
  ip?: string;
  ready?: boolean;
  ports?: Array<{ name?: string; containerPort: number; protocol?: 'TCP' | 'UDP' | 'SCTP' }>;
  hostNetwork?: boolean;
  hostIP?: string;
  phase?: string;
  /** spec.hostname and spec.subdomain: a headless Service named `subdomain` names the pod `hostname`. */
  hostname?: string;
  subdomain?: string;
}

export function pod(name: string, o: PodOpts = {}): Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace: o.ns ?? 'default', name, labels: o.labels ?? { app: 'web' } },
    spec: { hostNetwork: o.hostNetwork, hostname: o.hostname, subdomain: o.subdomain, containers: [{ name: 'c', image: 'busybox', ports: o.ports }] },
    status: {
      phase: o.phase ?? 'Running',
      podIP: o.ip,
      hostIP: o.hostIP ?? '192.168.1.10',
      conditions: [{ type: 'Ready', status: o.ready === false ? 'False' : 'True' }],
    },
  };
}
