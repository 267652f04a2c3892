/**
 * The agent's event recorder: Kubernetes core/v1 Events about pods, as the
 * kubelet emits them, kept in memory for the status API and `skiff describe`.
 *
 * A repeat of the same thing (same pod, container, type, reason and message)
 * bumps the existing event's count and lastTimestamp instead of adding one,
 * and the store is bounded overall and per pod: a pod crash-looping for a
 * week holds as many events as one that failed once.
 */
import type { Event } from 'kubernetes-types/core/v1.js';
import { namespacedKey as podKey } from '../labels.js';

export type EventType = 'Normal' | 'Warning';

/** The reasons the kubelet uses, so the agent's parts spell them the same way. */
export const EventReason = {
  Pulling: 'Pulling',
  Pulled: 'Pulled',
  Failed: 'Failed',
  ErrImageNeverPull: 'ErrImageNeverPull',
  BackOff: 'BackOff',
  Created: 'Created',
  Started: 'Started',
  Killing: 'Killing',
  Preempting: 'Preempting',
  ExceededGracePeriod: 'ExceededGracePeriod',
  Unhealthy: 'Unhealthy',
  ProbeWarning: 'ProbeWarning',
  FailedMount: 'FailedMount',
  FailedCreatePodSandBox: 'FailedCreatePodSandBox',
  SandboxChanged: 'SandboxChanged',
  FailedKillPod: 'FailedKillPod',
  FailedPostStartHook: 'FailedPostStartHook',
  FailedPreStopHook: 'FailedPreStopHook',
} as const;

/** The pod an event is about (what the kubelet puts in involvedObject). */
export interface PodRef {
  namespace: string;
  name: string;
  uid: string;
}

export interface EventRecorderOptions {
  /** The node name, for source.host. */
  node: string;
  /** Events kept in all (the oldest-updated go first). */
  maxEvents?: number;
  /** Events kept per pod. */
  maxPerPod?: number;
  now?: () => Date;
}

export const DEFAULT_MAX_EVENTS = 1000;
export const DEFAULT_MAX_EVENTS_PER_POD = 100;

type Listener = (type: 'ADDED' | 'MODIFIED', event: Event) => void;

export class EventRecorder {
  private readonly node: string;
  private readonly maxEvents: number;
  private readonly maxPerPod: number;
  private readonly now: () => Date;
  /** Aggregation key → event; Map order is least recently updated first. */
  private readonly events = new Map<string, Event>();
  /** Pod key → the aggregation keys of its events, least recently updated first. */
  private readonly byPod = new Map<string, Set<string>>();
  private readonly listeners = new Set<Listener>();
  private lastNameStamp = 0n;

  constructor(opts: EventRecorderOptions) {
    this.node = opts.node;
    this.maxEvents = Math.max(1, opts.maxEvents ?? DEFAULT_MAX_EVENTS);
    this.maxPerPod = Math.max(1, opts.maxPerPod ?? DEFAULT_MAX_EVENTS_PER_POD);
    this.now = opts.now ?? (() => new Date());
  }

  /**
   * Records that `reason` happened to the pod (to one of its containers when
   * `container` is given). Returns a copy of the event as stored.
   */
  record(pod: PodRef, type: EventType, reason: string, message: string, container?: string): Event {
    const fieldPath = container === undefined ? undefined : `spec.containers{${container}}`;
    const key = JSON.stringify([pod.namespace, pod.name, pod.uid, fieldPath ?? '', type, reason, message]);
    const involved: Event['involvedObject'] = { apiVersion: 'v1', kind: 'Pod', namespace: pod.namespace, name: pod.name, uid: pod.uid, ...(fieldPath ? { fieldPath } : {}) };
    return this.add(key, podKey(pod.namespace, pod.name), pod.namespace, involved, type, reason, message);
  }

