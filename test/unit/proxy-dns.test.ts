import { execFile } from 'node:child_process';
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import net from 'node:net';
import os from 'node:os';
import { parseArgs, promisify } from 'node:util';
import dnsPacket from 'dns-packet';
import { afterEach, describe, expect, it } from 'vitest';
import { PROXY_FLAGS, proxyOptionsFrom } from '../../src/cli/proxy.js';
import { createLogger, silentLogger } from '../../src/log.js';
import { canonicalIP, DnsServer, isSelf, parseResolvConf, RCODE } from '../../src/proxy/dns.js';
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

const execFileP = promisify(execFile);

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * A fake upstream resolver (127.0.0.1 and a free port unless told): answers example.org, stays
 * silent for silent.example; counts the queries it gets, the server's loop probes (HINFO) aside.
 */
async function fakeUpstream(address = '127.0.0.1', wantPort = 0): Promise<{ port: number; queries: () => number }> {
  let count = 0;
  const answer = (raw: Buffer): Buffer | undefined => {
    const q = dnsPacket.decode(raw);
    const name = q.questions![0]!.name;
    if (q.questions![0]!.type !== 'HINFO') count++;
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
  // A port free for both, not UDP's ephemeral one, which TCP may be using (the test would hang).
  const port = wantPort || (await freePort(address));
  await new Promise<void>((resolve, reject) => {
    udp.once('error', reject);
    udp.bind(port, address, () => resolve());
  });
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
  cleanups.push(() => new Promise<void>((r) => udp.close(() => r())));
  await new Promise<void>((resolve, reject) => {
    tcp.once('error', reject);
    tcp.listen(port, address, () => resolve());
  });
  cleanups.push(() => new Promise<void>((r) => tcp.close(() => r())));
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

function udpQuery(port: number, raw: Buffer, address = '127.0.0.1'): Promise<Buffer | undefined> {
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
    s.send(raw, port, address);
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
  it('takes up to three nameservers (the server drops itself, by address and port)', () => {
    const text = '# comment\nsearch example.com\nnameserver 10.88.0.1\nnameserver 192.168.1.1\nnameserver bogus\nnameserver ::1\nnameserver 8.8.8.8\nnameserver 1.1.1.1\n';
    expect(parseResolvConf(text)).toEqual([
      { host: '10.88.0.1', port: 53 },
      { host: '192.168.1.1', port: 53 },
      { host: '::1', port: 53 },
    ]);
  });
});

describe('which upstreams are the server itself', () => {
  const local = ['127.0.0.1', '10.88.0.1', '192.0.2.2', '::1', 'fe80::1'];
  it.each([
    // [upstream, listening address, self?]
    ['10.88.0.1:53', '10.88.0.1', true],
    ['10.88.0.1:5353', '10.88.0.1', false], // same address, another port: another server
    ['127.0.0.53:53', '10.88.0.1', false], // a stub resolver on loopback is an upstream
    ['127.0.0.53:53', '127.0.0.1', false], // ... even for a DNS on 127.0.0.1
    ['127.0.0.1:53', '127.0.0.1', true],
    ['0.0.0.0:53', '127.0.0.1', true], // delivered to loopback
    ['::ffff:10.88.0.1:53', '10.88.0.1', true],
    ['127.0.0.1:53', '0.0.0.0', true],
    ['127.0.0.53:53', '0.0.0.0', true], // a wildcard socket takes all of 127.0.0.0/8
    ['192.0.2.2:53', '0.0.0.0', true],
    ['192.0.2.9:53', '0.0.0.0', false], // not this host's
    ['::1:53', '0.0.0.0', false], // an IPv4 socket hears no IPv6
    ['::1:53', '::', true],
    ['0:0:0:0:0:0:0:1:53', '::', true],
    ['FE80::1:53', '::', true],
    ['10.88.0.1:53', '::', true], // dual-stack
    ['2001:db8::1:53', '::', false],
  ])('%s for a DNS on %s: %s', (up, address, self) => {
    const i = up.lastIndexOf(':');
    expect(isSelf({ host: up.slice(0, i), port: Number(up.slice(i + 1)) }, { address, port: 53 }, local)).toBe(self);
  });

  it('spells addresses one way', () => {
    expect(canonicalIP('::FFFF:127.0.0.1')).toBe('127.0.0.1');
    expect(canonicalIP('::ffff:7f00:1')).toBe('127.0.0.1');
    expect(canonicalIP('fe80::1%eth0')).toBe('fe80::1');
    expect(canonicalIP('2001:DB8:0:0::1')).toBe('2001:db8::1');
  });
});

/** A port free on `address` for both UDP and TCP, for servers that must be named before they start. */
async function freePort(address: string): Promise<number> {
  for (;;) {
    const udp = dgram.createSocket(net.isIPv6(address) ? 'udp6' : 'udp4');
    await new Promise<void>((r) => udp.bind(0, address, r));
    const port = udp.address().port;
    const tcp = net.createServer();
    const ok = await new Promise<boolean>((r) => {
      tcp.once('error', () => r(false));
      tcp.listen(port, address, () => r(true));
    });
    await new Promise<void>((r) => (ok ? tcp.close(() => r()) : r()));
    await new Promise<void>((r) => udp.close(() => r()));
    if (ok) return port;
  }
}

/**
 * A forwarding resolver in the test, as an upstream that forwards back to the server: relays each
 * UDP query to `to` and the answer back. `newIds` gives each relayed query an id of its own (as
 * dnsmasq or systemd-resolved do); `answerProbes` answers HINFO itself, so the server's loop probe
 * finds no loop (a loop for some names only). Counts every packet it receives.
 */
async function relay(address: string, to: { host: string; port: number }, o: { newIds: boolean; answerProbes: boolean }) {
  let packets = 0;
  let nextId = 1000;
  let closed = false;
  const front = dgram.createSocket('udp4');
  const reply = (b: Buffer, port: number, host: string) => !closed && front.send(b, port, host);
  front.on('message', (m, client) => {
    packets++;
    const q = dnsPacket.decode(m);
    if (o.answerProbes && q.questions?.[0]?.type === 'HINFO') {
      reply(dnsPacket.encode({ type: 'response', id: q.id, flags: 3, questions: q.questions }), client.port, client.address);
      return;
    }
    const back = dgram.createSocket('udp4');
    const out = Buffer.from(m);
    if (o.newIds) out.writeUInt16BE(nextId++ & 0xffff, 0);
    back.on('message', (a) => {
      packets++;
      const answer = Buffer.from(a);
      answer.writeUInt16BE(m.readUInt16BE(0), 0);
      reply(answer, client.port, client.address);
      back.close();
    });
    setTimeout(() => back.close(), 3000).unref(); // no answer: drop the socket
    back.send(out, to.port, to.host);
  });
  await new Promise<void>((r) => front.bind(0, address, r));
  cleanups.push(() => new Promise<void>((r) => ((closed = true), front.close(() => r()))));
  return { upstream: { host: address, port: front.address().port }, packets: () => packets };
}

/** Log lines, to see the warnings and errors the server gives. */
function capturingLog() {
  const lines: Array<{ level: string; msg: string } & Record<string, unknown>> = [];
  return { log: createLogger('warn', (l) => lines.push(JSON.parse(l))), lines };
}

async function loopingServer(address: string, port: number, upstreams: Array<{ host: string; port: number }>) {
  const { log, lines } = capturingLog();
  const server = new DnsServer({ address, port, clusterDomain: 'cluster.local', view, upstreams, log, forwardTimeoutMs: 300 });
  await server.start();
  cleanups.push(() => server.close());
  return { server, lines };
}

/** One query, its rcode and how long its answer took; undefined rcode for no answer. */
async function timedQuery(port: number, address: string, name = 'example.org', id = 7) {
  const t0 = Date.now();
  const answer = await udpQuery(port, query(name, 'A', id), address);
  return { rcode: answer ? decode(answer).rcode : undefined, ms: Date.now() - t0, answers: (answer ? decode(answer).answers : undefined) ?? [] };
}

describe('a self-forwarding DNS', () => {
  it('never forwards to its own address and port; other loopback addresses and other ports are upstreams', async () => {
    const port = await freePort('127.0.0.20');
    const stub = await fakeUpstream('127.0.0.21', port); // a stub resolver on another loopback address, same port
    const { server, lines } = await loopingServer('127.0.0.20', port, [{ host: '127.0.0.20', port }, { host: '127.0.0.21', port }]);
    await server.loopChecked();
    const before = server.stats();
    const r = await timedQuery(port, '127.0.0.20');
    expect(r.rcode).toBe('NOERROR');
    expect(r.answers.map((a) => (a as { data?: unknown }).data)).toEqual(['192.0.2.1']);
    expect(stub.queries()).toBe(1);
    expect(server.stats().queries - before.queries).toBe(1);
    expect(server.stats().forwarded - before.forwarded).toBe(1);
    expect(lines.filter((l) => /does not forward to itself/.test(l.msg))).toMatchObject([{ level: 'warn', skipped: [`127.0.0.20:${port}`] }]);
  });

  it('with only itself to forward to, other names get REFUSED at once and cost one packet', async () => {
    const port = await freePort('127.0.0.22');
    const { server } = await loopingServer('127.0.0.22', port, [{ host: '127.0.0.22', port }]);
    await server.loopChecked();
    for (let i = 0; i < 20; i++) {
      const r = await timedQuery(port, '127.0.0.22', 'example.org', i);
      expect(r.rcode).toBe('REFUSED');
      expect(r.ms).toBeLessThan(200);
    }
    expect(server.stats()).toMatchObject({ queries: 20, forwarded: 0 });
  });

  it('on 0.0.0.0, every address of the host on its port is itself; an upstream on another port still answers', async () => {
    const port = await freePort('0.0.0.0');
    const up = await fakeUpstream('127.0.0.1');
    const hostV4 = Object.values(os.networkInterfaces()).flatMap((l) => l ?? []).find((a) => a.family === 'IPv4' && !a.internal)?.address;
    const selves = [{ host: '127.0.0.1', port }, { host: '0.0.0.0', port }, { host: '127.0.0.23', port }, ...(hostV4 ? [{ host: hostV4, port }] : [])];
    const { server, lines } = await loopingServer('0.0.0.0', port, [...selves, { host: '127.0.0.1', port: up.port }]);
    expect(server.activeUpstreams()).toEqual([{ host: '127.0.0.1', port: up.port }]);
    await server.loopChecked();
    const before = server.stats();
    const r = await timedQuery(port, '127.0.0.1');
    expect(r.rcode).toBe('NOERROR');
    expect(up.queries()).toBe(1);
    expect(server.stats().queries - before.queries).toBe(1);
    expect(server.stats().forwarded - before.forwarded).toBe(1);
    expect(lines.find((l) => /does not forward to itself/.test(l.msg))?.skipped).toHaveLength(selves.length);
  });

  it('on 0.0.0.0 with only 127.0.0.1 on its own port: REFUSED at once, nothing forwarded', async () => {
    const port = await freePort('0.0.0.0');
    const { server } = await loopingServer('0.0.0.0', port, [{ host: '127.0.0.1', port }]);
    const r = await timedQuery(port, '127.0.0.1');
    expect(r.rcode).toBe('REFUSED');
    expect(r.ms).toBeLessThan(200);
    expect(server.stats()).toMatchObject({ queries: 1, forwarded: 0 });
  });

  it('a query coming back through an upstream that keeps ids (the probe passing) gets SERVFAIL after one lap', async () => {
    const port = await freePort('127.0.0.24');
    const back = await relay('127.0.0.25', { host: '127.0.0.24', port }, { newIds: false, answerProbes: true });
    const { server, lines } = await loopingServer('127.0.0.24', port, [back.upstream]);
    await server.loopChecked();
    expect(server.activeUpstreams()).toEqual([back.upstream]); // the probe saw no loop
    const before = { ...server.stats(), relayed: back.packets() };
    for (let i = 0; i < 10; i++) {
      const r = await timedQuery(port, '127.0.0.24', `name${i}.example.org`, 100 + i);
      expect(r.rcode).toBe('SERVFAIL');
      expect(r.ms).toBeLessThan(250);
    }
    const after = server.stats();
    // Per query: the client's, and ours once back (2 in); one forward out; the relay sees the query and our answer.
    expect(after.queries - before.queries).toBe(20);
    expect(after.forwarded - before.forwarded).toBe(10);
    expect(after.loops - before.loops).toBe(10);
    expect(back.packets() - before.relayed).toBe(20);
    expect(lines.some((l) => l.level === 'error' && /a loop/.test(l.msg))).toBe(true);
  });

  it('a query coming back with a new id (the probe passing) shares its own forward: one lap, SERVFAIL at the timeout', async () => {
    const port = await freePort('127.0.0.26');
    const back = await relay('127.0.0.27', { host: '127.0.0.26', port }, { newIds: true, answerProbes: true });
    const { server } = await loopingServer('127.0.0.26', port, [back.upstream]);
    await server.loopChecked();
    const before = { ...server.stats(), relayed: back.packets() };
    const r = await timedQuery(port, '127.0.0.26');
    expect(r.rcode).toBe('SERVFAIL');
    expect(r.ms).toBeLessThan(450); // the 300 ms forward timeout, not a thousand laps
    const after = server.stats();
    expect(after.queries - before.queries).toBe(2);
    expect(after.forwarded - before.forwarded).toBe(1);
    expect(back.packets() - before.relayed).toBeLessThanOrEqual(2);
  });

  it('the loop probe finds an upstream that forwards back with new ids, and stops using it', async () => {
    const port = await freePort('127.0.0.28');
    const back = await relay('127.0.0.29', { host: '127.0.0.28', port }, { newIds: true, answerProbes: false });
    const up = await fakeUpstream('127.0.0.30');
    const { server, lines } = await loopingServer('127.0.0.28', port, [back.upstream, { host: '127.0.0.30', port: up.port }]);
    await server.loopChecked();
    expect(server.activeUpstreams()).toEqual([{ host: '127.0.0.30', port: up.port }]);
    expect(lines.filter((l) => /forwarding loop/.test(l.msg))).toMatchObject([{ level: 'error', upstream: `127.0.0.29:${back.upstream.port}` }]);
    const relayed = back.packets();
    const r = await timedQuery(port, '127.0.0.28');
    expect(r.rcode).toBe('NOERROR');
    expect(up.queries()).toBe(1);
    expect(back.packets()).toBe(relayed);
  });

  it('two servers forwarding to each other find the loop; a query costs a handful of packets', async () => {
    const [pa, pb] = [await freePort('127.0.0.31'), await freePort('127.0.0.32')];
    const a = await loopingServer('127.0.0.31', pa, [{ host: '127.0.0.32', port: pb }]);
    const b = await loopingServer('127.0.0.32', pb, [{ host: '127.0.0.31', port: pa }]);
    await Promise.all([a.server.loopChecked(), b.server.loopChecked()]);
    const found = [...a.lines, ...b.lines].filter((l) => /forwarding loop/.test(l.msg));
    expect(found.length).toBeGreaterThanOrEqual(1);
    const before = [a.server.stats(), b.server.stats()];
    for (const [port, address] of [[pa, '127.0.0.31'], [pb, '127.0.0.32']] as const) {
      for (let i = 0; i < 5; i++) {
        const r = await timedQuery(port, address, `x${i}.example.org`, i);
        expect(['SERVFAIL', 'REFUSED']).toContain(r.rcode);
        expect(r.ms).toBeLessThan(250);
      }
    }
    const after = [a.server.stats(), b.server.stats()];
    const packets = after.reduce((n, s, i) => n + s.queries - before[i]!.queries + s.forwarded - before[i]!.forwarded, 0);
    expect(packets).toBeLessThanOrEqual(10 * 4);
  });

  it('two servers forwarding to each other stop a query after one lap even before their probes are done', async () => {
    // A query circles A → B → A with the client's id (neither changes it): A knows it as its own.
    const [pa, pb] = [await freePort('127.0.0.33'), await freePort('127.0.0.34')];
    const a = await loopingServer('127.0.0.33', pa, [{ host: '127.0.0.34', port: pb }]);
    const b = await loopingServer('127.0.0.34', pb, [{ host: '127.0.0.33', port: pa }]);
    // No waiting for the probes: queries sent at once still cost a handful of packets.
    const r = await timedQuery(pa, '127.0.0.33');
    expect(['SERVFAIL', 'REFUSED']).toContain(r.rcode);
    expect(r.ms).toBeLessThan(250);
    const total = a.server.stats().queries + b.server.stats().queries;
    expect(total).toBeLessThanOrEqual(8);
  });
});

// ------------------------------------------------------------ the specification's records

/** The records the Kubernetes DNS-Based Service Discovery specification (schema 1.0.1) requires. */
const specServices = new Allocator('10.96.0.0/12').resolve([
  serviceObject('ns1', 'web', { clusterIP: '10.96.0.10', selector: { app: 'web' }, ports: [{ name: 'http', port: 80 }] }),
  serviceObject('ns1', 'db', { clusterIP: 'None', selector: { app: 'db' }, ports: [{ name: 'pg', port: 5432, targetPort: 'pg' }] }),
  serviceObject('ns1', 'empty', { clusterIP: 'None', selector: { app: 'none-ready' }, ports: [{ name: 'http', port: 80 }] }),
  serviceObject('ns1', 'big', { clusterIP: 'None', selector: { app: 'big' }, ports: [{ name: 'http', port: 80 }] }),
  serviceObject('ns1', 'mid', { clusterIP: 'None', selector: { app: 'mid' }, ports: [{ name: 'http', port: 80 }] }),
  serviceObject('ns1', 'ext', { type: 'ExternalName', externalName: 'db.example.org.', ports: [{ name: 'pg', port: 5432 }] }),
]).services;
const pg = [{ name: 'pg', containerPort: 5433 }];
const specPods = [
  pod('db-0', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.5', ports: pg, hostname: 'db-0', subdomain: 'db' }),
  pod('db-1', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.6', ports: pg }),
  // A hostname under another subdomain does not name it in this Service.
  pod('db-x', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.8', ports: pg, hostname: 'x', subdomain: 'elsewhere' }),
  pod('db-unready', { ns: 'ns1', labels: { app: 'db' }, ip: '10.88.0.7', ports: pg, hostname: 'db-unready', subdomain: 'db', ready: false }),
  pod('empty-0', { ns: 'ns1', labels: { app: 'none-ready' }, ip: '10.88.0.9', ready: false }),
  ...Array.from({ length: 150 }, (_, i) => pod(`big-${i}`, { ns: 'ns1', labels: { app: 'big' }, ip: `10.88.1.${i + 1}` })),
  ...Array.from({ length: 60 }, (_, i) => pod(`mid-${i}`, { ns: 'ns1', labels: { app: 'mid' }, ip: `10.88.2.${i + 1}`, hostname: `mid-${i}`, subdomain: 'mid' })),
];
const specView = { services: () => specServices, pods: () => specPods };
const REVERSE = ['10.96.0.0/12', '10.88.0.0/16'];

/** `dig` (scripts/setup.sh installs dnsutils) against the server: +short lines, or with `full` the whole answer text. */
async function dig(port: number, args: string[], full = false): Promise<string> {
  const { stdout } = await execFileP('dig', ['@127.0.0.1', '-p', String(port), '+time=2', '+tries=1', ...(full ? [] : ['+short']), ...args]);
  return stdout;
}

type Rr = { type: string; name: string; data: unknown };
const edns = (name: string, type: string, size = 4096, id = 9) =>
  dnsPacket.encode({ type: 'query', id, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type, name, class: 'IN' } as dnsPacket.Question], additionals: [{ type: 'OPT', name: '.', udpPayloadSize: size } as dnsPacket.Answer] });

function tcpQuery(port: number, raw: Buffer): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    s.on('data', (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      if (buf.length >= 2 && buf.length >= 2 + buf.readUInt16BE(0)) {
        s.destroy();
        resolve(buf.subarray(2, 2 + buf.readUInt16BE(0)));
      }
    });
    s.on('error', reject);
    s.on('close', () => reject(new Error('the server closed the connection without an answer')));
    const len = Buffer.alloc(2);
    len.writeUInt16BE(raw.length);
    s.write(Buffer.concat([len, raw]));
  });
}

