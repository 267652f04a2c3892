/**
 * A hook the agent calls after a pod's sandbox has its address and before
 * any of its containers starts: the node fences the pod's network there
 * (NetworkPolicy), so a pod a policy selects never runs a moment without
 * its rules. The agent does not start the pod's containers until it
 * resolves; a rejection is reported as an event and the pod is tried again.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';

export type PodNetworkReady = (pod: Pod, podIP: string) => Promise<void>;
