/** The one-node scheduler's filters: node affinity and selector, resources fit, gates. */
import { describe, expect, it } from 'vitest';
import { isGated, matchesNodeAffinity, NodeRequests, placementRefusal, podRequests, requestsOn } from '../../src/api/kinds/placement.js';
import type { ApiObject } from '../../src/api/types.js';

const node = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1', labels: { 'kubernetes.io/hostname': 'n1', disktype: 'ssd', generation: '5' } }, spec: {}, status: { allocatable: { cpu: '2', memory: '1Gi', pods: '110' } } } as unknown as ApiObject;
const pod = (spec: Record<string, unknown>, name = 'p', extra: Record<string, unknown> = {}) => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name, uid: name }, spec: { containers: [{ name: 'c', image: 'x' }], ...spec }, ...extra }) as unknown as ApiObject;
const req = (cpu: string, memory?: string) => ({ containers: [{ name: 'c', image: 'x', resources: { requests: { cpu, ...(memory ? { memory } : {}) } } }] });
const affinity = (terms: unknown[]) => ({ affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: terms } } } });

describe('placement', () => {
  it('matches nodeSelector and required node affinity as NodeAffinity does', () => {
    expect(matchesNodeAffinity(node, pod({ nodeSelector: { disktype: 'ssd' } }))).toBe(true);
    expect(matchesNodeAffinity(node, pod({ nodeSelector: { disktype: 'hdd' } }))).toBe(false);
    const expr = (key: string, operator: string, values?: string[]) => affinity([{ matchExpressions: [{ key, operator, ...(values ? { values } : {}) }] }]);
    expect(matchesNodeAffinity(node, pod(expr('disktype', 'In', ['hdd', 'ssd'])))).toBe(true);
    expect(matchesNodeAffinity(node, pod(expr('disktype', 'NotIn', ['ssd'])))).toBe(false);
    expect(matchesNodeAffinity(node, pod(expr('gpu', 'NotIn', ['yes'])))).toBe(true);
    expect(matchesNodeAffinity(node, pod(expr('gpu', 'Exists')))).toBe(false);
    expect(matchesNodeAffinity(node, pod(expr('gpu', 'DoesNotExist')))).toBe(true);
    expect(matchesNodeAffinity(node, pod(expr('generation', 'Gt', ['4'])))).toBe(true);
    expect(matchesNodeAffinity(node, pod(expr('generation', 'Lt', ['4'])))).toBe(false);
    expect(matchesNodeAffinity(node, pod(expr('generation', 'Gt', ['four'])))).toBe(false);
    // Terms are ORed, a term's expressions ANDed; an empty term matches nothing; fields name the node.
    expect(matchesNodeAffinity(node, pod(affinity([{ matchExpressions: [{ key: 'gpu', operator: 'Exists' }] }, { matchFields: [{ key: 'metadata.name', operator: 'In', values: ['n1'] }] }])))).toBe(true);
    expect(matchesNodeAffinity(node, pod(affinity([{}])))).toBe(false);
    expect(matchesNodeAffinity(node, pod(affinity([{ matchExpressions: [{ key: 'disktype', operator: 'In', values: ['ssd'] }, { key: 'gpu', operator: 'Exists' }] }])))).toBe(false);
    expect(placementRefusal(node, pod({ nodeSelector: { disktype: 'hdd' } }))).toBe("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.");
  });

  it('sums requests as the scheduler does and refuses what does not fit the allocatable left', () => {
    expect(podRequests(pod({ ...req('500m', '100Mi'), initContainers: [{ name: 'i', image: 'x', resources: { requests: { cpu: '1', memory: '10Mi' } } }], overhead: { cpu: '10m' } }))).toEqual({ milliCpu: 1010, memory: 100 * 1024 * 1024 });
    const used = requestsOn([pod({ ...req('1500m'), nodeName: 'n1' }, 'a'), pod({ ...req('1'), nodeName: 'n1' }, 'b', { status: { phase: 'Succeeded' } }), pod({ ...req('1'), nodeName: 'other' }, 'c')], 'n1');
    expect(used).toEqual({ milliCpu: 1500, memory: 0 });
    expect(placementRefusal(node, pod(req('500m')), used)).toBeUndefined();
    expect(placementRefusal(node, pod(req('501m')), used)).toBe('0/1 nodes are available: 1 Insufficient cpu.');
    expect(placementRefusal(node, pod(req('1', '2Gi')), used)).toBe('0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.');
    expect(placementRefusal(node, pod(req('100'))), 'no usage given: no resource check').toBeUndefined();
  });

  it('keeps the running sum as pods come, finish and go', () => {
    const t = new NodeRequests('n1');
    const a = pod({ ...req('1'), nodeName: 'n1' }, 'a');
    t.apply({ type: 'ADDED', resource: 'pods', rv: 1, object: a, json: '' });
    t.apply({ type: 'ADDED', resource: 'pods', rv: 2, object: pod({ ...req('1'), nodeName: 'n1' }, 'b'), json: '' });
    t.apply({ type: 'MODIFIED', resource: 'pods', rv: 3, object: { ...a, status: { phase: 'Failed' } }, json: '' });
    expect(t.used.milliCpu).toBe(1000);
    t.apply({ type: 'DELETED', resource: 'pods', rv: 4, object: pod({ ...req('1'), nodeName: 'n1' }, 'b'), json: '' });
    expect(t.used.milliCpu).toBe(0);
  });

  it('knows a gated pod', () => {
    expect(isGated(pod({ schedulingGates: [{ name: 'example.com/wait' }] }))).toBe(true);
    expect(isGated(pod({ schedulingGates: [] }))).toBe(false);
  });
});
