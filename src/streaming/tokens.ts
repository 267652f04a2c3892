/** Unguessable, single-use, expiring tokens for streaming URLs. */
import { randomBytes } from 'node:crypto';
import { SkiffError } from '../errors.js';

/** Tokens outstanding at once (the kubelet's streaming cache allows as many in flight). */
export const MAX_TOKENS = 1000;
/** What the outstanding tokens' requests may weigh together (their commands, in bytes). */
export const MAX_TOKEN_BYTES = 16 * 1024 * 1024;

/**
 * A command's cost in bytes: its text plus a fixed overhead per argument
 * (so a million empty arguments are not free). Linux refuses to run a
 * command line past ARG_MAX (2 MiB by default) anyway.
 */
export function commandBytes(cmd: string[]): number {
  let n = 0;
  for (const a of cmd) n += Buffer.byteLength(a) + 32;
  return n;
}

export class TokenStore<T> {
  private readonly entries = new Map<string, { value: T; expires: number; weight: number }>();
  private weight = 0;

  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
    private readonly limits: { maxTokens: number; maxBytes: number } = { maxTokens: MAX_TOKENS, maxBytes: MAX_TOKEN_BYTES },
  ) {}

  /**
   * A token for `value`, which costs `weight` bytes while it waits. A client
   * that asks for URLs faster than it uses them is refused (ResourceExhausted)
   * rather than held without bound until the tokens expire.
   */
  issue(value: T, weight = 0): string {
    this.sweep();
    if (this.entries.size >= this.limits.maxTokens || this.weight + weight > this.limits.maxBytes) {
      throw new SkiffError('ResourceExhausted', `too many streaming requests in flight (at most ${this.limits.maxTokens}, ${this.limits.maxBytes} bytes of commands); try again once some are used or expired`);
    }
    const token = randomBytes(24).toString('base64url');
    this.entries.set(token, { value, expires: this.now() + this.ttlMs, weight });
    this.weight += weight;
    return token;
  }

  /** The value for `token`, once: a second use or a late one finds nothing. */
  take(token: string): T | undefined {
    const e = this.entries.get(token);
    if (!e) return undefined;
    this.remove(token, e.weight);
    if (e.expires < this.now()) return undefined;
    return e.value;
  }

  get size(): number {
    return this.entries.size;
  }

  private remove(token: string, weight: number): void {
    this.entries.delete(token);
    this.weight -= weight;
  }

  private sweep(): void {
    const t = this.now();
    for (const [k, e] of this.entries) if (e.expires < t) this.remove(k, e.weight);
  }
}
