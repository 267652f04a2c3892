/**
 * Endpoints, computed purely from Services and pods as the EndpointSlice
 * controller and kube-proxy would: the pods in the Service's namespace whose
 * labels match its selector, serving only when Ready (unless the Service
 * publishes not-ready addresses), with each targetPort resolved against that
 * pod. A pod being deleted that is still Ready is a serving, terminating
 * endpoint: used only while the Service port has no ready one, so the
 * connections to the last replica of a rolling update keep working through
 * its grace period (kube-proxy's ProxyTerminatingEndpoints).
 */
import type { EndpointSlice } from 'kubernetes-types/discovery/v1.js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { ServiceInfo, ServicePortInfo } from './service.js';
import { matchesLabels } from '../labels.js';

export interface Endpoint {
  ip: string;
  port: number;
  /** `ns/pod`, for DNS and logs. */
  pod: string;
  /** On this node: always true for kubelet-lite's own pods; from EndpointSlices, its nodeName is this node's. */
  local: boolean;
  /** Being deleted and still serving: used only when the port has no ready endpoint. */
  terminating?: boolean;
}

/** The address a pod serves on: the host's for hostNetwork pods, else its pod IP; undefined before it has one. */
export function podAddress(pod: Pod): string | undefined {
  const st = pod.status;
  if (pod.spec?.hostNetwork) return st?.hostIP ?? st?.podIP;
  return st?.podIP;
}

export function podReady(pod: Pod): boolean {
  return pod.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
}

/** Terminated pods never serve; being deleted, a pod no longer counts as ready. */
function podFinished(pod: Pod): boolean {
  const phase = pod.status?.phase;
  return phase === 'Succeeded' || phase === 'Failed';
}
function podServes(pod: Pod): boolean {
  return !podFinished(pod) && !pod.metadata?.deletionTimestamp;
}

/** A Service's selector: equality only. */
export const selectorMatches = matchesLabels;

/** The port number `sp.targetPort` means in `pod`, or undefined when the pod has no such named port. */
export function resolveTargetPort(sp: Pick<ServicePortInfo, 'targetPort' | 'protocol'>, pod: Pod): number | undefined {
  if (typeof sp.targetPort === 'number') return sp.targetPort;
  const containers = [...(pod.spec?.containers ?? []), ...(pod.spec?.initContainers ?? []).filter((c) => c.restartPolicy === 'Always')];
  for (const c of containers) {
    for (const p of c.ports ?? []) {
      if (p.name === sp.targetPort && (p.protocol ?? 'TCP') === sp.protocol) return p.containerPort;
    }
  }
  return undefined;
}

/** Pods by namespace and label, so selecting is not Services × pods (10,000 × 30,000 at scale); kept up to date pod by pod. */
export class PodIndex {
  private readonly byLabel = new Map<string, Set<Pod>>();
  constructor(pods: Iterable<Pod> = []) {
    for (const pod of pods) this.add(pod);
  }

  add(pod: Pod): void {
    const ns = pod.metadata?.namespace ?? 'default';
    for (const [k, v] of Object.entries(pod.metadata?.labels ?? {})) {
      const key = `${ns}\0${k}\0${v}`;
      let set = this.byLabel.get(key);
      if (!set) this.byLabel.set(key, (set = new Set()));
      set.add(pod);
    }
  }

  /** Forgets a pod object added before (the same object: sources replace a pod's object when it changes). */
  remove(pod: Pod): void {
    const ns = pod.metadata?.namespace ?? 'default';
    for (const [k, v] of Object.entries(pod.metadata?.labels ?? {})) {
      const key = `${ns}\0${k}\0${v}`;
      const set = this.byLabel.get(key);
      if (set?.delete(pod) && set.size === 0) this.byLabel.delete(key);
    }
  }

  /** Pods in `namespace` carrying at least the rarest label of the selector: a superset of the matches. */
  candidates(namespace: string, selector: Record<string, string>): Iterable<Pod> {
    let best: Set<Pod> | undefined;
    for (const [k, v] of Object.entries(selector)) {
      const set = this.byLabel.get(`${namespace}\0${k}\0${v}`);
      if (!set) return [];
      if (!best || set.size < best.size) best = set;
    }
    return best ?? [];
  }
}

/** The pods selected by a Service that may serve it (ready, or any when it publishes not-ready addresses), in a stable order. */
export function selectedPods(svc: ServiceInfo, pods: Pod[] | PodIndex): Pod[] {
  if (!svc.selector) return [];
  const out: Pod[] = [];
  const candidates = pods instanceof PodIndex ? pods.candidates(svc.namespace, svc.selector) : pods;
  for (const pod of candidates) {
    if ((pod.metadata?.namespace ?? 'default') !== svc.namespace) continue;
    if (!selectorMatches(svc.selector, pod.metadata?.labels)) continue;
    if (!podServes(pod) || !podAddress(pod)) continue;
    if (!svc.publishNotReady && !podReady(pod)) continue;
    out.push(pod);
  }
  return out;
}

/**
 * The pods selected by a Service that are being deleted and still Ready
 * (the EndpointSlice controller's serving and terminating endpoints); with
 * published not-ready addresses they are ready endpoints instead.
 */
