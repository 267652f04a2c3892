/**
 * The prober manager on fake time: when probes run (initial delay, period,
 * jitter, startup gating), what it caches (thresholds, initial values), what
 * it reports, and that removal stops everything, including runs in flight.
 */
import { describe, expect, it } from 'vitest';
import type { Container, Probe } from 'kubernetes-types/core/v1.js';
import type { ProbeKind, ProbeOutcome, ProbeRunner, ProbeTarget } from '../../src/kubelet-lite/model.js';
import { ProberManager, realClock, type ProbeResultEvent, type ProberClock } from '../../src/kubelet-lite/prober.js';

class FakeClock implements ProberClock {
  t = 1_000_000;
  private seq = 0;
  private timers = new Map<number, { at: number; fn: () => void }>();
  rand = 0;

  now() {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number) {
    const id = ++this.seq;
    this.timers.set(id, { at: this.t + ms, fn });
    return id;
  }
  clearTimeout(h: unknown) {
    this.timers.delete(h as number);
  }
  random() {
    return this.rand;
  }
  get pending() {
    return this.timers.size;
  }
  /** Runs every timer due within `ms`, in order, letting the probes' promises settle between them. */
  async advance(ms: number) {
    const end = this.t + ms;
    for (;;) {
      await settle();
      let next: [number, { at: number; fn: () => void }] | undefined;
      for (const e of this.timers) if (e[1].at <= end && (!next || e[1].at < next[1].at)) next = e;
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = next[1].at;
      next[1].fn();
    }
    this.t = end;
    await settle();
  }
}

const settle = () => new Promise<void>((r) => setImmediate(r));

type Script = (kind: ProbeKind, n: number, signal?: AbortSignal) => ProbeOutcome | Promise<ProbeOutcome>;

/** A ProbeRunner whose answers the test scripts per probe kind; it records when each probe ran. */
function scriptedRunner(clock: FakeClock, script: Script) {
  const runs: { kind: ProbeKind; at: number }[] = [];
  const count: Record<string, number> = {};
  const runner: ProbeRunner = {
    probe(p: Probe, _t: ProbeTarget, signal?: AbortSignal) {
      const kind = (p as Probe & { kind: ProbeKind }).kind;
      count[kind] = (count[kind] ?? 0) + 1;
      runs.push({ kind, at: clock.now() });
      return Promise.resolve(script(kind, count[kind]!, signal));
    },
  };
  return { runner, runs, times: (k: ProbeKind) => runs.filter((r) => r.kind === k).map((r) => r.at - T0) };
}

const T0 = 1_000_000;
const ok: ProbeOutcome = { result: 'success', message: '' };
const bad: ProbeOutcome = { result: 'failure', message: 'HTTP probe failed with statuscode: 500' };
const unk: ProbeOutcome = { result: 'unknown', message: 'container gone' };

/** A probe tagged with its kind, so the scripted runner knows which one it is running. */
function probe(kind: ProbeKind, extra: Partial<Probe> = {}): Probe {
  return { exec: { command: ['x'] }, timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3, ...extra, kind } as Probe;
}

function setup(container: Partial<Container>, script: Script, opts: { startedAt?: number; createdAt?: number } = {}) {
  const clock = new FakeClock();
  if (opts.createdAt !== undefined) clock.t = opts.createdAt;
  const events: ProbeResultEvent[] = [];
  const r = scriptedRunner(clock, script);
  const m = new ProberManager({ runner: r.runner, onResult: (e) => events.push(e), clock });
  clock.t = T0;
  const target: ProbeTarget = { containerId: 'cid-1', podIP: '10.0.0.2', container: { name: 'app', ...container } };
  m.addContainer({ podUid: 'pod-1', target, startedAt: opts.startedAt ?? T0 });
  return { clock, m, events, ...r, target };
}

