import { spawn } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import type { ConfigMap, Pod, Secret } from 'kubernetes-types/core/v1.js';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { validatePayloadPath, writeAtomic, type Payload } from '../../src/kubelet-lite/atomic-writer.js';
import type { ObjectLookup, PodContext } from '../../src/kubelet-lite/model.js';
import { checkHostPath, HostVolumeManager, managedHostsContent, memoryVolumeSize, mountsUnder, VolumeSetupError } from '../../src/kubelet-lite/volumes.js';
import type { Logger } from '../../src/log.js';
import { MNT_DETACH, umount2 } from '../../src/sys/libc.js';

const isRoot = process.getuid?.() === 0;
const GiB = 1024 ** 3;

let tmp: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kl-vol-'));
});
afterEach(async () => {
  // Never leave a tmpfs behind, even when a test failed half-way.
  for (const mp of await mountsUnder(tmp)) umount2(mp, MNT_DETACH);
  fs.rmSync(tmp, { recursive: true, force: true });
});

function payload(entries: Record<string, string>, mode = 0o644): Payload {
  return new Map(Object.entries(entries).map(([k, v]) => [k, { data: Buffer.from(v), mode }]));
}

async function waitUntil(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 5));
  }
}

describe('atomic writer', () => {
  it('lays files out behind ..data and swaps the whole set on update', async () => {
    const dir = path.join(tmp, 'vol');
    expect(await writeAtomic(dir, payload({ a: 'A1', 'sub/b': 'B1', c: 'C1' }))).toEqual({ changed: true });
    const v1 = fs.readlinkSync(path.join(dir, '..data'));
    expect(v1).toMatch(/^\.\.\d{4}_\d\d_\d\d_\d\d_\d\d_\d\d\.[0-9a-f]+$/);
    expect(fs.readlinkSync(path.join(dir, 'a'))).toBe('..data/a');
    expect(fs.readlinkSync(path.join(dir, 'sub'))).toBe('..data/sub');
    expect(fs.readFileSync(path.join(dir, 'sub/b'), 'utf8')).toBe('B1');
    expect(fs.statSync(path.join(dir, 'a')).mode & 0o777).toBe(0o644);

    // Same content: nothing is rewritten.
    expect(await writeAtomic(dir, payload({ a: 'A1', 'sub/b': 'B1', c: 'C1' }))).toEqual({ changed: false });
    expect(fs.readlinkSync(path.join(dir, '..data'))).toBe(v1);

    // A changed value and a removed key: new version dir, old one gone, c's link gone.
    expect(await writeAtomic(dir, payload({ a: 'A2', 'sub/b': 'B1' }))).toEqual({ changed: true });
    const v2 = fs.readlinkSync(path.join(dir, '..data'));
    expect(v2).not.toBe(v1);
    expect(fs.existsSync(path.join(dir, v1))).toBe(false);
    expect(fs.readFileSync(path.join(dir, 'a'), 'utf8')).toBe('A2');
    expect(fs.existsSync(path.join(dir, 'c'))).toBe(false);
    expect(fs.readdirSync(dir).sort()).toEqual(['..data', v2, 'a', 'sub'].sort());

    // A mode change alone is a change too.
    await writeAtomic(dir, payload({ a: 'A2', 'sub/b': 'B1' }, 0o400));
    expect(fs.statSync(path.join(dir, 'a')).mode & 0o777).toBe(0o400);
  });

  it.each(['../x', 'a/../../x', '/etc/passwd', '..data', '..2020_01_01', '..', '', 'a/..'])('refuses the payload path %j and writes nothing', async (p) => {
    expect(() => validatePayloadPath(p)).toThrow();
    const dir = path.join(tmp, 'vol');
    await expect(writeAtomic(dir, payload({ [p]: 'x', ok: 'y' }))).rejects.toThrow();
    expect(fs.existsSync(path.join(dir, 'ok'))).toBe(false);
    expect(fs.existsSync(path.join(tmp, 'x'))).toBe(false);
  });

  it('a concurrent reader never sees a partial or mixed set', async () => {
    const dir = path.join(tmp, 'vol');
    const names = ['k1', 'k2', 'k3', 'k4'];
    const big = (v: number, n: string) => `${v}:${n}:`.padEnd(256 * 1024, String(v % 10));
    const version = (v: number) => payload(Object.fromEntries(names.map((n) => [n, big(v, n)])));
    await writeAtomic(dir, version(0));
    const stop = path.join(tmp, 'stop');
    // A separate process, so reads really happen while the writer works.
    const reader = `
      const fs = require('fs'), path = require('path');
      const [dir, stop, names] = [process.argv[1], process.argv[2], process.argv[3].split(',')];
      const ok = (s, n) => { const m = /^(\\d+):([^:]+):/.exec(s); if (!m || m[2] !== n || s.length !== 256 * 1024) return -1;
        const d = String(Number(m[1]) % 10); return s.slice(m[0].length).split('').every((c) => c === d) ? Number(m[1]) : -1; };
      let sets = 0, files = 0, bad = [];
      process.stdout.write('R');
      while (!fs.existsSync(stop)) {
        // Through ..data once: the whole set is one version.
        let real;
        try { real = fs.realpathSync(path.join(dir, '..data')); } catch { continue; }
        try {
          const vs = names.map((n) => ok(fs.readFileSync(path.join(real, n), 'utf8'), n));
          if (vs.some((v) => v < 0 || v !== vs[0])) bad.push('set ' + vs.join(',')); else sets++;
        } catch (e) { if (e.code !== 'ENOENT') bad.push(String(e)); }
        // Through the visible names: every file whole.
        for (const n of names) {
          try { const v = ok(fs.readFileSync(path.join(dir, n), 'utf8'), n); if (v < 0) bad.push('file ' + n); else files++; }
          // ENOENT is a lookup racing the removal of the old set (the kubelet's writer has the
          // same window); what must never happen is a partial or mixed file.
          catch (e) { if (e.code !== 'ENOENT') bad.push(String(e)); }
        }
      }
      process.stdout.write(JSON.stringify({ sets, files, bad: bad.slice(0, 5), nbad: bad.length }));
    `;
    const child = spawn(process.execPath, ['-e', reader, dir, stop, names.join(',')], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    const done = new Promise<void>((resolve) => child.on('exit', () => resolve()));
    let last = 0;
    try {
      // Start writing once the reader reads, and overlap it for a while whatever the machine's speed.
      await waitUntil(() => out.startsWith('R') || child.exitCode !== null);
      const until = Date.now() + 500;
      while (last < 40 || Date.now() < until) await writeAtomic(dir, version(++last));
      // The writer removes each old set at once, so under load a reader may never catch one
      // whole while writes go on: give it a quiet moment on the last set before stopping.
      await new Promise((r) => setTimeout(r, 300));
    } finally {
      fs.writeFileSync(stop, '');
      await done;
    }
    const res = JSON.parse(out.slice(1)) as { sets: number; files: number; nbad: number; bad: string[] };
    expect(res.bad).toEqual([]);
    expect(res.nbad).toBe(0);
    expect(res.sets).toBeGreaterThan(0);
    expect(res.files).toBeGreaterThan(0);
    expect(fs.readFileSync(path.join(dir, 'k1'), 'utf8')).toBe(big(last, 'k1'));
  });
});

describe('hostPath type checks', () => {
  it('creates for DirectoryOrCreate (0755) and FileOrCreate, checks the others', async () => {
    const d = path.join(tmp, 'new', 'dir');
    await checkHostPath(d, 'DirectoryOrCreate');
    expect(fs.statSync(d).isDirectory()).toBe(true);
    expect(fs.statSync(d).mode & 0o777).toBe(0o755);
    await checkHostPath(d, 'DirectoryOrCreate');
    await checkHostPath(d, 'Directory');

    const f = path.join(tmp, 'file');
    await checkHostPath(f, 'FileOrCreate');
    expect(fs.statSync(f).isFile()).toBe(true);
    fs.writeFileSync(f, 'keep');
    await checkHostPath(f, 'FileOrCreate');
    expect(fs.readFileSync(f, 'utf8')).toBe('keep');
    await checkHostPath(f, 'File');
    await expect(checkHostPath(path.join(tmp, 'missing', 'f'), 'FileOrCreate')).rejects.toThrow();

    await expect(checkHostPath(path.join(tmp, 'nope'), 'Directory')).rejects.toThrow(`hostPath type check failed: ${path.join(tmp, 'nope')} is not a directory`);
    await expect(checkHostPath(f, 'Directory')).rejects.toThrow('is not a directory');
    await expect(checkHostPath(f, 'DirectoryOrCreate')).rejects.toThrow('is not a directory');
    await expect(checkHostPath(d, 'File')).rejects.toThrow('is not a file');
    await expect(checkHostPath(d, 'FileOrCreate')).rejects.toThrow('is not a file');
    await expect(checkHostPath(f, 'Socket')).rejects.toThrow('is not a socket file');
    await expect(checkHostPath('/dev/null', 'BlockDevice')).rejects.toThrow('is not a block device');
    await expect(checkHostPath(f, 'CharDevice')).rejects.toThrow('is not a character device');
    await checkHostPath('/dev/null', 'CharDevice');
    await checkHostPath(path.join(tmp, 'nothing-here'), '');
    await expect(checkHostPath(f, 'Bogus')).rejects.toThrow('Bogus is an invalid volume type');

    const sock = path.join(tmp, 's.sock');
    const srv = net.createServer();
    await new Promise<void>((r) => srv.listen(sock, r));
    try {
      await checkHostPath(sock, 'Socket');
    } finally {
      await new Promise((r) => srv.close(r));
    }
  });
});

// ---------------------------------------------------------------- the manager

interface Store {
  configMaps: ConfigMap[];
  secrets: Secret[];
}

function lookup(store: Store): ObjectLookup {
  const key = (o: { metadata?: { namespace?: string; name?: string } }) => `${o.metadata?.namespace ?? 'default'}/${o.metadata?.name}`;
  return {
    get: () => undefined,
    list: () => [],
    configMap: (ns, name) => store.configMaps.find((c) => key(c) === `${ns}/${name}`),
    secret: (ns, name) => store.secrets.find((s) => key(s) === `${ns}/${name}`),
  };
}

function recordingLog(): Logger & { warnings: string[] } {
  const warnings: string[] = [];
  const nop = () => undefined;
  return { warnings, debug: nop, info: nop, error: nop, warn: (m, f) => warnings.push(`${m} ${JSON.stringify(f)}`) };
}

function ctxFor(root: string, pod: Pod, store: Store, over: Partial<PodContext> = {}): PodContext {
  return {
    pod,
    uid: 'u1',
    nodeName: 'node-a',
    hostIP: '10.0.0.5',
    podIP: '10.88.0.9',
    clusterDomain: 'cluster.local',
    clusterDNS: [],
    hostResolvConf: '',
    podDir: path.join(root, 'pods', 'u1'),
    objects: lookup(store),
    ...over,
  };
}

describe('volume manager', () => {
  const store = (): Store => ({
    configMaps: [{ metadata: { name: 'cfg', namespace: 'ns' }, data: { 'app.conf': 'v=1', other: 'o' }, binaryData: { blob: Buffer.from([0, 1, 2]).toString('base64') } }],
    secrets: [{ metadata: { name: 'sec', namespace: 'ns' }, data: { password: Buffer.from('pw').toString('base64') } }],
  });
  const pod = (volumes: NonNullable<Pod['spec']>['volumes']): Pod => ({
    metadata: { name: 'p', namespace: 'ns', labels: { b: '2', a: '1' }, annotations: { note: 'x' } },
    spec: { containers: [{ name: 'c', image: 'i', resources: { limits: { memory: '64Mi' } } }], volumes },
  });

  it('sets up configMap, secret, downwardAPI and projected volumes with their modes, and is idempotent', async () => {
    const log = recordingLog();
    const vm = new HostVolumeManager({ rootDir: tmp, log, node: { milliCpu: 2000, memoryBytes: 4 * GiB } });
    const p = pod([
      { name: 'all', configMap: { name: 'cfg', defaultMode: 0o440 } },
      { name: 'items', configMap: { name: 'cfg', items: [{ key: 'app.conf', path: 'etc/app.conf', mode: 0o600 }, { key: 'absent', path: 'x' }], optional: true } },
      { name: 'gone', configMap: { name: 'nope', optional: true } },
      { name: 'sec', secret: { secretName: 'sec', defaultMode: 0o400 } },
      {
        name: 'meta',
        downwardAPI: {
          items: [
            { path: 'labels', fieldRef: { fieldPath: 'metadata.labels' } },
            { path: 'name', fieldRef: { fieldPath: 'metadata.name' } },
            { path: 'mem', resourceFieldRef: { containerName: 'c', resource: 'limits.memory', divisor: '1Mi' } },
            { path: 'cpu', resourceFieldRef: { containerName: 'c', resource: 'limits.cpu' } },
          ],
        },
      },
      {
        name: 'proj',
        projected: {
          defaultMode: 0o444,
          sources: [
            { configMap: { name: 'cfg', items: [{ key: 'other', path: 'other' }] } },
            { secret: { name: 'sec' } },
            { downwardAPI: { items: [{ path: 'ns', fieldRef: { fieldPath: 'metadata.namespace' } }] } },
            { serviceAccountToken: { path: 'token' } },
          ],
        },
      },
    ]);
    const ctx = ctxFor(tmp, p, store());
    const paths = await vm.setUp(ctx);
    const vol = (plugin: string, name: string) => path.join(ctx.podDir, 'volumes', plugin, name);
    expect(paths.get('all')).toBe(vol('kubernetes.io~configmap', 'all'));
    const read = (v: string, f: string) => fs.readFileSync(path.join(paths.get(v)!, f));
    const mode = (v: string, f: string) => fs.statSync(path.join(paths.get(v)!, f)).mode & 0o777;
    expect(read('all', 'app.conf').toString()).toBe('v=1');
    expect(read('all', 'blob')).toEqual(Buffer.from([0, 1, 2]));
    expect(mode('all', 'other')).toBe(0o440);
    expect(read('items', 'etc/app.conf').toString()).toBe('v=1');
    expect(mode('items', 'etc/app.conf')).toBe(0o600);
    expect(fs.existsSync(path.join(paths.get('items')!, 'other'))).toBe(false);
    expect(fs.readdirSync(paths.get('gone')!).filter((f) => !f.startsWith('..'))).toEqual([]);
    expect(read('sec', 'password').toString()).toBe('pw');
    expect(mode('sec', 'password')).toBe(0o400);
    expect(paths.get('sec')).toBe(vol('kubernetes.io~secret', 'sec'));
    expect(read('meta', 'labels').toString()).toBe('a="1"\nb="2"');
    expect(read('meta', 'name').toString()).toBe('p');
    expect(read('meta', 'mem').toString()).toBe('64');
    expect(read('meta', 'cpu').toString()).toBe('2');
    expect(mode('meta', 'name')).toBe(0o644);
    expect(fs.readdirSync(paths.get('proj')!).filter((f) => !f.startsWith('..')).sort()).toEqual(['ns', 'other', 'password']);
    expect(mode('proj', 'password')).toBe(0o444);
    expect(log.warnings.join('\n')).toMatch(/serviceAccountToken/);

    const before = fs.readlinkSync(path.join(paths.get('all')!, '..data'));
    expect(await vm.setUp(ctx)).toEqual(paths);
    expect(fs.readlinkSync(path.join(paths.get('all')!, '..data'))).toBe(before);
    await vm.tearDown('u1');
  });

  it.each([
    [{ name: 'v', configMap: { name: 'nope' } }, 'MountVolume.SetUp failed for volume "v" : configmap "nope" not found'],
    [{ name: 'v', secret: { secretName: 'nope' } }, 'MountVolume.SetUp failed for volume "v" : secret "nope" not found'],
    [{ name: 'v', configMap: { name: 'cfg', items: [{ key: 'nokey', path: 'x' }] } }, 'configmap references non-existent config key: nokey'],
    [{ name: 'v', secret: { secretName: 'sec', items: [{ key: 'nokey', path: 'x' }] } }, 'secret references non-existent secret key: nokey'],
    [{ name: 'v', configMap: { name: 'cfg', items: [{ key: 'other', path: '../../escape' }] } }, "contains '..'"],
    [{ name: 'v', configMap: { name: 'cfg', items: [{ key: 'other', path: '/abs' }] } }, 'is absolute'],
    [{ name: 'v', persistentVolumeClaim: { claimName: 'c' } }, 'MountVolume.SetUp failed for volume "v" : persistentvolumeclaim "c" not found'],
    [{ name: 'v', cinder: { volumeID: 'x' } }, 'volume type cinder is not supported'],
    [{ name: 'v', hostPath: { path: '/nonexistent/kl-test', type: 'Directory' } }, 'hostPath type check failed'],
  ])('fails %j as a FailedMount', async (v, msg) => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const ctx = ctxFor(tmp, pod([v]), store());
    const err = await vm.setUp(ctx).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(VolumeSetupError);
    expect((err as Error).message).toContain(msg);
    expect(fs.existsSync(path.join(tmp, 'escape'))).toBe(false);
    expect(fs.existsSync(path.join(tmp, 'pods', 'escape'))).toBe(false);
    await vm.tearDown('u1');
  });

  it('refresh rewrites in place through the same paths and keeps the last good set when the ConfigMap goes', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const s = store();
    const ctx = ctxFor(tmp, pod([{ name: 'cfg', configMap: { name: 'cfg' } }]), s);
    const paths = await vm.setUp(ctx);
    const file = path.join(paths.get('cfg')!, 'app.conf');
    const old = fs.readlinkSync(path.join(paths.get('cfg')!, '..data'));
    s.configMaps[0] = { ...s.configMaps[0], data: { 'app.conf': 'v=2' } };
    await vm.refresh(ctx);
    expect(fs.readFileSync(file, 'utf8')).toBe('v=2');
    expect(fs.existsSync(path.join(paths.get('cfg')!, 'other'))).toBe(false);
    expect(fs.existsSync(path.join(paths.get('cfg')!, old))).toBe(false);
    s.configMaps.length = 0;
    await expect(vm.refresh(ctx)).rejects.toThrow('configmap "cfg" not found');
    expect(fs.readFileSync(file, 'utf8')).toBe('v=2');
    await vm.tearDown('u1');
  });

  it.skipIf(!isRoot)('with an fsGroup, projected files and the emptyDir belong to that group, which may read them', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const p = pod([
      { name: 'cfg', configMap: { name: 'cfg', defaultMode: 0o400 } },
      { name: 'scratch', emptyDir: {} },
    ]);
    p.spec!.securityContext = { fsGroup: 2345 };
    const ctx = ctxFor(tmp, p, store());
    const paths = await vm.setUp(ctx);
    const st = fs.statSync(path.join(paths.get('cfg')!, 'app.conf'));
    expect(st.gid).toBe(2345);
    expect(st.mode & 0o777).toBe(0o440);
    const version = fs.statSync(path.join(paths.get('cfg')!, '..data'));
    expect(version.gid).toBe(2345);
    const scratch = fs.statSync(paths.get('scratch')!);
    expect(scratch.gid).toBe(2345);
    expect(scratch.mode & 0o7777).toBe(0o2777);
    // Unchanged content and group: no new version.
    const before = fs.readlinkSync(path.join(paths.get('cfg')!, '..data'));
    await vm.setUp(ctx);
    expect(fs.readlinkSync(path.join(paths.get('cfg')!, '..data'))).toBe(before);
    await vm.tearDown('u1');
  });

  it('concurrent refreshes of one volume queue up; the last one wins and one version remains', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const s = store();
    const ctx = ctxFor(tmp, pod([{ name: 'cfg', configMap: { name: 'cfg' } }]), s);
    const dir = (await vm.setUp(ctx)).get('cfg')!;
    const calls: Array<Promise<unknown>> = [];
    for (let i = 0; i < 10; i++) {
      s.configMaps[0] = { ...s.configMaps[0], data: { 'app.conf': `v=${i}` } };
      calls.push(i % 2 ? vm.refresh(ctx) : vm.setUp(ctx));
    }
    await Promise.all(calls);
    expect(fs.readFileSync(path.join(dir, 'app.conf'), 'utf8')).toBe('v=9');
    expect(fs.readdirSync(dir).filter((f) => f.startsWith('..') && f !== '..data')).toHaveLength(1);
    await vm.tearDown('u1');
  });

  it("sizes a memory emptyDir as the kubelet: the node's memory, the pod's limit, or a smaller sizeLimit; never unlimited", () => {
    const node = { milliCpu: 2000, memoryBytes: 8 * GiB };
    const withLimits = (limits: Array<string | undefined>, init?: string): Pod => ({
      spec: {
        containers: limits.map((l, i) => ({ name: `c${i}`, ...(l ? { resources: { limits: { memory: l } } } : {}) })),
        ...(init ? { initContainers: [{ name: 'i', resources: { limits: { memory: init } } }] } : {}),
      },
    });
    const vol = (sizeLimit?: string) => ({ name: 'm', emptyDir: { medium: 'Memory', ...(sizeLimit !== undefined ? { sizeLimit } : {}) } });
    expect(memoryVolumeSize(withLimits([undefined]), vol(), node)).toBe(8 * GiB);
    expect(memoryVolumeSize(withLimits([undefined]), vol('0'), node)).toBe(8 * GiB);
    expect(memoryVolumeSize(withLimits([undefined]), vol('1Gi'), node)).toBe(GiB);
    expect(memoryVolumeSize(withLimits([undefined]), vol('100Gi'), node)).toBe(8 * GiB);
    // Every container limited: their sum (or the largest init container) bounds it.
    expect(memoryVolumeSize(withLimits(['256Mi', '256Mi']), vol(), node)).toBe(512 * 1024 * 1024);
    expect(memoryVolumeSize(withLimits(['256Mi', '256Mi'], '1Gi'), vol('0'), node)).toBe(GiB);
    expect(memoryVolumeSize(withLimits(['256Mi', '256Mi']), vol('64Mi'), node)).toBe(64 * 1024 * 1024);
    // One container without a limit: the pod has none.
    expect(memoryVolumeSize(withLimits(['256Mi', undefined]), vol(), node)).toBe(8 * GiB);
  });

  it('emptyDir on disk is a world-writable directory', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const ctx = ctxFor(tmp, pod([{ name: 'scratch', emptyDir: {} }]), store());
    const dir = (await vm.setUp(ctx)).get('scratch')!;
    expect(dir).toBe(path.join(ctx.podDir, 'volumes/kubernetes.io~empty-dir/scratch'));
    expect(fs.statSync(dir).mode & 0o777).toBe(0o777);
    fs.writeFileSync(path.join(dir, 'f'), 'kept');
    await vm.setUp(ctx);
    expect(fs.readFileSync(path.join(dir, 'f'), 'utf8')).toBe('kept');
    await vm.tearDown('u1');
    expect(fs.existsSync(ctx.podDir)).toBe(false);
  });

  it.skipIf(!isRoot)('emptyDir medium Memory is a tmpfs of sizeLimit (the node memory without one, never unlimited), unmounted at teardown', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp, node: { milliCpu: 1000, memoryBytes: 64 * 1024 * 1024 } });
    const ctx = ctxFor(tmp, pod([{ name: 'mem', emptyDir: { medium: 'Memory', sizeLimit: '8Mi' } }, { name: 'half', emptyDir: { medium: 'Memory' } }, { name: 'zero', emptyDir: { medium: 'Memory', sizeLimit: '0' } }]), store());
    const paths = await vm.setUp(ctx);
    await vm.setUp(ctx); // no second mount on top
    const info = fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
    const line = (p: string) => info.filter((l) => l.split(' ')[4] === p);
    expect(line(paths.get('mem')!)).toHaveLength(1);
    expect(line(paths.get('mem')!)[0]).toMatch(/ - tmpfs tmpfs .*size=8192k/);
    expect(line(paths.get('half')!)[0]).toMatch(/size=65536k/);
    // tmpfs takes size=0 as no limit at all: a zero sizeLimit is the node's memory, as none is.
    expect(line(paths.get('zero')!)[0]).toMatch(/size=65536k/);
    const df = await fsp.statfs(paths.get('mem')!);
    expect(df.blocks * df.bsize).toBe(8 * 1024 * 1024);
    fs.writeFileSync(path.join(paths.get('mem')!, 'f'), 'x');
    await vm.tearDown('u1');
    expect(await mountsUnder(tmp)).toEqual([]);
    expect(fs.existsSync(ctx.podDir)).toBe(false);
    await vm.tearDown('u1');
  });

  it.skipIf(!isRoot)('finds its tmpfs mounts when the root dir is reached through a symlink', async () => {
    fs.mkdirSync(path.join(tmp, 'real'));
    fs.symlinkSync('real', path.join(tmp, 'link'));
    const root = path.join(tmp, 'link');
    const vm = new HostVolumeManager({ rootDir: root });
    const ctx = ctxFor(root, pod([{ name: 'mem', emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } }]), store());
    await vm.setUp(ctx);
    await vm.setUp(ctx);
    expect(await mountsUnder(path.join(tmp, 'real'))).toHaveLength(1);
    await vm.tearDown('u1');
    expect(await mountsUnder(tmp)).toEqual([]);
    expect(fs.existsSync(ctx.podDir)).toBe(false);
  });

  it('teardown never follows a symlink out of the pod dir, and refuses a bad uid', async () => {
    const vm = new HostVolumeManager({ rootDir: path.join(tmp, 'root') });
    const outside = path.join(tmp, 'outside');
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, 'precious'), 'x');
    const ctx = ctxFor(path.join(tmp, 'root'), pod([{ name: 'scratch', emptyDir: {} }]), store());
    const dir = (await vm.setUp(ctx)).get('scratch')!;
    // What a container could leave in its emptyDir.
    fs.symlinkSync(outside, path.join(dir, 'link'));
    fs.symlinkSync('/', path.join(dir, 'root'));
    await vm.tearDown('u1');
    expect(fs.readFileSync(path.join(outside, 'precious'), 'utf8')).toBe('x');
    expect(fs.existsSync(ctx.podDir)).toBe(false);
    await vm.tearDown('u1');
    await expect(vm.tearDown('../outside')).rejects.toThrow(/invalid pod uid/);
    expect(fs.existsSync(outside)).toBe(true);
  });

  it.skipIf(!isRoot)('teardown refuses to delete through a mount it cannot remove', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const ctx = ctxFor(tmp, pod([{ name: 'mem', emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } }]), store());
    const paths = await vm.setUp(ctx);
    fs.writeFileSync(path.join(paths.get('mem')!, 'f'), 'x');
    // Busy mounts are detached, so teardown still finishes.
    const fd = fs.openSync(path.join(paths.get('mem')!, 'f'), 'r');
    try {
      await vm.tearDown('u1');
    } finally {
      fs.closeSync(fd);
    }
    expect(await mountsUnder(tmp)).toEqual([]);
    expect(fs.existsSync(ctx.podDir)).toBe(false);
  });
});

