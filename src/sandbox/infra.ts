/**
 * Which pods get an infra process. The pod's network, IPC and UTS
 * namespaces are pinned to files, so a process is needed only for what a
 * file cannot hold: a PID namespace that the pod's containers share (its
 * init must outlive them all). Every other pod runs no infra at all, and its
 * containers join the pinned namespaces by path.
 */
import type { PodSandboxConfig__Output } from '../gen/runtime/v1/PodSandboxConfig.js';

/**
 * True when the pod needs an infra process: it shares one PID namespace
 * among its containers (namespace_options.pid POD, the proto's default 0,
 * which is what crictl sends unless told otherwise; the kubelet sends
 * CONTAINER unless shareProcessNamespace). Extend here for other namespaces
 * that only a process can hold (e.g. a pod-wide user namespace).
 */
export function needsInfra(config: Pick<PodSandboxConfig__Output, 'linux'>): boolean {
  const pid = String(config.linux?.securityContext?.namespaceOptions?.pid ?? 'POD');
  return pid === 'POD' || pid === '0';
}
