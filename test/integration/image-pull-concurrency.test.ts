/**
 * The layers of one pull download, verify and unpack at once, against a real
 * `skiff cri` and a registry that answers each layer at its own pace: out of
 * order they still land as the right chain with the right content; one bad
 * layer stops the others at once and leaves nothing behind; and a pull that
 * shares a layer with a failing one still gets it.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type http from 'node:http';
import Database from 'better-sqlite3';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { codeOf, makeDirs, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { HostileRegistry, type SeenRequest } from '../helpers/hostile-registry.js';
import { buildImage, type BuiltImage, type Entry } from '../helpers/oci.js';
import { chainIds } from '../../src/image/service.js';
import { randomBytes } from 'node:crypto';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends `data` in two halves with `pauseMs` between them, after `delayMs`; stops if the client hangs up. */
async function slowly(res: http.ServerResponse, seen: SeenRequest, data: Buffer, delayMs: number, pauseMs: number): Promise<void> {
  await sleep(delayMs);
  if (res.destroyed) return;
  res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': data.length });
  const half = data.length >> 1;
  res.write(data.subarray(0, half));
  seen.sent += half;
  await sleep(pauseMs);
  if (res.destroyed) return;
  res.end(data.subarray(half));
  seen.sent += data.length - half;
}

