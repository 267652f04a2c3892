import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ContainerEvents, MAX_PENDING_EVENTS } from '../../src/server/events.js';
import type { ContainerRecord, ContainerService } from '../../src/container/service.js';
import type { SandboxService } from '../../src/sandbox/service.js';
import type { Logger } from '../../src/log.js';

const log = { debug: () => undefined, info: () => undefined, warn: () => undefined, error: () => undefined } as unknown as Logger;

describe('ContainerEvents', () => {
  it('drops a subscriber that never reads once it holds a bounded number of events, and keeps one that reads', () => {
    const events = new ContainerEvents(log);
    const container = { id: 'c1', sandboxId: 'p1', config: { metadata: { name: 'c' }, labels: {}, annotations: {}, mounts: [] }, state: 'CONTAINER_RUNNING' } as unknown as ContainerRecord;
    events.bind({ get: () => undefined } as unknown as SandboxService, { listView: () => [] } as unknown as ContainerService);
    // A subscriber whose writes never complete (its client never reads), and one whose writes do.
    const stuck = new Writable({ objectMode: true, write: () => undefined });
    let read = 0;
    const reading = new Writable({ objectMode: true, write: (_e, _enc, cb) => (read++, cb()) });
    for (const s of [stuck, reading]) {
      s.on('error', () => undefined);
      events.handler(s as never);
    }
    for (let i = 0; i < MAX_PENDING_EVENTS * 4; i++) events.publish('CONTAINER_STARTED_EVENT', container);
    expect(events.subscribers).toBe(1);
    expect(stuck.writableLength).toBeLessThanOrEqual(MAX_PENDING_EVENTS + 1);
    expect(read).toBe(MAX_PENDING_EVENTS * 4);
  });
});
