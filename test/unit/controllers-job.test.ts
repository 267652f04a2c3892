import { describe, expect, it } from 'vitest';
import { podTemplate, Sim, stored } from '../helpers/controllers-sim.js';
import { CREATE_BURST } from '../../src/controllers/common.js';

function job(name: string, spec: Record<string, unknown>, restartPolicy = 'Never') {
  return stored('Job', name, { spec: { template: podTemplate({ app: name }, 'task:1', restartPolicy), ...spec } });
}

function conds(sim: Sim, name: string): Array<Record<string, string>> {
  return (sim.status('Job', name).status.conditions ?? []) as Array<Record<string, string>>;
}

describe('Job', () => {
  it('runs completions pods, parallelism at a time, and completes', () => {
    const sim = new Sim();
    sim.workloads = [job('calc', { completions: 3, parallelism: 2 })];
    sim.step();
    const first = sim.names('calc');
    expect(first).toHaveLength(2);
    for (const n of first) expect(n).toMatch(/^calc-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
    const p = sim.pod(first[0]!);
    expect(p.metadata!.labels).toMatchObject({ app: 'calc', 'job-name': 'calc', 'batch.kubernetes.io/job-name': 'calc' });
    expect(p.metadata!.labels!['controller-uid']).toBe(p.metadata!.labels!['batch.kubernetes.io/controller-uid']);
    expect(p.metadata!.ownerReferences![0]).toMatchObject({ kind: 'Job', name: 'calc', controller: true });
    expect(p.spec!.restartPolicy).toBe('Never');
    expect(sim.status('Job', 'calc').status).toMatchObject({ active: 2, succeeded: 0, failed: 0, startTime: '2026-01-01T00:00:00Z' });

    sim.setReady(first[1]!);
    sim.advance(5000).finish(first[0]!, 'Succeeded').step();
    expect(sim.names('calc')).toHaveLength(3); // the Succeeded pod stays, one new starts
    expect(sim.names('calc')).toContain(first[0]);
    expect(sim.status('Job', 'calc').status).toMatchObject({ active: 2, succeeded: 1, ready: 1 });

    for (const n of sim.names('calc')) if (sim.pod(n).status?.phase !== 'Succeeded') sim.finish(n, 'Succeeded');
    sim.advance(5000).step();
    expect(sim.status('Job', 'calc').status).toMatchObject({ active: 0, succeeded: 3, failed: 0, completionTime: '2026-01-01T00:00:10Z' });
    expect(conds(sim, 'calc')).toEqual([expect.objectContaining({ type: 'Complete', status: 'True' })]);
    // Finished pods stay in the desired set, unchanged, and nothing new starts.
    for (let i = 0; i < 3; i++) sim.advance(60_000).step();
    expect(sim.names('calc')).toHaveLength(3);
    expect(sim.last.pods.every((p) => p.metadata!.name!.startsWith('calc-'))).toBe(true);
  });

  it('Never: replaces failed pods after the back-off, and fails with BackoffLimitExceeded past backoffLimit', () => {
    const sim = new Sim(2);
    sim.workloads = [job('flaky', { backoffLimit: 1 })];
    sim.step();
    const [a] = sim.names('flaky');
    sim.finish(a!, 'Failed').step();
    expect(sim.names('flaky')).toEqual([a]); // back-off: 10 s before the next
    expect(sim.last.requeueAfterMs).toBe(10_000);
    sim.advance(10_000).step();
    const b = sim.names('flaky').find((n) => n !== a)!;
    expect(b).toBeDefined();
    expect(sim.status('Job', 'flaky').status).toMatchObject({ active: 1, failed: 1 });
    sim.finish(b, 'Failed').step();
    expect(sim.status('Job', 'flaky').status).toMatchObject({ active: 0, failed: 2 });
    expect(conds(sim, 'flaky')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'BackoffLimitExceeded' })]);
    sim.advance(600_000).step();
    expect(sim.names('flaky').sort()).toEqual([a, b].sort());
  });

  it('OnFailure: container restarts count against backoffLimit and the running pod is removed', () => {
    const sim = new Sim(3);
    sim.workloads = [job('retry', { backoffLimit: 2 }, 'OnFailure')];
    sim.step();
    const [a] = sim.names('retry');
    sim.restart(a!, 1).step();
    expect(sim.names('retry')).toEqual([a]);
    expect(conds(sim, 'retry')).toEqual([]);
    sim.restart(a!, 1).step();
    expect(conds(sim, 'retry')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'BackoffLimitExceeded' })]);
    expect(sim.names('retry')).toEqual([]);
  });

  it('activeDeadlineSeconds: fails with DeadlineExceeded and removes running pods', () => {
    const sim = new Sim(4);
    sim.workloads = [job('slow', { activeDeadlineSeconds: 30, parallelism: 2, completions: 2 })];
    sim.step();
    expect(sim.last.requeueAfterMs).toBe(30_000);
    sim.advance(29_000).step();
    expect(sim.names('slow')).toHaveLength(2);
    sim.advance(1000).step();
    expect(sim.names('slow')).toEqual([]);
    expect(conds(sim, 'slow')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'DeadlineExceeded', message: 'Job was active longer than specified deadline' })]);
    expect(sim.status('Job', 'slow').status.completionTime).toBeUndefined();
  });

  it('ttlSecondsAfterFinished: the pods go after the ttl and the Job is reported deleted', () => {
    const sim = new Sim(5);
    sim.workloads = [job('once', { ttlSecondsAfterFinished: 100 })];
    sim.step();
    const [a] = sim.names('once');
    sim.advance(1000).finish(a!, 'Succeeded').step();
    expect(sim.last.requeueAfterMs).toBe(100_000);
    sim.advance(99_000).step();
    expect(sim.names('once')).toEqual([a]);
    expect(sim.status('Job', 'once').deleted).toBeUndefined();
    sim.advance(1000).step();
    expect(sim.names('once')).toEqual([]);
    const s = sim.status('Job', 'once');
    expect(s.deleted).toBe(true);
    expect(s.status).toMatchObject({ succeeded: 1, conditions: [expect.objectContaining({ type: 'Complete' })] });
    sim.advance(1000).step();
    expect(sim.names('once')).toEqual([]);
    expect(sim.status('Job', 'once').deleted).toBe(true);
  });

  it('work-queue mode (no completions): no new pods once one succeeds; complete when all ended', () => {
    const sim = new Sim(6);
    sim.workloads = [job('queue', { parallelism: 3 })];
    sim.step();
    const names = sim.names('queue');
    expect(names).toHaveLength(3);
    sim.finish(names[0]!, 'Succeeded').step();
    expect(sim.names('queue')).toHaveLength(3);
    expect(conds(sim, 'queue')).toEqual([]);
    sim.finish(names[1]!, 'Succeeded').finish(names[2]!, 'Succeeded').step();
    expect(conds(sim, 'queue')).toEqual([expect.objectContaining({ type: 'Complete' })]);
  });

  it('refuses restartPolicy Always with a Failed condition and no pods', () => {
    const sim = new Sim(7);
    sim.workloads = [job('bad', {}, 'Always')];
    sim.step();
    expect(sim.names('bad')).toEqual([]);
    expect(conds(sim, 'bad')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'InvalidSpec', message: expect.stringMatching(/restartPolicy OnFailure or Never/) })]);
    const noPolicy = stored('Job', 'bad2', { spec: { template: podTemplate({}) } });
    sim.workloads = [noPolicy];
    sim.step();
    expect(sim.status('Job', 'bad2').problems.join()).toMatch(/Always \(the default\)/);
  });

  it('an invalid edit of a running Job keeps its pods and does not restart it', () => {
    const sim = new Sim(12);
    sim.workloads = [job('keep', { parallelism: 2, completions: 2 })];
    sim.step();
    const names = sim.names('keep');
    sim.workloads = [stored('Job', 'keep', { spec: { parallelism: 2, completions: 2, template: podTemplate({ app: 'keep' }, 'task:1', 'Always') } })];
    sim.advance(1000).step();
    expect(sim.names('keep').sort()).toEqual([...names].sort());
    const failedAt = conds(sim, 'keep')[0]!.lastTransitionTime;
    sim.advance(1000).step();
    expect(conds(sim, 'keep')[0]).toMatchObject({ type: 'Failed', reason: 'InvalidSpec', lastTransitionTime: failedAt });
    sim.workloads = [job('keep', { parallelism: 2, completions: 2 })];
    sim.advance(1000).step();
    expect(sim.names('keep').sort()).toEqual([...names].sort());
    expect(conds(sim, 'keep')).toEqual([]);
  });

  it('a changed template starts the Job over under a new controller-uid', () => {
    const sim = new Sim(8);
    sim.workloads = [job('re', {})];
    sim.step();
    const [a] = sim.names('re');
    sim.finish(a!, 'Succeeded').step();
    expect(conds(sim, 're')[0]).toMatchObject({ type: 'Complete' });
    sim.workloads = [stored('Job', 're', { spec: { template: podTemplate({ app: 're' }, 'task:2', 'Never') } })];
    sim.step();
    const now = sim.names('re');
    expect(now).toHaveLength(1);
    expect(now[0]).not.toBe(a);
    expect(sim.status('Job', 're').status).toMatchObject({ active: 1, succeeded: 0 });
  });

  it('suspend removes running pods and clears startTime; resuming starts again', () => {
    const sim = new Sim(9);
    sim.workloads = [job('sus', { parallelism: 2, completions: 4 })];
    sim.step();
    expect(sim.names('sus')).toHaveLength(2);
    sim.workloads = [job('sus', { parallelism: 2, completions: 4, suspend: true })];
    sim.step();
    expect(sim.names('sus')).toEqual([]);
    expect(sim.status('Job', 'sus').status.startTime).toBeUndefined();
    expect(conds(sim, 'sus')).toEqual([expect.objectContaining({ type: 'Suspended' })]);
    sim.workloads = [job('sus', { parallelism: 2, completions: 4 })];
    sim.advance(5000).step();
    expect(sim.names('sus')).toHaveLength(2);
    expect(sim.status('Job', 'sus').status.startTime).toBe('2026-01-01T00:00:05Z');
  });

  it('pods of a Job that is gone are removed', () => {
    const sim = new Sim(10);
    sim.workloads = [job('gone', {})];
    sim.step();
    expect(sim.names('gone')).toHaveLength(1);
    sim.workloads = [];
    sim.step();
    expect(sim.names('gone')).toEqual([]);
    expect(sim.state.jobs).toEqual({});
  });
});

