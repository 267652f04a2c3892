/**
 * The node's own Node spec, as a one-node cluster's controllers act on it:
 *
 * - the node lifecycle controller's part: while the Node is cordoned
 *   (spec.unschedulable, as `kubectl cordon` writes it) it carries the
 *   node.kubernetes.io/unschedulable:NoSchedule taint, and loses it when
 *   uncordoned;
 * - the scheduler's part: a Pod created while the node took none stays
 *   Pending and unbound (PodScheduled=False, reason Unschedulable, see
 *   kinds/placement.ts); once the node takes it, it is bound here
 *   (spec.nodeName set, PodScheduled=True) and the agent runs it.
 *
 * Each pod placed here (at its creation, or bound later) gets the
 * scheduler's `Scheduled` event, once.
 *
 * Over the ApiClient only. NodeReporter writes the Node's status, never its
 * spec; this writes the spec, never the status.
 */
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { isGated, placementRefusal, podRequests, requestsOn, UNSCHEDULABLE_TAINT } from '../api/kinds/placement.js';
import { timestamp } from '../api/store.js';
import type { ApiObject, Obj } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { ControllerEvents } from './controller-events.js';
import { LevelLoop } from './level-loop.js';

export interface NodeSchedulingOptions {
  client: ApiClient;
  nodeName: string;
  log: Logger;
  now?: () => number;
  /** Where the scheduler's `Scheduled` events go; none: not recorded. */
  events?: ControllerEvents;
}

const isObj = (v: unknown): v is Obj => typeof v === 'object' && v !== null && !Array.isArray(v);
const taintsOf = (node: ApiObject): Obj[] => (isObj(node.spec) && Array.isArray(node.spec.taints) ? (node.spec.taints as unknown[]).filter(isObj) : []);
const isCordonTaint = (t: Obj) => t.key === UNSCHEDULABLE_TAINT && t.effect === 'NoSchedule';

/** The taints the Node should carry for its spec.unschedulable, or undefined when they are right already. */
export function cordonTaints(node: ApiObject, nowMs: number): Obj[] | undefined {
  const cordoned = isObj(node.spec) && node.spec.unschedulable === true;
  const taints = taintsOf(node);
  const has = taints.some(isCordonTaint);
  if (cordoned && !has) return [...taints, { key: UNSCHEDULABLE_TAINT, effect: 'NoSchedule', timeAdded: timestamp(nowMs) }];
  if (!cordoned && has) return taints.filter((t) => !isCordonTaint(t));
  return undefined;
}

export class NodeScheduling {
  private readonly loop: LevelLoop;
  private readonly now: () => number;
  /** The pods whose Scheduled event is written (uids of pods still on the node). */
  private announced = new Set<string>();
  /** Pods created before this (before a restart) were announced by the node's earlier run. */
  private readonly since: number;

  constructor(private readonly o: NodeSchedulingOptions) {
    this.now = o.now ?? Date.now;
    this.since = this.now() - 1000;
    this.loop = new LevelLoop({ client: o.client, resources: ['nodes', 'pods'], sync: () => this.sync(), log: o.log, name: 'the node\'s scheduling', everyMs: 30_000 });
  }

  start(): Promise<void> {
    return this.loop.start();
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }

  async sync(): Promise<void> {
    const { client, nodeName } = this.o;
    let node: ApiObject;
    try {
      node = await client.get('nodes', '', nodeName);
    } catch (err) {
      if (err instanceof ApiError && err.reason === 'NotFound') return; // not registered yet
      throw err;
    }
    const taints = cordonTaints(node, this.now());
    if (taints) {
      try {
        node = await client.update('nodes', '', nodeName, { ...node, spec: { ...(node.spec as Obj), taints: taints.length > 0 ? taints : undefined } });
      } catch (err) {
        if (!(err instanceof ApiError && err.reason === 'Conflict')) throw err;
        this.loop.kick(0); // written meanwhile (the reporter, kubectl): looked at again
        return;
      }
    }
    if (this.o.events) await this.announce();
    const unbound = (await client.list('pods', { fieldSelector: 'spec.nodeName=' })).items.filter((p) => !p.metadata.deletionTimestamp && !isGated(p));
    if (unbound.length === 0) return;
    // Oldest first, each bound one's requests counted against the next, as the scheduler's queue takes them.
    unbound.sort((a, b) => String(a.metadata.creationTimestamp).localeCompare(String(b.metadata.creationTimestamp)));
    const used = requestsOn((await client.list('pods', { fieldSelector: `spec.nodeName=${nodeName}` })).items, nodeName);
    for (const pod of unbound) {
      const why = placementRefusal(node, pod, used);
      if (why !== undefined) {
        await this.unschedulable(pod, why);
        continue;
      }
      const r = podRequests(pod);
      used.milliCpu += r.milliCpu;
      used.memory += r.memory;
      await this.bind(pod).catch((err) => this.o.log.warn('could not bind a pod to the node', { pod: `${pod.metadata.namespace}/${pod.metadata.name}`, error: errorMessage(err) }));
    }
  }

