/**
 * A WebSocket client that sends whatever frame it is told to (reserved bits,
 * bad opcodes, lies about lengths) and can stop reading: what the streaming
 * server must survive. Only the handshake is done properly.
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';

export class RawWsClient {
  received = 0;
  closed = false;

  private constructor(readonly sock: net.Socket) {
    sock.on('data', (d: Buffer) => (this.received += d.length));
    sock.on('close', () => (this.closed = true));
    sock.on('error', () => undefined);
  }

  /** Upgrades `path` on 127.0.0.1:`port` offering `protocol`; rejects with the status line on refusal. */
  static async connect(port: number, path: string, protocol: string): Promise<RawWsClient> {
    const sock = net.connect(port, '127.0.0.1');
    await new Promise((r, j) => sock.once('connect', r).once('error', j));
    const key = randomBytes(16).toString('base64');
    sock.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Protocol: ${protocol}\r\n\r\n`);
    const rest = await new Promise<Buffer>((resolve, reject) => {
      let acc = Buffer.alloc(0);
      const on = (d: Buffer) => {
        acc = Buffer.concat([acc, d]);
        const i = acc.indexOf('\r\n\r\n');
        if (i < 0) return;
        sock.off('data', on);
        const head = acc.subarray(0, i).toString();
        if (!head.startsWith('HTTP/1.1 101')) {
          sock.destroy();
          reject(new Error(head.split('\r\n')[0]));
        } else resolve(acc.subarray(i + 4));
      };
      sock.on('data', on);
      sock.once('close', () => reject(new Error(`closed before a reply: ${acc.toString()}`)));
    });
    const c = new RawWsClient(sock);
    c.received += rest.length;
    return c;
  }

  /** One frame, masked as a client must, with any opcode and reserved bits. */
  static frame(opcode: number, payload: Buffer, opts: { fin?: boolean; rsv?: number; mask?: boolean } = {}): Buffer {
    const fin = opts.fin ?? true;
    const mask = opts.mask ?? true;
    const b0 = (fin ? 0x80 : 0) | ((opts.rsv ?? 0) & 0x7) << 4 | (opcode & 0xf);
    let header: Buffer;
    if (payload.length < 126) header = Buffer.from([b0, (mask ? 0x80 : 0) | payload.length]);
    else if (payload.length < 65536) {
      header = Buffer.alloc(4);
      header[0] = b0;
      header[1] = (mask ? 0x80 : 0) | 126;
      header.writeUInt16BE(payload.length, 2);
    } else {
      header = Buffer.alloc(10);
      header[0] = b0;
      header[1] = (mask ? 0x80 : 0) | 127;
      header.writeBigUInt64BE(BigInt(payload.length), 2);
    }
    if (!mask) return Buffer.concat([header, payload]);
    const key = randomBytes(4);
    const masked = Buffer.from(payload);
    for (let i = 0; i < masked.length; i++) masked[i]! ^= key[i % 4]!;
    return Buffer.concat([header, key, masked]);
  }

  /** A binary message on a Kubernetes channel. */
  static channel(n: number, data: Buffer | string): Buffer {
    return RawWsClient.frame(2, Buffer.concat([Buffer.from([n]), Buffer.from(data)]));
  }

  write(b: Buffer): Promise<boolean> {
    if (this.sock.destroyed) return Promise.resolve(false);
    return new Promise((resolve) => {
      if (this.sock.write(b)) return resolve(true);
      const onDrain = () => {
        this.sock.off('close', onClose);
        resolve(true);
      };
      const onClose = () => {
        this.sock.off('drain', onDrain);
        resolve(false);
      };
      this.sock.once('drain', onDrain);
      this.sock.once('close', onClose);
    });
  }

  stopReading(): void {
    this.sock.pause();
  }

  close(): void {
    this.sock.destroy();
  }
}
