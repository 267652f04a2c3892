/**
 * Reading CRI log files (`<RFC3339Nano time> <stdout|stderr> <P|F> <text>`,
 * one per line, as conmon writes them) the way `kubectl logs` shows them:
 * partial (P) lines joined with what follows, the last N lines found by
 * reading backwards from the end, across the files rotation left beside
 * the current one, and following the log as it grows and is rotated.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import { isErrno } from '../errors.js';
import { openLogDir, openLogFile, probeLogFile, rotatedLogs, UnsafeLogError, type LogRef } from './log-files.js';

export interface CriLogLine {
  time: string;
  stream: 'stdout' | 'stderr';
  /** False for a P (partial) line: its text continues in the next one. */
  full: boolean;
  text: Buffer;
}

/** Parses one raw line (without its newline); undefined when it is not in the CRI format. */
export function parseCriLogLine(raw: Buffer): CriLogLine | undefined {
  const s1 = raw.indexOf(0x20);
  if (s1 <= 0) return undefined;
  const s2 = raw.indexOf(0x20, s1 + 1);
  if (s2 < 0) return undefined;
  const stream = raw.subarray(s1 + 1, s2).toString('latin1');
  if (stream !== 'stdout' && stream !== 'stderr') return undefined;
  // The tag is "P" or "F" (possibly with more tags after ':'); older writers had none.
  const s3 = raw.indexOf(0x20, s2 + 1);
  const tag = s3 < 0 ? raw.subarray(s2 + 1).toString('latin1') : raw.subarray(s2 + 1, s3).toString('latin1');
  const first = tag.split(':')[0];
  if (first === 'P' || first === 'F') {
    return { time: raw.subarray(0, s1).toString('latin1'), stream, full: first === 'F', text: s3 < 0 ? Buffer.alloc(0) : raw.subarray(s3 + 1) };
  }
  return { time: raw.subarray(0, s1).toString('latin1'), stream, full: true, text: raw.subarray(s2 + 1) };
}

/** Raw lines longer than this without a newline are cut (conmon splits long output into P lines far shorter). */
export const MAX_RAW_LINE = 1024 * 1024;

/**
 * Turns a CRI log byte stream into what the container wrote: feed() takes any
 * chunking of the file and returns the output for the complete raw lines.
 */
export class CriLogDecoder {
  private pending: Buffer[] = [];
  private pendingLength = 0;
  /** Inside a logical line (after a P): no timestamp prefix for its continuation. */
  private midLine = false;
  /** The logical line under way began before `since`: its continuations are dropped with it. */
  private skipping = false;

  /** `since`: milliseconds since the epoch; logical lines that began earlier are left out. */
  constructor(private readonly opts: { timestamps?: boolean; since?: number } = {}) {}

  feed(chunk: Buffer): Buffer {
    const out: Buffer[] = [];
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      if (nl < 0) break;
      let raw = chunk.subarray(start, nl);
      if (this.pendingLength) {
        raw = Buffer.concat([...this.pending, raw]);
        this.pending = [];
        this.pendingLength = 0;
      }
      this.line(raw, out);
      start = nl + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      this.pending.push(Buffer.from(rest));
      this.pendingLength += rest.length;
      if (this.pendingLength > MAX_RAW_LINE) {
        const raw = Buffer.concat(this.pending);
        this.pending = [];
        this.pendingLength = 0;
        this.line(raw, out);
      }
    }
    return Buffer.concat(out);
  }

  private line(raw: Buffer, out: Buffer[]): void {
    if (raw.length === 0) return;
    const l = parseCriLogLine(raw);
    if (!l) {
      // Not ours to judge: show it as it is.
      out.push(raw, Buffer.from('\n'));
      this.midLine = false;
      return;
    }
    const wasMid = this.midLine;
    if (!this.midLine) this.skipping = this.opts.since !== undefined && !(Date.parse(l.time) >= this.opts.since);
    this.midLine = !l.full;
    if (this.skipping) return;
    if (this.opts.timestamps && !wasMid) out.push(Buffer.from(`${l.time} `));
    out.push(l.text);
    if (l.full) out.push(Buffer.from('\n'));
  }
}

const TAIL_CHUNK = 64 * 1024;

/**
 * The offset in the file where its last `lines` logical lines start, found
 * by reading backwards in chunks: a huge file costs only what its tail is.
 * A logical line ends at an F line (or at a line not in the CRI format).
 */
export async function tailOffset(fh: fsp.FileHandle, size: number, lines: number): Promise<number> {
  return (await tailStart(fh, size, lines)).offset;
}

