/**
 * metrics.k8s.io/v1beta1, as metrics-server serves it through the
 * aggregator: NodeMetrics and PodMetrics (get and list, label selectors on
 * lists), read-only, from the node's own stats (the same summary as the
 * status API's /stats/summary), so `kubectl top nodes` and `kubectl top
 * pods --containers` work with no metrics-server. Not stored: each request
 * takes the stats as they are.
 */
import type { IncomingMessage } from 'node:http';
import { ApiError } from './errors.js';
import { parseLabelSelector } from './selectors.js';
import type { Kind } from './types.js';

export const METRICS_GROUP = 'metrics.k8s.io';
export const METRICS_VERSION = 'v1beta1';

export interface Usage {
  /** Cores used now, in nanocores. */
  nanoCores: number;
  /** Working set bytes. */
  workingSetBytes: number;
}

export interface MetricsSnapshot {
  nodes: Array<{ name: string; labels?: Record<string, string>; timestamp: string; windowSeconds: number; usage: Usage }>;
  pods: Array<{ namespace: string; name: string; labels?: Record<string, string>; timestamp: string; windowSeconds: number; containers: Array<{ name: string; usage: Usage }> }>;
}

/** Where the numbers come from; undefined while the agent is not up yet. */
export type MetricsSource = () => Promise<MetricsSnapshot | undefined>;

const kind = (k: string, plural: string, singular: string, namespaced: boolean): Kind => ({
  group: METRICS_GROUP,
  version: METRICS_VERSION,
  kind: k,
  plural,
  singular,
  shortNames: [],
  namespaced,
  verbs: ['get', 'list'],
  validate: () => [],
  known: {},
  columns: [],
  row: () => [],
});

/** What discovery lists: not stored kinds, so never in the store. */
export const metricsKinds: Kind[] = [kind('NodeMetrics', 'nodes', '', false), kind('PodMetrics', 'pods', '', true)];

const apiVersion = `${METRICS_GROUP}/${METRICS_VERSION}`;

function quantities(u: Usage): { cpu: string; memory: string } {
  const n = Math.max(0, Math.round(u.nanoCores));
  const b = Math.max(0, Math.round(u.workingSetBytes));
  return { cpu: `${n}n`, memory: b % 1024 === 0 ? `${b / 1024}Ki` : String(b) };
}

const windowOf = (s: number) => `${Number(s.toFixed(3))}s`;

function nodeMetrics(n: MetricsSnapshot['nodes'][number]): object {
  return { kind: 'NodeMetrics', apiVersion, metadata: { name: n.name, creationTimestamp: n.timestamp, ...(n.labels ? { labels: n.labels } : {}) }, timestamp: n.timestamp, window: windowOf(n.windowSeconds), usage: quantities(n.usage) };
}

function podMetrics(p: MetricsSnapshot['pods'][number]): object {
  return {
    kind: 'PodMetrics',
    apiVersion,
    metadata: { name: p.name, namespace: p.namespace, creationTimestamp: p.timestamp, ...(p.labels ? { labels: p.labels } : {}) },
    timestamp: p.timestamp,
    window: windowOf(p.windowSeconds),
    containers: p.containers.map((c) => ({ name: c.name, usage: quantities(c.usage) })),
  };
}

const notFound = (what: string, name: string) => new ApiError('NotFound', `${what} "${name}" not found`, { name, group: METRICS_GROUP, kind: what === 'nodemetrics' ? 'nodes' : 'pods' });

/**
 * Answers a request under /apis/metrics.k8s.io (segs: the path's segments,
 * `apis` first): the status code and body.
 */
export async function metricsRequest(req: IncomingMessage, segs: string[], url: URL, source: MetricsSource | undefined): Promise<{ code: number; body: object }> {
  if (req.method !== 'GET' && req.method !== 'HEAD') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
  if (segs.length === 2) return { code: 200, body: { kind: 'APIGroup', apiVersion: 'v1', name: METRICS_GROUP, versions: [{ groupVersion: apiVersion, version: METRICS_VERSION }], preferredVersion: { groupVersion: apiVersion, version: METRICS_VERSION } } };
  if (segs[2] !== METRICS_VERSION) throw new ApiError('NotFound', 'the server could not find the requested resource');
  const rest = segs.slice(3);
  if (rest.length === 0) {
    const resources = metricsKinds.map((k) => ({ name: k.plural, singularName: k.singular, namespaced: k.namespaced, kind: k.kind, verbs: k.verbs }));
    return { code: 200, body: { kind: 'APIResourceList', apiVersion: 'v1', groupVersion: apiVersion, resources } };
  }
  let namespace: string | undefined;
  let parts = rest;
  if (parts[0] === 'namespaces' && parts.length >= 3) {
    namespace = parts[1]!;
    parts = parts.slice(2);
  }
  const [resource, name, ...more] = parts;
  if (more.length || (resource !== 'nodes' && resource !== 'pods') || (resource === 'nodes' && namespace !== undefined)) throw new ApiError('NotFound', 'the server could not find the requested resource');
  const selector = parseLabelSelector(url.searchParams.get('labelSelector') ?? undefined);
  if (url.searchParams.has('watch') && url.searchParams.get('watch') !== 'false') throw new ApiError('MethodNotAllowed', 'the server does not allow this method on the requested resource');
  const snap = await source?.();
  if (!snap) throw new ApiError('ServiceUnavailable', 'the node agent is not running yet: no metrics');
  if (resource === 'nodes') {
    if (name !== undefined) {
      const n = snap.nodes.find((x) => x.name === name);
      if (!n) throw notFound('nodemetrics', name);
      return { code: 200, body: nodeMetrics(n) };
    }
    return { code: 200, body: { kind: 'NodeMetricsList', apiVersion, metadata: {}, items: snap.nodes.filter((n) => selector(n.labels)).map(nodeMetrics) } };
  }
  if (name !== undefined) {
    const p = snap.pods.find((x) => x.name === name && x.namespace === (namespace ?? ''));
    if (!p) throw notFound('podmetrics', name);
    return { code: 200, body: podMetrics(p) };
  }
  const items = snap.pods.filter((p) => (namespace === undefined || p.namespace === namespace) && selector(p.labels)).sort((a, b) => `${a.namespace}/${a.name}`.localeCompare(`${b.namespace}/${b.name}`));
  return { code: 200, body: { kind: 'PodMetricsList', apiVersion, metadata: {}, items: items.map(podMetrics) } };
}
