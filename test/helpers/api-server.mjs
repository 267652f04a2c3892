// The node's API alone, in its own process (so a test can kill -9 it): node api-server.mjs DIR HOST:PORT
// SKIFF_API_MAX_UNREAD: bytes a watcher may leave unread before it is dropped; SKIFF_API_MAX_LIST_BYTES: bytes of lists sent at once.
import { startNodeApi } from '../../dist/api/index.js';
import { createLogger } from '../../dist/log.js';

const [dir, address] = process.argv.slice(2);
const maxUnread = process.env.SKIFF_API_MAX_UNREAD ? Number(process.env.SKIFF_API_MAX_UNREAD) : undefined;
const maxListBytes = process.env.SKIFF_API_MAX_LIST_BYTES ? Number(process.env.SKIFF_API_MAX_LIST_BYTES) : undefined;
const api = await startNodeApi({ dir, address, nodeName: process.env.SKIFF_NODE_NAME ?? 'test-node', log: createLogger('warn'), server: { maxUnreadWatchBytes: maxUnread, maxListBytes, bookmarkIntervalMs: 500 } });
process.stdout.write(`READY ${api.address} ${api.kubeconfig}\n`);
process.on('SIGTERM', () => void api.stop().then(() => process.exit(0)));
