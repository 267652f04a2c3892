/**
 * The agent's Prometheus metrics, named as the kubelet names them, on a
 * registry of their own (never prom-client's global one, so two agents in one
 * process, or tests, never share series).
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';

/** From 50 ms (a pod whose image is present) to a minute (a slow pull): where pod starts land. */
export const POD_START_BUCKETS = [0.05, 0.1, 0.25, 0.5, 1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60];

/** The container states the kubelet's running_containers gauge counts, CRI's names lower-cased. */
export type ContainerStateLabel = 'created' | 'running' | 'exited' | 'unknown';

export class AgentMetrics {
  readonly registry = new Registry();
  private readonly podStart: Histogram;
  private readonly runningPods: Gauge;
  private readonly runningContainers: Gauge<'container_state'>;
  private readonly restarts: Counter<'namespace' | 'pod' | 'container'>;
  private readonly manifestProblems: Gauge;
  /** The restart series per pod, so a removed pod's series go with it (cardinality stays at the pods on the node). */
  private readonly restartSeries = new Map<string, Set<string>>();

  constructor(opts: { defaultMetrics?: boolean } = {}) {
    const registers = [this.registry];
    this.podStart = new Histogram({
      name: 'kubelet_pod_start_duration_seconds',
      help: 'Duration in seconds from the agent seeing a pod for the first time to the pod starting to run',
      buckets: POD_START_BUCKETS,
      registers,
    });
    this.runningPods = new Gauge({ name: 'kubelet_running_pods', help: 'Number of pods that have a running pod sandbox', registers });
    this.runningContainers = new Gauge({
      name: 'kubelet_running_containers',
      help: 'Number of containers currently running, by state',
      labelNames: ['container_state'],
      registers,
    });
    this.restarts = new Counter({
      name: 'kubelet_container_restarts_total',
      help: 'Restarts of containers of the pods on this node',
      labelNames: ['namespace', 'pod', 'container'],
      registers,
    });
    this.manifestProblems = new Gauge({ name: 'kubelet_manifest_problems', help: 'Manifest files or documents that could not be used', registers });
    if (opts.defaultMetrics !== false) collectDefaultMetrics({ register: this.registry });
  }

  observePodStart(seconds: number): void {
    if (Number.isFinite(seconds) && seconds >= 0) this.podStart.observe(seconds);
  }

  /** `containers` counts containers by state; states not given are set to 0. */
  setRunning(pods: number, containers: Partial<Record<ContainerStateLabel, number>> | number): void {
    this.runningPods.set(pods);
    const byState = typeof containers === 'number' ? { running: containers } : containers;
    for (const state of ['created', 'running', 'exited', 'unknown'] as const) this.runningContainers.set({ container_state: state }, byState[state] ?? 0);
  }

  incRestart(namespace: string, pod: string, container: string): void {
    this.restarts.inc({ namespace, pod, container });
    const key = `${namespace}/${pod}`;
    let set = this.restartSeries.get(key);
    if (!set) this.restartSeries.set(key, (set = new Set()));
    set.add(container);
  }

  /** Drops a removed pod's series. */
  forgetPod(namespace: string, pod: string): void {
    const key = `${namespace}/${pod}`;
    for (const container of this.restartSeries.get(key) ?? []) this.restarts.remove({ namespace, pod, container });
    this.restartSeries.delete(key);
  }

  setManifestProblems(n: number): void {
    this.manifestProblems.set(n);
  }

  /** The Prometheus text exposition. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }
}
