/**
 * The node's API as one piece: the store over its database, the
 * credentials, and the HTTPS server. `skiff node` starts it; so can a test.
 */
import path from 'node:path';
import type { Logger } from '../log.js';
import { ensureCredentials } from './credentials.js';
import { GarbageCollector } from './gc.js';
import { evictionSubresource } from './eviction.js';
import { NodeRequests, placementRefusal } from './kinds/placement.js';
import { nodeKinds } from './kinds/index.js';
import { openApiDb } from './persist.js';
import { podSubresources, type PodStreams } from './pod-subresources.js';
import { splitHostPort, startApiServer, type ApiServerOptions } from './server.js';
import { Store } from './store.js';
import type { ApiObject } from './types.js';

export interface NodeApiOptions {
  /** The agent's root dir: api.db, pki/ and admin.kubeconfig go here. */
  dir: string;
  address: string;
  /** The node's name: pods created without a node are placed on it. */
  nodeName: string;
  log: Logger;
  server?: Partial<Pick<ApiServerOptions, 'maxUnreadWatchBytes' | 'maxUnreadWatchBytesTotal' | 'bookmarkIntervalMs' | 'maxWatchSeconds' | 'maxListBytes' | 'metrics'>>;
  maxWatches?: number;
  /** The agent's side of pods/log, exec, attach and port-forward (undefined until the agent is up). */
  podStreams?: () => PodStreams | undefined;
  /**
   * The manifest files' objects are shown later (showManifestObjects): until
   * `collector.ownersShown()`, an API object whose owner is missing is not yet garbage.
   */
  waitForOwners?: boolean;
}

export interface NodeApi {
  store: Store;
  /** Deletes what lost its owners, as kubectl delete --cascade asks. */
  collector: GarbageCollector;
  address: string;
  kubeconfig: string;
  /** Bytes written to watches and not yet read by their clients (the server's handle, for tests and metrics). */
  unreadWatchBytes(): number;
  stop(): Promise<void>;
}

export async function startNodeApi(opts: NodeApiOptions): Promise<NodeApi> {
  const [host] = splitHostPort(opts.address);
  // Pods nobody placed go on this node unless its Node (cordoned, tainted, labelled otherwise, full) refuses them.
  const requests = new NodeRequests(opts.nodeName);
  const refusal = (pod: ApiObject) => {
    const nodes = store.kind('nodes');
    let node: ApiObject | undefined;
    try {
      node = nodes ? store.get(nodes, '', opts.nodeName) : undefined;
    } catch {
      node = undefined; // not registered yet: placed, as before
    }
    return placementRefusal(node, pod, requests.used);
  };
  const store: Store = new Store({ kinds: nodeKinds(opts.nodeName, refusal, { rootDir: opts.dir }), persistence: openApiDb(path.join(opts.dir, 'api.db')), watch: { maxWatchers: opts.maxWatches }, garbageCollection: true });
  const pods = store.kind('pods');
  const stopRequests = pods ? store.watch(pods, {}, { deliver: (c) => (requests.apply(c), true), closed: () => undefined }) : () => undefined;
  const collector = new GarbageCollector({ store, log: opts.log, waitForOwners: opts.waitForOwners });
  try {
    // The kubeconfig names the port actually bound; with port 0 that is known only after listening.
    const creds = await ensureCredentials({ dir: opts.dir, server: opts.address, sans: [host] });
    const pods = podSubresources({ store, streams: opts.podStreams ?? (() => undefined), log: opts.log });
    const server = await startApiServer({ store, address: opts.address, tls: creds, log: opts.log, subresources: { ...pods.subresources, ...evictionSubresource({ store }) }, onClose: pods.close, ...opts.server });
    const clientHost = host === '0.0.0.0' || host === '::' || host === '' ? '127.0.0.1' : host;
    const [, port] = splitHostPort(server.address);
    const final = server.address === opts.address && clientHost === host ? creds : await ensureCredentials({ dir: opts.dir, server: `${clientHost.includes(':') ? `[${clientHost}]` : clientHost}:${port}`, sans: [host] });
    return {
      store,
      collector,
      address: server.address,
      kubeconfig: final.kubeconfig,
      unreadWatchBytes: () => server.unreadWatchBytes(),
      stop: async () => {
        await server.close();
        stopRequests();
        collector.stop();
        store.close();
      },
    };
  } catch (err) {
    collector.stop();
    store.close();
    throw err;
  }
}
