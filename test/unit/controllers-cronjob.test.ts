import { describe, expect, it } from 'vitest';
import { podTemplate, Sim, stored, T0 } from '../helpers/controllers-sim.js';

const MIN = 60_000;

function cronjob(name: string, schedule: string, spec: Record<string, unknown> = {}, jobSpec: Record<string, unknown> = {}) {
  return stored('CronJob', name, {
    spec: { schedule, jobTemplate: { metadata: { labels: { team: 'a' } }, spec: { template: podTemplate({ app: name }, 'task:1', 'Never'), ...jobSpec } }, ...spec },
  });
}

const jobName = (cj: string, t: number) => `${cj}-${Math.floor(t / MIN)}`;

function jobsOf(sim: Sim, cj: string) {
  return sim.last.statuses.filter((s) => s.kind === 'Job' && s.ownerCronJob === cj);
}

function finishAll(sim: Sim, prefix: string, phase: 'Succeeded' | 'Failed' = 'Succeeded') {
  for (const p of sim.podsOf(prefix)) if (p.status?.phase === 'Pending' || p.status?.phase === 'Running') sim.finish(p.metadata!.name!, phase);
}

describe('CronJob', () => {
  it('makes a Job named <cronjob>-<minutes> at each schedule time and runs it in the same pass', () => {
    const sim = new Sim();
    sim.workloads = [cronjob('tick', '*/5 * * * *')];
    sim.step();
    expect(jobsOf(sim, 'tick')).toEqual([]);
    expect(sim.last.requeueAfterMs).toBe(5 * MIN);
    sim.advance(5 * MIN).step();
    const name = jobName('tick', T0 + 5 * MIN);
    expect(jobsOf(sim, 'tick').map((j) => j.name)).toEqual([name]);
    const pods = sim.podsOf(name);
    expect(pods).toHaveLength(1);
    expect(pods[0]!.metadata!.labels).toMatchObject({ 'job-name': name, app: 'tick' });
    const st = sim.status('CronJob', 'tick').status;
    expect(st).toMatchObject({ lastScheduleTime: '2026-01-01T00:05:00Z', active: [expect.objectContaining({ kind: 'Job', name })] });
    expect(sim.last.requeueAfterMs).toBe(5 * MIN);
    // The same time is never run twice.
    sim.advance(MIN).step();
    expect(jobsOf(sim, 'tick')).toHaveLength(1);
    finishAll(sim, name);
    sim.advance(MIN).step();
    expect(sim.status('CronJob', 'tick').status).toMatchObject({ lastSuccessfulTime: '2026-01-01T00:07:00Z' });
    expect(sim.status('CronJob', 'tick').status.active).toBeUndefined();
  });

  it('Allow runs Jobs side by side', () => {
    const sim = new Sim(2);
    sim.workloads = [cronjob('par', '* * * * *', { concurrencyPolicy: 'Allow' })];
    sim.step(); // first seen (created) at T0
    for (let i = 0; i < 3; i++) sim.advance(MIN).step();
    expect(jobsOf(sim, 'par')).toHaveLength(3);
    expect(sim.status('CronJob', 'par').status.active).toHaveLength(3);
  });

  it('Forbid skips while a Job runs, then runs the skipped time once it ends', () => {
    const sim = new Sim(3);
    sim.workloads = [cronjob('one', '*/10 * * * *', { concurrencyPolicy: 'Forbid' })];
    sim.step(); // first seen (created) at T0
    sim.advance(10 * MIN).step();
    const first = jobName('one', T0 + 10 * MIN);
    expect(jobsOf(sim, 'one').map((j) => j.name)).toEqual([first]);
    sim.advance(10 * MIN).step(); // 00:20, first still running
    expect(jobsOf(sim, 'one').map((j) => j.name)).toEqual([first]);
    expect(sim.status('CronJob', 'one').status.lastScheduleTime).toBe('2026-01-01T00:10:00Z');
    finishAll(sim, first);
    sim.advance(2 * MIN).step(); // 00:22: first done; the 00:20 run starts now
    expect(jobsOf(sim, 'one').map((j) => j.name)).toEqual([first, jobName('one', T0 + 20 * MIN)]);
  });

  it('Replace removes the running Job and its pods before starting the next', () => {
    const sim = new Sim(4);
    sim.workloads = [cronjob('rep', '*/10 * * * *', { concurrencyPolicy: 'Replace' })];
    sim.step(); // first seen (created) at T0
    sim.advance(10 * MIN).step();
    const first = jobName('rep', T0 + 10 * MIN);
    expect(sim.podsOf(first)).toHaveLength(1);
    sim.advance(10 * MIN).step();
    const second = jobName('rep', T0 + 20 * MIN);
    expect(jobsOf(sim, 'rep').map((j) => j.name)).toEqual([second]);
    expect(sim.podsOf(first)).toEqual([]);
    expect(sim.podsOf(second)).toHaveLength(1);
  });

  it('startingDeadlineSeconds: a time missed by more than the deadline is skipped', () => {
    const sim = new Sim(5);
    sim.workloads = [cronjob('late', '0 * * * *', { startingDeadlineSeconds: 60 })];
    sim.step();
    sim.advance(65 * MIN).step(); // 01:05: the 01:00 run is 5 minutes late
    expect(jobsOf(sim, 'late')).toEqual([]);
    expect(sim.last.requeueAfterMs).toBe(55 * MIN);
    sim.advance(55 * MIN + 30_000).step(); // 02:00:30: within the minute
    expect(jobsOf(sim, 'late').map((j) => j.name)).toEqual([jobName('late', T0 + 120 * MIN)]);
  });

  it('without a deadline, only the most recent missed time runs', () => {
    const sim = new Sim(6);
    sim.workloads = [cronjob('catch', '*/5 * * * *')];
    sim.step();
    sim.advance(60 * MIN).step();
    expect(jobsOf(sim, 'catch').map((j) => j.name)).toEqual([jobName('catch', T0 + 60 * MIN)]);
  });

  it('suspend makes no Jobs', () => {
    const sim = new Sim(7);
    sim.workloads = [cronjob('off', '* * * * *', { suspend: true })];
    sim.step(); // first seen (created) at T0
    for (let i = 0; i < 3; i++) sim.advance(MIN).step();
    expect(jobsOf(sim, 'off')).toEqual([]);
    expect(sim.status('CronJob', 'off').status).toEqual({});
  });

  it('keeps successfulJobsHistoryLimit and failedJobsHistoryLimit finished Jobs, with their pods', () => {
    const sim = new Sim(8);
    sim.workloads = [cronjob('hist', '* * * * *', { successfulJobsHistoryLimit: 2 }, { backoffLimit: 0 })];
    sim.step(); // first seen (created) at T0
    const made: string[] = [];
    for (let i = 1; i <= 4; i++) {
      sim.advance(MIN).step();
      const name = jobName('hist', T0 + i * MIN);
      made.push(name);
      finishAll(sim, name);
    }
    sim.advance(30_000).step();
    expect(jobsOf(sim, 'hist').map((j) => j.name)).toEqual(made.slice(2));
    expect(sim.podsOf(made[0]!)).toEqual([]);
    expect(sim.podsOf(made[3]!)).toHaveLength(1);
    // Failures: the default limit keeps one.
    for (let i = 5; i <= 7; i++) {
      sim.advance(30_000).step();
      const name = jobName('hist', T0 + i * MIN);
      finishAll(sim, name, 'Failed');
      sim.advance(30_000);
    }
    sim.step();
    const failed = jobsOf(sim, 'hist').filter((j) => (j.status.conditions as Array<{ type: string }> | undefined)?.some((c) => c.type === 'Failed'));
    expect(failed.map((j) => j.name)).toEqual([jobName('hist', T0 + 7 * MIN)]);
  });

  it('a deleted CronJob takes its Jobs and their pods with it', () => {
    const sim = new Sim(9);
    sim.workloads = [cronjob('bye', '* * * * *')];
    sim.step(); // first seen (created) at T0
    sim.advance(MIN).step();
    expect(sim.pods.size).toBe(1);
    sim.workloads = [];
    sim.step();
    expect(sim.pods.size).toBe(0);
    expect(sim.state.virtualJobs).toEqual({});
    expect(sim.state.jobs).toEqual({});
  });

  it('an invalid schedule or time zone is a problem, not an exception', () => {
    const sim = new Sim(10);
    sim.workloads = [cronjob('bad', '61 * * * *'), cronjob('tz', '* * * * *', { timeZone: 'Europe/Paris' })];
    sim.step(); // first seen (created) at T0
    sim.advance(5 * MIN).step();
    expect(sim.status('CronJob', 'bad').problems.join()).toMatch(/minute: 61 is outside 0-59/);
    expect(sim.status('CronJob', 'tz').problems.join()).toMatch(/timeZone: only UTC/);
    expect(sim.pods.size).toBe(0);
  });

  it('refuses, on the CronJob itself, an Indexed jobTemplate whose pods\' hostnames would be too long', () => {
    const sim = new Sim(12);
    const long = 'c'.repeat(52);
    sim.workloads = [cronjob(long, '* * * * *', {}, { completionMode: 'Indexed', completions: 11 }), cronjob('c'.repeat(51), '* * * * *', {}, { completionMode: 'Indexed', completions: 11 })];
    sim.step();
    expect(sim.status('CronJob', long).problems).toEqual([expect.stringMatching(/hostname "<job name>-<index>", at most 63 characters; .* the last one has 64$/)]);
    expect(sim.status('CronJob', 'c'.repeat(51)).problems).toEqual([]);
    sim.advance(MIN).step();
    expect(jobsOf(sim, long)).toEqual([]);
    expect(jobsOf(sim, 'c'.repeat(51))).toHaveLength(1);
  });

  it("a Job's ttl removes it from the CronJob's history", () => {
    const sim = new Sim(11);
    sim.workloads = [cronjob('ttl', '0 * * * *', {}, { ttlSecondsAfterFinished: 60 })];
    sim.step(); // first seen (created) at T0
    sim.advance(60 * MIN).step();
    const name = jobName('ttl', T0 + 60 * MIN);
    finishAll(sim, name);
    sim.advance(1000).step();
    expect(jobsOf(sim, 'ttl')).toHaveLength(1);
    sim.advance(60_000).step();
    expect(jobsOf(sim, 'ttl')).toEqual([]);
    expect(sim.podsOf(name)).toEqual([]);
    sim.advance(1000).step();
    expect(jobsOf(sim, 'ttl')).toEqual([]);
  });
});
