/**
 * Hostile HTTP/2 clients on the real CRI socket: an HPACK bomb, a
 * CONTINUATION flood and a seeded fuzz of random and mutated frames. The bad
 * client loses its connection; every other client keeps getting answers.
 */
import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { makeDirs, removeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { prng } from '../helpers/prng.js';
import { frame, hpack, PREFACE } from '../helpers/h2-frames.js';

function encoder() {
  const c = hpack.compressor.create({ table: { maxSize: 4096 } });
  return (headers: Array<[string, string]>): Buffer => {
    c.write(headers.map(([name, value]) => ({ name, value, huffman: true })));
    const parts: Buffer[] = [];
    for (let b = c.read(); b !== null; b = c.read()) parts.push(b);
    return Buffer.concat(parts);
  };
}

const versionRequest = (authority: string): Array<[string, string]> => [
  [':method', 'POST'],
  [':scheme', 'http'],
  [':path', '/runtime.v1.RuntimeService/Version'],
  [':authority', authority],
  ['content-type', 'application/grpc'],
  ['te', 'trailers'],
];

/** A literal field with incremental indexing, new name, no Huffman: one entry of `size` value octets. */
function bigEntry(size: number): Buffer {
  const value = Buffer.alloc(size, 0x76);
  const len = (n: number) => {
    const out = [0x7f];
    n -= 127;
    while (n >= 128) {
      out.push((n % 128) + 128);
      n = Math.floor(n / 128);
    }
    out.push(n);
    return Buffer.from(out);
  };
  return Buffer.concat([Buffer.from([0x40, 0x01, 0x78]), len(size), value]);
}

interface RawConn {
  sock: net.Socket;
  received: Buffer[];
  closed: Promise<number>;
}

function connect(path: string): Promise<RawConn> {
  return new Promise((resolve, reject) => {
    const sock = net.connect(path);
    const received: Buffer[] = [];
    const closed = new Promise<number>((r) => sock.once('close', () => r(Date.now())));
    sock.on('data', (d: Buffer) => received.push(d));
    sock.on('error', () => {});
    sock.once('connect', () => resolve({ sock, received, closed }));
    sock.once('error', reject);
  });
}

function goawayCode(received: Buffer[]): number | undefined {
  const buf = Buffer.concat(received);
  for (let off = 0; off + 9 <= buf.length; ) {
    const len = buf.readUIntBE(off, 3);
    if (buf[off + 3] === 0x7 && off + 9 + 8 <= buf.length) return buf.readUInt32BE(off + 9 + 4);
    off += 9 + len;
  }
  return undefined;
}

const within = (p: Promise<number>, ms: number) => Promise.race([p, new Promise<number>((r) => setTimeout(() => r(-1), ms))]);

describe.skipIf(!isRoot)('the CRI socket under hostile HTTP/2 clients', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;

  async function versionMs(): Promise<number> {
    const t = performance.now();
    const v = await skiff.runtime.Version({});
    expect(v.runtimeName).toBe('skiff');
    return performance.now() - t;
  }

  /** Keeps asking for Version while `work` runs; returns the slowest answer. */
  async function slowestVersionDuring(work: () => Promise<void>): Promise<number> {
    let slowest = 0;
    let running = true;
    const prober = (async () => {
      while (running) {
        slowest = Math.max(slowest, await versionMs());
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    try {
      await work();
    } finally {
      running = false;
      await prober;
    }
    return slowest;
  }

  beforeAll(async () => {
    dirs = await makeDirs();
    skiff = await new SkiffProcess(dirs).start();
    await versionMs();
  });

  afterAll(async () => {
    await skiff?.stop();
    await removeDirs(dirs);
  });

  it('closes a connection that sends an HPACK bomb, and keeps answering others', async () => {
    const slowest = await slowestVersionDuring(async () => {
      const c = await connect(dirs.socket);
      // One 4000-octet table entry, then references to it: 16 KiB that would decode to ~50 MB, on 50 streams.
      const bomb = Buffer.concat([bigEntry(4000), Buffer.alloc(16_384 - 4010, 0x80 | 62)]);
      const frames = [PREFACE, frame(4, 0, 0, Buffer.alloc(0))];
      for (let i = 0; i < 50; i++) frames.push(frame(1, 0x4 | 0x1, 2 * i + 1, bomb));
      c.sock.write(Buffer.concat(frames));
      const closedAt = await within(c.closed, 3000);
      expect(closedAt, 'the daemon kept the bomb connection open').toBeGreaterThan(0);
      expect(goawayCode(c.received)).toBe(0xb); // ENHANCE_YOUR_CALM
    });
    expect(slowest).toBeLessThan(1000);
    expect(await versionMs()).toBeLessThan(1000);
    expect(skiff.log).toMatch(/header list larger than 65536/);
  });

  it('closes a connection whose table entry is larger than the table and then referenced', async () => {
    const c = await connect(dirs.socket);
    // The old decoder never evicted: a 60 KiB entry stayed and every 1-byte reference yielded 60 KiB.
    const block = Buffer.concat([bigEntry(60_000), Buffer.alloc(4000, 0x80 | 62)]);
    const parts = [frame(1, 0x1, 1, block.subarray(0, 16_000))];
    for (let off = 16_000; off < block.length; off += 16_000) parts.push(frame(9, off + 16_000 >= block.length ? 0x4 : 0, 1, block.subarray(off, off + 16_000)));
    c.sock.write(Buffer.concat([PREFACE, frame(4, 0, 0, Buffer.alloc(0)), ...parts]));
    expect(await within(c.closed, 3000)).toBeGreaterThan(0);
    expect(await versionMs()).toBeLessThan(1000);
  });

  it('closes a connection that floods CONTINUATION frames', async () => {
    const slowest = await slowestVersionDuring(async () => {
      const c = await connect(dirs.socket);
      const enc = encoder();
      const empty = frame(9, 0, 1, Buffer.alloc(0));
      c.sock.write(Buffer.concat([PREFACE, frame(4, 0, 0, Buffer.alloc(0)), frame(1, 0, 1, enc(versionRequest('/x.sock')))]));
      // Keep sending until the daemon hangs up, at most ~100k frames.
      for (let i = 0; i < 100 && !c.sock.destroyed; i++) {
        c.sock.write(Buffer.concat(Array.from({ length: 1000 }, () => empty)));
        await new Promise((r) => setImmediate(r));
      }
      expect(await within(c.closed, 3000)).toBeGreaterThan(0);
    });
    expect(slowest).toBeLessThan(1000);
  });

  it('survives a seeded fuzz of random and mutated HTTP/2 frames', async () => {
    const seed = Number(process.env.SKIFF_FUZZ_SEED ?? 20261130);
    const rand = prng(seed);
    const int = (n: number) => Math.floor(rand() * n);
    const bytes = (n: number) => Buffer.from(Array.from({ length: n }, () => int(256)));
    const connections = 100;
    const framesPer = 20;
    let sent = 0;
    const started = Date.now();
    for (let c = 0; c < connections; c++) {
      const conn = await connect(dirs.socket);
      const enc = encoder();
      const out: Buffer[] = [int(20) === 0 ? bytes(PREFACE.length) : PREFACE];
      if (int(4) !== 0) out.push(frame(4, 0, 0, Buffer.alloc(0)));
      for (let f = 0; f < framesPer; f++) {
        const stream = [0, 1, 3, 2 * int(50) + 1, int(2 ** 31)][int(5)]!;
        switch (int(5)) {
          case 0: {
            // A valid request, then mutated: bit flips, truncation or garbage appended.
            let block = enc(versionRequest(int(2) ? '/run/skiff.sock' : 'localhost'));
            if (int(3) === 0) block = block.subarray(0, int(block.length + 1));
            for (let k = int(4); k > 0; k--) {
              block = Buffer.from(block);
              if (block.length) block[int(block.length)] ^= 1 << int(8);
            }
            if (int(4) === 0) block = Buffer.concat([block, bytes(int(40))]);
            out.push(frame(1, [0x4, 0x5, 0x0, 0x24, 0x2c][int(5)]!, stream, block));
            break;
          }
          case 1:
            // A CONTINUATION, in or out of a block.
            out.push(frame(9, int(2) ? 0x4 : 0, stream, bytes(int(64))));
            break;
          case 2:
            // Any frame type, any flags, a random payload.
            out.push(frame(int(16), int(256), stream, bytes(int(3) ? int(64) : int(20_000))));
            break;
          case 3: {
            // SETTINGS with random identifiers and values, sometimes a bad length.
            const n = int(4);
            const p = Buffer.alloc(n * 6 + (int(5) === 0 ? 1 : 0));
            for (let k = 0; k < n; k++) {
              p.writeUInt16BE(int(8), k * 6);
              p.writeUInt32BE(int(2) ? int(70_000) : int(2 ** 32), k * 6 + 2);
            }
            out.push(frame(4, int(4) === 0 ? 1 : 0, int(8) === 0 ? 1 : 0, p));
            break;
          }
          default: {
            // A well-formed header then a frame with a lying length.
            const body = bytes(int(100));
            const f2 = frame(int(10), int(256), stream, body);
            f2.writeUIntBE(int(2 ** 24), 0, 3);
            out.push(int(2) ? f2 : frame(8, 0, stream, bytes(4)));
          }
        }
        sent++;
      }
      conn.sock.write(Buffer.concat(out));
      await within(conn.closed, 100);
      conn.sock.destroy();
      if (c % 25 === 24) {
        expect(skiff.child.exitCode, `daemon died after connection ${c}: ${skiff.log.slice(-2000)}`).toBeNull();
        expect(await versionMs()).toBeLessThan(1000);
      }
    }
    expect(sent).toBe(connections * framesPer);
    expect(Date.now() - started).toBeLessThan(60_000);
    expect(skiff.child.exitCode).toBeNull();
    expect(await versionMs()).toBeLessThan(1000);
  }, 90_000);
});
