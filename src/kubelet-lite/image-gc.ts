/**
 * Image garbage collection as the kubelet's image manager does it: when the
 * image filesystem is fuller than the high mark, remove images no container
 * uses, least recently used first, until it is back under the low mark.
 * Images seen for less than the minimum age and pinned images stay.
 */
import fs from 'node:fs/promises';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { isNotFound, type CriEndpoint } from './cri-client.js';
import { grpcDetails } from './images.js';

export interface ImageGcOptions {
  highThresholdPercent: number;
  lowThresholdPercent: number;
  /** An image first seen less than this long ago is never removed (the kubelet's MinAge, 2 min). */
  minAgeMs?: number;
  now?: () => number;
  /** Capacity and free bytes of the filesystem holding `path` (injected in tests). */
  statfs?: (path: string) => Promise<{ capacity: number; available: number }>;
  log: Logger;
}

export interface GcResult {
  usagePercent: number;
  removed: string[];
  freedBytes: number;
}

interface Record_ {
  firstSeen: number;
  lastUsed: number;
}

async function realStatfs(p: string): Promise<{ capacity: number; available: number }> {
  const s = await fs.statfs(p);
  return { capacity: s.blocks * s.bsize, available: s.bavail * s.bsize };
}

export class ImageGc {
  private readonly seen = new Map<string, Record_>();
  private readonly now: () => number;
  private readonly minAgeMs: number;
  private readonly statfs: (path: string) => Promise<{ capacity: number; available: number }>;

  constructor(
    private readonly cri: CriEndpoint,
    private readonly opts: ImageGcOptions,
  ) {
    if (!(opts.lowThresholdPercent < opts.highThresholdPercent)) {
      throw new Error(`--image-gc-low-threshold (${opts.lowThresholdPercent}) must be below --image-gc-high-threshold (${opts.highThresholdPercent})`);
    }
    this.now = opts.now ?? Date.now;
    this.minAgeMs = opts.minAgeMs ?? 120_000;
    this.statfs = opts.statfs ?? realStatfs;
  }

  /** Notes which images exist and which are in use; call it often (cheap) so that "least recently used" means something. */
  async observe(): Promise<{ images: Map<string, number>; inUse: Set<string>; pinned: Set<string> }> {
    const now = this.now();
    const [imgs, ctrs] = await Promise.all([this.cri.images.listImages({}), this.cri.runtime.listContainers({})]);
    const inUse = new Set<string>();
    for (const c of ctrs.containers) {
      if (c.imageRef) inUse.add(c.imageRef);
      if (c.imageId) inUse.add(c.imageId);
      if (c.image?.image) inUse.add(c.image.image);
    }
    const images = new Map<string, number>();
    const pinned = new Set<string>();
    for (const img of imgs.images) {
      images.set(img.id, Number(img.size) || 0);
      if (img.pinned) pinned.add(img.id);
      const used = inUse.has(img.id) || img.repoTags.some((t) => inUse.has(t)) || img.repoDigests.some((d) => inUse.has(d));
      if (used) inUse.add(img.id);
      const r = this.seen.get(img.id);
      if (!r) this.seen.set(img.id, { firstSeen: now, lastUsed: used ? now : 0 });
      else if (used) r.lastUsed = now;
    }
    for (const id of this.seen.keys()) if (!images.has(id)) this.seen.delete(id);
    return { images, inUse, pinned };
  }

  /** One collection pass. */
  async run(): Promise<GcResult> {
    const { images, inUse, pinned } = await this.observe();
    const info = await this.cri.images.imageFsInfo({});
    const fsInfo = info.imageFilesystems[0];
    const mountpoint = fsInfo?.fsId?.mountpoint;
    if (!mountpoint) return { usagePercent: 0, removed: [], freedBytes: 0 };
    const { capacity, available } = await this.statfs(mountpoint);
    if (capacity <= 0) return { usagePercent: 0, removed: [], freedBytes: 0 };
    const usagePercent = ((capacity - available) * 100) / capacity;
    if (usagePercent < this.opts.highThresholdPercent) return { usagePercent, removed: [], freedBytes: 0 };
    const toFree = capacity - available - (capacity * this.opts.lowThresholdPercent) / 100;
    this.opts.log.info('image filesystem above the high threshold; removing unused images', {
      usagePercent: Number(usagePercent.toFixed(1)),
      high: this.opts.highThresholdPercent,
      bytesToFree: Math.round(toFree),
    });
    const { removed, freed } = await this.remove(images, inUse, pinned, toFree);
    if (freed < toFree) {
      this.opts.log.warn('image GC freed less than needed', { freedBytes: freed, bytesToFree: Math.round(toFree) });
    }
    return { usagePercent, removed, freedBytes: freed };
  }

  /**
   * Removes every unused image old enough (the kubelet's DeleteUnusedImages,
   * which the eviction manager calls under disk pressure); returns the bytes freed.
   */
  async freeUnused(): Promise<number> {
    const { images, inUse, pinned } = await this.observe();
    return (await this.remove(images, inUse, pinned, Infinity)).freed;
  }

  /** Least recently used first, until `toFree` bytes are gone. */
  private async remove(images: Map<string, number>, inUse: Set<string>, pinned: Set<string>, toFree: number): Promise<{ removed: string[]; freed: number }> {
    const now = this.now();
    const candidates = [...images.keys()]
      .filter((id) => !inUse.has(id) && !pinned.has(id))
      .filter((id) => now - (this.seen.get(id)?.firstSeen ?? now) >= this.minAgeMs)
      .sort((a, b) => (this.seen.get(a)!.lastUsed - this.seen.get(b)!.lastUsed) || (this.seen.get(a)!.firstSeen - this.seen.get(b)!.firstSeen));
    const removed: string[] = [];
    let freed = 0;
    for (const id of candidates) {
      if (freed >= toFree) break;
      try {
        await this.cri.images.removeImage({ image: { image: id } });
        removed.push(id);
        freed += images.get(id) ?? 0;
        this.seen.delete(id);
      } catch (err) {
        if (isNotFound(err)) continue;
        this.opts.log.warn('image GC could not remove an image', { image: id, err: grpcDetails(err) });
      }
    }
    return { removed, freed };
  }

  /** Runs a pass every `periodMs` (the kubelet's is 5 min), and observes usage every `observeMs`. */
  start(periodMs = 300_000, observeMs = 30_000): () => void {
    const observe = setInterval(() => void this.observe().catch(() => undefined), observeMs);
    const gc = setInterval(() => void this.run().catch((err) => this.opts.log.warn('image GC failed', { err: errorMessage(err) })), periodMs);
    observe.unref();
    gc.unref();
    return () => {
      clearInterval(observe);
      clearInterval(gc);
    };
  }
}
