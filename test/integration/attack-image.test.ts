/**
 * What a hostile image's config and layers can make the daemon do: configs
 * whose fields have the wrong JSON types, configs made of millions of tiny
 * JSON values, and device nodes for the host's disks shipped in a layer.
 * One image must never break the RPCs of the others, never keep a pod from
 * being removed, never blow up the daemon's memory, never reach the host.
 */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { busyboxImage } from '../helpers/busybox.js';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { peakRss, rssOf } from '../helpers/hostile-registry.js';
import { buildImage, Pusher } from '../helpers/oci.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';

let seq = 0;

describe.skipIf(!isRoot)('hostile image configs and layers', () => {
  let fx: PodFixture;
  let reg: string;
  let push: Pusher;

  beforeAll(async () => {
    reg = inject('registryHost');
    push = new Pusher(`http://${reg}`);
    fx = await startPodFixture(reg, 'test/busybox-attack-image');
  });

  afterAll(async () => {
    if (!fx) return;
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  function podConfig() {
    const n = `apod${++seq}`;
    return { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: n, logDirectory: path.join(fx.dirs.base, 'logs', n), linux: {} };
  }

  async function runPod() {
    const config = podConfig();
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    return { id: podSandboxId!, config };
  }

  async function create(pod: { id: string; config: ReturnType<typeof podConfig> }, image: string, cfg: Record<string, unknown> = {}) {
    const name = `c${++seq}`;
    const { containerId } = await fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image }, logPath: `${name}.log`, linux: {}, ...cfg },
      sandboxConfig: pod.config,
    });
    return containerId!;
  }

  async function pushBusybox(repo: string, config: Record<string, unknown>, extraLayer?: Parameters<typeof busyboxImage>[1]): Promise<string> {
    await push.image(repo, 'v1', await busyboxImage(config, extraLayer));
    const image = `${reg}/${repo}:v1`;
    return image;
  }

  it('an image whose config fields have the wrong JSON types breaks neither ListImages nor the removal of its pod', async () => {
    // Numbers and objects where strings and string arrays belong.
    const image = await pushBusybox('test/attack-types', { User: 0, StopSignal: 15, WorkingDir: { x: 1 }, Env: 'PATH=/bin', Entrypoint: 'sh', Cmd: { a: 1 }, Labels: [1, 2] });
    await fx.skiff.images.PullImage({ image: { image } });
    const listed = await fx.skiff.images.ListImages({});
    expect(listed.images!.length).toBeGreaterThanOrEqual(2);
    const st = await fx.skiff.images.ImageStatus({ image: { image }, verbose: true });
    expect(st.image!.id).toMatch(/^sha256:/);

    const pod = await runPod();
    // The image's Env (a string, not a list) is dropped: no PATH.
    const c = await create(pod, image, { command: ['/bin/sleep', '1000'] });
    await fx.skiff.runtime.StartContainer({ containerId: c });
    await fx.skiff.runtime.StopContainer({ containerId: c, timeout: 2 });
    await fx.skiff.runtime.StopPodSandbox({ podSandboxId: pod.id });
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    expect((await codeOf(fx.skiff.runtime.ContainerStatus({ containerId: c }))).code).toBe(grpc.status.NOT_FOUND);
    await fx.skiff.images.RemoveImage({ image: { image } });
  });

  it('an unknown stop signal still lets the container and its pod be stopped', async () => {
    const image = await pushBusybox('test/attack-signal', { StopSignal: 'SIGNOPE' });
    await fx.skiff.images.PullImage({ image: { image } });
    const pod = await runPod();
    const c = await create(pod, image, { command: ['sleep', '1000'] });
    await fx.skiff.runtime.StartContainer({ containerId: c });
    await fx.skiff.runtime.StopContainer({ containerId: c, timeout: 2 });
    expect((await fx.skiff.runtime.ContainerStatus({ containerId: c })).status!.state).toBe('CONTAINER_EXITED');
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    await fx.skiff.images.RemoveImage({ image: { image } });
  });

  it('an image config made of millions of tiny JSON values is refused without the daemon parsing it into memory', async () => {
    // 8 MiB (the size skiff accepts) of "{}," expands to ~2.8 million objects: >100 MiB of heap per parse.
    const n = Math.floor((8 << 20) / 3) - 200;
    const img = await buildImage({ layers: [{ entries: [{ name: 'ok', data: 'fine' }] }], config: { junk: new Array(n).fill({}) } });
    expect(img.config.data.length).toBeLessThanOrEqual(8 << 20);
    await push.image('test/attack-json-bomb', 'v1', img);
    const image = `${reg}/test/attack-json-bomb:v1`;
    const pid = fx.skiff.child.pid!;
    const base = await rssOf(pid);
    const { result, peak } = await peakRss(pid, async () => {
      const pulled = codeOf(fx.skiff.images.PullImage({ image: { image } }));
      // Other RPCs keep answering meanwhile.
      const t0 = Date.now();
      await fx.skiff.runtime.Version({});
      const versionMs = Date.now() - t0;
      return { ...(await pulled), versionMs };
    });
    expect(result.status).toBe('fulfilled');
    const r = (result as PromiseFulfilledResult<{ code: grpc.status; details: string; versionMs: number }>).value;
    expect(r.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(r.details).toMatch(/JSON values/);
    expect(r.versionMs).toBeLessThan(1000);
    expect(peak - base, `RSS grew from ${base >> 20} to ${peak >> 20} MiB`).toBeLessThan(32 << 20);
  });

  it('an environment string longer than Linux passes to a process is refused at pull', async () => {
    const image = await pushBusybox('test/attack-huge-env', { Env: ['PATH=/bin', `BIG=${'x'.repeat(7 << 20)}`] });
    const r = await codeOf(fx.skiff.images.PullImage({ image: { image } }));
    expect(r.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(r.details).toMatch(/Env string of \d+ bytes, longer than Linux passes/);
  });

  it('ListImages and ImageStatus load no image config: images with big configs cost nothing per call', async () => {
    // Legal configs with 1.5 MiB of labels each.
    const images: string[] = [];
    const labels = (i: number) => Object.fromEntries(Array.from({ length: 15 }, (_, k) => [`l${k}`, `${i}`.repeat(100 << 10)]));
    for (let i = 0; i < 4; i++) {
      const image = await pushBusybox(`test/attack-big-labels-${i}`, { Labels: labels(i), User: 'app' });
      await fx.skiff.images.PullImage({ image: { image } });
      images.push(image);
    }
    const pid = fx.skiff.child.pid!;
    const base = await rssOf(pid);
    const { result, peak } = await peakRss(pid, async () => {
      for (let i = 0; i < 10; i++) {
        const list = await fx.skiff.images.ListImages({});
        expect(list.images!.filter((x) => x.username === 'app')).toHaveLength(4);
        for (const image of images) expect((await fx.skiff.images.ImageStatus({ image: { image } })).image!.username).toBe('app');
      }
    });
    expect(result.status).toBe('fulfilled');
    expect(peak - base, `RSS grew from ${base >> 20} to ${peak >> 20} MiB`).toBeLessThan(16 << 20);
    const verbose = JSON.parse((await fx.skiff.images.ImageStatus({ image: { image: images[0]! }, verbose: true })).info!.info!);
    expect(verbose.imageSpec.config.Labels.l0).toHaveLength(100 << 10);
    for (const image of images) await fx.skiff.images.RemoveImage({ image: { image } });
  });

  it('ExecSync of a command that prints 700k empty lines neither balloons the daemon nor stalls other RPCs', async () => {
    const pod = await runPod();
    const c = await create(pod, fx.image, { command: ['sleep', '1000'] });
    await fx.skiff.runtime.StartContainer({ containerId: c });
    const pid = fx.skiff.child.pid!;
    const base = await rssOf(pid);
    let slowest = 0;
    const { result, peak } = await peakRss(pid, async () => {
      const exec = fx.skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', "yes '' | head -c 700000"], timeout: 30 });
      let done = false;
      void exec.finally(() => (done = true)).catch(() => undefined);
      while (!done) {
        const t0 = Date.now();
        await fx.skiff.runtime.Version({});
        slowest = Math.max(slowest, Date.now() - t0);
        await new Promise((r) => setTimeout(r, 20));
      }
      return exec;
    });
    expect(result.status).toBe('fulfilled');
    const r = (result as PromiseFulfilledResult<Awaited<ReturnType<typeof fx.skiff.runtime.ExecSync>>>).value;
    expect(Buffer.from(r.stdout!).length).toBe(700_000);
    expect(slowest).toBeLessThan(500);
    expect(peak - base, `RSS grew from ${base >> 20} to ${peak >> 20} MiB`).toBeLessThan(48 << 20);
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
  });

  it('symlinks in the image at the working dir and at /etc/hosts, /etc/resolv.conf, /etc/hostname lead nothing onto the host', async () => {
    const outside = fs.mkdtempSync(path.join(os.tmpdir(), 'skiff-attack-outside-'));
    fs.writeFileSync(path.join(outside, 'victim'), 'untouched');
    fs.chmodSync(outside, 0o700);
    const state = () => fs.readdirSync(outside).map((n) => { const st = fs.lstatSync(path.join(outside, n)); return `${n} ${st.mode} ${st.uid} ${st.size}`; }).concat(`. ${fs.statSync(outside).mode} ${fs.statSync(outside).uid}`);
    const before = state();
    try {
      const image = await pushBusybox('test/attack-symlinks', { WorkingDir: '/w/made/here', User: '1000' }, [
        { name: 'w', type: 'symlink', linkname: outside },
        { name: 'etc/', type: 'directory' },
        { name: 'etc/hosts', type: 'symlink', linkname: `${outside}/victim` },
        { name: 'etc/resolv.conf', type: 'symlink', linkname: `../../../../../../..${outside}/resolv` },
        { name: 'etc/hostname', type: 'symlink', linkname: `${outside}/hostname` },
      ]);
      await fx.skiff.images.PullImage({ image: { image } });
      const pod = await runPod();
      const c = await create(pod, image, { command: ['sleep', '1000'] });
      await fx.skiff.runtime.StartContainer({ containerId: c });
      const r = await fx.skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'pwd; id -u; cat /etc/hostname; grep -c localhost /etc/hosts; ls /w'], timeout: 10 });
      // The runtime resolved every symlink inside the rootfs: the pod's files are mounted there, the working dir made there.
      const [cwd, uid, hostname, hosts] = Buffer.from(r.stdout!).toString().split('\n');
      expect([cwd, uid, hostname, Number(hosts) > 0]).toEqual([`${outside}/made/here`, '1000', pod.config.hostname, true]);
      await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
      await fx.skiff.images.RemoveImage({ image: { image } });
      expect(state()).toEqual(before);
      expect(fs.readFileSync(path.join(outside, 'victim'), 'utf8')).toBe('untouched');
    } finally {
      fs.rmSync(outside, { recursive: true, force: true });
    }
  });

  it('a device node for a host disk shipped in a layer cannot be opened by an unprivileged container', async () => {
    // The host's root filesystem's block device, and /dev/mem (1:1), as nodes in the image.
    const rootDev = fs.statSync('/').dev;
    const major = Number((BigInt(rootDev) >> 8n) & 0xfffn);
    const minor = Number((BigInt(rootDev) & 0xffn) | ((BigInt(rootDev) >> 12n) & ~0xffn));
    const image = await pushBusybox('test/attack-devices', {}, [
      { name: 'disk', type: 'block-device', devmajor: major, devminor: minor, mode: 0o666 },
      { name: 'mem', type: 'character-device', devmajor: 1, devminor: 1, mode: 0o666 },
    ]);
    await fx.skiff.images.PullImage({ image: { image } });
    const pod = await runPod();
    const c = await create(pod, image, { command: ['sleep', '1000'] });
    await fx.skiff.runtime.StartContainer({ containerId: c });
    const r = await fx.skiff.runtime.ExecSync({ containerId: c, cmd: ['sh', '-c', 'ls -l /disk /mem; head -c 512 /disk | wc -c; head -c 16 /mem | wc -c; mknod /d2 b ' + `${major} ${minor}` + ' && head -c 1 /d2 | wc -c'], timeout: 10 });
    const out = Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString();
    expect(out).toMatch(/\/disk: Operation not permitted/);
    expect(out).toMatch(/\/mem: Operation not permitted/);
    expect(out).not.toMatch(/^\s*(512|16|1)\s*$/m);
    await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: pod.id });
    await fx.skiff.images.RemoveImage({ image: { image } });
  });
});
