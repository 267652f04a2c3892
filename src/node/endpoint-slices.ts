/**
 * The endpoint-slice controller and the endpoints controller, as
 * kube-controller-manager runs them, over the ApiClient: for each Service
 * with a selector, the pods it selects (by the status the node wrote back:
 * podIP, Ready, deletionTimestamp) become discovery.k8s.io/v1
 * EndpointSlices (at most `maxEndpointsPerSlice` endpoints each, one set
 * per distinct port list, since a named targetPort resolves per pod) and
 * one v1 Endpoints. Level-triggered: a change only marks the Services it
 * may touch; a pass reads what is cached and converges. A Service without a
 * selector keeps whatever its user wrote.
 *
 * Pure parts (`desiredSlices`, `desiredEndpoints`) decide; the controller
 * only compares and writes.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { MANAGED_BY_LABEL, SERVICE_NAME_LABEL } from '../api/kinds/endpoints.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import { matchesLabels } from '../labels.js';
import type { Logger } from '../log.js';
import { podReady, resolveTargetPort } from '../proxy/endpoints.js';
import type { Protocol } from '../proxy/service.js';
import { Informer, type CacheChange } from './informer.js';

export const SLICE_CONTROLLER = 'endpointslice-controller.k8s.io';
/** The label kube-controller-manager (1.33 and later) puts on the Endpoints it writes. */
export const ENDPOINTS_MANAGED_BY_LABEL = 'endpoints.kubernetes.io/managed-by';
export const ENDPOINTS_CONTROLLER = 'endpoint-controller';
const HEADLESS_LABEL = 'service.kubernetes.io/headless';
/** As the endpoints controller truncates: at most this many addresses in one Endpoints. */
const MAX_ENDPOINTS_ADDRESSES = 1000;

export interface SlicePort {
  name: string;
  port: number;
  protocol: Protocol;
}

export interface SliceEndpoint {
  addresses: string[];
  conditions: { ready: boolean; serving: boolean; terminating: boolean };
  hostname?: string;
  nodeName?: string;
  targetRef: { kind: 'Pod'; namespace: string; name: string; uid: string };
}

