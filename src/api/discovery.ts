/**
 * Discovery as kubectl reads it: the legacy documents (/api, /api/v1,
 * /apis) and the aggregated one (apidiscovery.k8s.io v2, or v2beta1 for the
 * kubectl releases that ask for it) when the Accept header asks.
 */
import type { Kind } from './types.js';

const VERBS = ['create', 'delete', 'deletecollection', 'get', 'list', 'patch', 'update', 'watch'];

export function apiVersions(serverAddress: string): object {
  return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [{ clientCIDR: '0.0.0.0/0', serverAddress }] };
}

export function groupList(): object {
  return { kind: 'APIGroupList', apiVersion: 'v1', groups: [] };
}

export function resourceList(kinds: Kind[], groupVersion: string): object {
  return {
    kind: 'APIResourceList',
    apiVersion: 'v1',
    groupVersion,
    resources: kinds.map((k) => ({
      name: k.plural,
      singularName: k.singular,
      namespaced: k.namespaced,
      kind: k.kind,
      verbs: VERBS,
      ...(k.shortNames.length > 0 ? { shortNames: k.shortNames } : {}),
      storageVersionHash: '',
    })),
  };
}

/** The aggregated discovery version an Accept header asks for, in the client's order of preference. */
export function aggregatedVersion(accept: string | undefined): 'v2' | 'v2beta1' | undefined {
  for (const part of (accept ?? '').split(',')) {
    const params = new Map(
      part
        .split(';')
        .slice(1)
        .map((p) => p.trim().split('=') as [string, string]),
    );
    if (params.get('g') === 'apidiscovery.k8s.io' && params.get('as') === 'APIGroupDiscoveryList') {
      const v = params.get('v');
      if (v === 'v2' || v === 'v2beta1') return v;
    }
  }
  return undefined;
}

/** /api (core, `core`) or /apis (the named groups; none yet) as one aggregated document. */
export function aggregated(kinds: Kind[], version: 'v2' | 'v2beta1', core: boolean): object {
  const items = core
    ? [
        {
          metadata: { creationTimestamp: null },
          versions: [
            {
              version: 'v1',
              freshness: 'Current',
              resources: kinds.map((k) => ({
                resource: k.plural,
                responseKind: { group: '', version: 'v1', kind: k.kind },
                scope: k.namespaced ? 'Namespaced' : 'Cluster',
                singularResource: k.singular,
                verbs: VERBS,
                ...(k.shortNames.length > 0 ? { shortNames: k.shortNames } : {}),
              })),
            },
          ],
        },
      ]
    : [];
  return { kind: 'APIGroupDiscoveryList', apiVersion: `apidiscovery.k8s.io/${version}`, metadata: {}, items };
}
