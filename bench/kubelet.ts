/**
 * `npm run bench -- kubelet`: the node agent over skiff and, when it runs on
 * this machine (shared/conformance/containerd.sh), over containerd, in the
 * same run:
 *  - manifest written → pod Ready (no readiness probe), 20 pods one by one;
 *  - container exit → its first restart started (restartPolicy Always), from
 *    the runtime's own finishedAt/startedAt;
 *  - the agent's RSS and CPU with 50 pods idle, against its own idle RSS.
 */
import * as grpc from '@grpc/grpc-js';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { connectCri, type CriEndpoint } from '../src/kubelet-lite/cri-client.js';
import { AgentProcess } from '../test/helpers/kubelet.js';
import type { TestNetns } from '../test/helpers/netns.js';
import { freePort, waitFor } from '../test/helpers/registry.js';
import { rssKiB } from './pods.js';

const PODS_READY = 20;
const PODS_RESTART = 10;
const PODS_IDLE = 50;
const IDLE_SECONDS = 30;

export interface KubeletResults {
  readyMs: number[];
  restartMs: number[];
  idleRssMiB: number;
  loadedRssMiB: number;
  cpuPercent: number;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? NaN;
};

async function cpuTicks(pid: number): Promise<number> {
  const st = (await fs.readFile(`/proc/${pid}/stat`, 'utf8')).split(') ')[1]!.split(' ');
  return Number(st[11]) + Number(st[12]);
}

const podManifest = (name: string, image: string, command: string) => `apiVersion: v1
kind: Pod
metadata: {name: ${name}, labels: {bench: kubelet}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ${image}
    command: [sh, -c, "${command}"]
`;

