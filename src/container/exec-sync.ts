/**
 * One exec for ExecSync: conmon in exec mode (`--exec`, `--sync`) runs
 * `<runtime> exec --detach` and, as the subreaper of the command, learns its
 * exit status when the command itself exits. It writes the output to a
 * CRI-format log and stops reading shortly after the exit, so a background
 * child that keeps stdout open does not hold the answer (runc's own
 * foreground exec waits for every writer to close). skiff reads the log
 * back into stdout and stderr.
 *
 * The command is killed, when its time is up or the client gives up, through
 * a pidfd opened as soon as conmon reports the pid and checked to be conmon's
 * child: that pidfd names the command and no later process reusing its pid.
 * conmon then reaps it: nothing is left, not even a zombie.
 */
import fsp from 'node:fs/promises';
import path from 'node:path';
import { SkiffError } from '../errors.js';
import { closeFd, pidfdOpen, pidfdSendSignal } from '../sys/libc.js';
import { spawnChild } from '../sys/spawn.js';
import { parentPid } from '../sys/proc.js';

export interface ExecSyncResult {
  stdout: Buffer;
  stderr: Buffer;
  exitCode: number;
  /**
   * Gives back the output's share of the daemon-wide budget: call it once
   * the answer has left (it is held until then, and a client that does not
   * read it holds it).
   */
  release(): void;
}

/**
 * The most output (stdout and stderr together) one ExecSync returns; the
 * rest is cut. An answer is held three times on its way out (the output,
 * its protobuf encoding, the copy the HTTP/2 layer queues), and freed only when V8
 * next collects: at 16 MiB (CRI-O's cut) one answer alone could cost the
 * daemon 48 MiB and more, so 8 MiB. The kubelet reads 10 KiB of a probe's.
 */
export const MAX_EXEC_SYNC_OUTPUT = 8 << 20;
/** Output all ExecSync calls together may hold while they read it back and answer. */
export const EXEC_SYNC_OUTPUT_BUDGET = 8 << 20;
/** Output this small (a probe's) is not counted: it never waits behind a large answer. */
const UNCOUNTED_OUTPUT = 64 << 10;

/**
 * A budget of bytes shared by concurrent users: each reserves what it will
 * hold and waits while the others hold too much. Whoever fits goes first, so
 * small reservations (probes) never queue behind a large one. A reservation
 * larger than the whole budget goes through once nothing else is held.
 */
export class ByteBudget {
  private used = 0;
  private readonly waiters = new Set<{ n: number; go: () => void }>();

  constructor(readonly limit: number) {}

  get inUse(): number {
    return this.used;
  }

  /** Resolves, once `n` bytes are reserved, with the function that gives them back; rejects if `signal` aborts first. */
  async acquire(n: number, signal?: AbortSignal): Promise<() => void> {
    if (this.fits(n)) this.used += n;
    else {
      await new Promise<void>((resolve, reject) => {
        const w = {
          n,
          go: () => {
            signal?.removeEventListener('abort', abort);
            resolve();
          },
        };
        const abort = () => {
          this.waiters.delete(w);
          reject(new Error('aborted while waiting for room'));
        };
        if (signal?.aborted) return reject(new Error('aborted while waiting for room'));
        signal?.addEventListener('abort', abort, { once: true });
        this.waiters.add(w);
      });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.used -= n;
      this.wake();
    };
  }

  private fits(n: number): boolean {
    return this.used === 0 || this.used + n <= this.limit;
  }

  private wake(): void {
    for (const w of this.waiters) {
      if (!this.fits(w.n)) continue;
      this.waiters.delete(w);
      this.used += w.n;
      w.go();
    }
  }
}

const outputBudget = new ByteBudget(EXEC_SYNC_OUTPUT_BUDGET);

/**
 * Reads a CRI log back into its two streams, a chunk at a time, keeping at
 * most `max` bytes of output in all. The log is never read whole, and each
 * line's text is copied once, straight into its stream's buffer.
 */
export async function readCriLog(file: string, max: number): Promise<{ stdout: Buffer; stderr: Buffer }> {
  const fh = await fsp.open(file, 'r');
  try {
    // The output is never larger than the log (pages never written are never resident).
    const cap = Math.min((await fh.stat()).size, max);
    const out = { stdout: Buffer.allocUnsafeSlow(cap), stderr: Buffer.allocUnsafeSlow(cap) };
    const at = { stdout: 0, stderr: 0 };
    let kept = 0;
    const put = (stream: 'stdout' | 'stderr', data: Buffer) => {
      const n = Math.min(data.length, max - kept);
      if (n <= 0) return;
      data.copy(out[stream], at[stream], 0, n);
      at[stream] += n;
      kept += n;
    };
    const chunk = Buffer.allocUnsafe(256 * 1024);
    let held = 0;
    for (let eof = false; !eof && kept < max; ) {
      const { bytesRead } = await fh.read(chunk, held, chunk.length - held, null);
      eof = bytesRead === 0;
      const filled = held + bytesRead;
      // Whole lines only; a line cut by the chunk's end waits for the next read
      // (one longer than the whole chunk, which conmon never writes, is taken as it is).
      let end = eof ? filled : chunk.lastIndexOf(10, filled - 1) + 1;
      if (end === 0 && filled === chunk.length) end = filled;
      forEachCriLine(chunk.subarray(0, end), put);
      chunk.copy(chunk, 0, end, filled);
      held = filled - end;
    }
    return { stdout: out.stdout.subarray(0, at.stdout), stderr: out.stderr.subarray(0, at.stderr) };
  } finally {
    await fh.close();
  }
}

