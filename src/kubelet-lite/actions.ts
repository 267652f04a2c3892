/**
 * What one sync of a pod must do, decided purely from its spec and what the
 * runtime holds (the kubelet's computePodActions): create the sandbox, which
 * containers to kill, which to start and in what order, which dead ones to
 * remove. The worker gates starts through the back-off and acts.
 */
import type { Container, Pod } from 'kubernetes-types/core/v1.js';
import { CONTAINER_IMAGE_ANNOTATION } from './model.js';
import type { ContainerKind, ObservedContainer, ObservedPod } from './runtime-state.js';

/** What the prober knows about one container of the pod. */
export interface ProbeView {
  /** Liveness or startup failed past its threshold: the container must be killed. */
  unhealthy(name: string): string | undefined;
  /** The startup probe succeeded, or there is none. */
  started(name: string): boolean;
}

export interface StartAction {
  container: Container;
  kind: ContainerKind;
  restartCount: number;
  /** When the instance it replaces ended (for the back-off); 0 for a first start. */
  lastFinishedAt: number;
}

export interface KillAction {
  id: string;
  name: string;
  /** Why, for the Killing event. */
  reason: string;
  /** Remove it after it stops (it is a stale instance nobody will look at again). */
  remove: boolean;
  /** Overrides the pod's grace period (a probe's terminationGracePeriodSeconds). */
  graceSeconds?: number;
}

/** The grace period of a kill for a failed liveness or startup probe: the probe's own, when it has one. */
function probeGrace(c: Container): number | undefined {
  return c.livenessProbe?.terminationGracePeriodSeconds ?? c.startupProbe?.terminationGracePeriodSeconds ?? undefined;
}

export interface PodActions {
  /** Kill every container and make a new sandbox with this attempt. */
  createSandbox: boolean;
  sandboxAttempt: number;
  /** The pod reached its end (all containers done for good): stop its sandbox. */
  terminal: boolean;
  kill: KillAction[];
  start: StartAction[];
  /** Dead containers to remove: all but the newest per name. */
  remove: string[];
  /** Sandboxes to stop and remove: every one but the current. */
  removeSandboxes: string[];
}

const alive = (c: ObservedContainer | undefined) => c?.state === 'running';

/**
 * The pod's spec names another image than the one the container was made
 * from (a pod update may change only that): the kubelet kills it and starts
 * it again from the new image, whatever the restart policy. A container made
 * before the image was recorded is taken as unchanged.
 */
function imageChanged(spec: Container, c: ObservedContainer): boolean {
  const was = c.annotations?.[CONTAINER_IMAGE_ANNOTATION];
  return was !== undefined && spec.image !== undefined && was !== spec.image;
}
const changedReason = (name: string) => `Container ${name} definition changed, will be restarted`;

export function kindOf(c: Container, init: boolean): ContainerKind {
  if (!init) return 'app';
  return c.restartPolicy === 'Always' ? 'sidecar' : 'init';
}

