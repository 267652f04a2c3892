/**
 * The agent's events, written to the node's API as a kubelet's event
 * recorder writes them to the API server: created once, then updated as
 * they repeat (count, lastTimestamp). The API keeps events an hour after
 * they last happened (kube-apiserver's --event-ttl) and at most `max`
 * of those the node wrote, so a pod that fails forever cannot fill it.
 */
import type { Event } from 'kubernetes-types/core/v1.js';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import type { Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';

export interface EventSource {
  watch(listener: (type: 'ADDED' | 'MODIFIED', event: Event) => void): () => void;
}

export interface EventWriterOptions {
  client: ApiClient;
  log: Logger;
  ttlMs?: number;
  max?: number;
  now?: () => number;
  /** How often expired events are swept (default a minute). */
  sweepEveryMs?: number;
}

/** The kubelet's events from the node named `host` (those an EventWriter over its recorder wrote). */
export const isKubeletEventOf = (e: Obj, host: string): boolean => {
  const source = e.source as Obj | undefined;
  return source?.component === 'kubelet' && source.host === host;
};

export class EventWriter {
  /** namespace/name → when it last happened (ms), oldest-updated first. */
  private readonly written = new Map<string, number>();
  private readonly queue: Event[] = [];
  private draining = false;
  private stopWatch: (() => void) | undefined;
  private sweeper: NodeJS.Timeout | undefined;
  private readonly now: () => number;

  constructor(private readonly o: EventWriterOptions) {
    this.now = o.now ?? Date.now;
  }

  /**
   * `mine`: which events in the API this writer wrote before a restart (the
   * kubelet's: source.host is the node), swept as they expire too.
   */
  async start(source: EventSource, mine: (e: Obj) => boolean): Promise<void> {
    this.stopWatch = source.watch((_type, e) => this.enqueue(e));
    const { items } = await this.o.client.list('events').catch(() => ({ items: [] }));
    const earlier = items
      .filter((e) => mine(e))
      .map((e) => ({ k: `${e.metadata.namespace}/${e.metadata.name}`, at: Date.parse(String(e.lastTimestamp ?? '')) || 0 }))
      .sort((a, b) => a.at - b.at);
    for (const { k, at } of earlier) if (!this.written.has(k)) this.written.set(k, at);
    this.sweep();
    this.sweeper = setInterval(() => this.sweep(), this.o.sweepEveryMs ?? 60_000);
    this.sweeper.unref();
  }

  stop(): void {
    this.stopWatch?.();
    if (this.sweeper) clearInterval(this.sweeper);
    this.queue.length = 0;
  }

  private enqueue(e: Event): void {
    // Bounded: a burst beyond the cap keeps the newest (an aggregated event's later version replaces the earlier).
    const i = this.queue.findIndex((q) => q.metadata?.name === e.metadata?.name && q.metadata?.namespace === e.metadata?.namespace);
    if (i >= 0) this.queue.splice(i, 1);
    this.queue.push(e);
    if (this.queue.length > (this.o.max ?? 1000)) this.queue.shift();
    if (!this.draining) void this.drain();
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.queue.length > 0) {
        const e = this.queue.shift()!;
        await this.write(e).catch((err) => this.o.log.debug('could not write an event to the API', { event: e.metadata?.name, error: errorMessage(err) }));
      }
    } finally {
      this.draining = false;
    }
  }

  private async write(e: Event): Promise<void> {
    const ns = e.metadata?.namespace ?? 'default';
    const name = e.metadata?.name ?? '';
    const k = `${ns}/${name}`;
    const body = e as unknown as Obj;
    if (this.written.has(k)) {
      try {
        const cur = await this.o.client.get('events', ns, name);
        await this.o.client.update('events', ns, name, { ...body, metadata: { ...cur.metadata } });
      } catch (err) {
        if (!(err instanceof ApiError && err.reason === 'NotFound')) throw err;
        await this.o.client.create('events', ns, { ...body, metadata: { name, namespace: ns } });
      }
    } else {
      await this.o.client.create('events', ns, { ...body, metadata: { name, namespace: ns } });
    }
    this.written.delete(k);
    this.written.set(k, Date.parse(e.lastTimestamp ?? '') || this.now());
    while (this.written.size > (this.o.max ?? 1000)) await this.remove(this.written.keys().next().value as string);
  }

  private async remove(k: string): Promise<void> {
    this.written.delete(k);
    const i = k.indexOf('/');
    await this.o.client.delete('events', k.slice(0, i), k.slice(i + 1)).catch(() => undefined);
  }

  /** Events an hour past their last occurrence go. */
  sweep(): void {
    const cutoff = this.now() - (this.o.ttlMs ?? 3_600_000);
    void (async () => {
      for (const [k, at] of [...this.written]) if (at < cutoff) await this.remove(k);
    })();
  }
}