describe('Indexed Job', () => {
  const INDEX = 'batch.kubernetes.io/job-completion-index';
  const indexOf = (sim: Sim, name: string) => sim.pod(name).metadata!.annotations![INDEX];
  const byIndex = (sim: Sim, prefix: string) =>
    Object.fromEntries(sim.podsOf(prefix).map((p) => [p.metadata!.annotations![INDEX]!, p.metadata!.name!]));

  it('runs each index once, lowest first, parallelism at a time, and completes with completedIndexes', () => {
    const sim = new Sim(11);
    sim.workloads = [job('idx', { completionMode: 'Indexed', completions: 4, parallelism: 2 })];
    sim.step();
    const first = byIndex(sim, 'idx');
    expect(Object.keys(first).sort()).toEqual(['0', '1']);
    const p0 = sim.pod(first['0']!);
    expect(p0.metadata!.name).toMatch(/^idx-0-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
    expect(p0.metadata!.labels).toMatchObject({ [INDEX]: '0', 'job-name': 'idx' });
    expect(p0.spec!.hostname).toBe('idx-0');
    expect(p0.spec!.containers[0]!.env).toContainEqual({ name: 'JOB_COMPLETION_INDEX', valueFrom: { fieldRef: { fieldPath: `metadata.labels['${INDEX}']` } } });
    expect(sim.pod(first['1']!).spec!.hostname).toBe('idx-1');

    // Index 1 finishes first: index 2 starts, not a second pod for 0.
    sim.advance(1000).finish(first['1']!, 'Succeeded').step();
    expect(Object.keys(byIndex(sim, 'idx')).sort()).toEqual(['0', '1', '2']);
    expect(sim.status('Job', 'idx').status).toMatchObject({ active: 2, succeeded: 1, completedIndexes: '1' });

    // A failed pod's index runs again (after the back-off), under a new pod.
    sim.advance(1000).finish(first['0']!, 'Failed').step();
    expect(sim.names('idx')).toHaveLength(3);
    sim.advance(10_000).step();
    const again = sim.podsOf('idx').filter((p) => p.metadata!.annotations![INDEX] === '0' && p.status?.phase === 'Pending');
    expect(again).toHaveLength(1);
    expect(again[0]!.metadata!.name).not.toBe(first['0']);
    expect(sim.status('Job', 'idx').status).toMatchObject({ active: 2, succeeded: 1, failed: 1 });

    for (const p of sim.podsOf('idx')) if (p.status?.phase === 'Pending') sim.finish(p.metadata!.name!, 'Succeeded');
    sim.advance(1000).step();
    const three = sim.podsOf('idx').find((p) => p.metadata!.annotations![INDEX] === '3')!;
    expect(sim.status('Job', 'idx').status).toMatchObject({ active: 1, succeeded: 3, completedIndexes: '0-2' });
    sim.finish(three.metadata!.name!, 'Succeeded').advance(1000).step();
    expect(sim.status('Job', 'idx').status).toMatchObject({ active: 0, succeeded: 4, failed: 1, completedIndexes: '0-3' });
    expect(conds(sim, 'idx')).toEqual([expect.objectContaining({ type: 'Complete', reason: 'CompletionsReached' })]);
  });

  it('removes running pods whose index is done, duplicated, out of range or unreadable, keeping the one furthest along', () => {
    const sim = new Sim(12);
    sim.workloads = [job('dup', { completionMode: 'Indexed', completions: 3, parallelism: 3 })];
    sim.step();
    const made = byIndex(sim, 'dup');
    const uid = sim.pod(made['0']!).metadata!.labels!['batch.kubernetes.io/controller-uid']!;
    // Pods a crash or a hand could leave behind, all with this Job's uid.
    const clone = (from: string, name: string, index: string | undefined) => {
      const p = structuredClone(sim.pod(from));
      p.metadata!.name = name;
      if (index === undefined) {
        delete p.metadata!.annotations![INDEX];
        delete p.metadata!.labels![INDEX];
      } else p.metadata!.annotations![INDEX] = index;
      sim.pods.set(name, p);
    };
    sim.setReady(made['1']!);
    clone(made['1']!, 'dup-1-other', '1');
    sim.setStatus('dup-1-other', { phase: 'Pending' });
    clone(made['0']!, 'dup-7-stray', '7');
    clone(made['0']!, 'dup-x-stray', 'x');
    clone(made['2']!, 'dup-none', undefined);
    sim.advance(1000).finish(made['2']!, 'Succeeded');
    clone(made['0']!, 'dup-2-late', '2');
    sim.step();
    expect(sim.names('dup').sort()).toEqual([made['0'], made['1'], made['2']].sort());
    expect(sim.pod(made['1']!).status?.phase).toBe('Running');
    expect(indexOf(sim, made['2']!)).toBe('2');
    expect(sim.status('Job', 'dup').status).toMatchObject({ active: 2, succeeded: 1, completedIndexes: '2' });
    expect(uid).toBe(sim.pod(made['0']!).metadata!.labels!['batch.kubernetes.io/controller-uid']);
  });

  it('keeps the index whole in long pod names, and refuses names too long for the hostname', () => {
    const sim = new Sim(13);
    const long = 'a'.repeat(57);
    sim.workloads = [job(long, { completionMode: 'Indexed', completions: 12, parallelism: 12 })];
    sim.step();
    const names = [...sim.pods.keys()];
    expect(names).toHaveLength(12);
    for (const n of names) expect(n).toMatch(/^a+-\d{1,2}-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
    const p11 = [...sim.pods.values()].find((p) => p.metadata!.annotations![INDEX] === '11')!;
    expect(p11.metadata!.name).toMatch(new RegExp(`^${'a'.repeat(54)}-11-.{5}$`));
    expect(p11.metadata!.name!.length).toBe(63);
    expect(p11.spec!.hostname).toBe(`${long}-11`);

    const sim2 = new Sim(14);
    const tooLong = 'b'.repeat(62);
    sim2.workloads = [job(tooLong, { completionMode: 'Indexed', completions: 10 })];
    sim2.step();
    expect(sim2.pods.size).toBe(0);
    expect(sim2.status('Job', tooLong).problems.join('\n')).toMatch(/hostname "<job name>-<index>", at most 63 characters; "b{62}-9" is longer/);
    expect(conds(sim2, tooLong)).toEqual([expect.objectContaining({ type: 'Failed', reason: 'InvalidSpec' })]);
  });

  it('a success resets the back-off: failures among many successes each wait 10 s, not up to 6 minutes', () => {
    const sim = new Sim(16);
    sim.workloads = [job('flaky', { completionMode: 'Indexed', completions: 8, parallelism: 1, backoffLimit: 10 })];
    sim.step();
    for (let ix = 0; ix < 6; ix++) {
      const [first] = sim.names('flaky').filter((n) => sim.pod(n).status?.phase === 'Pending');
      expect(indexOf(sim, first!)).toBe(String(ix));
      // Each index fails once, then its retry succeeds.
      sim.advance(1000).finish(first!, 'Failed').step();
      expect(sim.status('Job', 'flaky').status).toMatchObject({ active: 0 });
      sim.advance(10_000).step();
      const retry = sim.names('flaky').filter((n) => sim.pod(n).status?.phase === 'Pending');
      expect(retry.map((n) => indexOf(sim, n)), `index ${ix} retried 10 s after its failure`).toEqual([String(ix)]);
      // A success: the next index starts at once, without waiting out the earlier failures.
      sim.advance(1000).finish(retry[0]!, 'Succeeded').step();
    }
    expect(sim.status('Job', 'flaky').status).toMatchObject({ active: 1, succeeded: 6, failed: 6, completedIndexes: '0-5' });
  });

  it('keeps a JOB_COMPLETION_INDEX the template sets, and counts a finished Job\'s indexes after its pods are gone', () => {
    const sim = new Sim(15);
    const template = podTemplate({ app: 'own' }, 'task:1', 'Never') as { spec: { containers: Array<Record<string, unknown>> } };
    template.spec.containers[0]!.env = [{ name: 'JOB_COMPLETION_INDEX', value: 'mine' }];
    sim.workloads = [stored('Job', 'own', { spec: { completionMode: 'Indexed', completions: 2, parallelism: 2, ttlSecondsAfterFinished: 60, template } })];
    sim.step();
    for (const n of sim.names('own')) expect(sim.pod(n).spec!.containers[0]!.env).toEqual([{ name: 'JOB_COMPLETION_INDEX', value: 'mine' }]);
    for (const n of sim.names('own')) sim.finish(n, 'Succeeded');
    sim.advance(1000).step();
    expect(sim.status('Job', 'own').status).toMatchObject({ succeeded: 2, completedIndexes: '0,1' });
    sim.advance(60_000).step();
    expect(sim.names('own')).toEqual([]);
    expect(sim.status('Job', 'own')).toMatchObject({ deleted: true, status: { succeeded: 2, completedIndexes: '0,1' } });
  });
});

describe('Job podFailurePolicy', () => {
  /** Ends a pod as Failed with `code` from container `name` (and optionally some pod conditions). */
  const fail = (sim: Sim, pod: string, code: number, name = 'app', conditions: Array<{ type: string; status: string }> = []) =>
    sim.setStatus(pod, {
      phase: 'Failed',
      conditions: [{ type: 'Ready', status: 'False', reason: 'PodCompleted' }, ...conditions],
      containerStatuses: [{ name, image: 'x', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: code, finishedAt: new Date(sim.now).toISOString() } } }],
    });
  const policy = (rules: unknown[]) => ({ backoffLimit: 3, podFailurePolicy: { rules } });

  it('FailJob on a listed exit code fails the Job at once and removes its running pods', () => {
    const sim = new Sim(21);
    sim.workloads = [job('pfp', { parallelism: 2, completions: 2, ...policy([{ action: 'FailJob', onExitCodes: { containerName: 'app', operator: 'In', values: [42] } }]) })];
    sim.step();
    const [a, b] = sim.names('pfp');
    sim.setReady(b!);
    fail(sim, a!, 42).advance(1000).step();
    expect(conds(sim, 'pfp')).toEqual([
      expect.objectContaining({
        type: 'Failed',
        reason: 'PodFailurePolicy',
        message: `container app of pod default/${a} exited with code 42, which matches podFailurePolicy rule 0 (FailJob)`,
      }),
    ]);
    expect(sim.names('pfp')).toEqual([a]);
    expect(sim.status('Job', 'pfp').status).toMatchObject({ active: 0, failed: 1 });
  });

  it('Ignore leaves a failure out of status.failed and backoffLimit, but not the back-off; other codes count', () => {
    const sim = new Sim(22);
    sim.workloads = [job('ign', { ...policy([{ action: 'Ignore', onExitCodes: { operator: 'In', values: [137] } }, { action: 'FailJob', onExitCodes: { operator: 'NotIn', values: [1] } }]), backoffLimit: 0 })];
    sim.step();
    for (let i = 0; i < 5; i++) {
      const [live] = sim.podsOf('ign').filter((p) => p.status?.phase === 'Pending');
      fail(sim, live!.metadata!.name!, 137).advance(1000).step();
      expect(sim.names('ign')).toHaveLength(i + 1); // 10 s, 20 s, … after the last failure
      expect(sim.last.requeueAfterMs).toBe(10_000 * 2 ** i - 1000);
      sim.advance(10_000 * 2 ** i).step();
    }
    expect(sim.names('ign')).toHaveLength(6);
    expect(conds(sim, 'ign')).toEqual([]);
    expect(sim.status('Job', 'ign').status).toMatchObject({ active: 1, failed: 0 });
    // Exit code 1 is not NotIn [1], so the FailJob rule does not match; it counts, past backoffLimit 0.
    const [live] = sim.podsOf('ign').filter((p) => p.status?.phase === 'Pending');
    fail(sim, live!.metadata!.name!, 1).advance(1000).step();
    expect(conds(sim, 'ign')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'BackoffLimitExceeded' })]);
    expect(sim.status('Job', 'ign').status).toMatchObject({ failed: 1 });
  });

  it('matches on the named container only, on pod conditions, and the first matching rule wins', () => {
    const sim = new Sim(23);
    const template = podTemplate({ app: 'order' }, 'task:1', 'Never') as { spec: { containers: Array<Record<string, unknown>> } };
    template.spec.containers.push({ name: 'other', image: 'side:1' });
    sim.workloads = [
      job('order', {
        template,
        parallelism: 3,
        completions: 3,
        ...policy([
          { action: 'Count', onExitCodes: { containerName: 'app', operator: 'In', values: [3] } },
          { action: 'FailJob', onExitCodes: { containerName: 'other', operator: 'In', values: [5] } },
          { action: 'Ignore', onPodConditions: [{ type: 'DisruptionTarget' }] },
          { action: 'FailJob', onExitCodes: { operator: 'In', values: [3, 5] } },
        ]),
      }),
    ];
    sim.step();
    const [a, b, c] = sim.names('order');
    fail(sim, a!, 3); // rule 0 (Count) before rule 3 (FailJob)
    fail(sim, b!, 5, 'app', [{ type: 'DisruptionTarget', status: 'True' }]); // rule 1 names another container; rule 2 matches
    sim.advance(1000).step();
    expect(conds(sim, 'order')).toEqual([]);
    expect(sim.status('Job', 'order').status).toMatchObject({ failed: 1 });
    fail(sim, c!, 5).advance(1000).step(); // rule 3
    expect(conds(sim, 'order')).toEqual([expect.objectContaining({ reason: 'PodFailurePolicy', message: expect.stringContaining('rule 3 (FailJob)') })]);
  });
});

