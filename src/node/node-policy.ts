/**
 * The small controllers that keep the node's policy: the disruption
 * controller (PodDisruptionBudget status), the Node's cordon taint with the
 * binding of pods left Pending while it was cordoned, and every namespace's
 * `default` ServiceAccount. One start and one stop for `skiff node`.
 */
import type { ApiClient } from '../api/client.js';
import type { Logger } from '../log.js';
import type { ControllerEvents } from './controller-events.js';
import { DisruptionController } from './disruption.js';
import { NodeScheduling } from './scheduling.js';
import { ServiceAccountsController } from './service-accounts.js';

export async function startNodePolicy(opts: { client: ApiClient; nodeName: string; log: Logger; events?: ControllerEvents }): Promise<{ stop(): Promise<void> }> {
  const disruption = new DisruptionController({ client: opts.client, log: opts.log });
  const scheduling = new NodeScheduling({ client: opts.client, nodeName: opts.nodeName, log: opts.log, events: opts.events });
  const accounts = new ServiceAccountsController({ client: opts.client, log: opts.log });
  await disruption.start();
  await scheduling.start();
  await accounts.start();
  return {
    stop: async () => {
      await accounts.stop();
      await scheduling.stop();
      await disruption.stop();
    },
  };
}
