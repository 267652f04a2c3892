/**
 * authorization.k8s.io/v1 SelfSubjectAccessReview and SelfSubjectRulesReview,
 * which `kubectl auth can-i` creates: nothing is stored. The node's API has
 * one credential, in system:masters, which a cluster's authorizer allows
 * everything; so every question is answered yes, and the rules are all of them.
 */
import type { Obj, Kind } from './types.js';

export const ACCESS_GROUP = 'authorization.k8s.io';
export const ACCESS_VERSION = 'v1';
const apiVersion = `${ACCESS_GROUP}/${ACCESS_VERSION}`;

const review = (kind: string, plural: string): Kind => ({
  group: ACCESS_GROUP,
  version: ACCESS_VERSION,
  kind,
  plural,
  singular: plural.slice(0, -1),
  shortNames: [],
  namespaced: false,
  verbs: ['create'],
  validate: () => [],
  known: {},
  columns: [],
  row: () => [],
});

/** What discovery lists: create only. Not stored kinds, so never in the store. */
export const accessReviewKinds: Kind[] = [review('SelfSubjectAccessReview', 'selfsubjectaccessreviews'), review('SelfSubjectRulesReview', 'selfsubjectrulesreviews')];

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The answer to a review of `plural`, its spec as the client sent it. */
export function accessReview(plural: string, body: unknown): object {
  const spec = isObj(body) && isObj(body.spec) ? body.spec : {};
  const meta = { creationTimestamp: null };
  if (plural === 'selfsubjectaccessreviews') {
    return { kind: 'SelfSubjectAccessReview', apiVersion, metadata: meta, spec, status: { allowed: true, reason: 'the node API\'s one credential is in system:masters' } };
  }
  return {
    kind: 'SelfSubjectRulesReview',
    apiVersion,
    metadata: meta,
    spec,
    status: { resourceRules: [{ verbs: ['*'], apiGroups: ['*'], resources: ['*'] }], nonResourceRules: [{ verbs: ['*'], nonResourceURLs: ['*'] }], incomplete: false },
  };
}
