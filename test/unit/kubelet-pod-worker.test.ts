/**
 * PodWorker against a fake CRI runtime and fake time: the order containers
 * start in, restart policies, the kubelet's crash-loop back-off, a sandbox
 * that dies, graceful termination, a deletion during a start, and image
 * pull failures. The worker's real collaborators run (computePodActions,
 * KubeletConfigBuilder, ImageManager, Backoff, RuntimeObserver, the hook
 * runner, pod status); only the runtime, volumes, prober and clock are fakes.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import type { ContainerStatus, PodStatus } from 'kubernetes-types/core/v1.js';
import { afterEach, describe, expect, it } from 'vitest';
import { Backoff, CONTAINER_BACKOFF } from '../../src/kubelet-lite/backoff.js';
import { KubeletConfigBuilder, terminationLogHostPath } from '../../src/kubelet-lite/cri-config.js';
import { runHook } from '../../src/kubelet-lite/hooks.js';
import { ImageManager } from '../../src/kubelet-lite/images.js';
import { POD_UID_LABEL, type PodContext } from '../../src/kubelet-lite/model.js';
import { PodWorker, type WorkerDeps } from '../../src/kubelet-lite/pod-worker.js';
import { qosClass } from '../../src/kubelet-lite/resources.js';
import { RuntimeObserver } from '../../src/kubelet-lite/runtime-state.js';
import { validatePod } from '../../src/kubelet-lite/validate.js';
import { silentLogger } from '../../src/log.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { FakeCri } from '../helpers/fake-cri.js';
import { FakeProber, FakeVolumes, TestManifests } from '../helpers/kubelet-parts.js';

const IMAGE = 'example.test/app:1';

interface Recorded {
  type: string;
  reason: string;
  message: string;
  container?: string;
}

interface Harness {
  clock: FakeClock;
  rt: FakeCri;
  worker: PodWorker;
  uid: string;
  prober: FakeProber;
  volumes: FakeVolumes;
  events: Recorded[];
  statuses: PodStatus[];
  /** The latest status of container `name` (app or init). */
  container(name: string): ContainerStatus;
}

let current: { h: Harness; root: string } | undefined;

afterEach(async () => {
  if (!current) return;
  current.h.worker.halt();
  // A sync in flight finishes on fake time before the timers go back to real ones.
  await current.h.clock.settle();
  current.h.clock.uninstall();
  await fs.rm(current.root, { recursive: true, force: true });
  current = undefined;
});

/** A worker for the pod in `yaml`, started as the agent starts one, with the runtime's events waking it as the agent's do. */
async function worker(yaml: string, setup: (rt: FakeCri) => void = (rt) => void rt.addImage(IMAGE), extra: Partial<WorkerDeps> = {}): Promise<Harness> {
  const root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-pod-worker-'));
  const clock = new FakeClock();
  const rt = new FakeCri({ now: clock.now });
  setup(rt);
  const manifests = new TestManifests('node-a');
  manifests.write('pod.yaml', yaml);
  const [obj] = manifests.store.list('Pod');
  expect(manifests.problems()).toEqual([]);
  const v = validatePod(obj!);
  if (!v.ok) throw new Error(v.reasons.join('; '));
  const pod = v.pod;
  pod.metadata = { ...pod.metadata, uid: obj!.uid, creationTimestamp: new Date(clock.now()).toISOString() };
  const uid = obj!.uid;
  const ctx: PodContext = {
    pod,
    uid,
    nodeName: 'node-a',
    hostIP: '192.0.2.10',
    clusterDomain: 'cluster.local',
    clusterDNS: ['10.96.0.10'],
    hostResolvConf: 'nameserver 192.0.2.53\n',
    podDir: path.join(root, 'pods', uid),
    objects: manifests.store,
  };
  const prober = new FakeProber();
  const volumes = new FakeVolumes();
  const events: Recorded[] = [];
  const statuses: PodStatus[] = [];
  const w = new PodWorker(
    uid,
    {
      cri: rt,
      observer: new RuntimeObserver(rt),
      builder: new KubeletConfigBuilder({ node: { milliCpu: 4000, memoryBytes: 8 * 2 ** 30 } }),
      volumes,
      prober,
      hooks: (handler, target, timeoutMs) => runHook(handler, target, rt, timeoutMs),
      images: new ImageManager(rt, clock.now),
      backoff: new Backoff(CONTAINER_BACKOFF),
      events: { record: (_pod, type, reason, message, container) => void events.push({ type, reason, message, container }) },
      log: silentLogger,
      runtimeName: () => 'fake',
      qosClass,
      terminationLogPath: terminationLogHostPath,
      now: clock.now,
      onStatus: (_uid, _pod, status) => void statuses.push(structuredClone(status)),
      ...extra,
    },
    ctx,
  );
  rt.containerEvents(
    (e) => {
      if (e.podSandboxStatus?.labels[POD_UID_LABEL] === uid) w.schedule(0);
    },
    () => undefined,
  );
  const h: Harness = {
    clock,
    rt,
    worker: w,
    uid,
    prober,
    volumes,
    events,
    statuses,
    container(name) {
      const s = statuses.at(-1);
      const c = [...(s?.initContainerStatuses ?? []), ...(s?.containerStatuses ?? [])].find((x) => x.name === name);
      if (!c) throw new Error(`no status for container ${name}`);
      return c;
    },
  };
  current = { h, root };
  w.schedule(0);
  await clock.advance(0);
  return h;
}

