/**
 * The manifest watcher against a real temporary directory and real inotify:
 * what the agent sees (store changes) after what a user does with files.
 */
import { execFileSync } from 'node:child_process';
import type { EventEmitter } from 'node:events';
import { closeSync, openSync, readdirSync, readFileSync } from 'node:fs';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { isErrno } from '../../src/errors.js';
import { IsolatedParser, type ManifestParser, type ParseOutcome } from '../../src/kubelet-lite/manifests.js';
import type { ObjectChange } from '../../src/kubelet-lite/model.js';
import { ObjectStore } from '../../src/kubelet-lite/store.js';
import { DEFAULT_DEBOUNCE_MS, inotifyWatch, ManifestWatcher, type DirWatch, type WatchFn } from '../../src/kubelet-lite/watch.js';

const DEBOUNCE_MS = 50;

const pod = (name: string, image = 'busybox:1.36') =>
  `apiVersion: v1\nkind: Pod\nmetadata:\n  name: ${name}\nspec:\n  containers:\n  - name: main\n    image: ${image}\n`;

/** The real parser thread, running the TypeScript source through tsx. */
const TS_WORKER = new URL('../helpers/manifest-worker.mjs', import.meta.url);

/** A real parser the test can swap (a healthy one, a starved one), counting and timing the parses. */
class SwitchParser implements ManifestParser {
  starts: number[] = [];
  running = 0;
  constructor(public current: ManifestParser) {}
  async parse(file: string, data: Uint8Array): Promise<ParseOutcome> {
    this.starts.push(performance.now());
    this.running++;
    try {
      return await this.current.parse(file, data);
    } finally {
      this.running--;
    }
  }
}

/** This process's soft and hard limits on open files. */
function nofileLimits(): { soft: string; hard: string } {
  const m = /^Max open files\s+(\S+)\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
  if (!m) throw new Error('no open files limit in /proc/self/limits');
  return { soft: m[1]!, hard: m[2]! };
}
function setNofile(soft: number | string, hard: number | string): void {
  execFileSync('prlimit', [`--pid=${process.pid}`, `--nofile=${soft}:${hard}`]);
}
/**
 * Puts the limits back. Spawning prlimit takes a dozen descriptors of its own
 * (stdio pipes, the exec error pipe, a loop), and a threadpool open may hold
 * one for a moment, so try a few times: a limit left low fails every later test.
 */
