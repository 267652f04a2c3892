/**
 * The exec kill walks a process tree and signals it through pidfds: a pid
 * that is reused while the tree is read (pid_max can be 32768, and a
 * container can cycle that many pids in seconds) names another process by
 * then, and must not be signalled in its place.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { processTree } from '../../src/streaming/kill.js';
import { closeFd, pidfdSendSignal } from '../../src/sys/libc.js';

describe('processTree', () => {
  const started: number[] = [];
  afterEach(() => {
    for (const p of started.splice(0)) {
      try {
        process.kill(-p, 'SIGKILL');
      } catch {
        // gone
      }
    }
  });

  async function tree() {
    const sh = spawn('sh', ['-c', 'sleep 100 & sleep 100 & echo ready; wait'], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
    started.push(sh.pid!);
    await new Promise((r) => sh.stdout!.once('data', r));
    // "ready" comes once both children are forked, not once they have exec'd sleep: wait for that too.
    const children = () => fs.readFileSync(`/proc/${sh.pid}/task/${sh.pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
    for (const end = Date.now() + 5000; Date.now() < end; await new Promise((r) => setTimeout(r, 10))) {
      const kids = children();
      if (kids.length === 2 && kids.every((k) => fs.readFileSync(`/proc/${k}/cmdline`, 'utf8').startsWith('sleep'))) break;
    }
    return sh;
  }

  it('holds the process and its descendants by pidfd, parents first', async () => {
    const sh = await tree();
    const held = await processTree(sh.pid!, process.pid);
    try {
      expect(held.map((h) => h.pid)[0]).toBe(sh.pid);
      expect(held).toHaveLength(3);
      for (const h of held.slice(1)) expect(fs.readFileSync(`/proc/${h.pid}/cmdline`, 'utf8')).toMatch(/^sleep/);
      for (const h of held) expect(pidfdSendSignal(h.fd, 0)).toBe(true);
    } finally {
      for (const h of held) closeFd(h.fd);
    }
  });

  it('takes nothing when the process is not the child it must be (its pid was reused)', async () => {
    const sh = await tree();
    // This test process is not sh's parent's parent: as if the pid file's pid now named a stranger.
    expect(await processTree(sh.pid!, 1)).toEqual([]);
    expect(await processTree(2 ** 22 + 12345, process.pid)).toEqual([]);
  });
});
