/**
 * The eviction manager on a real `skiff node`, measured from the machine's
 * own root memory cgroup: a hard memory threshold set just below what the
 * machine has free (measured at test time), a BestEffort pod that grows
 * past it is evicted while a Guaranteed pod beside it keeps running,
 * MemoryPressure (and its taint) comes and goes; a pod filling its
 * emptyDir past sizeLimit is evicted and its ReplicaSet replaces it.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Event, Node, Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { formatBytes } from '../../src/kubelet-lite/eviction.js';
import { isRoot } from '../helpers/env.js';
import { rssBytes } from '../helpers/loop-fs.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const Mi = 1024 * 1024;

/** memory.available as the eviction manager computes it: MemTotal less the root cgroup's working set. */
async function memoryAvailable(): Promise<number> {
  const meminfo = await fs.readFile('/proc/meminfo', 'utf8');
  const total = Number(/^MemTotal:\s+(\d+)/m.exec(meminfo)![1]) * 1024;
  const usage = Number((await fs.readFile('/sys/fs/cgroup/memory/memory.usage_in_bytes', 'utf8')).trim());
  const inactive = Number(/^total_inactive_file (\d+)$/m.exec(await fs.readFile('/sys/fs/cgroup/memory/memory.stat', 'utf8'))?.[1] ?? 0);
  return total - (usage - inactive);
}

const GUARANTEED = `
apiVersion: v1
kind: Pod
metadata: {name: steady}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
    resources:
      limits: {cpu: 100m, memory: 64Mi}
`;

/** Grows by 50 MiB a second, to 800 MiB at most (each variable a copy of the chunk), then sleeps. */
const HOG = `
apiVersion: v1
kind: Pod
metadata: {name: hog}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers:
  - name: hog
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'chunk=$(yes xxxxxxxxxxxxxxx | head -c 52428800); i=0; while [ $i -lt 16 ]; do eval "v$i=\\$chunk"; i=$((i+1)); echo grown $i; sleep 1; done; trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
`;

const FILLER = `
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: filler}
spec:
  replicas: 1
  selector: {matchLabels: {app: filler}}
  template:
    metadata: {labels: {app: filler}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'dd if=/dev/zero of=/cache/fill bs=1048576 count=20; trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
        volumeMounts: [{name: cache, mountPath: /cache}]
        resources:
          requests: {cpu: 10m, memory: 16Mi}
      volumes:
      - name: cache
        emptyDir: {sizeLimit: 10Mi}
`;