  /** The Scheduled event for each pod newly placed on the node. */
  private async announce(): Promise<void> {
    const placed = (await this.o.client.list('pods', { fieldSelector: `spec.nodeName=${this.o.nodeName}` })).items;
    const still = new Set<string>();
    for (const pod of placed) {
      const uid = String(pod.metadata.uid);
      still.add(uid);
      if (this.announced.has(uid)) continue;
      this.announced.add(uid);
      const created = Date.parse(String(pod.metadata.creationTimestamp ?? ''));
      if (!(created >= this.since) || pod.metadata.deletionTimestamp) continue;
      // Dated when it happened (the pod was placed as it was made, or bound later: its PodScheduled time), so it sorts before the kubelet's.
      const scheduled = (Array.isArray((pod.status as Obj | undefined)?.conditions) ? ((pod.status as Obj).conditions as Obj[]) : []).find((c) => c.type === 'PodScheduled');
      const at = Date.parse(String(scheduled?.lastTransitionTime ?? '')) || created;
      this.o.events!.record({ ...pod, apiVersion: 'v1', kind: 'Pod' }, 'Normal', 'Scheduled', `Successfully assigned ${pod.metadata.namespace}/${pod.metadata.name} to ${this.o.nodeName}`, at);
    }
    this.announced = new Set([...this.announced].filter((u) => still.has(u)));
  }

  /**
   * The scheduler's PodScheduled=False for a pod it cannot place, with why
   * now (the reason changes as the node does); a gated pod whose gates are
   * gone loses its SchedulingGated reason the same way.
   */
  private async unschedulable(pod: ApiObject, message: string): Promise<void> {
    const status = isObj(pod.status) ? pod.status : {};
    const conditions = Array.isArray(status.conditions) ? (status.conditions as Obj[]) : [];
    const old = conditions.find((c) => c.type === 'PodScheduled');
    if (old?.status === 'False' && old.reason === 'Unschedulable' && old.message === message) return;
    const next = { type: 'PodScheduled', status: 'False', lastProbeTime: null, lastTransitionTime: old?.status === 'False' ? old.lastTransitionTime : timestamp(this.now()), reason: 'Unschedulable', message };
    const ns = pod.metadata.namespace ?? 'default';
    await this.o.client.update('pods', ns, String(pod.metadata.name), { ...pod, status: { ...status, conditions: [...conditions.filter((c) => c.type !== 'PodScheduled'), next] } }, { status: true }).catch((err) => {
      if (!(err instanceof ApiError && (err.reason === 'Conflict' || err.reason === 'NotFound'))) throw err;
    });
  }

  /** What pods/binding does: the node set once, the PodScheduled condition True. */
  private async bind(pod: ApiObject): Promise<void> {
    const ns = pod.metadata.namespace ?? 'default';
    const name = String(pod.metadata.name);
    const bound = await this.o.client.patch('pods', ns, name, 'merge', { metadata: { uid: pod.metadata.uid, resourceVersion: pod.metadata.resourceVersion }, spec: { nodeName: this.o.nodeName } });
    const status = isObj(bound.status) ? bound.status : {};
    const others = (Array.isArray(status.conditions) ? (status.conditions as Obj[]) : []).filter((c) => c.type !== 'PodScheduled');
    const conditions = [...others, { type: 'PodScheduled', status: 'True', lastProbeTime: null, lastTransitionTime: timestamp(this.now()) }];
    await this.o.client.update('pods', ns, name, { ...bound, status: { ...status, conditions } }, { status: true });
  }
}
