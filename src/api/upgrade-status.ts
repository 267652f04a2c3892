/** Answering a connection that asked for an upgrade with a v1 Status instead. */
import http from 'node:http';
import type { Duplex } from 'node:stream';
import type { ApiError } from './errors.js';

/** The Status as the whole answer, then the connection closes (destroyed if the client does not take it within 5 s). */
export function writeStatus(socket: Duplex, err: ApiError): void {
  if (socket.destroyed) return;
  const body = JSON.stringify(err.status());
  socket.end(`HTTP/1.1 ${err.code} ${http.STATUS_CODES[err.code] ?? ''}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
  setTimeout(() => socket.destroy(), 5000).unref();
}
