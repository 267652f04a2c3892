/**
 * A process of its own for `npm run bench -- dns` (dns.ts), so the load
 * client does not share an event loop with what it measures:
 *
 *   tsx bench/dns-child.ts skiff ADDRESS UPSTREAM_ADDRESS UPSTREAM_PORT
 *   tsx bench/dns-child.ts upstream ADDRESS
 *
 * `skiff` serves the service DNS on ADDRESS (a free port) for 1,000 Services
 * and their pods, forwarding other names to the upstream; `upstream` is the
 * tiny upstream: every query is answered with one A record, built from the
 * query's own bytes (no decoding), so it costs next to nothing. Each prints
 * `{"port":N}` once it listens, and runs until killed.
 */
import dgram from 'node:dgram';
import { silentLogger } from '../src/log.js';
import { DnsServer } from '../src/proxy/dns.js';
import { Allocator } from '../src/proxy/service.js';
import { pod, serviceObject } from '../test/helpers/proxy-fixtures.js';
import { IN_ZONE, SERVICES } from './dns.js';

/** 1,000 ClusterIP Services (svc-500 at IN_ZONE.ip), 3 ready pods each. */
function view() {
  const objects = Array.from({ length: SERVICES }, (_, i) =>
    serviceObject('bench', `svc-${i}`, { clusterIP: i === 500 ? IN_ZONE.ip : undefined, selector: { app: `a${i}` }, ports: [{ name: 'http', port: 80, targetPort: 8080 }] }),
  );
  const services = new Allocator('10.96.0.0/12').resolve(objects).services;
  const pods = Array.from({ length: SERVICES * 3 }, (_, k) => pod(`p-${k}`, { ns: 'bench', labels: { app: `a${Math.floor(k / 3)}` }, ip: `10.88.${k >> 8}.${k & 255}` }));
  return { services: () => services, pods: () => pods };
}

async function skiff(address: string, upHost: string, upPort: number): Promise<number> {
  const server = new DnsServer({
    address,
    port: 0,
    clusterDomain: 'cluster.local',
    view: view(),
    upstreams: [{ host: upHost, port: upPort }],
    reverseCidrs: ['10.96.0.0/12', '10.88.0.0/16'],
    log: silentLogger,
    maxInflightForwards: 1024,
  });
  const { port } = await server.start();
  return port;
}

/** The query turned into its answer: QR, RA, one answer, the question kept, `192.0.2.1` after a pointer to it. */
function answerFor(q: Buffer): Buffer | undefined {
  if (q.length < 17 || q.readUInt16BE(4) !== 1) return undefined;
  let off = 12;
  while (off < q.length && q[off] !== 0) off += q[off]! + 1;
  const qEnd = off + 5;
  if (qEnd > q.length) return undefined;
  const out = Buffer.alloc(qEnd + 16);
  q.copy(out, 0, 0, qEnd);
  out.writeUInt16BE(0x8180 | (q.readUInt16BE(2) & 0x0100), 2);
  out.writeUInt16BE(1, 6);
  out.writeUInt16BE(0, 8);
  out.writeUInt16BE(0, 10);
  out.writeUInt16BE(0xc00c, qEnd);
  out.writeUInt16BE(1, qEnd + 2);
  out.writeUInt16BE(1, qEnd + 4);
  out.writeUInt32BE(60, qEnd + 6);
  out.writeUInt16BE(4, qEnd + 10);
  Buffer.from([192, 0, 2, 1]).copy(out, qEnd + 12);
  return out;
}

async function upstream(address: string): Promise<number> {
  const sock = dgram.createSocket('udp4');
  sock.on('message', (m, r) => {
    const out = answerFor(m);
    if (out) sock.send(out, r.port, r.address);
  });
  await new Promise<void>((resolve) => sock.bind(0, address, resolve));
  return sock.address().port;
}

async function main(): Promise<void> {
  const [mode, address, upHost, upPort] = process.argv.slice(2);
  if (!address || (mode === 'skiff' && (!upHost || !upPort))) throw new Error('usage: dns-child.ts skiff ADDRESS UPSTREAM_ADDRESS UPSTREAM_PORT | upstream ADDRESS');
  const port = mode === 'skiff' ? await skiff(address, upHost!, Number(upPort)) : await upstream(address);
  process.stdout.write(`${JSON.stringify({ port })}\n`);
}

main().catch((err) => {
  process.stderr.write(`dns-child failed: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
