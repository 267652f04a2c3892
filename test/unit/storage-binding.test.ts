/**
 * The PV controller's pure decisions: which volume a claim binds to, which
 * claims a pod needs, a volume's phase from its claim, node affinity.
 */
import { describe, expect, it } from 'vitest';
import type { ApiObject, Obj } from '../../src/api/types.js';
import { bestVolume, fitsNode, mismatch, podClaims, volumePhase } from '../../src/node/storage-binding.js';

const claim = (spec: Obj = {}, meta: Obj = {}): ApiObject => ({ apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name: 'c', namespace: 'ns', uid: 'u1', ...meta }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } }, storageClassName: 'manual', ...spec } });
const pv = (name: string, spec: Obj = {}, extra: Obj = {}): ApiObject => ({ apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name, ...((extra.metadata as Obj) ?? {}) }, spec: { accessModes: ['ReadWriteOnce'], capacity: { storage: '5Gi' }, storageClassName: 'manual', hostPath: { path: '/srv' }, ...spec }, status: { phase: 'Available', ...((extra.status as Obj) ?? {}) } });
const node = { 'kubernetes.io/hostname': 'n1', zone: 'a' };
const onNode = (n: string) => ({ required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: [n] }] }] } });

describe('bestVolume', () => {
  it('takes the smallest volume that fits, by class, access modes, size, mode, selector and node', () => {
    const pvs = [
      pv('huge', { capacity: { storage: '100Gi' } }),
      pv('small', { capacity: { storage: '512Mi' } }),
      pv('just', { capacity: { storage: '1Gi' } }),
      pv('other-class', { capacity: { storage: '1Gi' }, storageClassName: 'fast' }),
      pv('ro', { capacity: { storage: '1Gi' }, accessModes: ['ReadOnlyMany'] }),
      pv('block', { capacity: { storage: '1Gi' }, volumeMode: 'Block' }),
      pv('elsewhere', { capacity: { storage: '1Gi' }, nodeAffinity: onNode('n2') }),
    ];
    expect(bestVolume(claim(), pvs, node)?.metadata.name).toBe('just');
    expect(bestVolume(claim(), pvs.filter((p) => p.metadata.name !== 'just'), node)?.metadata.name).toBe('huge');
    expect(mismatch(pvs[1]!, claim(), node)).toBe('is too small');
    expect(mismatch(pvs[3]!, claim(), node)).toBe('is of class "fast"');
    expect(mismatch(pvs[4]!, claim(), node)).toBe('has no access mode ReadWriteOnce');
    expect(mismatch(pvs[5]!, claim(), node)).toBe('has volume mode Block');
    expect(mismatch(pvs[6]!, claim(), node)).toBe('is for another node');
    const labelled = pv('labelled', {}, { metadata: { labels: { tier: 'gold' } } });
    expect(bestVolume(claim({ selector: { matchLabels: { tier: 'gold' } } }), [pv('plain'), labelled], node)?.metadata.name).toBe('labelled');
  });

  it('never takes a volume bound to another claim, Released or Failed, and prefers one pre-bound to the claim', () => {
    const taken = pv('taken', { capacity: { storage: '1Gi' }, claimRef: { namespace: 'ns', name: 'other', uid: 'u2' } });
    const released = pv('released', { capacity: { storage: '1Gi' } }, { status: { phase: 'Released' } });
    const prebound = pv('prebound', { capacity: { storage: '50Gi' }, claimRef: { namespace: 'ns', name: 'c' } });
    expect(bestVolume(claim(), [taken, released], node)).toBeUndefined();
    expect(bestVolume(claim(), [taken, released, pv('free'), prebound], node)?.metadata.name).toBe('prebound');
    // A claimRef naming the claim but another uid (an earlier claim of that name) is someone else's.
    expect(bestVolume(claim(), [pv('old', { claimRef: { namespace: 'ns', name: 'c', uid: 'u0' } })], node)).toBeUndefined();
  });

  it('binds a claim that names its volume to that one only, whatever class it has', () => {
    expect(bestVolume(claim({ volumeName: 'mine', storageClassName: '' }), [pv('mine', { storageClassName: 'x' }), pv('other')], node)?.metadata.name).toBe('mine');
    expect(bestVolume(claim({ volumeName: 'mine' }), [pv('mine', { capacity: { storage: '1Mi' } })], node)).toBeUndefined();
  });
});

describe('fitsNode', () => {
  it('ORs terms and ANDs expressions; In, NotIn, Exists, DoesNotExist, Gt, Lt', () => {
    const a = (exprs: Obj[]) => pv('p', { nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: exprs }] } } });
    expect(fitsNode(pv('p'), node)).toBe(true);
    expect(fitsNode(a([{ key: 'zone', operator: 'In', values: ['a', 'b'] }, { key: 'kubernetes.io/hostname', operator: 'Exists' }]), node)).toBe(true);
    expect(fitsNode(a([{ key: 'zone', operator: 'NotIn', values: ['a'] }]), node)).toBe(false);
    expect(fitsNode(a([{ key: 'gpu', operator: 'DoesNotExist' }]), node)).toBe(true);
    expect(fitsNode(a([{ key: 'zone', operator: 'Gt', values: ['1'] }]), node)).toBe(false);
    expect(fitsNode(pv('p', { nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'zone', operator: 'In', values: ['z'] }] }, { matchExpressions: [{ key: 'zone', operator: 'In', values: ['a'] }] }] } } }), node)).toBe(true);
    expect(fitsNode(pv('p', { nodeAffinity: { required: { nodeSelectorTerms: [{}] } } }), node)).toBe(false);
  });
});

describe('podClaims and volumePhase', () => {
  it('names a pod\'s claims, an ephemeral volume\'s as <pod>-<volume>', () => {
    const pod: ApiObject = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'web' }, spec: { volumes: [{ name: 'a', persistentVolumeClaim: { claimName: 'data' } }, { name: 'scratch', ephemeral: { volumeClaimTemplate: { spec: {} } } }, { name: 'e', emptyDir: {} }] } };
    expect(podClaims(pod)).toEqual([{ volume: 'a', claim: 'data', ephemeral: false }, { volume: 'scratch', claim: 'web-scratch', ephemeral: true }]);
  });

  it('Available with no claim or a pre-bound one, Bound to the claim of its uid, Released once that claim is gone', () => {
    const c = claim();
    expect(volumePhase(pv('p'), undefined)).toBe('Available');
    expect(volumePhase(pv('p', { claimRef: { namespace: 'ns', name: 'c' } }), c)).toBe('Available');
    expect(volumePhase(pv('p', { claimRef: { namespace: 'ns', name: 'c', uid: 'u1' } }), c)).toBe('Bound');
    expect(volumePhase(pv('p', { claimRef: { namespace: 'ns', name: 'c', uid: 'u1' } }), undefined)).toBe('Released');
    expect(volumePhase(pv('p', { claimRef: { namespace: 'ns', name: 'c', uid: 'u1' } }), claim({}, { uid: 'u9' }))).toBe('Released');
    expect(volumePhase(pv('p', { claimRef: { namespace: 'ns', name: 'c', uid: 'u1' } }, { status: { phase: 'Failed' } }), undefined)).toBe('Failed');
  });
});
