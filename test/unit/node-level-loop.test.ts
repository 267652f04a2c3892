/** The level-triggered loop under the node's small controllers: a change is looked at soon (at most 100 ms after the last sync), whatever the resync period. */
import { describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { silentLogger } from '../../src/log.js';
import { LevelLoop } from '../../src/node/level-loop.js';

describe('LevelLoop', () => {
  it('syncs soon after a change even while its long resync timer is pending', async () => {
    const store = new Store({ kinds: nodeKinds('n') });
    const client = localClient(store);
    let syncs = 0;
    const loop = new LevelLoop({ client, resources: ['configmaps'], sync: async () => void syncs++, log: silentLogger, name: 'test', everyMs: 60_000, delayMs: 10 });
    await loop.start();
    for (let i = 0; i < 100 && syncs === 0; i++) await new Promise((r) => setTimeout(r, 5));
    await loop.idle();
    expect(syncs).toBe(1);
    // Now only the 60 s resync is due; a change must not wait for it.
    await client.create('configmaps', 'default', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'a' } });
    const t0 = Date.now();
    for (let i = 0; i < 400 && syncs === 1; i++) await new Promise((r) => setTimeout(r, 5));
    expect(syncs).toBe(2);
    // Within the loop's minimum gap after the last sync (100 ms), not the 60 s resync.
    expect(Date.now() - t0).toBeLessThan(1000);
    await loop.stop();
  });
});
