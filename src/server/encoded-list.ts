/**
 * List answers built from bytes encoded once per record. A repeated message
 * field on the wire is its elements' encodings one after another, so a list
 * response is the concatenation of each record's encoding as a one-element
 * response. Stored records are frozen and replaced whenever they change, so a
 * cache keyed by the record object never serves a stale encoding, and what a
 * removed record cached goes with it.
 */
export class EncodedList<R extends object, M> {
  private readonly cache = new WeakMap<R, Buffer>();

  constructor(
    /** Encodes a whole list response holding `msg` alone. */
    private readonly encodeOne: (msg: M) => Buffer,
    private readonly toMessage: (r: R) => M,
  ) {}

  /** The encoded list response for `records`, in their order. */
  encode(records: readonly R[]): Buffer {
    const parts: Buffer[] = [];
    for (const r of records) {
      let b = this.cache.get(r);
      if (!b) {
        b = this.encodeOne(this.toMessage(r));
        this.cache.set(r, b);
      }
      parts.push(b);
    }
    return Buffer.concat(parts);
  }
}
