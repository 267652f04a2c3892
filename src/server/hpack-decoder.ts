/**
 * An HPACK header-block decoder with hard bounds, for header blocks from
 * clients skiff does not trust. hpack.js supplies the primitives (integers,
 * Huffman strings, the static and dynamic tables); this module drives them
 * one representation at a time so a block can never cost more than its
 * limits: a dynamic table no larger than the size the server advertised, and
 * a decoded header list no larger than `maxHeaderListSize` (counted as RFC
 * 7541 counts entries: name + value + 32 octets), whatever the block repeats.
 */
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

// hpack.js has no type declarations; these are the few calls used here.
interface HpackTableEntry {
  name: string;
  value: string;
  nameSize: number;
}
interface HpackTable {
  protocolMaxSize: number;
  maxSize: number;
  size: number;
  lookup(index: number): HpackTableEntry;
  add(name: string, value: string, nameSize: number, valueSize: number): void;
  updateSize(size: number): void;
}
interface HpackDecoder {
  push(b: Buffer): void;
  isEmpty(): boolean;
  decodeBit(): number;
  decodeInt(): number;
  decodeStr(): Buffer | number[];
}
const hpack = require('hpack.js') as {
  decoder: { create(): HpackDecoder };
  table: { create(o: { maxSize: number }): HpackTable };
};

export interface Header {
  name: string;
  value: string;
}

/** A violation of the header-compression rules or of skiff's bounds: the connection must end. */
export class HpackError extends Error {
  constructor(
    message: string,
    /** HTTP/2 error code for the GOAWAY: COMPRESSION_ERROR, or ENHANCE_YOUR_CALM for a bound. */
    readonly h2Code: number,
  ) {
    super(message);
    this.name = 'HpackError';
  }
}

export const H2_COMPRESSION_ERROR = 0x9;
export const H2_ENHANCE_YOUR_CALM = 0xb;

/** The protocol's initial SETTINGS_HEADER_TABLE_SIZE. */
export const DEFAULT_TABLE_SIZE = 4096;
/** The most skiff lets a peer's settings raise the table to. */
export const MAX_TABLE_SIZE = 64 << 10;
export const DEFAULT_MAX_HEADER_LIST = 64 << 10;

function text(s: Buffer | number[]): string {
  return Buffer.isBuffer(s) ? s.toString('latin1') : Buffer.from(s).toString('latin1');
}

export class BoundedHpackDecoder {
  private readonly table: HpackTable;

  constructor(
    tableSize = DEFAULT_TABLE_SIZE,
    private readonly maxHeaderListSize = DEFAULT_MAX_HEADER_LIST,
  ) {
    this.table = hpack.table.create({ maxSize: Math.min(tableSize, MAX_TABLE_SIZE) });
  }

  /** The dynamic table's current size in octets (RFC 7541 §4.1), for tests. */
  get tableSize(): number {
    return this.table.size;
  }

  /**
   * SETTINGS_HEADER_TABLE_SIZE from the server: the most a client may set
   * its table to with a size update. Lowering it shrinks the table at once.
   */
  setMaxTableSize(size: number): void {
    const s = Math.min(Math.max(0, size), MAX_TABLE_SIZE);
    this.table.protocolMaxSize = s;
    if (this.table.maxSize > s) this.table.updateSize(s);
  }

  /** Decodes one complete header block; throws HpackError on any violation. */
  decode(block: Buffer): Header[] {
    const dec = hpack.decoder.create();
    dec.push(block);
    const out: Header[] = [];
    let listSize = 0;
    let first = true;
    const emit = (name: string, value: string) => {
      listSize += name.length + value.length + 32;
      if (listSize > this.maxHeaderListSize) {
        throw new HpackError(`header list larger than ${this.maxHeaderListSize} octets`, H2_ENHANCE_YOUR_CALM);
      }
      out.push({ name, value });
    };
    try {
      while (!dec.isEmpty()) {
        if (dec.decodeBit()) {
          const e = this.lookup(dec.decodeInt());
          emit(e.name, e.value);
        } else if (dec.decodeBit()) {
          this.literal(dec, true, emit);
        } else if (dec.decodeBit()) {
          // Dynamic table size update: only before the first header of a block.
          if (!first) throw new HpackError('table size update after a header field', H2_COMPRESSION_ERROR);
          const size = dec.decodeInt();
          if (size > this.table.protocolMaxSize) {
            throw new HpackError(`table size update to ${size} above the ${this.table.protocolMaxSize} allowed`, H2_COMPRESSION_ERROR);
          }
          this.table.updateSize(size);
          continue;
        } else {
          dec.decodeBit(); // never-indexed flag: passing it on is the encoder's business
          this.literal(dec, false, emit);
        }
        first = false;
      }
    } catch (err) {
      if (err instanceof HpackError) throw err;
      throw new HpackError(`malformed header block: ${err instanceof Error ? err.message : String(err)}`, H2_COMPRESSION_ERROR);
    }
    return out;
  }

  private lookup(index: number): HpackTableEntry {
    if (index === 0) throw new HpackError('header index 0', H2_COMPRESSION_ERROR);
    const e = this.table.lookup(index);
    if (!e) throw new HpackError(`header index ${index} out of range`, H2_COMPRESSION_ERROR);
    return e;
  }

  private literal(dec: HpackDecoder, index: boolean, emit: (n: string, v: string) => void): void {
    const nameIndex = dec.decodeInt();
    let name: string;
    let nameSize: number;
    if (nameIndex === 0) {
      name = text(dec.decodeStr());
      nameSize = name.length;
    } else {
      const e = this.lookup(nameIndex);
      name = e.name;
      nameSize = e.nameSize;
    }
    const value = text(dec.decodeStr());
    emit(name, value);
    if (index) this.table.add(name, value, nameSize, value.length);
  }
}
