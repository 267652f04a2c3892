/**
 * The OCI runtime command line (runc, or crun with the same verbs), and
 * conmon as each container's monitor. Missing containers are success in the
 * teardown verbs, so stop and remove stay idempotent.
 */
import { constants as fsc, open as openCb } from 'node:fs';
import fs from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { SkiffError, isErrno } from '../errors.js';
import type { Runner } from '../sys/run.js';
import { spawnChild } from '../sys/spawn.js';
import { isSameProcess } from '../sys/proc.js';

export interface RuntimeState {
  status: 'creating' | 'created' | 'running' | 'stopped' | 'paused';
  pid: number;
}

const gone = /does not exist|not found|no such file/i;

export class OciRuntime {
  constructor(
    readonly name: string,
    readonly binary: string,
    readonly root: string,
    private readonly runner: Runner,
  ) {}

  private args(...rest: string[]): string[] {
    return [`--root=${this.root}`, ...rest];
  }

  async state(id: string): Promise<RuntimeState | undefined> {
    const r = await this.runner(this.binary, this.args('state', id));
    if (r.code !== 0) {
      if (gone.test(r.stderr)) return undefined;
      throw new SkiffError('Internal', `${this.name} state ${id}: ${r.stderr.trim()}`);
    }
    return JSON.parse(r.stdout) as RuntimeState;
  }

  /**
   * Starts a container with no monitor, its stdio on /dev/null (the pod's
   * infra process). The container inherits runc's stdio, so runc's own errors
   * are read from its log file rather than from a pipe that would stay open.
   */
  async runDetached(id: string, bundle: string, pidFile: string): Promise<number> {
    const logFile = path.join(bundle, 'runtime.log');
    const code = await new Promise<number | null>((resolve, reject) => {
      const child = spawnChild(this.binary, [`--root=${this.root}`, `--log=${logFile}`, 'run', '--detach', '--bundle', bundle, '--pid-file', pidFile, id], { stdio: ['ignore', 'ignore', 'ignore'] });
      child.on('error', (e) => reject(new SkiffError('Internal', `could not run ${this.binary}: ${e.message}`)));
      child.on('exit', (c) => resolve(c));
    });
    if (code !== 0) {
      const log = await fs.readFile(logFile, 'utf8').catch(() => '');
      throw new SkiffError('Internal', `${this.name} run ${id} failed: ${log.trim().split('\n').slice(-3).join('; ') || `exit ${code}`}`);
    }
    return Number((await fs.readFile(pidFile, 'utf8')).trim());
  }

  async start(id: string): Promise<void> {
    const r = await this.runner(this.binary, this.args('start', id), { timeoutMs: 60_000 });
    if (r.code !== 0) throw new SkiffError('Internal', `${this.name} start ${id} failed: ${(r.stderr || r.stdout).trim()}`);
  }

  /**
   * Starts a created container whose init is `pid` (started at `startTime`,
   * /proc/<pid>/stat field 22). For runc this is what `runc start` itself
   * does, without spawning it (about 7 ms a start here): runc's init waits
   * in open(2) on `<root>/<id>/exec.fifo` for a reader, writes one byte and
   * execs the container's process, which closes its end; `runc start` reads
   * that byte to the end of the file and removes the fifo, after which runc
   * reports the container running. runc 1.1 runs poststart hooks at create,
   * not at start, and skiff sets no hooks. Other runtimes (crun keeps more
   * state), a missing fifo (runc's own error then says why) and a daemon
   * under systemd's sd_notify (runc start would wait for the container's
   * READY) go through the runtime's `start`.
   */
  async startCreated(id: string, pid: number, startTime: number | undefined, timeoutMs = 60_000): Promise<void> {
    if (this.name !== 'runc' || process.env.NOTIFY_SOCKET) return this.start(id);
    const fifo = path.join(this.root, id, 'exec.fifo');
    let fd: number;
    try {
      // Non-blocking: open(2) returns at once, whether or not the init holds the other end yet.
      fd = await new Promise<number>((resolve, reject) => openCb(fifo, fsc.O_RDONLY | fsc.O_NONBLOCK, (e, f) => (e ? reject(e) : resolve(f))));
    } catch (err) {
      if (isErrno(err, 'ENOENT')) return this.start(id);
      throw new SkiffError('Internal', `${this.name} start ${id} failed: cannot open ${fifo}: ${(err as Error).message}`);
    }
    await new Promise<void>((resolve, reject) => {
      // A fifo is polled like a pipe: no readiness (and no end) is reported before a writer has come.
      const sock = new net.Socket({ fd, readable: true, writable: false });
      let bytes = 0;
      let settled = false;
      let deadSince = 0;
      const finish = (err?: Error) => {
        if (settled) return;
        settled = true;
        clearInterval(watch);
        clearTimeout(timer);
        sock.destroy();
        if (err) return reject(err);
        // runc's own test for "running" is that this file is gone.
        fs.rm(fifo, { force: true }).then(() => resolve(), (e: Error) => reject(new SkiffError('Internal', `${this.name} start ${id}: cannot remove ${fifo}: ${e.message}`)));
      };
      sock.on('data', (d: Buffer) => (bytes += d.length));
      // The init's end closes when it execs the container's process (or exits).
      sock.on('end', () => finish(bytes > 0 ? undefined : new SkiffError('FailedPrecondition', `${this.name} start ${id} failed: the container was already started`)));
      sock.on('error', (e) => finish(new SkiffError('Internal', `${this.name} start ${id} failed: reading ${fifo}: ${e.message}`)));
      // An init that died before it opened its end never will: watch it, as runc start does.
      const watch = setInterval(() => {
        void isSameProcess(pid, startTime).then((alive) => {
          if (settled || alive) return;
          // A byte it wrote before it died is still in the fifo: give the reader a turn to see it.
          if (!deadSince) deadSince = Date.now();
          else if (bytes === 0) finish(new SkiffError('Internal', `${this.name} start ${id} failed: the container's process (pid ${pid}) is already dead: it exited or was killed before it was started`));
        });
      }, 25);
      const timer = setTimeout(
        () => finish(new SkiffError('DeadlineExceeded', `${this.name} start ${id} failed: the container's process (pid ${pid}) did not take the start signal within ${timeoutMs} ms`)),
        timeoutMs,
      );
    });
  }