const startSpecDns = (opts: Partial<ConstructorParameters<typeof DnsServer>[0]> = {}) => startDns({ view: specView, reverseCidrs: REVERSE, ...opts });

describe('the DNS specification\'s records (schema 1.0.1), over real sockets', () => {
  it('dns-version.<zone> TXT is "1.0.1", with authority; other types there are NODATA', async () => {
    const { port, up } = await startSpecDns();
    const txt = decode((await udpQuery(port, query('dns-version.cluster.local', 'TXT' as 'A')))!);
    expect(txt.rcode).toBe('NOERROR');
    expect(txt.flags! & dnsPacket.AUTHORITATIVE_ANSWER).toBeTruthy();
    expect(txt.answers!.map((a) => (a as { data: Buffer[] }).data.map(String))).toEqual([['1.0.1']]);
    const a = decode((await udpQuery(port, query('DNS-Version.cluster.local.')))!);
    expect([a.rcode, a.answers]).toEqual(['NOERROR', []]);
    expect(a.authorities!.map((r) => r.type)).toEqual(['SOA']);
    expect(await dig(port, ['dns-version.cluster.local', 'TXT'])).toBe('"1.0.1"\n');
    expect(up.queries()).toBe(0);
  });

  it('PTR for cluster IPs and headless endpoints, with authority; unknown addresses in the CIDRs are NXDOMAIN, never forwarded', async () => {
    const { port, up } = await startSpecDns();
    const ptr = async (ip: string) => {
      const r = decode((await udpQuery(port, query(`${ip.split('.').reverse().join('.')}.in-addr.arpa`, 'PTR' as 'A')))!);
      return { rcode: r.rcode, aa: Boolean(r.flags! & dnsPacket.AUTHORITATIVE_ANSWER), names: r.answers!.map((x) => (x as Rr).data), soa: r.authorities!.map((x) => x.name) };
    };
    expect(await ptr('10.96.0.10')).toEqual({ rcode: 'NOERROR', aa: true, names: ['web.ns1.svc.cluster.local'], soa: [] });
    // A headless endpoint is named by its hostname when its subdomain is the Service, else by its address.
    expect(await ptr('10.88.0.5')).toEqual({ rcode: 'NOERROR', aa: true, names: ['db-0.db.ns1.svc.cluster.local'], soa: [] });
    expect(await ptr('10.88.0.6')).toEqual({ rcode: 'NOERROR', aa: true, names: ['10-88-0-6.db.ns1.svc.cluster.local'], soa: [] });
    expect(await ptr('10.88.0.8')).toEqual({ rcode: 'NOERROR', aa: true, names: ['10-88-0-8.db.ns1.svc.cluster.local'], soa: [] });
    // Not ready, an unallocated cluster IP: NXDOMAIN, with the reverse zone's SOA.
    expect(await ptr('10.88.0.7')).toEqual({ rcode: 'NXDOMAIN', aa: true, names: [], soa: ['88.10.in-addr.arpa'] });
    expect(await ptr('10.96.0.99')).toEqual({ rcode: 'NXDOMAIN', aa: true, names: [], soa: ['10.in-addr.arpa'] });
    expect(up.queries()).toBe(0);
    // Outside the CIDRs: forwarded, as before.
    expect((await ptr('192.0.2.7')).aa).toBe(false);
    expect(up.queries()).toBe(1);
    expect(await dig(port, ['-x', '10.96.0.10'])).toBe('web.ns1.svc.cluster.local.\n');
    expect(await dig(port, ['-x', '10.88.0.5'])).toBe('db-0.db.ns1.svc.cluster.local.\n');
    expect(await dig(port, ['-x', '10.88.0.250'], true)).toMatch(/status: NXDOMAIN.*\n.*flags: qr aa rd ra/);
  });

  it('headless pods with hostname and subdomain get <hostname>.<svc>.<ns>.svc A records, and SRV targets use them', async () => {
    const { port, resolver } = await startSpecDns();
    expect(await resolver.resolve4('db-0.db.ns1.svc.cluster.local')).toEqual(['10.88.0.5']);
    expect(await resolver.resolve4('DB-0.db.ns1.svc.cluster.local')).toEqual(['10.88.0.5']);
    expect(await resolver.resolve4('10-88-0-6.db.ns1.svc.cluster.local')).toEqual(['10.88.0.6']);
    // The hostname is the endpoint's name (the spec's precedence); "x" is another Service's.
    for (const name of ['10-88-0-5.db.ns1.svc.cluster.local', 'x.db.ns1.svc.cluster.local', 'db-unready.db.ns1.svc.cluster.local']) {
      await expect(resolver.resolve4(name)).rejects.toMatchObject({ code: 'ENOTFOUND' });
    }
    const srv = decode((await udpQuery(port, query('_pg._tcp.db.ns1.svc.cluster.local', 'SRV')))!);
    const targets = srv.answers!.map((a) => `${(a as { data: { target: string; port: number } }).data.target}:${(a as { data: { port: number } }).data.port}`).sort();
    expect(targets).toEqual(['10-88-0-6.db.ns1.svc.cluster.local:5433', '10-88-0-8.db.ns1.svc.cluster.local:5433', 'db-0.db.ns1.svc.cluster.local:5433']);
    expect(srv.additionals!.map((a) => `${a.name} ${(a as Rr).data}`).sort()).toEqual([
      '10-88-0-6.db.ns1.svc.cluster.local 10.88.0.6',
      '10-88-0-8.db.ns1.svc.cluster.local 10.88.0.8',
      'db-0.db.ns1.svc.cluster.local 10.88.0.5',
    ]);
    expect(await dig(port, ['db-0.db.ns1.svc.cluster.local'])).toBe('10.88.0.5\n');
  });

  it('a headless Service with no ready endpoints is NXDOMAIN for every type, and so is every name below it', async () => {
    const { port, up } = await startSpecDns();
    for (const [name, type] of [
      ['empty.ns1.svc.cluster.local', 'A'],
      ['empty.ns1.svc.cluster.local', 'AAAA'],
      ['empty.ns1.svc.cluster.local', 'SRV'],
      ['_http._tcp.empty.ns1.svc.cluster.local', 'SRV'],
      ['10-88-0-9.empty.ns1.svc.cluster.local', 'A'],
    ] as const) {
      const r = decode((await udpQuery(port, query(name, type)))!);
      expect([name, type, r.rcode, r.answers!.length, r.authorities!.map((a) => `${a.type} ${a.name}`)]).toEqual([name, type, 'NXDOMAIN', 0, ['SOA cluster.local']]);
    }
    // With ready endpoints, a type it has no records of is NODATA (the name exists).
    const aaaa = decode((await udpQuery(port, query('db.ns1.svc.cluster.local', 'AAAA')))!);
    expect([aaaa.rcode, aaaa.answers]).toEqual(['NOERROR', []]);
    expect(up.queries()).toBe(0);
  });

  it('an ExternalName Service is a CNAME to its externalName for every type, with no records of its own, and nothing below it', async () => {
    const { port, up } = await startSpecDns();
    for (const type of ['A', 'AAAA', 'SRV', 'CNAME'] as const) {
      const r = decode((await udpQuery(port, query('ext.ns1.svc.cluster.local', type as 'A')))!);
      expect([type, r.rcode, r.flags! & dnsPacket.AUTHORITATIVE_ANSWER ? 'aa' : '', r.answers!.map((a) => `${a.type} ${a.name} ${String((a as { data?: unknown }).data)}`)]).toEqual([type, 'NOERROR', 'aa', ['CNAME ext.ns1.svc.cluster.local db.example.org']]);
    }
    expect(await dig(port, ['ext.ns1.svc.cluster.local', 'CNAME'])).toBe('db.example.org.\n');
    expect(decode((await udpQuery(port, query('_pg._tcp.ext.ns1.svc.cluster.local', 'SRV')))!).rcode).toBe('NXDOMAIN');
    // It has no cluster IP, so no rules and no reverse name.
    expect(specServices.find((s) => s.name === 'ext')!.clusterIP).toBeUndefined();
    // The CNAME target is outside the zone: never looked up here, and never forwarded by us.
    expect(up.queries()).toBe(0);
  });

  it('compresses names: 150 endpoints fit a 4096-byte EDNS answer; beyond what fits, additionals go first, then TC and TCP has it all', async () => {
    const { port } = await startSpecDns();
    const big = await udpQuery(port, edns('big.ns1.svc.cluster.local', 'A'));
    const a = decode(big!);
    expect(a.flags! & dnsPacket.TRUNCATED_RESPONSE).toBe(0);
    expect(a.answers!.length).toBe(150);
    expect(new Set(a.answers!.map((x) => (x as Rr).data)).size).toBe(150);
    expect(a.answers!.every((x) => x.name === 'big.ns1.svc.cluster.local')).toBe(true);
    expect(a.additionals!.map((x) => x.type)).toEqual(['OPT']); // EDNS answered with EDNS (RFC 6891)
    expect(big!.length).toBeLessThan(2600);
    // Without EDNS the same answer does not fit 512 bytes: TC, no records, and the client asks over TCP.
    const plain = decode((await udpQuery(port, query('big.ns1.svc.cluster.local')))!);
    expect([plain.flags! & dnsPacket.TRUNCATED_RESPONSE, plain.answers!.length, plain.rcode]).toEqual([dnsPacket.TRUNCATED_RESPONSE, 0, 'NOERROR']);
    expect(decode(await tcpQuery(port, query('big.ns1.svc.cluster.local'))).answers!.length).toBe(150);
    // 60 SRV records fit 4096 bytes, their targets' addresses too (optional, RFC 2181 9) do not: dropped, no TC.
    const mid = decode((await udpQuery(port, edns('_http._tcp.mid.ns1.svc.cluster.local', 'SRV')))!);
    expect(mid.flags! & dnsPacket.TRUNCATED_RESPONSE).toBe(0);
    expect(mid.answers!.length).toBe(60);
    expect(mid.additionals!.map((x) => x.type)).toEqual(['OPT']);
    const midTcp = decode(await tcpQuery(port, edns('_http._tcp.mid.ns1.svc.cluster.local', 'SRV')));
    expect(midTcp.additionals!.filter((x) => x.type === 'A').length).toBe(60);
    // 150 SRV records (targets are never compressed, RFC 2782) exceed 4096: TC over UDP, all of them over TCP.
    const srvUdp = decode((await udpQuery(port, edns('_http._tcp.big.ns1.svc.cluster.local', 'SRV')))!);
    expect([srvUdp.flags! & dnsPacket.TRUNCATED_RESPONSE, srvUdp.answers!.length]).toEqual([dnsPacket.TRUNCATED_RESPONSE, 0]);
    const srvTcp = decode(await tcpQuery(port, edns('_http._tcp.big.ns1.svc.cluster.local', 'SRV')));
    expect([srvTcp.answers!.length, srvTcp.additionals!.filter((x) => x.type === 'A').length]).toEqual([150, 150]);
    // A real resolver reads the compressed answer, and retries over TCP on TC by itself.
    expect((await dig(port, ['+bufsize=4096', 'big.ns1.svc.cluster.local'])).trim().split('\n').length).toBe(150);
    expect((await dig(port, ['+noedns', '_http._tcp.big.ns1.svc.cluster.local', 'SRV'])).trim().split('\n').length).toBe(150);
  });

  it('over TCP an answer stays within 65,535 bytes: the additional records go first, then TC', async () => {
    const many = (n: number) => {
      const services = new Allocator('10.96.0.0/12').resolve([serviceObject('ns1', 'huge', { clusterIP: 'None', selector: { app: 'huge' }, ports: [{ name: 'http', port: 80 }] })]).services;
      const pods = Array.from({ length: n }, (_, i) => pod(`huge-${i}`, { ns: 'ns1', labels: { app: 'huge' }, ip: `10.89.${i >> 8}.${i & 255}` }));
      return { services: () => services, pods: () => pods };
    };
    const srv = edns('_http._tcp.huge.ns1.svc.cluster.local', 'SRV');
    const fits = decode(await tcpQuery((await startSpecDns({ view: many(1000) })).port, srv));
    expect([fits.flags! & dnsPacket.TRUNCATED_RESPONSE, fits.answers!.length, fits.additionals!.filter((a) => a.type === 'A').length]).toEqual([0, 1000, 0]);
    const over = decode(await tcpQuery((await startSpecDns({ view: many(1300) })).port, srv));
    expect([over.flags! & dnsPacket.TRUNCATED_RESPONSE, over.answers!.length, over.rcode]).toEqual([dnsPacket.TRUNCATED_RESPONSE, 0, 'NOERROR']);
  });

  it('a label with a dot in it is one label: "web.ns1" is no Service, and the question comes back as sent', async () => {
    const { port, up } = await startSpecDns();
    const wire = (labels: string[]) =>
      Buffer.concat([Buffer.from([0, 5, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0]), ...labels.map((l) => Buffer.concat([Buffer.from([l.length]), Buffer.from(l, 'latin1')])), Buffer.from([0, 0, 1, 0, 1])]);
    const dotted = wire(['web.ns1', 'svc', 'cluster', 'local']);
    const r = (await udpQuery(port, dotted))!;
    expect(decode(r).rcode).toBe('NXDOMAIN');
    expect(r.subarray(12, dotted.length)).toEqual(dotted.subarray(12));
    // Outside the zone ("cluster.local" as one label): forwarded as sent, the upstream's answer back.
    const outside = wire(['web', 'ns1', 'svc', 'cluster.local']);
    expect(decode((await udpQuery(port, outside))!).rcode).toBe('NOERROR');
    expect(up.queries()).toBe(1);
  });

  it('pod names: "verified" answers only for a pod of that namespace; "insecure" for any address', async () => {
    const verified = await startSpecDns();
    expect(await verified.resolver.resolve4('10-88-0-6.ns1.pod.cluster.local')).toEqual(['10.88.0.6']);
    for (const name of ['10-88-0-6.other.pod.cluster.local', '192-0-2-1.ns1.pod.cluster.local']) {
      await expect(verified.resolver.resolve4(name)).rejects.toMatchObject({ code: 'ENOTFOUND' });
    }
    const insecure = await startSpecDns({ podRecords: 'insecure' });
    expect(await insecure.resolver.resolve4('192-0-2-1.any.pod.cluster.local')).toEqual(['192.0.2.1']);
    for (const name of ['192-0-2-256.ns1.pod.cluster.local', '192-0-2-01.ns1.pod.cluster.local', '1-2-3.ns1.pod.cluster.local']) {
      await expect(insecure.resolver.resolve4(name)).rejects.toMatchObject({ code: 'ENOTFOUND' });
    }
  });
});

describe('--dns-pods', () => {
  const optionsOf = (args: string[]) => proxyOptionsFrom(parseArgs({ args, options: PROXY_FLAGS, strict: true }).values);
  it('is verified unless told insecure; anything else is refused, naming the flag', () => {
    expect(optionsOf([]).podRecords).toBe('verified');
    expect(optionsOf(['--dns-pods', 'insecure']).podRecords).toBe('insecure');
    expect(() => optionsOf(['--dns-pods', 'disabled'])).toThrow('--dns-pods must be verified or insecure, not "disabled"');
  });
});
