/**
 * The contracts between kubelet-lite's parts. The manifest store, the
 * CRI-config builders, the prober, the status API and the pod workers each
 * live in their own module and meet only through these types.
 */
import type { ConfigMap, Container, Event, Pod, Probe, Secret, Service } from 'kubernetes-types/core/v1.js';
import type { ContainerConfig } from '../gen/runtime/v1/ContainerConfig.js';
import type { PodSandboxConfig } from '../gen/runtime/v1/PodSandboxConfig.js';
import type { CriEndpoint } from './cri-client.js';
import type { LogRef } from './log-files.js';
import type { ObjectSource, StoredObject } from '../stored-object.js';

export type { ObjectSource, StoredObject };

// ---------------------------------------------------------------- labels

/** On every sandbox and container kubelet-lite creates, so a restarted agent can find them. */
export const MANAGED_BY_LABEL = 'io.skiff.kubelet-lite/managed';
/** The node name the agent ran as: two agents on one runtime leave each other's pods alone. */
export const NODE_LABEL = 'io.skiff.kubelet-lite/node';
// The kubelet's own labels and annotations, so crictl users see what they know.
export const POD_NAME_LABEL = 'io.kubernetes.pod.name';
export const POD_NAMESPACE_LABEL = 'io.kubernetes.pod.namespace';
export const POD_UID_LABEL = 'io.kubernetes.pod.uid';
export const CONTAINER_NAME_LABEL = 'io.kubernetes.container.name';
export const RESTART_COUNT_ANNOTATION = 'io.kubernetes.container.restartCount';
export const TERMINATION_MESSAGE_PATH_ANNOTATION = 'io.kubernetes.container.terminationMessagePath';
export const TERMINATION_MESSAGE_POLICY_ANNOTATION = 'io.kubernetes.container.terminationMessagePolicy';
export const TERMINATION_GRACE_ANNOTATION = 'io.kubernetes.pod.terminationGracePeriod';
/** The image the container's spec named when it was made: a pod update that changes it restarts the container. */
export const CONTAINER_IMAGE_ANNOTATION = 'io.skiff.kubelet-lite/image';
/** Which list a container came from: "init", "sidecar" or "app". */
export const CONTAINER_TYPE_LABEL = 'io.skiff.kubelet-lite/container-type';

// ---------------------------------------------------------------- manifests

/** A manifest (or one document of it) that could not be used, with the reason. */
export interface ManifestProblem {
  file: string;
  line: number;
  /** The object's kind/namespace/name when it got that far. */
  object?: string;
  reason: string;
}

export type ChangeType = 'added' | 'modified' | 'deleted';

export interface ObjectChange {
  type: ChangeType;
  /** For 'deleted' the last version; otherwise the new one. */
  object: StoredObject;
}

/** Every object of every kind read from the manifest directory, keyed by kind/namespace/name. */
export interface ObjectLookup {
  get(kind: string, namespace: string, name: string): StoredObject | undefined;
  list(kind?: string): StoredObject[];
  configMap(namespace: string, name: string): ConfigMap | undefined;
  secret(namespace: string, name: string): Secret | undefined;
}

/**
 * A pod validated (and admitted): runnable, or not with the reasons. `reason`
 * is the pod status reason shown for it: InvalidManifest unless admission
 * refused a valid pod (SysctlForbidden), whose message carries no file.
 */
export type PodValidation =
  | { ok: true; pod: Pod }
  /** `blocked`: a valid pod the node cannot run as asked (soft admission): shown Pending with its containers Blocked, not Failed. */
  | { ok: false; reasons: string[]; reason?: string; blocked?: Pod };

// ---------------------------------------------------------------- CRI configs

/** What the CRI-config builders and the volume manager need to know about one pod. */
export interface PodContext {
  /** Validated and defaulted. */
  pod: Pod;
  uid: string;
  nodeName: string;
  hostIP: string;
  /** Known once the sandbox runs. */
  podIP?: string;
  clusterDomain: string;
  /** Nameservers for ClusterFirst pods. */
  clusterDNS: string[];
  /** The host's resolver config, for Default pods (and ClusterFirst pods when clusterDNS is empty). */
  hostResolvConf: string;
  /** <root-dir>/pods/<uid>: volumes, etc-hosts, termination logs. */
  podDir: string;
  /** The host ids of a `hostUsers: false` pod's user namespace, once allocated (the same for uids and gids). */
  userns?: { hostId: number; length: number };
  objects: ObjectLookup;
}

/** A container spec that cannot be turned into a CRI config (a missing ConfigMap key, a bad subPath...). */
export class ContainerConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ContainerConfigError';
  }
}

