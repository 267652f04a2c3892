import { describe, expect, it } from 'vitest';
import { AuthorityRewriter, ServerFrameWatcher, encodeLiterals } from '../../src/server/h2-authority-proxy.js';
import { BoundedHpackDecoder, HpackError } from '../../src/server/hpack-decoder.js';
import { frame, hpack, PREFACE } from '../helpers/h2-frames.js';

/** Feeds `input` to `w` `step` bytes at a time and returns all it passed on. */
async function feed(w: ServerFrameWatcher, input: Buffer, step: number): Promise<Buffer> {
  const out: Buffer[] = [];
  for (let off = 0; off < input.length; off += step) {
    const chunk = input.subarray(off, off + step);
    w.scan(chunk);
    out.push(chunk);
  }
  return Buffer.concat(out);
}

/** Encodes like a Go client: Huffman strings and a dynamic table that carries across requests. */
function goLikeEncoder() {
  const c = hpack.compressor.create({ table: { size: 4096 } });
  return (headers: Array<[string, string]>): Buffer => {
    c.write(headers.map(([name, value]) => ({ name, value, huffman: true })));
    const parts: Buffer[] = [];
    for (let b = c.read(); b !== null; b = c.read()) parts.push(b);
    return Buffer.concat(parts);
  };
}

interface Frame {
  type: number;
  flags: number;
  stream: number;
  payload: Buffer;
}

function parseFrames(buf: Buffer): Frame[] {
  const out: Frame[] = [];
  let off = 0;
  while (off < buf.length) {
    const len = buf.readUIntBE(off, 3);
    out.push({ type: buf[off + 3]!, flags: buf[off + 4]!, stream: buf.readUInt32BE(off + 5), payload: buf.subarray(off + 9, off + 9 + len) });
    off += 9 + len;
  }
  expect(off).toBe(buf.length);
  return out;
}

async function run(input: Buffer, chunk?: () => number): Promise<Buffer> {
  const r = new AuthorityRewriter();
  const out: Buffer[] = [];
  let off = 0;
  while (off < input.length) {
    const n = chunk ? Math.max(1, chunk()) : input.length;
    out.push(...r.rewrite(input.subarray(off, off + n)));
    off += n;
  }
  return Buffer.concat(out);
}

/** Decodes the header blocks of the rewritten stream, keeping one HPACK context as a server would. */
function headerBlocks(frames: Frame[]): Array<Array<[string, string]>> {
  const d = hpack.decompressor.create({ table: { size: 4096 } });
  const blocks: Array<Array<[string, string]>> = [];
  let cur: Buffer[] = [];
  for (const f of frames) {
    if (f.type !== 1 && f.type !== 9) continue;
    let p = f.payload;
    if (f.type === 1 && f.flags & 0x20) p = p.subarray(5);
    cur.push(p);
    if (f.flags & 0x4) {
      d.write(Buffer.concat(cur));
      d.execute();
      const hs: Array<[string, string]> = [];
      for (let h = d.read(); h !== null; h = d.read()) hs.push([h.name, h.value]);
      blocks.push(hs);
      cur = [];
    }
  }
  return blocks;
}

const request = (authority: string, extra: Array<[string, string]> = []): Array<[string, string]> => [
  [':method', 'POST'],
  [':scheme', 'http'],
  [':path', '/runtime.v1.RuntimeService/Version'],
  [':authority', authority],
  ['content-type', 'application/grpc'],
  ['user-agent', 'grpc-go/1.51.0'],
  ['te', 'trailers'],
  ...extra,
];

