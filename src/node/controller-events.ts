/**
 * The controllers' events, as kube-controller-manager's recorders write
 * them: `ScalingReplicaSet` on a Deployment, `SuccessfulCreate` and
 * `SuccessfulDelete` on a ReplicaSet, DaemonSet or Job, `Completed` on a
 * Job, `SuccessfulCreate` of a Job on a CronJob; and the scheduler's
 * `Scheduled` on a Pod placed on the node. The same event again is
 * one event counted up. Handed to an EventWriter (events.ts), which writes
 * them to the API and bounds and expires them.
 */
import type { Event } from 'kubernetes-types/core/v1.js';
import type { ApiObject } from '../api/types.js';
import type { EventSource } from './events.js';

/** Controller events kept for aggregation at most; older ones are forgotten (written once more as new if they recur). */
const MAX_KEPT = 1000;

/** Which of upstream's controllers speaks for a kind. */
const COMPONENT: Record<string, string> = {
  Deployment: 'deployment-controller',
  ReplicaSet: 'replicaset-controller',
  DaemonSet: 'daemonset-controller',
  StatefulSet: 'statefulset-controller',
  ReplicationController: 'replication-controller',
  Job: 'job-controller',
  CronJob: 'cronjob-controller',
  Pod: 'default-scheduler',
};

type Listener = (type: 'ADDED' | 'MODIFIED', e: Event) => void;

export class ControllerEvents implements EventSource {
  private readonly kept = new Map<string, Event>();
  private readonly listeners = new Set<Listener>();
  private lastStamp = 0n;

  /** `instance`: who reports them (reportingInstance), so the node finds its own again after a restart. */
  constructor(private readonly o: { instance: string; now?: () => number }) {}

  watch(listener: Listener): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  /** Whether an event in the API was written by these controllers (for the writer's expiry after a restart). */
  isMine(e: { reportingInstance?: unknown }): boolean {
    return e.reportingInstance === this.o.instance;
  }

  /** `atMs`: when it happened, if not now (a pod placed at its creation). */
  record(involved: ApiObject, type: 'Normal' | 'Warning', reason: string, message: string, atMs?: number): void {
    const ns = involved.metadata.namespace ?? 'default';
    const name = String(involved.metadata.name ?? '');
    const key = JSON.stringify([ns, involved.kind, name, involved.metadata.uid, type, reason, message]);
    atMs ??= (this.o.now ?? Date.now)();
    const stamp = new Date(atMs).toISOString().replace(/\.\d{3}Z$/, 'Z');
    const old = this.kept.get(key);
    if (old) {
      old.count = (old.count ?? 1) + 1;
      old.lastTimestamp = stamp;
      this.kept.delete(key);
      this.kept.set(key, old);
      this.emit('MODIFIED', old);
      return;
    }
    const component = COMPONENT[String(involved.kind)] ?? 'controller-manager';
    const event: Event = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name: `${eventNameBase(name)}.${this.nameStamp(atMs)}`, namespace: ns },
      involvedObject: { apiVersion: String(involved.apiVersion ?? ''), kind: String(involved.kind ?? ''), namespace: ns, name, uid: involved.metadata.uid, resourceVersion: involved.metadata.resourceVersion },
      reason,
      message,
      type,
      count: 1,
      firstTimestamp: stamp,
      lastTimestamp: stamp,
      source: { component },
      reportingComponent: component,
      reportingInstance: this.o.instance,
    };
    this.kept.set(key, event);
    while (this.kept.size > MAX_KEPT) this.kept.delete(this.kept.keys().next().value as string);
    this.emit('ADDED', event);
  }

  /** `<object>.<unix nanoseconds in hex>`, strictly increasing, as upstream names events. */
  private nameStamp(atMs: number): string {
    let ns = BigInt(atMs) * 1_000_000n;
    if (ns <= this.lastStamp) ns = this.lastStamp + 1n;
    this.lastStamp = ns;
    return ns.toString(16);
  }

  private emit(type: 'ADDED' | 'MODIFIED', e: Event): void {
    for (const l of this.listeners) l(type, structuredClone(e));
  }
}

/** The event's own name starts with its object's; one that is no DNS subdomain (a manifest's refused object) is made into one. */
function eventNameBase(name: string): string {
  const base = name.toLowerCase().replace(/[^a-z0-9.-]/g, '-').replace(/^[^a-z0-9]+|[^a-z0-9]+$/g, '').slice(0, 200);
  return base || 'object';
}
