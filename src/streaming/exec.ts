/**
 * Exec and attach against one set of session streams, whatever the
 * transport. One command per session; when the client goes away the command
 * inside the container is killed, not only runc.
 */
import type { ChildProcess, ChildProcessWithoutNullStreams } from 'node:child_process';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { AttachConnection } from './attach.js';
import { killExec } from './kill.js';
import { copy, flushed, type SessionStreams } from './streams.js';
import { Terminal } from './terminal.js';

export type ExecChild = ChildProcessWithoutNullStreams & { pidFile?: string };
export interface ExecTty {
  child: ChildProcess;
  master: number;
  pidFile?: string;
}

export interface ExecDeps {
  log: Logger;
  startExec: (containerId: string, cmd: string[]) => Promise<ExecChild>;
  startExecTty: (containerId: string, cmd: string[]) => Promise<ExecTty>;
}

const isDimension = (n: unknown): n is number => typeof n === 'number' && Number.isInteger(n) && n >= 0 && n <= 0xffff;

/**
 * Terminal size messages arrive as concatenated JSON objects
 * ({"Width":80,"Height":24}); sizes are 16-bit, as the kubelet's are, and
 * any other message is ignored.
 */
export function parseResizes(text: string): Array<{ width: number; height: number }> {
  const out: Array<{ width: number; height: number }> = [];
  for (const m of text.matchAll(/\{[^{}]*\}/g)) {
    try {
      const j = JSON.parse(m[0]) as { Width?: unknown; Height?: unknown };
      if (isDimension(j.Width) && isDimension(j.Height)) out.push({ width: j.Width, height: j.Height });
    } catch {
      // a malformed message is ignored, as the kubelet does
    }
  }
  return out;
}

/** Resolves with how a child ended; a child that could not start ends with its spawn error. */
export function childDone(child: ChildProcess): Promise<{ code: number | null; signal: string | null; error?: Error }> {
  return new Promise((resolve) => {
    let error: Error | undefined;
    child.on('error', (e) => (error = e));
    child.once('close', (code, signal) => resolve({ code: error ? null : code, signal, error }));
  });
}

/**
 * A child whose pipes are missing could not start (EMFILE, ENFILE): Node
 * gives it no stdio and reports the cause as an 'error' event, shortly.
 */
export function startFailure(child: ChildProcess): Promise<Error> | undefined {
  if (child.stdin && child.stdout && child.stderr) return undefined;
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(new Error('the process has no stdio')), 1000);
    child.once('error', (e) => {
      clearTimeout(timer);
      resolve(e);
    });
  });
}

/**
 * The last size message in `chunk`, found from its end: only the latest size
 * matters, so the rest of a chunk (however many messages) is never parsed.
 */
export function lastResize(chunk: Buffer): { width: number; height: number } | undefined {
  let end = chunk.length;
  // A malformed last message is skipped for the one before it, a few times at most.
  for (let tries = 0; tries < 4 && end > 0; tries++) {
    const close = chunk.lastIndexOf(0x7d, end - 1);
    if (close < 0) return undefined;
    const open = chunk.lastIndexOf(0x7b, close);
    if (open < 0) return undefined;
    const found = parseResizes(chunk.subarray(open, close + 1).toString()).pop();
    if (found) return found;
    end = open;
  }
  return undefined;
}

/**
 * Reads resize messages from `resize` and applies the last of each chunk:
 * only the latest size matters, and a flood of them costs one resize per
 * chunk read, not one per message.
 */
function onResize(resize: NodeJS.ReadableStream | undefined, apply: (cols: number, rows: number) => void): void {
  resize?.on('error', () => undefined);
  resize?.on('data', (d: Buffer) => {
    const last = lastResize(d);
    if (last) apply(last.width, last.height);
  });
}

