/**
 * A pod's status in the Kubernetes API's shape, built from the spec, what the
 * runtime holds, what the prober says and why the worker is waiting — as the
 * kubelet's generateAPIPodStatus does.
 */
import type { Container, ContainerState, ContainerStatus, Pod, PodCondition, PodStatus } from 'kubernetes-types/core/v1.js';
import { kindOf } from './actions.js';
import type { ObservedContainer, ObservedPod } from './runtime-state.js';

export interface Waiting {
  reason: string;
  message?: string;
}

export interface StatusInputs {
  pod: Pod;
  observed: ObservedPod;
  /** Why a container is not running, when the worker knows (ErrImagePull, CrashLoopBackOff …). */
  waiting: Map<string, Waiting>;
  ready(name: string): boolean;
  started(name: string): boolean;
  /** A container's termination message, read by the worker after it exited. */
  terminationMessage(c: ObservedContainer): string | undefined;
  runtimeName: string;
  hostIP: string;
  qosClass: string;
  startTime: number;
  /** The pod's previous status, to keep the conditions' transition times. */
  previous?: PodStatus;
  /** A pod-level failure (a volume that cannot be set up, an invalid spec) shown in the status. */
  podMessage?: { reason: string; message: string };
  /** The pod is being deleted. */
  terminating?: boolean;
  now: number;
}

/** A time as the API writes it: seconds, UTC. */
export const iso = (ms: number): string => new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');

function terminated(c: ObservedContainer, id: string, message: string | undefined): ContainerState {
  let reason = c.reason;
  if (!reason) reason = c.exitCode === 0 ? 'Completed' : 'Error';
  return {
    terminated: {
      exitCode: c.exitCode,
      reason,
      ...(message || c.message ? { message: message || c.message } : {}),
      startedAt: c.startedAt ? iso(c.startedAt) : undefined,
      finishedAt: c.finishedAt ? iso(c.finishedAt) : undefined,
      containerID: id,
    },
  };
}

function containerStatus(inp: StatusInputs, spec: Container, init: boolean, podInitialized: boolean): ContainerStatus {
  const instances = inp.observed.containers.filter((c) => c.name === spec.name);
  const latest = instances[0];
  const prevDead = instances.find((c, i) => i > 0 && c.state === 'exited');
  const idOf = (c: ObservedContainer) => `${inp.runtimeName}://${c.id}`;
  const wait = inp.waiting.get(spec.name);
  let state: ContainerState;
  let lastState: ContainerState = prevDead ? terminated(prevDead, idOf(prevDead), inp.terminationMessage(prevDead)) : {};
  if (latest?.state === 'running') {
    state = { running: { startedAt: latest.startedAt ? iso(latest.startedAt) : undefined } };
  } else if (wait) {
    state = { waiting: { reason: wait.reason, ...(wait.message ? { message: wait.message } : {}) } };
    if (latest?.state === 'exited') lastState = terminated(latest, idOf(latest), inp.terminationMessage(latest));
  } else if (latest?.state === 'exited') {
    state = terminated(latest, idOf(latest), inp.terminationMessage(latest));
  } else if (latest) {
    state = { waiting: { reason: 'ContainerCreating' } };
  } else {
    state = { waiting: { reason: init || podInitialized ? 'ContainerCreating' : 'PodInitializing' } };
  }
  const running = latest?.state === 'running';
  const kind = kindOf(spec, init);
  const ready = kind === 'init' ? latest?.state === 'exited' && latest.exitCode === 0 : running && inp.ready(spec.name);
  const status: ContainerStatus = {
    name: spec.name,
    state,
    lastState,
    ready,
    restartCount: latest?.restartCount ?? 0,
    image: spec.image ?? '',
    imageID: latest?.imageRef ?? '',
    ...(latest ? { containerID: idOf(latest) } : {}),
    started: running && inp.started(spec.name),
  };
  return status;
}

/** The pod's phase from its container statuses, as the kubelet's getPhase. */
export function podPhase(pod: Pod, init: ContainerStatus[], apps: ContainerStatus[]): PodStatus['phase'] {
  const spec = pod.spec!;
  const policy = spec.restartPolicy ?? 'Always';
  let pendingInit = 0;
  let failedInit = 0;
  for (const ic of spec.initContainers ?? []) {
    if (kindOf(ic, true) === 'sidecar') continue;
    const s = init.find((x) => x.name === ic.name);
    if (!s) pendingInit++;
    else if (s.state?.running) pendingInit++;
    else if (s.state?.terminated) {
      if (s.state.terminated.exitCode !== 0) failedInit++;
    } else if (s.state?.waiting && s.lastState?.terminated) {
      if (s.lastState.terminated.exitCode !== 0) failedInit++;
    } else pendingInit++;
  }
  if (failedInit > 0 && policy === 'Never') return 'Failed';
  if (pendingInit > 0 || failedInit > 0) return 'Pending';
  let running = 0;
  let waiting = 0;
  let stopped = 0;
  let succeeded = 0;
  for (const s of apps) {
    if (s.state?.running) running++;
    else if (s.state?.terminated) {
      stopped++;
      if (s.state.terminated.exitCode === 0) succeeded++;
    } else if (s.state?.waiting && s.lastState?.terminated) stopped++;
    else waiting++;
  }
  if (waiting > 0) return 'Pending';
  if (running > 0) return 'Running';
  if (stopped > 0) {
    if (policy === 'Always') return 'Running';
    if (stopped === succeeded) return 'Succeeded';
    if (policy === 'Never') return 'Failed';
    return 'Running';
  }
  return 'Pending';
}