async function restoreNofile(soft: string, hard: string): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      setNofile(soft, hard);
      return;
    } catch (err) {
      if (attempt === 20) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

interface Seen {
  at: number;
  changes: string[];
}

describe('ManifestWatcher (real directory, real inotify)', () => {
  let root: string;
  let dir: string;
  let store: ObjectStore;
  let watcher: ManifestWatcher | undefined;
  let seen: Seen[];

  beforeEach(async () => {
    root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-watch-'));
    dir = path.join(root, 'manifests');
    store = new ObjectStore({ nodeName: 'node' });
    seen = [];
    store.subscribe((c: ObjectChange[]) => seen.push({ at: performance.now(), changes: c.map((x) => `${x.type} ${x.object.kind}/${x.object.name}`) }));
  });
  afterEach(async () => {
    await watcher?.close();
    watcher = undefined;
    await fs.rm(root, { recursive: true, force: true });
  });

  async function start(): Promise<ManifestWatcher> {
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS });
    await watcher.start();
    return watcher;
  }

  /** Polls until `cond` holds; fails with what was seen if it never does. */
  async function until(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!cond()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}; seen: ${JSON.stringify(seen.map((s) => s.changes))}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  }
  const flat = () => seen.flatMap((s) => s.changes);
  /** Long enough for any straggling event to have been debounced and applied. */
  const quiet = () => new Promise((r) => setTimeout(r, DEBOUNCE_MS * 6));

  it('creates a missing directory at start, then loads a new file, an edit, and a delete', async () => {
    await start();
    expect((await fs.stat(dir)).isDirectory()).toBe(true);
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    await until(() => flat().includes('added Pod/web'), 'added');
    const uid1 = store.get('Pod', 'default', 'web')!.uid;

    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web', 'busybox:1.37'));
    await until(() => flat().includes('modified Pod/web'), 'modified');
    expect(store.get('Pod', 'default', 'web')!.uid).not.toBe(uid1);

    await fs.rm(path.join(dir, 'web.yaml'));
    await until(() => flat().includes('deleted Pod/web'), 'deleted');
    await quiet();
    expect(flat()).toEqual(['added Pod/web', 'modified Pod/web', 'deleted Pod/web']);
  });

  it('loads what is already there at start, dotfiles and subdirectories aside', async () => {
    await fs.mkdir(path.join(dir, 'sub'), { recursive: true });
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await fs.writeFile(path.join(dir, '.b.yaml'), pod('b'));
    await fs.writeFile(path.join(dir, 'sub', 'c.yaml'), pod('c'));
    await start();
    expect(store.list('Pod').map((o) => o.name)).toEqual(['a']);
  });

  it('sees an editor save (write a temp file, rename it over) as one modification', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    await start();
    seen.length = 0;
    const tmp = path.join(dir, '.web.yaml.swp');
    await fs.writeFile(tmp, pod('web', 'busybox:1.37'));
    await fs.rename(tmp, path.join(dir, 'web.yaml'));
    await until(() => flat().length > 0, 'the save');
    await quiet();
    expect(flat()).toEqual(['modified Pod/web']);
  });

  it('removes a file renamed away and loads one renamed in', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    await fs.writeFile(path.join(root, 'db.yaml'), pod('db'));
    await start();
    seen.length = 0;
    await fs.rename(path.join(dir, 'web.yaml'), path.join(dir, 'web.yaml.disabled'));
    await fs.rename(path.join(root, 'db.yaml'), path.join(dir, 'db.yaml'));
    await until(() => flat().includes('deleted Pod/web') && flat().includes('added Pod/db'), 'rename away and in');
    expect(store.list('Pod').map((o) => o.name)).toEqual(['db']);
  });

  it('coalesces a file written in pieces into one change with the whole content', async () => {
    await start();
    // Every prefix is a valid ConfigMap with different data: without coalescing, each piece would be a change.
    const f = path.join(dir, 'cm.yaml');
    const handle = await fs.open(f, 'w');
    try {
      await handle.write('apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata:\n');
      for (let i = 0; i < 10; i++) {
        await handle.write(`  k${i}: v${i}\n`);
        await new Promise((r) => setTimeout(r, 5));
      }
    } finally {
      await handle.close();
    }
    await until(() => flat().length > 0, 'the file');
    await quiet();
    expect(flat()).toEqual(['added ConfigMap/cm']);
    expect(Object.keys(store.configMap('default', 'cm')!.data!)).toHaveLength(10);
  });

  it('loads all of 200 files dropped in at once, each once', async () => {
    await start();
    const t0 = performance.now();
    await Promise.all(Array.from({ length: 200 }, (_, i) => fs.writeFile(path.join(dir, `p${i}.yaml`), pod(`p${i}`))));
    await until(() => store.list('Pod').length === 200, 'all 200 pods');
    const took = performance.now() - t0;
    await quiet();
    expect(flat().filter((c) => c.startsWith('added'))).toHaveLength(200);
    expect(flat()).toHaveLength(200);
    console.log(`200 manifests written at once were all in the store after ${took.toFixed(0)} ms`);
  });

  it('follows the directory being removed and created again, and being replaced by another', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await start();
    await fs.rm(dir, { recursive: true });
    await until(() => flat().includes('deleted Pod/a'), 'a deleted with the directory');
    // The agent owns the directory: it comes back, and a file written there is seen.
    await until(() => store.fileNames().length === 0, 'store empty');
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'b.yaml'), pod('b'));
    await until(() => flat().includes('added Pod/b'), 'b in the new directory');

    // Replaced wholesale: the old one moved aside, a prepared one moved in.
    const next = path.join(root, 'next');
    await fs.mkdir(next);
    await fs.writeFile(path.join(next, 'c.yaml'), pod('c'));
    await fs.rename(dir, path.join(root, 'old'));
    await fs.rename(next, dir);
    await until(() => flat().includes('deleted Pod/b') && flat().includes('added Pod/c'), 'the replaced directory');
    // And the watch is on the new directory now.
    await fs.writeFile(path.join(dir, 'd.yaml'), pod('d'));
    await until(() => flat().includes('added Pod/d'), 'd in the replacing directory');
  });

  it('sees manifests symlinked through a swapped ..data directory (a mounted ConfigMap) change', async () => {
    await fs.mkdir(path.join(dir, '..v1'), { recursive: true });
    await fs.writeFile(path.join(dir, '..v1', 'web.yaml'), pod('web'));
    await fs.symlink('..v1', path.join(dir, '..data'));
    await fs.symlink('..data/web.yaml', path.join(dir, 'web.yaml'));
    await start();
    expect(store.list('Pod').map((o) => o.name)).toEqual(['web']);
    // The AtomicWriter's swap: a new versioned dir, a temp symlink renamed over ..data.
    await fs.mkdir(path.join(dir, '..v2'));
    await fs.writeFile(path.join(dir, '..v2', 'web.yaml'), pod('web', 'busybox:1.37'));
    await fs.symlink('..v2', path.join(dir, '..data_tmp'));
    await fs.rename(path.join(dir, '..data_tmp'), path.join(dir, '..data'));
    await until(() => flat().includes('modified Pod/web'), 'the swapped content');
  });

  it('reports a FIFO dropped in the directory as a problem and keeps working', async () => {
    await start();
    execFileSync('mkfifo', [path.join(dir, 'pipe.yaml')]);
    await until(() => store.problems().some((p) => p.file.endsWith('pipe.yaml')), 'the FIFO problem');
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    await until(() => flat().includes('added Pod/web'), 'a pod after the FIFO');
    await watcher!.rescan();
    expect(store.problems()).toMatchObject([{ reason: 'not a regular file' }]);
  });

  it('rescan() brings the store up to date on its own (the safety net)', async () => {
    await fs.mkdir(dir, { recursive: true });
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS });
    // Not started: no watch, so only a rescan can see these.
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await fs.writeFile(path.join(dir, 'b.yaml'), `${pod('b')}---\nnot: [valid\n`);
    await watcher.rescan();
    expect(store.list('Pod').map((o) => o.name).sort()).toEqual(['a', 'b']);
    expect(store.problems()).toHaveLength(1);
    await fs.rm(path.join(dir, 'a.yaml'));
    await watcher.rescan();
    expect(store.list('Pod').map((o) => o.name)).toEqual(['b']);
  });

  it('rescans and watches again after a watch error (events lost meanwhile are found)', async () => {
    let muted = false;
    const watches: DirWatch[] = [];
    const wrapped: WatchFn = (d, onEvent) => {
      const w = inotifyWatch(d, (ev, name) => muted || onEvent(ev, name));
      watches.push(w);
      return w;
    };
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, watch: wrapped });
    await watcher.start();
    // Lose the events (as an inotify queue overflow does), then fail the watch.
    muted = true;
    await fs.writeFile(path.join(dir, 'lost.yaml'), pod('lost'));
    await quiet();
    expect(flat()).toEqual([]);
    muted = false;
    (watches[0] as unknown as EventEmitter).emit('error', new Error('inotify gave up'));
    await until(() => flat().includes('added Pod/lost'), 'the rescan after the error');
    expect(watches).toHaveLength(2);
    await fs.writeFile(path.join(dir, 'next.yaml'), pod('next'));
    await until(() => flat().includes('added Pod/next'), 'events through the new watch');
  });

  it('still loads the directory when it cannot be watched, and watches on a later rescan', async () => {
    let calls = 0;
    const flaky: WatchFn = (d, onEvent) => {
      if (++calls === 1) throw Object.assign(new Error('ENOSPC: System limit for number of file watchers reached'), { code: 'ENOSPC' });
      return inotifyWatch(d, onEvent);
    };
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, watch: flaky });
    await watcher.start();
    expect(store.list('Pod').map((o) => o.name)).toEqual(['a']);
    await watcher.rescan();
    expect(calls).toBe(2);
    await fs.writeFile(path.join(dir, 'b.yaml'), pod('b'));
    await until(() => flat().includes('added Pod/b'), 'b through the watch set up by the rescan');
  });

  it('rejects start() when the directory cannot be made (a file is in the way), and works once it can', async () => {
    await fs.writeFile(dir, 'not a directory');
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS });
    await expect(watcher.start()).rejects.toThrow(/EEXIST|ENOTDIR/);
    await fs.rm(dir);
    await fs.mkdir(dir);
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await watcher.rescan();
    expect(store.list('Pod').map((o) => o.name)).toEqual(['a']);
  });

  it('keeps what a file defined while it cannot be opened (out of file descriptors), and reads it again on its own', async () => {
    await fs.mkdir(dir, { recursive: true });
    const file = path.join(dir, 'web.yaml');
    await fs.writeFile(file, pod('web'));
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, retryMs: 100 });
    await watcher.start();
    const uid = store.get('Pod', 'default', 'web')!.uid;

    const limits = nofileLimits();
    const held: number[] = [];
    try {
      // Leave no descriptor free: every open in this process fails with EMFILE.
      // The soft limit only bounds how many the loop opens; 64 above the
      // highest in use leaves room to spawn prlimit again once they are closed.
      setNofile(Math.max(...readdirSync('/proc/self/fd').map(Number)) + 64, limits.hard);
      for (;;) {
        try {
          held.push(openSync('/dev/null', 'r'));
        } catch (err) {
          if (isErrno(err, 'EMFILE')) break;
          throw err;
        }
      }
      // Touching needs no descriptor; inotify tells the watcher, whose open fails.
      const now = new Date();
      await fs.utimes(file, now, now);
      await until(() => store.problems().some((p) => /EMFILE/.test(p.reason)), 'the EMFILE problem');
      // Retries (100 ms, 200 ms …) fail too; nothing is deleted meanwhile.
      await new Promise((r) => setTimeout(r, 400));
      expect(store.get('Pod', 'default', 'web')?.uid).toBe(uid);
      expect(store.problems()).toMatchObject([{ file, reason: expect.stringMatching(/^cannot open: EMFILE.*keeping the object it defined when last read$/) }]);
    } finally {
      for (const fd of held) closeSync(fd);
      await restoreNofile(limits.soft, limits.hard);
    }
    // No event, no rescan: the file's own retry reads it again.
    await until(() => store.problems().length === 0, 'the retry that reads the file again');
    expect(flat()).toEqual(['added Pod/web']);
    expect(store.get('Pod', 'default', 'web')!.uid).toBe(uid);
  });

  it('keeps what a file defined while its parser times out, and the retry loads it once the parser answers', async () => {
    await fs.mkdir(dir, { recursive: true });
    const file = path.join(dir, 'web.yaml');
    await fs.writeFile(file, pod('web'));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    // A real parser thread that cannot answer in time (it cannot even start in 1 ms).
    const starved = new IsolatedParser({ worker: TS_WORKER, timeoutMs: 1 });
    const parser = new SwitchParser(healthy);
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 100 });
    await watcher.start();
    const uid = store.get('Pod', 'default', 'web')!.uid;

    parser.current = starved;
    const now = new Date();
    await fs.utimes(file, now, now);
    await until(() => store.problems().some((p) => /took more than/.test(p.reason)), 'the timeout problem');
    await until(() => parser.starts.length >= 3, 'two retries');
    expect(store.get('Pod', 'default', 'web')?.uid).toBe(uid);
    expect(flat()).toEqual(['added Pod/web']);

    parser.current = healthy;
    await until(() => store.problems().length === 0, 'the retry with a parser that answers', 10_000);
    expect(flat()).toEqual(['added Pod/web']);
    expect(store.get('Pod', 'default', 'web')!.uid).toBe(uid);
  });

  it('keeps the last objects of content that always exhausts the parser heap, retries it with back-off only, and reads a new write at once', async () => {
    await fs.mkdir(dir, { recursive: true });
    const file = path.join(dir, 'big.yaml');
    await fs.writeFile(file, pod('big'));
    const parser = new SwitchParser(new IsolatedParser({ worker: TS_WORKER, heapMb: 32 }));
    // The back-off alone: no rest after each failed parse (see the test of many such files).
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 100, parserRetryRest: 0 });
    await watcher.start();
    const uid = store.get('Pod', 'default', 'big')!.uid;
    const loads = parser.starts.length;

    // About 200,000 nodes: some 100 MiB of parser heap, more than the 32 MiB allowed.
    const padding = `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: pad}\ndata:\n  x: [${'0,'.repeat(200_000)}0]\n`;
    await fs.writeFile(file, `${pod('big', 'busybox:1.37')}---\n${padding}`);
    await until(() => store.problems().some((p) => /needs more than 32 MiB/.test(p.reason)), 'the out-of-heap problem', 10_000);
    await until(() => parser.starts.length - loads >= 4 && parser.running === 0, 'three retries', 10_000);
    // The same content fails each time: the waits between tries double (100, 200, 400 ms …).
    const tries = parser.starts.slice(loads);
    for (let i = 1; i < tries.length; i++) expect(tries[i]! - tries[i - 1]!).toBeGreaterThanOrEqual(100 * 2 ** (i - 1) - 5);
    // Rescans leave the file to its retry rather than parsing it again.
    const before = parser.starts.length;
    await watcher.rescan();
    await watcher.rescan();
    expect(parser.starts.length).toBe(before);
    expect(store.get('Pod', 'default', 'big')?.uid).toBe(uid);
    expect(flat()).toEqual(['added Pod/big']);

    // A new write is read at once and ends the retries.
    await fs.writeFile(file, pod('big', 'busybox:1.37'));
    await until(() => flat().includes('modified Pod/big'), 'the new content');
    expect(store.problems()).toEqual([]);
    const after = parser.starts.length;
    await new Promise((r) => setTimeout(r, 1000));
    expect(parser.starts.length).toBe(after);
  });

  it('gives a file it could not read at the first load quick retries before start() resolves', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    const starved = new IsolatedParser({ worker: TS_WORKER, timeoutMs: 1 });
    const parser = new SwitchParser(starved);
    // The first parse times out (a CPU-starved boot); the next ones answer.
    const firstStarved: ManifestParser = { parse: (f, d) => (parser.starts.length > 1 ? healthy : starved).parse(f, d) };
    parser.current = firstStarved;
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 100 });
    await watcher.start();
    expect(parser.starts.length).toBe(2);
    expect(store.list('Pod').map((o) => o.name)).toEqual(['web']);
    expect(store.problems()).toEqual([]);
  });

  it('bounds how long start() waits for a file that keeps failing, and shows the problem', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    await fs.writeFile(path.join(dir, 'db.yaml'), pod('db'));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    const starved = new IsolatedParser({ worker: TS_WORKER, timeoutMs: 1 });
    const parser = new SwitchParser({ parse: (f, d) => (f.endsWith('web.yaml') ? starved : healthy).parse(f, d) });
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 100 });
    const t0 = performance.now();
    await watcher.start();
    const took = performance.now() - t0;
    // db.yaml once; web.yaml at the first load and three retries (100, 200, 400 ms), within the bound of ten delays.
    expect(parser.starts.length).toBe(5);
    expect(took).toBeGreaterThanOrEqual(700);
    expect(took).toBeLessThan(100 * 10 + 1500);
    expect(store.list('Pod').map((o) => o.name)).toEqual(['db']);
    expect(store.problems()).toMatchObject([{ file: path.join(dir, 'web.yaml'), reason: expect.stringMatching(/^cannot parse: took more than/) }]);
  });

  it('stops when closed: nothing is applied after close()', async () => {
    await start();
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await watcher!.close();
    await new Promise((r) => setTimeout(r, DEBOUNCE_MS * 4));
    expect(flat()).toEqual([]);
  });

  it('does not parse an unchanged file again on a rescan, but does one that changed or was swapped', async () => {
    await fs.mkdir(path.join(dir, '..v1'), { recursive: true });
    await fs.mkdir(path.join(dir, '..v2'), { recursive: true });
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    await fs.writeFile(path.join(dir, '..v1', 'b.yaml'), pod('b', 'busybox:1.36'));
    await fs.writeFile(path.join(dir, '..v2', 'b.yaml'), pod('b', 'busybox:1.37'));
    await fs.symlink('..v1', path.join(dir, '..data'));
    await fs.symlink('..data/b.yaml', path.join(dir, 'b.yaml'));
    // Older than the settle time, so the first read's stamps can be trusted.
    await new Promise((r) => setTimeout(r, 1100));
    const parser = new SwitchParser(new IsolatedParser({ worker: TS_WORKER }));
    // Not started: no watch, only rescans (the safety net that runs every minute).
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser });
    await watcher.rescan();
    expect(parser.starts.length).toBe(2);
    await watcher.rescan();
    await watcher.rescan();
    expect(parser.starts.length).toBe(2);

    // An edit in place of the same size (a touch is enough: ctime moves) and a ..data swap are read again.
    const now = new Date();
    await fs.utimes(path.join(dir, 'a.yaml'), now, now);
    await fs.rename(path.join(dir, '..data'), path.join(dir, '..old'));
    await fs.symlink('..v2', path.join(dir, '..data'));
    await watcher.rescan();
    expect(parser.starts.length).toBe(4);
    expect(store.get('Pod', 'default', 'b')!.object).toMatchObject({ spec: { containers: [{ image: 'busybox:1.37' }] } });
    // a.yaml changed less than the settle time before it was read: not trusted to be the same yet
    // (b.yaml's new target was written long before, so it is).
    await watcher.rescan();
    expect(parser.starts.length).toBe(5);
  });

  it('joins rescans asked for while one is queued rather than queueing each', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'a.yaml'), pod('a'));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    const parser = new SwitchParser({ parse: async (f, d) => (await gate, healthy.parse(f, d)) });
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser });
    const first = watcher.rescan();
    await until(() => parser.running === 1, 'the first rescan to be parsing');
    // a.yaml was just written: every rescan that runs parses it again.
    const more = Array.from({ length: 5 }, () => watcher!.rescan());
    release();
    await Promise.all([first, ...more]);
    expect(parser.starts.length).toBe(2);
  });

  it('keeps many files the parser always gives up on from holding up an edit of another file or keeping a core busy', async () => {
    await fs.mkdir(dir, { recursive: true });
    for (let i = 0; i < 4; i++) await fs.writeFile(path.join(dir, `bad${i}.yaml`), pod(`bad${i}`));
    await fs.writeFile(path.join(dir, 'ok.yaml'), pod('ok'));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    // Each try of a bad file costs 200 ms (as a 4 MiB file that runs out of heap costs seconds).
    const badStarts: number[] = [];
    const parser = new SwitchParser({
      parse: async (f, d) => {
        if (!path.basename(f).startsWith('bad')) return healthy.parse(f, d);
        badStarts.push(performance.now());
        await new Promise((r) => setTimeout(r, 200));
        return { failed: { file: f, line: 1, reason: 'cannot parse: took more than 0.2 s' } };
      },
    });
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 10 });
    await watcher.start();
    // Retries queued while start() waited (they do not rest then) rest once it has resolved.
    const t0 = performance.now();
    await new Promise((r) => setTimeout(r, 300));
    await fs.writeFile(path.join(dir, 'ok.yaml'), pod('ok', 'busybox:1.37'));
    const written = performance.now();
    await until(() => flat().includes('modified Pod/ok'), 'the edit of ok.yaml');
    // At most the one parse under way, not every bad file's retry, was ahead of the edit.
    expect(performance.now() - written).toBeLessThan(DEBOUNCE_MS + 200 + 250);
    await new Promise((r) => setTimeout(r, 3000 - (performance.now() - t0)));
    // Back to back that would be 15 tries in 3 s; resting 9 times each try's 200 ms, at most 2 (+1 under way).
    expect(badStarts.filter((t) => t > t0).length).toBeLessThanOrEqual(3);
    expect(store.problems()).toHaveLength(4);
  });

  it('gives a file the parser gave up on at the first load its quick retries, without the rest retries take later', async () => {
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'web.yaml'), pod('web'));
    const healthy = new IsolatedParser({ worker: TS_WORKER });
    // The first parse runs into its timeout (here 500 ms; a starved boot), the next one answers.
    let tries = 0;
    const parser = new SwitchParser({
      parse: async (f, d) => {
        if (tries++ > 0) return healthy.parse(f, d);
        await new Promise((r) => setTimeout(r, 500));
        return { failed: { file: f, line: 1, reason: 'cannot parse: took more than 0.5 s' } };
      },
    });
    watcher = new ManifestWatcher({ dir, store, debounceMs: DEBOUNCE_MS, parser, retryMs: 100 });
    await watcher.start();
    // Resting 9 times the 500 ms first, the retry would come only after start() gave up on it.
    expect(store.list('Pod').map((o) => o.name)).toEqual(['web']);
    expect(tries).toBe(2);
  });

  it('keeps what a file defined while it is empty (truncated by `gen > file` before the first write)', async () => {
    await start();
    const file = path.join(dir, 'job.yaml');
    await fs.writeFile(file, pod('job'));
    await until(() => flat().includes('added Pod/job'), 'the pod');
    const uid = store.get('Pod', 'default', 'job')!.uid;
    // The shell truncates the file; the generator writes only after a pause longer than the debounce.
    const fd = await fs.open(file, 'w');
    await new Promise((r) => setTimeout(r, DEBOUNCE_MS * 6));
    expect(store.get('Pod', 'default', 'job')?.uid).toBe(uid);
    expect(store.problems()).toMatchObject([{ file, reason: expect.stringMatching(/^the file is empty; keeping the object/) }]);
    await fd.writeFile(pod('job'));
    await fd.close();
    await until(() => store.problems().length === 0, 'the content read again');
    await watcher!.rescan();
    expect(flat()).toEqual(['added Pod/job']);
    // Removing the file is how a manifest's objects go.
    await fs.rm(file);
    await until(() => flat().includes('deleted Pod/job'), 'the removal');
  });

  it('measures the latency from a write to the change callback (default debounce)', async () => {
    watcher = new ManifestWatcher({ dir, store });
    await watcher.start();
    const latencies: number[] = [];
    for (let i = 0; i < 20; i++) {
      const before = seen.length;
      const t0 = performance.now();
      await fs.writeFile(path.join(dir, `p${i}.yaml`), pod(`p${i}`));
      await until(() => seen.length > before, `p${i}`);
      latencies.push(seen[before]!.at - t0);
    }
    latencies.sort((a, b) => a - b);
    const median = latencies[latencies.length >> 1]!;
    const max = latencies[latencies.length - 1]!;
    console.log(`manifest watch latency over 20 writes (debounce ${DEFAULT_DEBOUNCE_MS} ms): min ${latencies[0]!.toFixed(1)} ms, median ${median.toFixed(1)} ms, max ${max.toFixed(1)} ms`);
    expect(latencies[0]).toBeGreaterThanOrEqual(DEFAULT_DEBOUNCE_MS - 1);
    expect(median).toBeLessThan(DEFAULT_DEBOUNCE_MS + 250);
  });
});
