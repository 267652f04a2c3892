/**
 * Ending what an exec started: the command inside the container, its
 * children, and the runc that watches them. SIGKILL on runc alone would leave
 * the command running in the container, so the pid runc wrote is used.
 */
import type { ChildProcess } from 'node:child_process';
import fsp from 'node:fs/promises';

/** `pid` and every descendant, parents first (from /proc/<pid>/task/<tid>/children). */
export async function processTree(pid: number): Promise<number[]> {
  const out: number[] = [];
  const queue = [pid];
  while (queue.length && out.length < 4096) {
    const p = queue.shift()!;
    out.push(p);
    const tasks = await fsp.readdir(`/proc/${p}/task`).catch(() => [] as string[]);
    for (const t of tasks) {
      const kids = await fsp.readFile(`/proc/${p}/task/${t}/children`, 'utf8').catch(() => '');
      for (const k of kids.split(' ').filter(Boolean)) queue.push(Number(k));
    }
  }
  return out;
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
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
        // Freeze nothing, kill everything: the tree is read first, then signalled.
        const tree = await processTree(pid);
        if (running()) for (const p of tree) signal(p, 'SIGKILL');
        break;
      }
      if (Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
  if (running()) child.kill('SIGKILL');
}