/** The one running instance of `name`. */
function running(h: Harness, name: string) {
  const c = h.rt.containersNamed(h.uid, name).find((x) => x.state === 'CONTAINER_RUNNING');
  if (!c) throw new Error(`${name} is not running: ${JSON.stringify(h.rt.containersNamed(h.uid, name).map((x) => x.state))}`);
  return c;
}

/** Consecutive repeats dropped. */
const changes = <T>(xs: T[]) => xs.filter((x, i) => i === 0 || JSON.stringify(x) !== JSON.stringify(xs[i - 1]));

describe('PodWorker: starting a pod', () => {
  it('runs init containers one at a time, each to success, then starts the app containers', async () => {
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: ordered, namespace: default}
spec:
  initContainers:
  - {name: init-a, image: ${IMAGE}}
  - {name: init-b, image: ${IMAGE}}
  containers:
  - {name: web, image: ${IMAGE}}
  - {name: side, image: ${IMAGE}}
`);
    expect(h.rt.callsOf('runPodSandbox').map((c) => (c.req as { config: { metadata: { attempt: number } } }).config.metadata.attempt)).toEqual([0]);
    expect(h.rt.containerOps()).toEqual(['createContainer init-a', 'startContainer init-a']);
    expect(h.statuses.at(-1)?.phase).toBe('Pending');
    expect(h.container('web').state?.waiting?.reason).toBe('PodInitializing');

    h.rt.exit(running(h, 'init-a').id, 0);
    await h.clock.advance(0);
    expect(h.rt.containerOps().slice(2)).toEqual(['createContainer init-b', 'startContainer init-b']);

    h.rt.exit(running(h, 'init-b').id, 0);
    await h.clock.advance(0);
    expect(h.rt.containerOps().slice(4)).toEqual(['createContainer web', 'startContainer web', 'createContainer side', 'startContainer side']);
    const s = h.statuses.at(-1)!;
    expect(s.phase).toBe('Running');
    expect(s.initContainerStatuses?.map((c) => c.state?.terminated?.reason)).toEqual(['Completed', 'Completed']);
    expect(s.conditions?.find((c) => c.type === 'Initialized')?.status).toBe('True');
    expect(s.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
    // Every container the worker made carries the labels a restarted agent finds it by.
    for (const c of h.rt.containers.values()) expect(c.config.labels).toMatchObject({ [POD_UID_LABEL]: h.uid, 'io.skiff.kubelet-lite/node': 'node-a' });
    // Init containers are handed to the prober too (it runs no probes for them).
    expect(h.prober.added.map((a) => a.name)).toEqual(['init-a', 'init-b', 'web', 'side']);
  });

  it('stops starting init containers when one fails, and tries it again (restartPolicy Always)', async () => {
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: initfail, namespace: default}
spec:
  initContainers:
  - {name: init-a, image: ${IMAGE}}
  containers:
  - {name: web, image: ${IMAGE}}
`);
    h.rt.exit(running(h, 'init-a').id, 3);
    await h.clock.advance(0);
    expect(h.rt.containerOps()).toEqual(['createContainer init-a', 'startContainer init-a', 'createContainer init-a', 'startContainer init-a']);
    expect(h.container('init-a').restartCount).toBe(1);
    expect(h.container('init-a').lastState?.terminated?.exitCode).toBe(3);
    expect(h.statuses.at(-1)?.phase).toBe('Pending');
  });
});