describe('prober manager timing', () => {
  it('runs the first probe after initialDelaySeconds, then every periodSeconds', async () => {
    const s = setup({ readinessProbe: probe('readiness', { initialDelaySeconds: 5, periodSeconds: 3 }) }, () => ok);
    await s.clock.advance(4_999);
    expect(s.runs).toEqual([]);
    expect(s.m.ready('pod-1', 'app')).toBe(false);
    await s.clock.advance(10_001);
    expect(s.times('readiness')).toEqual([5_000, 8_000, 11_000, 14_000]);
    expect(s.m.ready('pod-1', 'app')).toBe(true);
  });

  it('counts the initial delay from the container start, not from when probing began', async () => {
    const s = setup({ livenessProbe: probe('liveness', { initialDelaySeconds: 5 }) }, () => ok, { startedAt: T0 - 4_000 });
    await s.clock.advance(1_000);
    expect(s.times('liveness')).toEqual([1_000]);
  });

  it('jitters the first run a little; containers found running at agent start over up to a period', async () => {
    const fresh = setup({ livenessProbe: probe('liveness') }, () => ok);
    fresh.clock.rand = 0.5;
    fresh.m.removePod('pod-1');
    fresh.m.addContainer({ podUid: 'pod-1', target: { ...fresh.target, containerId: 'cid-2' }, startedAt: T0 });
    await fresh.clock.advance(30_000);
    expect(fresh.times('liveness')).toEqual([500, 10_500, 20_500]);

    // The agent started at T0 and finds a container that started before it.
    const adopted = setup({ livenessProbe: probe('liveness') }, () => ok, { createdAt: T0, startedAt: T0 - 3_600_000 });
    adopted.clock.rand = 0.5;
    adopted.m.removePod('pod-1');
    adopted.m.addContainer({ podUid: 'pod-1', target: { ...adopted.target, containerId: 'cid-2' }, startedAt: T0 - 3_600_000 });
    await adopted.clock.advance(20_000);
    expect(adopted.times('liveness')).toEqual([5_000, 15_000]);
  });

  it('a run that overruns its period is followed by the next at once, never two at a time', async () => {
    let release: (() => void) | undefined;
    const s = setup({ livenessProbe: probe('liveness', { periodSeconds: 1 }) }, (_k, n) =>
      n === 1 ? new Promise<ProbeOutcome>((r) => (release = () => r(ok))) : ok,
    );
    await s.clock.advance(3_500);
    expect(s.times('liveness')).toEqual([0]);
    release!();
    await s.clock.advance(0);
    await s.clock.advance(1_000);
    expect(s.times('liveness')).toEqual([0, 3_500, 4_000]);
  });
});

