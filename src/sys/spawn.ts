/**
 * Starting helper programs without stalling the daemon.
 *
 * child_process.spawn forks: the kernel copies the daemon's page tables
 * while the event loop waits. Measured here (50 spawns of /bin/true), that
 * blocks the loop for 1.0 ms at 47 MiB RSS, 2.3 ms at 108 MiB and 4.7 ms at
 * 249 MiB, on every runc, conmon, CNI plugin and iptables-restore a pod start
 * or an ExecSync runs, and every call waiting meanwhile (a kubelet's
 * ListContainers) waits that long. posix_spawn shares the pages instead
 * (glibc uses CLONE_VFORK) and took 0.1 ms at every size.
 *
 * The price is reaping: libuv waits only for the children it started, so a
 * SIGCHLD listener waits for ours, each by pid (never -1, which would take
 * libuv's too).
 *
 * `Child` is the part of ChildProcess skiff uses: stdio streams, `exit`,
 * `close` and `error` events, kill, ref and unref.
 */
import { EventEmitter } from 'node:events';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { dupAbove, pipe, posixSpawn, reapChild, type SpawnFd } from './libc.js';

/** One entry per child descriptor 0, 1, 2, ...: a new pipe, /dev/null, the daemon's own, or a descriptor to hand over. */
export type StdioEntry = 'pipe' | 'ignore' | 'inherit' | number;

export interface SpawnOptions {
  stdio?: StdioEntry[];
  env?: NodeJS.ProcessEnv;
  cwd?: string;
  /** A new session, as child_process's `detached`. */
  detached?: boolean;
}

const live = new Map<number, Child>();
let listening = false;
let refs = 0;
let keepAlive: NodeJS.Timeout | undefined;

function reapAll(): void {
  for (const [pid, child] of live) {
    const r = reapChild(pid);
    if (r === undefined) continue;
    live.delete(pid);
    if (r === 'gone') child.exited(null, null);
    else child.exited(r.code, r.signal === null ? null : signalName(r.signal));
  }
}

function signalName(n: number): NodeJS.Signals | null {
  for (const [name, v] of Object.entries(os.constants.signals)) if (v === n) return name as NodeJS.Signals;
  return null;
}

function holdLoop(delta: number): void {
  refs += delta;
  if (refs > 0 && !keepAlive) keepAlive = setInterval(() => undefined, 0x7fffffff);
  if (refs === 0 && keepAlive) {
    clearInterval(keepAlive);
    keepAlive = undefined;
  }
}

/** `file` as child_process finds it: a name without a slash is looked up in the child's PATH. */
function resolveProgram(file: string, env: NodeJS.ProcessEnv, cwd: string | undefined): string | undefined {
  if (file.includes('/')) return path.resolve(cwd ?? '', file);
  for (const dir of (env.PATH ?? '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin').split(':')) {
    const p = path.resolve(cwd ?? '', dir || '.', file);
    try {
      fs.accessSync(p, fs.constants.X_OK);
      if (fs.statSync(p).isFile()) return p;
    } catch {
      // not here
    }
  }
  return undefined;
}

export class Child extends EventEmitter {
  pid: number | undefined;
  /** Set, before the 'error' event, when the program could not be started; stdio is then all null. */
  spawnError: NodeJS.ErrnoException | undefined;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  readonly stdio: (net.Socket | null)[];
  private hasExited = false;
  private referenced = true;
  private openStreams = 0;

  constructor(stdioLength: number) {
    super();
    this.stdio = new Array<net.Socket | null>(stdioLength).fill(null);
  }

  get stdin(): net.Socket | null {
    return this.stdio[0] ?? null;
  }

  get stdout(): net.Socket | null {
    return this.stdio[1] ?? null;
  }

  get stderr(): net.Socket | null {
    return this.stdio[2] ?? null;
  }

  /** Signals the child; false once it has ended (its pid may be someone else's by then). */
  kill(signal: NodeJS.Signals | number = 'SIGTERM'): boolean {
    if (this.pid === undefined || this.hasExited) return false;
    try {
      process.kill(this.pid, signal);
      return true;
    } catch {
      return false;
    }
  }

  ref(): void {
    if (this.referenced || this.hasExited || this.pid === undefined) return;
    this.referenced = true;
    holdLoop(1);
  }

  unref(): void {
    if (!this.referenced || this.hasExited || this.pid === undefined) return;
    this.referenced = false;
    holdLoop(-1);
  }

  /** @internal */
  started(pid: number): void {
    this.pid = pid;
    holdLoop(1);
  }

  /** @internal */
  watch(stream: net.Socket): void {
    this.openStreams++;
    stream.once('close', () => {
      this.openStreams--;
      this.maybeClose();
    });
  }

  /** @internal */
  exited(code: number | null, signal: NodeJS.Signals | null): void {
    if (this.hasExited) return;
    this.hasExited = true;
    // As child_process: nobody reads what is written to a process that has ended.
    this.stdin?.destroy();
    if (this.referenced) holdLoop(-1);
    this.exitCode = code;
    this.signalCode = signal;
    this.emit('exit', code, signal);
    // As child_process: output nobody reads is drained once the process has ended (after the
    // 'exit' listeners had their chance to start reading), or its stream never ends and 'close' never comes.
    process.nextTick(() => {
      for (const s of this.stdio.slice(1)) {
        if (s && s.readable && !(s as unknown as { _readableState: { readableListening: boolean } })._readableState.readableListening) s.resume();
      }
    });
    this.maybeClose();
  }