describe.skipIf(!isRoot)('eviction on a real skiff node', () => {
  const node = new SkiffNode([], { SKIFF_EVICTION_MONITOR_MS: '1000' });
  useSkiffNode(node);
  const pod = (name: string) => node.getJson<Pod>(['pod', name]);
  const nodeObj = () => node.getJson<Node>(['node', node.nodeName]);
  const condition = (n: Node, type: string) => n.status?.conditions?.find((c) => c.type === type);

  it('serves metrics.k8s.io from the node\'s stats: kubectl top nodes and top pods --containers (1.35 and 1.27)', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: GUARANTEED.replace('name: steady', 'name: topme') });
    await waitFor('topme running', async () => (await pod('topme')).status?.phase === 'Running', 60_000);
    for (const bin of [undefined, KUBECTL_127]) {
      let out = '';
      await waitFor('kubectl top nodes', async () => {
        const r = await node.kubectl(['top', 'nodes'], { bin });
        out = r.stdout;
        return r.status === 0;
      }, 30_000);
      const row = out.split('\n').find((l) => l.startsWith(node.nodeName))!.trim().split(/\s+/);
      // NAME CPU(cores) CPU% MEMORY(bytes) MEMORY%
      expect(row[1]).toMatch(/^\d+m$/);
      expect(row[3]).toMatch(/^\d+Mi$/);
      expect(Number(row[3]!.replace('Mi', ''))).toBeGreaterThan(50);
      await waitFor('kubectl top pods --containers', async () => {
        const r = await node.kubectl(['top', 'pods', '--containers'], { bin });
        out = r.stdout;
        return r.status === 0 && /^topme\s+c\s+\d+m\s+\d+Mi/m.test(out);
      }, 60_000);
    }
    const list = JSON.parse(await node.kubectlOk(['get', '--raw', '/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/topme'])) as { kind: string; containers: Array<{ name: string; usage: { cpu: string; memory: string } }> };
    expect(list.kind).toBe('PodMetrics');
    expect(list.containers[0]!.usage.memory).toMatch(/^\d+(Ki)?$/);
    const missing = await node.kubectl(['get', '--raw', '/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/nope']);
    expect(missing.stderr).toContain('NotFound');
    await node.kubectlOk(['delete', 'pod', 'topme', '--wait=false']);
  }, 240_000);

  it('reports a container the kernel killed at its memory limit as the kubelet does: OOMKilled, 137, in lastState after the restart', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: `
apiVersion: v1
kind: Pod
metadata: {name: oom}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'x=$(yes xxxxxxxxxxxxxxx | head -c 104857600); sleep 3600']
    resources:
      limits: {memory: 32Mi}
`,
    });
    let p: Pod | undefined;
    await waitFor('oom restarted once', async () => {
      p = await pod('oom');
      return (p.status?.containerStatuses?.[0]?.restartCount ?? 0) >= 1 && !!p.status?.containerStatuses?.[0]?.lastState?.terminated;
    }, 90_000);
    expect(p!.status!.containerStatuses![0]!.lastState!.terminated).toMatchObject({ reason: 'OOMKilled', exitCode: 137 });
    // A container's own limit is not the node's pressure: nothing was evicted.
    expect(p!.status!.reason).toBeUndefined();
    await node.kubectlOk(['delete', 'pod', 'oom', '--wait=false']);
  }, 120_000);

  it('evicts a pod whose emptyDir passes its sizeLimit, and its ReplicaSet replaces it', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: FILLER });
    let first: Pod | undefined;
    await waitFor('a filler pod evicted', async () => {
      const pods = (await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=filler'])).items;
      first = pods.find((p) => p.status?.reason === 'Evicted');
      return !!first;
    }, 90_000);
    expect(first!.status!.phase).toBe('Failed');
    expect(first!.status!.message).toBe('Usage of EmptyDir volume "cache" exceeds the limit "10Mi". ');
    expect(first!.status!.conditions?.find((c) => c.type === 'DisruptionTarget')).toMatchObject({ status: 'True', reason: 'TerminationByKubelet' });
    expect(first!.status!.containerStatuses?.[0]?.state?.terminated).toBeDefined();
    // Its emptyDir's 20 MiB are given back while the evicted pod is still shown.
    const cache = path.join(node.dirs.kubelet, 'pods', first!.metadata!.uid!, 'volumes', 'kubernetes.io~empty-dir', 'cache');
    await waitFor('the evicted pod\'s emptyDir emptied', async () => (await fs.readdir(cache)).length === 0, 30_000);
    const events = await node.kubectlOk(['get', 'events', '--field-selector', `involvedObject.name=${first!.metadata!.name},reason=Evicted`, '-o', 'jsonpath={.items[*].message}']);
    expect(events).toContain('Usage of EmptyDir volume "cache" exceeds the limit "10Mi".');
    await waitFor('a replacement filler pod', async () => {
      const pods = (await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=filler'])).items;
      return pods.some((p) => p.metadata!.name !== first!.metadata!.name);
    }, 60_000);
    await node.kubectlOk(['delete', 'replicaset', 'filler', '--wait=false']);
    await node.kubectlOk(['delete', 'pods', '-l', 'app=filler', '--wait=false']);
  }, 240_000);

  it('evicts a BestEffort pod growing past memory.available while a Guaranteed pod keeps running; MemoryPressure comes and goes', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: GUARANTEED });
    await waitFor('steady running', async () => (await pod('steady')).status?.phase === 'Running', 60_000);
    const steadyStart = (await pod('steady')).status!.containerStatuses![0]!.state!.running!.startedAt;
    let n = await nodeObj();
    expect(condition(n, 'MemoryPressure')).toMatchObject({ status: 'False', reason: 'KubeletHasSufficientMemory' });

    // The threshold: 500 MiB under what the machine has now, so the hog's 800 MiB crosses it (other
    // tests on the machine may use some of those 500 MiB meanwhile: the hog then goes sooner).
    // A restart first: the node's second read of its own files makes their page cache active, which
    // counts in the working set; measured before it, the restart alone would eat into the margin.
    await node.stopProcess();
    await node.start();
    await waitFor('the node reporting again', async () => condition(await nodeObj(), 'Ready')?.status === 'True', 30_000);
    const available = await memoryAvailable();
    const threshold = Math.floor((available - 500 * Mi) / Mi);
    expect(threshold).toBeGreaterThan(500);
    await node.stopProcess();
    node.extraArgs.splice(0, node.extraArgs.length, '--eviction-hard', `memory.available<${threshold}Mi`, '--eviction-pressure-transition-period', '5s');
    await node.start();
    n = await nodeObj();
    // Allocatable keeps the threshold back.
    await waitFor('allocatable less the threshold', async () => {
      n = await nodeObj();
      const cap = Number(String(n.status!.capacity!.memory).replace('Ki', '')) * 1024;
      const alloc = Number(String(n.status!.allocatable!.memory).replace('Ki', '')) * 1024;
      return Math.abs(cap - alloc - threshold * Mi) < 2 * 1024;
    }, 30_000);

    // The agent's resident memory before the pressure, and the most it reaches while a pod eats the machine's memory.
    await node.kubectlOk(['get', 'node', node.nodeName]);
    const baseline = await rssBytes(node.pid!);
    let peak = baseline;
    const sampleRss = async () => {
      const pid = node.pid;
      if (pid) peak = Math.max(peak, await rssBytes(pid));
    };

    await node.kubectlOk(['apply', '-f', '-'], { input: HOG });
    let sawPressure = false;
    let sawTaint = false;
    let hog: Pod | undefined;
    await waitFor('the hog evicted', async () => {
      await sampleRss();
      n = await nodeObj();
      if (condition(n, 'MemoryPressure')?.status === 'True') {
        sawPressure = true;
        expect(condition(n, 'MemoryPressure')).toMatchObject({ reason: 'KubeletHasInsufficientMemory', message: 'kubelet has insufficient memory available' });
      }
      if ((n.spec?.taints ?? []).some((t) => t.key === 'node.kubernetes.io/memory-pressure' && t.effect === 'NoSchedule')) sawTaint = true;
      hog = await pod('hog');
      return hog.status?.reason === 'Evicted';
    }, 120_000);
    expect(hog!.status!.phase).toBe('Failed');
    expect(hog!.status!.message).toMatch(new RegExp(`^The node was low on resource: memory\\. Threshold quantity: ${formatBytes(threshold * Mi)}, available: \\d+(Ki|Mi)?\\. Container hog was using \\d+(Ki|Mi)?, request is 0, has larger consumption of memory\\. $`));
    // Evicted pods are not restarted, whatever their restartPolicy.
    expect(hog!.status!.containerStatuses![0]!.state!.terminated).toBeDefined();

    // The pressure was seen on the Node, and held at least the 5 s transition period.
    n = await nodeObj();
    expect(sawPressure || condition(n, 'MemoryPressure')?.status === 'True').toBe(true);

    await waitFor('MemoryPressure false again, the taint gone', async () => {
      await sampleRss();
      n = await nodeObj();
      return condition(n, 'MemoryPressure')?.status === 'False' && !(n.spec?.taints ?? []).some((t) => t.key === 'node.kubernetes.io/memory-pressure');
    }, 90_000);
    expect(condition(n, 'MemoryPressure')).toMatchObject({ reason: 'KubeletHasSufficientMemory' });
    expect(sawTaint).toBe(true);

    // The Guaranteed pod ran throughout, never restarted.
    const steady = await pod('steady');
    if (steady.status!.phase !== 'Running') console.log(node.log.split('\n').filter((l) => /evict|reclaim|condition observed/.test(l)).join('\n'));
    expect(steady.status).toMatchObject({ phase: 'Running' });
    expect(steady.status!.containerStatuses![0]!.restartCount).toBe(0);
    expect(steady.status!.containerStatuses![0]!.state!.running!.startedAt).toBe(steadyStart);
    const hogAgain = await pod('hog');
    expect(hogAgain.status!.containerStatuses![0]!.restartCount).toBe(0);

    // The Node's events: the kubelet's Warning when the threshold was met, and the condition's transitions.
    const events = (await node.getJson<{ items: Event[] }>(['events', '--field-selector', `involvedObject.kind=Node,involvedObject.name=${node.nodeName}`])).items.map((e) => [e.type, e.reason, e.message]);
    expect(events).toContainEqual(['Warning', 'EvictionThresholdMet', 'Attempting to reclaim memory']);
    expect(events).toContainEqual(['Normal', 'NodeHasInsufficientMemory', `Node ${node.nodeName} status is now: NodeHasInsufficientMemory`]);
    expect(events).toContainEqual(['Normal', 'NodeHasSufficientMemory', `Node ${node.nodeName} status is now: NodeHasSufficientMemory`]);

    // Bounded: the margin is several times what a pass of the eviction manager and an eviction take (transient work,
    // not growth); only a leak or an unbounded buffer crosses it. The absolute bound is the 110 MiB idle target plus it.
    console.log(`skiff node RSS: baseline ${(baseline / Mi).toFixed(1)} MiB, peak ${(peak / Mi).toFixed(1)} MiB under memory pressure`);
    expect(peak).toBeLessThanOrEqual(baseline + 64 * Mi);
    expect(peak).toBeLessThanOrEqual((110 + 64) * Mi);
    await node.kubectlOk(['delete', 'pod', 'hog', 'steady', '--wait=false']);
  }, 400_000);
});
