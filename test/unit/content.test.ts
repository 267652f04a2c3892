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

  it('commits a verified blob and reads it back', async () => {
    const data = Buffer.from('hello blob');
    await store.ingest({ digest: digest(data), size: data.length }, Readable.from([data]));
    expect(await store.has(digest(data))).toBe(true);
    expect(await store.readBytes(digest(data))).toEqual(data);
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

  it('refuses digests it cannot verify', async () => {
    await expect(store.ingest({ digest: 'md5:abc' }, Readable.from([Buffer.from('x')]))).rejects.toThrow(/only sha256/);
  });
});
