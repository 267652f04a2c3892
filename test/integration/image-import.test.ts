/**
 * Images with no registry: archives imported into a real `skiff cri` through
 * the `skiff images` command and the images directory, then run as
 * containers; a corrupt archive leaves nothing behind; `skiff images pull`
 * shows its progress against the test registry.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { buildDemoImages, DEMO_CLIENT, DEMO_WEB } from '../../scripts/build-demo-images.js';
import { busyboxImage } from '../helpers/busybox.js';
import { grpc, makeDirs, repoRoot, SkiffProcess, type DaemonDirs } from '../helpers/daemon.js';
import { loadSkiff } from '../../src/server/proto.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { buildImage, dockerSaveArchive, ociArchive, Pusher } from '../helpers/oci.js';
import { leftBehind } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

const run = promisify(execFile);
const bin = path.join(repoRoot, 'bin', 'skiff.js');

/** Runs the real `skiff` command; returns its exit code and output instead of throwing. */
async function skiffCli(dirs: DaemonDirs, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [bin, ...args, '--runtime-endpoint', `unix://${dirs.socket}`], { timeout: 90_000 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === 'number' ? e.code : -1, stdout: e.stdout ?? '', stderr: e.stderr ?? String(err) };
  }
}

/** What the store holds on disk: blobs, snapshot dirs and ingest/unpack leftovers. */
async function onDisk(dirs: DaemonDirs): Promise<Record<string, string[]>> {
  const ls = (p: string) => fs.readdir(path.join(dirs.root, p)).then((l) => l.sort(), () => []);
  return {
    blobs: await ls('content/blobs/sha256'),
    ingest: await ls('content/ingest'),
    snapshots: await ls('snapshots'),
    work: await ls('snapshots-work'),
    importTmp: await ls('import-tmp'),
  };
}

let seq = 0;

