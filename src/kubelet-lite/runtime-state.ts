/**
 * What the runtime says about one pod: its sandboxes and every container it
 * still holds, read through plain CRI calls so that any runtime will do.
 * Exited containers never change, so their statuses are cached by id.
 */
import type { ContainerStatus__Output } from '../gen/runtime/v1/ContainerStatus.js';
import type { CriEndpoint } from './cri-client.js';
import { isNotFound } from './cri-client.js';
import { CONTAINER_TYPE_LABEL, POD_UID_LABEL, RESTART_COUNT_ANNOTATION } from './model.js';

export type ContainerKind = 'init' | 'sidecar' | 'app';
export type ObservedContainerState = 'created' | 'running' | 'exited' | 'unknown';

export interface ObservedContainer {
  id: string;
  sandboxId: string;
  name: string;
  kind: ContainerKind;
  restartCount: number;
  state: ObservedContainerState;
  /** Milliseconds since the epoch; 0 when not known. */
  createdAt: number;
  startedAt: number;
  finishedAt: number;
  exitCode: number;
  reason: string;
  message: string;
  image: string;
  imageRef: string;
  logPath: string;
  annotations: Record<string, string>;
}

export interface ObservedSandbox {
  id: string;
  attempt: number;
  ready: boolean;
  createdAt: number;
  ip: string;
  ips: string[];
}

export interface ObservedPod {
  /** Newest first. */
  sandboxes: ObservedSandbox[];
  /** Newest first. */
  containers: ObservedContainer[];
}

const ns2ms = (ns: number) => (ns > 0 ? Math.floor(ns / 1e6) : 0);

function stateOf(s: string): ObservedContainerState {
  switch (s) {
    case 'CONTAINER_CREATED':
      return 'created';
    case 'CONTAINER_RUNNING':
      return 'running';
    case 'CONTAINER_EXITED':
      return 'exited';
    default:
      return 'unknown';
  }
}

export class RuntimeObserver {
  private readonly exited = new Map<string, ContainerStatus__Output>();
  private readonly sandboxIps = new Map<string, { ip: string; ips: string[] }>();

  constructor(private readonly cri: CriEndpoint) {}

  async observe(uid: string): Promise<ObservedPod> {
    const selector = { [POD_UID_LABEL]: uid };
    const [sbs, cts] = await Promise.all([
      this.cri.runtime.listPodSandbox({ filter: { labelSelector: selector } }),
      this.cri.runtime.listContainers({ filter: { labelSelector: selector } }),
    ]);
    const sandboxes: ObservedSandbox[] = [];
    for (const sb of sbs.items) {
      const ready = sb.state === 'SANDBOX_READY';
      let net = this.sandboxIps.get(sb.id);
      if (!net && ready) {
        try {
          const st = await this.cri.runtime.podSandboxStatus({ podSandboxId: sb.id, verbose: false });
          const ip = st.status?.network?.ip ?? '';
          net = { ip, ips: [ip, ...(st.status?.network?.additionalIps ?? []).map((a) => a.ip)].filter(Boolean) };
          this.sandboxIps.set(sb.id, net);
        } catch (err) {
          if (!isNotFound(err)) throw err;
          continue;
        }
      }
      sandboxes.push({ id: sb.id, attempt: sb.metadata?.attempt ?? 0, ready, createdAt: ns2ms(sb.createdAt), ip: net?.ip ?? '', ips: net?.ips ?? [] });
    }
    sandboxes.sort((a, b) => b.createdAt - a.createdAt || b.attempt - a.attempt);

    const containers: ObservedContainer[] = [];
    for (const c of cts.containers) {
      let st = this.exited.get(c.id);
      if (!st) {
        try {
          const r = await this.cri.runtime.containerStatus({ containerId: c.id, verbose: false });
          st = r.status ?? undefined;
        } catch (err) {
          if (!isNotFound(err)) throw err;
        }
        if (!st) continue;
        if (st.state === 'CONTAINER_EXITED') this.exited.set(c.id, st);
      }
      const kind = (c.labels[CONTAINER_TYPE_LABEL] as ContainerKind | undefined) ?? 'app';
      containers.push({
        id: c.id,
        sandboxId: c.podSandboxId,
        name: c.metadata?.name ?? '',
        kind: kind === 'init' || kind === 'sidecar' ? kind : 'app',
        restartCount: Number(c.annotations[RESTART_COUNT_ANNOTATION] ?? c.metadata?.attempt ?? 0) || 0,
        state: stateOf(st.state),
        createdAt: ns2ms(st.createdAt),
        startedAt: ns2ms(st.startedAt),
        finishedAt: ns2ms(st.finishedAt),
        exitCode: st.exitCode,
        reason: st.reason,
        message: st.message,
        image: st.image?.image ?? c.image?.image ?? '',
        imageRef: st.imageRef || c.imageRef,
        logPath: st.logPath,
        annotations: c.annotations,
      });
    }
    containers.sort((a, b) => b.createdAt - a.createdAt || b.restartCount - a.restartCount);
    return { sandboxes, containers };
  }

  /** Drops cached facts about ids the runtime no longer has. */
  forget(ids: Iterable<string>): void {
    for (const id of ids) {
      this.exited.delete(id);
      this.sandboxIps.delete(id);
    }
  }
}
