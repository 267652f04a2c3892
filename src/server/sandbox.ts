/** RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox. */
import type { ListPodSandboxRequest__Output } from '../gen/runtime/v1/ListPodSandboxRequest.js';
import type { PodSandbox } from '../gen/runtime/v1/PodSandbox.js';
import type { PodSandboxStatusRequest__Output } from '../gen/runtime/v1/PodSandboxStatusRequest.js';
import type { PodSandboxStatusResponse } from '../gen/runtime/v1/PodSandboxStatusResponse.js';
import type { RemovePodSandboxRequest__Output } from '../gen/runtime/v1/RemovePodSandboxRequest.js';
import type { RunPodSandboxRequest__Output } from '../gen/runtime/v1/RunPodSandboxRequest.js';
import type { RunPodSandboxResponse } from '../gen/runtime/v1/RunPodSandboxResponse.js';
import type { StopPodSandboxRequest__Output } from '../gen/runtime/v1/StopPodSandboxRequest.js';
import { invalidArgument } from '../errors.js';
import type { SandboxRecord, SandboxService } from '../sandbox/service.js';
import { nowWireNs, wireNs } from '../container/time.js';
import { checkHostname, checkId, checkName, checkPortMappings, notTheOtherKind } from './ids.js';
import { EncodedList } from './encoded-list.js';
import { protoPath, serviceMethods } from './proto.js';
import { matchesLabels } from '../labels.js';

/** CRI's label_selector filter: every pair must match. */
export function matchLabels(labels: Record<string, string>, selector: Record<string, string>): boolean {
  return matchesLabels(selector, labels);
}

function toPodSandbox(s: Readonly<SandboxRecord>): PodSandbox {
  return {
    id: s.id,
    metadata: s.config.metadata,
    state: s.state,
    createdAt: wireNs(s.createdAt),
    labels: s.config.labels,
    annotations: s.config.annotations,
    runtimeHandler: s.runtimeHandler,
  };
}

export function toPodSandboxStatus(s: Readonly<SandboxRecord>) {
  const ns = s.config.linux?.securityContext?.namespaceOptions;
  return {
    ...toPodSandbox(s),
    network: { ip: s.ips[0] ?? '', additionalIps: s.ips.slice(1).map((ip) => ({ ip })) },
    linux: { namespaces: { options: { network: ns?.network ?? 'POD', pid: ns?.pid ?? 'POD', ipc: ns?.ipc ?? 'POD', targetId: '' } } },
  };
}

export function sandboxHandlers(sandboxes: SandboxService, containers?: { findView(id: string): unknown }) {
  const need = (id: string, rpc: string) => {
    checkId(id, 'pod_sandbox_id', rpc);
    if (containers) notTheOtherKind(id, (i) => sandboxes.findView(i), (i) => containers.findView(i), 'pod sandbox', 'container', rpc);
    return id;
  };
  // Each pod's entry is encoded once per version of its record, not at every call.
  const serialize = serviceMethods(protoPath, 'runtime.v1.RuntimeService').ListPodSandbox!.responseSerialize;
  const encoded = new EncodedList((s: PodSandbox) => serialize({ items: [s] }), toPodSandbox);
  return {
    RunPodSandbox: async (req: RunPodSandboxRequest__Output): Promise<RunPodSandboxResponse> => {
      if (!req.config) throw invalidArgument('RunPodSandbox: config is required');
      const md = req.config.metadata;
      checkName(md?.name ?? '', 'metadata.name', 'RunPodSandbox', { cniArg: true });
      checkName(md?.namespace ?? '', 'metadata.namespace', 'RunPodSandbox', { cniArg: true });
      checkName(md?.uid ?? '', 'metadata.uid', 'RunPodSandbox', { cniArg: true });
      checkHostname(req.config.hostname, 'RunPodSandbox');
      checkPortMappings(req.config.portMappings, 'RunPodSandbox');
      return { podSandboxId: await sandboxes.run(req.config, req.runtimeHandler) };
    },
    StopPodSandbox: async (req: StopPodSandboxRequest__Output) => {
      need(req.podSandboxId, 'StopPodSandbox');
      // Stopping a pod that is already gone is success: the kubelet retries stops.
      if (sandboxes.findView(req.podSandboxId)) await sandboxes.stop(req.podSandboxId);
      return {};
    },
    RemovePodSandbox: async (req: RemovePodSandboxRequest__Output) => {
      need(req.podSandboxId, 'RemovePodSandbox');
      await sandboxes.remove(req.podSandboxId);
      return {};
    },
    PodSandboxStatus: async (req: PodSandboxStatusRequest__Output): Promise<PodSandboxStatusResponse> => {
      const s = sandboxes.mustView(need(req.podSandboxId, 'PodSandboxStatus'));
      return {
        status: toPodSandboxStatus(s),
        info: req.verbose
          ? { info: JSON.stringify({ pid: s.infraPid ?? 0, netns: s.netns ?? '', hostname: s.hostname, cgroupParent: s.cgroupParent, config: s.config }) }
          : {},
        containersStatuses: [],
        timestamp: nowWireNs(),
      };
    },
    ListPodSandbox: async (req: ListPodSandboxRequest__Output): Promise<Buffer> => {
      const f = req.filter;
      let items = sandboxes.listView();
      if (f?.id) items = items.filter((s) => s.id.startsWith(f.id));
      if (f?.state) items = items.filter((s) => s.state === f.state!.state);
      if (f && Object.keys(f.labelSelector).length) items = items.filter((s) => matchLabels(s.config.labels, f.labelSelector));
      return encoded.encode(items);
    },
  };
}