describe('AuthorityRewriter', () => {
  it('replaces a socket-path :authority with localhost and keeps every other byte', async () => {
    const enc = goLikeEncoder();
    const settings = frame(4, 0, 0, Buffer.alloc(0));
    const data = frame(0, 1, 1, Buffer.from([0, 0, 0, 0, 0]));
    const input = Buffer.concat([
      PREFACE,
      settings,
      frame(1, 0x4, 1, enc(request('/run/skiff/skiff.sock'))),
      data,
      frame(1, 0x4 | 0x1, 3, enc(request('/run/skiff/skiff.sock'))),
      frame(8, 0, 0, Buffer.from([0, 0, 1, 0])),
    ]);
    const out = await run(input);
    expect(out.subarray(0, PREFACE.length)).toEqual(PREFACE);
    const frames = parseFrames(out.subarray(PREFACE.length));
    expect(frames.map((f) => [f.type, f.flags, f.stream])).toEqual([
      [4, 0, 0],
      [1, 0x4, 1],
      [0, 1, 1],
      [1, 0x5, 3],
      [8, 0, 0],
    ]);
    expect(frames[2]!.payload).toEqual(Buffer.from([0, 0, 0, 0, 0]));
    const blocks = headerBlocks(frames);
    expect(blocks).toEqual([request('localhost'), request('localhost')]);
  });

  it('keeps a valid :authority as it is', async () => {
    const enc = goLikeEncoder();
    const out = await run(Buffer.concat([PREFACE, frame(1, 0x4, 1, enc(request('localhost:1234')))]));
    expect(headerBlocks(parseFrames(out.subarray(PREFACE.length)))).toEqual([request('localhost:1234')]);
  });

  it('joins CONTINUATION frames, drops padding, keeps priority, and splits big blocks at 16 KiB', async () => {
    const enc = goLikeEncoder();
    const big: Array<[string, string]> = [['x-big', 'v'.repeat(40_000)]];
    const block = enc(request('/tmp/x.sock', big));
    const pad = 7;
    const first = Buffer.concat([Buffer.from([pad]), Buffer.from([0, 0, 0, 0, 15]), block.subarray(0, 100), Buffer.alloc(pad)]);
    const rest: Buffer[] = [];
    for (let off = 100; off < block.length; off += 16_000) rest.push(block.subarray(off, off + 16_000));
    const input = Buffer.concat([
      PREFACE,
      frame(1, 0x8 | 0x20, 5, first),
      ...rest.map((r, i) => frame(9, i === rest.length - 1 ? 0x4 : 0, 5, r)),
    ]);
    const frames = parseFrames((await run(input)).subarray(PREFACE.length));
    expect(frames[0]!.type).toBe(1);
    expect(frames[0]!.flags & 0x20).toBe(0x20);
    expect(frames[0]!.payload.subarray(0, 5)).toEqual(Buffer.from([0, 0, 0, 0, 15]));
    expect(frames.slice(1).every((f) => f.type === 9 && f.stream === 5)).toBe(true);
    expect(frames.every((f) => f.payload.length <= 16384)).toBe(true);
    expect(frames.at(-1)!.flags & 0x4).toBe(0x4);
    expect(headerBlocks(frames)).toEqual([request('localhost', big)]);
  });

  it('gives the same output however the input is split', async () => {
    const enc = goLikeEncoder();
    const input = Buffer.concat([
      PREFACE,
      frame(4, 0, 0, Buffer.alloc(6)),
      ...Array.from({ length: 20 }, (_, i) => Buffer.concat([frame(1, 0x4, 2 * i + 1, enc(request('/s.sock', [['n', String(i)]]))), frame(0, 1, 2 * i + 1, Buffer.alloc(i * 10, i))])),
    ]);
    const whole = await run(input);
    let seed = 42;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) % 97;
    for (let i = 0; i < 20; i++) expect(await run(input, rand)).toEqual(whole);
  });

  it('fails the connection, not the process, on garbage', async () => {
    await expect(run(Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'))).rejects.toThrow(/preface/);
    await expect(run(Buffer.concat([PREFACE, frame(9, 0x4, 1, Buffer.from([1, 2]))]))).rejects.toThrow(/CONTINUATION/);
    let seed = 7;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) & 0xff;
    for (let i = 0; i < 200; i++) {
      const junk = Buffer.from(Array.from({ length: 64 }, rand));
      const input = Buffer.concat([PREFACE, frame(1, 0x4, 1, junk)]);
      await run(input).catch((e: Error) => expect(e).toBeInstanceOf(Error));
    }
  });
});

/** A literal header field with incremental indexing and a new name (RFC 7541 §6.2.1), no Huffman. */
function literalIndexed(name: string, value: string): Buffer {
  return Buffer.concat([Buffer.from([0x40]), hpackString(name), hpackString(value)]);
}

function hpackInt(prefixBits: number, first: number, n: number): Buffer {
  const max = (1 << prefixBits) - 1;
  if (n < max) return Buffer.from([first | n]);
  const out = [first | max];
  n -= max;
  while (n >= 128) {
    out.push((n % 128) + 128);
    n = Math.floor(n / 128);
  }
  out.push(n);
  return Buffer.from(out);
}