/** One slice's content: its ports and its endpoints (sorted, so equal content compares equal). */
export interface DesiredSlice {
  ports: SlicePort[];
  endpoints: SliceEndpoint[];
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const specOf = (o: ApiObject): Obj => (isObj(o.spec) ? o.spec : {});

/** The equality selector of a Service that has one (an empty selector selects nothing, as upstream). */
export function selectorOf(svc: ApiObject): Record<string, string> | undefined {
  const sel = specOf(svc).selector;
  if (!isObj(sel) || Object.keys(sel).length === 0) return undefined;
  return sel as Record<string, string>;
}

/** Whether the controllers manage this Service's endpoints: it selects pods and is not an ExternalName. */
export function managesEndpoints(svc: ApiObject): boolean {
  return selectorOf(svc) !== undefined && specOf(svc).type !== 'ExternalName';
}

interface ServicePortSpec {
  name: string;
  protocol: Protocol;
  targetPort: number | string;
}

function servicePorts(svc: ApiObject): ServicePortSpec[] {
  const ports = Array.isArray(specOf(svc).ports) ? (specOf(svc).ports as unknown[]) : [];
  return ports.filter(isObj).map((p) => {
    const t = p.targetPort ?? p.port;
    return {
      name: typeof p.name === 'string' ? p.name : '',
      protocol: (typeof p.protocol === 'string' ? p.protocol : 'TCP') as Protocol,
      targetPort: typeof t === 'string' && /^\d+$/.test(t) ? Number(t) : (t as number | string),
    };
  });
}

/** The pods a Service's endpoints come from: selected, with an address, not finished (terminating ones included). */
function candidatePods(svc: ApiObject, pods: Iterable<Pod>): Pod[] {
  const sel = selectorOf(svc);
  if (!sel) return [];
  const ns = svc.metadata.namespace ?? 'default';
  const out: Pod[] = [];
  for (const pod of pods) {
    if ((pod.metadata?.namespace ?? 'default') !== ns || !matchesLabels(sel, pod.metadata?.labels)) continue;
    if (!pod.status?.podIP) continue;
    const phase = pod.status.phase;
    if (phase === 'Succeeded' || phase === 'Failed') continue;
    out.push(pod);
  }
  return out;
}

function portsOf(svc: ApiObject, pod: Pod): SlicePort[] {
  const out: SlicePort[] = [];
  for (const sp of servicePorts(svc)) {
    const port = resolveTargetPort(sp, pod);
    // A pod without the named port has no endpoint for that Service port (as upstream's FindPort).
    if (port !== undefined) out.push({ name: sp.name, port, protocol: sp.protocol });
  }
  return out;
}

function hostnameOf(svc: ApiObject, pod: Pod): string | undefined {
  const h = pod.spec?.hostname;
  return h && pod.spec?.subdomain === svc.metadata.name ? h : undefined;
}

const compareText = (a: string, b: string) => (a < b ? -1 : a > b ? 1 : 0);

/**
 * The slices a Service should have: endpoints grouped by their resolved
 * port list, chunks of `maxPerSlice`. A Service with no endpoints at all
 * gets one empty slice (upstream's placeholder), so it is seen to have none.
 */
export function desiredSlices(svc: ApiObject, pods: Iterable<Pod>, maxPerSlice = 100): DesiredSlice[] {
  const publish = specOf(svc).publishNotReadyAddresses === true;
  const groups = new Map<string, DesiredSlice>();
  for (const pod of candidatePods(svc, pods)) {
    const ports = portsOf(svc, pod);
    const terminating = !!pod.metadata?.deletionTimestamp;
    const serving = publish || podReady(pod);
    const ep: SliceEndpoint = {
      addresses: [pod.status!.podIP!],
      conditions: { ready: publish || (serving && !terminating), serving, terminating },
      targetRef: { kind: 'Pod', namespace: pod.metadata?.namespace ?? 'default', name: pod.metadata?.name ?? '', uid: pod.metadata?.uid ?? '' },
    };
    const hostname = hostnameOf(svc, pod);
    if (hostname) ep.hostname = hostname;
    if (pod.spec?.nodeName) ep.nodeName = pod.spec.nodeName;
    const k = JSON.stringify(ports);
    let g = groups.get(k);
    if (!g) groups.set(k, (g = { ports, endpoints: [] }));
    g.endpoints.push(ep);
  }
  const out: DesiredSlice[] = [];
  for (const k of [...groups.keys()].sort()) {
    const g = groups.get(k)!;
    g.endpoints.sort((a, b) => compareText(a.targetRef.name, b.targetRef.name) || compareText(a.addresses[0]!, b.addresses[0]!));
    for (let i = 0; i < g.endpoints.length; i += maxPerSlice) out.push({ ports: g.ports, endpoints: g.endpoints.slice(i, i + maxPerSlice) });
  }
  if (out.length === 0) out.push({ ports: [], endpoints: [] });
  return out;
}

/**
 * The v1 Endpoints subsets (the endpoints controller's): ready pods as
 * addresses, the others as notReadyAddresses, terminating pods left out
 * unless the Service publishes not-ready addresses; one subset per port
 * list. `truncated` when more than 1,000 addresses had to be cut.
 */
export function desiredEndpoints(svc: ApiObject, pods: Iterable<Pod>): { subsets: Obj[]; truncated: boolean } {
  const publish = specOf(svc).publishNotReadyAddresses === true;
  const groups = new Map<string, { ports: SlicePort[]; ready: Obj[]; notReady: Obj[] }>();
  let count = 0;
  let truncated = false;
  const chosen = candidatePods(svc, pods)
    .filter((p) => publish || !p.metadata?.deletionTimestamp)
    .sort((a, b) => compareText(a.metadata?.name ?? '', b.metadata?.name ?? ''));
  for (const pod of chosen) {
    const ports = portsOf(svc, pod);
    if (ports.length === 0 && servicePorts(svc).length > 0) continue;
    if (count >= MAX_ENDPOINTS_ADDRESSES) {
      truncated = true;
      break;
    }
    count++;
    const addr: Obj = { ip: pod.status!.podIP! };
    const hostname = hostnameOf(svc, pod);
    if (hostname) addr.hostname = hostname;
    if (pod.spec?.nodeName) addr.nodeName = pod.spec.nodeName;
    addr.targetRef = { kind: 'Pod', namespace: pod.metadata?.namespace ?? 'default', name: pod.metadata?.name ?? '', uid: pod.metadata?.uid ?? '' };
    const k = JSON.stringify(ports);
    let g = groups.get(k);
    if (!g) groups.set(k, (g = { ports, ready: [], notReady: [] }));
    (publish || podReady(pod) ? g.ready : g.notReady).push(addr);
  }
  const byIP = (a: Obj, b: Obj) => compareText(String(a.ip), String(b.ip));
  const subsets = [...groups.keys()].sort().map((k) => {
    const g = groups.get(k)!;
    const s: Obj = {};
    if (g.ready.length) s.addresses = g.ready.sort(byIP);
    if (g.notReady.length) s.notReadyAddresses = g.notReady.sort(byIP);
    if (g.ports.length) s.ports = g.ports.map((p) => ({ ...(p.name ? { name: p.name } : {}), port: p.port, protocol: p.protocol }));
    return s;
  });
  return { subsets, truncated };
}

function sliceBody(d: DesiredSlice): Obj {
  return {
    addressType: 'IPv4',
    endpoints: d.endpoints.map((e) => ({
      addresses: e.addresses,
      conditions: e.conditions,
      ...(e.hostname ? { hostname: e.hostname } : {}),
      ...(e.nodeName ? { nodeName: e.nodeName } : {}),
      targetRef: e.targetRef,
    })),
    ports: d.ports.map((p) => ({ name: p.name, port: p.port, protocol: p.protocol })),
  };
}

function ownerRef(svc: ApiObject): Obj {
  return { apiVersion: 'v1', kind: 'Service', name: svc.metadata.name, uid: svc.metadata.uid, controller: true, blockOwnerDeletion: true };
}

/** The Service's own labels, with the ones that say whose slice it is. */
function sliceLabels(svc: ApiObject): Record<string, string> {
  const labels: Record<string, string> = {};
  for (const [k, v] of Object.entries(svc.metadata.labels ?? {})) if (k !== SERVICE_NAME_LABEL && k !== MANAGED_BY_LABEL) labels[k] = v;
  labels[SERVICE_NAME_LABEL] = svc.metadata.name!;
  labels[MANAGED_BY_LABEL] = SLICE_CONTROLLER;
  if (specOf(svc).clusterIP === 'None') labels[HEADLESS_LABEL] = '';
  return labels;
}

/** JSON with sorted keys: the same content compares equal whatever order a write gave it. */
function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (isObj(v)) {
    return `{${Object.keys(v)
      .filter((k) => v[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

const sliceContent = (o: Obj | ApiObject, labels: unknown, owners: unknown): string =>
  canonical({ addressType: o.addressType, endpoints: o.endpoints ?? [], ports: o.ports ?? [], labels, owners });

export interface EndpointSliceControllerOptions {
  client: ApiClient;
  log: Logger;
  /** kube-controller-manager's --max-endpoints-per-slice (default 100). */
  maxEndpointsPerSlice?: number;
}

export class EndpointSliceController {
  private readonly services: Informer;
  private readonly pods: Informer;
  private readonly slices: Informer;
  private readonly endpoints: Informer;
  private readonly dirty = new Set<string>();
  private all = true;
  private running = false;
  private timer: NodeJS.Immediate | undefined;
  private stopped = false;
  private idle: Array<() => void> = [];

  constructor(private readonly o: EndpointSliceControllerOptions) {
    const on = (f: (c: CacheChange) => void) => (c: CacheChange) => {
      if (!c.before && !c.after) this.all = true;
      else f(c);
      this.schedule();
    };
    this.services = new Informer(o.client, 'services', on((c) => this.mark(c.before ?? c.after!)), o.log);
    this.pods = new Informer(o.client, 'pods', on((c) => this.markPods(c)), o.log);
    this.slices = new Informer(
      o.client,
      'endpointslices.discovery.k8s.io',
      on((c) => {
        const o = (c.after ?? c.before)!;
        const svc = o.metadata.labels?.[SERVICE_NAME_LABEL];
        if (svc) this.dirty.add(`${o.metadata.namespace}/${svc}`);
      }),
      o.log,
    );
    this.endpoints = new Informer(o.client, 'endpoints', on((c) => this.mark(c.before ?? c.after!)), o.log);
  }

  async start(): Promise<void> {
    await Promise.all([this.services.start(), this.pods.start(), this.slices.start(), this.endpoints.start()]);
    this.all = true;
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearImmediate(this.timer);
    for (const c of [this.services, this.pods, this.slices, this.endpoints]) c.stop();
  }

  /** Resolves once nothing is left to do (for tests and for an orderly start). */
  settled(): Promise<void> {
    if (!this.running && !this.timer && this.dirty.size === 0 && !this.all) return Promise.resolve();
    return new Promise((r) => this.idle.push(r));
  }

  private mark(o: ApiObject): void {
    this.dirty.add(`${o.metadata.namespace ?? 'default'}/${o.metadata.name}`);
  }

  /** A pod's change touches the Services selecting it before or after. */
  private markPods(c: CacheChange): void {
    const pods = [c.before, c.after].filter((p): p is ApiObject => p !== undefined);
    for (const svc of this.services.list()) {
      const sel = selectorOf(svc);
      if (!sel) continue;
      if (pods.some((p) => p.metadata.namespace === svc.metadata.namespace && matchesLabels(sel, p.metadata.labels))) this.mark(svc);
    }
  }

  private schedule(): void {
    if (this.timer || this.running || this.stopped) return;
    this.timer = setImmediate(() => {
      this.timer = undefined;
      void this.pass();
    });
  }

  private async pass(): Promise<void> {
    if (this.stopped) return;
    this.running = true;
    try {
      const keys = new Set(this.dirty);
      this.dirty.clear();
      if (this.all) {
        this.all = false;
        for (const s of this.services.list()) keys.add(`${s.metadata.namespace}/${s.metadata.name}`);
        for (const s of this.slices.list()) if (s.metadata.labels?.[MANAGED_BY_LABEL] === SLICE_CONTROLLER) keys.add(`${s.metadata.namespace}/${s.metadata.labels[SERVICE_NAME_LABEL]}`);
      }
      for (const k of keys) {
        if (this.stopped) return;
        const [ns, name] = [k.slice(0, k.indexOf('/')), k.slice(k.indexOf('/') + 1)];
        try {
          await this.syncService(ns, name);
        } catch (err) {
          // Conflicts and races with our own earlier writes: the watch brings the truth, and the key again.
          if (!(err instanceof ApiError && (err.reason === 'Conflict' || err.reason === 'NotFound' || err.reason === 'AlreadyExists'))) {
            this.o.log.warn('could not write a Service\'s endpoints', { service: k, error: errorMessage(err) });
          }
          this.dirty.add(k);
        }
      }
    } finally {
      this.running = false;
    }
    if (this.dirty.size > 0 || this.all) {
      // Whatever failed is retried after a pause, not in a tight loop.
      const t = setTimeout(() => this.schedule(), 200);
      t.unref();
      return;
    }
    const idle = this.idle;
    this.idle = [];
    for (const r of idle) r();
  }

  private ownedSlices(ns: string, name: string): ApiObject[] {
    return this.slices
      .list()
      .filter((s) => s.metadata.namespace === ns && s.metadata.labels?.[SERVICE_NAME_LABEL] === name && s.metadata.labels?.[MANAGED_BY_LABEL] === SLICE_CONTROLLER)
      .sort((a, b) => compareText(a.metadata.name ?? '', b.metadata.name ?? ''));
  }

  private async syncService(ns: string, name: string): Promise<void> {
    const svc = this.services.get(ns, name);
    const owned = this.ownedSlices(ns, name);
    if (!svc || !managesEndpoints(svc)) {
      // Gone, or its user keeps its endpoints: ours go (a selector-less Service's own slices stay).
      for (const s of owned) await this.deleteSlice(s);
      const ep = this.endpoints.get(ns, name);
      if (ep && ep.metadata.labels?.[ENDPOINTS_MANAGED_BY_LABEL] === ENDPOINTS_CONTROLLER) await this.o.client.delete('endpoints', ns, name).catch(ignoreNotFound);
      return;
    }
    const pods = this.pods.list() as unknown as Pod[];
    await this.syncSlices(svc, owned, desiredSlices(svc, pods, this.o.maxEndpointsPerSlice ?? 100));
    await this.syncEndpoints(svc, pods);
  }

  private async syncSlices(svc: ApiObject, owned: ApiObject[], desired: DesiredSlice[]): Promise<void> {
    const ns = svc.metadata.namespace!;
    const labels = sliceLabels(svc);
    const owners = [ownerRef(svc)];
    const want = desired.map((d) => ({ body: sliceBody(d), key: '' }));
    for (const w of want) w.key = sliceContent(w.body, labels, owners);
    // Slices already right stay untouched; the others are rewritten in place, then created or deleted.
    const left = [...owned];
    const todo: typeof want = [];
    for (const w of want) {
      const i = left.findIndex((s) => sliceContent(s, s.metadata.labels, s.metadata.ownerReferences) === w.key);
      if (i >= 0) left.splice(i, 1);
      else todo.push(w);
    }
    for (const w of todo) {
      const reuse = left.shift();
      if (reuse) {
        const next = { ...reuse, ...w.body, metadata: { ...reuse.metadata, labels, ownerReferences: owners } };
        await this.o.client.update('endpointslices.discovery.k8s.io', ns, reuse.metadata.name!, next);
      } else {
        const prefix = `${svc.metadata.name!.slice(0, 57)}-`;
        await this.o.client.create('endpointslices.discovery.k8s.io', ns, {
          apiVersion: 'discovery.k8s.io/v1',
          kind: 'EndpointSlice',
          metadata: { generateName: prefix, namespace: ns, labels, ownerReferences: owners },
          ...w.body,
        });
      }
    }
    for (const s of left) await this.deleteSlice(s);
  }

  private async deleteSlice(s: ApiObject): Promise<void> {
    await this.o.client.delete('endpointslices.discovery.k8s.io', s.metadata.namespace!, s.metadata.name!, { uid: s.metadata.uid }).catch(ignoreNotFound);
  }

  private async syncEndpoints(svc: ApiObject, pods: Pod[]): Promise<void> {
    const ns = svc.metadata.namespace!;
    const name = svc.metadata.name!;
    const { subsets, truncated } = desiredEndpoints(svc, pods);
    const labels: Record<string, string> = { ...(svc.metadata.labels ?? {}), [ENDPOINTS_MANAGED_BY_LABEL]: ENDPOINTS_CONTROLLER };
    if (specOf(svc).clusterIP === 'None') labels[HEADLESS_LABEL] = '';
    const annotations: Record<string, string> = truncated ? { 'endpoints.kubernetes.io/over-capacity': 'truncated' } : {};
    const cur = this.endpoints.get(ns, name);
    const body = { subsets, labels, annotations };
    if (cur && canonical({ subsets: cur.subsets ?? [], labels: cur.metadata.labels ?? {}, annotations: cur.metadata.annotations ?? {} }) === canonical(body)) return;
    const metadata = { ...(cur?.metadata ?? {}), name, namespace: ns, labels, annotations };
    if (cur) await this.o.client.update('endpoints', ns, name, { ...cur, metadata, subsets });
    else await this.o.client.create('endpoints', ns, { apiVersion: 'v1', kind: 'Endpoints', metadata, subsets });
  }
}

function ignoreNotFound(err: unknown): void {
  if (!(err instanceof ApiError && err.reason === 'NotFound')) throw err;
}
