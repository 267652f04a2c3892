/**
 * The agent's side of the node API's streaming Pod subresources (the API's
 * `PodStreams`, src/api/pod-subresources.ts, met structurally: the agent does
 * not import the API). Logs are read from the container's CRI log file with
 * the same decoder and follower as the status API's /containerLogs; exec,
 * attach and port-forward find the container or sandbox the runtime holds
 * for the pod and ask it over CRI for a streaming URL, as the kubelet does.
 */
import * as grpc from '@grpc/grpc-js';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { isErrno } from '../errors.js';
import type { Logger } from '../log.js';
import { grpcCode, type CriEndpoint } from './cri-client.js';
import { streamCriLog } from './cri-log.js';
import { UnsafeLogError, type LogRef } from './log-files.js';
import type { ObservedPod } from './runtime-state.js';

type RefusalReason = 'BadRequest' | 'NotFound' | 'Forbidden' | 'TooManyRequests' | 'InternalError';

/** A request the agent refuses, with the reason the API answers it with (its StreamRefusal). */
export class PodStreamRefusal extends Error {
  readonly streamRefusal = true;
  constructor(
    readonly reason: RefusalReason,
    message: string,
  ) {
    super(message);
  }
}

export interface PodStreamsAgent {
  getPod(namespace: string, name: string): Pod | undefined;
  logPath(namespace: string, name: string, container: string, previous: boolean): Promise<LogRef | undefined>;
  runtimeOf(namespace: string, name: string): Promise<{ observed: ObservedPod; cri: CriEndpoint } | undefined>;
}

interface PodRef {
  namespace: string;
  name: string;
}

interface LogRequest {
  container: string;
  follow: boolean;
  previous: boolean;
  timestamps: boolean;
  tailLines?: number;
  since?: number;
  limitBytes?: number;
  signal: AbortSignal;
  write(chunk: Buffer): Promise<void>;
}

interface StreamFlags {
  container: string;
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

/** How long the runtime has to hand out a streaming URL. */
const STREAM_URL_TIMEOUT_MS = 10_000;

export class AgentPodStreams {
  constructor(
    private readonly agent: PodStreamsAgent,
    private readonly logger: Logger,
    private readonly logOpts: { pollMs?: number; goneGraceMs?: number } = {},
  ) {}

  async log(pod: PodRef, req: LogRequest): Promise<void> {
    const p = this.agent.getPod(pod.namespace, pod.name);
    if (!p) throw notOnNode(pod);
    const status = [...(p.status?.initContainerStatuses ?? []), ...(p.status?.containerStatuses ?? [])].find((s) => s.name === req.container);
    // The kubelet's `previous` is the status's lastState: while a container waits to be restarted, that is
    // its newest instance (the one that just ended), not the one before it.
    const newestEnded = status?.state?.waiting !== undefined && status.lastState?.terminated !== undefined;
    const ref = await this.agent.logPath(pod.namespace, pod.name, req.container, req.previous && !newestEnded);
    if (!ref) {
      if (req.previous) throw new PodStreamRefusal('BadRequest', `previous terminated container "${req.container}" in pod "${pod.name}" not found`);
      throw new PodStreamRefusal('BadRequest', `container "${req.container}" in pod "${pod.name}" is waiting to start: ${status?.state?.waiting?.reason ?? 'ContainerCreating'}`);
    }
    // limitBytes: the output is cut there and the stream stops, following or not.
    const ac = new AbortController();
    const stop = () => ac.abort();
    req.signal.addEventListener('abort', stop, { once: true });
    let left = req.limitBytes ?? Infinity;
    try {
      await streamCriLog(ref, {
        tailLines: req.tailLines,
        follow: req.follow,
        timestamps: req.timestamps,
        since: req.since,
        signal: ac.signal,
        pollMs: this.logOpts.pollMs,
        goneGraceMs: this.logOpts.goneGraceMs,
        onUnsafe: (err) => this.logger.warn('stopped following a container log replaced by something unsafe to read', { pod: `${pod.namespace}/${pod.name}`, container: req.container, error: err.message }),
        write: async (chunk) => {
          if (left <= 0) return;
          const part = chunk.length > left ? chunk.subarray(0, left) : chunk;
          left -= part.length;
          if (left <= 0) ac.abort();
          await req.write(part);
        },
      });
    } catch (err) {
      if (isErrno(err, 'ENOENT')) throw new PodStreamRefusal('NotFound', `the log of container "${req.container}" in pod "${pod.name}" is gone`);
      if (err instanceof UnsafeLogError) {
        this.logger.warn('refusing to serve a container log that is not a plain file', { pod: `${pod.namespace}/${pod.name}`, container: req.container, error: err.message });
        throw new PodStreamRefusal('Forbidden', `the log of container "${req.container}" in pod "${pod.name}" is not a regular file of its own (${err.why}); not serving it`);
      }
      throw err;
    } finally {
      req.signal.removeEventListener('abort', stop);
    }
  }