describe('Job podFailurePolicy edited into a wrong shape', () => {
  it('with failed pods, says what is wrong and keeps its counts instead of an internal error', () => {
    for (const bad of [
      { rules: 'x' },
      { rules: [null] },
      { rules: [{ action: 'Ignore', onExitCodes: { operator: 'In', values: 5 } }] },
      { rules: [{ action: 'Ignore', onPodConditions: 'Ready' }] },
      { rules: [{ action: 'Ignore', onPodConditions: [null] }] },
    ]) {
      const sim = new Sim(33);
      const j = job('edited', { completions: 3 });
      sim.workloads = [j];
      sim.step();
      sim.finish(sim.names('edited')[0]!, 'Failed').advance(1000).step();
      (j.object.spec as Record<string, unknown>).podFailurePolicy = bad;
      sim.advance(1000).step();
      const s = sim.status('Job', 'edited');
      expect(s.problems, JSON.stringify(bad)).toEqual([expect.stringMatching(/^spec\.podFailurePolicy\.rules/)]);
      expect(s.status, JSON.stringify(bad)).toMatchObject({ failed: 1, conditions: [expect.objectContaining({ type: 'Failed', reason: 'InvalidSpec' })] });
      expect(sim.names('edited')).toHaveLength(1);
    }
  });
});