export interface ContainerConfigOptions {
  kind: 'init' | 'sidecar' | 'app';
  restartCount: number;
  /** The image reference to run (the pulled image's id or digest reference). */
  image: string;
  /** Each pod volume's name → the host path prepared for it (VolumeManager.setUp). */
  volumes: Map<string, string>;
  /** The pod's managed hosts file (VolumeManager.writeEtcHosts), mounted at /etc/hosts. */
  etcHosts?: string;
  /**
   * The image's user from ImageStatus (`image.uid` / `image.username`): passed
   * on as the user to run as when the pod sets none, and checked against
   * runAsNonRoot. Left out, the runtime picks the image's user, and a
   * runAsNonRoot container without runAsUser is refused (it cannot be verified).
   */
  imageUser?: { uid?: number; username?: string };
  /**
   * Filled with what the kubelet reports as Warning events without failing
   * the container (envFrom keys that are not valid variable names: reason
   * InvalidEnvironmentVariableNames).
   */
  warnings?: string[];
}

export interface ConfigBuilder {
  sandboxConfig(ctx: PodContext, attempt: number): PodSandboxConfig;
  /** Throws ContainerConfigError for what the kubelet reports as CreateContainerConfigError. */
  containerConfig(
    ctx: PodContext,
    container: Container,
    opts: ContainerConfigOptions,
  ): ContainerConfig;
}

export interface VolumeManager {
  /** Makes every volume of the pod ready on the host; returns name → host path. Idempotent. */
  setUp(ctx: PodContext): Promise<Map<string, string>>;
  /** Re-renders configMap, secret, downwardAPI and projected volumes in place (atomically). */
  refresh(ctx: PodContext): Promise<void>;
  /** Writes the kubelet-style managed /etc/hosts for the pod (needs podIP) and returns its path. */
  writeEtcHosts(ctx: PodContext): Promise<string>;
  /** Unmounts and removes everything under the pod's directory. Idempotent. */
  tearDown(uid: string): Promise<void>;
  /**
   * Empties the pod's emptyDirs (a memory-backed one unmounted), as the
   * kubelet tears down the volumes of a pod that has ended: an evicted
   * pod gives back the disk and memory they held while it stays shown.
   */
  emptyEmptyDirs?(ctx: PodContext): Promise<void>;
}

// ---------------------------------------------------------------- probes and hooks

export type ProbeKind = 'liveness' | 'readiness' | 'startup';
export type ProbeResult = 'success' | 'failure' | 'unknown';

export interface ProbeOutcome {
  /** 'unknown': the probe could not run (container gone, no such named port); the prober keeps its last result. */
  result: ProbeResult;
  /** What failed, as the kubelet's Unhealthy event says it ("HTTP probe failed with statuscode: 500"). */
  message: string;
  /** A success the kubelet reports as a ProbeWarning event (an HTTP redirect to another host it did not follow). */
  warning?: boolean;
}

/** Where probes and hooks reach a container. */
export interface ProbeTarget {
  containerId: string;
  /** The default host of httpGet/tcpSocket and the host of grpc probes. */
  podIP: string;
  container: Container;
  /** Names the pod in hook messages, as the kubelet's `name_namespace(uid)`. */
  pod?: { name: string; namespace: string; uid: string };
}

export interface ProbeRunner {
  /** Bounded by the probe's timeoutSeconds; never throws; `signal` abandons it ('unknown'). */
  probe(probe: Probe, target: ProbeTarget, signal?: AbortSignal): Promise<ProbeOutcome>;
}

// ---------------------------------------------------------------- status API

/** Read-only views the status API and the CLI serve. Everything returned is a copy. */
export interface AgentView {
  pods(): Pod[];
  pod(namespace: string, name: string): Pod | undefined;
  events(): Event[];
  problems(): ManifestProblem[];
  /**
   * The CRI log file of a container (the previous instance's with
   * `previous`): the agent's root, and the path beneath it that is opened
   * with no symlink followed.
   */
  logPath(namespace: string, pod: string, container: string, previous: boolean): Promise<LogRef | undefined>;
  /**
   * Calls `listener` with a copy of each pod as it is added, changes or goes,
   * synchronously from the agent (so a caller that subscribes and then lists
   * misses nothing). Returns the unsubscribe.
   */
  watchPods(listener: (type: PodWatchType, pod: Pod) => void): () => void;
  /** The Services as the node's proxy programs them (allocated cluster IPs and node ports), when one runs beside the agent. */
  services?(): Service[];
  /** The workloads' statuses (Deployments, DaemonSets, Jobs, CronJobs) from their controllers, when the agent runs them. */
  workloads?(): Array<{ kind: string; namespace: string; name: string; status: Record<string, unknown>; spec: Record<string, unknown>; problems: string[]; createdAt: number }>;
  cri: CriEndpoint;
}

export type PodWatchType = 'ADDED' | 'MODIFIED' | 'DELETED';
