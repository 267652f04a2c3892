/**
 * The service-account controller's one duty that matters on this node:
 * every active namespace has a ServiceAccount named `default` (charts and
 * tools look for it), made again when deleted. Tokens are not issued.
 */
import type { ApiClient } from '../api/client.js';
import { ApiError } from '../api/errors.js';
import { errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import { LevelLoop } from './level-loop.js';

export class ServiceAccountsController {
  private readonly loop: LevelLoop;

  constructor(private readonly o: { client: ApiClient; log: Logger }) {
    this.loop = new LevelLoop({ client: o.client, resources: ['namespaces', 'serviceaccounts'], sync: () => this.sync(), log: o.log, name: 'service accounts', everyMs: 5 * 60_000 });
  }

  start(): Promise<void> {
    return this.loop.start();
  }

  stop(): Promise<void> {
    return this.loop.stop();
  }

  private async sync(): Promise<void> {
    const { client, log } = this.o;
    const namespaces = (await client.list('namespaces')).items.filter((n) => !n.metadata.deletionTimestamp);
    const have = new Set((await client.list('serviceaccounts', { fieldSelector: 'metadata.name=default' })).items.map((sa) => sa.metadata.namespace));
    for (const ns of namespaces) {
      const name = String(ns.metadata.name);
      if (have.has(name)) continue;
      await client.create('serviceaccounts', name, { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'default', namespace: name } }).catch((err) => {
        // Made meanwhile, or the namespace went: the next pass sees it.
        if (!(err instanceof ApiError && (err.code === 409 || err.code === 403 || err.code === 404))) log.warn('could not make the default service account', { namespace: name, error: errorMessage(err) });
      });
    }
  }
}
