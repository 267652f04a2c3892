/**
 * An AgentView the tests fill in by hand: pods, events, manifest problems
 * and log files, with the watch the status API subscribes to.
 */
import type { Event, Pod } from 'kubernetes-types/core/v1.js';
import path from 'node:path';
import type { LogRef } from '../../src/kubelet-lite/log-files.js';
import type { CriEndpoint } from '../../src/kubelet-lite/cri-client.js';
import type { AgentView, ManifestProblem, PodWatchType } from '../../src/kubelet-lite/model.js';

export function testPod(namespace: string, name: string, extra: Partial<Pod> = {}): Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { namespace, name, uid: `uid-${namespace}-${name}`, creationTimestamp: '2026-11-30T06:00:00Z', ...extra.metadata },
    spec: { containers: [{ name: 'main', image: 'busybox' }], ...extra.spec },
    status: { phase: 'Running', ...extra.status },
  };
}

export class FakeAgentView implements AgentView {
  readonly byKey = new Map<string, Pod>();
  eventList: Event[] = [];
  problemList: ManifestProblem[] = [];
  /** "<ns>/<pod>/<container>" (with "#previous" for the previous instance) → log file. */
  readonly logs = new Map<string, string>();
  /** The root a log is opened beneath (default: its own directory). */
  readonly roots = new Map<string, string>();
  private readonly listeners = new Set<(type: PodWatchType, pod: Pod) => void>();

  constructor(public cri: CriEndpoint = {} as CriEndpoint) {}

  get watchers(): number {
    return this.listeners.size;
  }

  set(pod: Pod): void {
    const key = `${pod.metadata!.namespace}/${pod.metadata!.name}`;
    const type = this.byKey.has(key) ? 'MODIFIED' : 'ADDED';
    this.byKey.set(key, structuredClone(pod));
    for (const l of this.listeners) l(type, structuredClone(pod));
  }

  delete(namespace: string, name: string): void {
    const pod = this.byKey.get(`${namespace}/${name}`);
    if (!pod) return;
    this.byKey.delete(`${namespace}/${name}`);
    for (const l of this.listeners) l('DELETED', structuredClone(pod));
  }

  pods(): Pod[] {
    return [...this.byKey.values()].map((p) => structuredClone(p));
  }

  pod(namespace: string, name: string): Pod | undefined {
    const p = this.byKey.get(`${namespace}/${name}`);
    return p && structuredClone(p);
  }

  events(): Event[] {
    return structuredClone(this.eventList);
  }

  problems(): ManifestProblem[] {
    return structuredClone(this.problemList);
  }

  async logPath(namespace: string, pod: string, container: string, previous: boolean): Promise<LogRef | undefined> {
    const key = `${namespace}/${pod}/${container}${previous ? '#previous' : ''}`;
    const file = this.logs.get(key);
    const root = this.roots.get(key) ?? (file && path.dirname(file));
    return file === undefined || !root ? undefined : { root, path: path.relative(root, file) };
  }

  watchPods(listener: (type: PodWatchType, pod: Pod) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}
