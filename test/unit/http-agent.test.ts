import http from 'node:http';
import { createRequire } from 'node:module';
import type { AddressInfo } from 'node:net';
import { describe, expect, it } from 'vitest';
import { loadAgent } from '../../src/image/http-agent.js';

describe('loadAgent', () => {
  it("gives undici's Agent with a working request(), without loading the rest of undici", async () => {
    const server = http.createServer((req, res) => res.end(`hello ${req.url}`));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const Agent = await loadAgent();
    const agent = new Agent({ connections: 1 });
    try {
      const res = await agent.request({ origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, path: '/v2/', method: 'GET' });
      expect(res.statusCode).toBe(200);
      expect(await res.body.text()).toBe('hello /v2/');
      const require = createRequire(import.meta.url);
      const loaded = Object.keys(require.cache);
      expect(loaded.some((f) => f.endsWith('undici/lib/dispatcher/agent.js'))).toBe(true);
      // The index (and with it fetch, WebSocket and the caches) stays unloaded.
      expect(loaded.filter((f) => /undici\/(index\.js|lib\/web\/)/.test(f))).toEqual([]);
      expect(await loadAgent()).toBe(Agent);
    } finally {
      await agent.close();
      server.close();
    }
  });
});
