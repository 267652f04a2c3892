/**
 * A `skiff cri` in a network namespace of its own, with a busybox image
 * pulled, for tests that run pods; `cleanup` removes every pod, stops the
 * daemon and checks that nothing (mounts, processes) is left behind.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { makeDirs, SkiffProcess, type DaemonDirs } from './daemon.js';
import { busyboxImage } from './busybox.js';
import { TestNetns } from './netns.js';
import { Pusher } from './oci.js';

export interface PodFixture {
  dirs: DaemonDirs;
  skiff: SkiffProcess;
  ns: TestNetns;
  image: string;
  /** Removes everything; returns what leaked (mounts and processes under the test dir). */
  cleanup(): Promise<{ mounts: string[]; processes: string[] }>;
}

export function mountsUnder(dir: string): string[] {
  return spawnSync('cat', ['/proc/self/mountinfo'], { encoding: 'utf8' })
    .stdout.split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((m) => m.startsWith(dir));
}

export function processesMentioning(text: string): string[] {
  return spawnSync('ps', ['-eo', 'pid,args'], { encoding: 'utf8' })
    .stdout.split('\n')
    .filter((l) => l.includes(text) && !l.includes('ps -eo'));
}

/**
 * What is still mounted under `dir` or running with it in its command line, once the processes a stop
 * just signalled have had up to `graceMs` to go: polled, so a slow exit is not a leak and a leak is
 * whatever is still there at the deadline.
 */
export async function leftBehind(dir: string, graceMs = 3000): Promise<{ mounts: string[]; processes: string[] }> {
  const deadline = Date.now() + graceMs;
  for (;;) {
    const leaks = { mounts: mountsUnder(dir), processes: processesMentioning(dir) };
    if ((!leaks.mounts.length && !leaks.processes.length) || Date.now() >= deadline) return leaks;
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The sandbox config of a test pod named `n`, its logs under the daemon's test dir; the uid is unique per call. */
export function podConfig(dirs: DaemonDirs, n: string) {
  return {
    metadata: { name: n, namespace: 'test', uid: `uid-${n}-${randomBytes(3).toString('hex')}`, attempt: 0 },
    hostname: n,
    logDirectory: path.join(dirs.base, 'logs', n),
    linux: {},
  };
}

/** `wrap` prefixes the daemon's command line inside the namespace (a shell that hands it a descriptor, say). */
export async function startPodFixture(registryHost: string, repo = 'test/busybox', daemonArgs: string[] = [], opts: { wrap?: (argv: string[]) => string[] } = {}): Promise<PodFixture> {
  const img = await busyboxImage();
  await new Pusher(`http://${registryHost}`).image(repo, 'v1', img);
  const image = `${registryHost}/${repo}:v1`;
  const dirs = await makeDirs();
  const ns = new TestNetns().create();
  await ns.bridgePort(Number(registryHost.split(':')[1]), dirs.base);
  await fs.mkdir(path.join(dirs.base, 'net.d'));
  const skiff = await new SkiffProcess(dirs, ['--cni-conf-dir', path.join(dirs.base, 'net.d'), ...daemonArgs], (a) => ns.wrap(opts.wrap ? opts.wrap(a) : a)).start();
  await skiff.images.PullImage({ image: { image } });
  return {
    dirs,
    skiff,
    ns,
    image,
    cleanup: async () => {
      const pods = await skiff.runtime.ListPodSandbox({}).catch(() => ({ items: [] }));
      for (const p of pods.items ?? []) await skiff.runtime.RemovePodSandbox({ podSandboxId: p.id! }).catch(() => undefined);
      await skiff.stop();
      await ns.destroy();
      const leaks = await leftBehind(dirs.base);
      await fs.rm(dirs.base, { recursive: true, force: true });
      return leaks;
    },
  };
}