describe.skipIf(!isRoot)('PullImage: layers of one pull at once', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let reg: HostileRegistry;

  beforeAll(async () => {
    reg = await new HostileRegistry().start();
    dirs = await makeDirs();
    // A progress timeout far beyond the tests' own: a download that skiff does not stop itself would hang them.
    skiff = await new SkiffProcess(dirs, ['--image-pull-progress-timeout', '10m']).start();
  });
  afterEach(() => {
    reg.handler = () => false;
  });
  afterAll(async () => {
    await skiff?.stop();
    await reg?.close();
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
  });

  /** Layer blob digest → index, for a handler. */
  function layerIndex(img: BuiltImage, url: string | undefined): number {
    const p = new URL(url ?? '/', 'http://x').pathname;
    return img.layers.findIndex((l) => p.endsWith(`/blobs/${l.digest}`));
  }

  /** What the daemon's store holds: blob files, ingests, snapshot dirs (committed and in progress), snapshot rows. */
  async function inventory(): Promise<{ blobs: string[]; ingest: string[]; snapshots: string[]; work: string[]; rows: number }> {
    const ls = (p: string) => fs.readdir(p).catch(() => [] as string[]);
    const db = new Database(path.join(dirs.root, 'metadata.db'), { readonly: true, fileMustExist: true });
    try {
      return {
        blobs: (await ls(path.join(dirs.root, 'content', 'blobs', 'sha256'))).sort(),
        ingest: await ls(path.join(dirs.root, 'content', 'ingest')),
        snapshots: (await ls(path.join(dirs.root, 'snapshots'))).sort(),
        work: await ls(path.join(dirs.root, 'snapshots-work')),
        rows: (db.prepare('SELECT COUNT(*) AS n FROM snapshots').get() as { n: number }).n,
      };
    } finally {
      db.close();
    }
  }

  /** Files (not sockets, pipes or event fds) the daemon holds open. */
  async function openFiles(): Promise<string[]> {
    const fdDir = `/proc/${skiff.child.pid}/fd`;
    const out: string[] = [];
    for (const fd of await fs.readdir(fdDir)) {
      const target = await fs.readlink(path.join(fdDir, fd)).catch(() => '');
      if (target.startsWith('/') && target.startsWith(dirs.root)) out.push(target);
    }
    return out.sort();
  }

  it('layers answered out of order, each at its own pace, download together and still make the right chain with the right content', async () => {
    const layerEntries: Entry[][] = [
      [{ name: 'etc/', type: 'directory' }, { name: 'etc/which', data: 'layer 0' }, { name: 'etc/only-0', data: 'zero' }, { name: 'big0', data: randomBytes(400_000) }],
      [{ name: 'etc/', type: 'directory' }, { name: 'etc/which', data: 'layer 1' }, { name: 'etc/.wh.only-0', data: '' }, { name: 'big1', data: randomBytes(400_000) }],
      [{ name: 'etc/', type: 'directory' }, { name: 'etc/which', data: 'layer 2' }, { name: 'etc/only-2', data: 'two' }, { name: 'big2', data: randomBytes(400_000) }],
    ];
    const img = await buildImage({ layers: layerEntries.map((entries) => ({ entries })) });
    reg.serve('test/order', 'v1', img);
    // The bottom layer comes last and slowest, the top one first.
    const finished: number[] = [];
    reg.handler = (req, res, seen) => {
      const i = layerIndex(img, req.url);
      if (i < 0) return false;
      const delay = [700, 350, 0][i]!;
      void slowly(res, seen, img.layers[i]!.data, delay, 300).then(() => (finished[i] = Date.now()));
      return true;
    };
    const res = await skiff.images.PullImage({ image: { image: `${reg.host}/test/order:v1` } });
    expect(res.imageRef).toBe(img.config.digest);

    // All three were asked for before the first of them had been sent whole.
    const asked = img.layers.map((l) => reg.requests.find((r) => r.path.endsWith(l.digest))!.at);
    expect(Math.max(...asked)).toBeLessThan(Math.min(...finished));

    // Each layer's snapshot has its parent in the image's order, and holds that layer's files.
    const chain = chainIds(img.diffIds);
    const db = new Database(path.join(dirs.root, 'metadata.db'), { readonly: true, fileMustExist: true });
    try {
      const rows = chain.map((c) => db.prepare('SELECT id, parent FROM snapshots WHERE chain_id = ?').get(c) as { id: number; parent: string | null });
      expect(rows.map((r) => r.parent)).toEqual([null, chain[0], chain[1]]);
      const dir = (i: number) => path.join(dirs.root, 'snapshots', String(rows[i]!.id), 'fs');
      for (let i = 0; i < 3; i++) {
        expect(await fs.readFile(path.join(dir(i), 'etc/which'), 'utf8')).toBe(`layer ${i}`);
        expect((await fs.readFile(path.join(dir(i), `big${i}`))).equals(layerEntries[i]![3]!.data as Buffer), `big${i} in layer ${i}`).toBe(true);
      }
      // Layer 1's whiteout of layer 0's file is an overlay whiteout in layer 1's own directory.
      const wh = await fs.lstat(path.join(dir(1), 'etc/only-0'));
      expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    } finally {
      db.close();
    }
    await skiff.images.RemoveImage({ image: { image: res.imageRef! } });
  });

  it('a layer that fails its digest stops the other downloads at once, starts no more, and leaves no blob, snapshot, ingest or open file', async () => {
    // Four layers, three download slots: the last waits for a slot and must not start once the pull has failed.
    const img = await buildImage({
      layers: [0, 1, 2, 3].map((i) => ({ entries: [{ name: `f${i}`, data: randomBytes(300_000) }] })),
    });
    reg.serve('test/bad', 'v1', img);
    const before = await inventory();
    const filesBefore = await openFiles();
    const stalled: SeenRequest[] = [];
    reg.handler = (req, res, seen) => {
      const i = layerIndex(img, req.url);
      if (i < 0 || i === 3) return false;
      const data = img.layers[i]!.data;
      if (i === 1) {
        // The right length, one byte wrong, sent at once after the others started.
        const bad = Buffer.from(data);
        bad[bad.length - 1] ^= 0xff;
        setTimeout(() => res.writeHead(200, { 'content-length': bad.length }).end(bad), 300);
        return true;
      }
      // Half of each other layer, then nothing until skiff hangs up.
      stalled.push(seen);
      res.writeHead(200, { 'content-length': data.length });
      res.write(data.subarray(0, data.length >> 1));
      seen.sent = data.length >> 1;
      return true;
    };
    const t0 = Date.now();
    const err = await codeOf(skiff.images.PullImage({ image: { image: `${reg.host}/test/bad:v1` } }));
    expect(err.details).toMatch(/digest mismatch/);
    // The stalled layers would have held the pull until the 10-minute progress timeout.
    expect(Date.now() - t0).toBeLessThan(20_000);
    expect(stalled.length).toBe(2);
    expect(reg.requests.filter((r) => r.path.endsWith(img.layers[3]!.digest))).toEqual([]);
    for (const r of stalled) {
      const closedAt = await Promise.race([r.closed, sleep(5000).then(() => -1)]);
      expect(closedAt, `connection for ${r.path} still open`).toBeGreaterThan(0);
    }
    expect(await inventory()).toEqual(before);
    expect(await openFiles()).toEqual(filesBefore);
    expect((await skiff.images.ListImages({})).images.map((i) => i.id)).not.toContain(img.config.digest);
  });

  it('a pull that shares a layer with a pull that fails still gets that layer, fetched again for itself', async () => {
    const shared = { entries: [{ name: 'shared', data: randomBytes(300_000) }] };
    const good = await buildImage({ layers: [shared, { entries: [{ name: 'good', data: 'good' }] }] });
    const bad = await buildImage({ layers: [shared, { entries: [{ name: 'bad', data: 'bad' }] }] });
    expect(good.layers[0]!.digest).toBe(bad.layers[0]!.digest);
    reg.serve('test/good', 'v1', good);
    reg.serve('test/bad2', 'v1', bad);
    const sharedGets: SeenRequest[] = [];
    reg.handler = (req, res, seen) => {
      const p = new URL(req.url ?? '/', 'http://x').pathname;
      if (p.endsWith(`/blobs/${good.layers[0]!.digest}`)) {
        // Slow enough that both pulls are waiting on it when the bad layer fails.
        sharedGets.push(seen);
        void slowly(res, seen, good.layers[0]!.data, 100, 1000);
        return true;
      }
      if (p.endsWith(`/blobs/${bad.layers[1]!.digest}`)) {
        const wrong = Buffer.from(bad.layers[1]!.data);
        wrong[wrong.length - 1] ^= 0xff;
        setTimeout(() => res.writeHead(200, { 'content-length': wrong.length }).end(wrong), 400);
        return true;
      }
      return false;
    };
    const failing = codeOf(skiff.images.PullImage({ image: { image: `${reg.host}/test/bad2:v1` } }));
    // The good pull starts once the bad one's download of the shared layer is under way, and joins it.
    const deadline = Date.now() + 10_000;
    while (!sharedGets.length && Date.now() < deadline) await sleep(10);
    const ok = skiff.images.PullImage({ image: { image: `${reg.host}/test/good:v1` } });
    expect((await failing).details).toMatch(/digest mismatch/);
    expect((await ok).imageRef).toBe(good.config.digest);
    // The bad pull's download of the shared layer was stopped, and the good pull fetched it again.
    expect(sharedGets.length).toBe(2);
    const st = await skiff.images.ImageStatus({ image: { image: good.config.digest } });
    expect(st.image?.id).toBe(good.config.digest);
    await skiff.images.RemoveImage({ image: { image: good.config.digest } });
  });
});
