import { createRequire } from 'node:module';
import { describe, expect, it } from 'vitest';
import { AuthorityRewriter } from '../../src/server/h2-authority-proxy.js';

const require = createRequire(import.meta.url);
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const hpack = require('hpack.js') as any;

const PREFACE = Buffer.from('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');

function frame(type: number, flags: number, stream: number, payload: Buffer): Buffer {
  const h = Buffer.alloc(9);
  h.writeUIntBE(payload.length, 0, 3);
  h[3] = type;
  h[4] = flags;
  h.writeUInt32BE(stream, 5);
  return Buffer.concat([h, payload]);
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
  r.on('data', (d: Buffer) => out.push(d));
  const done = new Promise<void>((resolve, reject) => {
    r.on('end', resolve);
    r.on('error', reject);
  });
  let off = 0;
  while (off < input.length) {
    const n = chunk ? Math.max(1, chunk()) : input.length;
    r.write(input.subarray(off, off + n));
    off += n;
  }
  r.end();
  await done;
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
    const input = Buffer.concat([
      PREFACE,
      frame(1, 0x8 | 0x20, 5, first),
      frame(9, 0, 5, block.subarray(100, 20_000)),
      frame(9, 0x4, 5, block.subarray(20_000)),
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
