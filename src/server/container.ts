/** CreateContainer, StartContainer, StopContainer, RemoveContainer, ContainerStatus, ListContainers, ExecSync. */
import type { Container } from '../gen/runtime/v1/Container.js';
import type { ContainerStatusRequest__Output } from '../gen/runtime/v1/ContainerStatusRequest.js';
import type { ContainerStatusResponse } from '../gen/runtime/v1/ContainerStatusResponse.js';
import type { CreateContainerRequest__Output } from '../gen/runtime/v1/CreateContainerRequest.js';
import type { CreateContainerResponse } from '../gen/runtime/v1/CreateContainerResponse.js';
import type { ExecSyncRequest__Output } from '../gen/runtime/v1/ExecSyncRequest.js';
import type { ExecSyncResponse } from '../gen/runtime/v1/ExecSyncResponse.js';
import type { ListContainersRequest__Output } from '../gen/runtime/v1/ListContainersRequest.js';
import type { RemoveContainerRequest__Output } from '../gen/runtime/v1/RemoveContainerRequest.js';
import type { StartContainerRequest__Output } from '../gen/runtime/v1/StartContainerRequest.js';
import type { StopContainerRequest__Output } from '../gen/runtime/v1/StopContainerRequest.js';
import type { UpdateContainerResourcesRequest__Output } from '../gen/runtime/v1/UpdateContainerResourcesRequest.js';
import type { UnaryCall } from './rpc.js';
import { invalidArgument } from '../errors.js';
import type { ContainerRecord, ContainerService } from '../container/service.js';
import { wireNs } from '../container/time.js';
import { checkId, checkLogPath, checkName, notTheOtherKind } from './ids.js';
import { matchLabels } from './sandbox.js';
import { checkCommand } from './streaming.js';
import { whenAnswered } from './boundary.js';
import { EncodedList } from './encoded-list.js';
import { protoPath, serviceMethods } from './proto.js';

function toContainer(c: Readonly<ContainerRecord>): Container {
  return {
    id: c.id,
    podSandboxId: c.sandboxId,
    metadata: c.config.metadata,
    image: { image: c.imageRef, annotations: {} },
    imageRef: c.imageId,
    state: c.state,
    createdAt: wireNs(c.createdAt),
    labels: c.config.labels,
    annotations: c.config.annotations,
  };
}

export function toContainerStatus(c: Readonly<ContainerRecord>) {
  return {
    ...toContainer(c),
    startedAt: wireNs(c.startedAt),
    finishedAt: wireNs(c.finishedAt),
    exitCode: c.exitCode,
    reason: c.reason,
    message: c.message,
    mounts: c.config.mounts,
    logPath: c.logPath,
    resources: c.config.linux?.resources ? { linux: c.config.linux.resources } : null,
  };
}

export function containerHandlers(containers: ContainerService, sandboxes?: { findView(id: string): unknown }) {
  const need = (id: string, rpc: string) => {
    checkId(id, 'container_id', rpc);
    if (sandboxes) notTheOtherKind(id, (i) => containers.findView(i), (i) => sandboxes.findView(i), 'container', 'pod sandbox', rpc);
    return id;
  };
  // Each container's entry is encoded once per version of its record, not at every call.
  const serialize = serviceMethods(protoPath, 'runtime.v1.RuntimeService').ListContainers!.responseSerialize;
  const encoded = new EncodedList((c: Container) => serialize({ containers: [c] }), toContainer);
  return {
    CreateContainer: async (req: CreateContainerRequest__Output): Promise<CreateContainerResponse> => {
      checkId(req.podSandboxId, 'pod_sandbox_id', 'CreateContainer');
      if (!req.config) throw invalidArgument('CreateContainer: config is required');
      checkName(req.config.metadata?.name ?? '', 'metadata.name', 'CreateContainer');
      checkLogPath(req.config.logPath, 'CreateContainer');
      return { containerId: await containers.create(req.podSandboxId, req.config) };
    },
    StartContainer: async (req: StartContainerRequest__Output) => {
      await containers.start(need(req.containerId, 'StartContainer'));
      return {};
    },
    StopContainer: async (req: StopContainerRequest__Output) => {
      await containers.stop(need(req.containerId, 'StopContainer'), Number(req.timeout));
      return {};
    },
    RemoveContainer: async (req: RemoveContainerRequest__Output) => {
      await containers.remove(need(req.containerId, 'RemoveContainer'));
      return {};
    },
    ContainerStatus: async (req: ContainerStatusRequest__Output): Promise<ContainerStatusResponse> => {
      const c = containers.mustView(need(req.containerId, 'ContainerStatus'));
      return {
        status: toContainerStatus(c),
        info: req.verbose
          ? { info: JSON.stringify({ sandboxID: c.sandboxId, pid: c.pid ?? 0, runtimeType: c.runtimeHandler || 'runc', runtimeSpec: c.spec }) }
          : {},
      };
    },
    ListContainers: async (req: ListContainersRequest__Output): Promise<Buffer> => {
      const f = req.filter;
      let items = containers.listView();
      if (f?.id) items = items.filter((c) => c.id.startsWith(f.id));
      if (f?.podSandboxId) items = items.filter((c) => c.sandboxId.startsWith(f.podSandboxId));
      if (f?.state) items = items.filter((c) => c.state === f.state!.state);
      if (f && Object.keys(f.labelSelector).length) items = items.filter((c) => matchLabels(c.config.labels, f.labelSelector));
      return encoded.encode(items);
    },
    UpdateContainerResources: async (req: UpdateContainerResourcesRequest__Output) => {
      if (!req.linux) throw invalidArgument('UpdateContainerResources: linux resources are required');
      await containers.updateResources(need(req.containerId, 'UpdateContainerResources'), req.linux);
      return {};
    },
    ReopenContainerLog: async (req: { containerId: string }) => {
      await containers.reopenLog(need(req.containerId, 'ReopenContainerLog'));
      return {};
    },
    ExecSync: async (req: ExecSyncRequest__Output, call?: UnaryCall): Promise<ExecSyncResponse> => {
      // A client that gives up (its deadline passed, or it cancelled) takes the command with it.
      const cancel = new AbortController();
      call?.on('cancelled', () => cancel.abort());
      if (call?.cancelled) cancel.abort();
      const id = need(req.containerId, 'ExecSync');
      checkCommand('ExecSync', req.cmd);
      const r = await containers.execSync(id, req.cmd, Number(req.timeout), cancel.signal);
      // The output counts against the daemon's ExecSync budget until the answer has left.
      whenAnswered(call, r.release);
      return { stdout: r.stdout, stderr: r.stderr, exitCode: r.exitCode };
    },
  };
}