describe('Job at its size limits', () => {
  it('a pass over an Indexed Job of 100000 pods takes seconds, not minutes (pods are grouped by owner in linear time), and no pass makes more than CREATE_BURST', () => {
    const sim = new Sim(31);
    sim.workloads = [job('wide', { completionMode: 'Indexed', completions: 100_000, parallelism: 100_000 })];
    // At most CREATE_BURST new pods a pass: the Job grows to its parallelism a step at a time.
    sim.step();
    expect(sim.pods.size).toBe(CREATE_BURST);
    sim.step({ createBurst: 100_000 });
    expect(sim.pods.size).toBe(100_000);
    // Grouping by copying each owner's list per pod made this pass take over a minute.
    const t0 = performance.now();
    sim.step();
    expect(performance.now() - t0).toBeLessThan(15_000);
    expect(sim.status('Job', 'wide').status).toMatchObject({ active: 100_000, succeeded: 0 });
  }, 60_000);

  it('refuses a NonIndexed parallelism the node could never run, rather than building that many pods', () => {
    const sim = new Sim(32);
    sim.workloads = [job('flood', { parallelism: 200_001 }), job('huge', { parallelism: 2_000_000_000, completions: 1 })];
    sim.step();
    expect(sim.pods.size).toBe(0);
    expect(sim.status('Job', 'flood').problems).toEqual(['spec.parallelism: must be at most 100000 (no node runs more pods at once), got 200001']);
    expect(conds(sim, 'flood')).toEqual([expect.objectContaining({ type: 'Failed', reason: 'InvalidSpec' })]);
    expect(sim.status('Job', 'huge').problems.join('\n')).toMatch(/spec\.parallelism: must be at most 100000/);
  });
});