function hpackString(s: string): Buffer {
  return Buffer.concat([hpackInt(7, 0, s.length), Buffer.from(s, 'latin1')]);
}

describe('BoundedHpackDecoder', () => {
  it('keeps its dynamic table within 4096 octets: old entries are evicted', () => {
    const d = new BoundedHpackDecoder();
    d.decode(literalIndexed('a', 'x'.repeat(3000)));
    d.decode(literalIndexed('b', 'y'.repeat(3000)));
    expect(d.tableSize).toBeLessThanOrEqual(4096);
    // Index 62 is the newest entry; 63 (the evicted one) no longer exists.
    expect(d.decode(Buffer.from([0x80 | 62]))).toEqual([{ name: 'b', value: 'y'.repeat(3000) }]);
    expect(() => d.decode(Buffer.from([0x80 | 63]))).toThrow(HpackError);
  });

  it('does not keep an entry larger than the table', () => {
    const d = new BoundedHpackDecoder();
    expect(d.decode(literalIndexed('big', 'z'.repeat(5000)))).toHaveLength(1);
    expect(d.tableSize).toBe(0);
    expect(() => d.decode(Buffer.from([0x80 | 62]))).toThrow(/out of range|OOB/);
  });

  it('refuses a block of repeated references past the header list limit, quickly', () => {
    const d = new BoundedHpackDecoder();
    const bomb = Buffer.concat([literalIndexed('x', 'v'.repeat(4000)), Buffer.alloc(60_000, 0x80 | 62)]);
    const started = performance.now();
    let err: unknown;
    try {
      d.decode(bomb);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(HpackError);
    expect((err as HpackError).h2Code).toBe(0xb);
    expect((err as Error).message).toMatch(/header list larger than 65536/);
    expect(performance.now() - started).toBeLessThan(100);
  });

  it('honours SETTINGS_HEADER_TABLE_SIZE: size updates up to it, and no further', () => {
    const d = new BoundedHpackDecoder();
    expect(() => d.decode(hpackInt(5, 0x20, 8192))).toThrow(/above the 4096 allowed/);
    d.setMaxTableSize(8192);
    d.decode(hpackInt(5, 0x20, 8192));
    d.decode(literalIndexed('a', 'x'.repeat(3000)));
    d.decode(literalIndexed('b', 'y'.repeat(3000)));
    expect(d.tableSize).toBeGreaterThan(6000);
    // Lowering it evicts at once.
    d.setMaxTableSize(100);
    expect(d.tableSize).toBe(0);
    // Never more than 64 KiB, whatever the server says.
    d.setMaxTableSize(1 << 30);
    expect(() => d.decode(hpackInt(5, 0x20, 1 << 20))).toThrow(/above the 65536 allowed/);
  });

  it('refuses a size update after a header field, index 0 and truncated blocks', () => {
    const d = new BoundedHpackDecoder();
    expect(() => d.decode(Buffer.concat([Buffer.from([0x82]), hpackInt(5, 0x20, 0)]))).toThrow(/after a header field/);
    expect(() => d.decode(Buffer.from([0x80]))).toThrow(/index 0/);
    expect(() => d.decode(literalIndexed('a', 'abc').subarray(0, 5))).toThrow(HpackError);
  });
});

describe('AuthorityRewriter limits', () => {
  const headers = (stream: number, block: Buffer, flags = 0x4) => frame(1, flags, stream, block);

  it('closes the connection on a CONTINUATION flood', async () => {
    const enc = goLikeEncoder();
    const block = enc(request('/s.sock'));
    const flood = Array.from({ length: 100 }, () => frame(9, 0, 1, Buffer.alloc(0)));
    await expect(run(Buffer.concat([PREFACE, headers(1, block, 0), ...flood]))).rejects.toThrow(/more than 64 CONTINUATION/);
  });

  it('closes the connection on a header block over 64 KiB', async () => {
    const parts = Array.from({ length: 5 }, () => frame(9, 0, 1, Buffer.alloc(16_000, 0x20)));
    await expect(run(Buffer.concat([PREFACE, headers(1, Buffer.alloc(16_000, 0x20), 0), ...parts]))).rejects.toThrow(/header block larger than 65536/);
  });

  it('closes the connection on an HPACK bomb', async () => {
    const bomb = Buffer.concat([literalIndexed('x', 'v'.repeat(4000)), Buffer.alloc(12_000, 0x80 | 62)]);
    await expect(run(Buffer.concat([PREFACE, headers(1, bomb)]))).rejects.toThrow(/header list larger/);
  });

  it('refuses another frame inside a header block, and a frame larger than the server allows', async () => {
    const enc = goLikeEncoder();
    await expect(run(Buffer.concat([PREFACE, headers(1, enc(request('/s.sock')), 0), frame(0, 0, 1, Buffer.alloc(1))]))).rejects.toThrow(/inside a header block/);
    await expect(run(Buffer.concat([PREFACE, frame(0, 0, 1, Buffer.alloc(20_000))]))).rejects.toThrow(/frame of 20000 bytes/);
    const r = new AuthorityRewriter();
    r.serverSettings(0x5, 32768);
    const out = r.rewrite(Buffer.concat([PREFACE, frame(0, 0, 1, Buffer.alloc(20_000))]));
    expect(Buffer.concat(out).length).toBe(PREFACE.length + 9 + 20_000);
  });
});

describe('ServerFrameWatcher', () => {
  it('reports the server settings however the bytes are split, and passes them on unchanged', async () => {
    const settings = Buffer.alloc(12);
    settings.writeUInt16BE(0x1, 0);
    settings.writeUInt32BE(8192, 2);
    settings.writeUInt16BE(0x5, 6);
    settings.writeUInt32BE(65536, 8);
    const input = Buffer.concat([frame(4, 0, 0, settings), frame(0, 0, 1, Buffer.alloc(300, 7)), frame(4, 1, 0, Buffer.alloc(0)), frame(4, 0, 0, settings.subarray(0, 6))]);
    for (const step of [1, 5, 9, 10, 1000]) {
      const seen: Array<[number, number]> = [];
      const w = new ServerFrameWatcher((id, v) => seen.push([id, v]));
      expect(await feed(w, input, step)).toEqual(input);
      expect(seen).toEqual([[1, 8192], [5, 65536], [1, 8192]]);
      expect(w.atFrameBoundary).toBe(true);
    }
  });

  it('reports the error code of each GOAWAY the server sends, however the bytes are split', async () => {
    const goaway = (code: number) => {
      const p = Buffer.alloc(8 + 5, 0x61);
      p.writeUInt32BE(0, 0);
      p.writeUInt32BE(code, 4);
      return frame(7, 0, 0, p);
    };
    const input = Buffer.concat([frame(4, 0, 0, Buffer.alloc(0)), goaway(0), frame(0, 0, 1, Buffer.alloc(20)), goaway(1)]);
    for (const step of [1, 7, 13, 1000]) {
      const codes: number[] = [];
      const w = new ServerFrameWatcher(
        () => {},
        (code) => codes.push(code),
      );
      expect(await feed(w, input, step)).toEqual(input);
      expect(codes).toEqual([0, 1]);
    }
  });

  it('encodes header literals any HPACK decoder reads back, lengths past one byte and latin1 included', () => {
    const headers = [
      { name: ':path', value: '/runtime.v1.RuntimeService/Version' },
      { name: 'x-long', value: 'v'.repeat(127) },
      { name: 'x-longer', value: 'w'.repeat(20_000) },
      { name: 'x-empty', value: '' },
      { name: 'x-latin1', value: 'caf\u00e9' },
    ];
    const d = hpack.decompressor.create({ table: { size: 4096 } });
    d.write(encodeLiterals(headers));
    d.execute();
    const got: Array<{ name: string; value: string }> = [];
    for (let h = d.read(); h !== null; h = d.read()) got.push({ name: h.name, value: h.value });
    expect(got.map((h) => h.name)).toEqual(headers.map((h) => h.name));
    expect(got.slice(0, 4).map((h) => h.value)).toEqual(headers.slice(0, 4).map((h) => h.value));
    // Values go out as the latin1 bytes the decoder here read them as: one byte per character.
    expect(encodeLiterals([{ name: 'x', value: 'caf\u00e9' }])).toEqual(Buffer.from([0x10, 1, 0x78, 4, 0x63, 0x61, 0x66, 0xe9]));
    // Nothing went into the dynamic table: every field is a never-indexed literal.
    expect(encodeLiterals([{ name: 'a', value: 'b' }])).toEqual(Buffer.from([0x10, 1, 0x61, 1, 0x62]));
  });
});