  async exec(pod: PodRef, req: StreamFlags & { command: string[] }): Promise<string> {
    const { id, cri } = await this.runningContainer(pod, req.container);
    const res = await cri.runtime
      .Exec({ containerId: id, cmd: req.command, tty: req.tty, stdin: req.stdin, stdout: req.stdout, stderr: req.stderr && !req.tty }, STREAM_URL_TIMEOUT_MS)
      .catch((err: unknown) => Promise.reject(refusalOf(err)));
    return res.url;
  }

  async attach(pod: PodRef, req: StreamFlags): Promise<string> {
    const { id, cri } = await this.runningContainer(pod, req.container);
    const res = await cri.runtime
      .Attach({ containerId: id, tty: req.tty, stdin: req.stdin, stdout: req.stdout, stderr: req.stderr && !req.tty }, STREAM_URL_TIMEOUT_MS)
      .catch((err: unknown) => Promise.reject(refusalOf(err)));
    return res.url;
  }

  async portForward(pod: PodRef, ports: number[]): Promise<string> {
    const rt = await this.agent.runtimeOf(pod.namespace, pod.name);
    if (!rt) throw notOnNode(pod);
    const sandbox = rt.observed.sandboxes.find((s) => s.ready);
    if (!sandbox) throw new PodStreamRefusal('BadRequest', `pod "${pod.name}" has no running sandbox to forward ports into`);
    const res = await rt.cri.runtime.PortForward({ podSandboxId: sandbox.id, port: ports }, STREAM_URL_TIMEOUT_MS).catch((err: unknown) => Promise.reject(refusalOf(err)));
    return res.url;
  }

  private async runningContainer(pod: PodRef, container: string): Promise<{ id: string; cri: CriEndpoint }> {
    const rt = await this.agent.runtimeOf(pod.namespace, pod.name);
    if (!rt) throw notOnNode(pod);
    const c = rt.observed.containers.find((x) => x.name === container && x.state === 'running');
    // The kubelet's words, which kubectl shows after "unable to upgrade connection: ".
    if (!c) throw new PodStreamRefusal('BadRequest', `container not found ("${container}")`);
    return { id: c.id, cri: rt.cri };
  }
}

function notOnNode(pod: PodRef): PodStreamRefusal {
  return new PodStreamRefusal('NotFound', `pod "${pod.name}" in namespace "${pod.namespace}" is not running on this node`);
}

/** A failed CRI call as the API answers it: the runtime's message, by its gRPC code. */
function refusalOf(err: unknown): PodStreamRefusal {
  const message = (err as { details?: string }).details || (err as Error).message || String(err);
  switch (grpcCode(err)) {
    case grpc.status.NOT_FOUND:
      return new PodStreamRefusal('NotFound', message);
    case grpc.status.INVALID_ARGUMENT:
    case grpc.status.FAILED_PRECONDITION:
      return new PodStreamRefusal('BadRequest', message);
    case grpc.status.RESOURCE_EXHAUSTED:
      return new PodStreamRefusal('TooManyRequests', message);
    default:
      return new PodStreamRefusal('InternalError', `the container runtime failed: ${message}`);
  }
}
