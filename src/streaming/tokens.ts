/** Unguessable, single-use, expiring tokens for streaming URLs. */
import { randomBytes } from 'node:crypto';

export class TokenStore<T> {
  private readonly entries = new Map<string, { value: T; expires: number }>();

  constructor(
    private readonly ttlMs: number,
    private readonly now: () => number = Date.now,
  ) {}

  issue(value: T): string {
    this.sweep();
    const token = randomBytes(24).toString('base64url');
    this.entries.set(token, { value, expires: this.now() + this.ttlMs });
    return token;
  }

  /** The value for `token`, once: a second use or a late one finds nothing. */
  take(token: string): T | undefined {
    const e = this.entries.get(token);
    this.entries.delete(token);
    if (!e || e.expires < this.now()) return undefined;
    return e.value;
  }

  private sweep(): void {
    const t = this.now();
    for (const [k, e] of this.entries) if (e.expires < t) this.entries.delete(k);
  }
}
