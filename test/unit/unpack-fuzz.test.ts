/**
 * Fuzzes the unpacker with stacked layers that mix directories, symlinks
 * (absolute and relative, into and out of the layer), hardlinks, whiteouts,
 * opaque markers and devices, and checks that nothing outside the layer being
 * written changes: not the sentinel "host" tree, not the lower layers, not
 * their neighbours. A refused layer is fine; a changed byte outside is not.
 * The generator is seeded, so a failure names an iteration that replays.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findInLowers } from '../../src/image/snapshot.js';
import { applyLayer } from '../../src/image/unpack.js';
import { lgetxattr } from '../../src/sys/libc.js';
import { isRoot, rootSkipReason } from '../helpers/env.js';
import { tarOf, type Entry } from '../helpers/oci.js';
import { prng } from '../helpers/prng.js';

const ITERATIONS = 300;
const SEED = 0x5eed_cafe;

const SECRET = 'HOST-SECRET-CONTENT';

/** Paths below `dir` (minus `skip`) with kind, mode, owner, times, opaque mark and content. */
async function fingerprint(dir: string, skip: string[] = []): Promise<string[]> {
  const out: string[] = [];
  const walk = async (d: string) => {
    for (const name of (await fs.readdir(d)).sort()) {
      const p = path.join(d, name);
      if (skip.includes(p)) continue;
      const st = await fs.lstat(p);
      let what = '';
      if (st.isSymbolicLink()) what = `-> ${await fs.readlink(p)}`;
      else if (st.isFile()) what = await fs.readFile(p, 'utf8');
      const opaque = st.isDirectory() ? lgetxattr(p, 'trusted.overlay.opaque')?.toString() ?? '' : '';
      out.push(`${path.relative(dir, p)} ${st.mode.toString(8)} ${st.uid}:${st.gid} ${st.rdev} ${st.nlink} ${st.mtimeMs} ${opaque} ${what}`);
      if (st.isDirectory()) await walk(p);
    }
  };
  await walk(dir);
  return out;
}

describe.skipIf(!isRoot)(`unpack fuzz: ${ITERATIONS} seeded stacks of hostile layers (${isRoot ? 'root' : rootSkipReason})`, () => {
  let base: string;
  let host: string;

  beforeAll(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-fuzz-'));
    host = path.join(base, 'host');
    await fs.mkdir(path.join(host, 'dir/sub'), { recursive: true });
    await fs.writeFile(path.join(host, 'dir/secret'), `${SECRET} 1`);
    await fs.writeFile(path.join(host, 'dir/sub/deep'), `${SECRET} 2`);
    await fs.writeFile(path.join(host, 'victim'), `${SECRET} 3`);
    await fs.symlink('dir', path.join(host, 'lnk'));
  });
  afterAll(async () => {
    await fs.rm(base, { recursive: true, force: true });
  });

  it('never changes or reads anything outside the layer it writes', { timeout: 300_000 }, async () => {
    const rand = prng(SEED);
    const pick = <T,>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const segs = ['a', 'b', 'c', 'd', 'x'] as const;
    const relPath = (): string => Array.from({ length: 1 + Math.floor(rand() * 3) }, () => pick(segs)).join('/');
    // Targets that lead out: absolute into the host tree, relative climbs of every depth, magic links; and ones that stay in.
    const linkTarget = (): string =>
      pick([
        host,
        path.join(host, 'dir'),
        path.join(host, 'lnk'),
        `${'../'.repeat(1 + Math.floor(rand() * 7))}host`,
        `${'../'.repeat(1 + Math.floor(rand() * 7))}host/dir`,
        '../layer0',
        '/proc/self/root/tmp',
        '/',
        '.',
        '..',
        'a',
        '../a',
        '/a',
        relPath(),
        `../${relPath()}`,
      ]);
    /** Files made so far in this stack: hardlink targets that may still be there. */
    let files: string[] = [];
    const entry = (layer: number, n: number): Entry => {
      const p = relPath();
      const r = rand();
      if (r < 0.4 && r >= 0.2) files.push(p);
      if (r < 0.2) return { name: `${p}/`, type: 'directory', mode: pick([0o755, 0o777, 0o700]), uid: pick([0, 7]) };
      if (r < 0.4) return { name: p, data: `layer${layer}-entry${n}`, mode: pick([0o644, 0o4755, 0o666]) };
      if (r < 0.6) return { name: p, type: 'symlink', linkname: linkTarget() };
      if (r < 0.7) {
        const linkname = files.length && rand() < 0.7 ? pick(files) : pick([relPath(), `${relPath()}/secret`, 'a/secret', 'a/dir/secret', 'lnk/secret']);
        return { name: p, type: 'link', linkname };
      }
      if (r < 0.82) {
        const dir = rand() < 0.3 ? '' : `${relPath()}/`;
        return { name: `${dir}.wh.${rand() < 0.1 ? pick(['..', '.', '']) : pick([...segs, 'victim', 'dir'])}`, data: '' };
      }
      if (r < 0.9) return { name: `${rand() < 0.3 ? '' : `${relPath()}/`}.wh..wh..opq`, data: '' };
      if (r < 0.98) return { name: p, type: pick(['character-device', 'fifo'] as const), devmajor: 1, devminor: 3, mode: 0o666 };
      // Now and then a name that is refused outright.
      return { name: pick([`../${p}`, `/${p}`, `${p}/../../x`]), data: 'x' };
    };

    let applied = 0;
    let refused = 0;
    const outcomes = new Map<string, number>();
    for (let i = 0; i < ITERATIONS; i++) {
      const iter = path.join(base, `iter${i}`);
      await fs.mkdir(iter);
      await fs.writeFile(path.join(iter, 'neighbour'), `${SECRET} neighbour`);
      const layers: string[] = [];
      files = [];
      const depth = 2 + Math.floor(rand() * 2);
      for (let l = 0; l < depth; l++) {
        const entries = Array.from({ length: 2 + Math.floor(rand() * 8) }, (_, n) => entry(l, n));
        const dir = path.join(iter, `layer${l}`);
        await fs.mkdir(dir);
        const before = await fingerprint(base, [dir]);
        const lowers = [...layers].reverse();
        let ok = true;
        try {
          await applyLayer(dir, Readable.from([await tarOf(entries)]), { lookupLower: (rel) => findInLowers(lowers, rel) });
          applied++;
        } catch (err) {
          ok = false;
          refused++;
          const why = (err as Error).message.replace(/"[^"]*"/g, '"…"').replace(/\/tmp\/\S+/g, '…');
          outcomes.set(why, (outcomes.get(why) ?? 0) + 1);
        }
        const after = await fingerprint(base, [dir]);
        expect(after, `iteration ${i} layer ${l}: ${JSON.stringify(entries)}`).toEqual(before);
        // Nothing of the host's (or a neighbour's) files was copied into the layer.
        const inside = await fingerprint(dir);
        expect(inside.filter((line) => line.includes(SECRET)), `iteration ${i} layer ${l}: ${JSON.stringify(entries)}`).toEqual([]);
        if (!ok) break;
        layers.push(dir);
      }
      await fs.rm(iter, { recursive: true, force: true });
    }
    // The generator must exercise both outcomes, or the test proves nothing.
    expect(applied).toBeGreaterThan(ITERATIONS / 4);
    expect(refused).toBeGreaterThan(ITERATIONS / 4);
    // Every refusal is a refusal the unpacker meant, not a stray system error.
    const stray = [...outcomes.keys()].filter((m) => !/refusing layer entry/.test(m));
    expect(stray).toEqual([]);
  });
});
