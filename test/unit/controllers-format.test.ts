import { describe, expect, it } from 'vitest';
import { ControllerDriver } from '../../src/controllers/driver.js';
import { formatCronJobs, formatDaemonSets, formatDeployments, formatJobs, humanDuration } from '../../src/cli/workload-format.js';
import type { WorkloadStatus } from '../../src/controllers/types.js';
import { deployment, Sim, stored, podTemplate, T0 } from '../helpers/controllers-sim.js';

describe('kubectl durations', () => {
  const cases: Array<[number, string]> = [
    [-5_000, '<invalid>'],
    [0, '0s'],
    [45_000, '45s'],
    [119_000, '119s'],
    [125_000, '2m5s'],
    [240_000, '4m'],
    [50 * 60_000, '50m'],
    [(5 * 60 + 3) * 60_000, '5h3m'],
    [30 * 3_600_000, '30h'],
    [(3 * 24 + 4) * 3_600_000, '3d4h'],
    [300 * 86_400_000, '300d'],
    [(3 * 365 + 100) * 86_400_000, '3y100d'],
    [10 * 365 * 86_400_000, '10y'],
  ];
  it.each(cases)('%d ms → %s', (ms, want) => expect(humanDuration(ms)).toBe(want));
});

describe('skiff get tables', () => {
  it('deployments, daemonsets, jobs and cronjobs from a real reconcile', () => {
    const sim = new Sim();
    const t = podTemplate({ app: 'ds' });
    (t.spec as Record<string, unknown>).nodeSelector = { 'kubernetes.io/os': 'linux' };
    sim.workloads = [
      deployment('web', { replicas: 3 }),
      stored('DaemonSet', 'ds', { spec: { selector: { matchLabels: { app: 'ds' } }, template: t } }),
      stored('Job', 'calc', { spec: { completions: 2, template: podTemplate({}, 'x', 'Never') } }),
      stored('CronJob', 'tick', { spec: { schedule: '*/5 * * * *', jobTemplate: { spec: { template: podTemplate({}, 'x', 'Never') } } } }),
    ];
    sim.step();
    for (const n of sim.names('web').slice(0, 2)) sim.setReady(n);
    sim.setReady(sim.names('ds')[0]!);
    sim.advance(5 * 60_000).step();
    const now = sim.now + 30_000;
    expect(formatDeployments(sim.last.statuses, { now })).toBe(
      ['NAME   READY   UP-TO-DATE   AVAILABLE   AGE', 'web    2/3     3            2           5m30s', ''].join('\n'),
    );
    expect(formatDaemonSets(sim.last.statuses, { now })).toBe(
      [
        'NAME   DESIRED   CURRENT   READY   UP-TO-DATE   AVAILABLE   NODE SELECTOR            AGE',
        'ds     1         1         1       1            1           kubernetes.io/os=linux   5m30s',
        '',
      ].join('\n'),
    );
    const cjJob = `tick-${Math.floor((T0 + 5 * 60_000) / 60_000)}`;
    expect(formatJobs(sim.last.statuses, { now })).toBe(
      [
        'NAME            STATUS    COMPLETIONS   DURATION   AGE',
        'calc            Running   0/2           5m30s      5m30s',
        `${cjJob}   Running   0/1           30s        30s`,
        '',
      ].join('\n'),
    );
    expect(formatCronJobs(sim.last.statuses, { now, allNamespaces: true })).toBe(
      ['NAMESPACE   NAME   SCHEDULE      SUSPEND   ACTIVE   LAST SCHEDULE   AGE', 'default     tick   */5 * * * *   False     1        30s             5m30s', ''].join(
        '\n',
      ),
    );
  });

  it('a deleted (ttl) Job is hidden, and an empty list says so', () => {
    const base: WorkloadStatus = { kind: 'Job', namespace: 'default', name: 'old', status: {}, spec: {}, problems: [], createdAt: 0, deleted: true };
    expect(formatJobs([base], { now: 0 })).toBe('No resources found\n');
    expect(formatJobs([{ ...base, deleted: undefined, status: { succeeded: 1, startTime: '2026-01-01T00:00:00Z', completionTime: '2026-01-01T00:00:07Z', conditions: [{ type: 'Complete', status: 'True' }] }, spec: { parallelism: 3 } }], { now: 60_000 })).toMatch(
      /old    Complete   1\/1 of 3      7s         60s/,
    );
  });
});

