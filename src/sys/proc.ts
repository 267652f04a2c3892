/**
 * Which process a pid names. A pid alone can be reused once its process is
 * reaped; the pair (pid, start time) cannot, so records keep both.
 */
import { readFileSync } from 'node:fs';
import fs from 'node:fs/promises';

/**
 * The start time of `pid` (field 22 of /proc/<pid>/stat, in clock ticks
 * since boot), or undefined when there is no such process or it has already
 * exited and waits to be reaped (a zombie).
 */
export async function processStartTime(pid: number | undefined): Promise<number | undefined> {
  if (!pid || pid <= 0) return undefined;
  const text = await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  return parseStartTime(text);
}

/**
 * processStartTime read in place: a /proc read never waits on a disk, and
 * on a busy machine the thread pool's round trip costs more than the read.
 */
export function processStartTimeSync(pid: number | undefined): number | undefined {
  if (!pid || pid <= 0) return undefined;
  let text = '';
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  return parseStartTime(text);
}

/** The parsing half of processStartTime, apart so it can be tested on its own. */
export function parseStartTime(stat: string): number | undefined {
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const close = stat.lastIndexOf(')');
  if (close < 0) return undefined;
  const fields = stat.slice(close + 2).split(' ');
  const state = fields[0];
  if (!state || state === 'Z' || state === 'X' || state === 'x') return undefined;
  const start = Number(fields[19]);
  return Number.isFinite(start) ? start : undefined;
}

/** The parent pid of a live process, or undefined. */
export async function parentPid(pid: number): Promise<number | undefined> {
  const text = await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  const close = text.lastIndexOf(')');
  if (close < 0) return undefined;
  const ppid = Number(text.slice(close + 2).split(' ')[1]);
  return Number.isFinite(ppid) ? ppid : undefined;
}

/** True when `pid` is still the process that started at `startTime`. */
export async function isSameProcess(pid: number | undefined, startTime: number | undefined): Promise<boolean> {
  if (!pid || startTime === undefined) return false;
  return (await processStartTime(pid)) === startTime;
}