describe('prober manager results', () => {
  it('starts readiness as failure, liveness as success, startup as unknown', () => {
    const s = setup({ readinessProbe: probe('readiness'), livenessProbe: probe('liveness'), startupProbe: probe('startup') }, () => ok);
    expect(s.m.result('pod-1', 'app', 'readiness')).toBe('failure');
    expect(s.m.result('pod-1', 'app', 'liveness')).toBe('success');
    expect(s.m.result('pod-1', 'app', 'startup')).toBe('unknown');
    expect(s.m.started('pod-1', 'app')).toBe(false);
    expect(s.m.ready('pod-1', 'app')).toBe(false);
  });

  it('a running container without probes is started and ready', () => {
    const s = setup({}, () => ok);
    expect(s.m.workerCount()).toBe(0);
    expect(s.m.started('pod-1', 'app')).toBe(true);
    expect(s.m.ready('pod-1', 'app')).toBe(true);
  });

  it('reports liveness failure only after failureThreshold failures in a row, then holds', async () => {
    const answers = [bad, bad, ok, bad, bad, bad, bad];
    const s = setup({ livenessProbe: probe('liveness', { failureThreshold: 3 }) }, (_k, n) => answers[n - 1] ?? ok);
    await s.clock.advance(45_000);
    expect(s.events).toEqual([]);
    await s.clock.advance(10_000);
    expect(s.times('liveness')).toEqual([0, 10_000, 20_000, 30_000, 40_000, 50_000]);
    expect(s.events).toEqual([
      { podUid: 'pod-1', container: 'app', containerId: 'cid-1', kind: 'liveness', result: 'failure', message: bad.message, changed: true },
    ]);
    expect(s.m.result('pod-1', 'app', 'liveness')).toBe('failure');
    // On hold: no exec into a container that is being killed.
    await s.clock.advance(60_000);
    expect(s.times('liveness')).toHaveLength(6);
    expect(s.clock.pending).toBe(0);
    // The restarted container starts over from success.
    s.m.addContainer({ podUid: 'pod-1', target: { ...s.target, containerId: 'cid-2' }, startedAt: s.clock.now() });
    expect(s.m.result('pod-1', 'app', 'liveness')).toBe('success');
    await s.clock.advance(1);
    expect(s.runs).toHaveLength(7);
  });

  it('flips readiness both ways, each after its threshold, reporting only changes', async () => {
    const answers = [bad, ok, ok, ok, bad, bad, ok, ok];
    const s = setup({ readinessProbe: probe('readiness', { successThreshold: 2, failureThreshold: 2, periodSeconds: 1 }) }, (_k, n) => answers[n - 1] ?? ok);
    const readyAt: boolean[] = [];
    for (let i = 0; i < answers.length; i++) {
      await s.clock.advance(i === 0 ? 0 : 1_000);
      readyAt.push(s.m.ready('pod-1', 'app'));
    }
    expect(readyAt).toEqual([false, false, true, true, true, false, false, true]);
    expect(s.events.map((e) => [e.result, e.changed])).toEqual([
      ['success', true],
      ['failure', true],
      ['success', true],
    ]);
  });

  it('throws away unknown runs: they neither count nor break a run of failures', async () => {
    const answers = [bad, unk, bad, unk, unk, bad];
    const s = setup({ livenessProbe: probe('liveness', { periodSeconds: 1 }) }, (_k, n) => answers[n - 1] ?? ok);
    await s.clock.advance(4_000);
    expect(s.events).toEqual([]);
    await s.clock.advance(1_000);
    expect(s.events.map((e) => e.result)).toEqual(['failure']);
  });

  it('gates liveness and readiness until the startup probe succeeds, then runs readiness at once', async () => {
    const answers = [bad, bad, ok];
    const s = setup(
      {
        startupProbe: probe('startup', { periodSeconds: 1, failureThreshold: 30 }),
        readinessProbe: probe('readiness', { periodSeconds: 10 }),
        livenessProbe: probe('liveness', { periodSeconds: 10 }),
      },
      (k, n) => (k === 'startup' ? answers[n - 1] ?? ok : ok),
    );
    await s.clock.advance(1_500);
    expect(s.times('readiness')).toEqual([]);
    expect(s.times('liveness')).toEqual([]);
    expect(s.m.started('pod-1', 'app')).toBe(false);
    await s.clock.advance(1_000);
    expect(s.times('startup')).toEqual([0, 1_000, 2_000]);
    expect(s.m.started('pod-1', 'app')).toBe(true);
    // Readiness right after startup; liveness on its own period.
    expect(s.times('readiness')).toEqual([2_000]);
    expect(s.m.ready('pod-1', 'app')).toBe(true);
    await s.clock.advance(20_000);
    expect(s.times('startup')).toEqual([0, 1_000, 2_000]);
    expect(s.times('liveness')).toEqual([10_000, 20_000]);
    expect(s.events.map((e) => [e.kind, e.result])).toEqual([
      ['startup', 'success'],
      ['readiness', 'success'],
    ]);
  });

  it('reports a startup probe that never passes after failureThreshold and stops it', async () => {
    const s = setup({ startupProbe: probe('startup', { periodSeconds: 1, failureThreshold: 5 }), livenessProbe: probe('liveness') }, () => bad);
    await s.clock.advance(10_000);
    expect(s.times('startup')).toEqual([0, 1_000, 2_000, 3_000, 4_000]);
    expect(s.events).toEqual([
      { podUid: 'pod-1', container: 'app', containerId: 'cid-1', kind: 'startup', result: 'failure', message: bad.message, changed: true },
    ]);
    expect(s.times('liveness')).toEqual([]);
  });

  it('a restarted container failing again is reported again, even if the result did not change', async () => {
    const s = setup({ startupProbe: probe('startup', { periodSeconds: 1, failureThreshold: 1 }) }, () => bad);
    await s.clock.advance(0);
    // The pod worker restarts it before the prober ever saw a success.
    s.m.addContainer({ podUid: 'pod-1', target: { ...s.target, containerId: 'cid-2' }, startedAt: s.clock.now() });
    await s.clock.advance(0);
    expect(s.events.map((e) => [e.containerId, e.result, e.changed])).toEqual([
      ['cid-1', 'failure', true],
      ['cid-2', 'failure', true],
    ]);
  });
});

