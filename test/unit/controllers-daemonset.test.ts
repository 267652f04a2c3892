import { describe, expect, it } from 'vitest';
import { podTemplate, Sim, stored } from '../helpers/controllers-sim.js';

function ds(name: string, spec: Record<string, unknown> = {}, template = podTemplate({ app: name })) {
  return stored('DaemonSet', name, { spec: { selector: { matchLabels: { app: name } }, template, ...spec } });
}

describe('DaemonSet', () => {
  it('runs one pod on this node, named <name>-<suffix>, and reports it', () => {
    const sim = new Sim();
    sim.workloads = [ds('agent')];
    sim.step();
    const names = sim.names('agent');
    expect(names).toHaveLength(1);
    expect(names[0]).toMatch(/^agent-[bcdfghjklmnpqrstvwxz2456789]{5}$/);
    const p = sim.pod(names[0]!);
    expect(p.spec!.nodeName).toBe('node1');
    expect(p.metadata!.ownerReferences![0]).toMatchObject({ kind: 'DaemonSet', name: 'agent', controller: true });
    expect(sim.status('DaemonSet', 'agent').status).toMatchObject({ desiredNumberScheduled: 1, currentNumberScheduled: 1, numberReady: 0, updatedNumberScheduled: 1, numberAvailable: 0 });
    sim.setReady(names[0]!).step();
    sim.step();
    expect(sim.names('agent')).toEqual(names);
    expect(sim.status('DaemonSet', 'agent').status).toMatchObject({ numberReady: 1, numberAvailable: 1, numberUnavailable: 0 });
  });

  it('a template change removes the pod first, then creates the new one', () => {
    const sim = new Sim(2);
    sim.workloads = [ds('agent')];
    sim.step();
    const [old] = sim.names('agent');
    sim.setReady(old!);
    sim.workloads = [ds('agent', {}, podTemplate({ app: 'agent' }, 'agent:2'))];
    sim.step();
    expect(sim.names('agent')).toEqual([]);
    sim.step();
    const [fresh] = sim.names('agent');
    expect(fresh).toBeDefined();
    expect(fresh).not.toBe(old);
    expect(sim.pod(fresh!).spec!.containers[0]!.image).toBe('agent:2');
  });

  it('OnDelete keeps the old pod until it is gone', () => {
    const sim = new Sim(3);
    sim.workloads = [ds('agent', { updateStrategy: { type: 'OnDelete' } })];
    sim.step();
    const [old] = sim.names('agent');
    sim.workloads = [ds('agent', { updateStrategy: { type: 'OnDelete' } }, podTemplate({ app: 'agent' }, 'agent:2'))];
    sim.step();
    expect(sim.names('agent')).toEqual([old]);
    expect(sim.status('DaemonSet', 'agent').status).toMatchObject({ updatedNumberScheduled: 0, currentNumberScheduled: 1 });
    sim.finish(old!, 'Failed').step();
    sim.step();
    expect(sim.pod(sim.names('agent')[0]!).spec!.containers[0]!.image).toBe('agent:2');
  });

  it('replaces a failed pod', () => {
    const sim = new Sim(4);
    sim.workloads = [ds('agent')];
    sim.step();
    const [a] = sim.names('agent');
    sim.finish(a!, 'Failed').step();
    sim.step();
    expect(sim.names('agent')).toHaveLength(1);
    expect(sim.names('agent')[0]).not.toBe(a);
  });

  it('a nodeSelector this node does not match: no pod, desired 0', () => {
    const sim = new Sim(5);
    const t = podTemplate({ app: 'gpu' });
    (t.spec as Record<string, unknown>).nodeSelector = { 'kubernetes.io/hostname': 'other' };
    sim.workloads = [ds('gpu', {}, t)];
    sim.step();
    expect(sim.names('gpu')).toEqual([]);
    expect(sim.status('DaemonSet', 'gpu').status).toMatchObject({ desiredNumberScheduled: 0, currentNumberScheduled: 0 });
    const here = podTemplate({ app: 'here' });
    (here.spec as Record<string, unknown>).nodeSelector = { 'kubernetes.io/hostname': 'node1', 'kubernetes.io/os': 'linux' };
    sim.workloads = [ds('here', {}, here)];
    sim.step();
    expect(sim.names('here')).toHaveLength(1);
  });
});

describe('DaemonSet: maxSurge', () => {
  it('starts the new pod beside the old one and removes the old one once the new one is available', () => {
    const sim = new Sim(6);
    const strategy = { updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } }, minReadySeconds: 10 };
    sim.workloads = [ds('agent', strategy)];
    sim.step();
    const [old] = sim.names('agent');
    sim.setReady(old!);
    sim.workloads = [ds('agent', strategy, podTemplate({ app: 'agent' }, 'agent:2'))];
    sim.step();
    const both = sim.names('agent');
    expect(both).toHaveLength(2);
    const fresh = both.find((n) => n !== old)!;
    expect(sim.status('DaemonSet', 'agent').status).toMatchObject({ currentNumberScheduled: 1, updatedNumberScheduled: 1, numberReady: 1 });
    sim.setReady(fresh).advance(5000).step();
    expect(sim.names('agent').sort()).toEqual([...both].sort()); // not available yet (minReadySeconds)
    sim.advance(5000).step();
    expect(sim.names('agent')).toEqual([fresh]);
    expect(sim.status('DaemonSet', 'agent').status).toMatchObject({ numberAvailable: 1, updatedNumberScheduled: 1 });
  });
});