function servingTerminatingPods(svc: ServiceInfo, pods: Pod[] | PodIndex): Pod[] {
  if (!svc.selector) return [];
  const out: Pod[] = [];
  const candidates = pods instanceof PodIndex ? pods.candidates(svc.namespace, svc.selector) : pods;
  for (const pod of candidates) {
    if (!pod.metadata?.deletionTimestamp || podFinished(pod) || !podAddress(pod)) continue;
    if ((pod.metadata?.namespace ?? 'default') !== svc.namespace) continue;
    if (!selectorMatches(svc.selector, pod.metadata?.labels)) continue;
    if (svc.publishNotReady || podReady(pod)) out.push(pod);
  }
  return out;
}

/** Each pod's endpoint for one service port: once per address and port (two hostNetwork pods on one host port are one). */
function endpointsOf(sp: ServicePortInfo, pods: Pod[], terminating: boolean): Endpoint[] {
  const eps: Endpoint[] = [];
  const seen = new Set<string>();
  for (const pod of pods) {
    const port = resolveTargetPort(sp, pod);
    if (port === undefined) continue;
    const ip = podAddress(pod)!;
    const id = `${ip}:${port}`;
    if (seen.has(id)) continue;
    seen.add(id);
    const ep: Endpoint = { ip, port, pod: `${pod.metadata?.namespace ?? 'default'}/${pod.metadata?.name ?? ''}`, local: true };
    if (terminating) ep.terminating = true;
    eps.push(ep);
  }
  return eps.sort(compareEndpoints);
}

/**
 * Endpoints per service port key (`ns/name:port`), sorted by address: the
 * ready ones, or, when a port has none, its serving terminating ones.
 */
export function computeEndpoints(services: ServiceInfo[], pods: Pod[] | PodIndex): Map<string, Endpoint[]> {
  const out = new Map<string, Endpoint[]>();
  const index = pods instanceof PodIndex || services.length === 1 ? pods : new PodIndex(pods);
  for (const svc of services) {
    // Published not-ready addresses make every pod a ready endpoint, terminating ones too.
    const selected = svc.publishNotReady ? [...selectedPods(svc, index), ...servingTerminatingPods(svc, index)] : selectedPods(svc, index);
    let terminating: Pod[] | undefined;
    for (const sp of svc.ports) {
      let eps = endpointsOf(sp, selected, false);
      if (eps.length === 0 && !svc.publishNotReady) {
        terminating ??= servingTerminatingPods(svc, index);
        eps = endpointsOf(sp, terminating, true);
      }
      out.set(sp.key, eps);
    }
  }
  return out;
}

function ipKey(ip: string): number {
  const p = ip.split('.').map(Number);
  return p.length === 4 ? ((p[0]! * 256 + p[1]!) * 256 + p[2]!) * 256 + p[3]! : 0;
}

function compareEndpoints(a: Endpoint, b: Endpoint): number {
  return ipKey(a.ip) - ipKey(b.ip) || a.port - b.port;
}

/** What the proxy reads of a discovery.k8s.io/v1 EndpointSlice. */
export type SliceLike = Pick<EndpointSlice, 'addressType' | 'endpoints' | 'ports' | 'metadata'>;

/**
 * A Service's endpoints per service port key from its EndpointSlices, as
 * kube-proxy reads them: a slice port matches a service port by name and
 * protocol; an endpoint's first address is used; conditions unset mean
 * ready (and serving as ready); endpoints neither ready nor
 * serving-terminating are left out. Ready and serving-terminating ones
 * both come back, marked: renderPort picks between them (and between this
 * node's and the others', by `nodeName`). Sorted by address; each address
 * and port once.
 */
export function endpointsFromSlices(svc: ServiceInfo, slices: SliceLike[], nodeName: string): Map<string, Endpoint[]> {
  const out = new Map<string, Endpoint[]>();
  for (const sp of svc.ports) {
    const byId = new Map<string, Endpoint>();
    for (const slice of slices) {
      if (slice.addressType !== 'IPv4') continue;
      const port = (slice.ports ?? []).find((p) => (p.name ?? '') === sp.portName && (p.protocol ?? 'TCP') === sp.protocol);
      if (!port || typeof port.port !== 'number') continue;
      for (const e of slice.endpoints ?? []) {
        const ip = e.addresses?.[0];
        if (!ip) continue;
        const ready = e.conditions?.ready ?? true;
        const serving = e.conditions?.serving ?? ready;
        const terminating = e.conditions?.terminating ?? false;
        if (!ready && !(serving && terminating)) continue;
        const id = `${ip}:${port.port}`;
        const ep: Endpoint = { ip, port: port.port, pod: e.targetRef?.name ? `${e.targetRef.namespace ?? svc.namespace}/${e.targetRef.name}` : '', local: e.nodeName === nodeName };
        if (!ready) ep.terminating = true;
        const had = byId.get(id);
        // The same address in two slices (a move between them): the ready copy wins.
        if (!had || (had.terminating && !ep.terminating)) byId.set(id, ep);
      }
    }
    out.set(sp.key, [...byId.values()].sort(compareEndpoints));
  }
  return out;
}
