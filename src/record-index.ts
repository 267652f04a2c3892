/**
 * The records of one metadata table, held in memory: read from SQLite once,
 * written through to it on every change. Status and list calls answer from
 * here and never touch the database, so they neither parse JSON nor wait for
 * a write another call is doing.
 *
 * The records kept are frozen. `view`/`values` hand them out as they are, for
 * reading (building an answer); `get` hands out a copy to change and `save`.
 */
import { invalidArgument, notFound } from './errors.js';

export interface RecordTable<T> {
  /** Every stored record, in the order they were first stored. */
  load(): T[];
  /** Stores `record` (serialized as `json`), replacing the one with its id. */
  put(record: T, json: string): void;
  remove(id: string): void;
}

export class RecordIndex<T extends { id: string }> {
  private byId?: Map<string, Readonly<T>>;

  constructor(
    private readonly table: RecordTable<T>,
    /** What a record is called in errors ("pod sandbox", "container"). */
    private readonly kind: string,
  ) {}

  private map(): Map<string, Readonly<T>> {
    if (!this.byId) {
      const m = new Map<string, Readonly<T>>();
      for (const r of this.table.load()) m.set(r.id, deepFreeze(r));
      this.byId = m;
    }
    return this.byId;
  }

  /** The stored record itself (frozen): read it, never change it. */
  view(id: string): Readonly<T> | undefined {
    return this.map().get(id);
  }

  /** A copy of the stored record, to change and save. */
  get(id: string): T | undefined {
    const r = this.map().get(id);
    return r ? (structuredClone(r) as T) : undefined;
  }

  /** By full id or unique prefix; an ambiguous prefix is InvalidArgument. */
  findView(idOrPrefix: string): Readonly<T> | undefined {
    if (!idOrPrefix) return undefined;
    const exact = this.map().get(idOrPrefix);
    if (exact) return exact;
    let hit: Readonly<T> | undefined;
    let hits = 0;
    for (const [id, r] of this.map()) {
      if (!id.startsWith(idOrPrefix)) continue;
      hits++;
      hit = r;
    }
    if (hits > 1) throw invalidArgument(`${this.kind} id prefix "${idOrPrefix}" is ambiguous: it matches ${hits} ${this.kind === 'pod sandbox' ? 'pod sandboxes' : `${this.kind}s`}`);
    return hit;
  }

  /** By full id or unique prefix, a copy to change and save. */
  find(idOrPrefix: string): T | undefined {
    const r = this.findView(idOrPrefix);
    return r ? this.get(r.id) : undefined;
  }

  /** As find, or NotFound (`pod sandbox "x" not found`). */
  mustGet(idOrPrefix: string): T {
    const r = this.find(idOrPrefix);
    if (!r) throw notFound(`${this.kind} "${idOrPrefix}" not found`);
    return r;
  }

  /** As findView, or NotFound. */
  mustView(idOrPrefix: string): Readonly<T> {
    const r = this.findView(idOrPrefix);
    if (!r) throw notFound(`${this.kind} "${idOrPrefix}" not found`);
    return r;
  }

  /** The stored records themselves, in creation order: read them, never change them. */
  values(): Array<Readonly<T>> {
    return [...this.map().values()];
  }

  get size(): number {
    return this.map().size;
  }

  /** Writes `record` to the table, then (only once that worked) to memory, as a frozen copy. */
  save(record: T): void {
    const json = JSON.stringify(record);
    const m = this.map();
    this.table.put(record, json);
    // The copy is what a reload from the table would give (undefined fields dropped), detached from the caller's object.
    const stored = deepFreeze(JSON.parse(json) as T);
    m.set(stored.id, stored);
  }

  delete(id: string): void {
    const m = this.map();
    this.table.remove(id);
    m.delete(id);
  }
}

function deepFreeze<T>(v: T): T {
  if (v && typeof v === 'object' && !Object.isFrozen(v)) {
    Object.freeze(v);
    for (const k of Object.keys(v)) deepFreeze((v as Record<string, unknown>)[k]);
  }
  return v;
}
