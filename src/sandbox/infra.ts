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
 * CONTAINER unless shareProcessNamespace). Pods in a user namespace of their
 * own keep one too: their namespace is pinned like the others, but the
 * infra-less path has not been proven for them yet.
 */
export function needsInfra(config: Pick<PodSandboxConfig__Output, 'linux'>): boolean {
  const opts = config.linux?.securityContext?.namespaceOptions;
  const pid = String(opts?.pid ?? 'POD');
  const userns = String(opts?.usernsOptions?.mode ?? 'NODE');
  return pid === 'POD' || pid === '0' || (userns !== 'NODE' && userns !== '2');
}
