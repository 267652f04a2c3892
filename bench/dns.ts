/**
 * `npm run bench -- dns`: queries per second the service DNS answers, for
 * an in-zone A record (1,000 Services) and for a forwarded name (to a tiny
 * upstream on 127.0.0.62 that answers from the query's own bytes), with one
 * client (one UDP socket, 64 queries in flight) sending for 10 s each; and
 * the same two loads against dnsmasq (from Debian's dnsmasq-base, a static
 * host record, cache off so every forward goes upstream) as a floor. Each
 * server runs in a process of its own; its CPU time and memory come from
 * /proc, so the figures are also given per core of the server.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import dgram from 'node:dgram';
import fs from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import dnsPacket from 'dns-packet';

export const SERVICES = 1000;
/** The in-zone name asked for, and its cluster IP. */
export const IN_ZONE = { name: 'svc-500.bench.svc.cluster.local', ip: '10.96.1.244' };

const SECONDS = 10;
const IN_FLIGHT = 64;
/** Distinct forwarded names, so queries in flight never share one forward. */
const FORWARDED_NAMES = 4096;
const LOST_AFTER_MS = 1000;

const SERVER_ADDRESS = '127.0.0.61';
const UPSTREAM_ADDRESS = '127.0.0.62';
const DNSMASQ_ADDRESS = '127.0.0.63';

interface Load {
  qps: number;
  answered: number;
  lost: number;
  wrong: number;
  /** Of the server (and of the upstream, for forwards) over the window: CPU seconds per second. */
  cores: number;
  upstreamCores: number;
  rssMiB: [number, number];
  peakMiB: number;
}

const clockTicks = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