describe('PodWorker: restart policies', () => {
  it.each([
    { policy: 'Always', code: 0, restarts: true, phase: 'Running' },
    { policy: 'Always', code: 1, restarts: true, phase: 'Running' },
    { policy: 'OnFailure', code: 0, restarts: false, phase: 'Succeeded' },
    { policy: 'OnFailure', code: 1, restarts: true, phase: 'Running' },
    { policy: 'Never', code: 0, restarts: false, phase: 'Succeeded' },
    { policy: 'Never', code: 1, restarts: false, phase: 'Failed' },
  ])('restartPolicy $policy, exit code $code: restarted=$restarts, phase $phase', async ({ policy, code, restarts, phase }) => {
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: policy, namespace: default}
spec:
  restartPolicy: ${policy}
  containers:
  - {name: app, image: ${IMAGE}}
`);
    const first = running(h, 'app');
    const sandbox = h.rt.sandboxesOf(h.uid)[0]!;
    h.rt.exit(first.id, code);
    await h.clock.advance(0);
    const instances = h.rt.containersNamed(h.uid, 'app');
    expect(h.statuses.at(-1)?.phase).toBe(phase);
    if (restarts) {
      // The first restart is at once; the old instance is kept for lastState.
      expect(instances.map((c) => c.state)).toEqual(['CONTAINER_RUNNING', 'CONTAINER_EXITED']);
      expect(instances[0]!.config.annotations?.['io.kubernetes.container.restartCount']).toBe('1');
      expect(instances[0]!.config.metadata?.attempt).toBe(1);
      expect(h.container('app').restartCount).toBe(1);
      expect(h.container('app').lastState?.terminated).toMatchObject({ exitCode: code, reason: code === 0 ? 'Completed' : 'Error' });
      expect(sandbox.state).toBe('SANDBOX_READY');
    } else {
      expect(instances.map((c) => c.state)).toEqual(['CONTAINER_EXITED']);
      expect(h.container('app').state?.terminated?.exitCode).toBe(code);
      // A finished pod's sandbox is stopped (not removed: the pod is still shown).
      expect(sandbox.state).toBe('SANDBOX_NOTREADY');
      expect(h.rt.sandboxes.has(sandbox.id)).toBe(true);
      // ... and it stays finished.
      await h.clock.advance(5 * 60_000);
      expect(h.rt.callsOf('createContainer')).toHaveLength(1);
      expect(h.rt.callsOf('runPodSandbox')).toHaveLength(1);
    }
  });
});

describe('PodWorker: crash-loop back-off', () => {
  it('waits 10 s, doubling to 5 min, between restarts of a container that keeps dying, shown as CrashLoopBackOff', async () => {
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: crash, namespace: default}
spec:
  containers:
  - {name: app, image: ${IMAGE}}
`, (rt) => {
      rt.addImage(IMAGE);
      rt.onStart = (c) => rt.exit(c.id, 1);
    });
    await h.clock.advance(915_000);
    const starts = h.rt.callsOf('startContainer').map((c) => c.at);
    const gaps = starts.slice(1).map((t, i) => t - starts[i]!);
    expect(gaps.slice(0, 8)).toEqual([0, 10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]);

    const waiting = changes(h.statuses.map((s) => s.containerStatuses?.[0]?.state?.waiting).filter((w) => w?.reason === 'CrashLoopBackOff').map((w) => w!.message));
    const pod = `crash_default(${h.uid})`;
    expect(waiting).toEqual(['10s', '20s', '40s', '1m20s', '2m40s', '5m0s'].map((d) => `back-off ${d} restarting failed container=app pod=${pod}`));
    expect(h.events.filter((e) => e.reason === 'BackOff')[0]).toEqual({ type: 'Warning', reason: 'BackOff', message: 'Back-off restarting failed container', container: 'app' });
    const s = h.statuses.at(-1)!;
    expect(s.phase).toBe('Running');
    expect(s.containerStatuses?.[0]?.restartCount).toBe(starts.length - 1);
  });

  it.each([
    { ranMin: 9, waits: [20_000, 40_000] },
    { ranMin: 11, waits: [0, 10_000] },
  ])('a container that ran $ranMin min before dying waits $waits (the back-off resets after 10 min)', async ({ ranMin, waits }) => {
    let n = 0;
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: flappy, namespace: default}
spec:
  containers:
  - {name: app, image: ${IMAGE}}
`, (rt) => {
      rt.addImage(IMAGE);
      rt.onStart = (c) => {
        // The third instance runs a while; the others die at once.
        if (++n === 3) setTimeout(() => rt.exit(c.id, 1), ranMin * 60_000).unref();
        else rt.exit(c.id, 1);
      };
    });
    await h.clock.advance(ranMin * 60_000 + 120_000);
    const starts = h.rt.callsOf('startContainer').map((c) => c.at);
    expect(starts.length).toBeGreaterThanOrEqual(5);
    // Dead instances older than the last are removed from the runtime; the fake remembers them.
    const third = [...h.rt.everCreated.values()].find((c) => c.config.metadata?.attempt === 2)!;
    const died = Math.floor(third.finishedAt / 1e6);
    expect([starts[3]! - died, starts[4]! - starts[3]!]).toEqual(waits);
  });
});

describe('PodWorker: the sandbox', () => {
  it('makes a new sandbox with attempt+1 when the old one dies, keeping the restart count', async () => {
    const h = await worker(`
apiVersion: v1
kind: Pod
metadata: {name: phoenix, namespace: default}
spec:
  containers:
  - {name: app, image: ${IMAGE}}
`);
    const old = h.rt.sandboxesOf(h.uid)[0]!;
    h.rt.killSandbox(old.id);
    await h.clock.advance(0);
    const attempts = h.rt.callsOf<{ config: { metadata: { attempt: number } } }>('runPodSandbox').map((c) => c.req.config.metadata.attempt);
    expect(attempts).toEqual([0, 1]);
    expect(h.rt.sandboxes.has(old.id)).toBe(false);
    const [now] = h.rt.sandboxesOf(h.uid);
    expect(now?.state).toBe('SANDBOX_READY');
    const app = running(h, 'app');
    expect(app.sandboxId).toBe(now!.id);
    expect(app.config.metadata?.attempt).toBe(1);
    expect(h.events.map((e) => e.reason)).toContain('SandboxChanged');
    const s = h.statuses.at(-1)!;
    expect(s.phase).toBe('Running');
    expect(s.podIP).toBe(now!.ip);
    expect(s.containerStatuses?.[0]?.restartCount).toBe(1);
  });

  it('shows FailedCreatePodSandBox and tries again when RunPodSandbox fails', async () => {
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: nosandbox, namespace: default}
spec:
  containers:
  - {name: app, image: ${IMAGE}}
`,
      (rt) => {
        rt.addImage(IMAGE);
        rt.fail('runPodSandbox', grpc.status.UNKNOWN, 'failed to set up the network: no IP addresses left');
      },
    );
    expect(h.statuses.at(-1)).toMatchObject({ phase: 'Pending', reason: 'FailedCreatePodSandBox', message: 'Failed to create pod sandbox: failed to set up the network: no IP addresses left' });
    await h.clock.advance(4_000);
    expect(h.rt.callsOf('runPodSandbox').map((c) => c.at - h.rt.calls[0]!.at)).toEqual([0, 4_000]);
    expect(h.statuses.at(-1)?.phase).toBe('Running');
  });
});

