/**
 * kubelet-lite's exec probes and hooks against a real `skiff cri` with
 * runc and conmon: a probe that flips when a file appears in the container,
 * a probe and a hook that cannot finish within their time, and a probe of a
 * container that is gone. The agent's CRI client talks to the daemon's
 * socket, as kubelet-lite does.
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Container } from 'kubernetes-types/core/v1.js';
import { connectCri, type CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import { runHook } from '../../src/kubelet-lite/hooks.js';
import type { ProbeTarget } from '../../src/kubelet-lite/model.js';
import { ProberManager, type ProbeResultEvent } from '../../src/kubelet-lite/prober.js';
import { createProbeRunner } from '../../src/kubelet-lite/probes.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

let seq = 0;

describe.skipIf(!isRoot)('kubelet-lite exec probes and hooks on a real skiff daemon', () => {
  let fx: PodFixture;
  let cri: CriEndpoint;
  let pod: { id: string; config: Record<string, unknown> };
  let prober: ProberManager | undefined;

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-probes');
    cri = connectCri(`unix://${fx.dirs.socket}`);
    const n = `probes${++seq}`;
    const config = { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: n, logDirectory: path.join(fx.dirs.base, 'logs', n), linux: {} };
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    pod = { id: podSandboxId!, config };
  });

  afterAll(async () => {
    prober?.stopAll();
    cri?.close();
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  async function runContainer(container: Container): Promise<ProbeTarget> {
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name: container.name }, image: { image: fx.image }, command: ['sleep', '1000'], logPath: `${container.name}-${++seq}.log`, linux: {} },
      sandboxConfig: pod.config,
    });
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    return { containerId: containerId!, podIP: '', container, pod: { name: 'probes', namespace: 'test', uid: 'uid-probes' } };
  }

  async function processes(containerId: string): Promise<string> {
    const r = await cri.runtime.execSync({ containerId, cmd: ['ps', '-o', 'args'], timeout: 10 }, 15_000);
    return Buffer.from(r.stdout).toString();
  }

  it('an exec probe (test -f /tmp/healthy) fails, then passes once the file is created through ExecSync', async () => {
    const readinessProbe = { exec: { command: ['test', '-f', '/tmp/healthy'] }, timeoutSeconds: 5, periodSeconds: 1, successThreshold: 1, failureThreshold: 3 };
    const target = await runContainer({ name: 'ready', readinessProbe });
    const runner = createProbeRunner({ cri });
    expect(await runner.probe(readinessProbe, target)).toEqual({ result: 'failure', message: '' });

    // The same probe through the prober manager on real time.
    const events: ProbeResultEvent[] = [];
    prober = new ProberManager({ runner, onResult: (e) => events.push(e) });
    prober.addContainer({ podUid: 'uid-probes', target, startedAt: Date.now() });
    await new Promise((r) => setTimeout(r, 2_500));
    expect(prober.ready('uid-probes', 'ready')).toBe(false);
    expect(events).toEqual([]);

    const touch = await cri.runtime.execSync({ containerId: target.containerId, cmd: ['touch', '/tmp/healthy'], timeout: 10 }, 15_000);
    expect(touch.exitCode).toBe(0);
    expect(await runner.probe(readinessProbe, target)).toEqual({ result: 'success', message: '' });
    await waitFor('the prober to see the container ready', async () => prober!.ready('uid-probes', 'ready'));
    expect(events.map((e) => [e.kind, e.result, e.changed, e.containerId])).toEqual([['readiness', 'success', true, target.containerId]]);

    // And back: the file goes, readiness follows after failureThreshold runs.
    await cri.runtime.execSync({ containerId: target.containerId, cmd: ['rm', '/tmp/healthy'], timeout: 10 }, 15_000);
    await waitFor('the prober to see the container unready', async () => !prober!.ready('uid-probes', 'ready'));
    expect(events.at(-1)).toMatchObject({ kind: 'readiness', result: 'failure', changed: true });
    prober.stopAll();
  });

  it('a non-zero exit carries the output; a probe that outlives its timeout fails as timed out, bounded', async () => {
    const target = await runContainer({ name: 'slow' });
    const runner = createProbeRunner({ cri });
    const out = await runner.probe({ exec: { command: ['sh', '-c', 'echo not yet; exit 3'] }, timeoutSeconds: 5 }, target);
    expect(out).toEqual({ result: 'failure', message: 'not yet\n' });
    const t0 = Date.now();
    const slow = await runner.probe({ exec: { command: ['sleep', '30'] }, timeoutSeconds: 1 }, target);
    const took = Date.now() - t0;
    expect(slow).toEqual({ result: 'failure', message: 'command "sleep 30" timed out' });
    expect(took).toBeGreaterThanOrEqual(900);
    expect(took).toBeLessThan(2_500);
    // The runtime killed it: no sleep 30 lingers in the container.
    await waitFor('the timed-out probe command to be gone', async () => !/^sleep 30$/m.test(await processes(target.containerId)));
  });

  it('an exec hook that cannot finish within its timeout returns ok:false within that bound, and its command is killed', async () => {
    const target = await runContainer({ name: 'hooked' });
    const ok = await runHook({ exec: { command: ['sh', '-c', 'echo started > /tmp/hook'] } }, target, cri, 5_000);
    expect(ok).toEqual({ ok: true, message: '' });
    const t0 = Date.now();
    const r = await runHook({ exec: { command: ['sleep', '100'] } }, target, cri, 2_000);
    const took = Date.now() - t0;
    expect(r.ok).toBe(false);
    expect(r.message).toMatch(/^Exec lifecycle hook \(\[sleep 100\]\) for Container "hooked" in Pod "probes_test\(uid-probes\)" failed - error: command 'sleep 100' timed out/);
    expect(took).toBeLessThan(2_600);
    await waitFor('the hook command to be gone', async () => !/^sleep 100$/m.test(await processes(target.containerId)));
    const failing = await runHook({ exec: { command: ['sh', '-c', 'echo no >&2; exit 4'] } }, target, cri, 5_000);
    expect(failing).toEqual({
      ok: false,
      message: `Exec lifecycle hook ([sh -c echo no >&2; exit 4]) for Container "hooked" in Pod "probes_test(uid-probes)" failed - error: command 'sh -c echo no >&2; exit 4' exited with 4: no\n, message: "no\\n"`,
    });
  });

  it('a probe of a container that is gone is unknown, not a failure', async () => {
    const target = await runContainer({ name: 'gone' });
    await fx.skiff.runtime.StopContainer({ containerId: target.containerId, timeout: 0 });
    await fx.skiff.runtime.RemoveContainer({ containerId: target.containerId });
    const o = await createProbeRunner({ cri }).probe({ exec: { command: ['true'] }, timeoutSeconds: 1 }, target);
    expect(o.result).toBe('unknown');
    expect(o.message).toContain('not found');
  });
});
