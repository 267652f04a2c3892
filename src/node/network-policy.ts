/**
 * NetworkPolicy on the node: watches NetworkPolicies, Pods and Namespaces
 * in the API and writes the whole nft table again on every change (one
 * transaction, coalesced: see netpol/apply.ts). The agent calls `podReady`
 * between a sandbox's address and its first container, and waits for the
 * rules that include that address: a pod a policy selects never runs
 * unfenced, even before the API's status shows its IP.
 *
 * Nothing is written while no NetworkPolicy exists (and the table is
 * removed when the last one goes): a node without policies has no rules of
 * this kind at all. A write that fails is logged and recorded as a Warning
 * event on every policy (reason FailedToApplyNetworkPolicy); the previous
 * rules stay in force, and the next change or the retry writes again.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { NetworkPolicy } from 'kubernetes-types/networking/v1.js';
import type { ApiClient } from '../api/client.js';
import type { ApiObject } from '../api/types.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { NftApplier } from '../netpol/apply.js';
import { buildModel, type Model, type PolicyNamespace, type PolicyPod } from '../netpol/model.js';
import type { Write } from '../netpol/apply.js';
import { renderCleanup, renderDelta, renderRules } from '../netpol/render.js';
import { run, type Runner } from '../sys/run.js';
import type { ControllerEvents } from './controller-events.js';
import { Informer } from './informer.js';

export interface NetworkPolicyOptions {
  client: ApiClient;
  log: Logger;
  events?: ControllerEvents;
  runner?: Runner;
  /** The nft binary. */
  nft?: string;
  retryMs?: number;
  /** Tests only: every write waits this long before nft runs (a slow nft, to show the agent waits for it). */
  writeDelayMs?: number;
}

const POLICIES = 'networkpolicies.networking.k8s.io';
/** How long the agent's word on a pod's address counts while the API shows no such pod. */
const EARLY_TTL_MS = 120_000;

/** A pod as the rules see it; undefined when it has no address of its own (host network, not started, finished). */
export function policyPod(pod: Pod, ipOverride?: string): PolicyPod | undefined {
  if (pod.spec?.hostNetwork) return undefined;
  const phase = pod.status?.phase;
  if (phase === 'Succeeded' || phase === 'Failed') return undefined;
  const ip = ipOverride ?? pod.status?.podIP;
  if (!ip) return undefined;
  const ports: PolicyPod['ports'] = [];
  for (const c of [...(pod.spec?.initContainers ?? []), ...(pod.spec?.containers ?? [])]) {
    for (const p of c.ports ?? []) if (p.name) ports.push({ name: p.name, port: p.containerPort, protocol: p.protocol ?? 'TCP' });
  }
  return { namespace: pod.metadata?.namespace ?? 'default', name: pod.metadata?.name ?? '', ip, labels: { ...(pod.metadata?.labels ?? {}) }, ports };
}

export class NetworkPolicyController {
  private readonly policies: Informer;
  private readonly pods: Informer;
  private readonly namespaces: Informer;
  private readonly applier: NftApplier;
  /** Pods the agent told of before the API's status has their address: namespace/name → pod and IP. */
  private readonly early = new Map<string, { pod: Pod; ip: string; at: number }>();
  /** The table is in the kernel (written at least once since the last removal). */
  private written = false;
  private retry: NodeJS.Timeout | undefined;
  private stopped = false;
  private pending: Promise<void> = Promise.resolve();

  constructor(private readonly o: NetworkPolicyOptions) {
    const changed = () => this.schedule();
    this.policies = new Informer(o.client, POLICIES, changed, o.log);
    this.pods = new Informer(o.client, 'pods', changed, o.log);
    this.namespaces = new Informer(o.client, 'namespaces', changed, o.log);
    this.applier = new NftApplier(o.runner ?? run, o.nft ?? 'nft', o.writeDelayMs ?? 0);
  }

  async start(): Promise<void> {
    await Promise.all([this.policies.start(), this.pods.start(), this.namespaces.start()]);
    this.schedule();
    await this.pending;
  }

  stop(): void {
    this.stopped = true;
    if (this.retry) clearTimeout(this.retry);
    this.applier.stop();
    this.policies.stop();
    this.pods.stop();
    this.namespaces.stop();
  }

