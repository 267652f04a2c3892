import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { reconcile } from '../../src/controllers/reconcile.js';
import { emptyState } from '../../src/controllers/types.js';
import type { StoredObject } from '../../src/kubelet-lite/model.js';
import { deployment, podTemplate, Sim, stored, T0 } from '../helpers/controllers-sim.js';
import { prng } from '../helpers/prng.js';

describe('invalid workloads are reported, never thrown', () => {
  const dep = (spec: Record<string, unknown>) => deployment('d', spec);
  const cases: Array<[string, StoredObject, RegExp]> = [
    ['wrong apiVersion', stored('Deployment', 'd', { spec: {} }, 'extensions/v1beta1'), /apiVersion: Deployment is served as apps\/v1/],
    ['missing selector', stored('Deployment', 'd', { spec: { template: podTemplate({ app: 'd' }) } }), /spec.selector: required/],
    ['missing template', stored('Deployment', 'd', { spec: { selector: { matchLabels: { app: 'd' } } } }), /spec.template: required/],
    ['no containers', dep({ template: { metadata: { labels: { app: 'd' } }, spec: { containers: [] } } }), /at least one container/],
    ['container without image', dep({ template: { metadata: { labels: { app: 'd' } }, spec: { containers: [{ name: 'a' }] } } }), /image: required/],
    ['replicas as a string', dep({ replicas: '3' }), /spec.replicas: must be an integer, got "3"/],
    ['negative replicas', dep({ replicas: -1 }), /spec.replicas: must be at least 0/],
    ['maxSurge nonsense', dep({ strategy: { rollingUpdate: { maxSurge: 'lots' } } }), /maxSurge: must be a non-negative integer or a percentage/],
    ['unknown strategy', dep({ strategy: { type: 'BlueGreen' } }), /strategy.type: must be one of RollingUpdate, Recreate/],
    ['Recreate with rollingUpdate', dep({ strategy: { type: 'Recreate', rollingUpdate: {} } }), /may not be set when type is Recreate/],
    ['restartPolicy Never in a Deployment', dep({ template: podTemplate({ app: 'd' }, 'x', 'Never') }), /must be Always for this kind/],
    ['bad selector operator', dep({ selector: { matchExpressions: [{ key: 'app', operator: 'Like', values: ['d'] }] } }), /operator: must be In, NotIn/],
    ['empty selector', dep({ selector: {} }), /empty selector/],
    ['bad name', { ...deployment('d', {}), name: 'Bad_Name' }, /metadata.name: "Bad_Name"/],
    ['spec is a list', stored('Deployment', 'd', { spec: [1, 2] }), /spec: required/],
    ['Job with a string parallelism', stored('Job', 'j', { spec: { parallelism: 'two', template: podTemplate({}, 'x', 'Never') } }), /parallelism: must be an integer/],
    ['Job with an unknown completionMode', stored('Job', 'j', { spec: { completionMode: 'Sparse', template: podTemplate({}, 'x', 'Never') } }), /completionMode: must be one of NonIndexed, Indexed/],
    ['Indexed Job without completions', stored('Job', 'j', { spec: { completionMode: 'Indexed', template: podTemplate({}, 'x', 'Never') } }), /spec.completions: required when completionMode is Indexed/],
    ['Indexed Job with too many completions', stored('Job', 'j', { spec: { completionMode: 'Indexed', completions: 100_001, template: podTemplate({}, 'x', 'Never') } }), /spec.completions: must be at most 100000 when completionMode is Indexed/],
    ['Job with backoffLimitPerIndex', stored('Job', 'j', { spec: { completionMode: 'Indexed', completions: 2, backoffLimitPerIndex: 1, template: podTemplate({}, 'x', 'Never') } }), /spec.backoffLimitPerIndex: per-index back-off limits are not supported/],
    ['Job with a successPolicy', stored('Job', 'j', { spec: { successPolicy: { rules: [] }, template: podTemplate({}, 'x', 'Never') } }), /spec.successPolicy: success policies are not supported/],
    ['podFailurePolicy with OnFailure', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [] }, template: podTemplate({}, 'x', 'OnFailure') } }), /restartPolicy: must be Never when podFailurePolicy is set/],
    ['podFailurePolicy rule with both requirements', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [{ action: 'Ignore', onExitCodes: { operator: 'In', values: [1] }, onPodConditions: [{ type: 'X' }] }] }, template: podTemplate({}, 'x', 'Never') } }), /rules\[0\]: needs exactly one of onExitCodes and onPodConditions/],
    ['podFailurePolicy In with 0', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [{ action: 'FailJob', onExitCodes: { operator: 'In', values: [0, 1] } }] }, template: podTemplate({}, 'x', 'Never') } }), /0 is not a failure/],
    ['podFailurePolicy with an unknown container', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [{ action: 'FailJob', onExitCodes: { containerName: 'nope', operator: 'In', values: [1] } }] }, template: podTemplate({}, 'x', 'Never') } }), /containerName: must name one of the template's containers, got "nope"/],
    ['podFailurePolicy FailIndex', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [{ action: 'FailIndex', onExitCodes: { operator: 'In', values: [1] } }] }, template: podTemplate({}, 'x', 'Never') } }), /FailIndex needs backoffLimitPerIndex/],
    ['podFailurePolicy unknown action', stored('Job', 'j', { spec: { podFailurePolicy: { rules: [{ action: 'Retry', onExitCodes: { operator: 'In', values: [1] } }] }, template: podTemplate({}, 'x', 'Never') } }), /action: must be one of FailJob, Ignore, Count, got "Retry"/],
    ['Job name too long for a label', stored('Job', 'j'.repeat(64), { spec: { template: podTemplate({}, 'x', 'Never') } }), /at most 63/],
    ['CronJob without jobTemplate', stored('CronJob', 'c', { spec: { schedule: '* * * * *' } }), /spec.jobTemplate: required/],
    ['CronJob without schedule', stored('CronJob', 'c', { spec: { jobTemplate: { spec: { template: podTemplate({}, 'x', 'Never') } } } }), /spec.schedule: required/],
    ['DaemonSet with label value too long', stored('DaemonSet', 'x', { spec: { selector: { matchLabels: { a: 'b' } }, template: podTemplate({ a: 'b'.repeat(64) }) } }), /not a valid label value/],
  ];
  it.each(cases)('%s', (_n, obj, msg) => {
    const sim = new Sim();
    sim.workloads = [obj];
    sim.step();
    const s = sim.last.statuses.find((x) => x.name === obj.name)!;
    expect(s.problems.join('\n')).toMatch(msg);
    expect(sim.pods.size).toBe(0);
  });

  it('never takes the name of a pod from elsewhere, even with a stuck random source', () => {
    const first = reconcile({ workloads: [stored('Job', 'j', { spec: { template: podTemplate({}, 'x', 'Never') } })], pods: [], nodeName: 'n', now: T0, state: emptyState(), random: () => 0 });
    const name = first.pods[0]!.metadata!.name!;
    expect(name).toBe('j-bbbbb');
    const again = reconcile({
      workloads: [stored('Job', 'j', { spec: { parallelism: 3, completions: 3, template: podTemplate({}, 'x', 'Never') } })],
      pods: [],
      nodeName: 'n',
      now: T0,
      state: emptyState(),
      random: () => 0,
      reservedPodNames: ['default/j-bbbbb'],
    });
    const names = again.pods.map((p) => p.metadata!.name!);
    expect(new Set(names).size).toBe(3);
    expect(names).not.toContain('j-bbbbb');
  });

  it('an edit that breaks a running Deployment leaves its pods alone', () => {
    const sim = new Sim();
    sim.workloads = [deployment('web', { replicas: 2 })];
    sim.step();
    const names = sim.names('web');
    sim.workloads = [deployment('web', { replicas: 'two' })];
    sim.step();
    expect(sim.names('web').sort()).toEqual([...names].sort());
  });

  it('random garbage: objects, pods and state never make reconcile throw', () => {
    const rnd = prng(20260101);
    const pick = <T>(xs: T[]): T => xs[Math.floor(rnd() * xs.length)]!;
    const junk = (depth: number): unknown => {
      switch (Math.floor(rnd() * (depth > 2 ? 6 : 9))) {
        case 0: return null;
        case 1: return Math.floor(rnd() * 200) - 50;
        case 2: return pick(['', 'x', '25%', '*/5 * * * *', 'Never', 'Always', 'Recreate', 'RollingUpdate', '-1', 'Forbid', '@every 1s']);
        case 3: return rnd() < 0.5;
        case 4: return undefined;
        case 5: return 1.5;
        case 6: return [junk(depth + 1), junk(depth + 1)];
        default: {
          const o: Record<string, unknown> = {};
          for (let i = 0; i < 3; i++) o[pick(['spec', 'template', 'metadata', 'labels', 'selector', 'matchLabels', 'containers', 'replicas', 'strategy', 'rollingUpdate', 'maxSurge', 'schedule', 'jobTemplate', 'completions', 'parallelism', 'app', 'name', 'image', 'restartPolicy', 'status', 'phase', 'conditions', 'ownerReferences', 'kind'])] = junk(depth + 1);
          return o;
        }
      }
    };
    // Mutate a valid object at a random path, so most objects get deep into the controllers.
    const mutate = (o: unknown): unknown => {
      const copy = structuredClone(o) as Record<string, unknown>;
      let cur: Record<string, unknown> = copy;
      for (let i = 0; i < 6; i++) {
        const keys = Object.keys(cur);
        if (!keys.length) break;
        const k = pick(keys);
        if (rnd() < 0.35 || typeof cur[k] !== 'object' || cur[k] === null) {
          cur[k] = junk(0);
          break;
        }
        cur = cur[k] as Record<string, unknown>;
      }
      return copy;
    };
    const valid = (): StoredObject => {
      const t = podTemplate({ app: 'z' }, 'img', 'Never');
      return pick([
        deployment('z', { replicas: 3 }),
        stored('DaemonSet', 'z', { spec: { selector: { matchLabels: { app: 'z' } }, template: podTemplate({ app: 'z' }) } }),
        stored('Job', 'z', { spec: { completions: 2, parallelism: 2, template: t } }),
        stored('CronJob', 'z', { spec: { schedule: '* * * * *', jobTemplate: { spec: { template: t } } } }),
      ]);
    };
    let state: unknown = emptyState();
    let pods: Pod[] = [];
    let podsMade = 0;
    let clean = 0;
    let refused = 0;
    for (let round = 0; round < 400; round++) {
      const workloads: unknown[] = [];
      for (let i = 0; i < 4; i++) {
        const v = valid();
        workloads.push(rnd() < 0.7 ? { ...v, object: mutate(v.object) } : rnd() < 0.5 ? junk(0) : { ...v, ...(junk(0) as object) });
      }
      const inputPods = rnd() < 0.2 ? [...pods, junk(0) as Pod, { metadata: { name: 'p', ownerReferences: junk(0) } } as unknown as Pod] : pods;
      const out = reconcile({
        workloads: workloads as StoredObject[],
        pods: inputPods.map((p) => (rnd() < 0.1 ? ({ ...p, status: junk(0) } as Pod) : p)),
        nodeName: 'n',
        now: T0 + round * 30_000,
        state: (rnd() < 0.05 ? junk(0) : state) as never,
        random: rnd,
      });
      for (const p of out.pods) {
        expect(typeof p.metadata?.name).toBe('string');
        expect(p.spec).toBeDefined();
      }
      expect(() => JSON.stringify(out.state)).not.toThrow();
      podsMade += out.pods.length;
      clean += out.statuses.filter((x) => x.problems.length === 0).length;
      refused += out.statuses.filter((x) => x.problems.length > 0).length;
      state = JSON.parse(JSON.stringify(out.state));
      pods = out.pods.map((p) => ({ ...p, status: { phase: pick(['Pending', 'Running', 'Succeeded', 'Failed']) } }));
    }
    // The run reached the controllers' real paths, not only the validator.
    expect(podsMade).toBeGreaterThan(100);
    expect(clean).toBeGreaterThan(50);
    expect(refused).toBeGreaterThan(50);
  });
});