describe('prober manager removal', () => {
  it('removePod stops probing and abandons the run in flight, whose result is never reported', async () => {
    let aborted = false;
    const s = setup({ livenessProbe: probe('liveness', { periodSeconds: 1, failureThreshold: 1 }) }, (_k, n, signal) =>
      n < 3
        ? ok
        : new Promise<ProbeOutcome>((resolve) =>
            signal!.addEventListener('abort', () => {
              aborted = true;
              resolve(bad);
            }),
          ),
    );
    await s.clock.advance(2_000);
    expect(s.runs).toHaveLength(3);
    s.m.removePod('pod-1');
    await s.clock.advance(0);
    expect(aborted).toBe(true);
    await s.clock.advance(60_000);
    expect(s.runs).toHaveLength(3);
    expect(s.events).toEqual([]);
    expect(s.clock.pending).toBe(0);
    expect(s.m.workerCount()).toBe(0);
  });

  it('removeContainer and stopAll stop their workers; addContainer with the same ID is a no-op', async () => {
    const s = setup({ readinessProbe: probe('readiness', { periodSeconds: 1 }) }, () => ok);
    s.m.addContainer({ podUid: 'pod-1', target: s.target, startedAt: T0 });
    await s.clock.advance(2_000);
    expect(s.times('readiness')).toEqual([0, 1_000, 2_000]);
    s.m.addContainer({ podUid: 'pod-2', target: s.target, startedAt: T0 });
    s.m.removeContainer('pod-1', 'app');
    await s.clock.advance(1_000);
    // Only pod-2's: at once (its start is long past), then a period on.
    expect(s.runs).toHaveLength(5);
    s.m.stopAll();
    await s.clock.advance(10_000);
    expect(s.runs).toHaveLength(5);
    expect(s.clock.pending).toBe(0);
  });

  it('podTerminating quiets liveness and startup as success; readiness goes on', async () => {
    const s = setup(
      { livenessProbe: probe('liveness', { periodSeconds: 1 }), readinessProbe: probe('readiness', { periodSeconds: 1 }) },
      (k) => (k === 'liveness' ? bad : ok),
    );
    await s.clock.advance(1_000);
    s.m.podTerminating('pod-1');
    await s.clock.advance(5_000);
    expect(s.times('liveness')).toEqual([0, 1_000]);
    expect(s.times('readiness')).toHaveLength(7);
    expect(s.events.filter((e) => e.kind === 'liveness')).toEqual([]);
    expect(s.m.result('pod-1', 'app', 'liveness')).toBe('success');
  });

  it('a callback that throws does not stop probing', async () => {
    const clock = new FakeClock();
    const r = scriptedRunner(clock, (_k, n) => (n % 2 ? bad : ok));
    const logs: string[] = [];
    const m = new ProberManager({ runner: r.runner, onResult: () => { throw new Error('boom'); }, clock, log: (l) => logs.push(l) });
    m.addContainer({ podUid: 'p', target: { containerId: 'c', podIP: '', container: { name: 'app', readinessProbe: probe('readiness', { periodSeconds: 1, failureThreshold: 1 }) } }, startedAt: clock.now() });
    await clock.advance(3_000);
    expect(r.runs).toHaveLength(4);
    expect(logs[0]).toContain('boom');
    m.stopAll();
  });

  it('a period or initial delay longer than a Node timer takes is waited for, not run every millisecond', async () => {
    // 35 days: setTimeout would fire after 1 ms instead, and the probe would run back to back.
    const runs: string[] = [];
    const runner: ProbeRunner = { probe: async (p) => (runs.push((p as Probe & { kind: ProbeKind }).kind), ok) };
    const m = new ProberManager({ runner, onResult: () => undefined, clock: realClock });
    const long = 35 * 24 * 3600;
    m.addContainer({
      podUid: 'p',
      target: {
        containerId: 'c',
        podIP: '',
        container: { name: 'app', readinessProbe: probe('readiness', { periodSeconds: long }), livenessProbe: probe('liveness', { initialDelaySeconds: long }) },
      },
      startedAt: Date.now(),
    });
    try {
      await new Promise((r) => setTimeout(r, 300));
      // The readiness probe's first run (jittered within its period, so perhaps not yet); liveness not at all.
      expect(runs.filter((k) => k === 'readiness').length).toBeLessThanOrEqual(1);
      expect(runs.filter((k) => k === 'liveness')).toEqual([]);
    } finally {
      m.stopAll();
    }
  });

  it('real timers are unref\'d', () => {
    const t = realClock.setTimeout(() => undefined, 60_000) as NodeJS.Timeout;
    expect(t.hasRef()).toBe(false);
    realClock.clearTimeout(t);
  });
});