  private maybeClose(): void {
    if (this.hasExited && this.openStreams === 0) this.emit('close', this.exitCode, this.signalCode);
  }
}

/**
 * Starts `file` with `args`. Like child_process.spawn, a program that cannot
 * be started is reported as an 'error' event (on the next tick), not thrown.
 */
export function spawnChild(file: string, args: string[], opts: SpawnOptions = {}): Child {
  const stdio = opts.stdio ?? ['pipe', 'pipe', 'pipe'];
  const child = new Child(stdio.length);
  const env = opts.env ?? process.env;
  const ours: number[] = []; // the parent's ends, closed if the spawn fails
  const theirs: number[] = []; // the child's ends, closed once it has them
  const fail = (err: NodeJS.ErrnoException) => {
    for (const fd of [...ours, ...theirs]) fs.closeSync(fd);
    child.stdio.fill(null);
    child.spawnError = err;
    process.nextTick(() => child.emit('error', err));
    return child;
  };

  // A NUL would end the C string there, and the child would run with less than it was
  // given (`rm -rf /x\0/y` as `rm -rf /x`): refused, as child_process refuses it.
  const nul = nulIn(file, args, env, opts.cwd);
  if (nul) {
    const err = new TypeError(`spawn ${file}: ${nul} must be a string without null bytes`) as NodeJS.ErrnoException;
    err.code = 'ERR_INVALID_ARG_VALUE';
    return fail(err);
  }

  const program = resolveProgram(file, env, opts.cwd);
  if (!program) {
    const err = new Error(`spawn ${file} ENOENT`) as NodeJS.ErrnoException;
    Object.assign(err, { code: 'ENOENT', errno: -os.constants.errno.ENOENT, syscall: `spawn ${file}`, path: file });
    return fail(err);
  }

  const fds: SpawnFd[] = [];
  const ends: { index: number; fd: number; readable: boolean }[] = [];
  try {
    stdio.forEach((entry, index) => {
      if (entry === 'inherit') {
        if (index > 2) throw new Error(`spawn: 'inherit' is only for descriptors 0-2, not ${index}`);
      } else if (entry === 'ignore') {
        fds.push({ fd: index, devNull: true });
      } else if (typeof entry === 'number') {
        fds.push({ fd: index, from: entry });
      } else {
        const [r, w] = abovePipe(stdio.length);
        const childReads = index === 0;
        ours.push(childReads ? w : r);
        theirs.push(childReads ? r : w);
        fds.push({ fd: index, from: childReads ? r : w });
        ends.push({ index, fd: childReads ? w : r, readable: !childReads });
      }
    });
  } catch (err) {
    return fail(err as NodeJS.ErrnoException);
  }

  if (!listening) {
    listening = true;
    process.on('SIGCHLD', reapAll);
  }
  const plan = {
    file: program,
    argv: [file, ...args],
    env: Object.entries(env).flatMap(([k, v]) => (v === undefined ? [] : [`${k}=${v}`])),
    cwd: opts.cwd,
    fds,
    closeFrom: stdio.length,
    setsid: opts.detached,
  };
  let pid: number;
  try {
    pid = posixSpawn(plan);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOEXEC') return fail(err as NodeJS.ErrnoException);
    // As execvp, and so child_process: a file the kernel cannot run is a shell script without its #! line.
    try {
      pid = posixSpawn({ ...plan, file: '/bin/sh', argv: ['/bin/sh', program, ...args] });
    } catch (err2) {
      return fail(err2 as NodeJS.ErrnoException);
    }
  }
  for (const fd of theirs) fs.closeSync(fd);
  child.started(pid);
  live.set(pid, child);
  for (const e of ends) {
    const s = new net.Socket({ fd: e.fd, readable: e.readable, writable: !e.readable });
    child.stdio[e.index] = s;
    // As child_process: 'close' waits for the output streams, not for stdin.
    if (e.readable) child.watch(s);
  }
  // A child that ended before the listener saw a SIGCHLD for it (it may have come
  // for an earlier child, and signals of one kind merge) is found on the next one or here.
  setImmediate(reapAll);
  return child;
}

/** Which of the strings a child is started with holds a NUL, if one does. */
function nulIn(file: string, args: string[], env: NodeJS.ProcessEnv, cwd: string | undefined): string | undefined {
  if (file.includes('\0')) return 'the program';
  const arg = args.findIndex((a) => String(a).includes('\0'));
  if (arg >= 0) return `args[${arg}]`;
  for (const [k, v] of Object.entries(env)) if (k.includes('\0') || (v !== undefined && String(v).includes('\0'))) return `env ${JSON.stringify(k)}`;
  if (cwd?.includes('\0')) return 'cwd';
  return undefined;
}

/**
 * A pipe whose ends are numbered `min` or above: a source descriptor that is
 * also one of the child's targets would be overwritten by an earlier copy.
 */
function abovePipe(min: number): [number, number] {
  const ends = pipe();
  try {
    for (let i = 0; i < 2; i++) {
      if (ends[i]! >= min) continue;
      const low = ends[i]!;
      ends[i] = dupAbove(low, min);
      fs.closeSync(low);
    }
  } catch (err) {
    for (const fd of ends) fs.closeSync(fd);
    throw err;
  }
  return ends;
}
