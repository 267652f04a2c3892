import { describe, expect, it } from 'vitest';
import type { CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import { ImageGc } from '../../src/kubelet-lite/image-gc.js';
import { createLogger } from '../../src/log.js';

interface FakeImage {
  id: string;
  size: number;
  pinned?: boolean;
}

function fakeCri(images: FakeImage[], containers: string[]): { cri: CriEndpoint; removed: string[]; setContainers(c: string[]): void } {
  const removed: string[] = [];
  let ctrs = containers;
  const cri = {
    images: {
      listImages: async () => ({ images: images.filter((i) => !removed.includes(i.id)).map((i) => ({ id: i.id, size: i.size, pinned: !!i.pinned, repoTags: [`r/${i.id}:1`], repoDigests: [] })) }),
      imageFsInfo: async () => ({ imageFilesystems: [{ fsId: { mountpoint: '/fake' }, usedBytes: { value: 0 } }] }),
      removeImage: async (req: { image: { image: string } }) => {
        removed.push(req.image.image);
        return {};
      },
    },
    runtime: {
      listContainers: async () => ({ containers: ctrs.map((image, i) => ({ id: `c${i}`, imageRef: image, image: { image } })) }),
    },
  } as unknown as CriEndpoint;
  return { cri, removed, setContainers: (c) => (ctrs = c) };
}

const log = createLogger('error');

describe('image GC', () => {
  it('removes unused images least recently used first until under the low mark, sparing in-use, pinned and young ones', async () => {
    let now = 0;
    let used = 900;
    const { cri, removed, setContainers } = fakeCri(
      [{ id: 'inuse', size: 500 }, { id: 'old', size: 60 }, { id: 'recent', size: 60 }, { id: 'pinned', size: 100, pinned: true }, { id: 'spare', size: 60 }],
      ['inuse', 'recent'],
    );
    const gc = new ImageGc(cri, { highThresholdPercent: 85, lowThresholdPercent: 80, now: () => now, statfs: async () => ({ capacity: 1000, available: 1000 - used }), log });
    await gc.observe();
    // "recent" stops being used later than anything else was.
    now = 60_000;
    await gc.observe();
    setContainers(['inuse']);
    now = 200_000;
    const r = await gc.run();
    expect(r.usagePercent).toBe(90);
    // 100 bytes to free: "old" and "spare" were never used (tie broken by first sight), then "recent".
    expect(removed).toEqual(['old', 'spare']);
    expect(r.freedBytes).toBe(120);
    expect(removed).not.toContain('inuse');
    expect(removed).not.toContain('pinned');
    used = 700;
    expect((await gc.run()).removed).toEqual([]);
  });

  it('keeps images it first saw less than the minimum age ago', async () => {
    let now = 0;
    const { cri, removed } = fakeCri([{ id: 'fresh', size: 500 }], []);
    const gc = new ImageGc(cri, { highThresholdPercent: 85, lowThresholdPercent: 80, now: () => now, statfs: async () => ({ capacity: 1000, available: 50 }), log });
    await gc.run();
    expect(removed).toEqual([]);
    now = 121_000;
    await gc.run();
    expect(removed).toEqual(['fresh']);
  });

  it('refuses a low threshold that is not below the high one', () => {
    const { cri } = fakeCri([], []);
    expect(() => new ImageGc(cri, { highThresholdPercent: 80, lowThresholdPercent: 80, log })).toThrow(/must be below/);
  });
});