/** Each line of a CRI log (`<time> <stdout|stderr> <P|F> <text>`) as its stream's text: a full line (F) ends with a newline. */
function forEachCriLine(text: Buffer, put: (stream: 'stdout' | 'stderr', data: Buffer) => void): void {
  const NL = Buffer.from('\n');
  let at = 0;
  while (at < text.length) {
    let nl = text.indexOf(10, at);
    if (nl < 0) nl = text.length;
    const line = text.subarray(at, nl);
    at = nl + 1;
    const s1 = line.indexOf(32);
    const s2 = s1 < 0 ? -1 : line.indexOf(32, s1 + 1);
    const s3 = s2 < 0 ? -1 : line.indexOf(32, s2 + 1);
    if (s3 < 0) continue;
    const stream = line.subarray(s1 + 1, s2).toString();
    if (stream !== 'stdout' && stream !== 'stderr') continue;
    put(stream, line.subarray(s3 + 1));
    if (line.subarray(s2 + 1, s3).toString() === 'F') put(stream, NL);
  }
}

export interface ExecSyncOptions {
  conmon?: string;
  /** The runtime binary and its root. */
  runtime: { binary: string; root: string };
  containerId: string;
  processJson: string;
  /** A private directory for the pid, log and exit files. */
  workDir: string;
  /** 0: no limit. */
  timeoutMs: number;
  /** Aborted when the RPC is cancelled: the command is killed. */
  signal?: AbortSignal;
  maxOutput?: number;
  /** How long to wait for conmon to reap a killed command before killing conmon too. */
  killGraceMs?: number;
}

/** A CRI log (`<time> <stdout|stderr> <P|F> <text>` lines) back into the two streams. */
export function parseCriLog(text: Buffer): { stdout: Buffer; stderr: Buffer } {
  const parts: Record<'stdout' | 'stderr', Buffer[]> = { stdout: [], stderr: [] };
  forEachCriLine(text, (stream, data) => parts[stream].push(data));
  return { stdout: Buffer.concat(parts.stdout), stderr: Buffer.concat(parts.stderr) };
}

