/**
 * An in-memory CRI runtime for unit tests of the node agent. It keeps the
 * semantics the agent relies on — labels and annotations as given,
 * metadata attempts, containers CREATED → RUNNING → EXITED, sandboxes
 * READY → NOTREADY, timestamps in ns from the injected clock, list filters
 * by id prefix, sandbox id, state and label selector, and the gRPC codes a
 * runtime answers (NotFound, FailedPrecondition, AlreadyExists; stop and
 * remove of what is gone are success) — and lets the test:
 *
 * - make a running container exit with a code when it chooses (`exit`), or
 *   from `onStart` (a container that crashes at once, or later on a timer);
 * - kill a sandbox (`killSandbox`), as an infra process that died;
 * - fail the next matching call with a gRPC status (`fail`), or hold it
 *   until released (`hold`);
 * - read every call back (`calls`, `callsOf`).
 *
 * test/unit/kubelet-fake-cri.test.ts checks its contract; a call the agent
 * does not make answers UNIMPLEMENTED.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import type { CriEndpoint, ImageCalls, RuntimeCalls } from '../../src/kubelet-lite/cri-client.js';
import type { ContainerConfig } from '../../src/gen/runtime/v1/ContainerConfig.js';
import type { ContainerEventResponse__Output } from '../../src/gen/runtime/v1/ContainerEventResponse.js';
import type { ContainerStatus__Output } from '../../src/gen/runtime/v1/ContainerStatus.js';
import type { Container__Output } from '../../src/gen/runtime/v1/Container.js';
import type { CreateContainerRequest } from '../../src/gen/runtime/v1/CreateContainerRequest.js';
import type { ExecSyncRequest } from '../../src/gen/runtime/v1/ExecSyncRequest.js';
import type { Image__Output } from '../../src/gen/runtime/v1/Image.js';
import type { ImageStatusRequest } from '../../src/gen/runtime/v1/ImageStatusRequest.js';
import type { ListContainersRequest } from '../../src/gen/runtime/v1/ListContainersRequest.js';
import type { ListPodSandboxRequest } from '../../src/gen/runtime/v1/ListPodSandboxRequest.js';
import type { PodSandboxConfig } from '../../src/gen/runtime/v1/PodSandboxConfig.js';
import type { PodSandboxStatus__Output } from '../../src/gen/runtime/v1/PodSandboxStatus.js';
import type { PodSandbox__Output } from '../../src/gen/runtime/v1/PodSandbox.js';
import type { PullImageRequest } from '../../src/gen/runtime/v1/PullImageRequest.js';
import type { RunPodSandboxRequest } from '../../src/gen/runtime/v1/RunPodSandboxRequest.js';
import { grpcError } from './cri-double.js';

export type FakeContainerState = 'CONTAINER_CREATED' | 'CONTAINER_RUNNING' | 'CONTAINER_EXITED';
export type FakeSandboxState = 'SANDBOX_READY' | 'SANDBOX_NOTREADY';

export interface FakeSandbox {
  id: string;
  config: PodSandboxConfig;
  runtimeHandler: string;
  state: FakeSandboxState;
  /** ns */
  createdAt: number;
  ip: string;
}

export interface FakeContainer {
  id: string;
  sandboxId: string;
  config: ContainerConfig;
  state: FakeContainerState;
  imageRef: string;
  /** ns; 0 until it happened */
  createdAt: number;
  startedAt: number;
  finishedAt: number;
  exitCode: number;
  reason: string;
  logPath: string;
}

export interface FakeImage {
  id: string;
  repoTags: string[];
  uid?: number;
  username?: string;
}

export interface FakeCall {
  method: string;
  req: unknown;
  timeoutMs?: number;
  /** The injected clock's ms when the call arrived. */
  at: number;
}

export interface ExecResult {
  exitCode: number;
  stdout?: string;
  stderr?: string;
}

/** A call held by `hold`: it waits until the test releases or fails it. */
export interface Gate {
  /** Resolves with the call once one reached the gate. */
  readonly reached: Promise<FakeCall>;
  /** The call goes on (its effect happens now). */
  release(): void;
  /** The call fails with this status instead. */
  fail(code: grpc.status, details: string): void;
}

interface Fault {
  method: string;
  match?: (req: never) => boolean;
  times: number;
  code: grpc.status;
  details: string;
}

interface Hold {
  method: string;
  match?: (req: never) => boolean;
  arrive: (call: FakeCall) => void;
  go: Promise<void>;
}

