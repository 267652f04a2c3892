/**
 * The client side of a WebSocket that carries a byte stream in binary
 * messages, as kubectl 1.35's port-forward tunnel does. Written by hand
 * because its subprotocol ("SPDY/3.1+portforward.k8s.io") is not an RFC 6455
 * token, which the ws client refuses to offer.
 */
import { createHash, randomBytes } from 'node:crypto';
import type net from 'node:net';
import { Duplex } from 'node:stream';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

function frame(opcode: number, payload: Buffer): Buffer {
  const mask = randomBytes(4);
  const len = payload.length;
  const head = len < 126 ? Buffer.from([0x80 | opcode, 0x80 | len]) : len < 65536 ? Buffer.alloc(4) : Buffer.alloc(10);
  if (len >= 126 && len < 65536) {
    head[0] = 0x80 | opcode;
    head[1] = 0x80 | 126;
    head.writeUInt16BE(len, 2);
  } else if (len >= 65536) {
    head[0] = 0x80 | opcode;
    head[1] = 0x80 | 127;
    head.writeBigUInt64BE(BigInt(len), 2);
  }
  const body = Buffer.from(payload);
  for (let i = 0; i < body.length; i++) body[i]! ^= mask[i % 4]!;
  return Buffer.concat([head, mask, body]);
}

/** Upgrades `path` on `sock` offering `protocol`; resolves with the stream and the protocol the server chose, rejects with its status line. */
export async function wsTunnel(sock: net.Socket, path: string, protocol: string): Promise<{ stream: Duplex; protocol: string }> {
  const key = randomBytes(16).toString('base64');
  sock.write(`GET ${path} HTTP/1.1\r\nHost: api\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: ${key}\r\nSec-WebSocket-Protocol: ${protocol}\r\n\r\n`);
  const { head, rest } = await new Promise<{ head: string; rest: Buffer }>((resolve, reject) => {
    let acc = Buffer.alloc(0);
    const on = (d: Buffer) => {
      acc = Buffer.concat([acc, d]);
      const i = acc.indexOf('\r\n\r\n');
      if (i < 0) return;
      sock.off('data', on);
      resolve({ head: acc.subarray(0, i).toString(), rest: acc.subarray(i + 4) });
    };
    sock.on('data', on);
    sock.once('close', () => reject(new Error(`closed before a reply: ${acc.toString()}`)));
  });
  if (!head.startsWith('HTTP/1.1 101')) throw new Error(head.split('\r\n')[0]);
  const accept = /sec-websocket-accept: *(\S+)/i.exec(head)?.[1];
  if (accept !== createHash('sha1').update(key + GUID).digest('base64')) throw new Error(`bad Sec-WebSocket-Accept: ${accept}`);
  const chosen = /sec-websocket-protocol: *(.+)/i.exec(head)?.[1]?.trim() ?? '';
  let buf = Buffer.alloc(0);
  const stream = new Duplex({
    read() {
      sock.resume();
    },
    write(chunk: Buffer, _enc, cb) {
      sock.write(frame(2, chunk), cb);
    },
    final(cb) {
      sock.end(frame(8, Buffer.from([0x03, 0xe8])), () => cb());
    },
    destroy(err, cb) {
      sock.destroy();
      cb(err);
    },
  });
  const onBytes = (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    for (;;) {
      if (buf.length < 2) return;
      const opcode = buf[0]! & 0x0f;
      let len = buf[1]! & 0x7f;
      let off = 2;
      if (len === 126) {
        if (buf.length < 4) return;
        len = buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (buf.length < 10) return;
        len = Number(buf.readBigUInt64BE(2));
        off = 10;
      }
      if (buf.length < off + len) return;
      const payload = buf.subarray(off, off + len);
      buf = buf.subarray(off + len);
      if (opcode === 0 || opcode === 1 || opcode === 2) {
        if (!stream.push(Buffer.from(payload))) sock.pause();
      } else if (opcode === 8) stream.push(null);
      else if (opcode === 9) sock.write(frame(10, payload));
    }
  };
  sock.on('data', onBytes);
  sock.on('close', () => stream.destroy());
  if (rest.length) onBytes(rest);
  return { stream, protocol: chosen };
}
