/**
 * The OCI runtime command line (runc, or crun with the same verbs), and
 * conmon as each container's monitor. Missing containers are success in the
 * teardown verbs, so stop and remove stay idempotent.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { SkiffError } from '../errors.js';
import type { Runner } from '../sys/run.js';

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
      const child = spawn(this.binary, [`--root=${this.root}`, `--log=${logFile}`, 'run', '--detach', '--bundle', bundle, '--pid-file', pidFile, id], { stdio: 'ignore' });
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
  if (a.tty) args.push('-t');
  if (a.stdin) args.push('-i');
  if (a.stdin && !a.stdinOnce) args.push('--leave-stdin-open');
  return new Promise((resolve, reject) => {
    const child = spawn(conmonBinary, args, {
      stdio: ['ignore', 'ignore', 'pipe', 'pipe'],
      env: { ...process.env, _OCI_SYNCPIPE: '3' },
      // conmon writes some files (an `oom` marker) relative to its working directory: keep them in the bundle.
      cwd: a.bundle,
      detached: true,
    });
    let stderr = '';
    let buf = '';
    let settled = false;
    const sync = child.stdio[3] as NodeJS.ReadableStream & { destroy(): void };
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