type EventType = 'CONTAINER_CREATED_EVENT' | 'CONTAINER_STARTED_EVENT' | 'CONTAINER_STOPPED_EVENT' | 'CONTAINER_DELETED_EVENT';

/** Nanoseconds for a clock reading, half-way through its millisecond (a float64 of a 2030 date in ns is exact to 256 ns). */
const ns = (ms: number) => ms * 1e6 + 500_000;

const matches = (labels: Record<string, string> | undefined, selector: Record<string, string> | undefined) =>
  Object.entries(selector ?? {}).every(([k, v]) => labels?.[k] === v);

export interface FakeCriOptions {
  /** The clock every timestamp comes from (ms since the epoch). */
  now: () => number;
  /** Whether GetContainerEvents is served (else it ends at once with UNIMPLEMENTED, as in older runtimes). */
  events?: boolean;
}

export class FakeCri implements CriEndpoint {
  readonly calls: FakeCall[] = [];
  readonly sandboxes = new Map<string, FakeSandbox>();
  readonly containers = new Map<string, FakeContainer>();
  /** Every container ever created, removed ones too (to name the containers of old calls). */
  readonly everCreated = new Map<string, FakeContainer>();
  readonly imageStore = new Map<string, FakeImage>();
  /** Image references a pull finds (a registry's content); pulling anything else fails. */
  readonly registry = new Map<string, Omit<FakeImage, 'id' | 'repoTags'>>();
  /** Called once a container runs: the test may `exit` it here, or later. */
  onStart: ((c: FakeContainer) => void) | undefined;
  /** What a command run by ExecSync does (default: exits 0 at once). */
  exec: (c: FakeContainer, req: ExecSyncRequest) => ExecResult | Promise<ExecResult> = () => ({ exitCode: 0 });
  /**
   * How a container takes its stop signal: 'exit' ends it at once (code 143,
   * as a process killed by SIGTERM); 'ignore' makes StopContainer wait out
   * its timeout and then kill it (code 137).
   */
  stopSignal: (c: FakeContainer) => 'exit' | 'ignore' = () => 'exit';

  readonly runtime: RuntimeCalls;
  readonly images: ImageCalls;
  private readonly now: () => number;
  private readonly faults: Fault[] = [];
  private readonly holds: Hold[] = [];
  private readonly listeners = new Set<(e: ContainerEventResponse__Output) => void>();
  private readonly serveEvents: boolean;
  private seq = 0;

  constructor(opts: FakeCriOptions) {
    this.now = opts.now;
    this.serveEvents = opts.events ?? true;
    const runtime = {
      version: () => ({ version: '0.1.0', runtimeName: 'fake', runtimeVersion: '0.0.1', runtimeApiVersion: 'v1' }),
      status: () => ({
        status: { conditions: [{ type: 'RuntimeReady', status: true, reason: '', message: '' }, { type: 'NetworkReady', status: true, reason: '', message: '' }] },
        info: {},
        runtimeHandlers: [{ name: '', features: { recursiveReadOnlyMounts: false, userNamespaces: false } }],
        features: null,
      }),
      runPodSandbox: (r: RunPodSandboxRequest) => ({ podSandboxId: this.runPodSandbox(r) }),
      stopPodSandbox: (r: { podSandboxId?: string }) => (this.stopPodSandbox(r.podSandboxId ?? ''), {}),
      removePodSandbox: (r: { podSandboxId?: string }) => (this.removePodSandbox(r.podSandboxId ?? ''), {}),
      podSandboxStatus: (r: { podSandboxId?: string }) => ({ status: this.sandboxStatus(this.sandbox(r.podSandboxId ?? '')), info: {}, containersStatuses: [], timestamp: ns(this.now()) }),
      listPodSandbox: (r: ListPodSandboxRequest) => ({ items: this.listPodSandbox(r) }),
      createContainer: (r: CreateContainerRequest) => ({ containerId: this.createContainer(r) }),
      startContainer: (r: { containerId?: string }) => (this.startContainer(r.containerId ?? ''), {}),
      stopContainer: (r: { containerId?: string; timeout?: number }) => this.stopContainer(r.containerId ?? '', Number(r.timeout ?? 0)).then(() => ({})),
      removeContainer: (r: { containerId?: string }) => (this.removeContainer(r.containerId ?? ''), {}),
      listContainers: (r: ListContainersRequest) => ({ containers: this.listContainers(r) }),
      containerStatus: (r: { containerId?: string }) => ({ status: this.containerStatusOf(this.container(r.containerId ?? '')), info: {} }),
      execSync: (r: ExecSyncRequest) => this.execSync(r),
    };
    const images = {
      imageStatus: (r: ImageStatusRequest) => ({ image: this.imageOut(this.findImage(r.image?.image ?? '')), info: {} }),
      pullImage: (r: PullImageRequest) => ({ imageRef: this.pull(r.image?.image ?? '') }),
      listImages: () => ({ images: [...this.imageStore.values()].map((i) => this.imageOut(i)!) }),
      removeImage: (r: { image?: { image?: string } }) => {
        const img = this.findImage(r.image?.image ?? '');
        if (img) this.imageStore.delete(img.id);
        return {};
      },
    };
    this.runtime = this.served(runtime) as unknown as RuntimeCalls;
    this.images = this.served(images) as unknown as ImageCalls;
  }