async function cpuSeconds(pid: number): Promise<number> {
  const stat = await fs.readFile(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / clockTicks; // utime, stime
}

async function memoryMiB(pid: number): Promise<{ rss: number; peak: number }> {
  const status = await fs.readFile(`/proc/${pid}/status`, 'utf8');
  const kib = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+)`, 'm').exec(status)?.[1] ?? 0);
  return { rss: kib('VmRSS') / 1024, peak: kib('VmHWM') / 1024 };
}

const query = (name: string) => dnsPacket.encode({ type: 'query', id: 0, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name, class: 'IN' }] });

/**
 * One client: keeps IN_FLIGHT queries outstanding for `seconds`, cycling through `templates` with fresh
 * ids; an answer must carry NOERROR and at least one record. A query unanswered after a second is lost
 * and replaced.
 */
async function load(host: string, port: number, templates: Buffer[], seconds: number, pids: { server: number; upstream?: number }): Promise<Load> {
  const sock = dgram.createSocket('udp4');
  await new Promise<void>((r) => sock.bind(0, '127.0.0.1', r));
  const sentAt = new Map<number, number>();
  let nextId = 0;
  let nextName = 0;
  let answered = 0;
  let lost = 0;
  let wrong = 0;
  let sending = true;
  const send = () => {
    if (!sending) return;
    let id = nextId;
    while (sentAt.has(id)) id = (id + 1) & 0xffff;
    nextId = (id + 1) & 0xffff;
    const q = Buffer.from(templates[nextName++ % templates.length]!);
    q.writeUInt16BE(id, 0);
    sentAt.set(id, performance.now());
    sock.send(q, port, host);
  };
  sock.on('message', (m) => {
    if (m.length < 12) return;
    const id = m.readUInt16BE(0);
    if (!sentAt.delete(id)) return;
    if ((m[3]! & 0x0f) === 0 && m.readUInt16BE(6) >= 1) answered++;
    else wrong++;
    send();
  });
  const sweep = setInterval(() => {
    const now = performance.now();
    for (const [id, t] of sentAt) {
      if (now - t < LOST_AFTER_MS) continue;
      sentAt.delete(id);
      lost++;
      send();
    }
  }, 100);
  const cpu0 = await cpuSeconds(pids.server);
  const up0 = pids.upstream ? await cpuSeconds(pids.upstream) : 0;
  const mem0 = await memoryMiB(pids.server);
  const t0 = performance.now();
  const answered0 = answered;
  for (let i = 0; i < IN_FLIGHT; i++) send();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const elapsed = (performance.now() - t0) / 1000;
  const inWindow = answered - answered0;
  const cpu1 = await cpuSeconds(pids.server);
  const up1 = pids.upstream ? await cpuSeconds(pids.upstream) : 0;
  const mem1 = await memoryMiB(pids.server);
  sending = false;
  await new Promise((r) => setTimeout(r, 200));
  clearInterval(sweep);
  sock.close();
  return {
    qps: inWindow / elapsed,
    answered: inWindow,
    lost,
    wrong,
    cores: (cpu1 - cpu0) / elapsed,
    upstreamCores: (up1 - up0) / elapsed,
    rssMiB: [mem0.rss, mem1.rss],
    peakMiB: mem1.peak,
  };
}

/** Sends `q` until an answer comes back, for up to 10 s; the answer. */
async function ready(host: string, port: number, q: Buffer): Promise<ReturnType<typeof dnsPacket.decode>> {
  const deadline = Date.now() + 10_000;
  const sock = dgram.createSocket('udp4');
  try {
    while (Date.now() < deadline) {
      const got = await new Promise<Buffer | undefined>((resolve) => {
        const t = setTimeout(() => resolve(undefined), 200);
        sock.once('message', (m) => {
          clearTimeout(t);
          resolve(m);
        });
        sock.send(q, port, host);
      });
      if (got) return dnsPacket.decode(got);
    }
    throw new Error(`no DNS answer from ${host}:${port} within 10 s`);
  } finally {
    sock.close();
  }
}

/** A child that prints {"port":N} when it listens. */
async function startChild(args: string[]): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(new URL('./dns-child.ts', import.meta.url)), ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.add(child);
  const port = await new Promise<number>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (c) => {
      out += c;
      const line = out.split('\n')[0];
      if (out.includes('\n')) resolve((JSON.parse(line!) as { port: number }).port);
    });
    child.once('exit', (code) => reject(new Error(`dns-child ${args[0]} exited with ${code} before listening`)));
  });
  return { child, port };
}

async function freeUdpPort(address: string): Promise<number> {
  const s = dgram.createSocket('udp4');
  await new Promise<void>((r) => s.bind(0, address, r));
  const { port } = s.address();
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

const children = new Set<ChildProcess>();
async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((r) => child.once('exit', r));
    child.kill('SIGTERM');
    await exited;
  }
  children.delete(child);
}

/** An interrupted run must not leave its servers behind. */
function stopOnSignal(): void {
  for (const sig of ['SIGINT', 'SIGTERM'] as const) {
    process.once(sig, () => {
      for (const c of children) c.kill('SIGKILL');
      process.exit(130);
    });
  }
}

function line(server: string, what: string, r: Load): string {
  const perCore = r.cores > 0 ? r.qps / r.cores : 0;
  const up = r.upstreamCores ? `, upstream ${r.upstreamCores.toFixed(2)} core` : '';
  return (
    `  ${server.padEnd(8)} ${what.padEnd(12)} ${r.qps.toFixed(0).padStart(7)} q/s  server ${r.cores.toFixed(2)} core → ${perCore.toFixed(0).padStart(7)} q/s per core${up}; ` +
    `RSS ${r.rssMiB[0].toFixed(0)}→${r.rssMiB[1].toFixed(0)} MiB (peak ${r.peakMiB.toFixed(0)}); ${r.answered} answered, ${r.lost} lost, ${r.wrong} wrong\n`
  );
}

export async function benchDns(seconds = SECONDS): Promise<void> {
  stopOnSignal();
  const inZone = [query(IN_ZONE.name)];
  const forwarded = Array.from({ length: FORWARDED_NAMES }, (_, i) => query(`n${i}.example.org`));
  const upstream = await startChild(['upstream', UPSTREAM_ADDRESS]);
  const results: Record<string, { inZone: Load; forwarded: Load }> = {};
  process.stdout.write(`dns: one client, ${IN_FLIGHT} queries in flight, ${seconds} s per load; the server's CPU and memory from /proc\n`);
  try {
    const skiff = await startChild(['skiff', SERVER_ADDRESS, UPSTREAM_ADDRESS, String(upstream.port)]);
    try {
      const check = await ready(SERVER_ADDRESS, skiff.port, inZone[0]!);
      if ((check.answers?.[0] as { data?: string } | undefined)?.data !== IN_ZONE.ip) throw new Error(`skiff answered ${JSON.stringify(check.answers)} for ${IN_ZONE.name}`);
      const pids = { server: skiff.child.pid!, upstream: upstream.child.pid! };
      results.skiff = { inZone: await load(SERVER_ADDRESS, skiff.port, inZone, seconds, { server: pids.server }), forwarded: await load(SERVER_ADDRESS, skiff.port, forwarded, seconds, pids) };
      process.stdout.write(line('skiff', 'in-zone A', results.skiff.inZone) + line('skiff', 'forwarded A', results.skiff.forwarded));
    } finally {
      await stop(skiff.child);
    }
    if (spawnSync('dnsmasq', ['--version']).status !== 0) {
      process.stdout.write('  dnsmasq is not installed (Debian: dnsmasq-base; scripts/setup.sh installs it): no floor\n');
      return;
    }
    const port = await freeUdpPort(DNSMASQ_ADDRESS);
    // prettier-ignore
    const dnsmasq = spawn('dnsmasq', [
      '--keep-in-foreground', '--conf-file=/dev/null', '--user=root', '--pid-file=', '--log-facility=-',
      '--bind-interfaces', `--listen-address=${DNSMASQ_ADDRESS}`, `--port=${port}`,
      '--no-resolv', '--no-hosts', '--cache-size=0', '--dns-forward-max=1024',
      `--server=${UPSTREAM_ADDRESS}#${upstream.port}`, '--local=/cluster.local/', `--host-record=${IN_ZONE.name},${IN_ZONE.ip}`,
    ], { stdio: ['ignore', 'ignore', 'pipe'] });
    children.add(dnsmasq);
    let errText = '';
    dnsmasq.stderr!.on('data', (c) => (errText += c));
    try {
      const check = await ready(DNSMASQ_ADDRESS, port, inZone[0]!).catch((err: Error) => {
        throw new Error(`${err.message}\n${errText}`);
      });
      if ((check.answers?.[0] as { data?: string } | undefined)?.data !== IN_ZONE.ip) throw new Error(`dnsmasq answered ${JSON.stringify(check.answers)} for ${IN_ZONE.name}`);
      const pids = { server: dnsmasq.pid!, upstream: upstream.child.pid! };
      results.dnsmasq = { inZone: await load(DNSMASQ_ADDRESS, port, inZone, seconds, { server: pids.server }), forwarded: await load(DNSMASQ_ADDRESS, port, forwarded, seconds, pids) };
      process.stdout.write(line('dnsmasq', 'in-zone A', results.dnsmasq.inZone) + line('dnsmasq', 'forwarded A', results.dnsmasq.forwarded));
    } finally {
      await stop(dnsmasq);
    }
    const s = results.skiff!;
    const d = results.dnsmasq!;
    const perCore = (r: Load) => (r.cores > 0 ? r.qps / r.cores : 0);
    process.stdout.write(
      `  skiff / dnsmasq: in-zone ${(s.inZone.qps / d.inZone.qps).toFixed(2)} (per core ${(perCore(s.inZone) / perCore(d.inZone)).toFixed(2)}), ` +
        `forwarded ${(s.forwarded.qps / d.forwarded.qps).toFixed(2)} (per core ${(perCore(s.forwarded) / perCore(d.forwarded)).toFixed(2)})\n`,
    );
  } finally {
    await stop(upstream.child);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  benchDns(Number(process.argv[2]) || undefined).catch((err) => {
    process.stderr.write(`bench failed: ${err instanceof Error ? err.stack : String(err)}\n`);
    process.exit(1);
  });
}
