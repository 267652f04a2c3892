/**
 * Host id ranges for pods with `hostUsers: false`, handed out as the
 * kubelet does: each pod gets a block of 65536 ids at a multiple of 65536,
 * never the first block (the host's own users and groups), the same block
 * for uids and gids. A pod keeps its block for its whole life, across
 * restarts of the agent (the blocks are saved under the agent's root dir
 * before the runtime is asked to use them), and gives it back when it is
 * removed. The number of blocks is bounded; past it a pod waits with a
 * reason rather than sharing ids with another pod.
 */
import fs from 'node:fs/promises';
import type { Logger } from '../log.js';
import { StateFile } from './state-file.js';

/** Ids per pod: a whole 16-bit id space, so images' users (nobody is 65534) all map. */
export const USERNS_LENGTH = 65536;
/** As many pods in user namespaces as the kubelet runs pods by default (maxPods). */
export const DEFAULT_MAX_USERNS_PODS = 110;

export interface UsernsRange {
  /** The first host id; the pod's id 0 (uid and gid). */
  hostId: number;
  length: number;
}

/** No free block left: the pod waits until another is removed. */
export class UsernsExhaustedError extends Error {
  constructor(max: number) {
    super(`could not find an empty slot to allocate a user namespace: all ${max} ranges of ${USERNS_LENGTH} host ids are in use by other pods`);
    this.name = 'UsernsExhaustedError';
  }
}

export interface UsernsAllocatorOptions {
  /** Where the allocations are saved (JSON: pod uid → first host id). */
  file: string;
  max?: number;
  log?: Logger;
}

interface Saved {
  pods: Record<string, number>;
}

export class UsernsAllocator {
  /** pod uid → block index (block i starts at host id (i + 1) * 65536). */
  private readonly byUid = new Map<string, number>();
  private readonly used = new Set<number>();
  readonly max: number;
  private readonly stateFile: StateFile;

  private constructor(private readonly opts: UsernsAllocatorOptions) {
    this.stateFile = new StateFile(opts.file, { sync: true });
    this.max = opts.max ?? DEFAULT_MAX_USERNS_PODS;
    if (!Number.isSafeInteger(this.max) || this.max < 1 || (this.max + 1) * USERNS_LENGTH > 2 ** 32) {
      throw new Error(`user namespace ranges: max ${this.max} must be between 1 and ${2 ** 16 - 1}`);
    }
  }

  /** The allocator with the blocks saved in `file` (none when it is missing); bad entries are dropped with a warning. */
  static async load(opts: UsernsAllocatorOptions): Promise<UsernsAllocator> {
    const a = new UsernsAllocator(opts);
    let text: string;
    try {
      text = await fs.readFile(opts.file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return a;
      throw err;
    }
    let saved: Saved | undefined;
    try {
      saved = JSON.parse(text) as Saved;
    } catch {
      opts.log?.warn('user namespace allocations unreadable; starting empty', { file: opts.file });
      return a;
    }
    for (const [uid, hostId] of Object.entries(saved?.pods ?? {})) {
      const i = typeof hostId === 'number' && hostId % USERNS_LENGTH === 0 ? hostId / USERNS_LENGTH - 1 : -1;
      if (i < 0 || i >= a.max || a.used.has(i)) {
        opts.log?.warn('dropping a saved user namespace allocation', { uid, hostId, reason: i >= a.max ? `beyond the ${a.max} ranges` : 'not a free range' });
        continue;
      }
      a.byUid.set(uid, i);
      a.used.add(i);
    }
    return a;
  }

  /** The pod's block, if it has one. */
  get(uid: string): UsernsRange | undefined {
    const i = this.byUid.get(uid);
    return i === undefined ? undefined : { hostId: (i + 1) * USERNS_LENGTH, length: USERNS_LENGTH };
  }

  /** The pods that hold a block. */
  uids(): string[] {
    return [...this.byUid.keys()];
  }

  /** The pod's block, a new one (the lowest free) when it has none; resolves once it is saved. */
  async allocate(uid: string): Promise<UsernsRange> {
    const had = this.get(uid);
    if (had) return had;
    let i = 0;
    while (this.used.has(i)) i++;
    if (i >= this.max) throw new UsernsExhaustedError(this.max);
    this.byUid.set(uid, i);
    this.used.add(i);
    try {
      await this.save();
    } catch (err) {
      // Not on disk: a restarted agent would not know it, so it is not handed out.
      this.byUid.delete(uid);
      this.used.delete(i);
      throw err;
    }
    return this.get(uid)!;
  }

  /** Gives the pod's block back (nothing if it has none). */
  async release(uid: string): Promise<void> {
    const i = this.byUid.get(uid);
    if (i === undefined) return;
    this.byUid.delete(uid);
    this.used.delete(i);
    await this.save().catch((err) => this.opts.log?.warn('could not save user namespace allocations', { err: String(err) }));
  }

  /** Writes the allocations (atomically, one write at a time, synced: a block in use must not be handed out twice). */
  private save(): Promise<void> {
    const pods: Record<string, number> = {};
    for (const uid of this.byUid.keys()) pods[uid] = this.get(uid)!.hostId;
    return this.stateFile.write(JSON.stringify({ pods } satisfies Saved));
  }
}