  /** The agent's hook (kubelet-lite/pod-network.ts): resolves once the rules in force include the pod's address. */
  readonly podReady = async (pod: Pod, ip: string): Promise<void> => {
    const key = `${pod.metadata?.namespace ?? 'default'}/${pod.metadata?.name ?? ''}`;
    this.early.set(key, { pod, ip, at: Date.now() });
    if (this.policies.list().length === 0) return;
    await this.sync();
  };

  /** Resolves when the rules for the state seen so far are written (tests). */
  async idle(): Promise<void> {
    await this.pending;
  }

  private schedule(): void {
    if (this.stopped) return;
    this.pending = this.sync().catch(() => undefined);
  }

  /** The model's inputs: every pod with an address (the API's status, or the agent's word before it). */
  private inputs(): { policies: NetworkPolicy[]; pods: PolicyPod[]; namespaces: PolicyNamespace[] } {
    const pods: PolicyPod[] = [];
    const seen = new Set<string>();
    for (const o of this.pods.list()) {
      const pod = o as unknown as Pod;
      const key = `${o.metadata.namespace ?? 'default'}/${o.metadata.name ?? ''}`;
      seen.add(key);
      // Once the API's status has the address, the agent's early word is no longer needed.
      if (pod.status?.podIP) this.early.delete(key);
      const early = this.early.get(key);
      const p = policyPod(pod, pod.status?.podIP ? undefined : early?.ip);
      if (p) pods.push(p);
    }
    const now = Date.now();
    for (const [key, e] of this.early) {
      if (seen.has(key)) continue;
      // A pod the API never showed (or no longer does): its address is not held for long, it may be reused.
      if (now - e.at > EARLY_TTL_MS) {
        this.early.delete(key);
        continue;
      }
      const p = policyPod(e.pod, e.ip);
      if (p) pods.push(p);
    }
    const namespaces = this.namespaces.list().map((n: ApiObject) => ({ name: n.metadata.name ?? '', labels: { ...(n.metadata.labels ?? {}) } }));
    return { policies: this.policies.list() as unknown as NetworkPolicy[], pods, namespaces };
  }

  private async sync(): Promise<void> {
    if (this.stopped) return;
    if (this.policies.list().length === 0) {
      if (!this.written) return;
      await this.applier.apply((applied) => this.render(applied)).catch((err) => this.failed(err));
      return;
    }
    await this.applier.apply((applied) => this.render(applied)).catch((err) => {
      this.failed(err);
      throw err;
    });
  }

  /** The write for the state now: the elements that changed since `applied`, or the whole table; with no policies left, its removal. */
  private render(applied: Model | undefined): Write {
    const { policies, pods, namespaces } = this.inputs();
    if (policies.length === 0) {
      this.written = false;
      return { text: renderCleanup(), model: undefined };
    }
    const model = buildModel(policies, pods, namespaces);
    // Told once while they last: every write would otherwise log them again.
    const problems = JSON.stringify(model.problems);
    if (problems !== this.lastProblems) {
      this.lastProblems = problems;
      for (const p of model.problems) {
        this.o.log.warn('network policy partly not enforced', p);
        const policy = policies.find((x) => `${x.metadata?.namespace ?? 'default'}/${x.metadata?.name ?? ''}` === p.policy);
        if (policy) this.o.events?.record({ ...(policy as unknown as ApiObject), kind: 'NetworkPolicy' }, 'Warning', 'PolicyNotEnforced', p.message);
      }
    }
    this.written = true;
    const full = () => renderRules(model);
    const delta = applied ? renderDelta(applied, model) : undefined;
    return delta !== undefined ? { text: delta, model, full } : { text: full(), model };
  }

  private lastProblems = '[]';

  private failed(err: unknown): void {
    const message = `could not write the node's network policy rules: ${errorMessage(err)}`;
    this.o.log.error('network policies not applied', { error: errorMessage(err) });
    for (const p of this.policies.list()) this.o.events?.record({ ...p, kind: 'NetworkPolicy' }, 'Warning', 'FailedToApplyNetworkPolicy', message);
    if (this.stopped || this.retry) return;
    this.retry = setTimeout(() => {
      this.retry = undefined;
      this.schedule();
    }, this.o.retryMs ?? 5_000);
    this.retry.unref();
  }
}
