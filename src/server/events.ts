/**
 * GetContainerEvents: a server stream of container lifecycle events, each
 * with the pod's status and its containers' statuses, for the kubelet's
 * evented PLEG. Every open stream gets every event from the moment it opens.
 */
import type { ServerStream } from './rpc.js';
import type { ContainerRecord, ContainerService } from '../container/service.js';
import type { SandboxService } from '../sandbox/service.js';
import type { Logger } from '../log.js';
import { toContainerStatus } from './container.js';
import { toPodSandboxStatus } from './sandbox.js';
import { nowWireNs } from '../container/time.js';
import { Status } from './status.js';

export type ContainerEventType = 'CONTAINER_CREATED_EVENT' | 'CONTAINER_STARTED_EVENT' | 'CONTAINER_STOPPED_EVENT' | 'CONTAINER_DELETED_EVENT';

/** Events one subscriber may leave unread before it is dropped (each can carry a whole pod's statuses). */
export const MAX_PENDING_EVENTS = 256;
/**
 * Streams open at once (the kubelet keeps one). Each may hold MAX_PENDING_EVENTS events before it is
 * dropped, and each event carries a whole pod's statuses: with no bound, clients opening thousands of
 * streams they never read made every container event cost thousands of copies, kept until 256 had piled up.
 */
export const MAX_SUBSCRIBERS = 16;

export class ContainerEvents {
  private readonly streams = new Set<ServerStream>();
  private sandboxes?: SandboxService;
  private containers?: ContainerService;

  constructor(private readonly log: Logger) {}

  bind(sandboxes: SandboxService, containers: ContainerService): void {
    this.sandboxes = sandboxes;
    this.containers = containers;
  }

  get subscribers(): number {
    return this.streams.size;
  }

  publish(type: ContainerEventType, c: ContainerRecord): void {
    if (!this.streams.size || !this.sandboxes || !this.containers) return;
    const pod = this.sandboxes.get(c.sandboxId);
    const event = {
      containerId: c.id,
      containerEventType: type,
      createdAt: nowWireNs(),
      podSandboxStatus: pod ? toPodSandboxStatus(pod) : null,
      containersStatuses: this.containers.listView(c.sandboxId).map(toContainerStatus),
    };
    for (const s of this.streams) {
      // A stream that cannot keep up is dropped rather than buffered without bound.
      // (The stream holds objects: its writableLength counts events, not bytes.)
      if (!s.write(event) && s.writableLength > MAX_PENDING_EVENTS) {
        this.log.warn('dropping a slow container event stream');
        s.end();
        this.streams.delete(s);
      }
    }
  }

  handler = (call: ServerStream): void => {
    if (this.streams.size >= MAX_SUBSCRIBERS) {
      this.log.warn('refusing a container event stream: too many are open', { max: MAX_SUBSCRIBERS });
      call.fail({ code: Status.RESOURCE_EXHAUSTED, details: `skiff serves at most ${MAX_SUBSCRIBERS} container event streams at once` });
      return;
    }
    this.streams.add(call);
    const drop = () => this.streams.delete(call);
    call.on('cancelled', drop);
    call.on('close', drop);
  };

  close(): void {
    for (const s of this.streams) s.end();
    this.streams.clear();
  }
}
