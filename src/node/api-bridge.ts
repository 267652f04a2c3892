/**
 * The node's API and its agent joined as a cluster and its kubelet are:
 *
 * - The Pods the API binds to this node (those clients write and those the
 *   controller manager makes), and the ConfigMaps, Secrets and Services
 *   they read, are handed to the agent as one more source beside the
 *   manifest directory, under the API's uids, so an object's edit is an
 *   edit and not a new object.
 * - The agent's view goes back as status: each pod's status onto its Pod
 *   (a file's pods and the API's alike).
 * - A Pod deleted through the API is marked (graceful deletion); the agent
 *   stops it, and the bridge then deletes it for good, as a kubelet does.
 *
 * Reads and status writes go through the ApiClient interface; the store
 * itself is read only to tell a file's objects (which the agent has from
 * the file) from the API's.
 */
import { createHash } from 'node:crypto';
import type { Pod, Service } from 'kubernetes-types/core/v1.js';
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import type { Store } from '../api/store.js';
import { resourceOf, type ApiObject, type Kind, type Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { ParsedObject } from '../kubelet-lite/manifests.js';
import type { ObjectStore } from '../kubelet-lite/store.js';
import { API_SOURCE_FILE } from '../stored-object.js';

/**
 * The resources the agent (or the proxy) acts on: claims and volumes for the pods' persistentVolumeClaim volumes,
 * ServiceAccounts for the image pull secrets of pods that name none.
 */
const FED = ['pods', 'configmaps', 'secrets', 'services', 'persistentvolumeclaims', 'persistentvolumes', 'serviceaccounts'];

/** What the bridge needs of the agent. */
export interface AgentView {
  listPods(): Pod[];
  watchPods(listener: (type: 'ADDED' | 'MODIFIED' | 'DELETED', pod: Pod) => void): () => void;
  getPod(namespace: string, name: string): Pod | undefined;
  /** The API deleted the pod with this uid with this grace: the agent stops it within it. */
  deletionGrace?(uid: string, seconds: number): void;
}

export interface ApiBridgeOptions {
  store: Store;
  client: ApiClient;
  objects: ObjectStore;
  nodeName: string;
  log: Logger;
  /** How often the proxy's allocations are looked at (default 1 s). */
  allocationEveryMs?: number;
}

const key = (ns: string, name: string) => `${ns}/${name}`;

/** The pod conditions the kubelet writes; any other (DisruptionTarget, a readiness gate's) belongs to whoever set it. */
const KUBELET_CONDITIONS = new Set(['PodScheduled', 'Initialized', 'Ready', 'ContainersReady', 'PodReadyToStartContainers']);

/**
 * The agent's status for a pod, keeping the conditions others wrote into the
 * API's (as the kubelet's status manager keeps them): the eviction
 * subresource's DisruptionTarget, a controller's readiness-gate condition.
 * With `gates` (the pod's readinessGates), Ready is judged as the kubelet
 * judges it: the containers ready and every gate's condition True.
 */
export function withOthersConditions(agent: Obj | undefined, api: Obj | undefined, gates: string[] = [], now: () => string = () => new Date().toISOString()): Obj | undefined {
  const all = Array.isArray(api?.conditions) ? (api!.conditions as Obj[]).filter((c) => typeof c === 'object' && c !== null) : [];
  const theirs = all.filter((c) => !KUBELET_CONDITIONS.has(String(c.type)));
  if (!agent || (theirs.length === 0 && gates.length === 0)) return agent;
  const mine = Array.isArray(agent.conditions) ? (agent.conditions as Obj[]) : [];
  const have = new Set(mine.map((c) => String(c.type)));
  const conditions = [...mine, ...theirs.filter((c) => !have.has(String(c.type)))];
  return { ...agent, conditions: gates.length > 0 ? gatedReady(conditions, gates, all.find((c) => c.type === 'Ready'), now) : conditions };
}

/** The conditions with Ready False (reason ReadinessGatesNotReady, the kubelet's messages) until every gate's condition is True. */
function gatedReady(conditions: Obj[], gates: string[], before: Obj | undefined, now: () => string): Obj[] {
  const at = conditions.findIndex((c) => c.type === 'Ready');
  if (at < 0 || conditions.find((c) => c.type === 'ContainersReady')?.status !== 'True') return conditions;
  const byType = new Map(conditions.map((c) => [String(c.type), c]));
  const unready = gates.flatMap((g) => {
    const c = byType.get(g);
    if (!c) return [`corresponding condition of pod readiness gate "${g}" does not exist.`];
    return c.status === 'True' ? [] : [`the status of pod readiness gate "${g}" is not "True", but ${String(c.status)}`];
  });
  const status = unready.length > 0 ? 'False' : 'True';
  const ready: Obj = {
    type: 'Ready',
    status,
    lastProbeTime: null,
    lastTransitionTime: before?.status === status ? before.lastTransitionTime : now(),
    ...(unready.length > 0 ? { reason: 'ReadinessGatesNotReady', message: unready.join(', ') } : {}),
  };
  return conditions.map((c, i) => (i === at ? ready : c));
}

/** The object as the agent should read it: no status, no server bookkeeping. */
function forAgent(o: ApiObject): Obj {
  const { status: _s, ...rest } = o;
  const { managedFields: _m, resourceVersion: _r, ...meta } = o.metadata;
  return { ...rest, metadata: meta };
}

function revisionOf(o: Obj): string {
  return createHash('sha256').update(JSON.stringify(o)).digest('hex').slice(0, 16);
}

export class ApiBridge {
  private readonly o: ApiBridgeOptions;
  private agent: AgentView | undefined;
  private stops: Array<() => void> = [];
  private feedTimer: NodeJS.Immediate | undefined;
  private workloadTimer: NodeJS.Timeout | undefined;
  /** resource/ns/name → the revision last handed to the agent. */
  private fed = new Map<string, string>();
  private readonly pendingPods = new Set<string>();
  private podTimer: NodeJS.Immediate | undefined;
  private stopped = false;
  private services: (() => Service[]) | undefined;
  /** namespace/name → what the proxy had given each Service when last looked at. */
  private allocationsSeen = new Map<string, string>();

  constructor(opts: ApiBridgeOptions) {
    this.o = opts;
  }

  private kinds(): Kind[] {
    return FED.map((r) => this.o.store.kind(r)).filter((k): k is Kind => k !== undefined);
  }

  /**
   * Hands the API's objects to the agent's store now (before the agent's
   * first pass, so the pods they define are adopted) and from then on as
   * they change.
   */
  async start(): Promise<void> {
    this.feed();
    for (const kind of this.kinds()) {
      const w = await this.o.client.watch(
        resourceOf(kind),
        { resourceVersion: this.o.store.resourceVersion },
        (e) => {
          const m = e.object.metadata;
          if (kind.plural === 'pods' && m.uid && m.deletionGracePeriodSeconds !== undefined) this.agent?.deletionGrace?.(m.uid, m.deletionGracePeriodSeconds);
          // A status someone else wrote over the agent's (a forged podIP or phase) is put back, as the kubelet's status manager
          // does: NetworkPolicy, Services and DNS read it.
          if (kind.plural === 'pods' && e.type === 'MODIFIED' && this.agent) this.schedulePod(m.namespace ?? 'default', m.name ?? '');
          if (this.changesFeed(kind, e.type, e.object)) this.scheduleFeed();
        },
        (reason) => {
          // Fell behind (or stopped): a full feed is the relist.
          if (!this.stopped) this.o.log.warn('the API bridge lost its watch; feeding everything again', { resource: resourceOf(kind), reason });
          this.scheduleFeed();
        },
      );
      this.stops.push(() => w.stop());
    }
  }

  /** From now on, the agent's pods are written back as status. */
  attach(agent: AgentView): void {
    this.agent = agent;
    this.stops.push(agent.watchPods((_type, pod) => this.schedulePod(pod.metadata?.namespace ?? 'default', pod.metadata?.name ?? '')));
    for (const p of agent.listPods()) this.schedulePod(p.metadata?.namespace ?? 'default', p.metadata?.name ?? '');
    // Pods the API holds that the agent does not know (stopped while the node was down, or never valid).
    for (const p of this.o.store.list(this.o.store.kind('pods')!).items) this.schedulePod(p.metadata.namespace ?? 'default', p.metadata.name ?? '');
    const tick = () => {
      this.copyAllocations();
      this.workloadTimer = setTimeout(tick, this.o.allocationEveryMs ?? 1000);
      this.workloadTimer.unref();
    };
    tick();
  }

  /**
   * The proxy's Services, with the cluster IPs and node ports it allocated:
   * written into the API's Services that asked for none, as the API
   * server's allocators would have at creation (and so kept across restarts).
   */
  attachServices(view: () => Service[]): void {
    this.services = view;
    this.copyAllocations();
  }

  stop(): void {
    this.stopped = true;
    for (const s of this.stops) s();
    this.stops = [];
    if (this.feedTimer) clearImmediate(this.feedTimer);
    if (this.podTimer) clearImmediate(this.podTimer);
    if (this.workloadTimer) clearTimeout(this.workloadTimer);
  }

  // ------------------------------------------------------------ API → agent

  /**
   * Whether a change is one the agent must see: most are the node's own status
   * writes, which leave what the agent reads as it was (and a full feed lists everything).
   */
  private changesFeed(kind: Kind, type: string, o: ApiObject): boolean {
    const ns = o.metadata.namespace ?? '';
    const name = o.metadata.name ?? '';
    const k = `${resourceOf(kind)}/${ns}/${name}`;
    if (type === 'DELETED' || (this.o.store.ownerOf(kind, ns, name) !== undefined && !kind.nodeSet)) return this.fed.has(k);
    if (kind.plural === 'pods' && (((o.spec ?? {}) as Obj).nodeName !== this.o.nodeName || o.metadata.deletionTimestamp)) return true;
    return this.fed.get(k) !== revisionOf(forAgent(o));
  }

  private scheduleFeed(): void {
    if (this.feedTimer || this.stopped) return;
    this.feedTimer = setImmediate(() => {
      this.feedTimer = undefined;
      this.feed();
    });
  }

  /** Every API-written object of the fed kinds, as one source of the agent's store. */
  private feed(): void {
    const objects: ParsedObject[] = [];
    const fed = new Map<string, string>();
    for (const kind of this.kinds()) {
      for (const o of this.o.store.list(kind).items) {
        const ns = o.metadata.namespace ?? '';
        const name = o.metadata.name ?? '';
        // A file's: the agent has it already, unless the node's controllers set fields on it (a claim's binding) that it must see.
        const owner = this.o.store.ownerOf(kind, ns, name);
        if (owner !== undefined && !kind.nodeSet) continue;
        if (kind.plural === 'pods') {
          const spec = (o.spec ?? {}) as Obj;
          if (spec.nodeName !== this.o.nodeName) continue;
          if (o.metadata.deletionTimestamp) {
            // Being deleted: the agent stops it once it is no longer given, then it goes for good.
            this.schedulePod(ns, name);
            continue;
          }
        }
        const object = forAgent(o);
        const revision = revisionOf(object);
        const k = `${resourceOf(kind)}/${ns}/${name}`;
        fed.set(k, revision);
        const amends = owner?.replace(/^the manifest file /, '');
        objects.push({ apiVersion: o.apiVersion, kind: o.kind, namespace: ns, name, object, source: { file: API_SOURCE_FILE, document: 0, line: 0, ...(amends ? { amends } : {}) }, uid: o.metadata.uid, revision });
      }
    }
    const same = fed.size === this.fed.size && [...fed].every(([k, r]) => this.fed.get(k) === r);
    if (same) return;
    this.fed = fed;
    this.o.objects.replaceFile(API_SOURCE_FILE, { objects, problems: [] });
  }

  // ------------------------------------------------------------ agent → API

  private schedulePod(namespace: string, name: string): void {
    if (this.stopped) return;
    this.pendingPods.add(key(namespace, name));
    if (this.podTimer) return;
    this.podTimer = setImmediate(() => {
      this.podTimer = undefined;
      const keys = [...this.pendingPods];
      this.pendingPods.clear();
      void (async () => {
        for (const k of keys) {
          const i = k.indexOf('/');
          await this.syncPod(k.slice(0, i), k.slice(i + 1)).catch((err) => this.o.log.warn('could not write a pod\'s status to the API', { pod: k, error: errorMessage(err) }));
        }
      })();
    });
  }

  private async getOrUndefined(resource: string, namespace: string, name: string): Promise<ApiObject | undefined> {
    try {
      return await this.o.client.get(resource, namespace, name);
    } catch (err) {
      if (err instanceof ApiError && err.reason === 'NotFound') return undefined;
      throw err;
    }
  }

  /** Makes the API's Pod namespace/name agree with the agent's. */
  private async syncPod(namespace: string, name: string): Promise<void> {
    const agent = this.agent;
    if (!agent) return;
    const view = agent.getPod(namespace, name);
    const current = await this.getOrUndefined('pods', namespace, name);
    const viewUid = view?.metadata?.uid;
    if (current && current.metadata.deletionTimestamp && (!view || viewUid !== current.metadata.uid)) {
      // The agent has stopped it (or never ran it): gone for good.
      await this.o.client.delete('pods', namespace, name, { gracePeriodSeconds: 0, uid: current.metadata.uid }).catch((err) => {
        if (!(err instanceof ApiError && (err.reason === 'NotFound' || err.reason === 'Conflict'))) throw err;
      });
      return;
    }
    if (!view || !current || current.metadata.uid !== viewUid) return; // a file's pod not shown yet, or an API pod the agent has not caught up with
    const gates = ((current.spec as Obj | undefined)?.readinessGates as Obj[] | undefined ?? []).map((g) => String(g?.conditionType ?? '')).filter(Boolean);
    const status = withOthersConditions(view.status as Obj | undefined, current.status as Obj | undefined, gates);
    if (JSON.stringify(current.status ?? null) === JSON.stringify(status ?? null)) return;
    await this.o.client.update('pods', namespace, name, { ...current, status }, { status: true });
  }

  private copyAllocations(): void {
    const view = this.services;
    const kind = this.o.store.kind('services');
    if (!view || !kind || this.stopped) return;
    void (async () => {
      const seen = new Map<string, string>();
      for (const svc of view()) {
        const ns = svc.metadata?.namespace ?? 'default';
        const name = svc.metadata?.name ?? '';
        // What the proxy gave it, as a signature: a Service already looked at with the same is skipped (every second, 10,000 of them).
        const sig = `${svc.metadata?.uid}|${svc.spec?.clusterIP}|${(svc.spec?.ports ?? []).map((q) => q.nodePort ?? '').join(',')}`;
        if (this.allocationsSeen.get(`${ns}/${name}`) === sig) {
          seen.set(`${ns}/${name}`, sig);
          continue;
        }
        const current = await this.getOrUndefined('services', ns, name);
        const fileOwned = this.o.store.ownerOf(kind, ns, name) !== undefined;
        // The API has not caught up: looked at again next time (a file's Service is the same one whatever its uid).
        if (!current || (!fileOwned && current.metadata.uid !== svc.metadata?.uid)) continue;
        seen.set(`${ns}/${name}`, sig);
        const spec = structuredClone((current.spec ?? {}) as Obj);
        const ip = svc.spec?.clusterIP;
        let changed = false;
        if (ip && ip !== 'None' && !spec.clusterIP) {
          spec.clusterIP = ip;
          spec.clusterIPs = [ip];
          changed = true;
        }
        const ports = Array.isArray(spec.ports) ? (spec.ports as Obj[]) : [];
        for (const p of ports) {
          if (p.nodePort !== undefined) continue;
          const got = svc.spec?.ports?.find((q) => q.port === p.port && (q.protocol ?? 'TCP') === (p.protocol ?? 'TCP'))?.nodePort;
          if (got !== undefined) {
            p.nodePort = got;
            changed = true;
          }
        }
        if (!changed) continue;
        const owner = this.o.store.ownerOf(kind, ns, name);
        if (fileOwned && owner !== undefined) {
          // A file's Service: shown with what the proxy gave it (the file itself names none).
          this.o.store.mirror(kind, { ...current, spec }, owner);
          continue;
        }
        await this.o.client.update('services', ns, name, { ...current, spec }).catch((err) => {
          if (!(err instanceof ApiError && (err.reason === 'NotFound' || err.reason === 'Conflict'))) this.o.log.warn('could not write a Service\'s cluster IP to the API', { service: `${ns}/${name}`, error: errorMessage(err) });
        });
      }
      this.allocationsSeen = seen;
    })();
  }
}
