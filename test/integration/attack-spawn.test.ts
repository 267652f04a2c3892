/**
 * The helpers the daemon starts with posix_spawn (src/sys/spawn.ts): conmon
 * for a container and for each ExecSync must not take along a descriptor the
 * daemon inherited from whoever started it, and bursts of ExecSync that time
 * out or are cancelled must leave no zombie, descriptor or command behind.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { loadCri } from '../../src/server/proto.js';
import { grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { podConfig, startPodFixture, type PodFixture } from '../helpers/pods.js';

/** The processes whose parent is `pid`, with their state (Z for a zombie). */
function childrenOf(pid: number): { pid: number; state: string; comm: string }[] {
  const out: { pid: number; state: string; comm: string }[] = [];
  for (const d of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const st = fs.readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      if (Number(f[1]) === pid) out.push({ pid: Number(d), state: f[0]!, comm: st.slice(st.indexOf('(') + 1, st.lastIndexOf(')')) });
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** What each open descriptor of `pid` points at. */
function fdTargets(pid: number): string[] {
  const out: string[] = [];
  for (const fd of fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      out.push(fs.readlinkSync(`/proc/${pid}/fd/${fd}`));
    } catch {
      // closed meanwhile
    }
  }
  return out;
}

/** The conmon processes whose command line names `containerId`. */
function conmonsOf(containerId: string, exec: boolean): number[] {
  return fs
    .readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => {
      try {
        const argv = fs.readFileSync(`/proc/${d}/cmdline`, 'utf8').split('\0');
        return path.basename(argv[0]!) === 'conmon' && argv.includes(containerId) && argv.includes('--exec') === exec;
      } catch {
        return false;
      }
    })
    .map(Number);
}

describe.skipIf(!isRoot)('helpers started with posix_spawn', () => {
  let fx: PodFixture;
  let dir: string;
  let marker: string;
  let daemonPid: number;
  let ctr: string;

  beforeAll(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'skiff-attack-spawn-'));
    marker = path.join(dir, 'inherited-by-the-daemon');
    fs.writeFileSync(marker, '');
    // A launcher's descriptor that is not close-on-exec, as a shell's redirection leaves it (a supervisor's
    // pipe, a test runner's): the daemon has it open, its helpers must not.
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-attack-spawn', [], { wrap: (a) => ['bash', '-c', 'exec "$@" 200<"$0"', marker, ...a] });
    daemonPid = fx.skiff.child.pid!;
    const config = podConfig(fx.dirs, 'spawnpod');
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: podSandboxId!,
      config: { metadata: { name: 'c' }, image: { image: fx.image }, logPath: 'c.log', linux: {}, command: ['sleep', '100000'] },
      sandboxConfig: config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    ctr = containerId!;
  });

  afterAll(async () => {
    if (fx) {
      const leaks = await fx.cleanup();
      expect(leaks.mounts, 'mounts left behind').toEqual([]);
      expect(leaks.processes, 'processes left behind').toEqual([]);
    }
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it("conmon, for the container and for an ExecSync, holds no descriptor the daemon inherited from its launcher", async () => {
    expect(fdTargets(daemonPid), 'the daemon has the launcher\'s descriptor').toContain(marker);
    const [monitor] = conmonsOf(ctr, false);
    expect(monitor, 'the container\'s conmon').toBeGreaterThan(0);
    // Held for as long as the container lives: a launcher waiting for its pipe's end would wait that long.
    expect(fdTargets(monitor!)).not.toContain(marker);

    const exec = fx.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['sleep', '2'], timeout: 10 });
    let execConmon: number | undefined;
    for (let i = 0; i < 100 && execConmon === undefined; i++) {
      [execConmon] = conmonsOf(ctr, true);
      if (execConmon === undefined) await new Promise((r) => setTimeout(r, 20));
    }
    expect(execConmon, 'the ExecSync\'s conmon').toBeGreaterThan(0);
    expect(fdTargets(execConmon!)).not.toContain(marker);
    expect((await exec).exitCode).toBe(0);
  });

  it('ExecSync that times out or is cancelled, 80 at once, leaves no zombie, descriptor or command behind', async () => {
    const fdsBefore = fs.readdirSync(`/proc/${daemonPid}/fd`).length;
    const calls: Promise<unknown>[] = [];
    for (let i = 0; i < 40; i++) {
      calls.push(fx.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['sleep', '100'], timeout: 1 }).then(() => 'ok', (e: { code: number }) => e.code));
    }
    // Cancelled at staggered moments: before conmon starts, before it reports the pid, while the command runs.
    const rt = new (loadCri().runtime.v1.RuntimeService)(`unix:${fx.dirs.socket}`, grpc.credentials.createInsecure());
    for (let i = 0; i < 40; i++) {
      calls.push(
        new Promise((resolve) => {
          const call = rt.ExecSync({ containerId: ctr, cmd: ['sleep', '100'], timeout: 0 }, (err: grpc.ServiceError | null) => resolve(err ? err.code : 'ok'));
          setTimeout(() => call.cancel(), 5 + i * 7);
        }),
      );
    }
    const codes = await Promise.all(calls);
    rt.close();
    // Timed out: DeadlineExceeded, every one (an Internal now and then was conmon exiting 1 without an exit
    // file when concurrent execs replaced each other's attach socket, fixed in 450cad8); never an answer.
    expect(codes.slice(0, 40).every((c) => c === grpc.status.DEADLINE_EXCEEDED), JSON.stringify(codes.slice(0, 40))).toBe(true);
    expect(codes.slice(40).every((c) => c === grpc.status.CANCELLED), JSON.stringify(codes.slice(40))).toBe(true);
    // conmon reaps the commands and the daemon reaps conmon; a killed one's grace is 5 s at most.
    let left: unknown[] = [];
    for (let i = 0; i < 70; i++) {
      const ps = (await fx.skiff.runtime.ExecSync({ containerId: ctr, cmd: ['ps', '-o', 'args'], timeout: 10 })).stdout!.toString();
      left = [...childrenOf(daemonPid), ...ps.split('\n').filter((l) => l.startsWith('sleep 100') && l.trim() !== 'sleep 100000')];
      if (!left.length) break;
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(left).toEqual([]);
    expect(fs.readdirSync(`/proc/${daemonPid}/fd`).length).toBeLessThanOrEqual(fdsBefore);
  });
});
