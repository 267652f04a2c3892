/**
 * A level-triggered loop over the API, the shape of a small controller:
 * watches a few resources only to learn that something changed, then runs
 * one `sync` that reads the whole state it needs and converges. Changes that
 * arrive while a sync runs coalesce into one more; a lost watch is started
 * again (the sync lists everything anyway); a resync also runs every
 * `everyMs` for what changes with time alone.
 */
import type { ApiClient } from '../api/client.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';

export interface LevelLoopOptions {
  client: ApiClient;
  resources: string[];
  sync: () => Promise<void>;
  log: Logger;
  name: string;
  everyMs?: number;
  /** How long after a change the sync runs, so a burst of changes is one sync. */
  delayMs?: number;
}

/** Syncs woken by changes are at least this far apart. */
const MIN_GAP_MS = 100;

export class LevelLoop {
  private stops: Array<() => void> = [];
  private timer: NodeJS.Timeout | undefined;
  private dueAt = 0;
  private lastEnd = 0;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = false;

  constructor(private readonly o: LevelLoopOptions) {}

  async start(): Promise<void> {
    for (const r of this.o.resources) await this.watch(r);
    this.kick(0);
  }

  private async watch(resource: string): Promise<void> {
    if (this.stopped) return;
    // From now: the sync reads what is there, the watch only says when to look again.
    const { resourceVersion } = await this.o.client.list(resource, { limit: 1 });
    const w = await this.o.client.watch(
      resource,
      { resourceVersion },
      () => this.kick(this.o.delayMs ?? 50),
      () => {
        if (this.stopped) return;
        const t = setTimeout(() => void this.watch(resource).catch((err) => this.o.log.warn(`${this.o.name}: could not watch again`, { resource, error: errorMessage(err) })), 1000);
        t.unref();
        this.kick(0);
      },
    );
    this.stops.push(() => w.stop());
  }

  /** A sync soon (or right after the one running). */
  kick(delayMs: number): void {
    if (this.stopped) return;
    if (this.running) {
      this.again = true;
      return;
    }
    // A change wakes the loop soon, but never sooner than MIN_GAP_MS after the last sync ended: a sync whose
    // own writes wake it again (or a stream of unrelated changes) is held to a few a second.
    const due = Math.max(Date.now() + delayMs, this.lastEnd + MIN_GAP_MS);
    delayMs = Math.max(0, due - Date.now());
    // The periodic resync's timer must not hold back a change's sooner one.
    if (this.timer && this.dueAt <= due) return;
    if (this.timer) clearTimeout(this.timer);
    this.dueAt = due;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.run();
    }, delayMs);
    this.timer.unref();
  }

  private run(): void {
    this.running = this.o
      .sync()
      .catch((err) => this.o.log.warn(`${this.o.name} failed; trying again`, { error: errorMessage(err) }))
      .finally(() => {
        this.running = undefined;
        this.lastEnd = Date.now();
        if (this.stopped) return;
        if (this.again) {
          this.again = false;
          this.kick(0);
        } else this.kick(this.o.everyMs ?? 10_000);
      });
  }

  /** Resolves when no sync is running or due right now (tests). */
  async idle(): Promise<void> {
    while (this.running || this.again) await (this.running ?? new Promise((r) => setImmediate(r)));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    for (const s of this.stops) s();
    this.stops = [];
    await this.running;
  }
}