export async function runExec(d: ExecDeps, containerId: string, cmd: string[], tty: boolean, io: SessionStreams): Promise<void> {
  if (tty) return runExecTty(d, containerId, cmd, io);
  let child: ExecChild;
  try {
    child = await d.startExec(containerId, cmd);
  } catch (err) {
    io.finish({ kind: 'failure', message: errorMessage(err) });
    return;
  }
  const failed = startFailure(child);
  if (failed) {
    io.finish({ kind: 'failure', message: `cannot run the command: ${(await failed).message}` });
    return;
  }
  const done = childDone(child);
  const kill = () => void killExec(child, child.pidFile).catch(() => undefined);
  if (io.signal.aborted) kill();
  io.signal.addEventListener('abort', kill, { once: true });
  child.stdin.on('error', () => undefined);
  if (io.stdin) {
    io.stdin.on('error', () => undefined);
    io.stdin.pipe(child.stdin);
  } else child.stdin.end();
  const outputs = [copy(child.stdout, io.stdout), copy(child.stderr, io.stderr)];
  const end = await done;
  await Promise.all(outputs);
  io.signal.removeEventListener('abort', kill);
  if (end.error) io.finish({ kind: 'failure', message: `cannot run the command: ${end.error.message}` });
  else io.finish({ kind: 'exit', code: end.code, signal: end.signal });
}

async function runExecTty(d: ExecDeps, containerId: string, cmd: string[], io: SessionStreams): Promise<void> {
  let started: ExecTty;
  let term: Terminal;
  try {
    started = await d.startExecTty(containerId, cmd);
    term = new Terminal(started.master);
  } catch (err) {
    io.finish({ kind: 'failure', message: errorMessage(err) });
    return;
  }
  const { child } = started;
  const done = childDone(child);
  const kill = () => void killExec(child, started.pidFile).catch(() => undefined);
  if (io.signal.aborted) kill();
  io.signal.addEventListener('abort', kill, { once: true });
  onResize(io.resize, (cols, rows) => {
    term.resize(cols, rows);
    if (child.exitCode === null) child.kill('SIGWINCH');
  });
  if (io.stdin) {
    io.stdin.on('error', () => undefined);
    io.stdin.pipe(term.input);
  }
  const output = copy(term.output, io.stdout);
  const end = await done;
  // What the program wrote last is still in the terminal: read it, briefly.
  await Promise.race([output, new Promise((r) => setTimeout(r, 500))]);
  term.close();
  io.signal.removeEventListener('abort', kill);
  if (end.error) io.finish({ kind: 'failure', message: `cannot run the command: ${end.error.message}` });
  else io.finish({ kind: 'exit', code: end.code, signal: end.signal });
}

/** conmon's control FIFO takes "<type> <height> <width>"; type 1 resizes the terminal. */
export type Resizer = (cols: number, rows: number) => void;

/** Attaches the session to a container's own stdio through conmon's attach socket. */
export function runAttach(bundle: string, containerId: string, resizeConmon: Resizer, io: SessionStreams): void {
  let conn: AttachConnection;
  try {
    conn = new AttachConnection(bundle);
  } catch (err) {
    io.finish({ kind: 'failure', message: `cannot attach to ${containerId}: ${errorMessage(err)}` });
    return;
  }
  io.signal.addEventListener('abort', () => conn.close(), { once: true });
  if (io.signal.aborted) conn.close();
  if (io.stdin) {
    io.stdin.on('error', () => undefined);
    io.stdin.on('data', (d: Buffer) => {
      if (!conn.write(d)) {
        io.stdin!.pause();
        conn.once('drained', () => io.stdin!.resume());
      }
    });
    io.stdin.on('end', () => conn.endInput());
  }
  onResize(io.resize, resizeConmon);
  // A client that reads slowly stops the polling of conmon's socket until it catches up.
  const deliver = (out: NodeJS.WritableStream | undefined, d: Buffer) => {
    if (!out || out.write(d)) return;
    conn.pause();
    out.once('drain', () => conn.resume());
  };
  conn.on('stdout', (d: Buffer) => deliver(io.stdout, d));
  conn.on('stderr', (d: Buffer) => deliver(io.stderr, d));
  conn.on('close', () => {
    void Promise.all([flushed(io.stdout, io.signal), flushed(io.stderr, io.signal)]).then(() => io.finish({ kind: 'ended' }));
  });
}