  // ------------------------------------------------------------ test controls

  /** An image already on the node. Returns its id. */
  addImage(ref: string, user: { uid?: number; username?: string } = {}): string {
    const id = `sha256:${createHash('sha256').update(ref).digest('hex')}`;
    const have = this.imageStore.get(id);
    if (have) return id;
    this.imageStore.set(id, { id, repoTags: [ref], ...user });
    return id;
  }

  /** The next `times` calls of `method` (matching `match`) fail with `code`. */
  fail<R = unknown>(method: string, code: grpc.status, details: string, opts: { times?: number; match?: (req: R) => boolean } = {}): void {
    this.faults.push({ method, code, details, times: opts.times ?? 1, match: opts.match as Fault['match'] });
  }

  /** The next call of `method` (matching `match`) waits until the gate opens; its effect happens then. */
  hold<R = unknown>(method: string, match?: (req: R) => boolean): Gate {
    let arrive!: (c: FakeCall) => void;
    const reached = new Promise<FakeCall>((r) => (arrive = r));
    let release!: () => void;
    let reject!: (e: Error) => void;
    const go = new Promise<void>((res, rej) => {
      release = res;
      reject = rej;
    });
    go.catch(() => undefined);
    this.holds.push({ method, match: match as Hold['match'], arrive, go });
    return { reached, release: () => release(), fail: (code, details) => reject(grpcError(code, details)) };
  }

  /** The running container exits with `exitCode` now. */
  exit(id: string, exitCode: number, reason?: string): void {
    const c = this.container(id);
    if (c.state !== 'CONTAINER_RUNNING') throw new Error(`container ${id} is ${c.state}, it cannot exit`);
    this.finish(c, exitCode, reason);
  }

  /** The sandbox's infrastructure died: it is not ready, and its containers were killed with it. */
  killSandbox(id: string): void {
    const sb = this.sandbox(id);
    for (const c of this.containers.values()) if (c.sandboxId === id && c.state === 'CONTAINER_RUNNING') this.finish(c, 137);
    sb.state = 'SANDBOX_NOTREADY';
  }

  /** Ends the container event stream for everyone subscribed (the runtime restarted, say). */
  endEvents(): void {
    const ls = [...this.listeners];
    this.listeners.clear();
    for (const l of ls) (l as unknown as { end: (e?: Error) => void }).end?.(grpcError(grpc.status.UNAVAILABLE, 'the runtime went away'));
  }

  callsOf<R = Record<string, unknown>>(method: string): Array<FakeCall & { req: R }> {
    return this.calls.filter((c) => c.method === method) as Array<FakeCall & { req: R }>;
  }

  /** "createContainer web", "startContainer web"…: the container calls in order, by container name. */
  containerOps(...methods: string[]): string[] {
    const want = methods.length ? methods : ['createContainer', 'startContainer', 'stopContainer', 'removeContainer'];
    return this.calls
      .filter((c) => want.includes(c.method))
      .map((c) => {
        const r = c.req as { containerId?: string; config?: { metadata?: { name?: string } } };
        return `${c.method} ${r.config?.metadata?.name ?? this.everCreated.get(r.containerId ?? '')?.config.metadata?.name ?? r.containerId}`;
      });
  }

  /** The containers of a pod (by its uid label) with this name, newest first. */
  containersNamed(podUid: string, name: string): FakeContainer[] {
    return [...this.containers.values()]
      .filter((c) => c.config.labels?.['io.kubernetes.pod.uid'] === podUid && c.config.metadata?.name === name)
      .sort((a, b) => b.createdAt - a.createdAt || (b.config.metadata?.attempt ?? 0) - (a.config.metadata?.attempt ?? 0));
  }

