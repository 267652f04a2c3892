/**
 * The kubectl-like CLI as a user runs it: the real `skiff` process, reading
 * a status API (served by the real StatusServer over a hand-filled
 * AgentView) and exec'ing through a real `skiff cri` daemon's CRI Exec and
 * WebSocket streaming server into a real container.
 */
import { spawn } from 'node:child_process';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { connectCri, type CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import { SummaryBuilder } from '../../src/kubelet-lite/stats-summary.js';
import { StatusServer } from '../../src/kubelet-lite/status-server.js';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { FakeAgentView } from '../helpers/fake-agent-view.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

const bin = path.join(repoRoot, 'bin/skiff.js');

describe.skipIf(!isRoot)('skiff exec, logs and get against a real runtime', () => {
  let f: PodFixture;
  let server: StatusServer;
  let view: FakeAgentView;
  let cri: CriEndpoint | undefined;
  const children = new Set<ReturnType<typeof spawn>>();

  beforeAll(async () => {
    f = await startPodFixture(inject('registryHost'), 'test/busybox-kubectl');
    const logDirectory = path.join(f.dirs.base, 'logs');
    const config = { metadata: { name: 'web', namespace: 'default', uid: 'web-uid', attempt: 0 }, logDirectory, linux: {} };
    const podId = (await f.skiff.runtime.RunPodSandbox({ config })).podSandboxId!;
    const mk = async (name: string, command: string[]) => {
      const id = (await f.skiff.runtime.CreateContainer({ podSandboxId: podId, config: { metadata: { name }, image: { image: f.image }, command, logPath: `${name}.log`, linux: {} }, sandboxConfig: config })).containerId!;
      await f.skiff.runtime.StartContainer({ containerId: id });
      return id;
    };
    const main = await mk('main', ['sleep', '100000']);
    const printer = await mk('printer', ['sh', '-c', 'echo first line; printf "no newline then "; sleep 0.2; echo rest; echo err line >&2; sleep 100000']);
    const started = new Date().toISOString();
    const pod: Pod = {
      metadata: { name: 'web', namespace: 'default', uid: 'web-uid', creationTimestamp: started },
      spec: { nodeName: 'test-node', containers: [{ name: 'main', image: f.image }, { name: 'printer', image: f.image }] },
      status: {
        phase: 'Running',
        startTime: started,
        containerStatuses: [
          { name: 'main', ready: true, restartCount: 0, image: f.image, imageID: '', started: true, containerID: `skiff://${main}`, state: { running: { startedAt: started } } },
          { name: 'printer', ready: true, restartCount: 0, image: f.image, imageID: '', started: true, containerID: `skiff://${printer}`, state: { running: { startedAt: started } } },
        ],
      },
    };
    view = new FakeAgentView();
    view.set(pod);
    view.logs.set('default/web/printer', path.join(logDirectory, 'printer.log'));
    cri = connectCri(`unix://${f.dirs.socket}`);
    view.cri = cri;
    const summary = new SummaryBuilder({ nodeName: 'test-node', cri, pods: () => view.pods() });
    server = await StatusServer.listen({ address: '127.0.0.1:0', view, summary });
    // The CLI runs inside the test's network namespace (where the exec URL's 127.0.0.1 is); bridge the status API in.
    await f.ns.bridgePort(server.port, f.dirs.base);
  });

  afterAll(async () => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    await server?.close();
    cri?.close();
    const leaks = await f?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  /** Runs the real CLI inside the test namespace; resolves with its output and exit code. */
  function skiff(args: string[], stdin?: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
    const argv = f.ns.wrap([process.execPath, bin, ...args]);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    children.add(child);
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    if (stdin !== undefined) child.stdin!.end(stdin);
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    return new Promise((resolve) =>
      child.once('close', (code) => {
        clearTimeout(timer);
        children.delete(child);
        resolve({ code, stdout, stderr });
      }),
    );
  }

  const common = () => ['--server', `http://127.0.0.1:${server.port}`];

  it('skiff exec prints the command output and exits with its exit code', async () => {
    const r = await skiff(['exec', 'web', '-c', 'main', ...common(), '--runtime-endpoint', `unix://${f.dirs.socket}`, '--', 'sh', '-c', 'echo hi; echo oops >&2; exit 3']);
    expect(r.stdout).toBe('hi\n');
    expect(r.stderr).toBe('oops\n');
    expect(r.code).toBe(3);
    const ok = await skiff(['exec', 'web', ...common(), '--runtime-endpoint', `unix://${f.dirs.socket}`, '--', 'cat', '/etc/hostname']);
    expect(ok.code).toBe(0);
    expect(ok.stdout.trim()).not.toBe('');
    // Two containers and none named: the first, with kubectl's note.
    expect(ok.stderr).toContain('Defaulted container "main" out of: main, printer');
  });

  it('skiff exec -i passes stdin and its end to the command', async () => {
    const r = await skiff(['exec', '-i', 'web', '-c', 'main', ...common(), '--runtime-endpoint', `unix://${f.dirs.socket}`, '--', 'sh', '-c', 'cat; echo after-eof'], 'one\ntwo\n');
    expect(r.stdout).toBe('one\ntwo\nafter-eof\n');
    expect(r.code).toBe(0);
  });

  it('skiff exec -it gives the command a terminal of the local size and still passes its exit code', async () => {
    const q = (a: string) => `'${a.replace(/'/g, `'\\''`)}'`;
    const cli = [process.execPath, bin, 'exec', '-it', 'web', '-c', 'main', ...common(), '--runtime-endpoint', `unix://${f.dirs.socket}`, '--', 'sh', '-c', 'sleep 0.5; stty size; tty; exit 5'];
    // `script` gives the CLI a terminal of its own, sized 37x91 here.
    const argv = f.ns.wrap(['script', '-qec', `stty cols 91 rows 37; ${cli.map(q).join(' ')}`, '/dev/null']);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    children.add(child);
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
    const code = await new Promise<number | null>((resolve) => child.once('close', resolve));
    children.delete(child);
    expect(out).toMatch(/^37 91\r?$/m);
    expect(out).toMatch(/^\/dev\/pts\/\d+\r?$/m);
    expect(code).toBe(5);
  });

  it('skiff exec refuses a container that is not in the pod, without calling the runtime', async () => {
    const r = await skiff(['exec', 'web', '-c', 'nope', ...common(), '--runtime-endpoint', 'unix:///nonexistent.sock', '--', 'true']);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('container nope is not valid for pod web');
  });

  it('skiff logs shows the real CRI log with partial lines joined, and asks for a container when there are several', async () => {
    await waitFor('the printer output', async () => (await skiff(['logs', 'web', '-c', 'printer', ...common()])).stdout.includes('err line'));
    const r = await skiff(['logs', 'web', '-c', 'printer', ...common()]);
    expect(r.stdout).toBe('first line\nno newline then rest\nerr line\n');
    expect((await skiff(['logs', 'web', '-c', 'printer', '--tail', '1', ...common()])).stdout).toBe('err line\n');
    const ask = await skiff(['logs', 'web', ...common()]);
    expect(ask.code).toBe(1);
    expect(ask.stderr).toContain('a container name must be specified for pod web, choose one of: [main printer]');
  });

  it('skiff get pods prints kubectl columns, and a missing pod as the server says it', async () => {
    const r = await skiff(['get', 'pods', ...common()]);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/^NAME +READY +STATUS +RESTARTS +AGE\nweb +2\/2 +Running +0 +\d+s\n$/);
    const missing = await skiff(['get', 'pod', 'ghost', ...common()]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toBe('Error from server (NotFound): pods "ghost" not found in namespace "default"\n');
  });

  it('/stats/summary reports the node from /proc and the pod and its containers from the runtime', async () => {
    const sum = (await (await fetch(`http://127.0.0.1:${server.port}/stats/summary`)).json()) as {
      node: { nodeName: string; cpu: { usageCoreNanoSeconds: number; usageNanoCores: number }; memory: { workingSetBytes: number; availableBytes: number } };
      pods: { podRef: { name: string; namespace: string; uid: string }; memory: { workingSetBytes: number }; containers: { name: string; memory: { workingSetBytes: number }; cpu: { usageCoreNanoSeconds: number } }[] }[];
    };
    expect(sum.node.nodeName).toBe('test-node');
    expect(sum.node.cpu.usageCoreNanoSeconds).toBeGreaterThan(0);
    expect(sum.node.cpu.usageNanoCores).toBeGreaterThanOrEqual(0);
    expect(sum.node.memory.workingSetBytes).toBeGreaterThan(0);
    expect(sum.node.memory.availableBytes).toBeGreaterThan(0);
    expect(sum.pods).toHaveLength(1);
    expect(sum.pods[0]!.podRef).toEqual({ name: 'web', namespace: 'default', uid: 'web-uid' });
    expect(sum.pods[0]!.containers.map((c) => c.name).sort()).toEqual(['main', 'printer']);
    for (const c of sum.pods[0]!.containers) expect(c.memory.workingSetBytes, c.name).toBeGreaterThan(0);
  });
});
