/**
 * What goes wrong around a container's life and how skiff must still answer:
 * a monitor that died, a reboot that lost the exit files, exec commands that
 * leave children or outlive their caller, OOM kills, namespace escapes
 * through seccomp, and what the kubelet reads from status and stats.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

let seq = 0;

describe.skipIf(!isRoot)('runtime hardening: lost monitors, exec, OOM, seccomp, status and stats', () => {
  let fx: PodFixture;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-hardening');
  });

  afterAll(async () => {
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  function podConfig(extra: Record<string, unknown> = {}) {
    const n = `hpod${++seq}`;
    return {
      metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 },
      hostname: `host-${n}`,
      logDirectory: path.join(fx.dirs.base, 'logs', n),
      linux: {},
      ...extra,
    };
  }

  async function runPod(extra: Record<string, unknown> = {}) {
    const config = podConfig(extra);
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  async function runContainer(pod: { id: string; config: ReturnType<typeof podConfig> }, cfg: Record<string, unknown>) {
    const name = `c${++seq}`;
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image: fx.image }, logPath: `${name}.log`, linux: {}, ...cfg },
      sandboxConfig: pod.config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    return containerId!;
  }

  async function exec(id: string, script: string, timeout = 10): Promise<string> {
    const r = await fx.skiff.runtime.ExecSync({ containerId: id, cmd: ['sh', '-c', script], timeout });
    return Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString();
  }

  async function pids(id: string): Promise<{ pid: number; conmon: number }> {
    const info = JSON.parse((await fx.skiff.runtime.ContainerStatus({ containerId: id, verbose: true })).info!.info!);
    const bundle = path.join(fx.dirs.state, 'containers', id);
    const conmon = Number((await fs.readFile(path.join(bundle, 'conmon.pid'), 'utf8')).trim());
    expect(info.pid).toBeGreaterThan(0);
    expect(conmon).toBeGreaterThan(0);
    return { pid: info.pid as number, conmon };
  }

  function killBoth(p: { pid: number; conmon: number }) {
    process.kill(p.conmon, 'SIGKILL');
    process.kill(p.pid, 'SIGKILL');
  }

  async function gone(pid: number) {
    await waitFor(`process ${pid} to be gone`, async () => {
      const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
      return stat === '' || / [ZX] /.test(stat);
    });
  }

  it('stops a container whose conmon and process were killed, then stops and removes its pod', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const p = await pids(c);
    killBoth(p);
    await gone(p.pid);
    await gone(p.conmon);
    const t0 = Date.now();
    await fx.skiff.runtime.StopContainer({ containerId: c, timeout: 30 });
    // Learned from the runtime at once, not after the 30 s grace period.
    expect(Date.now() - t0).toBeLessThan(10_000);
    const st = (await fx.skiff.runtime.ContainerStatus({ containerId: c })).status!;
    expect(st).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 255, reason: 'Unknown' });
    expect(Number(st.finishedAt)).toBeGreaterThanOrEqual(Number(st.startedAt));
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    expect((await codeOf(fx.skiff.runtime.ContainerStatus({ containerId: c }))).code).toBe(grpc.status.NOT_FOUND);
  });

  it('stops a container that still runs after its conmon died', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const p = await pids(c);
    process.kill(p.conmon, 'SIGKILL');
    await gone(p.conmon);
    await fx.skiff.runtime.StopContainer({ containerId: c, timeout: 1 });
    await gone(p.pid);
    expect((await fx.skiff.runtime.ContainerStatus({ containerId: c })).status).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 255, reason: 'Unknown' });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });

  it('after a simulated reboot (monitor, process and exit files gone) reports the container EXITED and removes it', async () => {
    const pod = await runPod();
    const c = await runContainer(pod, { command: ['sleep', '1000'] });
    const p = await pids(c);
    expect((await fx.skiff.stop()).code).toBe(0);
    killBoth(p);
    await gone(p.pid);
    await gone(p.conmon);
    // The exit files live on the state tmpfs, which a reboot empties.
    const exits = path.join(fx.dirs.state, 'exits');
    for (const f of await fs.readdir(exits)) await fs.rm(path.join(exits, f), { force: true });
    await fx.skiff.start();
    const st = (await fx.skiff.runtime.ContainerStatus({ containerId: c })).status!;
    expect(st).toMatchObject({ state: 'CONTAINER_EXITED', exitCode: 255, reason: 'Unknown' });
    await fx.skiff.runtime.RemoveContainer({ containerId: c });
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });

  describe('ExecSync', () => {
    let pod: Awaited<ReturnType<typeof runPod>>;
    let c: string;
    beforeAll(async () => {
      pod = await runPod();
      c = await runContainer(pod, { command: ['sleep', '1000'] });
    });
    afterAll(async () => {
      if (pod) await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    });

    const count = (pattern: string) => exec(c, `ps -o stat,args | grep -v grep | grep -c "${pattern}" || true`).then((t) => Number(t.trim()));

    it('answers when the command exits, though a background child keeps stdout open', async () => {
      const t0 = Date.now();
      const r = await fx.skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'echo before; sleep 101 & exit 3'], timeout: 30 });
      expect(Date.now() - t0).toBeLessThan(5_000);
      expect(r.exitCode).toBe(3);
      expect(Buffer.from(r.stdout!).toString()).toBe('before\n');
      await exec(c, 'pkill -f "sleep 101" || true');
    });

    it('kills a command that outlives its timeout and answers DeadlineExceeded, leaving no process', async () => {
      const t0 = Date.now();
      const err = await codeOf(fx.skiff.runtime.ExecSync({ containerId: c, cmd: ['sleep', '4322'], timeout: 1 }));
      expect(err.code).toBe(grpc.status.DEADLINE_EXCEEDED);
      expect(err.details).toMatch(/timed out/);
      expect(Date.now() - t0).toBeLessThan(6_000);
      expect(await count('sleep 4322')).toBe(0);
    });

    it('kills the command when the client cancels (its deadline passes)', async () => {
      const { loadCri } = await import('../../src/server/proto.js');
      const client = new (loadCri().runtime.v1.RuntimeService)(`unix:${fx.dirs.socket}`, grpc.credentials.createInsecure());
      try {
        const err = await new Promise<grpc.ServiceError>((resolve, reject) =>
          client.ExecSync({ containerId: c, cmd: ['sleep', '4323'], timeout: 0 }, { deadline: Date.now() + 1_000 }, (e) => (e ? resolve(e) : reject(new Error('ExecSync returned')))),
        );
        expect(err.code).toBe(grpc.status.DEADLINE_EXCEEDED);
      } finally {
        client.close();
      }
      await waitFor('the cancelled command to be killed', async () => ((await count('sleep 4323')) === 0 ? true : undefined), 10_000);
      expect(fx.skiff.log).toMatch(/exec cancelled by the client/);
    });
  });
});
