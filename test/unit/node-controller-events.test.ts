/** The controllers' and the scheduler's events: aggregated as upstream's recorders do, and the scheduler announces each placed pod once. */
import type { Event } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject } from '../../src/api/types.js';
import { silentLogger } from '../../src/log.js';
import { ControllerEvents } from '../../src/node/controller-events.js';
import { NodeScheduling } from '../../src/node/scheduling.js';

const seen = (events: ControllerEvents) => {
  const out: Array<[string, Event]> = [];
  events.watch((type, e) => out.push([type, e]));
  return out;
};

describe('ControllerEvents', () => {
  it('names the component by the involved kind and counts the same event up', () => {
    const events = new ControllerEvents({ instance: 'controller-manager-n', now: () => Date.parse('2026-12-02T05:00:00Z') });
    const got = seen(events);
    const d = { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web', namespace: 'shop', uid: 'u1' } } as ApiObject;
    events.record(d, 'Normal', 'ScalingReplicaSet', 'Scaled up replica set web-abc from 0 to 2');
    events.record(d, 'Normal', 'ScalingReplicaSet', 'Scaled up replica set web-abc from 0 to 2');
    events.record(d, 'Normal', 'ScalingReplicaSet', 'Scaled down replica set web-abc from 2 to 1');
    expect(got.map(([t, e]) => [t, e.count, e.message])).toEqual([
      ['ADDED', 1, 'Scaled up replica set web-abc from 0 to 2'],
      ['MODIFIED', 2, 'Scaled up replica set web-abc from 0 to 2'],
      ['ADDED', 1, 'Scaled down replica set web-abc from 2 to 1'],
    ]);
    const [, first] = got[0]!;
    expect(first).toMatchObject({ metadata: { namespace: 'shop' }, involvedObject: { kind: 'Deployment', name: 'web', uid: 'u1', apiVersion: 'apps/v1' }, source: { component: 'deployment-controller' }, reportingInstance: 'controller-manager-n', type: 'Normal' });
    expect(first.metadata!.name).toMatch(/^web\.[0-9a-f]+$/);
    expect(got[2]![1].metadata!.name).not.toBe(first.metadata!.name);
    expect(events.isMine(first)).toBe(true);
  });
});

describe('NodeScheduling', () => {
  it('writes Scheduled once for each pod placed on the node after it started', async () => {
    const store = new Store({ kinds: nodeKinds('n') });
    const client = localClient(store);
    await client.create('nodes', '', { apiVersion: 'v1', kind: 'Node', metadata: { name: 'n' } });
    const events = new ControllerEvents({ instance: 'controller-manager-n' });
    const got = seen(events);
    const scheduling = new NodeScheduling({ client, nodeName: 'n', log: silentLogger, events });
    await scheduling.start();
    await client.create('pods', 'default', { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' }, spec: { containers: [{ name: 'c', image: 'x' }] } });
    for (let i = 0; i < 100 && got.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    await scheduling.sync();
    expect(got.map(([t, e]) => [t, e.reason, e.message, e.source?.component])).toEqual([['ADDED', 'Scheduled', 'Successfully assigned default/p to n', 'default-scheduler']]);
    await scheduling.stop();
  });
});
