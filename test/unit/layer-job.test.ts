/**
 * One layer's job as a layer thread runs it: the compressed chunks are
 * written to the ingest file (and hashed) and unpacked at once; each side's
 * failure is reported apart, a chunk is given back for reuse only once zlib
 * is done with it, and errors keep their kind across the thread boundary.
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isNoSpace, SkiffError } from '../../src/errors.js';
import { fromWire, LayerRun, NeedsLowerLayers, toWire, type LayerJob } from '../../src/image/layer-job.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { compress, tarOf } from '../helpers/oci.js';

const sha256 = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

/** Offers `data` in chunks of `size` without waiting for any, then ends: the end must come after every chunk. */
function feedAll(run: LayerRun, data: Buffer, size: number): void {
  for (let off = 0; off < data.length; off += size) void run.offer(data.subarray(off, off + size));
  run.end();
}

describe.skipIf(!isRoot)(`LayerRun (${isRoot ? 'root' : rootSkipReason})`, () => {
  let base: string;
  let job: LayerJob;

  beforeEach(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-layer-job-'));
    await fs.mkdir(path.join(base, 'layer'));
    job = { dir: path.join(base, 'layer'), blobTmp: path.join(base, 'blob'), algorithm: 'sha256', lower: undefined };
  });
  afterEach(async () => {
    await fs.rm(base, { recursive: true, force: true });
  });

  it('writes the blob and unpacks the same chunks, offered all at once before the end', async () => {
    const big = randomBytes(3 << 20);
    const raw = await tarOf([
      { name: 'etc', type: 'directory' },
      { name: 'etc/hello', data: 'hello\n' },
      { name: 'big', data: big },
    ]);
    const blob = compress(raw, 'gzip');
    const run = new LayerRun(job);
    feedAll(run, blob, 7001);
    const o = await run.outcome;
    expect(o.stored).toEqual({ ok: true, value: { digest: sha256(blob), size: blob.length } });
    expect(o.unpacked.ok && o.unpacked.value.diffId).toBe(sha256(raw));
    expect((await fs.readFile(job.blobTmp)).equals(blob)).toBe(true);
    expect(await fs.readFile(path.join(job.dir, 'etc/hello'), 'utf8')).toBe('hello\n');
    expect((await fs.readFile(path.join(job.dir, 'big'))).equals(big)).toBe(true);
  });

  it('keeps storing the blob when the unpack refuses an entry', async () => {
    const blob = compress(await tarOf([{ name: '../escape', data: 'x' }, { name: 'after', data: randomBytes(1 << 20) }]), 'gzip');
    const run = new LayerRun(job);
    feedAll(run, blob, 65536);
    const o = await run.outcome;
    expect(o.unpacked.ok).toBe(false);
    expect(!o.unpacked.ok && (o.unpacked.error as Error).message).toMatch(/refusing layer entry "..\/escape"/);
    expect(o.stored).toEqual({ ok: true, value: { digest: sha256(blob), size: blob.length } });
    await expect(fs.access(path.join(base, 'escape'))).rejects.toThrow();
  });

  it('stops the unpack when the blob cannot be written', async () => {
    const blob = compress(await tarOf([{ name: 'f', data: randomBytes(1 << 20) }]), 'gzip');
    const run = new LayerRun({ ...job, blobTmp: path.join(base, 'missing-dir', 'blob') });
    // No end: a job whose blob cannot be written settles by itself.
    void run.offer(blob.subarray(0, 1000));
    const o = await run.outcome;
    expect(!o.stored.ok && (o.stored.error as { code?: string }).code).toBe('ENOENT');
    expect(o.unpacked.ok).toBe(false);
  });

  it('fails both sides with the download\'s error', async () => {
    const blob = compress(await tarOf([{ name: 'f', data: randomBytes(2 << 20) }]), 'gzip');
    const run = new LayerRun(job);
    await run.offer(blob.subarray(0, blob.length >> 1));
    const cut = new SkiffError('Unavailable', 'the registry went away');
    run.abort(cut);
    const o = await run.outcome;
    expect(o.stored).toEqual({ ok: false, error: cut });
    expect(o.unpacked.ok).toBe(false);
  });

  it('settles both sides when the download fails before its first byte', async () => {
    const run = new LayerRun(job);
    const cut = new SkiffError('Unavailable', 'no progress');
    run.abort(cut);
    const o = await run.outcome;
    expect(o.stored).toEqual({ ok: false, error: cut });
    expect(o.unpacked.ok).toBe(false);
  });

  it('gives a gzip chunk back once written and inflated, and never a chunk the unpacker may still hold', async () => {
    const raw = await tarOf([{ name: 'f', data: randomBytes(3 << 20) }]);
    const gz = compress(raw, 'gzip');
    const run = new LayerRun(job);
    const reused: boolean[] = [];
    for (let off = 0; off < gz.length; off += 1 << 20) reused.push(await run.offer(gz.subarray(off, off + (1 << 20))));
    run.end();
    const o = await run.outcome;
    expect(o.unpacked.ok && o.unpacked.value.diffId).toBe(sha256(raw));
    expect(reused.every(Boolean)).toBe(true);

    // A plain tar goes to the unpacker as it is: tar-stream and the file writers may keep a chunk after taking it.
    await fs.rm(job.blobTmp);
    await fs.rm(job.dir, { recursive: true });
    await fs.mkdir(job.dir);
    const plain = new LayerRun(job);
    const plainReused: boolean[] = [];
    for (let off = 0; off < raw.length; off += 1 << 20) plainReused.push(await plain.offer(raw.subarray(off, off + (1 << 20))));
    plain.end();
    const p = await plain.outcome;
    expect(p.unpacked.ok && p.unpacked.value.diffId).toBe(sha256(raw));
    expect(plainReused.some(Boolean)).toBe(false);
  });

  it('inflates a gzip layer once: a gzip inside it is not a tar, as for any other reader', async () => {
    const raw = await tarOf([{ name: 'f', data: 'x' }]);
    const blob = compress(compress(raw, 'gzip'), 'gzip');
    const run = new LayerRun(job);
    feedAll(run, blob, 4096);
    const o = await run.outcome;
    expect(o.stored.ok).toBe(true);
    expect(o.unpacked.ok).toBe(false);
    expect(!o.unpacked.ok && (o.unpacked.error as Error).message).toMatch(/not a tar archive/);
    expect(await fs.readdir(job.dir)).toEqual([]);
  });

  it('fails a gzip stream that does not inflate as the layer\'s fault', async () => {
    const blob = compress(await tarOf([{ name: 'f', data: randomBytes(1 << 20) }]), 'gzip');
    blob[blob.length >> 1] ^= 0xff;
    const run = new LayerRun(job);
    feedAll(run, blob, 65536);
    const o = await run.outcome;
    expect(!o.unpacked.ok && o.unpacked.error).toBeInstanceOf(SkiffError);
    expect(!o.unpacked.ok && (o.unpacked.error as SkiffError).kind).toBe('InvalidArgument');
  });

  it('asks for the lower layers when a hardlink points below a layer not unpacked yet', async () => {
    const blob = compress(await tarOf([{ name: 'link', type: 'link', linkname: 'bin/sh' }]), 'gzip');
    const run = new LayerRun({ ...job, lower: 'later' });
    feedAll(run, blob, 512);
    const o = await run.outcome;
    expect(!o.unpacked.ok && o.unpacked.error).toBeInstanceOf(NeedsLowerLayers);
    expect(o.stored.ok).toBe(true);
  });
});

describe('layer thread errors on the wire', () => {
  it('keep their kind, message and errno code', () => {
    const skiff = fromWire(toWire(new SkiffError('InvalidArgument', 'bad entry')));
    expect(skiff).toBeInstanceOf(SkiffError);
    expect(skiff).toMatchObject({ kind: 'InvalidArgument', message: 'bad entry' });
    const full = fromWire(toWire(Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC', errno: -28, syscall: 'write' })));
    expect(isNoSpace(full)).toBe(true);
    expect(full).toMatchObject({ code: 'ENOSPC', errno: -28, syscall: 'write', message: 'ENOSPC: no space left on device, write' });
    expect(fromWire(toWire(new NeedsLowerLayers()))).toBeInstanceOf(NeedsLowerLayers);
  });
});
