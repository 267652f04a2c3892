import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import net from 'node:net';
import dnsPacket from 'dns-packet';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/log.js';
import { DnsServer, parseResolvConf, RCODE } from '../../src/proxy/dns.js';
import { Allocator } from '../../src/proxy/service.js';
import { pod, serviceObject } from '../helpers/proxy-fixtures.js';

const services = new Allocator('10.96.0.0/12').resolve([
  serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'dns', port: 53, protocol: 'UDP' }] }),
  serviceObject('ns1', 'db', { clusterIP: 'None', selector: { app: 'db' }, ports: [{ name: 'pg', port: 5432, targetPort: 'pg' }] }),
]).services;
const pods = [
  pod('db-0', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.5', ports: [{ name: 'pg', containerPort: 5433 }] }),
  pod('db-1', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.6', ports: [{ name: 'pg', containerPort: 5433 }] }),
  pod('db-2', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.7', ready: false }),
];
const view = { services: () => services, pods: () => pods };

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** A fake upstream resolver on 127.0.0.1: answers example.org, stays silent for silent.example. */
async function fakeUpstream(): Promise<{ port: number; queries: () => number }> {
  let count = 0;
  const answer = (raw: Buffer): Buffer | undefined => {
    count++;
    const q = dnsPacket.decode(raw);
    const name = q.questions![0]!.name;
    if (name === 'silent.example') return undefined;
    return dnsPacket.encode({
      type: 'response',
      id: q.id,
      flags: dnsPacket.RECURSION_AVAILABLE,
      questions: q.questions,
      answers: name === 'example.org' ? [{ type: 'A', name, ttl: 60, class: 'IN', data: '192.0.2.1' }] : [],
    });
  };
  const udp = dgram.createSocket('udp4');
  udp.on('message', (m, r) => {
    const out = answer(m);
    if (out) udp.send(out, r.port, r.address);
  });
  await new Promise<void>((r) => udp.bind(0, '127.0.0.1', r));
  const port = udp.address().port;
  const tcp = net.createServer((s) => {
    s.on('error', () => {});
    s.once('data', (b: Buffer) => {
      const out = answer(b.subarray(2));
      if (!out) return;
      const len = Buffer.alloc(2);
      len.writeUInt16BE(out.length);
      s.end(Buffer.concat([len, out]));
    });
  });
  await new Promise<void>((r) => tcp.listen(port, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => udp.close(() => r())), () => new Promise<void>((r) => tcp.close(() => r())));
  return { port, queries: () => count };
}

async function startDns(opts: Partial<ConstructorParameters<typeof DnsServer>[0]> = {}) {
  const up = await fakeUpstream();
  const server = new DnsServer({
    address: '127.0.0.1',
    port: 0,
    clusterDomain: 'cluster.local',
    view,
    upstreams: [{ host: '127.0.0.1', port: up.port }],
    log: silentLogger,
    forwardTimeoutMs: 300,
    ...opts,
  });
  const { port } = await server.start();
  cleanups.push(() => server.close());
  const resolver = new Resolver({ timeout: 2000, tries: 1 });
  resolver.setServers([`127.0.0.1:${port}`]);
  return { port, resolver, up };
}

function udpQuery(port: number, raw: Buffer): Promise<Buffer | undefined> {
  return new Promise((resolve) => {
    const s = dgram.createSocket('udp4');
    const t = setTimeout(() => {
      s.close();
      resolve(undefined);
    }, 500);
    s.on('message', (m) => {
      clearTimeout(t);
      s.close();
      resolve(m);
    });
    s.send(raw, port, '127.0.0.1');
  });
}

/** dns-packet decodes the rcode, though its types do not say so. */
const decode = (buf: Buffer) => dnsPacket.decode(buf) as ReturnType<typeof dnsPacket.decode> & { rcode: string };

const query = (name: string, type: 'A' | 'SRV' | 'AAAA' = 'A', id = 7) =>
  dnsPacket.encode({ type: 'query', id, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type, name, class: 'IN' }] });

describe('service DNS over real sockets', () => {
  it('answers Service A and SRV records, headless Services with the ready pods, and pod names', async () => {
    const { resolver } = await startDns();
    expect(await resolver.resolve4('web.ns1.svc.cluster.local')).toEqual(['10.96.0.10']);
    expect(await resolver.resolve4('WEB.ns1.svc.cluster.local.')).toEqual(['10.96.0.10']);
    expect(await resolver.resolveSrv('_http._tcp.web.ns1.svc.cluster.local')).toEqual([{ name: 'web.ns1.svc.cluster.local', port: 80, priority: 0, weight: 100 }]);
    expect(await resolver.resolveSrv('_dns._udp.web.ns1.svc.cluster.local')).toEqual([{ name: 'web.ns1.svc.cluster.local', port: 53, priority: 0, weight: 100 }]);
    expect((await resolver.resolve4('db.ns1.svc.cluster.local')).sort()).toEqual(['10.88.0.5', '10.88.0.6']);
    const srv = await resolver.resolveSrv('_pg._tcp.db.ns1.svc.cluster.local');
    expect(srv.map((s) => `${s.name}:${s.port}`).sort()).toEqual(['10-88-0-5.db.ns1.svc.cluster.local:5433', '10-88-0-6.db.ns1.svc.cluster.local:5433']);
    expect(await resolver.resolve4('10-88-0-5.db.ns1.svc.cluster.local')).toEqual(['10.88.0.5']);
    expect(await resolver.resolve4('10-88-0-6.ns1.pod.cluster.local')).toEqual(['10.88.0.6']);
  });

  it('NXDOMAIN for unknown names in the cluster domain, NODATA for other types of known ones', async () => {
    const { resolver, port, up } = await startDns();
    for (const name of ['nope.ns1.svc.cluster.local', 'web.other.svc.cluster.local', '10-1-2-3.ns1.pod.cluster.local', '_x._tcp.web.ns1.svc.cluster.local', 'a.b.c.cluster.local']) {
      await expect(resolver.resolve4(name)).rejects.toMatchObject({ code: 'ENOTFOUND' });
    }
    const aaaa = decode((await udpQuery(port, query('web.ns1.svc.cluster.local', 'AAAA')))!);
    expect(aaaa.rcode).toBe('NOERROR');
    expect(aaaa.answers).toEqual([]);
    expect(up.queries()).toBe(0); // the cluster domain never leaks upstream
  });

  it('forwards other names to the upstream, and answers SERVFAIL when it is silent', async () => {
    const { resolver, up } = await startDns();
    expect(await resolver.resolve4('example.org')).toEqual(['192.0.2.1']);
    const t0 = Date.now();
    await expect(resolver.resolve4('silent.example')).rejects.toMatchObject({ code: 'ESERVFAIL' });
    expect(Date.now() - t0).toBeLessThan(1500);
    expect(up.queries()).toBe(2);
  });

  it('answers over TCP, including forwarded names', async () => {
    const { port } = await startDns();
    const ask = (raw: Buffer) =>
      new Promise<Buffer>((resolve, reject) => {
        const s = net.connect(port, '127.0.0.1');
        let buf = Buffer.alloc(0);
        s.on('data', (c: Buffer) => {
          buf = Buffer.concat([buf, c]);
          if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
            s.destroy();
            resolve(buf.subarray(2));
          }
        });
        s.on('error', reject);
        const len = Buffer.alloc(2);
        len.writeUInt16BE(raw.length);
        s.write(Buffer.concat([len, raw]));
      });
    const local = dnsPacket.decode(await ask(query('web.ns1.svc.cluster.local')));
    expect(local.answers?.map((a) => (a as { data?: unknown }).data)).toEqual(['10.96.0.10']);
    const fwd = dnsPacket.decode(await ask(query('example.org')));
    expect(fwd.answers?.map((a) => (a as { data?: unknown }).data)).toEqual(['192.0.2.1']);
  });

  it('survives hostile input: garbage, responses, several questions, oversized TCP messages, connection floods', async () => {
    const { port, resolver } = await startDns({ maxTcpConnections: 4 });
    // Garbage with a header: FORMERR; shorter than a header: silence; a response: silence.
    const garbage = Buffer.concat([Buffer.from([0x12, 0x34, 0x01, 0x00, 0x00, 0x01, 0, 0, 0, 0, 0, 0]), Buffer.from([0xff, 0xff, 0xff])]);
    const formerr = decode((await udpQuery(port, garbage))!);
    expect(formerr.id).toBe(0x1234);
    expect(formerr.rcode).toBe('FORMERR');
    expect(await udpQuery(port, Buffer.from([1, 2, 3]))).toBeUndefined();
    const asResponse = Buffer.from(query('web.ns1.svc.cluster.local'));
    asResponse[2] = asResponse[2]! | 0x80;
    expect(await udpQuery(port, asResponse)).toBeUndefined();
    const two = Buffer.from(query('web.ns1.svc.cluster.local'));
    two.writeUInt16BE(2, 4);
    expect(decode((await udpQuery(port, two))!).rcode).toBe('FORMERR');
    expect(await udpQuery(port, Buffer.alloc(9000, 1))).toBeUndefined();

    // A TCP message longer than any query: the connection is closed.
    const closed = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => s.write(Buffer.from([0xff, 0xff, 0, 0, 0])));
      s.on('close', () => resolve(true));
      s.on('error', () => {});
      setTimeout(() => resolve(false), 2000);
    });
    expect(closed).toBe(true);

    // More idle connections than allowed: the extra ones are closed at once.
    const socks: net.Socket[] = [];
    cleanups.push(() => socks.forEach((s) => s.destroy()));
    for (let i = 0; i < 4; i++) {
      const s = net.connect(port, '127.0.0.1');
      s.on('error', () => {});
      socks.push(s);
      await new Promise((r) => s.once('connect', r));
    }
    const extra = net.connect(port, '127.0.0.1');
    extra.on('error', () => {});
    await new Promise((r) => extra.once('close', r));

    // Still answering.
    expect(await resolver.resolve4('web.ns1.svc.cluster.local')).toEqual(['10.96.0.10']);
    expect(RCODE.NXDOMAIN).toBe(3);
  });

  it('bounds forwards in flight: beyond the limit a query gets SERVFAIL at once', async () => {
    const { port } = await startDns({ maxInflightForwards: 2, forwardTimeoutMs: 1500 });
    const slow = [udpQuery(port, query('silent.example', 'A', 1)), udpQuery(port, query('silent.example', 'A', 2))];
    await new Promise((r) => setTimeout(r, 50));
    const t0 = Date.now();
    const third = await udpQuery(port, query('example.org', 'A', 3));
    expect(Date.now() - t0).toBeLessThan(400);
    expect(decode(third!).rcode).toBe('SERVFAIL');
    await Promise.all(slow);
  });
});

describe('resolv.conf', () => {
  it('takes up to three nameservers and never our own address', () => {
    const text = '# comment\nsearch example.com\nnameserver 10.88.0.1\nnameserver 192.168.1.1\nnameserver bogus\nnameserver ::1\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n';
    expect(parseResolvConf(text, ['10.88.0.1'])).toEqual([
      { host: '192.168.1.1', port: 53 },
      { host: '::1', port: 53 },
      { host: '8.8.8.8', port: 53 },
    ]);
  });
});