/** tailOffset, with how many complete logical lines there are from that offset on (fewer than asked when the file has fewer). */
export async function tailStart(fh: fsp.FileHandle, size: number, lines: number): Promise<{ offset: number; count: number }> {
  if (lines <= 0) return { offset: size, count: 0 };
  let pos = size;
  // Complete logical lines seen so far from the end (the file's last, unterminated one does not count).
  let count = 0;
  // Bytes of a raw line cut by the chunk boundary, carried to the next (earlier) chunk.
  let carry = Buffer.alloc(0);
  // Until the file's last newline is found: anything after it is a line still being written, never counted.
  let seekingLast = true;
  while (pos > 0) {
    const len = Math.min(TAIL_CHUNK, pos);
    pos -= len;
    const buf = Buffer.alloc(len);
    await readFully(fh, buf, pos);
    const data = carry.length ? Buffer.concat([buf, carry]) : buf;
    // Invariant in the loop: data[end - 1] is a newline, or end is 0.
    let end = data.length;
    if (seekingLast) {
      const nl = data.lastIndexOf(0x0a);
      if (nl < 0) continue;
      seekingLast = false;
      end = nl + 1;
    }
    carry = Buffer.alloc(0);
    while (end > 0) {
      const nl = end >= 2 ? data.lastIndexOf(0x0a, end - 2) : -1;
      if (nl < 0 && pos > 0) {
        // The line starts in an earlier chunk.
        carry = data.subarray(0, end);
        break;
      }
      const raw = data.subarray(nl + 1, end - 1);
      const parsed = parseCriLogLine(raw);
      if (raw.length && (!parsed || parsed.full)) {
        count++;
        if (count > lines) return { offset: pos + end, count: lines };
      }
      end = nl + 1;
    }
    // A monster line without newlines: count it as one line without holding it whole, and
    // if it is wanted, start inside it.
    if (carry.length > MAX_RAW_LINE) {
      // Nothing before it is read: the count is as good as met.
      return { offset: ++count > lines ? pos + carry.length : pos, count: lines };
    }
  }
  return { offset: 0, count };
}

async function readFully(fh: fsp.FileHandle, buf: Buffer, position: number): Promise<void> {
  let off = 0;
  while (off < buf.length) {
    const { bytesRead } = await fh.read(buf, off, buf.length - off, position + off);
    if (bytesRead === 0) break;
    off += bytesRead;
  }
}

export interface StreamLogOptions {
  /** Only the last N logical lines (all when undefined). */
  tailLines?: number;
  follow?: boolean;
  timestamps?: boolean;
  /** Only logical lines that began at or after this time (milliseconds since the epoch). */
  since?: number;
  /** Stops the stream (the client went away). */
  signal: AbortSignal;
  /** Writes output; resolves when the reader can take more. */
  write(chunk: Buffer): Promise<void>;
  /** How often a followed file is checked for growth and rotation when no change notice comes. */
  pollMs?: number;
  /**
   * How long a followed log may be missing before the stream ends (rotation
   * renames it away until the runtime has reopened it; removal is for good).
   */
  goneGraceMs?: number;
  /** Told when a followed log is replaced by something it will not read. */
  onUnsafe?(err: UnsafeLogError): void;
}

const READ_CHUNK = 64 * 1024;
/** The runtime's ReopenContainerLog answers within 5 s; a little more before a missing log counts as removed. */
export const DEFAULT_GONE_GRACE_MS = 10_000;
/** How often a follow that has caught up asks whether its container still runs (the kubelet's is 5 s). */
const RUNNING_CHECK_MS = 1_000;

/**
 * Streams a container's CRI log: the rotated files beside it (as many as
 * `tailLines` needs, or all), then the current file. With `follow`, keeps
 * going as the file grows, and into the new file when it is rotated (or
 * replaced, as the runtime's own size cap does); ends once it has been gone
 * for longer than the grace while its container is not running, when its
 * container has exited and the file is drained (as the kubelet's follow
 * ends), when it is replaced by a file that is not safe to read, or when the
 * signal aborts. Every file is opened beneath the log directory without
 * following a symlink (see log-files.ts).
 */
export async function streamCriLog(ref: LogRef, opts: StreamLogOptions): Promise<void> {
  const { dirFd, name } = openLogDir(ref);
  try {
    await streamIn(dirFd, name, opts, ref.running);
  } finally {
    fs.closeSync(dirFd);
  }
}

