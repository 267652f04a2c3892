/**
 * One `kubectl get pods` row, as kubectl computes READY, STATUS and
 * RESTARTS from the Pod; shared by the API's Pod table and skiff's CLI.
 */
import type { Container, ContainerState, ContainerStatus, Pod } from 'kubernetes-types/core/v1.js';
import { humanDuration } from './common.js';

function age(timestamp: string | undefined, now: Date): string {
  if (!timestamp) return '<unknown>';
  const t = Date.parse(timestamp);
  if (Number.isNaN(t)) return '<unknown>';
  return humanDuration(now.getTime() - t);
}

export interface PodRow {
  namespace: string;
  name: string;
  ready: string;
  status: string;
  restarts: string;
  age: string;
  ip: string;
  node: string;
  nominatedNode: string;
  readinessGates: string;
}

function isSidecar(c: Container | undefined): boolean {
  return c?.restartPolicy === 'Always';
}

function terminatedReason(s: NonNullable<ContainerState['terminated']>, prefix: string): string {
  if (s.reason) return `${prefix}${s.reason}`;
  if (s.signal) return `${prefix}Signal:${s.signal}`;
  return `${prefix}ExitCode:${s.exitCode}`;
}

function conditionTrue(pod: Pod, type: string): boolean {
  return (pod.status?.conditions ?? []).some((c) => c.type === type && c.status === 'True');
}

/** One `kubectl get pods` row, computed as kubectl computes it. */
export function podRow(pod: Pod, now: Date): PodRow {
  const spec = pod.spec;
  const status = pod.status ?? {};
  const initSpecs = new Map((spec?.initContainers ?? []).map((c) => [c.name, c]));
  let total = (spec?.containers ?? []).length + (spec?.initContainers ?? []).filter(isSidecar).length;
  let ready = 0;
  let restarts = 0;
  let sidecarRestarts = 0;
  let lastRestart = 0;
  let lastSidecarRestart = 0;
  let reason = status.reason || status.phase || 'Unknown';
  if ((status.conditions ?? []).some((c) => c.type === 'PodScheduled' && c.reason === 'SchedulingGated')) reason = 'SchedulingGated';
  const finishedAt = (c: ContainerStatus) => Date.parse(c.lastState?.terminated?.finishedAt ?? '') || 0;

  let initializing = false;
  const inits = status.initContainerStatuses ?? [];
  for (let i = 0; i < inits.length; i++) {
    const c = inits[i]!;
    restarts += c.restartCount ?? 0;
    lastRestart = Math.max(lastRestart, finishedAt(c));
    const sidecar = isSidecar(initSpecs.get(c.name));
    if (sidecar) {
      sidecarRestarts += c.restartCount ?? 0;
      lastSidecarRestart = Math.max(lastSidecarRestart, finishedAt(c));
    }
    const t = c.state?.terminated;
    const w = c.state?.waiting;
    if (t && t.exitCode === 0) continue;
    if (sidecar && c.started) {
      if (c.ready) ready++;
      continue;
    }
    if (t) reason = terminatedReason(t, 'Init:');
    else if (w?.reason && w.reason !== 'PodInitializing') reason = `Init:${w.reason}`;
    else reason = `Init:${i}/${(spec?.initContainers ?? []).length}`;
    initializing = true;
    break;
  }

  if (!initializing || conditionTrue(pod, 'Initialized')) {
    restarts = sidecarRestarts;
    lastRestart = lastSidecarRestart;
    let hasRunning = false;
    const cs = status.containerStatuses ?? [];
    // The first container's state wins: walk backwards so it is seen last.
    for (let i = cs.length - 1; i >= 0; i--) {
      const c = cs[i]!;
      restarts += c.restartCount ?? 0;
      lastRestart = Math.max(lastRestart, finishedAt(c));
      const w = c.state?.waiting;
      const t = c.state?.terminated;
      if (w?.reason) reason = w.reason;
      else if (t) reason = terminatedReason(t, '');
      else if (c.ready && c.state?.running) {
        hasRunning = true;
        ready++;
      }
    }
    if (reason === 'Completed' && hasRunning) reason = conditionTrue(pod, 'Ready') ? 'Running' : 'NotReady';
  }

  if (pod.metadata?.deletionTimestamp) {
    if (status.reason === 'NodeLost') reason = 'Unknown';
    else if (status.phase !== 'Succeeded' && status.phase !== 'Failed') reason = 'Terminating';
  }

  let restartText = String(restarts);
  if (restarts !== 0 && lastRestart > 0) restartText = `${restarts} (${humanDuration(now.getTime() - lastRestart)} ago)`;
  const gates = spec?.readinessGates ?? [];
  const gatesReady = gates.filter((g) => conditionTrue(pod, g.conditionType)).length;
  return {
    namespace: pod.metadata?.namespace ?? 'default',
    name: pod.metadata?.name ?? '',
    ready: `${ready}/${total}`,
    status: reason,
    restarts: restartText,
    age: age(pod.metadata?.creationTimestamp, now),
    ip: status.podIP || '<none>',
    node: spec?.nodeName || '<none>',
    nominatedNode: status.nominatedNodeName || '<none>',
    readinessGates: gates.length ? `${gatesReady}/${gates.length}` : '<none>',
  };
}

/** The pod's QoS class: its status's, or computed from its containers' requests and limits as the API server does. */
export function qosClass(pod: Pod): string {
  if (pod.status?.qosClass) return pod.status.qosClass;
  const cs = [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])];
  let any = false;
  let guaranteed = true;
  for (const c of cs) {
    const limits = c.resources?.limits ?? {};
    const requests = { ...limits, ...(c.resources?.requests ?? {}) };
    if (Object.keys(limits).length || Object.keys(requests).length) any = true;
    for (const r of ['cpu', 'memory']) {
      if (limits[r] === undefined || String(requests[r]) !== String(limits[r])) guaranteed = false;
    }
  }
  if (!any) return 'BestEffort';
  return guaranteed ? 'Guaranteed' : 'Burstable';
}