describe.skipIf(!isRoot)('image archives: skiff images import/ls/rm/pull and --images-dir', () => {
  let dirs: DaemonDirs;
  let skiff: SkiffProcess;
  let ns: TestNetns;
  let imagesDir: string;
  let archives: string;
  let reg: string;

  const start = async () => {
    skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d'), '--images-dir', imagesDir], (a) => ns.wrap(a)).start();
  };

  beforeAll(async () => {
    reg = inject('registryHost');
    dirs = await makeDirs();
    imagesDir = path.join(dirs.base, 'images');
    archives = path.join(dirs.base, 'archives');
    await fs.mkdir(path.join(dirs.base, 'net.d'));
    await fs.mkdir(imagesDir);
    // The demo images, built by the setup script's own code: one is in the images dir before the daemon starts.
    await buildDemoImages(archives);
    await fs.copyFile(path.join(archives, 'demo-client.tar'), path.join(imagesDir, 'demo-client.tar'));
    // Old enough to count as complete at start.
    const old = new Date(Date.now() - 60_000);
    await fs.utimes(path.join(imagesDir, 'demo-client.tar'), old, old);
    ns = new TestNetns().create();
    await ns.bridgePort(Number(reg.split(':')[1]), dirs.base);
    await start();
  });

  afterAll(async () => {
    if (skiff) {
      const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await skiff.stop();
    }
    await ns?.destroy();
    const { mounts, processes: procs } = dirs ? await leftBehind(dirs.base) : { mounts: [], processes: [] };
    if (dirs) await fs.rm(dirs.base, { recursive: true, force: true });
    expect(mounts, 'mounts left behind').toEqual([]);
    expect(procs, 'processes left behind').toEqual([]);
  });

  async function runIn(image: string, command: string[]) {
    const n = `imp${++seq}`;
    const config = { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: `host-${n}`, logDirectory: path.join(dirs.base, 'logs', n), linux: {} };
    const { podSandboxId } = await skiff.runtime.RunPodSandbox({ config });
    const { containerId } = await skiff.runtime.CreateContainer({
      podSandboxId,
      config: { metadata: { name: 'c' }, image: { image }, logPath: 'c.log', linux: {}, ...(command.length ? { command } : {}) },
      sandboxConfig: config,
    });
    await skiff.runtime.StartContainer({ containerId });
    return { pod: podSandboxId!, container: containerId!, hostname: config.hostname };
  }

  it('imports the archive that was in --images-dir at start, before serving', async () => {
    const st = await skiff.images.ImageStatus({ image: { image: DEMO_CLIENT } });
    expect(st.image?.repoTags).toEqual([DEMO_CLIENT]);
    expect(st.image?.repoDigests?.[0]).toMatch(/^skiff\.local\/demo-client@sha256:[a-f0-9]{64}$/);
    expect(skiff.log).toContain('images dir: archive imported');
  });

  it('skiff images import loads an OCI archive whose image then serves its page from a pod', async () => {
    const r = await skiffCli(dirs, 'images', 'import', path.join(archives, 'demo-web.tar'));
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`imported ${DEMO_WEB.replace(/[.:]/g, '\\$&')} sha256:[a-f0-9]{64}`));
    const listed = await skiff.images.ListImages({});
    const web = listed.images!.find((i) => i.repoTags?.includes(DEMO_WEB))!;
    expect(web.uid?.value).toBe(1000);
    expect(Number(web.size)).toBeGreaterThan(500_000);
    const { container, hostname } = await runIn(DEMO_WEB, []);
    const page = await waitFor('the demo web server to answer', async () => {
      const out = await skiff.runtime.ExecSync({ containerId: container, cmd: ['wget', '-qO-', 'http://127.0.0.1:8080/'], timeout: 5 });
      const text = Buffer.from(out.stdout!).toString();
      return text.includes('served by') ? text : undefined;
    });
    expect(page).toContain(`served by ${hostname}`);
  });

  it('skiff images import loads a docker save archive; the image runs, ls lists it and rm removes it', async () => {
    const img = await busyboxImage({ Cmd: ['sh'], User: 'app' }, [{ name: 'greeting', data: 'hello from docker save\n' }], 'none');
    const file = path.join(archives, 'docker-save.tar');
    await fs.writeFile(file, await dockerSaveArchive([{ tags: ['example.com/saved/busybox:7'], image: img }]));
    const r = await skiffCli(dirs, 'images', 'import', file);
    expect(r.code, r.stderr).toBe(0);
    const st = await skiff.images.ImageStatus({ image: { image: 'example.com/saved/busybox:7' } });
    expect(st.image?.id).toBe(img.config.digest);
    expect(st.image?.username).toBe('app');
    expect(st.image?.repoDigests).toEqual([]);
    const { container, pod } = await runIn('example.com/saved/busybox:7', ['sleep', '1000']);
    const out = await skiff.runtime.ExecSync({ containerId: container, cmd: ['sh', '-c', 'cat /greeting; id -un'], timeout: 10 });
    expect(Buffer.from(out.stdout!).toString()).toBe('hello from docker save\napp\n');
    await skiff.runtime.RemovePodSandbox({ podSandboxId: pod });

    const ls = await skiffCli(dirs, 'images', 'ls');
    expect(ls.code).toBe(0);
    expect(ls.stdout.split('\n')[0]).toMatch(/^IMAGE\s+TAG\s+IMAGE ID\s+SIZE$/);
    expect(ls.stdout).toMatch(new RegExp(`example\\.com/saved/busybox\\s+7\\s+${img.config.digest.slice(7, 20)}`));
    expect(ls.stdout).toMatch(/skiff\.local\/demo-web\s+1\s/);
    const rm = await skiffCli(dirs, 'images', 'rm', 'example.com/saved/busybox:7');
    expect(rm.code, rm.stderr).toBe(0);
    expect((await skiff.images.ImageStatus({ image: { image: 'example.com/saved/busybox:7' } })).image).toBeFalsy();
    const again = await skiffCli(dirs, 'images', 'rm', 'example.com/saved/busybox:7');
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('no such image: example.com/saved/busybox:7');
    expect((await skiffCli(dirs, 'images', 'ls')).stdout).not.toContain('example.com/saved/busybox');
  });

  it('refuses a corrupt archive with a clear error and keeps no blob or snapshot of it', async () => {
    const img = await buildImage({
      layers: [{ entries: [{ name: 'a', data: 'a'.repeat(5000) }] }, { entries: [{ name: 'b', data: 'b'.repeat(5000) }] }],
      config: { config: { Cmd: ['sh'] } },
    });
    const tar = await ociArchive([{ name: 'corrupt.local/x:1', image: img }]);
    // Flip bytes inside the second layer's blob, leaving its size and the archive's framing intact.
    const at = tar.indexOf(Buffer.from(`blobs/sha256/${img.layers[1]!.digest.slice(7)}`)) + 512;
    for (let i = 10; i < 20; i++) tar[at + i] ^= 0xff;
    const file = path.join(archives, 'corrupt.tar');
    await fs.writeFile(file, tar);
    const before = await onDisk(dirs);
    const r = await skiffCli(dirs, 'images', 'import', file);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/failed to import .*corrupt\.tar: .*(digest mismatch|did not decompress)/);
    expect(await onDisk(dirs)).toEqual(before);
    expect((await skiff.images.ImageStatus({ image: { image: 'corrupt.local/x:1' } })).image).toBeFalsy();
    // What is not a regular file is refused by the daemon before anything is read.
    const notAFile = await skiffCli(dirs, 'images', 'import', '/etc');
    expect(notAFile.code).toBe(1);
    expect(notAFile.stderr).toContain('is not a regular file');
  });

  it('skiff.v1.Images/Import refuses relative paths, devices and FIFOs with INVALID_ARGUMENT, and does not block on them', async () => {
    const fifo = path.join(dirs.base, 'fifo.tar');
    await run('mkfifo', [fifo]);
    const client = new (loadSkiff().skiff.v1.Images)(`unix:${dirs.socket}`, grpc.credentials.createInsecure());
    const importOf = (p: string) =>
      new Promise<{ code: number; details: string }>((resolve) => {
        const call = client.Import({ path: p }, { deadline: Date.now() + 20_000 });
        call.on('data', () => undefined);
        call.on('error', (e: grpc.ServiceError) => resolve({ code: e.code, details: e.details }));
        call.on('end', () => resolve({ code: 0, details: '' }));
      });
    try {
      for (const [p, message] of [
        ['relative/archive.tar', /absolute path/],
        ['', /absolute path/],
        ['/dev/zero', /not a regular file/],
        [fifo, /not a regular file/],
        [path.join(dirs.base, 'absent.tar'), /does not exist/],
      ] as const) {
        const r = await importOf(p);
        expect(r.code, p).toBe(p.endsWith('absent.tar') ? grpc.status.NOT_FOUND : grpc.status.INVALID_ARGUMENT);
        expect(r.details).toMatch(message);
      }
    } finally {
      client.close();
    }
  });

  it('the images-dir watcher imports an archive added later, and logs and skips a bad one', async () => {
    const img = await busyboxImage({ Cmd: ['sh'] }, [{ name: 'late', data: 'late\n' }]);
    await fs.writeFile(path.join(imagesDir, 'bad.tar'), 'this is not an archive at all'.repeat(100));
    // Written in two steps, as a slow copy would: the watcher waits for it to stop changing.
    const whole = await ociArchive([{ name: 'late.local/busybox:2', image: img }]);
    const target = path.join(imagesDir, 'late.tar.part');
    await fs.writeFile(target, whole.subarray(0, 4096));
    await fs.appendFile(target, whole.subarray(4096));
    await fs.rename(target, path.join(imagesDir, 'late.tar'));
    await waitFor('the watcher to import late.tar', async () => (await skiff.images.ImageStatus({ image: { image: 'late.local/busybox:2' } })).image ?? undefined, 30_000);
    await waitFor('the bad archive to be logged', async () => skiff.log.includes('images dir: archive refused, skipped') && skiff.log.includes('bad.tar'));
    expect((await skiff.runtime.Version({})).runtimeName).toBe('skiff');

    // A restart imports nothing again: every archive there was seen, as it was.
    await skiff.stop();
    await start();
    expect(skiff.log).not.toContain('images dir: archive imported');
    expect(skiff.log).toContain('bad.tar');
    expect((await skiff.images.ImageStatus({ image: { image: 'late.local/busybox:2' } })).image?.repoTags).toEqual(['late.local/busybox:2']);
  });

  it('skiff images pull shows its progress, bytes and layers, against the test registry', async () => {
    const img = await busyboxImage({ Cmd: ['sh'] }, [{ name: 'big', data: Buffer.alloc(3 << 20, 7) }]);
    await new Pusher(`http://${reg}`).image('test/progress', 'v1', img);
    const ref = `${reg}/test/progress:v1`;
    const r = await skiffCli(dirs, 'images', 'pull', ref);
    expect(r.code, r.stderr).toBe(0);
    const lines = r.stdout.trim().split('\n');
    expect(lines.at(-1)).toBe(`pulled ${ref} ${img.config.digest}`);
    const progress = lines.filter((l) => l.startsWith(`pulling ${ref}: `));
    expect(progress.length).toBeGreaterThanOrEqual(2);
    expect(progress.at(-1)).toMatch(/ \/ [\d.]+ (KiB|MiB) {2}[\d.]+ (B|KiB|MiB|GiB)\/s {2}layers 2\/2$/);
    const missing = await skiffCli(dirs, 'images', 'pull', `${reg}/test/absent:v1`);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/skiff: failed to pull image/);
  });
});
