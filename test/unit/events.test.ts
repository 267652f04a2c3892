import { Writable } from 'node:stream';
import { describe, expect, it } from 'vitest';
import { ContainerEvents, MAX_PENDING_EVENTS, MAX_SUBSCRIBERS } from '../../src/server/events.js';
import { Status } from '../../src/server/status.js';
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

  it('refuses a stream past MAX_SUBSCRIBERS with RESOURCE_EXHAUSTED, and takes one again once another ends', () => {
    const events = new ContainerEvents(log);
    const calls = Array.from({ length: MAX_SUBSCRIBERS + 1 }, () => {
      const w = new Writable({ objectMode: true, write: () => undefined }) as Writable & { failed?: number };
      (w as unknown as { fail(e: { code: number }): void }).fail = (e) => (w.failed = e.code);
      w.on('error', () => undefined);
      return w;
    });
    for (const c of calls) events.handler(c as never);
    expect(events.subscribers).toBe(MAX_SUBSCRIBERS);
    expect(calls[MAX_SUBSCRIBERS]!.failed).toBe(Status.RESOURCE_EXHAUSTED);
    expect(calls[0]!.failed).toBeUndefined();
    calls[0]!.emit('close');
    const again = Object.assign(new Writable({ objectMode: true, write: () => undefined }), { fail: () => undefined });
    events.handler(again as never);
    expect(events.subscribers).toBe(MAX_SUBSCRIBERS);
  });
});