  /** The sandboxes of a pod (by its uid label), newest first. */
  sandboxesOf(podUid: string): FakeSandbox[] {
    return [...this.sandboxes.values()].filter((s) => s.config.labels?.['io.kubernetes.pod.uid'] === podUid).sort((a, b) => b.createdAt - a.createdAt);
  }

  // ------------------------------------------------------------ CriEndpoint

  containerEvents(onEvent: (e: ContainerEventResponse__Output) => void, onEnd: (err?: Error) => void): { cancel(): void } {
    let ended = false;
    const end = (err?: Error) => {
      if (ended) return;
      ended = true;
      this.listeners.delete(listener);
      queueMicrotask(() => onEnd(err));
    };
    const listener = Object.assign((e: ContainerEventResponse__Output) => onEvent(e), { end });
    if (!this.serveEvents) end(grpcError(grpc.status.UNIMPLEMENTED, 'GetContainerEvents is not implemented'));
    else this.listeners.add(listener);
    return { cancel: () => end(grpcError(grpc.status.CANCELLED, 'Cancelled on client')) };
  }

  close(): void {
    this.listeners.clear();
  }

  // ------------------------------------------------------------ the calls

  /** Wraps each call: recorded, then failed or held as the test asked, then done. */
  private served(impl: Record<string, (req: never) => unknown>): unknown {
    return new Proxy(impl, {
      get: (target, prop) => {
        if (typeof prop !== 'string' || prop === 'then') return undefined;
        const fn = target[prop];
        return async (req: unknown, timeoutMs?: number) => {
          const call: FakeCall = { method: prop, req: structuredClone(req), timeoutMs, at: this.now() };
          this.calls.push(call);
          if (!fn) throw grpcError(grpc.status.UNIMPLEMENTED, `${prop} is not in the fake runtime`);
          const fault = this.faults.find((f) => f.method === prop && f.times > 0 && (!f.match || f.match(req as never)));
          if (fault) {
            fault.times--;
            throw grpcError(fault.code, fault.details);
          }
          const hold = this.holds.find((h) => h.method === prop && (!h.match || h.match(req as never)));
          if (hold) {
            this.holds.splice(this.holds.indexOf(hold), 1);
            hold.arrive(call);
            await hold.go;
          }
          return structuredClone(await fn(req as never));
        };
      },
    });
  }

  private id(prefix: string): string {
    return `${prefix}${(++this.seq).toString(16).padStart(8, '0')}`;
  }

  private sandbox(id: string): FakeSandbox {
    const sb = this.sandboxes.get(id);
    if (!sb) throw grpcError(grpc.status.NOT_FOUND, `pod sandbox "${id}" not found`);
    return sb;
  }

  private container(id: string): FakeContainer {
    const c = this.containers.get(id);
    if (!c) throw grpcError(grpc.status.NOT_FOUND, `container "${id}" not found`);
    return c;
  }

  private runPodSandbox(r: RunPodSandboxRequest): string {
    const config = r.config;
    const md = config?.metadata;
    if (!config || !md?.name || !md.namespace || !md.uid) throw grpcError(grpc.status.INVALID_ARGUMENT, 'RunPodSandbox: metadata name, namespace and uid are required');
    const clash = [...this.sandboxes.values()].find((s) => {
      const o = s.config.metadata!;
      return o.name === md.name && o.namespace === md.namespace && o.uid === md.uid && (o.attempt ?? 0) === (md.attempt ?? 0);
    });
    if (clash) throw grpcError(grpc.status.ALREADY_EXISTS, `pod sandbox name ${md.name}_${md.namespace}_${md.uid}_${md.attempt ?? 0} is reserved for ${clash.id}`);
    const id = this.id('sb');
    const hostNetwork = config.linux?.securityContext?.namespaceOptions?.network === 'NODE';
    this.sandboxes.set(id, { id, config: structuredClone(config), runtimeHandler: r.runtimeHandler ?? '', state: 'SANDBOX_READY', createdAt: ns(this.now()), ip: hostNetwork ? '' : `10.88.0.${(this.seq % 250) + 2}` });
    return id;
  }

  private stopPodSandbox(id: string): void {
    const sb = this.sandboxes.get(id);
    // Stopping what is gone is success: the kubelet retries stops.
    if (!sb) return;
    for (const c of this.containers.values()) if (c.sandboxId === id && c.state === 'CONTAINER_RUNNING') this.finish(c, 137);
    sb.state = 'SANDBOX_NOTREADY';
  }

