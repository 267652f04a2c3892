import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { spawnChild, type Child } from '../../src/sys/spawn.js';

const ended = (c: Child) => new Promise<[number | null, NodeJS.Signals | null]>((resolve) => c.on('close', (code, sig) => resolve([code, sig])));
const read = (s: NodeJS.ReadableStream | null) =>
  new Promise<string>((resolve) => {
    let out = '';
    s!.on('data', (d: Buffer) => (out += d.toString()));
    s!.on('end', () => resolve(out));
  });
const openFds = () => fs.readdirSync('/proc/self/fd').length;

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'skiff-spawn-'));
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

describe('spawnChild (posix_spawn)', () => {
  it('pipes stdin, stdout, stderr and a fourth descriptor, and reports the exit code', async () => {
    const c = spawnChild('sh', ['-c', 'read line; echo "got $line"; echo oops >&2; echo sync >&3; exit 7'], { stdio: ['pipe', 'pipe', 'pipe', 'pipe'] });
    const [out, err, sync] = [read(c.stdout), read(c.stderr), read(c.stdio[3]!)];
    c.stdin!.end('hello\n');
    expect(await ended(c)).toEqual([7, null]);
    expect([await out, await err, await sync]).toEqual(['got hello\n', 'oops\n', 'sync\n']);
    expect(c.exitCode).toBe(7);
  });

  it('reports a signal death by name, and kill is refused once the child is gone', async () => {
    const c = spawnChild('sleep', ['30'], { stdio: ['ignore', 'ignore', 'ignore'] });
    expect(c.pid).toBeGreaterThan(0);
    expect(c.kill('SIGKILL')).toBe(true);
    expect(await ended(c)).toEqual([null, 'SIGKILL']);
    expect(c.kill('SIGKILL')).toBe(false);
    // Reaped: no zombie left behind.
    expect(fs.existsSync(`/proc/${c.pid}`)).toBe(false);
  });

  it('reports a missing program, or a missing working directory, as an error event with no descriptors left open', async () => {
    const before = openFds();
    for (const [file, cwd] of [['no-such-program-skiff', undefined], ['/bin/true', path.join(tmp, 'missing')]] as const) {
      const c = spawnChild(file, [], { cwd, stdio: ['pipe', 'pipe', 'pipe'] });
      expect(c.spawnError?.code).toBe('ENOENT');
      expect(c.stdout).toBeNull();
      const err = await new Promise<NodeJS.ErrnoException>((resolve) => c.on('error', resolve));
      expect(err.message).toContain('ENOENT');
    }
    expect(openFds()).toBe(before);
  });

  it('runs a shell script without a #! line with /bin/sh, as child_process (execvp) does, with its arguments', async () => {
    // A CNI plugin or a wrapper written as a bare script ran under child_process; posix_spawn alone answers ENOEXEC.
    const script = path.join(tmp, 'bare-script');
    fs.writeFileSync(script, 'echo "bare $1 $2"\n', { mode: 0o755 });
    const c = spawnChild(script, ['one', 'two'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const out = read(c.stdout);
    expect(c.spawnError).toBeUndefined();
    expect(await ended(c)).toEqual([0, null]);
    expect(await out).toBe('bare one two\n');
  });

  it('finds a program in the PATH it is given, and runs it in cwd with exactly the env given', async () => {
    const bin = path.join(tmp, 'bin');
    fs.mkdirSync(bin, { recursive: true });
    fs.writeFileSync(path.join(bin, 'skiff-probe'), '#!/bin/sh\npwd; echo "$ONLY"; env | wc -l\n', { mode: 0o755 });
    const c = spawnChild('skiff-probe', [], { env: { PATH: `${bin}:/usr/bin:/bin`, ONLY: 'this' }, cwd: tmp, stdio: ['ignore', 'pipe', 'ignore'] });
    const out = read(c.stdout);
    expect(await ended(c)).toEqual([0, null]);
    // sh adds PWD (and may add SHLVL and _); nothing of ours beyond what was given.
    const [cwd, only, count] = (await out).trim().split('\n');
    expect([cwd, only]).toEqual([tmp, 'this']);
    expect(Number(count)).toBeLessThanOrEqual(5);
  });

  it('gives the child no descriptor of ours beyond its stdio, default signal handling, and no blocked signals', async () => {
    // Something of ours that is open and not close-on-exec would show up in the child.
    const c = spawnChild('sh', ['-c', 'ls /proc/$$/fd'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const out = read(c.stdout);
    await ended(c);
    const fdLines = (await out).trim().split('\n');
    const fds = fdLines.filter((l) => /^\d+$/.test(l)).map(Number);
    const saidFds = JSON.stringify({ lines: fdLines, code: c.exitCode, signal: c.signalCode });
    expect(fds.every((fd) => fd <= 2 || fd >= 10), saidFds).toBe(true); // sh may keep its own high fd for the script
    expect(fds.filter((fd) => fd > 2 && fd < 10), saidFds).toEqual([]);
    // The signal state is read by the spawned program itself: a shell blocks every signal around
    // its own vfork, and a child of it reading the shell's status in that window sees them blocked.
    const g = spawnChild('grep', ['-E', '^Sig(Ign|Blk)', '/proc/self/status'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const sigOut = read(g.stdout);
    await ended(g);
    const lines = (await sigOut).trim().split('\n');
    const said = JSON.stringify({ lines, code: g.exitCode, signal: g.signalCode });
    // Node ignores SIGPIPE, and glibc's posix_spawn ignores its own signals 32 and 33 unless told: a child must not inherit either.
    expect(lines.find((l) => l.startsWith('SigIgn')), said).toMatch(/^SigIgn:\s+0+$/);
    expect(lines.find((l) => l.startsWith('SigBlk')), said).toMatch(/^SigBlk:\s+0+$/);
  });

  it('refuses a NUL in the program, an argument, the env or cwd, as child_process does, rather than cut the string short', async () => {
    const before = openFds();
    // Through koffi a NUL ends the C string: `echo a\0b` printed "a", and X=a\0b reached the child as X=a.
    for (const [file, args, opts] of [
      ['echo', ['a\0b'], {}],
      ['sh', ['-c', 'echo "$X"'], { env: { PATH: process.env.PATH, X: 'a\0b' } }],
      ['sh', ['-c', 'pwd'], { cwd: `${tmp}\0/etc` }],
      ['/bin/echo\0/x', ['hi'], {}],
    ] as const) {
      const c = spawnChild(file, [...args], { ...opts, stdio: ['ignore', 'pipe', 'ignore'] });
      expect(c.spawnError?.code, `${file} ${JSON.stringify(args)}`).toBe('ERR_INVALID_ARG_VALUE');
      expect(c.pid).toBeUndefined();
      expect(c.stdout).toBeNull();
      const err = await new Promise<NodeJS.ErrnoException>((resolve) => c.on('error', resolve));
      expect(err.message).toContain('null bytes');
    }
    expect(openFds()).toBe(before);
  });

  it("closes in the child what the daemon inherited without close-on-exec (a launcher's descriptor), as conmon would hold it for its container's life", () => {
    // A shell's redirection is not close-on-exec: the node bash execs has fd 200 open on the marker file
    // (node itself marks the low ones close-on-exec as it starts, not one that high).
    const marker = path.join(tmp, 'inherited-marker');
    fs.writeFileSync(marker, '');
    const mod = path.resolve('dist/sys/spawn.js');
    const script = `import('${mod}').then(({ spawnChild }) => { const c = spawnChild('sh', ['-c', 'for f in /proc/$$/fd/*; do readlink $f; done'], { stdio: ['ignore', 'pipe', 'ignore'] }); let o = ''; c.stdout.on('data', (d) => (o += d)); c.on('close', () => console.log(o)); })`;
    const r = spawnSync('bash', ['-c', 'exec "$0" -e "$1" 200<"$2"', process.execPath, script, marker], { encoding: 'utf8' });
    expect(r.stdout, r.stderr).toContain('pipe:');
    expect(r.stdout).not.toContain(marker);
  });

  it("emits 'close' for a child whose output nobody reads, as child_process does", async () => {
    // A caller that wants only the exit code: the unread output held the stream, and 'close', forever.
    const c = spawnChild('sh', ['-c', 'echo unread; echo unread >&2'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const closed = ended(c);
    const late = new Promise((resolve) => setTimeout(() => resolve('no close'), 3000));
    expect(await Promise.race([closed, late])).toEqual([0, null]);
  });

  it('starts a detached child as the leader of its own session', async () => {
    const c = spawnChild('sleep', ['30'], { stdio: ['ignore', 'ignore', 'ignore'], detached: true });
    const stat = fs.readFileSync(`/proc/${c.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    expect(Number(fields[3])).toBe(c.pid); // session id (field 6)
    c.kill('SIGKILL');
    await ended(c);
  });

  it('leaves children started by child_process to libuv, with their exit codes', async () => {
    const ours = spawnChild('sh', ['-c', 'exit 3'], { stdio: ['ignore', 'ignore', 'ignore'] });
    const theirs = spawn('sh', ['-c', 'sleep 0.1; exit 4']);
    const theirCode = new Promise((resolve) => theirs.on('exit', resolve));
    expect(await ended(ours)).toEqual([3, null]);
    expect(await theirCode).toBe(4);
  });

  it('many children at once: each reaped with its own code, and no descriptor leaks', async () => {
    const before = openFds();
    const codes = await Promise.all(Array.from({ length: 40 }, (_, i) => ended(spawnChild('sh', ['-c', `exit ${i}`]))));
    expect(codes.map(([c]) => c)).toEqual(Array.from({ length: 40 }, (_, i) => i));
    expect(openFds()).toBe(before);
  });

  it('keeps a Node process alive while a referenced child runs, and not while an unreferenced one does', () => {
    const mod = path.resolve('dist/sys/spawn.js');
    const script = (unref: boolean) =>
      `import('${mod}').then(({ spawnChild }) => { const c = spawnChild('sleep', ['0.3'], { stdio: ['ignore', 'ignore', 'ignore'] }); ${unref ? 'c.unref();' : ''} c.on('exit', (code) => console.log('exit', code)); })`;
    const kept = spawnSync(process.execPath, ['-e', script(false)], { encoding: 'utf8' });
    expect(kept.stdout.trim()).toBe('exit 0');
    const let_go = spawnSync(process.execPath, ['-e', script(true)], { encoding: 'utf8' });
    expect(let_go.stdout.trim()).toBe('');
  });
});
