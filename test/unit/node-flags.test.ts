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
