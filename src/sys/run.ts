/**
 * Runs a helper program to completion. A program that could not be started
 * is an error; one that ran and exited non-zero is a result with its (bounded)
 * output, unless `check` asks for it to be an error too.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { SkiffError } from '../errors.js';
import { spawnChild } from './spawn.js';

export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
}

export interface RunOptions {
  input?: string | Buffer;
  env?: NodeJS.ProcessEnv;
  timeoutMs?: number;
  /** Throw when the program exits non-zero. */
  check?: boolean;
  maxOutput?: number;
  cwd?: string;
  /** Kills the program (SIGKILL) when aborted: a stopping daemon leaves no long write running behind it. */
  signal?: AbortSignal;
}

export type Runner = (cmd: string, args: string[], opts?: RunOptions) => Promise<RunResult>;

export const run: Runner = (cmd, args, opts = {}) =>
  new Promise((resolve, reject) => {
    const max = opts.maxOutput ?? 1 << 20;
    const child = spawnChild(cmd, args, { env: opts.env ?? process.env, cwd: opts.cwd, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    child.stdout?.on('data', (d: Buffer) => {
      if (stdout.length < max) stdout += d.toString().slice(0, max - stdout.length);
    });
    child.stderr?.on('data', (d: Buffer) => {
      if (stderr.length < max) stderr += d.toString().slice(0, max - stderr.length);
    });
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          child.kill('SIGKILL');
        }, opts.timeoutMs)
      : undefined;
    const abort = () => child.kill('SIGKILL');
    if (opts.signal?.aborted) abort();
    else opts.signal?.addEventListener('abort', abort, { once: true });
    child.on('error', (err) => {
      opts.signal?.removeEventListener('abort', abort);
      if (timer) clearTimeout(timer);
      reject(new SkiffError('Internal', `could not run ${cmd}: ${err.message}`, { cause: err }));
    });
    child.on('close', (code, signal) => {
      opts.signal?.removeEventListener('abort', abort);
      if (timer) clearTimeout(timer);
      const res = { code, signal, stdout, stderr, timedOut };
      if (opts.check && (code !== 0 || timedOut)) {
        const why = timedOut ? `timed out after ${opts.timeoutMs} ms` : signal ? `killed by ${signal}` : `exit ${code}`;
        reject(new SkiffError('Internal', `${cmd} ${args.slice(0, 3).join(' ')} failed (${why}): ${(stderr || stdout).trim().slice(0, 2000)}`));
        return;
      }
      resolve(res);
    });
    child.stdin?.on('error', () => undefined);
    child.stdin?.end(opts.input ?? '');
  });

/** Runs and throws on a non-zero exit. */
export async function runChecked(runner: Runner, cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
  return runner(cmd, args, { ...opts, check: true });
}

/** The first `dir/name` that is executable, in the order given. */
export async function findExecutable(name: string, dirs: string[]): Promise<string | undefined> {
  for (const d of dirs) {
    const p = path.join(d, name);
    try {
      await fs.access(p, fs.constants.X_OK);
      return p;
    } catch {
      // try the next directory
    }
  }
  return undefined;
}