  /** Signals the container's init; a container that is gone or already stopped is not an error. */
  async kill(id: string, signal: string): Promise<void> {
    const r = await this.runner(this.binary, this.args('kill', id, signal), { timeoutMs: 30_000 });
    if (r.code !== 0 && !gone.test(r.stderr) && !/not running|process already finished|container not running/i.test(r.stderr)) {
      throw new SkiffError('Internal', `${this.name} kill ${id} ${signal} failed: ${r.stderr.trim()}`);
    }
  }

  async delete(id: string): Promise<void> {
    const r = await this.runner(this.binary, this.args('delete', '--force', id), { timeoutMs: 30_000 });
    if (r.code !== 0 && !gone.test(r.stderr)) throw new SkiffError('Internal', `${this.name} delete ${id} failed: ${r.stderr.trim()}`);
  }
}

export interface ConmonArgs {
  id: string;
  name: string;
  bundle: string;
  runtime: OciRuntime;
  logPath: string;
  /**
   * conmon 2.1 (checked in 2.1.6): when a write would take the bytes it has
   * written since it last started a file past this, it opens `<log>.tmp`
   * afresh and renames it over the log: what the old file held is dropped,
   * not rotated. Undefined or 0: no cap.
   */
  logSizeMax?: number;
  exitDir: string;
  socketDir: string;
  pidFile: string;
  conmonPidFile: string;
  tty: boolean;
  stdin: boolean;
  stdinOnce: boolean;
  /** How long conmon may take to report the container's pid (default 60 s). */
  timeoutMs?: number;
}

/**
 * Starts conmon, which runs `<runtime> create` and then stays as the
 * container's monitor. Resolves with the container's pid once it is created.
 */
export function startConmon(a: ConmonArgs, conmonBinary = 'conmon'): Promise<number> {
  const args = [
    '--api-version', '1',
    '-c', a.id, '-u', a.id, '-n', a.name,
    '-r', a.runtime.binary,
    '-b', a.bundle,
    '-p', a.pidFile,
    '-P', a.conmonPidFile,
    '-l', `k8s-file:${a.logPath}`,
    '--exit-dir', a.exitDir,
    '--socket-dir-path', a.socketDir,
    '--runtime-arg', `--root=${a.runtime.root}`,
    '--log-level', 'error',
    '--syslog',
  ];
  if (a.logSizeMax) args.push('--log-size-max', String(a.logSizeMax));
  if (a.tty) args.push('-t');
  if (a.stdin) args.push('-i');
  if (a.stdin && !a.stdinOnce) args.push('--leave-stdin-open');
  return new Promise((resolve, reject) => {
    const child = spawnChild(conmonBinary, args, {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
      env: { ...process.env, _OCI_SYNCPIPE: '3' },
      // conmon writes some files (an `oom` marker) relative to its working directory: keep them in the bundle.
      cwd: a.bundle,
      detached: true,
    });
    const sync = child.stdio[3];
    if (child.spawnError || !sync || !child.stderr) {
      child.on('error', () => undefined);
      return reject(new SkiffError('Internal', `could not run conmon: ${child.spawnError?.message ?? 'no pipes for it'}`));
    }
    let stderr = '';
    let buf = '';
    let settled = false;
    const finish = (err: Error | undefined, pid?: number) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      // conmon keeps its end open to report the exit; skiff reads exit files instead.
      sync.destroy();
      child.stderr!.destroy();
      if (err) reject(err);
      else resolve(pid!);
    };
    // A conmon (or runtime) that hangs before it reports must not hang CreateContainer/StartContainer.
    const timeoutMs = a.timeoutMs ?? 60_000;
    const timer = setTimeout(async () => {
      // conmon leads its own process group (detached), and may have forked off its monitor,
      // which wrote its pid file: take both, and the runtime they started.
      const monitor = Number((await fs.readFile(a.conmonPidFile, 'utf8').catch(() => '')).trim());
      for (const target of [child.pid ? -child.pid : 0, monitor]) {
        try {
          if (target) process.kill(target, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      finish(new SkiffError('DeadlineExceeded', `conmon for ${a.id} did not report the container's pid within ${timeoutMs} ms: ${stderr.trim()}`));
    }, timeoutMs);
    timer.unref();
    child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
    sync.on('data', (d: Buffer) => {
      buf += d.toString();
      const line = buf.split('\n').find((l) => l.trim().startsWith('{'));
      if (!line) return;
      try {
        const msg = JSON.parse(line) as { data: number; message?: string };
        if (msg.data > 0) finish(undefined, msg.data);
        else finish(new SkiffError('Internal', `${a.runtime.name} create ${a.id} failed: ${msg.message ?? stderr.trim()}`));
      } catch {
        // wait for the whole line
      }
    });
    sync.on('end', () => finish(new SkiffError('Internal', `conmon for ${a.id} ended without creating the container: ${stderr.trim()}`)));
    child.on('error', (e) => finish(new SkiffError('Internal', `could not run conmon: ${e.message}`)));
    child.unref();
  });
}