describe('ControllerDriver', () => {
  it('keeps the memory between runs and calls back when a timed thing is due', () => {
    let now = T0;
    const timers: Array<{ fn: () => void; ms: number; cancelled: boolean }> = [];
    let requeues = 0;
    const d = new ControllerDriver({
      nodeName: 'n',
      now: () => now,
      random: () => 0.5,
      onRequeue: () => requeues++,
      setTimer: (fn, ms) => {
        const t = { fn, ms, cancelled: false };
        timers.push(t);
        return { cancel: () => (t.cancelled = true) };
      },
    });
    const job = stored('Job', 'j', { spec: { activeDeadlineSeconds: 30, template: podTemplate({}, 'x', 'Never') } });
    const out = d.run([job], []);
    expect(out.pods).toHaveLength(1);
    expect(timers.at(-1)!.ms).toBe(30_000);
    now += 10_000;
    const again = d.run([job], out.pods.map((p) => ({ ...p, status: { phase: 'Running' } })));
    expect(again.pods.map((p) => p.metadata!.name)).toEqual(out.pods.map((p) => p.metadata!.name));
    expect(timers.at(-2)!.cancelled).toBe(true);
    expect(timers.at(-1)!.ms).toBe(20_000);
    timers.at(-1)!.fn();
    expect(requeues).toBe(1);
    // A restarted agent hands the memory back: the Job's start time survives.
    const d2 = new ControllerDriver({ nodeName: 'n', now: () => now, state: JSON.parse(JSON.stringify(d.state)), setTimer: () => ({ cancel() {} }) });
    now += 20_000;
    const after = d2.run([job], again.pods.map((p) => ({ ...p, status: { phase: 'Running' } })));
    expect(after.pods).toEqual([]);
    expect(after.statuses[0]!.status.conditions).toEqual([expect.objectContaining({ reason: 'DeadlineExceeded' })]);
    d.stop();
    d2.stop();
    expect(new ControllerDriver({ nodeName: 'n', state: 'garbage' }).state.version).toBe(1);
  });
});

describe('skiff describe', () => {
  it('shows a Deployment with its replicas, strategy and conditions', async () => {
    const { describeWorkload } = await import('../../src/cli/workload-format.js');
    const sim = new Sim();
    sim.workloads = [deployment('web', { replicas: 2, strategy: { rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } })];
    sim.step();
    for (const n of sim.names('web')) sim.setReady(n);
    sim.step();
    const text = describeWorkload(sim.status('Deployment', 'web'), { now: sim.now + 60_000 });
    expect(text).toContain('Name:                   web\n');
    expect(text).toContain('Selector:               app=web\n');
    expect(text).toContain('Replicas:               2 desired | 2 updated | 2 total | 2 available | 0 unavailable\n');
    expect(text).toContain('RollingUpdateStrategy:  0 max unavailable, 1 max surge\n');
    expect(text).toContain('    Image:  web:1\n');
    expect(text).toMatch(/Type +Status +Reason\n +---- +------ +------\n +Available +True +MinimumReplicasAvailable\n +Progressing +True +NewReplicaSetAvailable/);
  });

  it('shows a Job\'s pod counts and an invalid object\'s problems', async () => {
    const { describeWorkload } = await import('../../src/cli/workload-format.js');
    const sim = new Sim();
    sim.workloads = [stored('Job', 'j', { spec: { completions: 2, template: podTemplate({}, 'x', 'Never') } }), stored('CronJob', 'c', { spec: { schedule: 'nope' } })];
    sim.step();
    const job = describeWorkload(sim.status('Job', 'j'), { now: sim.now });
    expect(job).toMatch(/\nPods Statuses: +1 Active \(0 Ready\) \/ 0 Succeeded \/ 0 Failed\n/);
    expect(job).toMatch(/\nCompletion Mode: +NonIndexed\n/);
    expect(job).not.toContain('Completed Indexes');
    const cj = describeWorkload(sim.status('CronJob', 'c'), { now: sim.now });
    expect(cj).toMatch(/Problems:\n  spec.jobTemplate: required/);
  });
});
