/**
 * authentication.k8s.io SelfSubjectReview, which `kubectl auth whoami`
 * creates: nothing is stored, the answer is the request's own user as the
 * API authenticated it (a client certificate's CN is the user name, its O
 * entries the groups, as kube-apiserver reads x509 credentials). v1 for
 * kubectl 1.28 on, v1beta1 for 1.27.
 */
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import type { Kind } from './types.js';

export const REVIEW_GROUP = 'authentication.k8s.io';
export const REVIEW_VERSIONS = ['v1', 'v1beta1'];

/** What discovery lists for it: create only, cluster-scoped. Not a stored kind, so never in the store. */
export const reviewKinds: Kind[] = REVIEW_VERSIONS.map((version) => ({
  group: REVIEW_GROUP,
  version,
  kind: 'SelfSubjectReview',
  plural: 'selfsubjectreviews',
  singular: 'selfsubjectreview',
  shortNames: [],
  namespaced: false,
  verbs: ['create'],
  validate: () => [],
  known: {},
  columns: [],
  row: () => [],
}));

const list = (v: string | string[] | undefined): string[] => (v === undefined ? [] : Array.isArray(v) ? v : [v]);

export function selfSubjectReview(req: IncomingMessage, version: string): object {
  const subject = (req.socket as TLSSocket).getPeerCertificate().subject ?? {};
  const username = list(subject.CN)[0] ?? '';
  const groups = [...list(subject.O), 'system:authenticated'];
  return { kind: 'SelfSubjectReview', apiVersion: `${REVIEW_GROUP}/${version}`, metadata: { creationTimestamp: null }, status: { userInfo: { username, groups } } };
}
