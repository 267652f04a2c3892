import net from 'node:net';
import { describe, expect, it } from 'vitest';
import { SockDiag } from '../../src/sys/sock-diag.js';

/** A loopback connection, with the server's end of it. */
async function connection(host: string) {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, host, () => r()));
  const accepted = new Promise<net.Socket>((r) => server.once('connection', r));
  const client = net.connect((server.address() as net.AddressInfo).port, host);
  client.on('error', () => undefined);
  const s = await accepted;
  const ends = { address: s.remoteAddress!, port: s.remotePort!, localAddress: s.localAddress!, localPort: s.localPort! };
  return { server, client, s, ends };
}

describe('SockDiag', () => {
  it("names the uid that owns the peer's socket, over IPv4 and IPv6", async () => {
    const d = new SockDiag();
    try {
      for (const host of ['127.0.0.1', '::1']) {
        const c = await connection(host);
        expect(d.peerUid(c.ends), host).toBe(process.getuid!());
        // Many lookups on one netlink socket, each exact.
        for (let i = 0; i < 200; i++) expect(d.peerUid(c.ends)).toBe(process.getuid!());
        c.client.destroy();
        c.s.destroy();
        c.server.close();
      }
    } finally {
      d.close();
    }
  });

  it('names nobody for ends no socket has, and for a peer already closed (whose TIME_WAIT says uid 0)', async () => {
    const d = new SockDiag();
    try {
      const c = await connection('127.0.0.1');
      expect(d.peerUid({ ...c.ends, port: c.ends.port === 65535 ? 65534 : c.ends.port + 1 })).toBeUndefined();
      expect(d.peerUid({ ...c.ends, address: 'not an address' })).toBeUndefined();
      // The client closes first: its socket goes to FIN_WAIT then TIME_WAIT, with no owner left.
      c.client.end();
      await new Promise((r) => c.s.once('end', r));
      c.s.end();
      await new Promise((r) => c.client.once('close', r));
      expect(d.peerUid(c.ends)).toBeUndefined();
      c.server.close();
    } finally {
      d.close();
    }
  });
});
