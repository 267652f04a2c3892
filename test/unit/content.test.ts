import { createHash } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { LocalContentStore } from '../../src/image/content.js';

const digest = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

describe('LocalContentStore', () => {
  let dir: string;
  let store: LocalContentStore;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-content-'));
    store = new LocalContentStore(dir);
    await store.init();
  });
  afterEach(() => fs.rm(dir, { recursive: true, force: true }));

  it('verifies a blob of several MiB arriving in small chunks, and refuses it under another digest', async () => {
    const data = Buffer.alloc(5 * (1 << 20) + 777);
    for (let i = 0; i < data.length; i++) data[i] = (i * 2654435761) >>> 24;
    const chunks = (b: Buffer) => Readable.from(Array.from({ length: Math.ceil(b.length / 65536) }, (_, i) => b.subarray(i * 65536, (i + 1) * 65536)));
    await store.ingest({ digest: digest(data), size: data.length }, chunks(data));
    expect((await store.readBytes(digest(data))).equals(data)).toBe(true);
    const changed = Buffer.from(data);
    changed[3 << 20] ^= 1;
    await expect(store.ingest({ digest: digest(changed), size: data.length }, chunks(data))).rejects.toThrow(/digest mismatch/);
    expect(await store.list()).toEqual([{ digest: digest(data), size: data.length }]);
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
  });

  it('commits a verified blob and reads it back', async () => {
    const data = Buffer.from('hello blob');
    await store.ingest({ digest: digest(data), size: data.length }, Readable.from([data]));
    expect(await store.has(digest(data))).toBe(true);
    expect(await store.readBytes(digest(data))).toEqual(data);
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
  });

  it('keeps a blob a layer thread wrote to an ingest file only when the size and digest it reports are the descriptor\'s', async () => {
    const data = Buffer.from('written by a layer thread');
    const want = { digest: digest(data), size: data.length };
    for (const [actual, why] of [
      [{ digest: want.digest, size: data.length + 1 }, /its descriptor says/],
      [{ digest: digest(Buffer.from('something else')), size: data.length }, /digest mismatch/],
    ] as const) {
      const f = store.ingestFile(want);
      await fs.writeFile(f.path, data);
      await expect(f.commit(actual)).rejects.toThrow(why);
      expect(await store.has(want.digest)).toBe(false);
      expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
    }
    const f = store.ingestFile(want);
    expect(path.dirname(f.path)).toBe(path.join(dir, 'ingest'));
    await fs.writeFile(f.path, data);
    await f.abort();
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
    const g = store.ingestFile(want);
    await fs.writeFile(g.path, data);
    expect(await g.commit(want)).toEqual(want);
    expect((await store.readBytes(want.digest)).equals(data)).toBe(true);
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
  });

  it('refuses a wrong digest or size and leaves nothing visible', async () => {
    const data = Buffer.from('payload');
    const other = digest(Buffer.from('other'));
    await expect(store.ingest({ digest: other }, Readable.from([data]))).rejects.toThrow(/digest mismatch/);
    await expect(store.ingest({ digest: digest(data), size: 3 }, Readable.from([data]))).rejects.toThrow(/larger than/);
    await expect(store.ingest({ digest: digest(data), size: 100 }, Readable.from([data]))).rejects.toThrow(/7 bytes/);
    expect(await store.list()).toEqual([]);
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
  });

  it('leaves no blob when the source breaks mid-stream', async () => {
    const data = Buffer.alloc(1000, 1);
    const broken = new Readable({
      read() {
        this.push(data.subarray(0, 10));
        this.destroy(new Error('connection reset'));
      },
    });
    await expect(store.ingest({ digest: digest(data), size: data.length }, broken)).rejects.toThrow(/connection reset/);
    expect(await store.list()).toEqual([]);
  });

  it('shares one write between concurrent ingests of a digest', async () => {
    const data = Buffer.alloc(1 << 20, 9);
    const results = await Promise.all([1, 2, 3].map(() => store.ingest({ digest: digest(data), size: data.length }, Readable.from([data]))));
    expect(results.every((r) => r.size === data.length)).toBe(true);
    expect(await store.list()).toEqual([{ digest: digest(data), size: data.length }]);
  });

  it('refuses digests it cannot verify, before writing anything', async () => {
    for (const d of ['md5:abc', 'sha384:' + 'a'.repeat(96), 'sha256', 'blake3:' + 'a'.repeat(64)]) {
      await expect(store.ingest({ digest: d }, Readable.from([Buffer.from('x')])), d).rejects.toThrow(/unsupported digest algorithm.*only sha256 and sha512/);
    }
    await expect(store.ingest({ digest: 'sha512:abc' }, Readable.from([Buffer.from('x')]))).rejects.toThrow(/malformed sha512 digest/);
    await expect(store.ingest({ digest: `sha256:${'A'.repeat(64)}` }, Readable.from([Buffer.from('x')]))).rejects.toThrow(/malformed sha256 digest/);
    expect(() => store.path('sha1:' + 'a'.repeat(40))).toThrow(/unsupported digest algorithm/);
    expect(await store.list()).toEqual([]);
    expect(await fs.readdir(path.join(dir, 'ingest'))).toEqual([]);
  });

  it('verifies sha512 digests, and keeps sha512 blobs apart from sha256 ones', async () => {
    const data = Buffer.from('sha512 payload');
    const good = `sha512:${createHash('sha512').update(data).digest('hex')}`;
    const wrong = `sha512:${createHash('sha512').update('something else').digest('hex')}`;
    await expect(store.ingest({ digest: wrong, size: data.length }, Readable.from([data]))).rejects.toThrow(/digest mismatch/);
    // The same bytes under their sha256 digest do not pass as the sha512 one.
    await store.ingest({ digest: digest(data), size: data.length }, Readable.from([data]));
    expect(await store.has(good)).toBe(false);
    await store.ingest({ digest: good, size: data.length }, Readable.from([data]));
    expect(await store.has(good)).toBe(true);
    expect(await store.readBytes(good)).toEqual(data);
    expect(store.path(good)).toBe(path.join(dir, 'blobs', 'sha512', good.slice('sha512:'.length)));
    expect((await store.list()).map((b) => b.digest).sort()).toEqual([digest(data), good].sort());
    await store.delete(good);
    expect(await store.has(good)).toBe(false);
  });
});