describe('managed /etc/hosts', () => {
  it('writes the kubelet hosts file with the FQDN and host aliases, in place', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const p: Pod = {
      metadata: { name: 'web-0', namespace: 'shop' },
      spec: {
        hostname: 'web-0',
        subdomain: 'web',
        hostAliases: [
          { ip: '10.1.2.3', hostnames: ['foo.local', 'bar.local'] },
          { ip: '10.1.2.4', hostnames: ['baz'] },
        ],
        containers: [],
      },
    };
    const ctx = ctxFor(tmp, p, { configMaps: [], secrets: [] });
    const file = await vm.writeEtcHosts(ctx);
    expect(file).toBe(path.join(ctx.podDir, 'etc-hosts'));
    expect(fs.readFileSync(file, 'utf8')).toBe(
      [
        '# Kubernetes-managed hosts file.',
        '127.0.0.1\tlocalhost',
        '::1\tlocalhost ip6-localhost ip6-loopback',
        'fe00::0\tip6-localnet',
        'fe00::0\tip6-mcastprefix',
        'fe00::1\tip6-allnodes',
        'fe00::2\tip6-allrouters',
        '10.88.0.9\tweb-0.web.shop.svc.cluster.local\tweb-0',
        '',
        '# Entries added by HostAliases.',
        '10.1.2.3\tfoo.local\tbar.local',
        '10.1.2.4\tbaz',
        '',
      ].join('\n'),
    );
    const ino = fs.statSync(file).ino;
    await vm.writeEtcHosts({ ...ctx, podIP: '10.88.0.10' });
    expect(fs.statSync(file).ino).toBe(ino);
    expect(fs.readFileSync(file, 'utf8')).toContain('10.88.0.10\tweb-0.web.shop.svc.cluster.local\tweb-0\n');
    await expect(vm.writeEtcHosts({ ...ctx, podIP: undefined })).rejects.toThrow(/no pod IP/);
  });

  it('never reads a hosts file a container has grown into memory', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const p: Pod = { metadata: { name: 'web', namespace: 'shop' }, spec: { containers: [] } };
    const ctx = ctxFor(tmp, p, { configMaps: [], secrets: [] });
    const file = await vm.writeEtcHosts(ctx);
    const ino = fs.statSync(file).ino;
    // The container has it read-write at /etc/hosts: 768 MiB (sparse, no disk) when the agent comes back.
    fs.truncateSync(file, 768 * 1024 * 1024);
    const before = process.resourceUsage().maxRSS;
    await vm.writeEtcHosts(ctx);
    expect(process.resourceUsage().maxRSS - before).toBeLessThan(128 * 1024);
    expect(fs.statSync(file).ino).toBe(ino);
    expect(fs.readFileSync(file, 'utf8')).toBe(managedHostsContent(p, ['10.88.0.9'], 'cluster.local'));
  });

  it('a pod without subdomain or aliases gets its name only', async () => {
    const vm = new HostVolumeManager({ rootDir: tmp });
    const ctx = ctxFor(tmp, { metadata: { name: 'solo' }, spec: { containers: [] } }, { configMaps: [], secrets: [] });
    const text = fs.readFileSync(await vm.writeEtcHosts(ctx), 'utf8');
    expect(text.endsWith('fe00::2\tip6-allrouters\n10.88.0.9\tsolo\n')).toBe(true);
  });

  it("a host-network pod gets the host's file plus its aliases", async () => {
    const hostsFile = path.join(tmp, 'hosts');
    fs.writeFileSync(hostsFile, '127.0.0.1 localhost\n192.168.1.10 myhost');
    const vm = new HostVolumeManager({ rootDir: tmp, hostsFile });
    const p: Pod = { metadata: { name: 'h' }, spec: { hostNetwork: true, hostAliases: [{ ip: '1.2.3.4', hostnames: ['x'] }], containers: [] } };
    const text = fs.readFileSync(await vm.writeEtcHosts(ctxFor(tmp, p, { configMaps: [], secrets: [] }, { podIP: undefined })), 'utf8');
    expect(text).toBe('# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n192.168.1.10 myhost\n\n# Entries added by HostAliases.\n1.2.3.4\tx\n');
  });
});
