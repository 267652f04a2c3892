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
import { spawn } from 'node:child_process';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { SkiffError } from '../errors.js';
import { closeFd, pidfdOpen, pidfdSendSignal } from '../sys/libc.js';
import { parentPid } from './proc.js';

export interface ExecSyncResult {
  stdout: Buffer;
  stderr: Buffer;
  exitCode: number;
}

export interface ExecSyncOptions {
  conmon?: string;
  /** The runtime binary and its root. */
  runtime: { binary: string; root: string };
  containerId: string;
  bundle: string;
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

/**
 * A CRI log (`<time> <stdout|stderr> <P|F> <text>` lines) back into the two
 * streams, each cut at `max` bytes. The command's output is the container's
 * to choose: a log of a million empty lines must cost no object per line, so
 * one pass measures each stream and another copies the bytes into place.
 */
export function parseCriLog(text: Buffer, max = Number.MAX_SAFE_INTEGER): { stdout: Buffer; stderr: Buffer } {
  const STDOUT = Buffer.from('stdout');
  const STDERR = Buffer.from('stderr');
  const walk = (each: (out: 0 | 1, from: number, to: number, full: boolean) => void) => {
    let at = 0;
    while (at < text.length) {
      let nl = text.indexOf(10, at);
      if (nl < 0) nl = text.length;
      const start = at;
      at = nl + 1;
      const s1 = text.indexOf(32, start);
      if (s1 < 0 || s1 >= nl) continue;
      const s2 = text.indexOf(32, s1 + 1);
      if (s2 < 0 || s2 >= nl) continue;
      const s3 = text.indexOf(32, s2 + 1);
      if (s3 < 0 || s3 > nl) continue;
      const out = text.compare(STDOUT, 0, 6, s1 + 1, s2) === 0 ? 0 : text.compare(STDERR, 0, 6, s1 + 1, s2) === 0 ? 1 : -1;
      if (out < 0) continue;
      each(out as 0 | 1, s3 + 1, nl, s3 - s2 === 2 && text[s2 + 1] === 0x46 /* F */);
    }
  };
  const size = [0, 0];
  walk((out, from, to, full) => (size[out] = Math.min(max, size[out]! + (to - from) + (full ? 1 : 0))));
  const bufs = [Buffer.allocUnsafe(size[0]!), Buffer.allocUnsafe(size[1]!)] as const;
  const got = [0, 0];
  walk((out, from, to, full) => {
    const b = bufs[out];
    if (got[out]! < b.length) got[out]! += text.copy(b, got[out], from, Math.min(to, from + b.length - got[out]!));
    if (full && got[out]! < b.length) b[got[out]!++] = 10;
  });
  return { stdout: bufs[0], stderr: bufs[1] };
}

export function runExecSync(o: ExecSyncOptions): Promise<ExecSyncResult> {
  const max = o.maxOutput ?? 16 << 20;
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
      '-b', o.bundle,
      '-p', pidFile,
      '-l', `k8s-file:${logFile}`,
      '--log-size-max', String(2 * max),
      '--exit-dir', exitDir,
      '--socket-dir-path', o.workDir,
      '--runtime-arg', `--root=${o.runtime.root}`,
      '--log-level', 'error',
      '--syslog',
      '--exec', '--exec-process-spec', o.processJson,
      // The log is read back at once and thrown away: no need to sync it to disk.
      '--no-sync-log',
      // conmon stays our child: its exit is the end of the exec.
      '--sync',
    ];
    const child = spawn(o.conmon ?? 'conmon', args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe'], env: { ...process.env, _OCI_SYNCPIPE: '3' }, cwd: o.workDir });
    const sync = child.stdio[3] as NodeJS.ReadableStream & { destroy(): void };
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
          const why = startError ?? (stderr.trim() || 'conmon reported no exit status');
          return settle(() => reject(new SkiffError('Internal', `exec in ${o.containerId} failed: ${why}`)));
        }
        const log = await fsp.readFile(logFile).catch(() => Buffer.alloc(0));
        const out = parseCriLog(log, max);
        settle(() => resolve({ stdout: out.stdout, stderr: out.stderr, exitCode: code }));
      })();
    });
  });
}
