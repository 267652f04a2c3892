/** `skiff node`'s --node-labels and --register-with-taints, parsed and checked as the kubelet's flags are. */
import { describe, expect, it } from 'vitest';
import { parseNodeLabels, parseTaints } from '../../src/node/node-status.js';

describe('--node-labels', () => {
  it('takes key=value pairs, comma-separated and repeated, empty values included', () => {
    expect(parseNodeLabels(['tier=edge,node-role.kubernetes.io/worker=', 'zone=a'])).toEqual({ tier: 'edge', 'node-role.kubernetes.io/worker': '', zone: 'a' });
    expect(parseNodeLabels([])).toEqual({});
  });
  it('refuses what is not a label', () => {
    expect(() => parseNodeLabels(['tier'])).toThrow('--node-labels takes key=value pairs, not "tier"');
    expect(() => parseNodeLabels(['bad key=x'])).toThrow(/^--node-labels: /);
  });

  it("limits the kubernetes.io and k8s.io namespaces as the kubelet does, node-role included", () => {
    expect(parseNodeLabels(['topology.kubernetes.io/zone=z1,node.kubernetes.io/exclude-from-external-load-balancers=,kubelet.kubernetes.io/x=1,node-role.kubernetes.io/edge=,example.com/k8s.io=y'])).toEqual({
      'topology.kubernetes.io/zone': 'z1',
      'node.kubernetes.io/exclude-from-external-load-balancers': '',
      'kubelet.kubernetes.io/x': '1',
      'node-role.kubernetes.io/edge': '',
      'example.com/k8s.io': 'y',
    });
    expect(() => parseNodeLabels(['kubernetes.io/role=master'])).toThrow("--node-labels: unknown 'kubernetes.io' or 'k8s.io' labels: kubernetes.io/role;");
    expect(() => parseNodeLabels(['node-restriction.kubernetes.io/pool=a,x.k8s.io/y=1'])).toThrow(/labels: node-restriction\.kubernetes\.io\/pool, x\.k8s\.io\/y;/);
    expect(() => parseNodeLabels(['a.kubernetes.io/hostname=h'])).toThrow(/labels: a\.kubernetes\.io\/hostname;/);
    expect(() => parseNodeLabels(['k=not ok'])).toThrow(/a valid label must be/);
  });
});

describe('--register-with-taints', () => {
  it('takes key=value:Effect and key:Effect', () => {
    expect(parseTaints(['dedicated=batch:NoSchedule,gpu:NoExecute', 'soft=x:PreferNoSchedule'])).toEqual([
      { key: 'dedicated', value: 'batch', effect: 'NoSchedule' },
      { key: 'gpu', effect: 'NoExecute' },
      { key: 'soft', value: 'x', effect: 'PreferNoSchedule' },
    ]);
  });
  it('refuses a bad effect, a missing one, a bad key or a repeat', () => {
    expect(() => parseTaints(['a=b:Sometimes'])).toThrow(/Effect one of NoSchedule, PreferNoSchedule, NoExecute, not "a=b:Sometimes"/);
    expect(() => parseTaints(['a=b'])).toThrow(/not "a=b"/);
    expect(() => parseTaints(['bad key:NoSchedule'])).toThrow(/^--register-with-taints "bad key:NoSchedule": /);
    expect(() => parseTaints(['a:NoSchedule,a=x:NoSchedule'])).toThrow('--register-with-taints names a:NoSchedule twice');
  });
});