export async function benchKubelet(opts: { name: string; endpoint: string; image: string; base: string; ns?: TestNetns }): Promise<KubeletResults> {
  const manifests = path.join(opts.base, `manifests-${opts.name}`);
  await fs.rm(manifests, { recursive: true, force: true });
  await fs.mkdir(manifests, { recursive: true });
  const port = await freePort();
  const wrap = (a: string[]) => (opts.ns ? opts.ns.wrap(a) : a);
  const agent = await new AgentProcess(
    ['--manifests', manifests, '--runtime-endpoint', opts.endpoint, '--status-address', `127.0.0.1:${port}`, '--root-dir', path.join(opts.base, `kubelet-${opts.name}`), '--node-name', `bench-${opts.name}`, '--log-level', 'info'],
    wrap,
  ).start();
  const status = opts.ns ? `http://127.0.0.1:${await opts.ns.exposePort(port, opts.base)}` : `http://127.0.0.1:${port}`;
  const cri: CriEndpoint = connectCri(opts.endpoint);
  const pod = async (name: string): Promise<Pod | undefined> => {
    const r = await fetch(`${status}/pods/default/${name}`);
    return r.status === 200 ? ((await r.json()) as Pod) : undefined;
  };
  const isReady = (p: Pod | undefined) => p?.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
  const write = async (file: string, text: string) => {
    await fs.writeFile(path.join(manifests, `.${file}`), text);
    await fs.rename(path.join(manifests, `.${file}`), path.join(manifests, file));
  };
  const removeAll = async () => {
    for (const f of await fs.readdir(manifests)) await fs.rm(path.join(manifests, f));
    await waitFor('every bench pod to be gone', async () => {
      const r = (await (await fetch(`${status}/pods`)).json()) as { items: Pod[] };
      return r.items.length === 0 ? true : undefined;
    }, 180_000);
  };
  try {
    await new Promise((r) => setTimeout(r, 2000));
    const idleRss = await rssKiB([agent.child.pid!]);
    // Warm-up: one pod, uncounted (image present, JIT warm).
    await write('warm.yaml', podManifest('warm', opts.image, 'exec sleep 3600'));
    await waitFor('warm-up pod Ready', async () => (isReady(await pod('warm')) ? true : undefined), 120_000);
    await removeAll();

    const readyMs: number[] = [];
    for (let i = 0; i < PODS_READY; i++) {
      const name = `ready-${i}`;
      const t0 = performance.now();
      await write(`${name}.yaml`, podManifest(name, opts.image, 'exec sleep 3600'));
      await waitFor(`${name} Ready`, async () => (isReady(await pod(name)) ? true : undefined), 120_000);
      readyMs.push(performance.now() - t0);
    }
    await removeAll();

    const restartMs: number[] = [];
    for (let i = 0; i < PODS_RESTART; i++) {
      const name = `restart-${i}`;
      await write(`${name}.yaml`, podManifest(name, opts.image, 'while [ ! -f /tmp/die ]; do sleep 0.02; done; exit 1'));
      const p = await waitFor(`${name} running`, async () => {
        const x = await pod(name);
        return x?.status?.containerStatuses?.[0]?.state?.running ? x : undefined;
      }, 120_000);
      const first = p.status!.containerStatuses![0]!.containerID!.replace(/^[a-z]+:\/\//, '');
      await cri.runtime.execSync({ containerId: first, cmd: ['touch', '/tmp/die'], timeout: 5 });
      const next = await waitFor(`${name} restarted`, async () => {
        const x = await pod(name);
        const cs = x?.status?.containerStatuses?.[0];
        return cs?.restartCount === 1 && cs.state?.running ? cs.containerID!.replace(/^[a-z]+:\/\//, '') : undefined;
      }, 60_000);
      const a = await cri.runtime.containerStatus({ containerId: first, verbose: false });
      const b = await cri.runtime.containerStatus({ containerId: next, verbose: false });
      restartMs.push((b.status!.startedAt - a.status!.finishedAt) / 1e6);
    }
    await removeAll();

    for (let i = 0; i < PODS_IDLE; i++) await write(`idle-${i}.yaml`, podManifest(`idle-${i}`, opts.image, 'exec sleep 3600'));
    await waitFor('50 idle pods Ready', async () => {
      const r = (await (await fetch(`${status}/pods`)).json()) as { items: Pod[] };
      return r.items.filter(isReady).length === PODS_IDLE ? true : undefined;
    }, 300_000);
    const t0 = await cpuTicks(agent.child.pid!);
    const w0 = performance.now();
    await new Promise((r) => setTimeout(r, IDLE_SECONDS * 1000));
    const ticks = (await cpuTicks(agent.child.pid!)) - t0;
    const cpuPercent = (ticks / 100 / ((performance.now() - w0) / 1000)) * 100;
    const loadedRss = await rssKiB([agent.child.pid!]);
    await removeAll();
    return { readyMs, restartMs, idleRssMiB: idleRss / 1024, loadedRssMiB: loadedRss / 1024, cpuPercent };
  } finally {
    cri.close();
    await agent.stop();
  }
}

export function reportKubelet(results: Array<[string, KubeletResults]>): string {
  const f = (x: number) => x.toFixed(1);
  const lines = ['', 'kubelet-lite over each runtime (same run):', `${'measure'.padEnd(44)}${results.map(([n]) => n.padStart(16)).join('')}`];
  const row = (label: string, get: (r: KubeletResults) => string) => lines.push(`${label.padEnd(44)}${results.map(([, r]) => get(r).padStart(16)).join('')}`);
  row('manifest → Ready p50 (ms, 20 pods)', (r) => f(pct(r.readyMs, 50)));
  row('manifest → Ready p95 (ms)', (r) => f(pct(r.readyMs, 95)));
  row('exit → restart started p50 (ms, 10 pods)', (r) => f(pct(r.restartMs, 50)));
  row('exit → restart started p95 (ms)', (r) => f(pct(r.restartMs, 95)));
  row('agent RSS idle (MiB)', (r) => f(r.idleRssMiB));
  row('agent RSS, 50 pods idle (MiB)', (r) => f(r.loadedRssMiB));
  row('agent RSS growth for 50 pods (MiB)', (r) => f(r.loadedRssMiB - r.idleRssMiB));
  row(`agent CPU, 50 pods idle ${IDLE_SECONDS}s (%)`, (r) => f(r.cpuPercent));
  lines.push('targets (skiff): Ready p50 ≤ 250 ms; restart p50 ≤ 100 ms; RSS growth ≤ 60 MiB', '');
  return lines.join('\n');
}

export { grpc };
