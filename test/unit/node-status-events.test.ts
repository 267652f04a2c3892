/**
 * The Node's pressure conditions as the node reports them, and the kubelet's
 * Normal event on the Node each time one is set to a status it did not have
 * (NodeHasDiskPressure, NodeHasNoDiskPressure...), first at registration.
 */
import os from 'node:os';
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import type { Condition } from '../../src/kubelet-lite/eviction.js';
import { silentLogger } from '../../src/log.js';
import { NodeReporter } from '../../src/node/node-status.js';
import { FakeCri } from '../helpers/fake-cri.js';

const NODE = 'test-node';

describe('NodeReporter pressure events', () => {
  it('records the kubelet\'s "status is now" event when a pressure condition changes, once per change', async () => {
    const store = new Store({ kinds: nodeKinds(NODE) });
    const client = localClient(store);
    const pressure = new Set<Condition>();
    const events: string[] = [];
    let t = Date.parse('2026-12-02T10:00:00Z');
    const reporter = new NodeReporter({
      client,
      cri: new FakeCri({ now: () => t }),
      nodeName: NODE,
      hostIP: '192.0.2.10',
      rootDir: os.tmpdir(),
      maxPods: 110,
      statusPort: 10255,
      eviction: { conditions: () => pressure, thresholds: [] },
      nodeEvent: (type, reason, message) => void events.push(`${type} ${reason} ${message}`),
      now: () => t,
      log: silentLogger,
    });
    const condition = async (type: string) => ((await client.get('nodes', '', NODE)).status as { conditions: Array<{ type: string; status: string; reason: string }> }).conditions.find((c) => c.type === type);

    await reporter.tick();
    expect(events).toEqual([
      `Normal NodeHasSufficientMemory Node ${NODE} status is now: NodeHasSufficientMemory`,
      `Normal NodeHasNoDiskPressure Node ${NODE} status is now: NodeHasNoDiskPressure`,
      `Normal NodeHasSufficientPID Node ${NODE} status is now: NodeHasSufficientPID`,
      `Normal NodeReady Node ${NODE} status is now: NodeReady`,
    ]);
    events.length = 0;
    t += 10_000;
    await reporter.tick();
    expect(events).toEqual([]);

    pressure.add('DiskPressure');
    t += 10_000;
    await reporter.tick();
    expect(await condition('DiskPressure')).toMatchObject({ status: 'True', reason: 'KubeletHasDiskPressure' });
    expect(events).toEqual([`Normal NodeHasDiskPressure Node ${NODE} status is now: NodeHasDiskPressure`]);
    t += 10_000;
    await reporter.tick();
    expect(events).toHaveLength(1);

    pressure.clear();
    pressure.add('MemoryPressure');
    t += 10_000;
    await reporter.tick();
    expect(events.slice(1)).toEqual([
      `Normal NodeHasInsufficientMemory Node ${NODE} status is now: NodeHasInsufficientMemory`,
      `Normal NodeHasNoDiskPressure Node ${NODE} status is now: NodeHasNoDiskPressure`,
    ]);
    await reporter.stop();
  });

  it('records NodeNotReady when the runtime goes down, and NodeReady when it is back', async () => {
    const store = new Store({ kinds: nodeKinds(NODE) });
    const client = localClient(store);
    const events: string[] = [];
    let t = Date.parse('2026-12-02T10:00:00Z');
    const cri = new FakeCri({ now: () => t });
    let down = false;
    const status = cri.runtime.status.bind(cri.runtime);
    cri.runtime.status = ((...args: Parameters<typeof status>) => (down ? Promise.reject(new Error('connection refused')) : status(...args))) as typeof status;
    const reporter = new NodeReporter({ client, cri, nodeName: NODE, hostIP: '192.0.2.10', rootDir: os.tmpdir(), maxPods: 110, statusPort: 10255, nodeEvent: (type, reason) => void events.push(`${type} ${reason}`), now: () => t, log: silentLogger });
    await reporter.tick();
    expect(events).toContain('Normal NodeReady');
    events.length = 0;
    down = true;
    t += 10_000;
    await reporter.tick();
    expect(events).toEqual(['Normal NodeNotReady']);
    down = false;
    t += 10_000;
    await reporter.tick();
    expect(events).toEqual(['Normal NodeNotReady', 'Normal NodeReady']);
    await reporter.stop();
  });
});
