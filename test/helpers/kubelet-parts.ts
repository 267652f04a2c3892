/**
 * Fakes of the node agent's parts that are not under test in its unit
 * tests — the prober (probes are tested in kubelet-prober.test.ts) and the
 * volume manager (kubelet-volumes.test.ts) — and a manifest source over the
 * real ObjectStore and parser, fed YAML by the test instead of a watcher.
 */
import path from 'node:path';
import type { Container, Pod } from 'kubernetes-types/core/v1.js';
import type { ManifestSource } from '../../src/kubelet-lite/agent.js';
import { parseManifest } from '../../src/kubelet-lite/manifests.js';
import type { ObjectChange, PodContext, ProbeTarget, VolumeManager } from '../../src/kubelet-lite/model.js';
import type { ProberPort } from '../../src/kubelet-lite/pod-worker.js';
import { ObjectStore } from '../../src/kubelet-lite/store.js';

/** A prober whose verdicts the test sets; with none set, containers are ready, started and healthy (no probes). */
export class FakeProber implements ProberPort {
  readonly added: Array<{ uid: string; name: string; containerId: string; startedAt: number }> = [];
  readonly removed: string[] = [];
  readonly removedPods: string[] = [];
  readonly notReady = new Set<string>();
  readonly unhealthyWhy = new Map<string, string>();

  addContainer(pod: Pod, container: Container, target: ProbeTarget, startedAt: number): void {
    const uid = pod.metadata?.uid ?? '';
    if (this.added.some((a) => a.uid === uid && a.containerId === target.containerId)) return;
    this.added.push({ uid, name: container.name, containerId: target.containerId, startedAt });
  }
  removeContainer(uid: string, name: string): void {
    this.removed.push(`${uid}/${name}`);
  }
  removePod(uid: string): void {
    this.removedPods.push(uid);
  }
  ready(uid: string, name: string): boolean {
    return !this.notReady.has(`${uid}/${name}`);
  }
  started(): boolean {
    return true;
  }
  unhealthy(uid: string, name: string): string | undefined {
    return this.unhealthyWhy.get(`${uid}/${name}`);
  }
  clearUnhealthy(uid: string, name: string): void {
    this.unhealthyWhy.delete(`${uid}/${name}`);
  }
}

/** Volumes that need no host work: each volume "is" a path under the pod's directory; every call is recorded. */
export class FakeVolumes implements VolumeManager {
  readonly calls: string[] = [];
  /** setUp fails with this message while set. */
  failSetUp: string | undefined;

  async setUp(ctx: PodContext): Promise<Map<string, string>> {
    this.calls.push(`setUp ${ctx.uid}`);
    if (this.failSetUp) throw new Error(this.failSetUp);
    return new Map((ctx.pod.spec?.volumes ?? []).map((v) => [v.name, path.join(ctx.podDir, 'volumes', v.name)]));
  }
  async refresh(ctx: PodContext): Promise<void> {
    this.calls.push(`refresh ${ctx.uid}`);
  }
  async writeEtcHosts(ctx: PodContext): Promise<string> {
    this.calls.push(`writeEtcHosts ${ctx.uid}`);
    return path.join(ctx.podDir, 'etc-hosts');
  }
  async tearDown(uid: string): Promise<void> {
    this.calls.push(`tearDown ${uid}`);
  }
}

/** The manifest directory as the agent sees it, written by the test: each file's YAML goes through the real parser and store. */
export class TestManifests implements ManifestSource {
  readonly store: ObjectStore;

  constructor(nodeName: string) {
    this.store = new ObjectStore({ nodeName });
  }

  get objects(): ObjectStore {
    return this.store;
  }

  write(file: string, yaml: string): void {
    const m = parseManifest(file, yaml);
    this.store.replaceFile(file, { objects: m.objects, problems: m.problems });
  }

  remove(file: string): void {
    this.store.removeFile(file);
  }

  async start(onChange: (changes: ObjectChange[]) => void): Promise<void> {
    this.store.subscribe(onChange);
  }
  stop(): void {}
  problems() {
    return this.store.problems();
  }
}

/** A pod manifest with one container "app"; `spec` is YAML lines added to its spec (two-space indent), `container` lines added after the container (or further list items). */
export function podYaml(name: string, opts: { image?: string; namespace?: string; restartPolicy?: string; spec?: string; container?: string } = {}): string {
  return [
    'apiVersion: v1',
    'kind: Pod',
    'metadata:',
    `  name: ${name}`,
    `  namespace: ${opts.namespace ?? 'default'}`,
    'spec:',
    ...(opts.restartPolicy ? [`  restartPolicy: ${opts.restartPolicy}`] : []),
    ...(opts.spec ? [opts.spec] : []),
    '  containers:',
    '  - name: app',
    `    image: ${opts.image ?? 'example.test/app:1'}`,
    ...(opts.container ? [opts.container] : []),
    '',
  ].join('\n');
}
