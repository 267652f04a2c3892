import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseDuration } from '../../src/cli/main.js';
import { closeFd, isCloexec, openpty, receiveFd, setCloexec } from '../../src/sys/libc.js';
import { Terminal } from '../../src/streaming/terminal.js';
import { lastResize, parseResizes } from '../../src/streaming/exec.js';

/** How late a 10 ms timer fires, at worst, while `during` runs. */
async function loopLag(during: Promise<unknown>): Promise<number> {
  let worst = 0;
  let running = true;
  const tick = async () => {
    while (running) {
      const t0 = Date.now();
      await new Promise((r) => setTimeout(r, 10));
      worst = Math.max(worst, Date.now() - t0 - 10);
    }
  };
  const ticking = tick();
  await during;
  running = false;
  await ticking;
  return worst;
}

describe('Terminal (a pty master on the event loop)', () => {
  it('never blocks the event loop or the thread pool when the program does not read its input', async () => {
    const { master, slave } = openpty();
    setCloexec(master);
    setCloexec(slave);
    expect(isCloexec(master) && isCloexec(slave)).toBe(true);
    const term = new Terminal(master);
    // Nobody reads the slave side: the terminal's input queue fills after a few KiB.
    const block = Buffer.alloc(64 * 1024, 0x61);
    let accepted = 0;
    for (let i = 0; i < 64 && term.input.write(block); i++) accepted += block.length;
    expect(accepted).toBeLessThan(4 * 1024 * 1024);
    // Meanwhile the loop keeps time and thread-pool work (fs) completes.
    const lag = await loopLag(Promise.all([new Promise((r) => setTimeout(r, 300)), fs.promises.stat('/'), fs.promises.readFile('/proc/self/status')]));
    expect(lag).toBeLessThan(100);
    term.close();
    closeFd(slave);
  });

  it('reads what the program writes, and ends when the program side closes', async () => {
    const { master, slave } = openpty();
    const term = new Terminal(master);
    const chunks: Buffer[] = [];
    term.output.on('data', (d: Buffer) => chunks.push(d));
    const ended = new Promise<void>((r) => {
      term.output.once('end', () => r());
      term.output.once('close', () => r());
    });
    fs.writeSync(slave, 'hello from the program\n');
    closeFd(slave);
    await ended;
    expect(Buffer.concat(chunks).toString()).toContain('hello from the program');
    term.close();
  });
});

describe('--stream-idle-timeout durations', () => {
  it('parses ms, s, m, h and bare seconds, and refuses the rest', () => {
    expect(parseDuration('500ms')).toBe(500);
    expect(parseDuration('90s')).toBe(90_000);
    expect(parseDuration('30m')).toBe(1_800_000);
    expect(parseDuration('4h')).toBe(14_400_000);
    expect(parseDuration('1h30m')).toBe(5_400_000);
    expect(parseDuration('1.5s')).toBe(1500);
    for (const bad of ['', 'h', '2', '4d', '-1s', '1 h', 'soon']) expect(parseDuration(bad)).toBeUndefined();
  });
});

describe('receiveFd (SCM_RIGHTS)', () => {
  it('hands over a descriptor that is close-on-exec from the start', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'skiff-fd-'));
    try {
      const sock = path.join(dir, 'console.sock');
      const r = receiveFd(sock, 5000);
      // A peer that sends a descriptor, as runc does on --console-socket.
      const sender = spawn('python3', ['-c', `import socket, os\ns = socket.socket(socket.AF_UNIX)\ns.connect(${JSON.stringify(sock)})\nsocket.send_fds(s, [b"x"], [os.open("/dev/null", os.O_RDONLY)])`], { stdio: 'ignore' });
      // Listened for at once: the sender may be gone before the descriptor's two threadpool hops end.
      const senderClosed = new Promise((res) => sender.once('close', res));
      const fd = await r.fd;
      await senderClosed;
      expect(fs.readlinkSync(`/proc/self/fd/${fd}`)).toBe('/dev/null');
      expect(isCloexec(fd)).toBe(true);
      closeFd(fd);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('terminal size messages', () => {
  it('keeps only 16-bit integer sizes, and finds the last one in a chunk without parsing the rest', () => {
    expect(parseResizes('{"Width":80,"Height":24}{"Width":-1,"Height":5}{"Width":1.5,"Height":2}{"Width":70000,"Height":1}{"Width":"9","Height":1}')).toEqual([{ width: 80, height: 24 }]);
    expect(lastResize(Buffer.from('{"Width":80,"Height":24}'.repeat(1000) + '{"Width":120,"Height":50}'))).toEqual({ width: 120, height: 50 });
    // A malformed or out-of-range last message falls back to the one before it.
    expect(lastResize(Buffer.from('{"Width":90,"Height":30}{"Width":-4,"Height":3}{nope}'))).toEqual({ width: 90, height: 30 });
    expect(lastResize(Buffer.from('}{'))).toBeUndefined();
    expect(lastResize(Buffer.alloc(0))).toBeUndefined();
  });
});