describe('PodWorker: the pod network fence (podNetworkReady)', () => {
  it('is called with the sandbox IP before any container is created; a failure holds every container back and is tried again', async () => {
    const calls: Array<{ ip: string; containersBefore: number }> = [];
    let fail = true;
    let rt!: FakeCri;
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: fenced, namespace: default}
spec:
  initContainers:
  - {name: init, image: ${IMAGE}}
  containers:
  - {name: app, image: ${IMAGE}}
`,
      (r) => {
        rt = r;
        r.addImage(IMAGE);
      },
      {
        podNetworkReady: async (_pod, ip) => {
          calls.push({ ip, containersBefore: rt.containerOps().length });
          if (fail) throw new Error('nft -f failed (exit 1): no table');
        },
      },
    );
    expect(calls.length).toBe(1);
    expect(calls[0]!.ip).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(calls[0]!.containersBefore).toBe(0);
    expect(h.rt.containerOps()).toEqual([]);
    expect(h.events.map((e) => [e.type, e.reason])).toContainEqual(['Warning', 'NetworkNotReady']);
    expect(h.statuses.at(-1)).toMatchObject({ phase: 'Pending', reason: 'NetworkNotReady' });
    fail = false;
    await h.clock.advance(4_000);
    expect(calls.length).toBe(2);
    expect(h.rt.containerOps().slice(0, 2)).toEqual(['createContainer init', 'startContainer init']);
    // Once fenced, the same sandbox is not fenced again for its next containers.
    h.rt.exit(running(h, 'init').id, 0);
    await h.clock.advance(0);
    expect(h.rt.containerOps().slice(2)).toEqual(['createContainer app', 'startContainer app']);
    expect(calls.length).toBe(2);
  });
});

describe('PodWorker: termination', () => {
  it.each([
    { what: 'a 5 s preStop, grace 30 s', grace: 30, preStopMs: 5_000, stopAfter: 5_000, timeout: 25, hookFailed: false },
    { what: 'no preStop, grace 10 s', grace: 10, preStopMs: undefined, stopAfter: 0, timeout: 10, hookFailed: false },
    { what: 'a preStop outlasting grace 10 s', grace: 10, preStopMs: 60_000, stopAfter: 10_000, timeout: 0, hookFailed: true },
  ])('$what: preStop, then StopContainer with what is left of the grace period, then everything removed', async ({ grace, preStopMs, stopAfter, timeout, hookFailed }) => {
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: graceful, namespace: default}
spec:
  terminationGracePeriodSeconds: ${grace}
  containers:
  - name: app
    image: ${IMAGE}
${preStopMs === undefined ? '' : '    lifecycle: {preStop: {exec: {command: [/bin/drain]}}}'}
`,
      (rt) => {
        rt.addImage(IMAGE);
        // The process ignores SIGTERM: only the SIGKILL at the end of the grace period stops it.
        rt.stopSignal = () => 'ignore';
        rt.exec = () => new Promise((resolve) => setTimeout(() => resolve({ exitCode: 0 }), preStopMs ?? 0).unref());
      },
    );
    const app = running(h, 'app');
    const sandbox = h.rt.sandboxesOf(h.uid)[0]!;
    const t0 = h.clock.now();
    h.worker.update(undefined);
    await h.clock.advance(60_000);

    const execs = h.rt.callsOf<{ cmd: string[] }>('execSync');
    expect(execs.map((c) => c.req.cmd)).toEqual(preStopMs === undefined ? [] : [['/bin/drain']]);
    const stops = h.rt.callsOf<{ containerId: string; timeout: number }>('stopContainer');
    expect(stops.map((c) => [c.req.containerId, c.req.timeout, c.at - t0])).toEqual([[app.id, timeout, stopAfter]]);
    expect(Math.floor(app.finishedAt / 1e6) - t0).toBe(stopAfter + timeout * 1000);
    expect(app.exitCode).toBe(137);
    expect(h.events.some((e) => e.reason === 'FailedPreStopHook')).toBe(hookFailed);
    expect(h.events.find((e) => e.reason === 'Killing')).toMatchObject({ message: 'Stopping container app', container: 'app' });

    const order = h.rt.calls.map((c) => c.method).filter((m) => ['execSync', 'stopContainer', 'removeContainer', 'stopPodSandbox', 'removePodSandbox'].includes(m));
    expect(changes(order)).toEqual([...(preStopMs === undefined ? [] : ['execSync']), 'stopContainer', 'removeContainer', 'stopPodSandbox', 'removePodSandbox']);
    expect(h.rt.containers.size).toBe(0);
    expect(h.rt.sandboxes.has(sandbox.id)).toBe(false);
    expect(h.worker.isTerminated).toBe(true);
    expect(h.volumes.calls.at(-1)).toBe(`tearDown ${h.uid}`);
    expect(h.prober.removedPods).toEqual([h.uid]);
  });

  it('a deletion that arrives while a container is being created stops the rest of the start', async () => {
    let gate: ReturnType<FakeCri['hold']> | undefined;
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: many, namespace: default}
spec:
  containers:
  - {name: a, image: ${IMAGE}}
  - {name: b, image: ${IMAGE}}
  - {name: c, image: ${IMAGE}}
`,
      (rt) => {
        rt.addImage(IMAGE);
        gate = rt.hold<{ config: { metadata: { name: string } } }>('createContainer', (r) => r.config.metadata.name === 'b');
      },
    );
    await gate!.reached;
    expect(h.rt.containerOps()).toEqual(['createContainer a', 'startContainer a', 'createContainer b']);
    h.worker.update(undefined);
    gate!.release();
    await h.clock.advance(60_000);
    expect(h.rt.containerOps('createContainer')).toEqual(['createContainer a', 'createContainer b']);
    expect(h.rt.containers.size).toBe(0);
    expect(h.rt.sandboxes.size).toBe(0);
    expect(h.worker.isTerminated).toBe(true);
  });

  it('a deletion that arrives during an image pull creates nothing', async () => {
    let gate: ReturnType<FakeCri['hold']> | undefined;
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: pulling, namespace: default}
spec:
  containers:
  - {name: a, image: example.test/big:1}
`,
      (rt) => {
        rt.registry.set('example.test/big:1', {});
        gate = rt.hold('pullImage');
      },
    );
    await gate!.reached;
    h.worker.update(undefined);
    gate!.release();
    await h.clock.advance(60_000);
    expect(h.rt.callsOf('createContainer')).toEqual([]);
    expect(h.rt.sandboxes.size).toBe(0);
    expect(h.worker.isTerminated).toBe(true);
  });
});

