/** The agent's events written to the node's API: aggregated, capped, and gone an hour after they last happened. */
import type { Event } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { EventRecorder } from '../../src/kubelet-lite/events.js';
import { silentLogger } from '../../src/log.js';
import { EventWriter, isKubeletEventOf } from '../../src/node/events.js';

const settle = async (store: Store, want: (n: number) => boolean) => {
  for (let i = 0; i < 200; i++) {
    if (want(store.list(store.kind('events')!).items.length)) return;
    await new Promise((r) => setImmediate(r));
  }
};

describe('EventWriter', () => {
  it('creates an event once and updates it as it repeats', async () => {
    const store = new Store({ kinds: nodeKinds('n') });
    const recorder = new EventRecorder({ node: 'n' });
    const w = new EventWriter({ client: localClient(store), log: silentLogger });
    await w.start(recorder, (e) => isKubeletEventOf(e, 'n'));
    const pod = { namespace: 'default', name: 'p', uid: 'u1' };
    recorder.record(pod, 'Warning', 'BackOff', 'Back-off restarting failed container');
    recorder.record(pod, 'Warning', 'BackOff', 'Back-off restarting failed container');
    await settle(store, (n) => n === 1);
    await new Promise((r) => setTimeout(r, 20));
    const [e] = store.list(store.kind('events')!).items as unknown as Event[];
    expect(e).toMatchObject({ reason: 'BackOff', count: 2, involvedObject: { kind: 'Pod', name: 'p', uid: 'u1' }, source: { component: 'kubelet', host: 'n' } });
    w.stop();
  });

  it('keeps at most `max` of its events, dropping the least recently updated, and sweeps those past the ttl, also from before a restart', async () => {
    let now = Date.parse('2026-12-01T10:00:00Z');
    const store = new Store({ kinds: nodeKinds('n') });
    const recorder = new EventRecorder({ node: 'n', now: () => new Date(now) });
    const w = new EventWriter({ client: localClient(store), log: silentLogger, max: 3, now: () => now });
    await w.start(recorder, (e) => isKubeletEventOf(e, 'n'));
    for (let i = 0; i < 5; i++) {
      recorder.record({ namespace: 'default', name: `p${i}`, uid: `u${i}` }, 'Normal', 'Started', 'Started container c');
      now += 1000;
    }
    await settle(store, (n) => n === 3);
    await new Promise((r) => setTimeout(r, 20));
    const names = () => store.list(store.kind('events')!).items.map((e) => (e.involvedObject as { name: string }).name).sort();
    expect(names()).toEqual(['p2', 'p3', 'p4']);
    w.stop();
    // A new writer (the node restarted) finds its earlier events and lets them expire.
    now += 2 * 3_600_000;
    const again = new EventWriter({ client: localClient(store), log: silentLogger, now: () => now });
    await again.start(new EventRecorder({ node: 'n' }), (e) => isKubeletEventOf(e, 'n'));
    await settle(store, (n) => n === 0);
    expect(names()).toEqual([]);
    again.stop();
  });
});
