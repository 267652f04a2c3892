/**
 * Writes the rendered table with one `nft -f -`: every line or none, so a
 * failed write leaves the previous rules in force (fail closed for the pods
 * they fence). Applies are serialized and coalesced: a request while one is
 * running waits for the next write, which carries the newest state.
 */
import { SkiffError } from '../errors.js';
import type { Runner } from '../sys/run.js';
import type { Model } from './model.js';
import { renderCleanup } from './render.js';

const NFT_TIMEOUT_MS = 30_000;

/** What to write: `text` (empty: nothing to do), the model it puts in force, and the whole table should `text` be a delta that fails. */
export interface Write {
  text: string;
  model: Model | undefined;
  full?: () => string;
}

export class NftApplier {
  private running: Promise<void> | undefined;
  private next: { render: (applied: Model | undefined) => Write; done: Promise<void>; resolve: () => void; reject: (e: unknown) => void } | undefined;
  /** The model in the kernel, after the last write that worked; undefined after a failure (write whole next time). */
  private applied: Model | undefined;

  private readonly stopping = new AbortController();

  /** `delayMs` (tests only) holds every write back that long, as a slow nft would. */
  constructor(private readonly runner: Runner, private readonly nft = 'nft', private readonly delayMs = 0) {}

  /** Kills a write in progress (the node is stopping); later writes fail at once. */
  stop(): void {
    this.stopping.abort();
  }

  /**
   * Applies what `render` gives when the write starts (so a burst of
   * changes is one write of the last state), given the model in force;
   * resolves once rules at least that new are in the kernel.
   */
  apply(render: (applied: Model | undefined) => Write): Promise<void> {
    if (this.next) {
      this.next.render = render;
      return this.next.done;
    }
    let resolve!: () => void;
    let reject!: (e: unknown) => void;
    const done = new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
    this.next = { render, done, resolve, reject };
    void this.drain();
    return done;
  }

  private async drain(): Promise<void> {
    if (this.running) return;
    while (this.next) {
      const job = this.next;
      this.next = undefined;
      this.running = this.writeJob(job.render).then(job.resolve, job.reject);
      await this.running;
      this.running = undefined;
    }
  }

  private async writeJob(render: (applied: Model | undefined) => Write): Promise<void> {
    const w = render(this.applied);
    try {
      if (w.text !== '') await this.write(w.text);
    } catch (err) {
      this.applied = undefined;
      if (!w.full) throw err;
      // The kernel's table is not what was last written (someone changed it): write it whole.
      await this.write(w.full());
    }
    this.applied = w.model;
  }

  private async write(text: string): Promise<void> {
    if (this.delayMs > 0) await new Promise((r) => setTimeout(r, this.delayMs));
    const r = await this.runner(this.nft, ['-f', '-'], { input: text, timeoutMs: NFT_TIMEOUT_MS, signal: this.stopping.signal });
    if (r.code !== 0 || r.timedOut) {
      const why = r.timedOut ? `timed out after ${NFT_TIMEOUT_MS} ms` : `exit ${r.code}`;
      throw new SkiffError('Internal', `nft -f failed (${why}): ${r.stderr.trim().split('\n').slice(0, 6).join(' | ').slice(0, 2000)}`);
    }
  }

  /** Removes the table. */
  async cleanup(): Promise<void> {
    await this.apply(() => ({ text: renderCleanup(), model: undefined }));
  }
}
