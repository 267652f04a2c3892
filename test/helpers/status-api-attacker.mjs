// A local user trying to lock everyone out of the agent's status API: run
// under another uid (setpriv), it holds idle pod watches and slowloris
// sockets, opens them again as soon as they are closed, and runs
// connect/close loops, for a bounded time. Or, with mode "probe", it asks
// /healthz now and then, as an ordinary user whose check should still work.
// Prints one JSON line of counts and exits.
//
// argv[2]: {"port", "ms", "watches", "slowloris", "churn", "mode"}
import http from 'node:http';
import net from 'node:net';

const o = JSON.parse(process.argv[2]);
const deadline = Date.now() + o.ms;
const live = new Set();
const counts = { connects: 0, closed: 0, watchesStreaming: 0, maxOpen: 0, healthOk: 0, healthFailed: 0 };
let stopping = false;

function open(onConnect, again) {
  if (stopping || Date.now() > deadline) return;
  const c = net.connect(o.port, '127.0.0.1');
  live.add(c);
  c.on('error', () => undefined);
  c.once('connect', () => {
    counts.connects++;
    counts.maxOpen = Math.max(counts.maxOpen, live.size);
    onConnect(c);
  });
  c.once('close', () => {
    live.delete(c);
    counts.closed++;
    // A refused attacker comes straight back, but never spins without a pause at all.
    if (again) setTimeout(again, 2);
  });
}

function watch() {
  open((c) => {
    c.write('GET /pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n');
    c.once('data', () => {
      counts.watchesStreaming++;
      // Never read again: the watch sits idle, holding its place.
      c.pause();
    });
  }, watch);
}

function slowloris() {
  open((c) => {
    c.write('GET /pods HTTP/1.1\r\nHost: x\r\n');
    const t = setInterval(() => c.writable && c.write('X-a: b\r\n'), 1000);
    c.once('close', () => clearInterval(t));
  }, slowloris);
}

function churn() {
  open((c) => c.destroy(), churn);
}

/** One /healthz on a connection of its own; true when it answered "ok". */
function health() {
  return new Promise((resolve) => {
    const req = http.get(`http://127.0.0.1:${o.port}/healthz`, { agent: false, timeout: 3000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve(res.statusCode === 200 && body === 'ok'));
      res.on('error', () => resolve(false));
    });
    req.on('timeout', () => req.destroy());
    req.on('error', () => resolve(false));
  });
}

async function probe() {
  while (Date.now() < deadline) {
    if (await health()) counts.healthOk++;
    else counts.healthFailed++;
    await new Promise((r) => setTimeout(r, 100));
  }
}

if (o.mode === 'probe') {
  await probe();
} else {
  for (let i = 0; i < (o.watches ?? 0); i++) watch();
  for (let i = 0; i < (o.slowloris ?? 0); i++) slowloris();
  for (let i = 0; i < (o.churn ?? 0); i++) churn();
  await new Promise((r) => setTimeout(r, o.ms));
}
stopping = true;
for (const c of live) c.destroy();
process.stdout.write(`${JSON.stringify(counts)}\n`);
process.exit(0);