export function buildPodStatus(inp: StatusInputs): PodStatus {
  const spec = inp.pod.spec!;
  const sandbox = inp.observed.sandboxes[0];
  const appStarted = spec.containers.some((c) => inp.observed.containers.some((o) => o.name === c.name && (!sandbox || o.sandboxId === sandbox.id)));
  const initStatuses = (spec.initContainers ?? []).map((c) => containerStatus(inp, c, true, appStarted));
  const initialized =
    appStarted ||
    (spec.initContainers ?? []).every((ic, i) => {
      const s = initStatuses[i]!;
      return kindOf(ic, true) === 'sidecar' ? s.started === true : s.state?.terminated?.exitCode === 0;
    });
  const appStatuses = spec.containers.map((c) => containerStatus(inp, c, false, initialized));
  let phase = podPhase(inp.pod, initStatuses, appStatuses);
  if (inp.podMessage && phase === 'Pending' && !sandbox) phase = 'Pending';

  const sidecarsReady = (spec.initContainers ?? []).every((ic, i) => kindOf(ic, true) !== 'sidecar' || initStatuses[i]!.ready);
  const containersReady = phase === 'Running' && !inp.terminating && appStatuses.every((s) => s.ready) && sidecarsReady;
  // The gates' conditions are written by others into the API's copy; the node's API bridge judges them (node/api-bridge.ts).
  const gates = (spec.readinessGates ?? []).map((g) => g.conditionType);
  const previous = new Map((inp.previous?.conditions ?? []).map((c) => [c.type, c]));
  const condition = (type: string, ok: boolean, reason?: string): PodCondition => {
    const status = ok ? 'True' : 'False';
    const prev = previous.get(type);
    const lastTransitionTime = prev && prev.status === status ? prev.lastTransitionTime : iso(inp.now);
    return { type, status, lastProbeTime: null as unknown as undefined, lastTransitionTime, ...(!ok && reason ? { reason } : {}) };
  };
  const notReady = appStatuses.filter((s) => !s.ready).map((s) => s.name);
  const conditions: PodCondition[] = [
    condition('PodReadyToStartContainers', !!sandbox?.ready),
    condition('Initialized', initialized, 'ContainersNotInitialized'),
    condition('Ready', containersReady && gates.length === 0, phase === 'Succeeded' || phase === 'Failed' ? 'PodCompleted' : containersReady ? 'ReadinessGatesNotReady' : 'ContainersNotReady'),
    condition('ContainersReady', containersReady, phase === 'Succeeded' || phase === 'Failed' ? 'PodCompleted' : 'ContainersNotReady'),
    condition('PodScheduled', true),
  ];
  for (const c of conditions) {
    if (c.status === 'False' && (c.type === 'Ready' || c.type === 'ContainersReady') && c.reason === 'ContainersNotReady' && notReady.length) {
      c.message = `containers with unready status: [${notReady.join(' ')}]`;
    }
    if (c.status === 'False' && c.type === 'Initialized') {
      const pending = (spec.initContainers ?? []).filter((_, i) => !initStatuses[i]!.ready && kindOf(spec.initContainers![i]!, true) === 'init').map((c) => c.name);
      if (pending.length) c.message = `containers with incomplete status: [${pending.join(' ')}]`;
    }
    if (c.status === 'False' && c.type === 'Ready' && c.reason === 'ReadinessGatesNotReady') {
      c.message = gates.map((g) => `corresponding condition of pod readiness gate "${g}" does not exist.`).join(', ');
    }
  }

  const hostNetwork = spec.hostNetwork === true;
  const ip = hostNetwork ? inp.hostIP : sandbox?.ready ? sandbox.ip : '';
  const ips = hostNetwork ? [inp.hostIP] : sandbox?.ready ? sandbox.ips : [];
  const status: PodStatus = {
    phase,
    conditions,
    hostIP: inp.hostIP,
    hostIPs: [{ ip: inp.hostIP }],
    ...(ip ? { podIP: ip, podIPs: ips.map((x) => ({ ip: x })) } : {}),
    startTime: iso(inp.startTime),
    ...(initStatuses.length ? { initContainerStatuses: initStatuses } : {}),
    containerStatuses: appStatuses,
    qosClass: inp.qosClass,
    ...(inp.podMessage ? { reason: inp.podMessage.reason, message: inp.podMessage.message } : {}),
  };
  return status;
}
