/**
 * Digests computed on hashing threads: the same answer as node:crypto for
 * every size and chunking, a bounded window of bytes in flight, no thread
 * left when idle, and a stopped pool that fails what it was hashing.
 */
import { createHash, randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { DIGEST_BATCH, DigestThreads, inlineDigester, THREAD_MIN_BYTES, type Digester } from '../../src/image/digest-threads.js';

const pools: DigestThreads[] = [];
/** A pool that takes every blob with a size hint, however small. */
function pool(size = 2, idleMs = 10_000, minBytes = 0): DigestThreads {
  const p = new DigestThreads(size, idleMs, minBytes);
  pools.push(p);
  return p;
}

afterEach(async () => {
  await Promise.all(pools.splice(0).map((p) => p.close()));
});

async function feed(d: Digester, algorithm: 'sha256' | 'sha512', data: Buffer, chunk: (i: number) => number): Promise<string> {
  const h = d.create(algorithm, data.length);
  for (let off = 0, i = 0; off < data.length; i++) {
    const n = Math.min(chunk(i), data.length - off);
    await h.update(data.subarray(off, off + n));
    off += n;
  }
  return h.digest();
}

describe('DigestThreads', () => {
  const sizes = [0, 1, 4096, DIGEST_BATCH - 1, DIGEST_BATCH, DIGEST_BATCH + 1, 5 * DIGEST_BATCH + 12345];
  for (const size of sizes) {
    it(`matches node:crypto for ${size} bytes in uneven chunks, sha256 and sha512`, async () => {
      const p = pool();
      const data = randomBytes(size);
      for (const alg of ['sha256', 'sha512'] as const) {
        const want = `${alg}:${createHash(alg).update(data).digest('hex')}`;
        expect(await feed(p, alg, data, (i) => [65536, 7, 300_000, 1 << 20][i % 4]!)).toBe(want);
        expect(await feed(inlineDigester, alg, data, () => 65536)).toBe(want);
      }
    });
  }

  it('hashes many streams at once on few threads, each to its own digest', async () => {
    const p = pool(2);
    const blobs = Array.from({ length: 6 }, (_, i) => randomBytes(3 * DIGEST_BATCH + i * 1000));
    const got = await Promise.all(blobs.map((b) => feed(p, 'sha256', b, () => 64 << 10)));
    expect(got).toEqual(blobs.map((b) => `sha256:${createHash('sha256').update(b).digest('hex')}`));
    expect(p.running).toBeLessThanOrEqual(2);
  });

  it('more digests on one thread than it has shared slots all finish, each right (none waits on another in a circle)', async () => {
    const p = pool(1);
    const blobs = Array.from({ length: 12 }, (_, i) => randomBytes(2 * DIGEST_BATCH + 1 + i * 7919));
    // Each first fills and sends a batch, then holds a partly filled slot while the others do the same.
    const digests = blobs.map(() => p.create('sha256', 1 << 30));
    for (const [i, b] of blobs.entries()) await digests[i]!.update(b.subarray(0, DIGEST_BATCH + 100));
    await Promise.all(blobs.map(async (b, i) => {
      for (let off = DIGEST_BATCH + 100; off < b.length; off += 300_001) await digests[i]!.update(b.subarray(off, Math.min(b.length, off + 300_001)));
    }));
    expect(await Promise.all(digests.map((d) => d.digest()))).toEqual(blobs.map((b) => `sha256:${createHash('sha256').update(b).digest('hex')}`));
  });

  it('asks the writer to wait once a few batches are in flight, rather than queueing without bound', async () => {
    const p = pool(1);
    const h = p.create('sha256', 1 << 30);
    // One 16 MiB write is sixteen batches: far past the window.
    const wait = h.update(randomBytes(16 * DIGEST_BATCH));
    expect(wait).toBeInstanceOf(Promise);
    await wait;
    expect(await h.digest()).toMatch(/^sha256:[0-9a-f]{64}$/);
  });

  it('blobs under the size threshold, or of unknown size, never start a thread', async () => {
    const p = pool(2, 10_000, THREAD_MIN_BYTES);
    const data = randomBytes(THREAD_MIN_BYTES - 1);
    expect(await feed(p, 'sha256', data, () => 1 << 20)).toBe(`sha256:${createHash('sha256').update(data).digest('hex')}`);
    const unknown = p.create('sha256');
    await unknown.update(randomBytes(3 * DIGEST_BATCH));
    await unknown.digest();
    expect(p.running).toBe(0);
  });

  it('stops its threads when idle, and starts them again when needed', async () => {
    const p = pool(2, 50);
    await feed(p, 'sha256', randomBytes(2 * DIGEST_BATCH), () => 1 << 20);
    expect(p.running).toBeGreaterThan(0);
    const deadline = Date.now() + 5000;
    while (p.running > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(p.running).toBe(0);
    const data = randomBytes(2 * DIGEST_BATCH);
    expect(await feed(p, 'sha256', data, () => 1 << 20)).toBe(`sha256:${createHash('sha256').update(data).digest('hex')}`);
  });

  it('an aborted digest frees its thread for the next one', async () => {
    const p = pool(1, 50);
    const h = p.create('sha256', 1 << 30);
    await h.update(randomBytes(3 * DIGEST_BATCH));
    h.abort();
    const data = randomBytes(2 * DIGEST_BATCH);
    expect(await feed(p, 'sha256', data, () => 1 << 20)).toBe(`sha256:${createHash('sha256').update(data).digest('hex')}`);
  });

  it('a pool stopped mid-hash fails the digest instead of leaving it waiting', async () => {
    const p = pool(1);
    const h = p.create('sha256', 1 << 30);
    await h.update(randomBytes(2 * DIGEST_BATCH));
    await p.close();
    await expect(h.digest()).rejects.toThrow(/hashing threads stopped/);
    await expect(p.create('sha256', 1 << 30).update(randomBytes(DIGEST_BATCH))).rejects.toThrow(/hashing threads stopped/);
  });
});
