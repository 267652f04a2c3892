/**
 * A small state file the agent rewrites whole (probe results, the
 * controllers' memory, user namespace ranges): each write goes to a
 * temporary file renamed over the old one, so a crash leaves the old text or
 * the new, never half of one; writes run one at a time, in call order.
 */
import fs from 'node:fs/promises';

export class StateFile {
  private writing: Promise<void> = Promise.resolve();

  /** `sync`: the text is on disk before the rename (for what must survive a power loss, not only a crash). */
  constructor(
    readonly file: string,
    private readonly opts: { sync?: boolean } = {},
  ) {}

  write(text: string): Promise<void> {
    const run = async () => {
      const tmp = `${this.file}.tmp`;
      const fh = await fs.open(tmp, 'w', 0o600);
      try {
        await fh.writeFile(text);
        if (this.opts.sync) await fh.sync();
      } finally {
        await fh.close();
      }
      await fs.rename(tmp, this.file);
    };
    const next = this.writing.then(run, run);
    this.writing = next.catch(() => undefined);
    return next;
  }

  /** Resolves once every write asked for so far has ended, however it ended. */
  settled(): Promise<void> {
    return this.writing;
  }
}
