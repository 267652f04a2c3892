import http from 'node:http';
import net from 'node:net';
import { Writable } from 'node:stream';
import { afterEach, describe, expect, it } from 'vitest';
import WebSocket, { WebSocketServer } from 'ws';
import { WsChannels } from '../../src/streaming/streams.js';

const cleanups: Array<() => void> = [];
afterEach(() => {
  for (const c of cleanups.splice(0)) c();
});

/** A server whose channel 0 feeds `sink`; resolves the client WebSocket once open. */
async function setup(sink: Writable): Promise<{ client: WebSocket; channels: () => WsChannels | undefined }> {
  const wss = new WebSocketServer({ noServer: true });
  let channels: WsChannels | undefined;
  const server = http.createServer();
  server.on('upgrade', (req, socket, head) =>
    wss.handleUpgrade(req, socket, head, (ws) => {
      channels = new WsChannels(ws, socket, new Set([0]));
      channels.channel(0).pipe(sink);
    }),
  );
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  cleanups.push(() => server.close());
  const client = new WebSocket(`ws://127.0.0.1:${(server.address() as net.AddressInfo).port}/`, ['v5.channel.k8s.io']);
  cleanups.push(() => client.terminate());
  await new Promise((r) => client.once('open', r));
  return { client, channels: () => channels };
}

describe('WsChannels', () => {
  it('holds input back while its reader is slow, then delivers every byte', async () => {
    let received = 0;
    let gate: (() => void) | undefined;
    let open = false;
    const sink = new Writable({
      highWaterMark: 16 * 1024,
      write(chunk: Buffer, _enc, cb) {
        received += chunk.length;
        if (open) cb();
        else gate = cb;
      },
    });
    const { client } = await setup(sink);
    const block = Buffer.alloc(32 * 1024, 1);
    const total = 256;
    for (let i = 0; i < total; i++) client.send(Buffer.concat([Buffer.from([0]), block]));
    await new Promise((r) => setTimeout(r, 500));
    // The reader took one chunk and stalled: the rest waits, mostly outside the server.
    expect(received).toBeLessThan(block.length * 4);
    open = true;
    gate?.();
    const deadline = Date.now() + 10_000;
    while (received < total * block.length && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(received).toBe(total * block.length);
  });
});