  private removePodSandbox(id: string): void {
    if (!this.sandboxes.has(id)) return;
    this.stopPodSandbox(id);
    for (const c of [...this.containers.values()]) if (c.sandboxId === id) this.removeContainer(c.id);
    this.sandboxes.delete(id);
  }

  private sandboxStatus(sb: FakeSandbox): PodSandboxStatus__Output {
    return {
      id: sb.id,
      metadata: { name: sb.config.metadata!.name!, uid: sb.config.metadata!.uid!, namespace: sb.config.metadata!.namespace!, attempt: sb.config.metadata!.attempt ?? 0 },
      state: sb.state,
      createdAt: sb.createdAt,
      network: { ip: sb.ip, additionalIps: [] },
      linux: null,
      labels: { ...(sb.config.labels ?? {}) },
      annotations: { ...(sb.config.annotations ?? {}) },
      runtimeHandler: sb.runtimeHandler,
    };
  }

  private listPodSandbox(r: ListPodSandboxRequest): PodSandbox__Output[] {
    const f = r.filter;
    return [...this.sandboxes.values()]
      .filter((s) => !f?.id || s.id.startsWith(f.id))
      .filter((s) => !f?.state || s.state === f.state.state)
      .filter((s) => matches(s.config.labels, f?.labelSelector))
      .map((s) => {
        const { network: _n, linux: _l, ...rest } = this.sandboxStatus(s);
        return rest;
      });
  }

  private findImage(ref: string): FakeImage | undefined {
    if (!ref) return undefined;
    return this.imageStore.get(ref) ?? [...this.imageStore.values()].find((i) => i.repoTags.includes(ref));
  }

  private imageOut(i: FakeImage | undefined): Image__Output | null {
    if (!i) return null;
    return { id: i.id, repoTags: [...i.repoTags], repoDigests: [], size: 1024, uid: i.uid === undefined ? null : { value: i.uid }, username: i.username ?? '', spec: { image: i.id, annotations: {}, userSpecifiedImage: '', runtimeHandler: '', imageRef: i.id }, pinned: false };
  }

  private pull(ref: string): string {
    const found = this.registry.get(ref);
    if (!found) throw grpcError(grpc.status.UNKNOWN, `failed to pull and unpack image "${ref}": failed to resolve reference "${ref}": not found`);
    return this.addImage(ref, found);
  }

  private createContainer(r: CreateContainerRequest): string {
    const sb = this.sandbox(r.podSandboxId ?? '');
    if (sb.state !== 'SANDBOX_READY') throw grpcError(grpc.status.FAILED_PRECONDITION, `pod sandbox ${sb.id} is not ready`);
    const config = r.config;
    const md = config?.metadata;
    if (!config || !md?.name) throw grpcError(grpc.status.INVALID_ARGUMENT, 'CreateContainer: metadata.name is required');
    const pmd = sb.config.metadata!;
    const clash = [...this.containers.values()].find((c) => c.sandboxId === sb.id && c.config.metadata?.name === md.name && (c.config.metadata?.attempt ?? 0) === (md.attempt ?? 0));
    if (clash) throw grpcError(grpc.status.ALREADY_EXISTS, `container name ${md.name}_${pmd.name}_${pmd.namespace}_${pmd.uid}_${md.attempt ?? 0} is reserved for ${clash.id}`);
    const image = this.findImage(config.image?.image ?? '');
    if (!image) throw grpcError(grpc.status.NOT_FOUND, `image "${config.image?.image ?? ''}" not found: pull it first`);
    const id = this.id('ct');
    const c: FakeContainer = {
      id,
      sandboxId: sb.id,
      config: structuredClone(config),
      state: 'CONTAINER_CREATED',
      imageRef: image.id,
      createdAt: ns(this.now()),
      startedAt: 0,
      finishedAt: 0,
      exitCode: 0,
      reason: '',
      logPath: config.logPath ? path.join(sb.config.logDirectory ?? '', config.logPath) : '',
    };
    this.containers.set(id, c);
    this.everCreated.set(id, c);
    this.emit('CONTAINER_CREATED_EVENT', c);
    return id;
  }

  private startContainer(id: string): void {
    const c = this.container(id);
    if (c.state !== 'CONTAINER_CREATED') throw grpcError(grpc.status.FAILED_PRECONDITION, `container ${id} is ${c.state}, not CONTAINER_CREATED`);
    if (this.sandboxes.get(c.sandboxId)?.state !== 'SANDBOX_READY') throw grpcError(grpc.status.FAILED_PRECONDITION, `pod sandbox ${c.sandboxId} is not ready`);
    c.state = 'CONTAINER_RUNNING';
    c.startedAt = ns(this.now());
    this.emit('CONTAINER_STARTED_EVENT', c);
    this.onStart?.(c);
  }