  /**
   * Records that `reason` happened to the node itself (the kubelet's nodeRef:
   * kind Node, the node's name as its uid, no namespace; the event lives in
   * "default"), aggregated and bounded as a pod's are.
   */
  recordNode(type: EventType, reason: string, message: string): Event {
    const key = JSON.stringify(['Node', this.node, type, reason, message]);
    return this.add(key, nodeKey(this.node), 'default', { kind: 'Node', name: this.node, uid: this.node }, type, reason, message);
  }

  /** A new event about `involved`, or the count of the same one bumped. */
  private add(key: string, pk: string, namespace: string, involved: Event['involvedObject'], type: EventType, reason: string, message: string): Event {
    const at = this.now();
    const stamp = at.toISOString().replace(/\.\d{3}Z$/, 'Z');
    const existing = this.events.get(key);
    if (existing) {
      existing.count = (existing.count ?? 1) + 1;
      existing.lastTimestamp = stamp;
      this.touch(key, pk, existing);
      this.emit('MODIFIED', existing);
      return structuredClone(existing);
    }
    const event: Event = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: `${involved.name}.${this.nameStamp(at)}`, namespace },
      involvedObject: involved,
      reason,
      message,
      type,
      count: 1,
      firstTimestamp: stamp,
      lastTimestamp: stamp,
      source: { component: 'kubelet', host: this.node },
      reportingComponent: 'kubelet',
      reportingInstance: this.node,
    };
    this.touch(key, pk, event);
    this.evict(pk);
    this.emit('ADDED', event);
    return structuredClone(event);
  }

  /** Every event, oldest first (by lastTimestamp). Copies. */
  list(): Event[] {
    return sortByLast([...this.events.values()].map((e) => structuredClone(e)));
  }

  /** The events about one pod (any of its UIDs), oldest first. Copies. */
  listFor(namespace: string, name: string): Event[] {
    const keys = this.byPod.get(podKey(namespace, name));
    if (!keys) return [];
    return sortByLast([...keys].map((k) => structuredClone(this.events.get(k)!)));
  }

  get size(): number {
    return this.events.size;
  }

  /** Calls `listener` for every new or aggregated event; returns the unsubscribe. */
  watch(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  private touch(key: string, pk: string, event: Event): void {
    this.events.delete(key);
    this.events.set(key, event);
    let keys = this.byPod.get(pk);
    if (!keys) this.byPod.set(pk, (keys = new Set()));
    keys.delete(key);
    keys.add(key);
  }

  private evict(pk: string): void {
    const keys = this.byPod.get(pk)!;
    while (keys.size > this.maxPerPod) this.drop(keys.values().next().value as string);
    while (this.events.size > this.maxEvents) this.drop(this.events.keys().next().value as string);
  }

  private drop(key: string): void {
    const e = this.events.get(key);
    if (!e) return;
    this.events.delete(key);
    const pk = e.involvedObject.kind === 'Node' ? nodeKey(e.involvedObject.name ?? '') : podKey(e.involvedObject.namespace ?? '', e.involvedObject.name ?? '');
    const keys = this.byPod.get(pk);
    keys?.delete(key);
    if (keys && keys.size === 0) this.byPod.delete(pk);
  }

  /** The kubelet names events `<object>.<unix nanoseconds in hex>`; strictly increasing so names never collide. */
  private nameStamp(at: Date): string {
    let ns = BigInt(at.getTime()) * 1_000_000n;
    if (ns <= this.lastNameStamp) ns = this.lastNameStamp + 1n;
    this.lastNameStamp = ns;
    return ns.toString(16);
  }

  private emit(type: 'ADDED' | 'MODIFIED', e: Event): void {
    for (const l of this.listeners) {
      try {
        l(type, structuredClone(e));
      } catch {
        // A listener's failure is its own; the recorder keeps going.
      }
    }
  }
}


/** The node's own events are kept apart from any pod's (a pod key always holds a slash; this never does). */
const nodeKey = (name: string) => `Node\0${name.replaceAll('/', '')}`;

function sortByLast(events: Event[]): Event[] {
  // Stable: events updated in the same second keep their update order.
  return events.sort((a, b) => (a.lastTimestamp ?? '').localeCompare(b.lastTimestamp ?? ''));
}
