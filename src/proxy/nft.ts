/** The nft commands the nftables proxier runs, through the same command runner as iptables.ts. */
import { SkiffError } from '../errors.js';
import type { CommandRunner } from './iptables.js';
import { NFT_FAMILY, NFT_TABLE } from './nft-rules.js';

export class Nft {
  constructor(private readonly run: CommandRunner) {}

  /** One `nft -f -`: the kernel applies all of it or none. */
  async apply(text: string): Promise<void> {
    const r = await this.run(['nft', '-f', '-'], text);
    if (r.code !== 0) throw new SkiffError('Internal', `nft -f failed (exit ${r.code}): ${firstLines(r.stderr)}${contextOf(r.stderr, text)}`);
  }

  /** Deletes the proxy's table; a missing table (or a missing nft, when nothing can have made one) is fine. */
  async deleteTable(): Promise<void> {
    let r;
    try {
      r = await this.run(['nft', 'delete', 'table', NFT_FAMILY, NFT_TABLE]);
    } catch (err) {
      if (err instanceof SkiffError && /cannot run nft/.test(err.message)) return;
      throw err;
    }
    if (r.code !== 0 && !/No such file or directory/.test(r.stderr)) throw new SkiffError('Internal', `nft delete table ${NFT_FAMILY} ${NFT_TABLE} failed (exit ${r.code}): ${firstLines(r.stderr)}`);
  }
}

function firstLines(s: string): string {
  return s.split('\n').slice(0, 3).join(' / ').trim();
}

/** nft names the failing line ("/dev/stdin:42:1-..."): show it. */
function contextOf(stderr: string, text: string): string {
  const m = /stdin:(\d+):/.exec(stderr);
  if (!m) return '';
  const line = text.split('\n')[Number(m[1]) - 1];
  return line ? ` (line ${m[1]}: ${line.slice(0, 300)})` : '';
}