async function streamIn(dirFd: number, name: string, opts: StreamLogOptions, running?: () => Promise<boolean>): Promise<void> {
  const decoder = new CriLogDecoder({ timestamps: opts.timestamps, since: opts.since });
  const buf = Buffer.alloc(READ_CHUNK);
  const emit = async (bytes: Buffer) => {
    const out = decoder.feed(bytes);
    if (out.length) await opts.write(out);
  };
  /** Reads from `pos` to the end of what the file has now (or to `end`); returns the new position. */
  const drain = async (fh: fsp.FileHandle, pos: number, end = Infinity) => {
    while (!opts.signal.aborted && pos < end) {
      const { bytesRead } = await fh.read(buf, 0, Math.min(buf.length, end - pos), pos);
      if (bytesRead === 0) break;
      pos += bytesRead;
      await emit(buf.subarray(0, bytesRead));
    }
    return pos;
  };

  let cur = await openLogFile(dirFd, name);
  try {
    // Where to start: in the current file, or back in the rotated ones when it holds fewer lines than asked.
    let pos = 0;
    let older: Array<{ file: string; offset: number }> = [];
    const rotated = await rotatedLogs(dirFd, name);
    if (opts.tailLines === undefined) older = rotated.map((file) => ({ file, offset: 0 }));
    else {
      const t = await tailStart(cur.fh, cur.st.size, opts.tailLines);
      pos = t.offset;
      let want = opts.tailLines - t.count;
      for (let i = rotated.length - 1; i >= 0 && want > 0; i--) {
        const r = await openLogFile(dirFd, rotated[i]!).catch(() => undefined);
        if (!r) continue;
        try {
          const ts = await tailStart(r.fh, r.st.size, want);
          older.unshift({ file: rotated[i]!, offset: ts.offset });
          want -= ts.count;
        } finally {
          await r.fh.close();
        }
      }
    }
    for (const o of older) {
      if (opts.signal.aborted) return;
      // Rotated away and pruned meanwhile, or swapped for something unsafe: skip it, the rest is still worth showing.
      const r = await openLogFile(dirFd, o.file).catch(() => undefined);
      if (!r) continue;
      try {
        await drain(r.fh, o.offset);
      } finally {
        await r.fh.close();
      }
    }
    // Without follow, what the file held when the tail was counted: a line written since would make `--tail=2` three.
    pos = await drain(cur.fh, pos, opts.follow ? Infinity : cur.st.size);
    if (!opts.follow) return;

    let watcher: fs.FSWatcher | undefined;
    let wake: (() => void) | undefined;
    const onChange = () => wake?.();
    try {
      // The directory, through the descriptor: renames and new files show up as well as writes.
      watcher = fs.watch(`/proc/self/fd/${dirFd}`, { persistent: false }, onChange);
      watcher.on('error', () => undefined);
    } catch {
      // Polling alone will do.
    }
    opts.signal.addEventListener('abort', onChange);
    const grace = opts.goneGraceMs ?? DEFAULT_GONE_GRACE_MS;
    let missingSince: number | undefined;
    // When the container was last asked about while the follow had caught up: an exited one ends it.
    let askedAt = Date.now();
    const exited = async () => {
      if (!running || Date.now() - askedAt < RUNNING_CHECK_MS) return false;
      askedAt = Date.now();
      return !(await running());
    };
    try {
      while (!opts.signal.aborted) {
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, opts.pollMs ?? 250);
          t.unref();
          wake = () => {
            clearTimeout(t);
            resolve();
          };
        });
        wake = undefined;
        const from = pos;
        pos = await drain(cur.fh, pos);
        const caughtUp = pos === from;
        let now: { dev: number; ino: number } | undefined;
        try {
          now = await probeLogFile(dirFd, name);
        } catch (err) {
          if (err instanceof UnsafeLogError) {
            opts.onUnsafe?.(err);
            return;
          }
          throw err;
        }
        if (!now) {
          // Rotation renames the log away until the runtime reopens it, which can take a while on a busy
          // node: while the container runs, a missing file is one about to come back, as the kubelet takes it.
          missingSince ??= Date.now();
          if (Date.now() - missingSince > grace) {
            if (!running || !(await running())) return;
            missingSince = Date.now();
          }
          continue;
        }
        missingSince = undefined;
        if (now.ino === cur.st.ino && now.dev === cur.st.dev) {
          // Truncated in place: what is there now is new output.
          if ((await cur.fh.stat()).size < pos) pos = 0;
          else if (caughtUp && (await exited())) {
            // Its last words may have come after the look.
            await drain(cur.fh, pos);
            return;
          }
          continue;
        }
        // Rotated: the old file's last words, then on into the new one.
        await drain(cur.fh, pos);
        let next: { fh: fsp.FileHandle; st: fs.Stats };
        try {
          next = await openLogFile(dirFd, name);
        } catch (err) {
          if (err instanceof UnsafeLogError) {
            opts.onUnsafe?.(err);
            return;
          }
          // Gone again between the look and the open: the next round sees it.
          if (isErrno(err, 'ENOENT')) continue;
          throw err;
        }
        await cur.fh.close();
        cur = next;
        pos = await drain(cur.fh, 0);
      }
    } finally {
      watcher?.close();
      opts.signal.removeEventListener('abort', onChange);
    }
  } finally {
    await cur.fh.close().catch(() => undefined);
  }
}