describe('PodWorker: images', () => {
  it('shows ErrImagePull, then ImagePullBackOff while the image back-off runs, and starts once a pull works', async () => {
    const image = 'example.test/late:1';
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: late, namespace: default}
spec:
  containers:
  - {name: app, image: ${image}}
`,
      () => undefined,
    );
    const t0 = h.rt.calls[0]!.at;
    const reasons: Array<string | undefined> = [];
    const seen = () => reasons.push(...h.statuses.splice(0).map((s) => s.containerStatuses?.[0]?.state?.waiting?.reason ?? (s.containerStatuses?.[0]?.state?.running ? 'Running' : undefined)));
    expect(h.container('app').state?.waiting?.message).toBe(`Failed to pull image "${image}": failed to pull and unpack image "${image}": failed to resolve reference "${image}": not found`);
    seen();
    await h.clock.advance(5_000);
    expect(h.container('app').state?.waiting).toEqual({ reason: 'ImagePullBackOff', message: `Back-off pulling image "${image}"` });
    await h.clock.advance(15_000);
    // The image appears in the registry; the next pull the back-off allows gets it.
    h.rt.registry.set(image, {});
    await h.clock.advance(15_000);
    seen();
    expect(h.rt.callsOf('pullImage').map((c) => c.at - t0)).toEqual([0, 10_000, 30_000]);
    expect(changes(reasons)).toEqual(['ErrImagePull', 'ImagePullBackOff', 'ErrImagePull', 'ImagePullBackOff', 'Running']);
    expect(changes(h.events.map((e) => e.reason))).toEqual(['Pulling', 'Failed', 'BackOff', 'Pulling', 'Failed', 'BackOff', 'Pulling', 'Pulled', 'Created', 'Started']);
  });

  it('never pulls an image with imagePullPolicy Never: ErrImageNeverPull', async () => {
    const h = await worker(
      `
apiVersion: v1
kind: Pod
metadata: {name: never, namespace: default}
spec:
  containers:
  - {name: app, image: example.test/absent:1, imagePullPolicy: Never}
`,
      () => undefined,
    );
    expect(h.container('app').state?.waiting).toEqual({ reason: 'ErrImageNeverPull', message: 'Container image "example.test/absent:1" is not present with pull policy of Never' });
    expect(h.rt.callsOf('pullImage')).toEqual([]);
  });
});