export function runExecSync(o: ExecSyncOptions): Promise<ExecSyncResult> {
  const max = o.maxOutput ?? MAX_EXEC_SYNC_OUTPUT;
  const pidFile = path.join(o.workDir, 'pid');
  const logFile = path.join(o.workDir, 'log');
  const exitDir = path.join(o.workDir, 'exit');
  const id = path.basename(o.workDir);
  return new Promise((resolve, reject) => {
    if (o.signal?.aborted) return reject(new SkiffError('DeadlineExceeded', 'exec cancelled by the client before it started'));
    const args = [
      '--api-version', '1',
      '-c', o.containerId, '-u', id, '-n', id,
      '-r', o.runtime.binary,
      // No bundle (-b): given one, conmon 2.1 sets up an attach socket for the exec in it, where the
      // container's own conmon listens, unlinking that one first. The container then could no longer
      // be attached to, and concurrent execs unlinked each other's sockets (conmon exits 1).
      '-p', pidFile,
      '-l', `k8s-file:${logFile}`,
      // conmon starts the log over past this size, losing what came first: leave room for
      // the line prefixes of a program that writes in small pieces (tr writes 1 KiB or less).
      '--log-size-max', String(8 * max),
      '--exit-dir', exitDir,
      '--runtime-arg', `--root=${o.runtime.root}`,
      '--log-level', 'error',
      '--syslog',
      '--exec', '--exec-process-spec', o.processJson,
      // The log is read back at once and thrown away: no need to sync it to disk.
      '--no-sync-log',
      // conmon stays our child: its exit is the end of the exec.
      '--sync',
    ];
    const child = spawnChild(o.conmon ?? 'conmon', args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe'], env: { ...process.env, _OCI_SYNCPIPE: '3' }, cwd: o.workDir });
    const sync = child.stdio[3];
    if (child.spawnError || !sync || !child.stderr) {
      // Out of descriptors (EMFILE) is the daemon's state, not the request's fault: worth a retry.
      const e = child.spawnError;
      child.on('error', () => undefined);
      const busy = e?.code === 'EMFILE' || e?.code === 'ENFILE';
      return reject(new SkiffError(busy ? 'Unavailable' : 'Internal', `could not run conmon: ${e?.message ?? 'no pipes for it'}`));
    }
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));

    let exited = false;
    let settled = false;
    let pidfd: number | undefined;
    let ending: 'timeout' | 'cancelled' | undefined;
    const timers: NodeJS.Timeout[] = [];
    const later = (ms: number, fn: () => void) => {
      const t = setTimeout(fn, ms);
      t.unref();
      timers.push(t);
    };

    const killCommand = () => {
      if (pidfd === undefined) return;
      try {
        pidfdSendSignal(pidfd, 'SIGKILL');
      } catch {
        // gone already
      }
    };
    const end = (why: 'timeout' | 'cancelled') => {
      if (exited || ending) return;
      ending = why;
      killCommand();
      // If conmon hangs, or never reported the pid, it goes too.
      later(o.killGraceMs ?? 5_000, () => child.kill('SIGKILL'));
    };

    // The first message on the sync pipe is the command's pid (or the runtime's failure).
    let buf = '';
    let startError: string | undefined;
    sync.on('data', (d: Buffer) => {
      if (pidfd !== undefined || startError) return;
      buf += d.toString();
      const line = buf.split('\n').find((l) => l.trim().startsWith('{') && l.trim().endsWith('}'));
      if (!line) return;
      let msg: { data: number; message?: string };
      try {
        msg = JSON.parse(line) as { data: number; message?: string };
      } catch {
        return;
      }
      if (!(msg.data > 0)) {
        startError = msg.message ?? `exec failed (${msg.data})`;
        return;
      }
      void adopt(msg.data);
    });
    sync.on('error', () => undefined);
    const adopt = async (pid: number) => {
      let fd: number;
      try {
        fd = pidfdOpen(pid);
      } catch {
        return; // exited and reaped already
      }
      // conmon's child, so not a later process that reuses the pid.
      if (!exited && (await parentPid(pid)) === child.pid) pidfd = fd;
      else closeFd(fd);
      if (ending) killCommand();
    };

    const onAbort = () => end('cancelled');
    o.signal?.addEventListener('abort', onAbort, { once: true });
    if (o.timeoutMs > 0) later(o.timeoutMs, () => end('timeout'));

    const settle = (fn: () => void) => {
      if (settled) return;
      settled = true;
      for (const t of timers) clearTimeout(t);
      o.signal?.removeEventListener('abort', onAbort);
      if (pidfd !== undefined) closeFd(pidfd);
      pidfd = undefined;
      sync.destroy();
      fn();
    };

    child.on('error', (e) => {
      exited = true;
      settle(() => reject(new SkiffError('Internal', `could not run conmon: ${e.message}`)));
    });
    child.on('close', () => {
      exited = true;
      void (async () => {
        if (ending === 'timeout') return settle(() => reject(new SkiffError('DeadlineExceeded', `command timed out after ${o.timeoutMs / 1000}s and was killed`)));
        if (ending === 'cancelled') return settle(() => reject(new SkiffError('DeadlineExceeded', 'exec cancelled by the client: the command was killed')));
        const files = await fsp.readdir(exitDir).catch(() => [] as string[]);
        const code = files.length ? Number((await fsp.readFile(path.join(exitDir, files[0]!), 'utf8').catch(() => '')).trim()) : NaN;
        if (!Number.isFinite(code)) {
          // conmon points its own stderr at /dev/null once it runs, and says why it failed to syslog only.
          const how = child.signalCode ? `was killed by ${child.signalCode}` : `exited ${child.exitCode ?? '?'}`;
          const why = startError ?? (stderr.trim() || `conmon ${how} without an exit status (its own errors go to syslog)`);
          return settle(() => reject(new SkiffError('Internal', `exec in ${o.containerId} failed: ${why}`)));
        }
        // Many calls with large output at once wait for each other rather than all hold it together.
        const size = await fsp.stat(logFile).then((st) => st.size, () => 0);
        let release: () => void;
        try {
          release = size <= UNCOUNTED_OUTPUT ? () => undefined : await outputBudget.acquire(Math.min(size, max), o.signal);
        } catch {
          return settle(() => reject(new SkiffError('DeadlineExceeded', 'exec cancelled by the client while its output waited to be read')));
        }
        let out: { stdout: Buffer; stderr: Buffer };
        try {
          out = size ? await readCriLog(logFile, max) : { stdout: Buffer.alloc(0), stderr: Buffer.alloc(0) };
        } catch (err) {
          release();
          return settle(() => reject(new SkiffError('Internal', `exec in ${o.containerId}: cannot read its output: ${(err as Error).message}`)));
        }
        settle(() => resolve({ ...out, exitCode: code, release }));
      })();
    });
  });
}
