/**
 * Writes the rendered table with one `nft -f -`: every line or none, so a
 * failed write leaves the previous rules in force (fail closed for the pods
 * they fence). Applies are serialized and coalesced: a request while one is
 * running waits for the next write, which carries the newest state.
 */
import { SkiffError } from '../errors.js';
import type { Runner } from '../sys/run.js';
import { renderCleanup } from './render.js';

const NFT_TIMEOUT_MS = 30_000;

export class NftApplier {
  private running: Promise<void> | undefined;
  private next: { text: () => string; done: Promise<void>; resolve: () => void; reject: (e: unknown) => void } | undefined;

  constructor(private readonly runner: Runner, private readonly nft = 'nft') {}

  /**
   * Applies the text `render` gives when the write starts (so a burst of
   * changes is one write of the last state); resolves once rules at least
   * that new are in the kernel.
   */
  apply(render: () => string): Promise<void> {
    if (this.next) {
      this.next.text = render;
      return this.next.done;
    }
    let resolve!: () => void;
    let reject!: (e: unknown) => void;
    const done = new Promise<void>((res, rej) => ((resolve = res), (reject = rej)));
    this.next = { text: render, done, resolve, reject };
    void this.drain();
    return done;
  }

  private async drain(): Promise<void> {
    if (this.running) return;
    while (this.next) {
      const job = this.next;
      this.next = undefined;
      this.running = this.write(job.text()).then(job.resolve, job.reject);
      await this.running;
      this.running = undefined;
    }
  }

  private async write(text: string): Promise<void> {
    const r = await this.runner(this.nft, ['-f', '-'], { input: text, timeoutMs: NFT_TIMEOUT_MS });
    if (r.code !== 0 || r.timedOut) {
      const why = r.timedOut ? `timed out after ${NFT_TIMEOUT_MS} ms` : `exit ${r.code}`;
      throw new SkiffError('Internal', `nft -f failed (${why}): ${r.stderr.trim().split('\n').slice(0, 6).join(' | ').slice(0, 2000)}`);
    }
  }

  /** Removes the table. */
  async cleanup(): Promise<void> {
    await this.write(renderCleanup());
  }
}