export function computePodActions(pod: Pod, observed: ObservedPod, probes: ProbeView): PodActions {
  const spec = pod.spec!;
  const policy = spec.restartPolicy ?? 'Always';
  const initContainers = spec.initContainers ?? [];
  const actions: PodActions = { createSandbox: false, sandboxAttempt: 0, terminal: false, kill: [], start: [], remove: [], removeSandboxes: [] };

  const sandbox = observed.sandboxes[0];
  const newestByName = new Map<string, ObservedContainer>();
  for (const c of observed.containers) if (!newestByName.has(c.name)) newestByName.set(c.name, c);
  const nextCount = (name: string) => {
    const n = newestByName.get(name);
    return n ? n.restartCount + 1 : 0;
  };

  // Garbage: keep the newest instance of each name, and the newest dead one
  // behind a live one (its lastState and `logs --previous`).
  const kept = new Map<string, { live: boolean; dead: boolean }>();
  const wanted = new Set([...initContainers, ...spec.containers].map((c) => c.name));
  for (const c of observed.containers) {
    const k = kept.get(c.name) ?? { live: false, dead: false };
    kept.set(c.name, k);
    const dead = c.state === 'exited';
    if (!wanted.has(c.name)) {
      if (dead) actions.remove.push(c.id);
      else actions.kill.push({ id: c.id, name: c.name, reason: `Container ${c.name} is not in the pod's spec`, remove: true });
      continue;
    }
    if (dead) {
      if (k.dead) actions.remove.push(c.id);
      k.dead = true;
    } else if (!k.live && !k.dead && (!sandbox || c.sandboxId === sandbox.id)) {
      k.live = true;
    } else {
      actions.kill.push({ id: c.id, name: c.name, reason: `Container ${c.name} is a stale instance`, remove: true });
    }
  }
  for (const sb of observed.sandboxes.slice(1)) actions.removeSandboxes.push(sb.id);

  const restartable = (c: ObservedContainer) => policy === 'Always' || (policy === 'OnFailure' && c.exitCode !== 0);

  // A pod that has finished stays finished, whatever became of its sandbox.
  if (policy !== 'Always') {
    const appsFinished = spec.containers.every((ac) => {
      const n = newestByName.get(ac.name);
      return n !== undefined && n.state === 'exited' && !restartable(n);
    });
    const initFailed =
      policy === 'Never' &&
      initContainers.some((ic) => {
        const n = newestByName.get(ic.name);
        return kindOf(ic, true) === 'init' && n !== undefined && n.state === 'exited' && n.exitCode !== 0;
      });
    if (appsFinished || initFailed) {
      actions.terminal = true;
      for (const c of observed.containers) {
        if (c.state !== 'exited' && !actions.kill.some((k) => k.id === c.id)) actions.kill.push({ id: c.id, name: c.name, reason: 'Pod has finished', remove: false });
      }
      return actions;
    }
  }

  let current = new Map<string, ObservedContainer>();
  if (sandbox) for (const c of observed.containers) if (c.sandboxId === sandbox.id && !current.has(c.name)) current.set(c.name, c);

  if (!sandbox || !sandbox.ready) {
    const ran = observed.containers.some((c) => c.kind !== 'sidecar' && (c.state === 'exited' || c.state === 'running'));
    if (sandbox && policy === 'Never' && ran) {
      // The kubelet does not give a Never pod whose containers ran a second sandbox.
      actions.terminal = true;
      for (const c of current.values()) if (alive(c)) actions.kill.push({ id: c.id, name: c.name, reason: 'Pod sandbox is gone', remove: false });
      return actions;
    }
    actions.createSandbox = true;
    actions.sandboxAttempt = sandbox ? sandbox.attempt + 1 : 0;
    for (const c of observed.containers) {
      if (c.state !== 'exited' && !actions.kill.some((k) => k.id === c.id)) actions.kill.push({ id: c.id, name: c.name, reason: 'Pod sandbox changed, it will be killed and re-created', remove: false });
    }
    if (sandbox) actions.removeSandboxes.push(sandbox.id);
    current = new Map();
  }

  const appStarted = spec.containers.some((c) => current.has(c.name));

  // Init containers in order; sidecars started (and kept running) among them.
  let initialized = true;
  let initFailed = false;
  for (const ic of initContainers) {
    const kind = kindOf(ic, true);
    const c = current.get(ic.name);
    if (kind === 'sidecar') {
      if (c && alive(c) && imageChanged(ic, c)) {
        actions.kill.push({ id: c.id, name: ic.name, reason: changedReason(ic.name), remove: false });
        actions.start.push({ container: ic, kind, restartCount: nextCount(ic.name), lastFinishedAt: 0 });
        if (!appStarted) {
          initialized = false;
          break;
        }
        continue;
      }
      if (c && alive(c)) {
        const why = probes.unhealthy(ic.name);
        if (why) actions.kill.push({ id: c.id, name: ic.name, reason: why, remove: false, graceSeconds: probeGrace(ic) });
        if (!appStarted && (why || !probes.started(ic.name))) {
          initialized = false;
          break;
        }
        continue;
      }
      actions.start.push({ container: ic, kind, restartCount: nextCount(ic.name), lastFinishedAt: c?.finishedAt ?? 0 });
      if (!appStarted) {
        initialized = false;
        break;
      }
      continue;
    }
    if (appStarted) continue;
    if (!c) {
      actions.start.push({ container: ic, kind, restartCount: nextCount(ic.name), lastFinishedAt: 0 });
      initialized = false;
      break;
    }
    if (c.state !== 'exited') {
      initialized = false;
      break;
    }
    if (c.exitCode === 0) continue;
    initialized = false;
    if (policy === 'Never') initFailed = true;
    else actions.start.push({ container: ic, kind, restartCount: nextCount(ic.name), lastFinishedAt: c.finishedAt });
    break;
  }

  let appsDone = spec.containers.length > 0;
  if (initialized) {
    for (const ac of spec.containers) {
      const c = current.get(ac.name);
      if (!c) {
        actions.start.push({ container: ac, kind: 'app', restartCount: nextCount(ac.name), lastFinishedAt: 0 });
        appsDone = false;
        continue;
      }
      if ((alive(c) || c.state === 'created') && imageChanged(ac, c)) {
        appsDone = false;
        actions.kill.push({ id: c.id, name: ac.name, reason: changedReason(ac.name), remove: false });
        actions.start.push({ container: ac, kind: 'app', restartCount: nextCount(ac.name), lastFinishedAt: 0 });
        continue;
      }
      if (alive(c) || c.state === 'created') {
        appsDone = false;
        const why = probes.unhealthy(ac.name);
        if (why) actions.kill.push({ id: c.id, name: ac.name, reason: why, remove: false, graceSeconds: probeGrace(ac) });
        continue;
      }
      if (c.state === 'unknown') {
        appsDone = false;
        continue;
      }
      if (restartable(c)) {
        appsDone = false;
        actions.start.push({ container: ac, kind: 'app', restartCount: nextCount(ac.name), lastFinishedAt: c.finishedAt });
      }
    }
  } else {
    appsDone = false;
  }

  if (initFailed || (appsDone && policy !== 'Always')) {
    actions.terminal = true;
    actions.start = [];
    for (const c of current.values()) {
      if (alive(c) && !actions.kill.some((k) => k.id === c.id)) actions.kill.push({ id: c.id, name: c.name, reason: 'Pod has finished', remove: false });
    }
  }
  return actions;
}