  private async stopContainer(id: string, timeoutSeconds: number): Promise<void> {
    const c = this.container(id);
    if (c.state !== 'CONTAINER_RUNNING') return;
    if (timeoutSeconds > 0 && this.stopSignal(c) === 'exit') return this.finish(c, 143);
    if (timeoutSeconds > 0) {
      await new Promise<void>((resolve) => setTimeout(resolve, timeoutSeconds * 1000).unref());
      if (c.state !== 'CONTAINER_RUNNING') return;
    }
    this.finish(c, 137);
  }

  private removeContainer(id: string): void {
    const c = this.containers.get(id);
    // Removing what is gone is success.
    if (!c) return;
    if (c.state === 'CONTAINER_RUNNING') this.finish(c, 137);
    this.containers.delete(id);
    this.emit('CONTAINER_DELETED_EVENT', c);
  }

  private containerOut(c: FakeContainer): Container__Output {
    return {
      id: c.id,
      podSandboxId: c.sandboxId,
      metadata: { name: c.config.metadata?.name ?? '', attempt: c.config.metadata?.attempt ?? 0 },
      image: { image: c.config.image?.image ?? '', annotations: {}, userSpecifiedImage: c.config.image?.userSpecifiedImage ?? '', runtimeHandler: '', imageRef: c.imageRef },
      imageRef: c.imageRef,
      state: c.state,
      createdAt: c.createdAt,
      labels: { ...(c.config.labels ?? {}) },
      annotations: { ...(c.config.annotations ?? {}) },
      imageId: c.imageRef,
    };
  }

  private listContainers(r: ListContainersRequest): Container__Output[] {
    const f = r.filter;
    return [...this.containers.values()]
      .filter((c) => !f?.id || c.id.startsWith(f.id))
      .filter((c) => !f?.podSandboxId || c.sandboxId.startsWith(f.podSandboxId))
      .filter((c) => !f?.state || c.state === f.state.state)
      .filter((c) => matches(c.config.labels, f?.labelSelector))
      .map((c) => this.containerOut(c));
  }

  private containerStatusOf(c: FakeContainer): ContainerStatus__Output {
    const o = this.containerOut(c);
    return {
      id: c.id,
      metadata: o.metadata,
      state: c.state,
      createdAt: c.createdAt,
      startedAt: c.startedAt,
      finishedAt: c.finishedAt,
      exitCode: c.exitCode,
      image: o.image,
      imageRef: c.imageRef,
      reason: c.reason,
      message: '',
      labels: o.labels,
      annotations: o.annotations,
      mounts: [],
      logPath: c.logPath,
      resources: null,
      imageId: c.imageRef,
      user: null,
      stopSignal: 'SIGNAL_RUNTIME_DEFAULT',
    };
  }

  private async execSync(r: ExecSyncRequest): Promise<{ stdout: Buffer; stderr: Buffer; exitCode: number }> {
    const c = this.container(r.containerId ?? '');
    if (c.state !== 'CONTAINER_RUNNING') throw grpcError(grpc.status.FAILED_PRECONDITION, `container ${c.id} is not running`);
    const res = await this.exec(c, r);
    return { stdout: Buffer.from(res.stdout ?? ''), stderr: Buffer.from(res.stderr ?? ''), exitCode: res.exitCode };
  }

  private finish(c: FakeContainer, exitCode: number, reason?: string): void {
    c.state = 'CONTAINER_EXITED';
    c.finishedAt = ns(this.now());
    c.exitCode = exitCode;
    c.reason = reason ?? (exitCode === 0 ? 'Completed' : 'Error');
    this.emit('CONTAINER_STOPPED_EVENT', c);
  }

  /** Events reach subscribers after the call that caused them returns, as over a stream. */
  private emit(type: EventType, c: FakeContainer): void {
    if (!this.listeners.size) return;
    const sb = this.sandboxes.get(c.sandboxId);
    const e: ContainerEventResponse__Output = {
      containerId: c.id,
      containerEventType: type,
      createdAt: ns(this.now()),
      podSandboxStatus: sb ? this.sandboxStatus(sb) : null,
      containersStatuses: [this.containerStatusOf(c)],
    };
    for (const l of [...this.listeners]) queueMicrotask(() => l(structuredClone(e)));
  }
}
