/**
 * Port-forward against a data/error stream pair, whatever the transport: a
 * helper process (socat, entered into the pod's network namespace with
 * nsenter) per connection, bounded per session, killed when the session ends.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import type { Duplex, Writable } from 'node:stream';
import { childDone, startFailure } from './exec.js';
import { copy } from './streams.js';

/** Helpers one port-forward session may run at once. */
export const MAX_HELPERS_PER_SESSION = 32;
/** Streams one port-forward session may hold open at once (16 connections' pairs... and then some). */
export const MAX_PORTFORWARD_STREAMS = 128;

export interface ForwardTarget {
  sandboxId: string;
  /** The pod's network namespace file; undefined for host-network pods. */
  netns?: string;
}

/** Counts a session's running helpers. */
export class HelperLimit {
  active = 0;
  constructor(readonly max = MAX_HELPERS_PER_SESSION) {}
}

/** A connection to localhost:`port` inside the pod's network namespace. */
export function connectInPod(netns: string | undefined, port: number): ChildProcessWithoutNullStreams {
  const args = ['STDIO', `TCP:localhost:${port}`];
  return netns ? spawn('nsenter', [`--net=${netns}`, 'socat', ...args], { stdio: 'pipe' }) : spawn('socat', args, { stdio: 'pipe' });
}

/**
 * Forwards one connection: bytes both ways with backpressure, a failure to
 * reach the port as text on `error`. Resolves when the connection is over.
 */
export async function forwardPort(t: ForwardTarget, port: number, data: Duplex, error: Writable, limit: HelperLimit, signal: AbortSignal): Promise<void> {
  data.on('error', () => undefined);
  error.on('error', () => undefined);
  if (signal.aborted) return;
  if (limit.active >= limit.max) {
    error.end(`error forwarding port ${port} to pod ${t.sandboxId}: too many connections at once in this session (at most ${limit.max})`);
    data.end();
    return;
  }
  limit.active++;
  let conn: ChildProcessWithoutNullStreams;
  try {
    conn = connectInPod(t.netns, port);
  } catch (err) {
    limit.active--;
    error.end(`error forwarding port ${port} to pod ${t.sandboxId}: ${(err as Error).message}`);
    data.end();
    return;
  }
  const failed = startFailure(conn);
  if (failed) {
    const err = await failed;
    limit.active--;
    error.end(`error forwarding port ${port} to pod ${t.sandboxId}: cannot start the helper: ${err.message}`);
    data.end();
    return;
  }
  const done = childDone(conn);
  const kill = () => conn.kill('SIGKILL');
  signal.addEventListener('abort', kill, { once: true });
  // The client gave up on this connection (reset its stream): the helper goes too.
  data.once('reset', kill);
  conn.stdin.on('error', () => undefined);
  data.pipe(conn.stdin);
  let gotData = false;
  conn.stdout.once('data', () => (gotData = true));
  let stderr = '';
  conn.stderr.on('data', (d: Buffer) => {
    if (stderr.length < 4096) stderr += d.toString();
  });
  conn.stderr.on('error', () => undefined);
  const output = copy(conn.stdout, data);
  const end = await done;
  await output;
  limit.active--;
  signal.removeEventListener('abort', kill);
  data.off('reset', kill);
  if (end.error) error.end(`error forwarding port ${port} to pod ${t.sandboxId}: cannot start the helper: ${end.error.message}`);
  else if (end.code !== 0 && !gotData && !signal.aborted) {
    error.end(`error forwarding port ${port} to pod ${t.sandboxId}: ${stderr.trim().split('\n').pop() || `exit ${end.code}`}`);
  } else error.end();
  data.end();
}
