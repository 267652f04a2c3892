/**
 * What the hostile streaming tests look at on the real daemon: its memory,
 * its sockets, its child processes, and whether its crash guard fired.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { expect } from 'vitest';

/** The daemon's resident set, in bytes (VmRSS). */
export function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

/** TCP sockets in CLOSE-WAIT whose local port is `port`, in the daemon's network namespace. */
export function closeWaitSockets(pid: number, port: number): string[] {
  const hex = port.toString(16).toUpperCase().padStart(4, '0');
  const out: string[] = [];
  for (const file of ['tcp', 'tcp6']) {
    let text = '';
    try {
      text = fs.readFileSync(`/proc/${pid}/net/${file}`, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/);
      if (cols.length < 4) continue;
      if (cols[1]!.endsWith(`:${hex}`) && cols[3] === '08') out.push(line.trim());
    }
  }
  return out;
}

/** The daemon's direct children as "pid comm". */
export function childrenOf(pid: number): string[] {
  const out: string[] = [];
  for (const t of fs.readdirSync(`/proc/${pid}/task`)) {
    let kids = '';
    try {
      kids = fs.readFileSync(`/proc/${pid}/task/${t}/children`, 'utf8');
    } catch {
      continue;
    }
    for (const k of kids.split(' ').filter(Boolean)) {
      let comm = '?';
      try {
        comm = fs.readFileSync(`/proc/${k}/comm`, 'utf8').trim();
      } catch {
        // exited meanwhile
      }
      out.push(`${k} ${comm}`);
    }
  }
  return out;
}

/** Open descriptors of `pid`. */
export function fdCount(pid: number): number {
  return fs.readdirSync(`/proc/${pid}/fd`).length;
}

/** `pid`'s descriptor count once it is down to `target`, or what it is at the deadline (closing takes the daemon a moment). */
export async function fdCountSettled(pid: number, target: number, timeoutMs = 10_000): Promise<number> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const n = fdCount(pid);
    if (n <= target || Date.now() >= deadline) return n;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Sets `pid`'s soft (and hard) limit on open files with util-linux prlimit. */
export function setNofile(pid: number, soft: number, hard: number): void {
  const r = spawnSync('prlimit', [`--pid=${pid}`, `--nofile=${soft}:${hard}`], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`prlimit: ${r.stderr}`);
}

export function nofile(pid: number): { soft: number; hard: number } {
  const m = /^Max open files\s+(\d+)\s+(\d+)/m.exec(fs.readFileSync(`/proc/${pid}/limits`, 'utf8'));
  if (!m) throw new Error('no open-files limit');
  return { soft: Number(m[1]), hard: Number(m[2]) };
}

/** The open flags (octal, from fdinfo) of each of `pid`'s descriptors that point at `target`. */
export function fdFlags(pid: number, target: RegExp): string[] {
  const out: string[] = [];
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    let link = '';
    try {
      link = fs.readlinkSync(`/proc/${pid}/fd/${fd}`);
    } catch {
      continue;
    }
    if (!target.test(link)) continue;
    const m = /^flags:\s+([0-7]+)$/m.exec(fs.readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8'));
    if (m) out.push(m[1]!);
  }
  return out;
}

/** What the daemon logs when its crash guard fires (src/daemon.ts): no hostile input may reach it. */
export const GUARD = 'crash guard';

/**
 * The end of a hostile-input suite: close the test's clients, tear the pod
 * fixture down, and fail if the crash guard ever fired or anything leaked.
 */
export async function cleanupUnguarded(
  f: { skiff: { log: string }; cleanup(): Promise<{ mounts: string[]; processes: string[] }> } | undefined,
  clients: Array<{ close(): void }> = [],
): Promise<void> {
  for (const c of clients) c.close();
  const log = f?.skiff.log ?? '';
  const leaks = await f?.cleanup();
  expect(log).not.toContain(GUARD);
  expect(leaks?.mounts ?? []).toEqual([]);
  expect(leaks?.processes ?? []).toEqual([]);
}
