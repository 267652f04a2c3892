/**
 * What stands between the node's agent and its objects, whether or not the
 * API is served over HTTPS: the API store (the node API's own, or one of
 * its own over the same database), the manifest directory's objects shown
 * in it, the bridge that hands the agent the Pods bound to it and writes
 * their status back, and the controller manager that turns workloads into
 * those Pods, and the storage controller that binds their claims to volumes
 * (provisioning them in the node's root dir). `skiff node` and `skiff
 * kubelet` both run the agent this way, so the agent itself hosts no controllers.
 */
import fs from 'node:fs/promises';
import type { Service } from 'kubernetes-types/core/v1.js';
import path from 'node:path';
import { localClient } from '../api/client.js';
import { GarbageCollector } from '../api/gc.js';
import { nodeKinds } from '../api/kinds/index.js';
import { showManifestObjects } from '../api/manifest-objects.js';
import { openApiDb } from '../api/persist.js';
import { Store } from '../api/store.js';
import type { RunningKubelet } from '../kubelet-lite/run.js';
import { ObjectStore } from '../kubelet-lite/store.js';
import type { Logger } from '../log.js';
import { ApiBridge } from './api-bridge.js';
import { NetworkPolicyController } from './network-policy.js';
import { ControllerEvents } from './controller-events.js';
import { ControllerManager } from './controller-manager.js';
import { EventWriter } from './events.js';
import { notShownEvents, reportManifestProblems } from './manifest-problems.js';
import { StorageController } from './storage.js';

export interface ControlPlaneOptions {
  nodeName: string;
  /** The agent's root dir: the store's database (when it has none given) and the controllers' memory live here. */
  rootDir: string;
  log: Logger;
  /** The node API's store; none: one of its own, not served. */
  store?: Store;
  /** The garbage collector over `store` (the node API's); with a store of its own, one of its own too. */
  collector?: GarbageCollector;
  /** Tests only (SKIFF_TEST_NETPOL_WRITE_DELAY_MS): every NetworkPolicy write waits this long first, as a slow nft would. */
  netpolWriteDelayMs?: number;
}

export class ControlPlane {
  /** The agent's object store, filled with the API's objects before the agent's first pass. */
  readonly objects: ObjectStore;
  private unshow: () => void = () => undefined;
  private unreport: () => void = () => undefined;

  private constructor(
    readonly store: Store,
    private readonly ownStore: boolean,
    private readonly bridge: ApiBridge,
    private readonly collector: GarbageCollector,
    readonly controllers: ControllerManager,
    readonly storage: StorageController,
    /** The controllers' and the scheduler's events (written to the store by `writer`). */
    readonly events: ControllerEvents,
    private readonly writer: EventWriter,
    objects: ObjectStore,
    private readonly log: Logger,
    private readonly nodeName: string,
    /** NetworkPolicy enforcement; pass its `podReady` to the agent (podNetworkReady). */
    readonly networkPolicies: NetworkPolicyController,
  ) {
    this.objects = objects;
  }

  /** Opens the store and hands its objects to a new agent object store; start the agent next. */
  static async open(opts: ControlPlaneOptions): Promise<ControlPlane> {
    let store = opts.store;
    if (!store) {
      await fs.mkdir(opts.rootDir, { recursive: true, mode: 0o700 });
      store = new Store({ kinds: nodeKinds(opts.nodeName, undefined, { rootDir: opts.rootDir }), persistence: openApiDb(path.join(opts.rootDir, 'api.db')), garbageCollection: true });
    }
    // A deleted workload takes what it owns (its ReplicaSets, their Pods) with it; an owner only in a
    // manifest file is not taken as gone before the files are shown (attach).
    const collector = opts.collector ?? new GarbageCollector({ store, log: opts.log, waitForOwners: true });
    const api = store;
    const objects = new ObjectStore({
      nodeName: opts.nodeName,
      log: opts.log,
      // What the node's API serves its controllers and agent act on; anything else in a manifest is named as skipped.
      actsOn: () => api.kindList().map((k) => ({ apiVersion: k.group ? `${k.group}/${k.version}` : k.version, kind: k.kind })),
    });
    const client = localClient(store);
    const bridge = new ApiBridge({ store, client, objects, nodeName: opts.nodeName, log: opts.log });
    const storage = new StorageController({ client, nodeName: opts.nodeName, rootDir: opts.rootDir, log: opts.log });
    const events = new ControllerEvents({ instance: `controller-manager-${opts.nodeName}` });
    const writer = new EventWriter({ client, log: opts.log });
    const networkPolicies = new NetworkPolicyController({ client, log: opts.log, events, ...(opts.netpolWriteDelayMs ? { writeDelayMs: opts.netpolWriteDelayMs } : {}) });
    try {
      await writer.start(events, (e) => events.isMine(e));
      const controllers = await ControllerManager.create({ client, nodeName: opts.nodeName, log: opts.log, stateFile: path.join(opts.rootDir, 'controllers.json'), events });
      await bridge.start();
      // Before any client writes a claim: the default class is there for the DefaultStorageClass admission.
      await storage.start();
      // Before the agent starts any pod: its first containers wait for rules that know their pod's address.
      await networkPolicies.start();
      return new ControlPlane(store, !opts.store, bridge, collector, controllers, storage, events, writer, objects, opts.log, opts.nodeName, networkPolicies);
    } catch (err) {
      networkPolicies.stop();
      await storage.stop();
      writer.stop();
      bridge.stop();
      if (!opts.collector) collector.stop();
      if (!opts.store) store.close();
      throw err;
    }
  }

  /** The agent is up: its manifest files are shown in the store, and its pods' status written back. */
  attach(kubelet: RunningKubelet): void {
    this.unshow = showManifestObjects(this.store, kubelet.objects, this.log, notShownEvents(this.events));
    this.unreport = reportManifestProblems(kubelet.objects, this.events, this.nodeName);
    this.collector.ownersShown();
    this.bridge.attach(kubelet.agent);
  }

  /** The proxy's Services, for the cluster IPs and node ports it allocated (see ApiBridge.attachServices). */
  attachServices(view: () => Service[]): void {
    this.bridge.attachServices(view);
  }

  /** Once the agent's adopted pods know their state: the controllers' first look. */
  async startControllers(): Promise<void> {
    await this.controllers.start();
  }

  async stop(): Promise<void> {
    this.unshow();
    this.unreport();
    this.networkPolicies.stop();
    await this.storage.stop();
    await this.controllers.stop();
    this.writer.stop();
    this.bridge.stop();
    if (this.ownStore) {
      this.collector.stop();
      this.store.close();
    }
  }
}
