/** The controllers' adoption and release plan (src/node/adoption.ts), as kube-controller-manager's controllers claim what they select. */
import { describe, expect, it } from 'vitest';
import { isStatefulSetMember, planOwnership, selectorOf } from '../../src/node/adoption.js';
import type { ApiObject } from '../../src/api/types.js';

const rs = (name: string, uid: string, app: string, created = '2026-12-01T00:00:00Z', extra: Partial<ApiObject['metadata']> = {}): ApiObject => ({
  apiVersion: 'apps/v1', kind: 'ReplicaSet', metadata: { name, namespace: 'default', uid, creationTimestamp: created, ...extra }, spec: { selector: { matchLabels: { app } } },
});
const pod = (name: string, labels: Record<string, string>, owner?: { kind: string; name: string; uid: string }, extra: Partial<ApiObject['metadata']> = {}): ApiObject => ({
  apiVersion: 'v1', kind: 'Pod', metadata: { name, namespace: 'default', uid: `pod-${name}`, labels, ...(owner ? { ownerReferences: [{ apiVersion: 'apps/v1', ...owner, controller: true }] } : {}), ...extra },
});
const claim = (...os: ApiObject[]) => os.map((object) => ({ object, selector: selectorOf(object) }));

describe('planOwnership', () => {
  it('adopts an orphan the selector matches, with a controller reference that blocks its owner\'s deletion', () => {
    const out = planOwnership(claim(rs('web', 'u1', 'web')), [pod('a', { app: 'web' }), pod('b', { app: 'other' })]);
    expect(out).toHaveLength(1);
    expect(out[0]).toMatchObject({ change: 'adopt', object: { metadata: { name: 'a' } } });
    expect(out[0]!.ownerReferences).toEqual([{ apiVersion: 'apps/v1', kind: 'ReplicaSet', name: 'web', uid: 'u1', controller: true, blockOwnerDeletion: true }]);
  });

  it('releases what its controller no longer selects, keeping other references', () => {
    const p = pod('a', { app: 'debug' }, { kind: 'ReplicaSet', name: 'web', uid: 'u1' });
    p.metadata.ownerReferences = [...(p.metadata.ownerReferences as Array<Record<string, unknown>>), { apiVersion: 'v1', kind: 'ConfigMap', name: 'keep', uid: 'c1' }];
    const out = planOwnership(claim(rs('web', 'u1', 'web')), [p, pod('b', { app: 'web' }, { kind: 'ReplicaSet', name: 'web', uid: 'u1' })]);
    expect(out).toEqual([expect.objectContaining({ change: 'release', ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'keep', uid: 'c1' }] })]);
  });

  it('leaves alone what is being deleted, what a deleting controller owns or could adopt, other controllers\' objects and other namespaces', () => {
    const going = rs('old', 'u0', 'web', '2026-11-01T00:00:00Z', { deletionTimestamp: '2026-12-01T00:00:00Z' });
    const deps = [
      pod('dying', { app: 'web' }, undefined, { deletionTimestamp: '2026-12-01T00:00:00Z' }),
      pod('held', { app: 'moved' }, { kind: 'ReplicaSet', name: 'old', uid: 'u0' }),
      pod('job', { app: 'web' }, { kind: 'Job', name: 'j', uid: 'j1' }),
      { ...pod('elsewhere', { app: 'web' }), metadata: { ...pod('elsewhere', { app: 'web' }).metadata, namespace: 'other' } },
    ];
    expect(planOwnership(claim(going, rs('web', 'u1', 'web')), deps)).toEqual([]);
  });

  it('gives an orphan two controllers match to the older, and an empty selector takes nothing', () => {
    const out = planOwnership(claim(rs('young', 'u2', 'web', '2026-12-02T00:00:00Z'), rs('old', 'u1', 'web', '2026-12-01T00:00:00Z')), [pod('a', { app: 'web' })]);
    expect(out[0]!.controller.metadata.name).toBe('old');
    const empty: ApiObject = { ...rs('all', 'u3', 'x'), spec: { selector: {} } };
    expect(planOwnership(claim(empty), [pod('a', { app: 'web' })])).toEqual([]);
  });

  it('reads a ReplicationController\'s map selector', () => {
    const rc: ApiObject = { apiVersion: 'v1', kind: 'ReplicationController', metadata: { name: 'rc', namespace: 'default', uid: 'r1' }, spec: { selector: { app: 'web' } } };
    expect(planOwnership(claim(rc), [pod('a', { app: 'web' })])[0]!.ownerReferences[0]).toMatchObject({ apiVersion: 'v1', kind: 'ReplicationController', uid: 'r1' });
  });

  it('lets a StatefulSet claim only pods named as its members, and release one it holds that is not', () => {
    const set: ApiObject = { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 'web', namespace: 'default', uid: 's1' }, spec: { selector: { matchLabels: { app: 'web' } } } };
    expect([isStatefulSetMember(set, pod('web-0', {})), isStatefulSetMember(set, pod('web-12', {})), isStatefulSetMember(set, pod('web-x', {})), isStatefulSetMember(set, pod('web', {})), isStatefulSetMember(set, pod('webby-0', {})), isStatefulSetMember(set, pod('a-web-0', {}))]).toEqual([true, true, false, false, false, false]);
    const claimant = { object: set, selector: selectorOf(set), accepts: (p: ApiObject) => isStatefulSetMember(set, p) };
    const out = planOwnership([claimant], [pod('web-1', { app: 'web' }), pod('debug', { app: 'web' }), pod('held', { app: 'web' }, { kind: 'StatefulSet', name: 'web', uid: 's1' })]);
    expect(out.map((c) => `${c.change} ${c.object.metadata.name}`)).toEqual(['adopt web-1', 'release held']);
  });
});
