/**
 * What an idle daemon can give back to the kernel without losing anything:
 * the free pages glibc's malloc keeps inside its arenas after a burst of
 * work (request buffers, JSON, child process plumbing). malloc_trim(0)
 * returns them; the next burst takes them again.
 *
 * Not done, though it lowers RSS a lot more: dropping the clean pages of
 * node and its libraries from this process (MADV_DONTNEED). They stay in the
 * page cache, charged to the daemon's cgroup just the same, and come straight
 * back on use; RSS would fall without memory being freed.
 */
import fsp from 'node:fs/promises';
import { mallocTrim } from './libc.js';

export interface Released {
  /** Whether malloc_trim gave any pages back. */
  trimmed: boolean;
  rssBeforeKiB: number;
  rssAfterKiB: number;
  ms: number;
}

async function rssKiB(): Promise<number> {
  return Number(/^VmRSS:\s+(\d+) kB$/m.exec(await fsp.readFile('/proc/self/status', 'utf8'))?.[1] ?? 0);
}

/** Gives glibc's free pages back; for an idle process. */
export async function releaseIdleMemory(): Promise<Released> {
  const t0 = performance.now();
  const rssBeforeKiB = await rssKiB();
  const trimmed = mallocTrim(0);
  return { trimmed, rssBeforeKiB, rssAfterKiB: await rssKiB(), ms: performance.now() - t0 };
}
