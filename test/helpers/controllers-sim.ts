/**
 * A fake node for the workload controllers: it runs reconcile() with injected
 * time and randomness, then does what the agent would with the result (start
 * new pods as Pending, drop removed ones) and lets a test move pods through
 * their phases.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { reconcile } from '../../src/controllers/reconcile.js';
import { emptyState, type ControllerState, type ReconcileOutput, type WorkloadStatus } from '../../src/controllers/types.js';
import type { StoredObject } from '../../src/kubelet-lite/model.js';
import { prng } from './prng.js';

export const T0 = Date.UTC(2026, 0, 1, 0, 0, 0);

let uidSeq = 0;
export function stored(kind: string, name: string, object: Record<string, unknown>, apiVersion?: string): StoredObject {
  const api = apiVersion ?? (kind === 'Job' || kind === 'CronJob' ? 'batch/v1' : 'apps/v1');
  return {
    apiVersion: api,
    kind,
    namespace: 'default',
    name,
    uid: `uid-${++uidSeq}`,
    object: { apiVersion: api, kind, metadata: { name }, ...object },
    source: { file: `/m/${name}.yaml`, document: 0, line: 1 },
  };
}

export function podTemplate(labels: Record<string, string>, image = 'web:1', restartPolicy?: string): Record<string, unknown> {
  return {
    metadata: { labels },
    spec: { containers: [{ name: 'app', image }], ...(restartPolicy ? { restartPolicy } : {}) },
  };
}

export function deployment(name: string, spec: Record<string, unknown>): StoredObject {
  return stored('Deployment', name, {
    spec: { selector: { matchLabels: { app: name } }, template: podTemplate({ app: name }), ...spec },
  });
}

export class Sim {
  readonly pods = new Map<string, Pod>();
  state: ControllerState = emptyState();
  now = T0;
  workloads: StoredObject[] = [];
  last!: ReconcileOutput;
  readonly random: () => number;
  /** Every pod name ever created, in order. */
  readonly created: string[] = [];

  constructor(seed = 1) {
    this.random = prng(seed);
  }

  /** One reconcile; the agent applies it at once (removed pods vanish, new pods start Pending). */
  step(opts: { createBurst?: number } = {}): ReconcileOutput {
    const out = reconcile({ workloads: this.workloads, pods: [...this.pods.values()], nodeName: 'node1', now: this.now, state: this.state, random: this.random, ...opts });
    this.state = out.state;
    this.last = out;
    const want = new Set(out.pods.map((p) => p.metadata!.name!));
    for (const name of [...this.pods.keys()]) if (!want.has(name)) this.pods.delete(name);
    for (const p of out.pods) {
      if (!this.pods.has(p.metadata!.name!)) {
        this.created.push(p.metadata!.name!);
        this.pods.set(p.metadata!.name!, { ...structuredClone(p), status: { phase: 'Pending' } });
      }
    }
    // Round-trip the state through JSON: it must be plain data.
    this.state = JSON.parse(JSON.stringify(this.state)) as ControllerState;
    return out;
  }

  advance(ms: number): this {
    this.now += ms;
    return this;
  }

  pod(name: string): Pod {
    const p = this.pods.get(name);
    if (!p) throw new Error(`no pod ${name}`);
    return p;
  }

  setStatus(name: string, status: Pod['status']): this {
    this.pods.set(name, { ...this.pod(name), status });
    return this;
  }

  setReady(name: string, ready = true): this {
    const p = this.pod(name);
    this.setStatus(name, {
      phase: 'Running',
      conditions: [{ type: 'Ready', status: ready ? 'True' : 'False', lastTransitionTime: new Date(this.now).toISOString() }],
      containerStatuses: [{ name: 'app', image: 'x', imageID: '', ready, restartCount: p.status?.containerStatuses?.[0]?.restartCount ?? 0, state: { running: {} } }],
    });
    return this;
  }

  restart(name: string, n = 1): this {
    const p = this.pod(name);
    this.setStatus(name, {
      phase: 'Running',
      conditions: [{ type: 'Ready', status: 'False' }],
      containerStatuses: [{ name: 'app', image: 'x', imageID: '', ready: false, restartCount: (p.status?.containerStatuses?.[0]?.restartCount ?? 0) + n }],
    });
    return this;
  }

  finish(name: string, phase: 'Succeeded' | 'Failed'): this {
    const p = this.pod(name);
    const at = new Date(this.now).toISOString();
    this.setStatus(name, {
      phase,
      conditions: [{ type: 'Ready', status: 'False', reason: 'PodCompleted' }],
      containerStatuses: [
        { name: 'app', image: 'x', imageID: '', ready: false, restartCount: 0, state: { terminated: { exitCode: phase === 'Succeeded' ? 0 : 1, finishedAt: at } } },
      ],
    });
    return this;
  }

  /** Pods owned (directly or through a ReplicaSet) by a workload, by name prefix. */
  podsOf(prefix: string): Pod[] {
    return [...this.pods.values()].filter((p) => p.metadata!.name!.startsWith(`${prefix}-`));
  }

  names(prefix: string): string[] {
    return this.podsOf(prefix).map((p) => p.metadata!.name!);
  }

  status(kind: string, name: string): WorkloadStatus {
    const s = this.last.statuses.find((x) => x.kind === kind && x.name === name);
    if (!s) throw new Error(`no status for ${kind}/${name}`);
    return s;
  }

  readyCount(prefix: string): number {
    return this.podsOf(prefix).filter((p) => p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')).length;
  }
}
