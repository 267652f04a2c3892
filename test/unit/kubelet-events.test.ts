import { describe, expect, it } from 'vitest';
import { EventRecorder } from '../../src/kubelet-lite/events.js';
import { AgentMetrics } from '../../src/kubelet-lite/metrics.js';

const web = { namespace: 'default', name: 'web', uid: 'u1' };

function clock(start = Date.parse('2026-11-30T06:00:00Z')) {
  let t = start;
  return { now: () => new Date(t), advance: (ms: number) => (t += ms) };
}

describe('EventRecorder', () => {
  it('produces core/v1 Events as the kubelet does, with the container as fieldPath', () => {
    const c = clock();
    const rec = new EventRecorder({ node: 'node-a', now: c.now });
    const e = rec.record(web, 'Normal', 'Pulling', 'Pulling image "busybox"', 'main');
    expect(e).toMatchObject({
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { namespace: 'default' },
      involvedObject: { kind: 'Pod', namespace: 'default', name: 'web', uid: 'u1', fieldPath: 'spec.containers{main}' },
      reason: 'Pulling',
      message: 'Pulling image "busybox"',
      type: 'Normal',
      count: 1,
      firstTimestamp: '2026-11-30T06:00:00Z',
      lastTimestamp: '2026-11-30T06:00:00Z',
      source: { component: 'kubelet', host: 'node-a' },
    });
    expect(e.metadata.name).toMatch(/^web\.[0-9a-f]+$/);
    const podLevel = rec.record(web, 'Warning', 'FailedMount', 'MountVolume.SetUp failed for volume "cfg"');
    expect(podLevel.involvedObject.fieldPath).toBeUndefined();
    expect(podLevel.metadata.name).not.toBe(e.metadata.name);
  });

  it('records events about the node itself as the kubelet\'s nodeRef names it, aggregated and bounded apart from the pods\'', () => {
    const c = clock();
    const rec = new EventRecorder({ node: 'node-a', now: c.now, maxPerPod: 3 });
    const e = rec.recordNode('Warning', 'EvictionThresholdMet', 'Attempting to reclaim memory');
    expect(e).toMatchObject({
      metadata: { namespace: 'default' },
      involvedObject: { kind: 'Node', name: 'node-a', uid: 'node-a' },
      reason: 'EvictionThresholdMet',
      message: 'Attempting to reclaim memory',
      type: 'Warning',
      count: 1,
      source: { component: 'kubelet', host: 'node-a' },
    });
    expect(e.involvedObject.namespace).toBeUndefined();
    expect(e.metadata.name).toMatch(/^node-a\.[0-9a-f]+$/);
    c.advance(10_000);
    expect(rec.recordNode('Warning', 'EvictionThresholdMet', 'Attempting to reclaim memory')).toMatchObject({ count: 2, lastTimestamp: '2026-11-30T06:00:10Z' });
    // A pod's events do not push the node's out, and the node's own are bounded like a pod's.
    for (let i = 0; i < 5; i++) rec.record(web, 'Warning', 'BackOff', `message ${i}`);
    for (let i = 0; i < 5; i++) rec.recordNode('Normal', 'NodeHasDiskPressure', `n ${i}`);
    const nodeEvents = rec.list().filter((x) => x.involvedObject.kind === 'Node');
    expect(nodeEvents.map((x) => x.message)).toEqual(['n 2', 'n 3', 'n 4']);
    expect(rec.listFor('default', 'web')).toHaveLength(3);
  });

  it('aggregates a repeat into one event with a count, and keeps different messages apart', () => {
    const c = clock();
    const rec = new EventRecorder({ node: 'n', now: c.now });
    for (let i = 0; i < 5; i++) {
      rec.record(web, 'Warning', 'BackOff', 'Back-off restarting failed container main in pod web_default(u1)', 'main');
      c.advance(10_000);
    }
    rec.record(web, 'Warning', 'Unhealthy', 'Liveness probe failed: HTTP probe failed with statuscode: 500', 'main');
    rec.record(web, 'Warning', 'Unhealthy', 'Liveness probe failed: HTTP probe failed with statuscode: 503', 'main');
    // Same reason and message about another container, and about a new instance (UID) of the pod: separate.
    rec.record(web, 'Warning', 'BackOff', 'Back-off restarting failed container main in pod web_default(u1)', 'side');
    rec.record({ ...web, uid: 'u2' }, 'Warning', 'BackOff', 'Back-off restarting failed container main in pod web_default(u1)', 'main');
    const list = rec.listFor('default', 'web');
    expect(list).toHaveLength(5);
    const backoff = list.find((e) => e.reason === 'BackOff' && e.involvedObject.uid === 'u1' && e.involvedObject.fieldPath === 'spec.containers{main}')!;
    expect(backoff.count).toBe(5);
    expect(backoff.firstTimestamp).toBe('2026-11-30T06:00:00Z');
    expect(backoff.lastTimestamp).toBe('2026-11-30T06:00:40Z');
    expect(rec.listFor('default', 'other')).toEqual([]);
    // Copies: changing what was handed out changes nothing inside.
    backoff.count = 99;
    expect(rec.listFor('default', 'web').find((e) => e.reason === 'BackOff')!.count).toBe(5);
  });

  it('stays bounded per pod and overall, dropping the least recently updated', () => {
    const c = clock();
    const rec = new EventRecorder({ node: 'n', now: c.now, maxEvents: 50, maxPerPod: 10 });
    // A crash-looping pod whose messages differ every time (exit codes, timestamps in messages...).
    for (let i = 0; i < 10_000; i++) {
      rec.record(web, 'Warning', 'Failed', `Error: attempt ${i}`, 'main');
      c.advance(1000);
    }
    const mine = rec.listFor('default', 'web');
    expect(mine).toHaveLength(10);
    expect(mine.map((e) => e.message)).toEqual(Array.from({ length: 10 }, (_, i) => `Error: attempt ${9990 + i}`));
    for (let p = 0; p < 20; p++) for (let i = 0; i < 5; i++) rec.record({ namespace: 'ns', name: `p${p}`, uid: `u${p}` }, 'Normal', 'Started', `Started container c${i}`, `c${i}`);
    expect(rec.size).toBe(50);
    expect(rec.list()).toHaveLength(50);
    // The oldest pods' events went first.
    expect(rec.listFor('default', 'web')).toEqual([]);
    expect(rec.listFor('ns', 'p0')).toEqual([]);
    expect(rec.listFor('ns', 'p19')).toHaveLength(5);
    // A repeat of an old event refreshes it, so it survives the next evictions.
    rec.record({ namespace: 'ns', name: 'p10', uid: 'u10' }, 'Normal', 'Started', 'Started container c0', 'c0');
    rec.record({ namespace: 'ns', name: 'p20', uid: 'u20' }, 'Normal', 'Started', 'Started container c0', 'c0');
    expect(rec.listFor('ns', 'p10').map((e) => e.message)).toContain('Started container c0');
    expect(rec.size).toBe(50);
  });
});

describe('AgentMetrics', () => {
  it('counts restarts per container and forgets a removed pod series', async () => {
    const m = new AgentMetrics({ defaultMetrics: false });
    m.incRestart('default', 'web', 'main');
    m.incRestart('default', 'web', 'main');
    m.incRestart('default', 'db', 'pg');
    m.setManifestProblems(2);
    let text = await m.text();
    expect(text).toMatch(/^kubelet_container_restarts_total\{namespace="default",pod="web",container="main"\} 2$/m);
    expect(text).toMatch(/^kubelet_manifest_problems 2$/m);
    expect(text).not.toMatch(/process_cpu/);
    m.forgetPod('default', 'web');
    text = await m.text();
    expect(text).not.toMatch(/pod="web"/);
    expect(text).toMatch(/pod="db"/);
    // Two instances never share series.
    const other = new AgentMetrics({ defaultMetrics: false });
    expect(await other.text()).not.toMatch(/pod="db"/);
  });
});
