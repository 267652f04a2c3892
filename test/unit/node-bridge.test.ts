/** The API-to-agent bridge over a real store and a real agent object store (no agent): what it hands on, and when. */
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import type { ObjectChange } from '../../src/kubelet-lite/model.js';
import { ObjectStore } from '../../src/kubelet-lite/store.js';
import { silentLogger } from '../../src/log.js';
import { ApiBridge, withOthersConditions } from '../../src/node/api-bridge.js';
import { API_SOURCE_FILE } from '../../src/stored-object.js';

const tick = () => new Promise((r) => setTimeout(r, 20));

async function setUp() {
  const store = new Store({ kinds: nodeKinds('n1') });
  const objects = new ObjectStore({ nodeName: 'n1' });
  const seen: string[] = [];
  objects.subscribe((ch: ObjectChange[]) => seen.push(...ch.map((c) => `${c.type} ${c.object.kind} ${c.object.name}`)));
  const bridge = new ApiBridge({ store, client: localClient(store), objects, nodeName: 'n1', log: silentLogger });
  return { store, objects, seen, bridge, pods: store.kind('pods')! };
}

describe('ApiBridge', () => {
  it('hands the API\'s objects to the agent before it starts, under the API\'s uid, and their edits as edits', async () => {
    const { store, objects, seen, bridge, pods } = await setUp();
    const before = store.create(pods, 'default', { metadata: { name: 'early' }, spec: { containers: [{ name: 'c', image: 'x' }] } });
    await bridge.start();
    expect(objects.get('Pod', 'default', 'early')).toMatchObject({ uid: before.metadata.uid, source: { file: API_SOURCE_FILE } });
    const p = store.create(pods, 'default', { metadata: { name: 'p' }, spec: { containers: [{ name: 'c', image: 'x' }] } });
    await tick();
    // The node's own status write changes nothing the agent reads: no change is reported.
    store.update(pods, 'default', 'p', { ...p, status: { phase: 'Running' } }, { status: true });
    await tick();
    store.patch(pods, 'default', 'p', (c) => ({ ...c, metadata: { ...c.metadata, labels: { tier: 'front' } } }));
    await tick();
    expect(seen).toEqual(['added Pod early', 'added Pod p', 'modified Pod p']);
    const fed = objects.get('Pod', 'default', 'p')!;
    expect(fed.uid).toBe(p.metadata.uid);
    expect((fed.object.metadata as { labels: Record<string, string> }).labels).toEqual({ tier: 'front' });
    expect(fed.object.status).toBeUndefined();
    bridge.stop();
  });

  it('does not hand on pods bound to another node, and takes a pod marked for deletion away from the agent', async () => {
    const { store, objects, bridge, pods } = await setUp();
    await bridge.start();
    store.create(pods, 'default', { metadata: { name: 'other' }, spec: { nodeName: 'elsewhere', containers: [{ name: 'c', image: 'x' }] } });
    const p = store.create(pods, 'default', { metadata: { name: 'p' }, spec: { containers: [{ name: 'c', image: 'x' }] } });
    store.update(pods, 'default', 'p', { ...p, status: { phase: 'Running' } }, { status: true });
    await tick();
    expect(objects.list('Pod').map((o) => o.name)).toEqual(['p']);
    const out = store.delete(pods, 'default', 'p');
    expect(out.removed).toBe(false);
    expect(out.object.metadata.deletionTimestamp).toBeDefined();
    await tick();
    expect(objects.list('Pod')).toEqual([]);
    bridge.stop();
  });

  it('leaves a manifest file\'s objects to the file (never handed back as the API\'s)', async () => {
    const { store, objects, bridge } = await setUp();
    objects.replaceFile('/m/cm.yaml', { objects: [{ apiVersion: 'v1', kind: 'ConfigMap', namespace: 'default', name: 'filed', object: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'filed' }, data: { a: 'b' } }, source: { file: '/m/cm.yaml', document: 0, line: 1 } }], problems: [] });
    store.mirror(store.kind('configmaps')!, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'filed', uid: objects.get('ConfigMap', 'default', 'filed')!.uid }, data: { a: 'b' } }, 'the manifest file /m/cm.yaml');
    await bridge.start();
    await tick();
    expect(objects.list('ConfigMap').map((o) => o.source.file)).toEqual(['/m/cm.yaml']);
    bridge.stop();
  });
});

describe('withOthersConditions', () => {
  it('keeps the conditions others wrote (DisruptionTarget, a readiness gate) beside the agent\'s own, and the agent\'s win for its types', () => {
    const agent = { phase: 'Running', conditions: [{ type: 'Ready', status: 'False' }, { type: 'PodScheduled', status: 'True' }] };
    const api = { phase: 'Running', conditions: [{ type: 'Ready', status: 'True' }, { type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI' }, { type: 'example.com/gate', status: 'True' }] };
    expect(withOthersConditions(agent, api)).toEqual({
      phase: 'Running',
      conditions: [{ type: 'Ready', status: 'False' }, { type: 'PodScheduled', status: 'True' }, { type: 'DisruptionTarget', status: 'True', reason: 'EvictionByEvictionAPI' }, { type: 'example.com/gate', status: 'True' }],
    });
    expect(withOthersConditions(agent, { conditions: [{ type: 'Initialized', status: 'True' }] })).toBe(agent);
  });

  it('judges Ready by the readiness gates as the kubelet does once the containers are ready, keeping the transition time while it holds', () => {
    const at = () => '2026-12-02T10:00:00Z';
    const agent = { conditions: [{ type: 'Ready', status: 'False', reason: 'ReadinessGatesNotReady' }, { type: 'ContainersReady', status: 'True' }] };
    const ready = (api: unknown, gates = ['example.com/a', 'example.com/b']) => (withOthersConditions(agent, api as never, gates, at)!.conditions as Array<Record<string, unknown>>).find((c) => c.type === 'Ready');
    expect(ready({ conditions: [{ type: 'example.com/b', status: 'False' }] })).toEqual({
      type: 'Ready', status: 'False', lastProbeTime: null, lastTransitionTime: '2026-12-02T10:00:00Z', reason: 'ReadinessGatesNotReady',
      message: 'corresponding condition of pod readiness gate "example.com/a" does not exist., the status of pod readiness gate "example.com/b" is not "True", but False',
    });
    const both = [{ type: 'example.com/a', status: 'True' }, { type: 'example.com/b', status: 'True' }];
    expect(ready({ conditions: both })).toEqual({ type: 'Ready', status: 'True', lastProbeTime: null, lastTransitionTime: '2026-12-02T10:00:00Z' });
    // Unchanged since the API's copy: its transition time stays.
    expect(ready({ conditions: [...both, { type: 'Ready', status: 'True', lastTransitionTime: '2026-12-01T00:00:00Z' }] })!.lastTransitionTime).toBe('2026-12-01T00:00:00Z');
    // Containers not ready: the agent's Ready (and its reason) stands, whatever the gates say.
    const notReady = { conditions: [{ type: 'Ready', status: 'False', reason: 'ContainersNotReady' }, { type: 'ContainersReady', status: 'False' }] };
    expect((withOthersConditions(notReady, { conditions: both }, ['example.com/a'], at)!.conditions as unknown[])[0]).toEqual({ type: 'Ready', status: 'False', reason: 'ContainersNotReady' });
  });
});
