/**
 * Workloads on one node: Deployments (replicas, rolling updates with
 * readiness, scaling by editing the file), a DaemonSet and a Job, reconciled
 * by the agent's controllers over a real runtime and seen through the status
 * API and the real `skiff get` / `skiff rollout status` commands.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

interface Workload {
  kind: string;
  namespace: string;
  name: string;
  status: Record<string, unknown>;
}

function cli(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [path.join(repoRoot, 'bin', 'skiff.js'), ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('close', (code) => resolve({ code, out, err }));
  });
}

const deployment = (image: string, replicas: number, version: string) => `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: ${replicas}
  selector:
    matchLabels: {app: web}
  strategy:
    rollingUpdate: {maxSurge: 1, maxUnavailable: 0}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: ${image}
        command: [sh, -c, "touch /tmp/ready; exec sleep 3600"]
        env: [{name: VERSION, value: "${version}"}]
        readinessProbe:
          exec: {command: [test, -f, /tmp/ready]}
          periodSeconds: 1
`;

describe.skipIf(!isRoot)('kubelet-lite: Deployments, DaemonSets and Jobs', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-workloads');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const pods = async (selector: (p: Pod) => boolean) => ((await node.get<{ items: Pod[] }>('/pods')).body.items ?? []).filter(selector);
  const webPods = (p: Pod) => p.metadata?.labels?.app === 'web' && !p.metadata?.deletionTimestamp;
  const workload = async (kind: string, name: string) => ((await node.get<{ items: Workload[] }>('/workloads')).body.items ?? []).find((w) => w.kind === kind && w.name === name);
  const jobComplete = (name: string, what: string) =>
    waitFor(what, async () => {
      const w = await workload('Job', name);
      return (w?.status.conditions as Array<{ type: string; status: string }> | undefined)?.some((c) => c.type === 'Complete' && c.status === 'True') ? w : undefined;
    }, 60_000);

  it('runs a Deployment\'s replicas, named <name>-<hash>-<suffix>, and reports them ready', async () => {
    await node.write('web.yaml', deployment(node.image, 3, 'one'));
    const running = await waitFor('3 ready web pods', async () => {
      const ps = await pods(webPods);
      return ps.length === 3 && ps.every(ready) ? ps : undefined;
    }, 60_000);
    for (const p of running) expect(p.metadata?.name).toMatch(/^web-[0-9a-z]+-[0-9a-z]{5}$/);
    const d = await waitFor('the Deployment status', async () => {
      const w = await workload('Deployment', 'web');
      return w?.status.readyReplicas === 3 ? w : undefined;
    });
    expect(d.status).toMatchObject({ replicas: 3, updatedReplicas: 3, readyReplicas: 3, availableReplicas: 3 });
    const table = await cli(['get', 'deployments', '--server', node.status]);
    expect(table.out).toMatch(/^NAME\s+READY\s+UP-TO-DATE\s+AVAILABLE\s+AGE\nweb\s+3\/3\s+3\s+3\s+/);
  });

  it('rolls a template change out one surge pod at a time, never below 3 ready, and `skiff rollout status` waits for it', async () => {
    const before = new Set((await pods(webPods)).map((p) => p.metadata!.name!));
    await node.write('web.yaml', deployment(node.image, 3, 'two'));
    let minReady = 3;
    let maxPods = 3;
    const watcher = setInterval(async () => {
      const ps = await pods((p) => p.metadata?.labels?.app === 'web').catch(() => undefined);
      if (!ps) return;
      minReady = Math.min(minReady, ps.filter((p) => ready(p) && !p.metadata?.deletionTimestamp).length);
      maxPods = Math.max(maxPods, ps.filter((p) => !p.metadata?.deletionTimestamp).length);
    }, 100);
    const rolled = await cli(['rollout', 'status', 'deployment/web', '--server', node.status, '--timeout', '90s']);
    clearInterval(watcher);
    expect(rolled.err).toBe('');
    expect(rolled.code).toBe(0);
    expect(rolled.out).toMatch(/deployment "web" successfully rolled out\n$/);
    const after = await waitFor('only new pods left', async () => {
      const ps = await pods(webPods);
      return ps.length === 3 && ps.every((p) => !before.has(p.metadata!.name!)) ? ps : undefined;
    }, 30_000);
    expect(after.every((p) => p.spec?.containers[0]?.env?.[0]?.value === 'two')).toBe(true);
    expect(minReady).toBeGreaterThanOrEqual(3);
    expect(maxPods).toBeLessThanOrEqual(4);
  }, 120_000);

  it('scales down when the file says fewer replicas', async () => {
    await node.write('web.yaml', deployment(node.image, 1, 'two'));
    await waitFor('one web pod', async () => ((await pods((p) => p.metadata?.labels?.app === 'web')).length === 1 ? true : undefined), 30_000);
    expect((await workload('Deployment', 'web'))?.status.replicas).toBe(1);
  });

  it('runs one DaemonSet pod on the node and a Job to its completions', async () => {
    await node.write('ds.yaml', `apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      terminationGracePeriodSeconds: 1
      containers: [{name: a, image: ${node.image}, command: [sleep, "3600"]}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: count}
spec:
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: ${node.image}, command: [sh, -c, "echo done"]}]
`);
    await waitFor('the DaemonSet pod ready', async () => {
      const ps = await pods((p) => p.metadata?.labels?.app === 'agent');
      return ps.length === 1 && ready(ps[0]!) ? true : undefined;
    }, 30_000);
    const job = await jobComplete('count', 'the Job complete');
    expect(job.status.succeeded).toBe(3);
    const jobPods = await pods((p) => p.metadata?.labels?.['job-name'] === 'count');
    expect(jobPods.length).toBe(3);
    expect(jobPods.every((p) => p.status?.phase === 'Succeeded')).toBe(true);
    const all = await cli(['get', 'all', '--server', node.status]);
    expect(all.out).toMatch(/count\s+Complete\s+3\/3/);
    await node.remove('ds.yaml');
    await waitFor('the DaemonSet and Job pods gone', async () => ((await pods((p) => p.metadata?.labels?.app === 'agent' || !!p.metadata?.labels?.['job-name'])).length === 0 ? true : undefined), 30_000);
  });

  it('runs an Indexed Job: each index once, with its index in the env, the hostname and the status', async () => {
    await node.write('indexed.yaml', `apiVersion: batch/v1
kind: Job
metadata: {name: shard}
spec:
  completionMode: Indexed
  completions: 3
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: c
        image: ${node.image}
        command: [sh, -c, 'echo "index=$JOB_COMPLETION_INDEX host=$(hostname)" > /dev/termination-log']
`);
    const job = await jobComplete('shard', 'the Indexed Job complete');
    expect(job.status).toMatchObject({ succeeded: 3, failed: 0, completedIndexes: '0-2' });
    const said = (await pods((p) => p.metadata?.labels?.['job-name'] === 'shard')).map((p) => ({
      name: p.metadata!.name!,
      index: p.metadata!.annotations!['batch.kubernetes.io/job-completion-index'],
      message: p.status?.containerStatuses?.[0]?.state?.terminated?.message?.trim(),
    }));
    expect(said.map((s) => s.index).sort()).toEqual(['0', '1', '2']);
    for (const s of said) {
      expect(s.name).toMatch(new RegExp(`^shard-${s.index}-[0-9a-z]{5}$`));
      expect(s.message).toBe(`index=${s.index} host=shard-${s.index}`);
    }
    const described = await cli(['describe', 'job/shard', '--server', node.status]);
    expect(described.out).toMatch(/Completion Mode: +Indexed\n/);
    expect(described.out).toMatch(/Completed Indexes: +0-2\n/);
    await node.remove('indexed.yaml');
    await waitFor('the Indexed Job\'s pods gone', async () => ((await pods((p) => p.metadata?.labels?.['job-name'] === 'shard')).length === 0 ? true : undefined), 30_000);
  });

  it('applies a Job\'s podFailurePolicy to real exit codes: FailJob ends it, Ignore retries without counting', async () => {
    const policyJob = (name: string, code: number) => `apiVersion: batch/v1
kind: Job
metadata: {name: ${name}}
spec:
  backoffLimit: 0
  podFailurePolicy:
    rules:
    - {action: FailJob, onExitCodes: {containerName: c, operator: In, values: [42]}}
    - {action: Ignore, onExitCodes: {operator: In, values: [3]}}
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: ${node.image}, command: [sh, -c, "exit ${code}"]}]
`;
    await node.write('policy.yaml', `${policyJob('fatal', 42)}---\n${policyJob('shrug', 3)}`);
    const fatal = await waitFor('the FailJob rule to fail the Job', async () => {
      const w = await workload('Job', 'fatal');
      return (w?.status.conditions as Array<{ type: string; reason: string; message: string }> | undefined)?.find((c) => c.type === 'Failed');
    }, 60_000);
    expect(fatal.reason).toBe('PodFailurePolicy');
    expect(fatal.message).toMatch(/^container c of pod default\/fatal-[0-9a-z]{5} exited with code 42, which matches podFailurePolicy rule 0 \(FailJob\)$/);
    // backoffLimit 0, yet an ignored failure is replaced (after the 10 s back-off) and not counted.
    const shrug = await waitFor('two ignored failures', async () => {
      const failed = (await pods((p) => p.metadata?.labels?.['job-name'] === 'shrug')).filter((p) => p.status?.phase === 'Failed');
      return failed.length >= 2 ? failed : undefined;
    }, 60_000);
    expect(shrug.every((p) => p.status?.containerStatuses?.[0]?.state?.terminated?.exitCode === 3)).toBe(true);
    const w = await workload('Job', 'shrug');
    expect(w?.status.failed).toBe(0);
    expect(w?.status.conditions ?? []).toEqual([]);
    await node.remove('policy.yaml');
    await waitFor('the policy Jobs\' pods gone', async () => ((await pods((p) => ['fatal', 'shrug'].includes(p.metadata?.labels?.['job-name'] ?? ''))).length === 0 ? true : undefined), 30_000);
  });

  it('keeps a finished Job finished across a kill -9, while a slow manifest holds up the next agent\'s first load', async () => {
    await node.write('z-once.yaml', `apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: ${node.image}, command: [sh, -c, "echo once"]}]
`);
    await jobComplete('once', 'the Job complete');
    const onceName = (p: Pod) => p.metadata?.labels?.['job-name'] === 'once';
    const before = (await pods(onceName)).map((p) => p.metadata!.name!);
    expect(before).toHaveLength(1);
    // Read in name order: a small file first (its change starts the adopted pods' syncs), then
    // one the parser takes seconds over, then the Job's. The adopted Job pod syncs meanwhile.
    await node.write('a-small.yaml', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: small}\ndata: {a: b}\n');
    const keys: string[] = [];
    for (let i = 0; keys.length * 12 < 2_000_000; i++) keys.push(`  k${i}: "v"`);
    await node.write('y-slow.yaml', `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: slow}\ndata:\n${keys.join('\n')}\n`);
    try {
      await node.restartAgent('SIGKILL');
      await jobComplete('once', 'the Job seen complete by the new agent');
      // Still the same one pod, finished: not removed, and no second run.
      await new Promise((r) => setTimeout(r, 2000));
      const after = await pods(onceName);
      expect(after.map((p) => p.metadata!.name!)).toEqual(before);
      expect(after[0]!.status?.phase).toBe('Succeeded');
    } finally {
      for (const f of ['z-once.yaml', 'y-slow.yaml', 'a-small.yaml']) await node.remove(f);
    }
    await waitFor('the Job pod gone', async () => ((await pods(onceName)).length === 0 ? true : undefined), 30_000);
  });

  it('keeps a finished Job finished while its file is rewritten in place (`gen > job.yaml` truncates it first)', async () => {
    const text = `apiVersion: batch/v1
kind: Job
metadata: {name: rewritten}
spec:
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: ${node.image}, command: [sh, -c, "echo once"]}]
`;
    await node.write('rewritten.yaml', text);
    const complete = async () => {
      const w = await workload('Job', 'rewritten');
      return (w?.status.conditions as Array<{ type: string; status: string }> | undefined)?.some((c) => c.type === 'Complete' && c.status === 'True') ? w : undefined;
    };
    await waitFor('the Job complete', complete, 60_000);
    const jobPods = (p: Pod) => p.metadata?.labels?.['job-name'] === 'rewritten';
    const before = (await pods(jobPods)).map((p) => p.metadata!.name!);
    expect(before).toHaveLength(1);
    try {
      // Truncated, then written by a generator that takes a moment: the agent sees the empty file.
      const fd = await fs.open(path.join(node.manifests, 'rewritten.yaml'), 'w');
      await new Promise((r) => setTimeout(r, 1000));
      expect(await workload('Job', 'rewritten')).toBeDefined();
      await fd.writeFile(text);
      await fd.close();
      await new Promise((r) => setTimeout(r, 2000));
      await waitFor('the Job still complete', complete, 10_000);
      // The same one pod, finished: not removed, and no second run.
      const after = await pods(jobPods);
      expect(after.map((p) => p.metadata!.name!)).toEqual(before);
      expect(after[0]!.status?.phase).toBe('Succeeded');
    } finally {
      await node.remove('rewritten.yaml');
    }
    await waitFor('the Job pod gone', async () => ((await pods(jobPods)).length === 0 ? true : undefined), 30_000);
  });
});
