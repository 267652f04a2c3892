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

/** One named group as /apis/<group> and the legacy group list show it: its versions, the first preferred. */
export function groupOf(group: string, versions: string[]): object {
  const gv = (v: string) => ({ groupVersion: `${group}/${v}`, version: v });
  return { name: group, versions: versions.map(gv), preferredVersion: gv(versions[0]!) };
}

/** The named groups of the served kinds, in the order the kinds are listed. */
function groupsOf(kinds: Kind[]): Map<string, string[]> {
  const groups = new Map<string, string[]>();
  for (const k of kinds) {
    if (!k.group) continue;
    const vs = groups.get(k.group) ?? [];
    if (!vs.includes(k.version)) vs.push(k.version);
    groups.set(k.group, vs);
  }
  return groups;
}

export function groupList(kinds: Kind[]): object {
  return { kind: 'APIGroupList', apiVersion: 'v1', groups: [...groupsOf(kinds)].map(([g, vs]) => groupOf(g, vs)) };
}

/** A kind's subresources beyond its own verbs (status, scale, pods/log…), each with the verbs it takes. */
export type Subresources = Record<string, { kind: string; verbs: string[]; group?: string; version?: string }>;

export function resourceList(kinds: Kind[], groupVersion: string, subresources: (k: Kind) => Subresources = () => ({})): object {
  return {
    kind: 'APIResourceList',
    apiVersion: 'v1',
    groupVersion,
    resources: kinds.flatMap((k) => [
      {
        name: k.plural,
        singularName: k.singular,
        namespaced: k.namespaced,
        kind: k.kind,
        verbs: k.verbs ?? VERBS,
        ...(k.shortNames.length > 0 ? { shortNames: k.shortNames } : {}),
        ...(k.categories ? { categories: k.categories } : {}),
        storageVersionHash: '',
      },
      ...Object.entries(subresources(k)).map(([sub, s]) => ({
        name: `${k.plural}/${sub}`,
        singularName: '',
        namespaced: k.namespaced,
        ...(s.group !== undefined ? { group: s.group, version: s.version } : {}),
        kind: s.kind,
        verbs: s.verbs,
      })),
    ]),
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

/** /api (the core group, `core`) or /apis (the named groups) as one aggregated document. */
export function aggregated(kinds: Kind[], version: 'v2' | 'v2beta1', core: boolean, subresources: (k: Kind) => Subresources = () => ({})): object {
  const resource = (k: Kind) => ({
    resource: k.plural,
    responseKind: { group: k.group, version: k.version, kind: k.kind },
    scope: k.namespaced ? 'Namespaced' : 'Cluster',
    singularResource: k.singular,
    verbs: k.verbs ?? VERBS,
    ...(k.shortNames.length > 0 ? { shortNames: k.shortNames } : {}),
    ...(k.categories ? { categories: k.categories } : {}),
    ...(Object.keys(subresources(k)).length > 0
      ? { subresources: Object.entries(subresources(k)).map(([sub, s]) => ({ subresource: sub, responseKind: { group: s.group ?? k.group, version: s.version ?? k.version, kind: s.kind }, verbs: s.verbs })) }
      : {}),
  });
  const groups = core ? new Map([['', ['v1']]]) : groupsOf(kinds);
  const items = [...groups].map(([group, versions]) => ({
    metadata: { creationTimestamp: null, ...(group ? { name: group } : {}) },
    versions: versions.map((v) => ({ version: v, freshness: 'Current', resources: kinds.filter((k) => k.group === group && k.version === v).map(resource) })),
  }));
  return { kind: 'APIGroupDiscoveryList', apiVersion: `apidiscovery.k8s.io/${version}`, metadata: {}, items };
}
