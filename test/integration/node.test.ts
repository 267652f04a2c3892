/**
 * `skiff node` as a user runs it: the demo's manifests (a ConfigMap-driven
 * page on a 3-replica Deployment with readiness probes, a NodePort Service,
 * a Job that calls it by name) over images imported from archives, with no
 * registry — everything in one process, inside a network namespace of the
 * test's own.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildDemoImages } from '../../scripts/build-demo-images.js';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { freePort, waitFor } from '../helpers/registry.js';
import { removeNode } from '../helpers/skiff-node.js';
import { processesMentioning } from '../helpers/pods.js';

const bin = path.join(repoRoot, 'bin', 'skiff.js');

describe.skipIf(!isRoot)('skiff node: the demo, offline, in one process', () => {
  let base: string;
  let ns: TestNetns;
  let child: ChildProcess | undefined;
  let log = '';
  let status = '';
  let statusPort = 0;
  const dirs = () => ({
    socket: path.join(base, 'skiff.sock'),
    root: path.join(base, 'root'),
    state: path.join(base, 'state'),
    kubelet: path.join(base, 'kubelet'),
    manifests: path.join(base, 'manifests'),
    images: path.join(base, 'images'),
  });

  async function startNodeProcess(): Promise<void> {
    const d = dirs();
    log = '';
    const argv = ns.wrap([
      process.execPath, bin, 'node',
      '--manifests', d.manifests, '--images-dir', d.images,
      '--socket', d.socket, '--root', d.root, '--state', d.state, '--root-dir', d.kubelet,
      '--cni-conf-dir', path.join(base, 'net.d'), '--registry-config', path.join(base, 'certs.d'),
      '--status-address', `127.0.0.1:${statusPort}`, '--node-name', 'demo-node', '--log-level', 'info',
    ]);
    child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (b: Buffer) => (log += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (log += b.toString()));
    await waitFor('skiff node to be ready', async () => {
      if (child!.exitCode !== null) throw new Error(`skiff node exited ${child!.exitCode}: ${log}`);
      return log.includes('skiff node ready');
    }, 60_000);
  }

  async function stopNodeProcess(): Promise<number | null> {
    if (!child || child.exitCode !== null) return child?.exitCode ?? null;
    const exited = new Promise<number | null>((r) => child!.once('exit', (c) => r(c)));
    child.kill('SIGTERM');
    return exited;
  }

  const get = async <T>(p: string): Promise<T> => (await (await fetch(status + p)).json()) as T;
  const pods = async () => (await get<{ items: Pod[] }>('/pods')).items;
  /** An HTTP GET from the node's own network namespace (busybox wget; its -T crashes, so timeout(1)). */
  const wgetInNode = (url: string) => spawnSync('nsenter', [`--net=${ns.path}`, 'timeout', '5', '/bin/busybox', 'wget', '-q', '-O', '-', url], { encoding: 'utf8' });

  beforeAll(async () => {
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-node-'));
    const d = dirs();
    await fs.mkdir(d.manifests, { recursive: true });
    await fs.mkdir(path.join(base, 'net.d'));
    await buildDemoImages(d.images);
    for (const f of await fs.readdir(path.join(repoRoot, 'examples', 'demo'))) await fs.copyFile(path.join(repoRoot, 'examples', 'demo', f), path.join(d.manifests, f));
    ns = new TestNetns().create();
    // The node's own address, as eth0 would carry it on a real machine (a documentation address
    // on a veth pair whose both ends stay in the namespace: nothing leaves it).
    for (const args of [['link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0-peer'], ['addr', 'add', '192.0.2.10/24', 'dev', 'eth0'], ['link', 'set', 'eth0-peer', 'up'], ['link', 'set', 'eth0', 'up']]) {
      const r = spawnSync('ip', ['-n', ns.name, ...args], { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`ip ${args.join(' ')}: ${r.stderr}`);
    }
    statusPort = await freePort();
    await startNodeProcess();
    status = `http://127.0.0.1:${await ns.exposePort(statusPort, base)}`;
  }, 120_000);

  afterAll(async () => {
    if (base && ns) {
      // The node leaves its pods running on purpose: stop it, then remove them through a bare
      // runtime on the same root (nothing then makes new ones behind our back).
      await stopNodeProcess();
      const leaks = await removeNode(base, ns, dirs());
      expect(leaks).toEqual({ mounts: [], processes: [] });
    }
  }, 120_000);

  it('imports the demo images, runs 3 ready web replicas, and the Job reaches them by name through the Service', async () => {
    await waitFor('the demo images imported from the images dir', async () => log.includes('"images":["skiff.local/demo-web:1"]'), 30_000);
    const web = await waitFor('3 ready web pods', async () => {
      const ps = (await pods()).filter((p) => p.metadata?.labels?.app === 'web' && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'));
      return ps.length === 3 ? ps : undefined;
    }, 60_000);
    const names = new Set(web.map((p) => p.metadata!.name!));
    const hello = await waitFor('the hello Job to complete', async () => {
      const j = (await get<{ items: Array<{ kind: string; name: string; status: Record<string, unknown> }> }>('/workloads/job')).items.find((w) => w.name === 'hello');
      return (j?.status.conditions as Array<{ type: string; status: string }> | undefined)?.some((c) => c.type === 'Complete' && c.status === 'True') ? j : undefined;
    }, 60_000);
    expect(hello.status.succeeded).toBe(1);
    const helloPod = (await pods()).find((p) => p.metadata?.labels?.['job-name'] === 'hello')!;
    const out = await (await fetch(`${status}/containerLogs/default/${helloPod.metadata!.name}/hello`)).text();
    const answers = out.split('\n').filter((l) => l.startsWith('answered by: ')).map((l) => l.slice('answered by: '.length));
    for (const a of answers) expect(names.has(a)).toBe(true);
    expect(new Set(answers)).toEqual(names);
    expect(out).toMatch(/heard from 3 replicas/);
  });

  it('serves the page on the NodePort, balanced over the replicas, and follows a ConfigMap edit without restarts', async () => {
    const hostIP = (await pods()).find((p) => p.metadata?.labels?.app === 'web')!.status!.hostIP!;
    expect(hostIP).toBe('192.0.2.10');
    const seen = new Set<string>();
    for (let i = 0; i < 30; i++) {
      const r = wgetInNode(`http://${hostIP}:30080/`);
      expect(r.status, r.stderr).toBe(0);
      expect(r.stdout).toMatch(/^Hello from skiff/);
      seen.add(/served by (\S+)/.exec(r.stdout)![1]!);
    }
    expect(seen.size).toBeGreaterThanOrEqual(2);
    const described = spawnSync(process.execPath, [bin, 'describe', 'service', 'web', '--server', status], { encoding: 'utf8' });
    expect(described.stdout).toMatch(/NodePort:\s+http  30080\/TCP/);
    expect(described.stdout.match(/Endpoints:\s+(\S+)/)![1]!.split(',')).toHaveLength(3);
    const svc = spawnSync(process.execPath, [bin, 'get', 'services', '--server', status], { encoding: 'utf8' });
    // The kubernetes Service first, as the node's API keeps it (as on any cluster).
    expect(svc.stdout).toMatch(/^NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+AGE\nkubernetes\s+ClusterIP\s+10\.96\.0\.1\s+<none>\s+443\/TCP\s+\d+s\nweb\s+NodePort\s+10\.\d+\.\d+\.\d+\s+<none>\s+80:30080\/TCP\s+\d+s\n$/);
    await fs.writeFile(path.join(dirs().manifests, '.page.tmp'), 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo-page}\ndata:\n  message: "Edited while running."\n');
    await fs.rename(path.join(dirs().manifests, '.page.tmp'), path.join(dirs().manifests, '10-page.yaml'));
    await waitFor('the edited page', async () => (wgetInNode(`http://${hostIP}:30080/`).stdout.startsWith('Edited while running.') ? true : undefined), 30_000);
    const restarts = (await pods()).filter((p) => p.metadata?.labels?.app === 'web').map((p) => p.status?.containerStatuses?.[0]?.restartCount);
    expect(restarts).toEqual([0, 0, 0]);
  });

  it('rolls a template edit out with every replica Ready throughout (maxUnavailable 0)', async () => {
    const file = path.join(dirs().manifests, '20-web.yaml');
    const text = await fs.readFile(file, 'utf8');
    const before = new Set((await pods()).filter((p) => p.metadata?.labels?.app === 'web').map((p) => p.metadata!.name!));
    let minReady = 3;
    const watch = setInterval(() => {
      pods().then((ps) => {
        minReady = Math.min(minReady, ps.filter((p) => p.metadata?.labels?.app === 'web' && !p.metadata?.deletionTimestamp && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length);
      }, () => undefined);
    }, 100);
    await fs.writeFile(`${file}.tmp`, text.replace('        imagePullPolicy: IfNotPresent\n        command:', '        imagePullPolicy: IfNotPresent\n        env: [{name: EDITION, value: "2"}]\n        command:'));
    await fs.rename(`${file}.tmp`, file);
    const rolled = spawnSync(process.execPath, [bin, 'rollout', 'status', 'deployment/web', '--server', status, '--timeout', '90s'], { encoding: 'utf8' });
    clearInterval(watch);
    expect(rolled.stdout).toMatch(/successfully rolled out/);
    const now = await waitFor('three new web pods only', async () => {
      const ps = (await pods()).filter((p) => p.metadata?.labels?.app === 'web');
      return ps.length === 3 && ps.every((p) => !before.has(p.metadata!.name!)) ? ps : undefined;
    }, 30_000);
    expect(now.every((p) => p.spec?.containers[0]?.env?.some((e) => e.name === 'EDITION'))).toBe(true);
    expect(minReady).toBe(3);
  }, 120_000);

  it('keeps a one-replica Service answering through its old pod\'s grace period while the new one is not ready', async () => {
    // maxSurge 0: the old pod goes first; its preStop keeps it serving for 12 s, and the new pod
    // is not Ready for its first 4 s. Only the terminating pod can answer meanwhile.
    const solo = (edition: string) => `apiVersion: apps/v1
kind: Deployment
metadata: {name: solo}
spec:
  replicas: 1
  selector: {matchLabels: {app: solo}}
  strategy: {rollingUpdate: {maxSurge: 0, maxUnavailable: 1}}
  template:
    metadata: {labels: {app: solo}}
    spec:
      terminationGracePeriodSeconds: 20
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: IfNotPresent
        env: [{name: EDITION, value: "${edition}"}]
        command: [sh, -c, 'mkdir -p /www; echo "solo $EDITION $(hostname)" > /www/index.html; exec httpd -f -p 8080 -h /www']
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {httpGet: {path: /, port: http}, periodSeconds: 1, initialDelaySeconds: 4}
        lifecycle: {preStop: {exec: {command: [sleep, "12"]}}}
---
apiVersion: v1
kind: Service
metadata: {name: solo}
spec:
  type: NodePort
  selector: {app: solo}
  ports: [{name: http, port: 80, targetPort: http, nodePort: 30081}]
`;
    const file = path.join(dirs().manifests, '50-solo.yaml');
    const write = async (text: string) => {
      await fs.writeFile(`${file}.tmp`, text);
      await fs.rename(`${file}.tmp`, file);
    };
    await write(solo('1'));
    // Through the node port, as the demo's test reaches its Service (the namespace has no route to cluster IPs).
    const url = `http://${(await pods()).find((p) => p.metadata?.labels?.app === 'web')!.status!.hostIP!}:30081/`;
    await waitFor('solo edition 1 answering', async () => (wgetInNode(url).stdout.startsWith('solo 1 ') ? true : undefined), 60_000).catch(async (err) => {
      const r = wgetInNode(url);
      throw new Error(`${(err as Error).message}: wget ${r.status} ${r.stdout} ${r.stderr}; pods ${JSON.stringify((await pods()).filter((p) => p.metadata?.labels?.app === 'solo').map((p) => p.status))}`);
    });
    await write(solo('2'));
    const failures: string[] = [];
    let answered = 0;
    let sawOldWhileTerminating = false;
    const started = Date.now();
    while (Date.now() - started < 40_000) {
      const r = wgetInNode(url);
      if (r.status !== 0) failures.push(`${Date.now() - started} ms: ${r.stderr.trim() || `exit ${r.status}`}`);
      else {
        answered++;
        if (r.stdout.startsWith('solo 1 ') && (await pods()).some((p) => p.metadata?.labels?.app === 'solo' && p.metadata?.deletionTimestamp)) sawOldWhileTerminating = true;
        if (r.stdout.startsWith('solo 2 ')) break;
      }
      await new Promise((res) => setTimeout(res, 200));
    }
    expect(failures).toEqual([]);
    expect(sawOldWhileTerminating).toBe(true);
    expect(answered).toBeGreaterThan(5);
    await fs.rm(file);
    await waitFor('the solo pods gone', async () => ((await pods()).some((p) => p.metadata?.labels?.app === 'solo') ? undefined : true), 60_000);
  }, 150_000);

  it('survives a kill -9 of the node: the next one adopts every pod and restarts none', async () => {
    const before = (await pods()).filter((p) => p.metadata?.labels?.app === 'web').map((p) => `${p.metadata!.name} ${p.status?.containerStatuses?.[0]?.containerID}`).sort();
    const restarts = async () => Object.fromEntries((await pods()).map((p) => [p.metadata!.name!, (p.status?.containerStatuses ?? []).map((c) => c.restartCount)]));
    const restartsBefore = await restarts();
    // The Service keeps its three endpoints throughout: the rules stay while the node is down,
    // and the next node neither drops adopted pods from Services nor waits for their probes again.
    const sepCount = () => {
      const rules = spawnSync('nsenter', [`--net=${ns.path}`, 'iptables-save', '-t', 'nat'], { encoding: 'utf8' }).stdout.split('\n');
      const svc = rules.find((l) => l.includes('default/web:http cluster IP') && l.startsWith('-A KUBE-SERVICES'))?.match(/-j (KUBE-SVC-\S+)/)?.[1];
      return svc ? rules.filter((l) => l.startsWith(`-A ${svc} `) && l.includes('-j KUBE-SEP-')).length : 0;
    };
    // The rollout before ends once the API holds three new pods; the proxy drops the last old pod's
    // endpoint at its next sync, a moment later.
    let minEndpoints = await waitFor('the Service at its three new endpoints', async () => (sepCount() === 3 ? 3 : undefined), 10_000);
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        minEndpoints = Math.min(minEndpoints, sepCount());
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    const exited = new Promise((r) => child!.once('exit', r));
    child!.kill('SIGKILL');
    await exited;
    const firstLog = log;
    const savedAtKill = await fs.readFile(path.join(dirs().kubelet, 'workloads.json'), 'utf8').catch((e) => String(e));
    expect(processesMentioning(path.join(base, 'state')).filter((l) => l.includes('conmon')).length).toBeGreaterThanOrEqual(3);
    await startNodeProcess();
    const after = await waitFor('the same web pods, running', async () => {
      const ps = (await pods()).filter((p) => p.metadata?.labels?.app === 'web' && p.status?.containerStatuses?.[0]?.state?.running);
      return ps.length === 3 ? ps.map((p) => `${p.metadata!.name} ${p.status?.containerStatuses?.[0]?.containerID}`).sort() : undefined;
    }, 30_000);
    expect(after).toEqual(before);
    await new Promise((r) => setTimeout(r, 3000));
    sampling = false;
    await sampler;
    expect(minEndpoints).toBe(3);
    const restartsAfter = await restarts();
    if (JSON.stringify(restartsAfter) !== JSON.stringify(restartsBefore)) {
      // Say what the restarted node did: its log and the controllers' saved memory.
      const saved = await fs.readFile(path.join(dirs().kubelet, 'workloads.json'), 'utf8').catch((e) => String(e));
      console.error(`the first node's log (no rpc lines):\n${firstLog.split('\n').filter((l) => !l.includes('"msg":"rpc"')).join('\n')}\nworkloads.json at the kill:\n${savedAtKill}\nnode log after the restart:\n${log}\nworkloads.json:\n${saved}`);
    }
    expect(restartsAfter).toEqual(restartsBefore);
    expect((await pods()).find((p) => p.metadata?.labels?.['job-name'] === 'hello')?.status?.phase).toBe('Succeeded');
  });
});
