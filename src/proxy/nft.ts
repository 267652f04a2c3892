/**
 * How the nftables proxier writes its table: `nft -f` through the same
 * command runner as iptables.ts, and a partial sync's steps over netlink
 * when it knows the namespace the runner's commands reach.
 */
import { SkiffError } from '../errors.js';
import { NfnetlinkError, NfnetlinkSocket, NfnetlinkUnanswered } from '../sys/nfnetlink.js';
import type { CommandRunner } from './iptables.js';
import { encodeOps, NotEncodable } from './nft-netlink.js';
import { isServiceTable, NFT_FAMILY, NFT_TABLE, type NftOp } from './nft-rules.js';

/**
 * Past this many messages a partial sync goes through nft, in its own
 * process: encoding takes 17-30 µs a message on this thread (a partial sync
 * of 1,000 new Services is 14,000 messages, 250-450 ms with the event loop
 * held), and nft's reading of the tables first costs less than that.
 */
export const MAX_NETLINK_MESSAGES = 2000;

/** About how many netlink messages the ops make (elements go 500 to a message, or fewer when long). */
function messageCount(ops: NftOp[]): number {
  let n = 0;
  for (const o of ops) n += o.op === 'add-element' || o.op === 'delete-element' ? Math.ceil(o.elements.length / 100) : 1;
  return n;
}

export class Nft {
  private socket: NfnetlinkSocket | undefined;

  /**
   * `netns`: the network namespace the runner's commands reach, for netlink
   * writes (a path; null for this process's own). Undefined: not known, so
   * everything goes through nft.
   */
  constructor(
    private readonly run: CommandRunner,
    private readonly netns?: string | null,
    /** Partial syncs of more messages go through nft (see MAX_NETLINK_MESSAGES). */
    private readonly maxMessages = MAX_NETLINK_MESSAGES,
  ) {}

  /**
   * A partial sync: its steps sent as one netlink batch (an all-or-nothing
   * transaction, as `nft -f` is), or their text through nft when they hold a
   * rule this side cannot encode, are too many to encode on the event loop,
   * or netlink cannot be used. Says which.
   */
  async applyOps(ops: NftOp[], text: () => string): Promise<'netlink' | 'nft'> {
    if (this.netns !== undefined && messageCount(ops) <= this.maxMessages) {
      let messages;
      try {
        messages = encodeOps(ops);
      } catch (err) {
        if (!(err instanceof NotEncodable)) throw err;
      }
      if (messages) {
        try {
          // A namespace deleted, or made again at the same path, is not the one the socket writes to.
          if (this.socket && this.netns && !this.socket.isIn(this.netns)) this.close();
          this.socket ??= NfnetlinkSocket.open(this.netns ?? undefined);
          await this.socket.transact(messages);
          return 'netlink';
        } catch (err) {
          if (err instanceof NfnetlinkError) throw new SkiffError('Internal', err.message, { cause: err });
          if (err instanceof NfnetlinkUnanswered) {
            // Perhaps applied: the same steps again through nft would write rules twice or fail on what is gone.
            this.close();
            throw new SkiffError('Internal', err.message, { cause: err });
          }
          // The socket itself failed before sending (or the batch is too big for it): nft can still do it.
          this.close();
        }
      }
    }
    await this.apply(text());
    return 'nft';
  }

  close(): void {
    this.socket?.close();
    this.socket = undefined;
  }

  /** One `nft -f -`: the kernel applies all of it or none. */
  async apply(text: string): Promise<void> {
    const r = await this.run(['nft', '-f', '-'], text);
    if (r.code !== 0) throw new SkiffError('Internal', `nft -f failed (exit ${r.code}): ${firstLines(r.stderr)}${contextOf(r.stderr, text)}`);
  }

  /** The proxy's tables besides `kube-proxy` (Services spread over tables) that exist now. */
  async serviceTables(): Promise<string[]> {
    let r;
    try {
      r = await this.run(['nft', 'list', 'tables', NFT_FAMILY]);
    } catch (err) {
      if (err instanceof SkiffError && /cannot run nft/.test(err.message)) return [];
      throw err;
    }
    if (r.code !== 0) throw new SkiffError('Internal', `nft list tables failed (exit ${r.code}): ${firstLines(r.stderr)}`);
    const out: string[] = [];
    for (const line of r.stdout.split('\n')) {
      const m = /^table \S+ (\S+)$/.exec(line.trim());
      if (m && isServiceTable(m[1]!)) out.push(m[1]!);
    }
    return out;
  }

  /** Deletes the proxy's tables, all in one transaction; none there (or a missing nft, when nothing can have made one) is fine. */
  async deleteTable(): Promise<void> {
    const tables = [NFT_TABLE, ...(await this.serviceTables())];
    let r;
    try {
      // Made first, so deleting one that is not there is no error.
      r = await this.run(['nft', '-f', '-'], tables.map((t) => `add table ${NFT_FAMILY} ${t}\ndelete table ${NFT_FAMILY} ${t}\n`).join(''));
    } catch (err) {
      if (err instanceof SkiffError && /cannot run nft/.test(err.message)) return;
      throw err;
    }
    if (r.code !== 0) throw new SkiffError('Internal', `deleting the tables ${tables.join(', ')} failed (exit ${r.code}): ${firstLines(r.stderr)}`);
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
