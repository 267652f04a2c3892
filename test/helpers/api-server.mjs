// The node's API alone, in its own process (so a test can kill -9 it): node api-server.mjs DIR HOST:PORT
// SKIFF_API_MAX_UNREAD: bytes a watcher may leave unread before it is dropped; SKIFF_API_MAX_LIST_BYTES: bytes of lists sent at once;
// SKIFF_API_MAX_WATCHES: watches at once. Started with an IPC channel, it answers a 'stats' message with what it holds.
import { startNodeApi } from '../../dist/api/index.js';
import { createLogger } from '../../dist/log.js';

const [dir, address] = process.argv.slice(2);
const num = (name) => (process.env[name] ? Number(process.env[name]) : undefined);
const api = await startNodeApi({
  dir,
  address,
  nodeName: process.env.SKIFF_NODE_NAME ?? 'test-node',
  log: createLogger('warn'),
  maxWatches: num('SKIFF_API_MAX_WATCHES'),
  server: { maxUnreadWatchBytes: num('SKIFF_API_MAX_UNREAD'), maxListBytes: num('SKIFF_API_MAX_LIST_BYTES'), bookmarkIntervalMs: 500 },
});
process.on('message', (m) => {
  if (m === 'stats') process.send?.({ unreadWatchBytes: api.unreadWatchBytes(), watches: api.store.watchers, rss: process.memoryUsage().rss });
});
process.channel?.unref();
process.stdout.write(`READY ${api.address} ${api.kubeconfig}\n`);
process.on('SIGTERM', () => void api.stop().then(() => process.exit(0)));
