/**
 * What an idle daemon can give back to the kernel without losing anything.
 *
 * Measured on an idle `skiff cri` after a few pods (bench/idle-rss.ts), most
 * of its RSS is not its own data: ~43 MiB are pages of /usr/bin/node itself
 * (startup code, symbol tables read once by the dynamic linker, V8's
 * builtins), mapped while starting and never used again, and ~12 MiB are
 * glibc heap pages that malloc keeps after a burst. Both come back cheaply:
 *
 * - malloc_trim(0) returns the free pages inside every glibc arena;
 * - the clean pages of read-only file mappings (the node binary, shared
 *   libraries, native addons) are dropped from this process's page tables
 *   with MADV_DONTNEED. They are identical to the file and stay in the page
 *   cache, so a page used again comes back with a minor fault; the kernel
 *   could drop them itself under pressure, but only after everything else.
 *
 * A mapping holding any anonymous page (a copy-on-write page, e.g. the
 * relocated RELRO data of a library) is left alone: dropping it would bring
 * back the file's bytes instead of the relocated ones. Only files that stay
 * mapped for the process's whole life are touched (node, .so, .node): a
 * mapping cannot go away and be replaced between reading the list and the
 * madvise.
 */
import fsp from 'node:fs/promises';
import { MADV_DONTNEED, madvise, mallocTrim } from './libc.js';

export interface FileMapping {
  start: bigint;
  end: bigint;
  path: string;
  rssKiB: number;
}

/** The read-only, private, unmodified mappings of program files in an smaps text that have pages resident. */
export function droppableMappings(smaps: string, executable: string): FileMapping[] {
  const out: FileMapping[] = [];
  let cur: (FileMapping & { ok: boolean; anon: number }) | undefined;
  const flush = () => {
    if (cur?.ok && cur.anon === 0 && cur.rssKiB > 0) out.push({ start: cur.start, end: cur.end, path: cur.path, rssKiB: cur.rssKiB });
  };
  for (const line of smaps.split('\n')) {
    const head = /^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \d+\s*(.*)$/.exec(line);
    if (head) {
      flush();
      const [perms, file] = [head[3]!, head[4]!];
      const program = file === executable || /\.so(\.[0-9.]+)?$|\.node$/.test(file);
      cur = { start: BigInt(`0x${head[1]}`), end: BigInt(`0x${head[2]}`), path: file, rssKiB: 0, anon: -1, ok: program && perms[1] === '-' && perms[3] === 'p' };
      continue;
    }
    if (!cur) continue;
    const f = /^(Rss|Anonymous):\s+(\d+) kB/.exec(line);
    if (f?.[1] === 'Rss') cur.rssKiB = Number(f[2]);
    else if (f?.[1] === 'Anonymous') cur.anon = Number(f[2]);
  }
  flush();
  return out;
}

export interface Released {
  /** Whether malloc_trim gave any pages back. */
  trimmed: boolean;
  /** Resident file pages dropped from the page tables. */
  droppedKiB: number;
  rssBeforeKiB: number;
  ms: number;
}

/**
 * Gives back glibc's free pages and the clean pages of program files; for an idle process.
 * The pages are dropped last, with nothing after but the return: whatever ran after would
 * fault its code straight back in (a log line and a read of the RSS brought back ~8 MiB).
 */
export async function releaseIdleMemory(): Promise<Released> {
  const t0 = performance.now();
  const executable = await fsp.realpath(process.execPath);
  const rssBeforeKiB = Number(/^VmRSS:\s+(\d+) kB$/m.exec(await fsp.readFile('/proc/self/status', 'utf8'))?.[1] ?? 0);
  const smaps = await fsp.readFile('/proc/self/smaps', 'utf8');
  const trimmed = mallocTrim(0);
  const drop = droppableMappings(smaps, executable);
  for (const m of drop) madvise(m.start, m.end - m.start, MADV_DONTNEED);
  return { trimmed, droppedKiB: drop.reduce((n, m) => n + m.rssKiB, 0), rssBeforeKiB, ms: performance.now() - t0 };
}
