/**
 * The node's numbers for metrics.k8s.io (`kubectl top`), from the agent's
 * stats summary: the node's working set and CPU rate, and each running
 * pod's containers', as metrics-server takes them from the kubelet's
 * /stats/summary. The window is the time between two summaries, over
 * which the node's CPU rate is taken.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { MetricsSnapshot, MetricsSource } from '../api/metrics.js';
import type { CpuStats, MemoryStats, Summary } from '../kubelet-lite/stats-summary.js';

export interface MetricsInputs {
  summary(): Promise<Summary>;
  pods(): Pod[];
  nodeLabels?(): Record<string, string> | undefined;
}

const usage = (cpu: CpuStats | undefined, mem: MemoryStats | undefined) =>
  cpu?.usageNanoCores !== undefined && mem?.workingSetBytes !== undefined ? { nanoCores: cpu.usageNanoCores, workingSetBytes: mem.workingSetBytes } : undefined;

/** Turns a summary into the metrics API's snapshot (pods without CPU and memory numbers yet are left out, as metrics-server does). */
export function snapshotOf(s: Summary, pods: Pod[], windowSeconds: number, at: Date, nodeLabels?: Record<string, string>): MetricsSnapshot {
  const byUid = new Map(pods.map((p) => [p.metadata?.uid ?? '', p]));
  const timestamp = at.toISOString().replace(/\.\d{3}Z$/, 'Z');
  const nodeUsage = usage(s.node.cpu, s.node.memory);
  const out: MetricsSnapshot = { nodes: nodeUsage ? [{ name: s.node.nodeName, ...(nodeLabels ? { labels: nodeLabels } : {}), timestamp, windowSeconds, usage: nodeUsage }] : [], pods: [] };
  for (const p of s.pods) {
    const containers = p.containers.flatMap((c) => {
      const u = usage(c.cpu, c.memory) ?? (c.memory?.workingSetBytes !== undefined ? { nanoCores: 0, workingSetBytes: c.memory.workingSetBytes } : undefined);
      return u ? [{ name: c.name, usage: u }] : [];
    });
    if (!containers.length) continue;
    const labels = byUid.get(p.podRef.uid)?.metadata?.labels;
    out.pods.push({ namespace: p.podRef.namespace, name: p.podRef.name, ...(labels ? { labels } : {}), timestamp, windowSeconds, containers });
  }
  return out;
}

/** A source for the API server; one summary at a time, shared by requests that come meanwhile. */
export function metricsSource(inputs: () => MetricsInputs | undefined): MetricsSource {
  let last = 0;
  let pending: Promise<MetricsSnapshot | undefined> | undefined;
  return () => {
    if (pending) return pending;
    const i = inputs();
    if (!i) return Promise.resolve(undefined);
    pending = (async () => {
      const s = await i.summary();
      const now = Date.now();
      const window = last ? Math.max(0.1, (now - last) / 1000) : 0.1;
      last = now;
      return snapshotOf(s, i.pods(), window, new Date(now), i.nodeLabels?.());
    })().finally(() => (pending = undefined));
    return pending;
  };
}
