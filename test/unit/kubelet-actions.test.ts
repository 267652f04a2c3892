import type { Container, Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { computePodActions, type ProbeView } from '../../src/kubelet-lite/actions.js';
import { buildPodStatus, podPhase } from '../../src/kubelet-lite/pod-status.js';
import type { ObservedContainer, ObservedPod } from '../../src/kubelet-lite/runtime-state.js';

const healthy: ProbeView = { unhealthy: () => undefined, started: () => true };

function pod(spec: Partial<NonNullable<Pod['spec']>>): Pod {
  return { metadata: { name: 'p', namespace: 'default', uid: 'u1' }, spec: { containers: [{ name: 'app', image: 'img' }], ...spec } };
}

let seq = 0;
function ctr(name: string, state: ObservedContainer['state'], extra: Partial<ObservedContainer> = {}): ObservedContainer {
  seq++;
  return {
    id: `${name}-${seq}`,
    sandboxId: 'sb1',
    name,
    kind: 'app',
    restartCount: 0,
    state,
    createdAt: 1000 + seq,
    startedAt: 1000 + seq,
    finishedAt: state === 'exited' ? 2000 + seq : 0,
    exitCode: 0,
    reason: '',
    message: '',
    image: 'img',
    imageRef: 'sha256:1',
    logPath: '',
    annotations: {},
    ...extra,
  };
}

const sandbox = { id: 'sb1', attempt: 0, ready: true, createdAt: 1, ip: '10.0.0.2', ips: ['10.0.0.2'] };
const observed = (containers: ObservedContainer[], sb = [sandbox]): ObservedPod => ({ sandboxes: sb, containers: [...containers].sort((a, b) => b.createdAt - a.createdAt) });
const names = (a: { container: Container }[]) => a.map((s) => s.container.name);

describe('computePodActions', () => {
  it('kills a running container whose image the pod spec changed and starts it again from the new image, whatever the policy', () => {
    const made = (image: string) => ({ annotations: { 'io.skiff.kubelet-lite/image': image } });
    for (const restartPolicy of ['Always', 'Never'] as const) {
      const p = pod({ restartPolicy, containers: [{ name: 'app', image: 'img:2' }, { name: 'other', image: 'x' }] });
      const app = ctr('app', 'running', { ...made('img:1'), restartCount: 3 });
      const a = computePodActions(p, observed([app, ctr('other', 'running', made('x'))]), healthy);
      expect(a.kill.map((k) => [k.id, k.reason, k.remove]), restartPolicy).toEqual([[app.id, 'Container app definition changed, will be restarted', false]]);
      expect(a.start.map((s) => [s.container.name, s.container.image, s.restartCount, s.lastFinishedAt])).toEqual([['app', 'img:2', 4, 0]]);
      expect(a.terminal).toBe(false);
    }
    // The same image, or a container made before the image was recorded: nothing to do.
    const same = pod({ containers: [{ name: 'app', image: 'img:1' }] });
    expect(computePodActions(same, observed([ctr('app', 'running', made('img:1'))]), healthy).kill).toEqual([]);
    expect(computePodActions(pod({ containers: [{ name: 'app', image: 'img:2' }] }), observed([ctr('app', 'running')]), healthy).kill).toEqual([]);
    // A running sidecar too; a finished init container is not run again.
    const side = pod({ initContainers: [{ name: 'side', image: 's:2', restartPolicy: 'Always' }, { name: 'i1', image: 'i:2' }], containers: [{ name: 'app', image: 'img' }] });
    const s = computePodActions(side, observed([ctr('side', 'running', { kind: 'sidecar', ...made('s:1') }), ctr('i1', 'exited', { kind: 'init', ...made('i:1') }), ctr('app', 'running', made('img'))]), healthy);
    expect(s.kill.map((k) => k.name)).toEqual(['side']);
    expect(names(s.start)).toEqual(['side']);
  });

  it('creates a sandbox and starts the first init container of a new pod', () => {
    const p = pod({ initContainers: [{ name: 'i1', image: 'x' }, { name: 'i2', image: 'x' }] });
    const a = computePodActions(p, { sandboxes: [], containers: [] }, healthy);
    expect(a.createSandbox).toBe(true);
    expect(a.sandboxAttempt).toBe(0);
    expect(names(a.start)).toEqual(['i1']);
  });

  it('runs init containers in order, each to success, then the app containers', () => {
    const p = pod({ initContainers: [{ name: 'i1', image: 'x' }, { name: 'i2', image: 'x' }], containers: [{ name: 'a', image: 'x' }, { name: 'b', image: 'x' }] });
    expect(names(computePodActions(p, observed([ctr('i1', 'running', { kind: 'init' })]), healthy).start)).toEqual([]);
    expect(names(computePodActions(p, observed([ctr('i1', 'exited', { kind: 'init' })]), healthy).start)).toEqual(['i2']);
    const both = observed([ctr('i1', 'exited', { kind: 'init' }), ctr('i2', 'exited', { kind: 'init' })]);
    expect(names(computePodActions(p, both, healthy).start)).toEqual(['a', 'b']);
  });

  it('restarts a failed init container unless the policy is Never, which ends the pod', () => {
    const p = pod({ initContainers: [{ name: 'i1', image: 'x' }] });
    const failed = observed([ctr('i1', 'exited', { kind: 'init', exitCode: 1, restartCount: 2 })]);
    const a = computePodActions(p, failed, healthy);
    expect(names(a.start)).toEqual(['i1']);
    expect(a.start[0]!.restartCount).toBe(3);
    expect(a.start[0]!.lastFinishedAt).toBeGreaterThan(0);
    const never = computePodActions(pod({ ...p.spec, restartPolicy: 'Never' }), failed, healthy);
    expect(never.terminal).toBe(true);
    expect(never.start).toEqual([]);
  });

  it('starts a sidecar before the next init container and waits until it has started', () => {
    const p = pod({ initContainers: [{ name: 'side', image: 'x', restartPolicy: 'Always' }, { name: 'i1', image: 'x' }] });
    expect(names(computePodActions(p, { sandboxes: [], containers: [] }, healthy).start)).toEqual(['side']);
    const running = observed([ctr('side', 'running', { kind: 'sidecar' })]);
    const notStarted: ProbeView = { unhealthy: () => undefined, started: (n) => n !== 'side' };
    expect(names(computePodActions(p, running, notStarted).start)).toEqual([]);
    expect(names(computePodActions(p, running, healthy).start)).toEqual(['i1']);
    // Once the apps run, a dead sidecar is restarted and the init containers are not rerun.
    const later = observed([ctr('side', 'exited', { kind: 'sidecar', exitCode: 1 }), ctr('i1', 'exited', { kind: 'init' }), ctr('app', 'running')]);
    expect(names(computePodActions(p, later, healthy).start)).toEqual(['side']);
  });

  it.each([
    ['Always', 0, true],
    ['Always', 1, true],
    ['OnFailure', 1, true],
    ['OnFailure', 0, false],
    ['Never', 1, false],
    ['Never', 0, false],
  ] as const)('restartPolicy %s with exit %d restarts: %s', (policy, code, restarts) => {
    const p = pod({ restartPolicy: policy });
    const a = computePodActions(p, observed([ctr('app', 'exited', { exitCode: code, restartCount: 4 })]), healthy);
    expect(names(a.start)).toEqual(restarts ? ['app'] : []);
    expect(a.terminal).toBe(!restarts);
    if (restarts) expect(a.start[0]!.restartCount).toBe(5);
  });

  it('kills a container whose liveness probe failed, without removing it', () => {
    const c = ctr('app', 'running');
    const a = computePodActions(pod({}), observed([c]), { unhealthy: () => 'Container app failed liveness probe, will be restarted', started: () => true });
    expect(a.kill).toEqual([{ id: c.id, name: 'app', reason: 'Container app failed liveness probe, will be restarted', remove: false }]);
    expect(a.start).toEqual([]);
  });

  it('re-creates a sandbox that is gone, killing what still runs and counting restarts on', () => {
    const c = ctr('app', 'running', { restartCount: 2 });
    const a = computePodActions(pod({}), observed([c], [{ ...sandbox, ready: false }]), healthy);
    expect(a.createSandbox).toBe(true);
    expect(a.sandboxAttempt).toBe(1);
    expect(a.kill.map((k) => k.id)).toEqual([c.id]);
    expect(a.start[0]!.restartCount).toBe(3);
  });

  it('does not give a Never pod whose containers ran a second sandbox, nor a finished OnFailure pod', () => {
    const ran = observed([ctr('app', 'running')], [{ ...sandbox, ready: false }]);
    const never = computePodActions(pod({ restartPolicy: 'Never' }), ran, healthy);
    expect(never.createSandbox).toBe(false);
    expect(never.terminal).toBe(true);
    const done = computePodActions(pod({ restartPolicy: 'OnFailure' }), observed([ctr('app', 'exited')], [{ ...sandbox, ready: false }]), healthy);
    expect(done.createSandbox).toBe(false);
    expect(done.terminal).toBe(true);
  });

  it('keeps only the newest dead instance per container, and removes containers the spec dropped', () => {
    const old1 = ctr('app', 'exited', { restartCount: 0 });
    const old2 = ctr('app', 'exited', { restartCount: 1 });
    const cur = ctr('app', 'running', { restartCount: 2 });
    const gone = ctr('removed', 'exited');
    const a = computePodActions(pod({}), observed([old1, old2, cur, gone]), healthy);
    expect(a.remove.sort()).toEqual([old1.id, gone.id].sort());
  });

  it('stops sidecars when a Never pod finishes', () => {
    const p = pod({ restartPolicy: 'Never', initContainers: [{ name: 'side', image: 'x', restartPolicy: 'Always' }] });
    const side = ctr('side', 'running', { kind: 'sidecar' });
    const a = computePodActions(p, observed([side, ctr('app', 'exited')]), healthy);
    expect(a.terminal).toBe(true);
    expect(a.kill.map((k) => k.id)).toEqual([side.id]);
  });
});

describe('pod status', () => {
  const base = { waiting: new Map(), ready: () => true, started: () => true, terminationMessage: () => undefined, runtimeName: 'skiff', hostIP: '192.0.2.1', qosClass: 'BestEffort', startTime: 0, now: 5000 };

  it('shows CrashLoopBackOff with the last termination, and the phase stays Running', () => {
    const dead = ctr('app', 'exited', { exitCode: 2, restartCount: 3 });
    const s = buildPodStatus({ ...base, pod: pod({}), observed: observed([dead]), waiting: new Map([['app', { reason: 'CrashLoopBackOff', message: 'back-off 40s' }]]) });
    const cs = s.containerStatuses![0]!;
    expect(cs.state?.waiting?.reason).toBe('CrashLoopBackOff');
    expect(cs.lastState?.terminated?.exitCode).toBe(2);
    expect(cs.restartCount).toBe(3);
    expect(cs.containerID).toBe(`skiff://${dead.id}`);
    expect(s.phase).toBe('Running');
    expect(s.conditions!.find((c) => c.type === 'Ready')!.status).toBe('False');
  });

  it('is Ready only when every container is running and ready', () => {
    const p = pod({ containers: [{ name: 'a', image: 'x' }, { name: 'b', image: 'x' }] });
    const obs = observed([ctr('a', 'running'), ctr('b', 'running')]);
    const ready = buildPodStatus({ ...base, pod: p, observed: obs });
    expect(ready.phase).toBe('Running');
    expect(ready.conditions!.find((c) => c.type === 'Ready')!.status).toBe('True');
    expect(ready.podIP).toBe('10.0.0.2');
    const half = buildPodStatus({ ...base, pod: p, observed: obs, ready: (n) => n === 'a' });
    const cond = half.conditions!.find((c) => c.type === 'Ready')!;
    expect(cond.status).toBe('False');
    expect(cond.message).toBe('containers with unready status: [b]');
  });

  it.each([
    ['Never', [1], 'Failed'],
    ['Never', [0], 'Succeeded'],
    ['OnFailure', [0], 'Succeeded'],
    ['Always', [0], 'Running'],
  ] as const)('a %s pod whose container exited %j is %s', (policy, codes, phase) => {
    const p = pod({ restartPolicy: policy });
    const s = buildPodStatus({ ...base, pod: p, observed: observed(codes.map((c) => ctr('app', 'exited', { exitCode: c }))) });
    expect(s.phase).toBe(phase);
    expect(podPhase(p, [], s.containerStatuses!)).toBe(phase);
  });

  it('is Pending with PodInitializing apps while an init container runs', () => {
    const p = pod({ initContainers: [{ name: 'i', image: 'x' }] });
    const s = buildPodStatus({ ...base, pod: p, observed: observed([ctr('i', 'running', { kind: 'init' })]) });
    expect(s.phase).toBe('Pending');
    expect(s.containerStatuses![0]!.state?.waiting?.reason).toBe('PodInitializing');
    expect(s.conditions!.find((c) => c.type === 'Initialized')!.status).toBe('False');
  });
});
