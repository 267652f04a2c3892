import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { ByteBudget, parseCriLog, readCriLog } from '../../src/container/exec-sync.js';
import { parseStartTime } from '../../src/sys/proc.js';
import { CpuRates, oomKilled } from '../../src/container/stats.js';
import { nowWireNs, wireNs } from '../../src/container/time.js';

describe('oomKilled (cgroup v1, v2 and hybrid)', () => {
  let root: string | undefined;
  afterEach(async () => {
    if (root) await fs.rm(root, { recursive: true, force: true });
  });
  async function tree(file: string, text: string) {
    root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-cg-'));
    await fs.mkdir(path.dirname(path.join(root, file)), { recursive: true });
    await fs.writeFile(path.join(root, file), text);
    return root;
  }
  it.each([
    ['v1 memory.oom_control', 'memory/skiff/skiff-c/memory.oom_control', 'oom_kill_disable 0\nunder_oom 0\noom_kill 1\n', true],
    ['v1, no kill', 'memory/skiff/skiff-c/memory.oom_control', 'oom_kill_disable 0\nunder_oom 0\noom_kill 0\n', false],
    ['v2 memory.events', 'skiff/skiff-c/memory.events', 'low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n', true],
    ['v2, limit reached but nothing killed', 'skiff/skiff-c/memory.events', 'low 0\nhigh 0\nmax 12\noom 0\noom_kill 0\n', false],
    ['hybrid: v2 under unified/', 'unified/skiff/skiff-c/memory.events', 'oom 2\noom_kill 2\n', true],
  ])('%s', async (_what, file, text, want) => {
    expect(await oomKilled('/skiff/skiff-c', await tree(file, text))).toBe(want);
  });
  it('is false when the cgroup is gone', async () => {
    root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-cg-'));
    expect(await oomKilled('/skiff/nope', root)).toBe(false);
  });
});

describe('CpuRates', () => {
  it('turns two cumulative samples into nanocores, and keeps the last rate for samples too close together', () => {
    let t = 1_000_000_000n;
    const rates = new CpuRates(() => t);
    expect(rates.sample('c', 5e9)).toBeUndefined();
    t += 2_000_000_000n; // 2 s later, 1 s of CPU more: half a core
    expect(rates.sample('c', 6e9)).toBe(5e8);
    t += 1_000_000n; // 1 ms later: too short to measure
    expect(rates.sample('c', 6.1e9)).toBe(5e8);
    t += 299_000_000n; // 300 ms after the last kept sample, and no CPU used meanwhile: still too short
    expect(rates.sample('c', 6e9)).toBe(5e8);
    t += 700_000_000n; // a whole second after it: 0.5 s of CPU more, half a core
    expect(rates.sample('c', 6.5e9)).toBe(5e8);
    t += 60_000_000n; // a first call's own short window is allowed when asked for
    expect(rates.sample('c', 6.56e9, 50_000_000n)).toBe(1e9);
    rates.retain(new Set());
    expect(rates.has('c')).toBe(false);
  });
  it('gives no rate when the counter went backwards (a new cgroup)', () => {
    let t = 0n;
    const rates = new CpuRates(() => t);
    rates.sample('c', 5e9);
    t += 1_000_000_000n;
    expect(rates.sample('c', 1e9)).toBeUndefined();
  });
});

describe('wire timestamps', () => {
  it('are exact integers to the microsecond, with the float noise of ms * 1e6 removed', () => {
    const ms = 1764474491123;
    expect(BigInt(ms * 1e6)).not.toBe(1764474491123000000n); // the noise: the nearest double is off by tens of ns
    expect(wireNs(ms * 1e6)).toBe('1764474491123000000');
    expect(wireNs(1764474491123456.7 * 1000)).toBe('1764474491123457000');
    expect(wireNs(0)).toBe('0');
    expect(nowWireNs(() => ms)).toBe('1764474491123000000');
  });
});

describe('parseStartTime', () => {
  const stat = (name: string, state: string) => `1234 (${name}) ${state} 1 1234 1234 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 0`;
  it('reads field 22, past a command name with spaces and parentheses', () => {
    expect(parseStartTime(stat('sleep', 'S'))).toBe(987654);
    expect(parseStartTime(stat('a) b (c', 'R'))).toBe(987654);
  });
  it('counts a zombie or a missing process as gone', () => {
    expect(parseStartTime(stat('sleep', 'Z'))).toBeUndefined();
    expect(parseStartTime('')).toBeUndefined();
  });
});

