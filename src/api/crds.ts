/**
 * apiextensions.k8s.io/v1 CustomResourceDefinitions, as a node without
 * custom resources answers for them: discovery names the resource, a list is
 * empty, a get is NotFound, and a write is refused saying why. Clients ask
 * before they act: kubectl's validation lists CRDs when it meets a kind it
 * does not know (an Ingress, an extensions/v1beta1 Deployment), and without
 * this group it stopped with "failed to list CRDs" instead of the API's own
 * "no matches for kind" answer.
 */
import type { IncomingMessage } from 'node:http';
import { ApiError, notFound } from './errors.js';
import { toTable, wantsTable } from './table.js';
import type { Kind } from './types.js';
import { nameColumn } from './kinds/common.js';

export const CRD_GROUP = 'apiextensions.k8s.io';
const VERSION = 'v1';
const apiVersion = `${CRD_GROUP}/${VERSION}`;

export const crdKind: Kind = {
  group: CRD_GROUP,
  version: VERSION,
  kind: 'CustomResourceDefinition',
  plural: 'customresourcedefinitions',
  singular: 'customresourcedefinition',
  shortNames: ['crd', 'crds'],
  categories: ['api-extensions'],
  namespaced: false,
  verbs: ['get', 'list'],
  validate: () => [],
  known: {},
  columns: [nameColumn, { name: 'Created At', type: 'date' }],
  row: () => [],
};

/** The answer to a request under /apis/apiextensions.k8s.io; `resourceVersion` is the store's, for a list. */
export function crdRequest(req: IncomingMessage, segs: string[], resourceVersion: string): { code: number; body: object; table?: boolean } {
  const method = req.method ?? 'GET';
  if (segs.length === 2) return { code: 200, body: { kind: 'APIGroup', apiVersion: 'v1', name: CRD_GROUP, versions: [{ groupVersion: apiVersion, version: VERSION }], preferredVersion: { groupVersion: apiVersion, version: VERSION } } };
  if (segs[2] !== VERSION) throw new ApiError('NotFound', 'the server could not find the requested resource');
  if (segs.length === 3) {
    const k = crdKind;
    return { code: 200, body: { kind: 'APIResourceList', apiVersion: 'v1', groupVersion: apiVersion, resources: [{ name: k.plural, singularName: k.singular, namespaced: false, kind: k.kind, verbs: k.verbs, shortNames: k.shortNames, categories: k.categories }] } };
  }
  if (segs[3] !== crdKind.plural || segs.length > 5) throw new ApiError('NotFound', 'the server could not find the requested resource');
  if (method !== 'GET' && method !== 'HEAD') {
    req.resume();
    throw new ApiError('MethodNotAllowed', 'this node serves no custom resources: CustomResourceDefinitions cannot be created or changed here');
  }
  if (new URL(req.url ?? '/', 'https://node').searchParams.get('watch') === 'true') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
  if (segs.length === 5) throw notFound(crdKind.plural, segs[4]!, CRD_GROUP);
  if (wantsTable(req.headers.accept)) return { code: 200, body: toTable(crdKind, [], { resourceVersion }, 'Metadata', Date.now()), table: true };
  return { code: 200, body: { kind: 'CustomResourceDefinitionList', apiVersion, metadata: { resourceVersion }, items: [] } };
}
