/**
 * The Agent against a fake CRI runtime and fake time: adoption of what the
 * runtime already runs, --max-pods, invalid and refused pods, and an edited
 * pod. Manifests go through the real parser and store; the agent's real
 * parts run (validatePod and sysctl admission, KubeletConfigBuilder,
 * computePodActions, Backoff, the event recorder); only the runtime,
 * volumes, prober and clock are fakes.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { Agent } from '../../src/kubelet-lite/agent.js';
import { KubeletConfigBuilder, terminationLogHostPath } from '../../src/kubelet-lite/cri-config.js';
import { EventRecorder } from '../../src/kubelet-lite/events.js';
import { runHook } from '../../src/kubelet-lite/hooks.js';
import { MANAGED_BY_LABEL, NODE_LABEL, POD_UID_LABEL } from '../../src/kubelet-lite/model.js';
import { qosClass } from '../../src/kubelet-lite/resources.js';
import { admitPod, SysctlAllowlist } from '../../src/kubelet-lite/sysctls.js';
import { validatePod } from '../../src/kubelet-lite/validate.js';
import { silentLogger } from '../../src/log.js';
import { FakeClock } from '../helpers/fake-clock.js';
import { FakeCri } from '../helpers/fake-cri.js';
import { FakeProber, FakeVolumes, podYaml, TestManifests } from '../helpers/kubelet-parts.js';
import { API_SOURCE_FILE } from '../../src/stored-object.js';

const NODE = 'node-a';
const IMAGE = 'example.test/app:1';

let root: string;
let clock: FakeClock;
let rt: FakeCri;
let manifests: TestManifests;
const agents: Agent[] = [];

beforeEach(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-agent-'));
  clock = new FakeClock();
  rt = new FakeCri({ now: clock.now });
  rt.addImage(IMAGE);
  manifests = new TestManifests(NODE);
});

afterEach(async () => {
  for (const a of agents.splice(0)) a.stop();
  await clock.settle();
  clock.uninstall();
  await fs.rm(root, { recursive: true, force: true });
});

interface Started {
  agent: Agent;
  prober: FakeProber;
  volumes: FakeVolumes;
}

async function startAgent(opts: { maxPods?: number; allowedUnsafeSysctls?: string[]; admit?: (pod: Pod) => { reason: string; message: string } | undefined } = {}): Promise<Started> {
  const prober = new FakeProber();
  const volumes = new FakeVolumes();
  const sysctls = new SysctlAllowlist(opts.allowedUnsafeSysctls);
  const events = new EventRecorder({ node: NODE, now: () => new Date(clock.now()) });
  const ref = (pod: Pod) => ({ namespace: pod.metadata?.namespace ?? 'default', name: pod.metadata?.name ?? '', uid: pod.metadata?.uid ?? '' });
  const agent = new Agent(
    { nodeName: NODE, rootDir: root, clusterDomain: 'cluster.local', clusterDNS: ['10.96.0.10'], hostResolvConf: 'nameserver 192.0.2.53\n', hostIP: '192.0.2.10', ...(opts.maxPods ? { maxPods: opts.maxPods } : {}) },
    {
      cri: rt,
      manifests,
      validatePod: (obj) => admitPod(validatePod(obj), sysctls),
      builder: new KubeletConfigBuilder({ node: { milliCpu: 4000, memoryBytes: 8 * 2 ** 30 } }),
      volumes,
      prober,
      hooks: (handler, target, timeoutMs) => runHook(handler, target, rt, timeoutMs),
      events: { record: (pod, type, reason, message, container) => void events.record(ref(pod), type, reason, message, container), list: () => events.list() },
      qosClass,
      terminationLogPath: terminationLogHostPath,
      log: silentLogger,
      now: clock.now,
      ...(opts.admit ? { admit: opts.admit } : {}),
    },
  );
  agents.push(agent);
  await agent.start();
  await clock.advance(0);
  return { agent, prober, volumes };
}

const phaseOf = (agent: Agent, name: string) => agent.getPod('default', name)?.status?.phase;
const uidOf = (agent: Agent, name: string) => agent.getPod('default', name)?.metadata?.uid ?? '';

function runningApp(uid: string) {
  const c = rt.containersNamed(uid, 'app').find((x) => x.state === 'CONTAINER_RUNNING');
  if (!c) throw new Error(`the app container of ${uid} is not running`);
  return c;
}

describe('Agent: adoption', () => {
  it('adopts the pods the runtime already runs: no new sandbox, no restart, restart counts kept; stops orphans, leaves other nodes alone', async () => {
    manifests.write('web.yaml', podYaml('web'));
    manifests.write('old.yaml', podYaml('old'));
    const first = await startAgent();
    const web = uidOf(first.agent, 'web');
    const old = uidOf(first.agent, 'old');
    // One crash and restart before the agent goes, so there is a count to keep.
    rt.exit(runningApp(web).id, 1);
    await clock.advance(0);
    const live = runningApp(web);
    expect(first.agent.getPod('default', 'web')?.status?.containerStatuses?.[0]?.restartCount).toBe(1);
    first.agent.stop();
    await clock.settle();

    // While no agent runs, the old pod's manifest goes, and another node's agent has a pod on the same runtime.
    manifests.remove('old.yaml');
    const other = (await rt.runtime.runPodSandbox({
      config: { metadata: { name: 'theirs', namespace: 'default', uid: 'u-other', attempt: 0 }, labels: { [MANAGED_BY_LABEL]: 'true', [NODE_LABEL]: 'node-b', [POD_UID_LABEL]: 'u-other' } },
    })).podSandboxId;
    const mark = rt.calls.length;

    const second = await startAgent();
    await clock.advance(10_000);
    const since = rt.calls.slice(mark).map((c) => c.method);
    expect(since.filter((m) => m === 'runPodSandbox' || m === 'createContainer' || m === 'startContainer')).toEqual([]);
    expect(rt.callsOf<{ containerId: string }>('stopContainer').slice(-1).map((c) => c.req.containerId)).not.toContain(live.id);
    expect(live.state).toBe('CONTAINER_RUNNING');
    const pod = second.agent.getPod('default', 'web')!;
    expect(pod.metadata?.uid).toBe(web);
    expect(pod.status?.phase).toBe('Running');
    expect(pod.status?.containerStatuses?.[0]).toMatchObject({ restartCount: 1, containerID: `fake://${live.id}`, lastState: { terminated: { exitCode: 1 } } });
    // The adopted container is probed as if this agent had started it.
    expect(second.prober.added.map((a) => a.containerId)).toContain(live.id);
    // The orphan is gone; the other node's pod is left alone.
    expect(rt.sandboxesOf(old)).toEqual([]);
    expect(rt.containersNamed(old, 'app')).toEqual([]);
    expect(second.agent.getPod('default', 'old')).toBeUndefined();
    expect(rt.sandboxes.get(other)?.state).toBe('SANDBOX_READY');
  });
});

describe('Agent: --max-pods', () => {
  it('keeps pods beyond the maximum Pending and Unschedulable, and starts the one that waited longest as pods end', async () => {
    manifests.write('b1.yaml', podYaml('p1'));
    manifests.write('b2.yaml', podYaml('p2', { restartPolicy: 'Never' }));
    manifests.write('b3.yaml', podYaml('p3'));
    const { agent } = await startAgent({ maxPods: 2 });
    expect([phaseOf(agent, 'p1'), phaseOf(agent, 'p2')]).toEqual(['Running', 'Running']);
    const p3 = agent.getPod('default', 'p3')!;
    expect(p3.status).toEqual({
      phase: 'Pending',
      conditions: [
        {
          type: 'PodScheduled',
          status: 'False',
          reason: 'Unschedulable',
          message: 'the node runs its maximum of 2 pods (--max-pods); this one starts when one of them ends',
          lastTransitionTime: '2030-01-01T00:00:00Z',
        },
      ],
    });
    expect(rt.sandboxesOf(uidOf(agent, 'p3'))).toEqual([]);

    // A later pod waits behind p3, though its name (and file) sort first.
    manifests.write('a0.yaml', podYaml('p0'));
    await clock.advance(1_000);
    expect(phaseOf(agent, 'p0')).toBe('Pending');
    expect(rt.sandboxesOf(uidOf(agent, 'p0'))).toEqual([]);

    // p1 is deleted: p3 takes its place, p0 still waits.
    manifests.remove('b1.yaml');
    await clock.advance(60_000);
    expect(agent.getPod('default', 'p1')).toBeUndefined();
    expect(phaseOf(agent, 'p3')).toBe('Running');
    expect(phaseOf(agent, 'p0')).toBe('Pending');
    expect(rt.sandboxesOf(uidOf(agent, 'p0'))).toEqual([]);

    // p2 finishes: a finished pod takes no place, p0 starts.
    rt.exit(runningApp(uidOf(agent, 'p2')).id, 0);
    await clock.advance(1_000);
    expect(phaseOf(agent, 'p2')).toBe('Succeeded');
    expect(phaseOf(agent, 'p0')).toBe('Running');
    const running = [...rt.sandboxes.values()].filter((s) => s.state === 'SANDBOX_READY');
    expect(running).toHaveLength(2);
  });
});

describe('Agent: pods that may not run', () => {
  it.each([
    {
      what: 'an invalid container name',
      yaml: podYaml('bad', { container: '  - name: Bad_Name\n    image: example.test/app:1' }),
      sysctls: [],
      reason: 'InvalidManifest',
      message: /^bad\.yaml:\d+: .*spec\.containers\[1\]\.name/,
    },
    {
      what: 'an unsafe sysctl',
      yaml: podYaml('bad', { spec: '  securityContext:\n    sysctls:\n    - {name: kernel.msgmax, value: "65536"}' }),
      sysctls: [],
      reason: 'SysctlForbidden',
      message: /^forbidden sysctl: "kernel\.msgmax" not allowlisted$/,
    },
    {
      what: 'an unsafe sysctl the node allows',
      yaml: podYaml('bad', { spec: '  securityContext:\n    sysctls:\n    - {name: kernel.msgmax, value: "65536"}' }),
      sysctls: ['kernel.msg*'],
      reason: undefined,
      message: undefined,
    },
  ])('$what: $reason', async ({ yaml, sysctls, reason, message }) => {
    manifests.write('bad.yaml', yaml);
    const { agent } = await startAgent({ allowedUnsafeSysctls: sysctls });
    const pod = agent.getPod('default', 'bad')!;
    if (!reason) {
      expect(pod.status?.phase).toBe('Running');
      const [sb] = rt.sandboxesOf(pod.metadata!.uid!);
      expect(sb?.config.linux?.sysctls).toEqual({ 'kernel.msgmax': '65536' });
      return;
    }
    expect(pod.status).toMatchObject({ phase: 'Failed', reason });
    expect(pod.status?.message).toMatch(message!);
    expect(rt.callsOf('runPodSandbox')).toEqual([]);
    await clock.advance(60_000);
    expect(rt.callsOf('runPodSandbox')).toEqual([]);
  });
});

describe('Agent: an edited pod', () => {
  it('stops and removes the old pod, then makes the new one', async () => {
    manifests.write('web.yaml', podYaml('web', { spec: '  terminationGracePeriodSeconds: 5' }));
    const { agent } = await startAgent();
    const before = uidOf(agent, 'web');
    const oldSandbox = rt.sandboxesOf(before)[0]!;
    // The old container takes its whole grace period to stop.
    rt.stopSignal = () => 'ignore';
    const t0 = clock.now();
    manifests.write('web.yaml', podYaml('web', { spec: '  terminationGracePeriodSeconds: 5', container: '    env: [{name: MODE, value: edited}]' }));
    await clock.advance(30_000);

    const after = uidOf(agent, 'web');
    expect(after).not.toBe(before);
    expect(phaseOf(agent, 'web')).toBe('Running');
    expect(rt.sandboxesOf(before)).toEqual([]);
    const methods = rt.calls.map((c) => c.method);
    const removed = rt.calls.findIndex((c) => c.method === 'removePodSandbox' && (c.req as { podSandboxId: string }).podSandboxId === oldSandbox.id);
    const made = rt.calls.findIndex((c, i) => c.method === 'runPodSandbox' && i > 0 && (c.req as { config: { metadata: { uid: string } } }).config.metadata.uid === after);
    expect(removed).toBeGreaterThan(0);
    expect(made).toBeGreaterThan(removed);
    expect(rt.calls[made]!.at - t0).toBe(5_000);
    expect(methods.filter((m) => m === 'runPodSandbox')).toHaveLength(2);
    const env = runningApp(after).config.envs?.find((e) => e.key === 'MODE');
    expect(Buffer.from(env!.value as Uint8Array).toString()).toBe('edited');
  });
});

describe('Agent: eviction', () => {
  it('evicts a pod for good: containers stopped, Failed with reason Evicted and the message, never restarted; refuses a pod at admission', async () => {
    // As the API bridge hands them in: the API's pods (pods from files are static pods, never evicted nor refused).
    manifests.write(API_SOURCE_FILE, podYaml('web'));
    manifests.write('static.yaml', podYaml('static'));
    const { agent } = await startAgent({ admit: (pod) => (pod.metadata?.name === 'besteffort' ? { reason: 'Evicted', message: 'The node had condition: [MemoryPressure]. ' } : undefined) });
    await clock.advance(1_000);
    expect(phaseOf(agent, 'web')).toBe('Running');
    const uid = uidOf(agent, 'web');
    expect(agent.activePods().map((p) => p.metadata?.name)).toEqual(['web']);
    expect(phaseOf(agent, 'static')).toBe('Running');
    const message = 'The node was low on resource: memory. Threshold quantity: 100Mi, available: 51200Ki. ';
    const done = agent.evictPod(uid, message, 1);
    await clock.advance(5_000);
    await done;
    const pod = agent.getPod('default', 'web')!;
    expect(pod.status).toMatchObject({ phase: 'Failed', reason: 'Evicted', message });
    expect(pod.status?.conditions?.find((c) => c.type === 'DisruptionTarget')).toMatchObject({ status: 'True', reason: 'TerminationByKubelet', message });
    expect(pod.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('False');
    expect(rt.containersNamed(uid, 'app').every((c) => c.state === 'CONTAINER_EXITED')).toBe(true);
    expect(rt.sandboxesOf(uid).map((sb) => sb.state)).toEqual(['SANDBOX_NOTREADY']);
    expect(rt.containersNamed(uid, 'app').length).toBe(1);
    expect(agent.listEvents().some((e) => e.reason === 'Evicted' && e.message === message && e.type === 'Warning')).toBe(true);
    expect(agent.activePods()).toEqual([]);
    // restartPolicy Always does not bring it back.
    const started = rt.callsOf('startContainer').length;
    await clock.advance(120_000);
    expect(rt.callsOf('startContainer').length).toBe(started);
    expect(phaseOf(agent, 'web')).toBe('Failed');

    manifests.write(API_SOURCE_FILE, podYaml('web') + '---\n' + podYaml('besteffort'));
    await clock.advance(1_000);
    expect(agent.getPod('default', 'besteffort')?.status).toMatchObject({ phase: 'Failed', reason: 'Evicted', message: 'Pod was rejected: The node had condition: [MemoryPressure]. ' });
    expect(rt.sandboxesOf(uidOf(agent, 'besteffort'))).toEqual([]);
  });
});
