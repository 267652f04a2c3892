import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { USERNS_LENGTH, UsernsAllocator, UsernsExhaustedError } from '../../src/kubelet-lite/userns.js';

let tmp: string;
let file: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kl-userns-'));
  file = path.join(tmp, 'userns-ranges.json');
});
afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('UsernsAllocator', () => {
  it('gives each pod its own block of 65536 ids at a multiple of 65536, never block 0', async () => {
    const a = await UsernsAllocator.load({ file });
    const r1 = await a.allocate('pod-a');
    const r2 = await a.allocate('pod-b');
    expect(r1).toEqual({ hostId: 65536, length: USERNS_LENGTH });
    expect(r2).toEqual({ hostId: 131072, length: USERNS_LENGTH });
    expect(a.get('pod-a')).toEqual(r1);
    expect(a.get('pod-c')).toBeUndefined();
  });

  it('answers the same block for a pod that asks again', async () => {
    const a = await UsernsAllocator.load({ file });
    const r = await a.allocate('pod-a');
    await a.allocate('pod-b');
    expect(await a.allocate('pod-a')).toEqual(r);
    expect(a.uids().sort()).toEqual(['pod-a', 'pod-b']);
  });

  it('reuses a released block, lowest first', async () => {
    const a = await UsernsAllocator.load({ file });
    await a.allocate('pod-a');
    const b = await a.allocate('pod-b');
    await a.allocate('pod-c');
    await a.release('pod-b');
    expect(a.get('pod-b')).toBeUndefined();
    expect(await a.allocate('pod-d')).toEqual(b);
    await a.release('never-had-one');
  });

  it('refuses a pod past the limit until another releases its block', async () => {
    const a = await UsernsAllocator.load({ file, max: 2 });
    await a.allocate('pod-a');
    await a.allocate('pod-b');
    await expect(a.allocate('pod-c')).rejects.toBeInstanceOf(UsernsExhaustedError);
    await expect(a.allocate('pod-c')).rejects.toThrow(/all 2 ranges of 65536 host ids are in use/);
    expect(a.get('pod-c')).toBeUndefined();
    await a.release('pod-a');
    expect(await a.allocate('pod-c')).toEqual({ hostId: 65536, length: USERNS_LENGTH });
  });

  it('keeps every pod\'s block across a reload, and forgets released ones', async () => {
    const a = await UsernsAllocator.load({ file });
    await a.allocate('pod-a');
    const b = await a.allocate('pod-b');
    const c = await a.allocate('pod-c');
    await a.release('pod-a');
    const again = await UsernsAllocator.load({ file });
    expect(again.get('pod-a')).toBeUndefined();
    expect(again.get('pod-b')).toEqual(b);
    expect(again.get('pod-c')).toEqual(c);
    // A new pod after the reload does not take a block still held.
    expect(await again.allocate('pod-e')).toEqual({ hostId: 65536, length: USERNS_LENGTH });
    expect(JSON.parse(fs.readFileSync(file, 'utf8'))).toEqual({ pods: { 'pod-b': 131072, 'pod-c': 196608, 'pod-e': 65536 } });
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(fs.existsSync(`${file}.tmp`)).toBe(false);
  });

  it('drops saved entries that are not whole free blocks inside the limit', async () => {
    fs.writeFileSync(file, JSON.stringify({ pods: { zero: 0, odd: 70000, high: 65536 * 5, good: 65536, twin: 65536, text: '131072' } }));
    const a = await UsernsAllocator.load({ file, max: 3 });
    expect(a.uids()).toEqual(['good']);
    expect(await a.allocate('new')).toEqual({ hostId: 131072, length: USERNS_LENGTH });
  });

  it('starts empty from an unreadable file, and fails an allocation it cannot save', async () => {
    fs.writeFileSync(file, '{not json');
    const a = await UsernsAllocator.load({ file });
    expect(a.uids()).toEqual([]);
    const b = await UsernsAllocator.load({ file: path.join(tmp, 'missing-dir', 'userns.json') });
    await expect(b.allocate('pod-a')).rejects.toThrow(/ENOENT/);
    expect(b.get('pod-a')).toBeUndefined();
  });
});