describe('parseCriLog', () => {
  it('splits the streams back apart and joins partial lines', () => {
    const log = Buffer.from(
      '2026-01-01T00:00:00.000000001Z stdout F one\n' +
        '2026-01-01T00:00:00.000000002Z stderr F err\n' +
        '2026-01-01T00:00:00.000000003Z stdout P par\n' +
        '2026-01-01T00:00:00.000000004Z stdout F tial\n' +
        '2026-01-01T00:00:00.000000005Z stdout P no newline',
    );
    const out = parseCriLog(log);
    expect(out.stdout.toString()).toBe('one\npartial\nno newline');
    expect(out.stderr.toString()).toBe('err\n');
  });
});

describe('readCriLog', () => {
  it('reads a log larger than its chunk, line by line, and keeps at most `max` bytes of both streams together', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-crilog-'));
    try {
      const file = path.join(dir, 'log');
      const lines: string[] = [];
      let stdout = '';
      let stderr = '';
      for (let i = 0; i < 20_000; i++) {
        const text = `line ${i} ${'x'.repeat(i % 97)}`;
        const stream = i % 3 === 0 ? 'stderr' : 'stdout';
        const tag = i % 5 === 0 ? 'P' : 'F';
        lines.push(`2026-01-01T00:00:00.000000001Z ${stream} ${tag} ${text}`);
        const piece = text + (tag === 'F' ? '\n' : '');
        if (stream === 'stdout') stdout += piece;
        else stderr += piece;
      }
      await fs.writeFile(file, lines.join('\n') + '\n');
      const all = await readCriLog(file, 1 << 30);
      expect(all.stdout.toString()).toBe(stdout);
      expect(all.stderr.toString()).toBe(stderr);
      const cut = await readCriLog(file, 1000);
      expect(cut.stdout.length + cut.stderr.length).toBe(1000);
      expect(stdout.startsWith(cut.stdout.toString())).toBe(true);
      expect(stderr.startsWith(cut.stderr.toString())).toBe(true);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});

describe('ByteBudget', () => {
  it('lets whoever fits go first, lets one oversized user through alone, and drops a waiter whose signal aborts', async () => {
    const b = new ByteBudget(100);
    const big = await b.acquire(90);
    const order: string[] = [];
    const large = b.acquire(50).then((r) => (order.push('large'), r));
    const small = await b.acquire(10);
    order.push('small');
    const ac = new AbortController();
    const aborted = b.acquire(60, ac.signal).catch(() => 'aborted');
    ac.abort();
    expect(await aborted).toBe('aborted');
    big();
    (await large)();
    small();
    expect(order).toEqual(['small', 'large']);
    expect(b.inUse).toBe(0);
    const huge = await b.acquire(500);
    expect(b.inUse).toBe(500);
    huge();
  });
});

describe('diskUsage of a writable layer', () => {
  it('counts what is there, enters no symlink, and walks a directory tree deeper than one path can name', async () => {
    const { LayerUsage } = await import('../../src/container/stats.js');
    const usage = new LayerUsage();
    const { execFileSync } = await import('node:child_process');
    const fsp = await import('node:fs/promises');
    const os = await import('node:os');
    const path = await import('node:path');
    const dir = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-du-'));
    try {
      await fsp.writeFile(path.join(dir, 'f'), 'x'.repeat(10_000));
      await fsp.symlink('/', path.join(dir, 'root'));
      await fsp.symlink('/usr', path.join(dir, 'usr'));
      // 200 levels of 30-character names: 6 KB of path, more than PATH_MAX; made with relative cds.
      execFileSync('python3', ['-c', `import os, sys\nos.chdir(sys.argv[1])\nfor i in range(200):\n    os.mkdir('${'n'.repeat(30)}')\n    os.chdir('${'n'.repeat(30)}')\nopen('last', 'w').write('x')`, dir]);
      const u = await usage.of(dir);
      expect(u.inodes).toBe(3 + 200 + 1);
      expect(u.bytes).toBeGreaterThanOrEqual(10_000);
      // Asked together, the same layer is walked once and both get the answer.
      const [a, b] = await Promise.all([usage.of(dir), usage.of(dir)]);
      expect(a).toEqual(u);
      expect(b).toEqual(u);
    } finally {
      execFileSync('rm', ['-rf', dir]);
    }
  });
});
