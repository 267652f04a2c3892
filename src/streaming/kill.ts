/**
 * Ending what an exec started: the command inside the container, its
 * children, and the runc that watches them. SIGKILL on runc alone would leave
 * the command running in the container, so the pid runc wrote is used.
 */
import type { ChildProcess } from 'node:child_process';
import fsp from 'node:fs/promises';
import { parentPid } from '../sys/proc.js';
import { closeFd, pidfdOpen, pidfdSendSignal } from '../sys/libc.js';

export interface HeldProcess {
  pid: number;
  /** A pidfd: it names this process even once its pid is reused. */
  fd: number;
}

function openPidfd(pid: number): number | undefined {
  try {
    return pidfdOpen(pid);
  } catch {
    return undefined; // gone
  }
}

/** Whether the process behind `fd` has not been reaped yet (so its pid still names it). */
function held(fd: number): boolean {
  try {
    return pidfdSendSignal(fd, 0);
  } catch {
    return false;
  }
}

/**
 * `pid` and every descendant, parents first (from /proc/<pid>/task/<tid>/children),
 * each held by a pidfd, so that a process that exits while the tree is read
 * and whose pid goes to another process (pid_max may be as low as 32768: a
 * container can cycle the pids in seconds) is never signalled in its place.
 * A process joins the tree only if, once its pidfd is open, its parent is
 * still the tree's process with that pid (held, so not reused). `parent`, when
 * given, is what `pid` itself must be the child of. The caller closes the fds.
 */
export async function processTree(pid: number, parent?: number): Promise<HeldProcess[]> {
  const out: HeldProcess[] = [];
  const rootFd = openPidfd(pid);
  if (rootFd === undefined) return out;
  if (parent !== undefined && (await parentPid(pid)) !== parent) {
    closeFd(rootFd);
    return out;
  }
  out.push({ pid, fd: rootFd });
  for (let i = 0; i < out.length && out.length < 4096; i++) {
    const p = out[i]!;
    const tasks = await fsp.readdir(`/proc/${p.pid}/task`).catch(() => [] as string[]);
    for (const t of tasks) {
      const kids = await fsp.readFile(`/proc/${p.pid}/task/${t}/children`, 'utf8').catch(() => '');
      for (const k of kids.split(' ').filter(Boolean)) {
        if (out.length >= 4096) break;
        const fd = openPidfd(Number(k));
        if (fd === undefined) continue;
        if ((await parentPid(Number(k))) === p.pid && held(p.fd)) out.push({ pid: Number(k), fd });
        else closeFd(fd);
      }
    }
  }
  return out;
}

function signal(pidfd: number, sig: NodeJS.Signals): void {
  try {
    pidfdSendSignal(pidfd, sig);
  } catch {
    // already gone
  }
}

const PID_FILE_WAIT_MS = 5000;

/**
 * Kills an exec: the process runc started in the container (named by
 * `pidFile`) with its descendants, then runc. While runc is still starting the
 * command, the pid file is awaited for a few seconds.
 */
export async function killExec(child: ChildProcess, pidFile: string | undefined): Promise<void> {
  const running = () => child.exitCode === null && child.signalCode === null && child.pid !== undefined;
  if (pidFile) {
    const deadline = Date.now() + PID_FILE_WAIT_MS;
    while (running()) {
      const text = await fsp.readFile(pidFile, 'utf8').catch(() => '');
      const pid = Number(text.trim());
      if (Number.isInteger(pid) && pid > 1) {
        // Freeze nothing, kill everything: the tree is read first, then signalled through its pidfds.
        // The command is runc's child (runc exec is its subreaper), which tells it from a reused pid.
        const tree = await processTree(pid, child.pid);
        try {
          if (running()) for (const p of tree) signal(p.fd, 'SIGKILL');
        } finally {
          for (const p of tree) closeFd(p.fd);
        }
        break;
      }
      if (Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  if (running()) child.kill('SIGKILL');
}
