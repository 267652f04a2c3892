/**
 * Who may hold the status API's connections. Everyone on the host shares
 * 127.0.0.1, so a client is the uid that owns its socket: each non-root uid
 * gets a few connections, all of them together a share that leaves room for
 * root (the node's own tools, health checks), and when the server is full a
 * newcomer that holds less takes the place of a connection of the uid that
 * holds most, instead of being refused. One user can never keep root out.
 *
 * Pure bookkeeping: the server asks, acts on the answer, and reports what
 * each connection is doing.
 */

/** The key of peers whose owner is not known: unprivileged, all together. */
export const UNKNOWN_UID = -1;

export interface BudgetLimits {
  /** All connections. */
  max: number;
  /** Connections of one non-root uid. */
  perUser: number;
  /** Kept for root: non-root uids together hold at most max - reservedForRoot. */
  reservedForRoot: number;
}

export const DEFAULT_MAX_PER_USER = 16;

/** The defaults for a cap: 16 per user and a quarter kept for root (32 of 128). */
export function budgetLimits(max: number, perUser?: number, reservedForRoot?: number): BudgetLimits {
  const reserved = Math.min(max, reservedForRoot ?? Math.floor(max / 4));
  return { max, perUser: Math.max(1, Math.min(perUser ?? DEFAULT_MAX_PER_USER, max - reserved)), reservedForRoot: reserved };
}

export type RefusalReason = 'per-user' | 'share' | 'full';

export type Admission<C> = { admit: true; shed?: { conn: C; uid: number } } | { admit: false; reason: RefusalReason };

interface Entry {
  uid: number;
  /** A request is being answered (a watch or log stream included). */
  busy: boolean;
}

export class ConnectionBudget<C> {
  private readonly entries = new Map<C, Entry>();
  /** Per uid, its connections oldest first. */
  private readonly byUid = new Map<number, Set<C>>();
  private nonRoot = 0;

  constructor(readonly limits: BudgetLimits) {}

  get size(): number {
    return this.entries.size;
  }

  /** Connections held by one uid. */
  held(uid: number): number {
    return this.byUid.get(uid)?.size ?? 0;
  }

  /** Connections held by all non-root uids. */
  get heldByNonRoot(): number {
    return this.nonRoot;
  }

  /**
   * Decides on a new connection of `uid` and, when it is admitted, counts it
   * at once. A connection to shed is already uncounted: the caller closes it.
   */
  admit(conn: C, uid: number): Admission<C> {
    const { max, perUser, reservedForRoot } = this.limits;
    const root = uid === 0;
    let shed: { conn: C; uid: number } | undefined;
    if (!root && this.held(uid) >= perUser) return { admit: false, reason: 'per-user' };
    if (this.entries.size >= max || (!root && this.nonRoot >= max - reservedForRoot)) {
      // Root displaces any non-root uid; a non-root uid only one holding more than it would.
      const victim = this.victim(root ? 0 : this.held(uid) + 1);
      if (victim === undefined) return { admit: false, reason: root ? 'full' : 'share' };
      shed = { conn: victim, uid: this.entries.get(victim)!.uid };
      this.remove(victim);
    }
    this.entries.set(conn, { uid, busy: false });
    let set = this.byUid.get(uid);
    if (!set) this.byUid.set(uid, (set = new Set()));
    set.add(conn);
    if (!root) this.nonRoot++;
    return shed === undefined ? { admit: true } : { admit: true, shed };
  }

  /** Marks a connection as answering a request or waiting for one (or for its headers). */
  setBusy(conn: C, busy: boolean): void {
    const e = this.entries.get(conn);
    if (e) e.busy = busy;
  }

  remove(conn: C): void {
    const e = this.entries.get(conn);
    if (!e) return;
    this.entries.delete(conn);
    const set = this.byUid.get(e.uid)!;
    set.delete(conn);
    if (!set.size) this.byUid.delete(e.uid);
    if (e.uid !== 0) this.nonRoot--;
  }

  /**
   * A connection of the non-root uid holding most (more than `moreThan`):
   * one waiting for a request (slow headers, idle keep-alive) before one
   * being answered, the oldest first.
   */
  private victim(moreThan: number): C | undefined {
    let top: Set<C> | undefined;
    for (const [uid, set] of this.byUid) if (uid !== 0 && set.size > moreThan && (!top || set.size > top.size)) top = set;
    if (!top) return undefined;
    for (const c of top) if (!this.entries.get(c)!.busy) return c;
    return top.values().next().value;
  }
}
