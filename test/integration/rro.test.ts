/**
 * Recursive read-only mounts through the real daemon and runc: a host
 * directory with a submount (a tmpfs mounted inside it), given to containers
 * read-only and recursively read-only. Only the recursive one keeps the
 * submount from being written; the CRI's preconditions are refused with
 * InvalidArgument; and Status tells the kubelet the handler can do it only
 * because runc itself lists the `rro` mount option.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { codeOf, grpc } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { mountsUnder, startPodFixture, type PodFixture } from '../helpers/pods.js';

let seq = 0;

function sh(cmd: string, args: string[]) {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

describe.skipIf(!isRoot)('recursive read-only mounts', () => {
  let fx: PodFixture;
  let host: string;
  let pod: { id: string; config: Record<string, unknown> };

  beforeAll(async () => {
    host = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-rro-'));
    await fs.mkdir(path.join(host, 'data', 'sub'), { recursive: true });
    sh('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'skiff-rro-sub', path.join(host, 'data', 'sub')]);
    fx = await startPodFixture(inject('registryHost'), 'test/busybox-rro');
    const n = `rpod${++seq}`;
    const config = { metadata: { name: n, namespace: 'test', uid: `uid-${n}`, attempt: 0 }, hostname: n, logDirectory: path.join(fx.dirs.base, 'logs', n), linux: {} };
    const { podSandboxId } = await fx.skiff.runtime.RunPodSandbox({ config });
    pod = { id: podSandboxId!, config };
  });

  afterAll(async () => {
    const leaks = fx ? await fx.cleanup() : { mounts: [], processes: [] };
    if (host) {
      for (const m of mountsUnder(host).reverse()) spawnSync('umount', ['-l', m]);
      await fs.rm(host, { recursive: true, force: true });
    }
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  function create(mount: Record<string, unknown>) {
    const name = `c${++seq}`;
    return fx.skiff.runtime.CreateContainer({
      podSandboxId: pod.id,
      config: { metadata: { name }, image: { image: fx.image }, command: ['sleep', '1000'], logPath: `${name}.log`, mounts: [{ containerPath: '/data', hostPath: path.join(host, 'data'), ...mount }], linux: {} },
      sandboxConfig: pod.config,
    });
  }

  async function probe(mount: Record<string, unknown>): Promise<string> {
    const { containerId } = await create(mount);
    await fx.skiff.runtime.StartContainer({ containerId: containerId! });
    const r = await fx.skiff.runtime.ExecSync({ containerId: containerId!, cmd: ['sh', '-c', 'touch /data/top 2>&1; echo top=$?; touch /data/sub/file 2>&1; echo sub=$?; rm -f /data/sub/file'], timeout: 10 });
    return Buffer.from(r.stdout!).toString() + Buffer.from(r.stderr!).toString();
  }

  it('reports recursiveReadOnlyMounts for runc, which lists the rro mount option', async () => {
    const st = await fx.skiff.runtime.Status({});
    const runc = st.runtimeHandlers?.find((h) => h.name === 'runc');
    const listed = JSON.parse(sh('runc', ['features'])).mountOptions.includes('rro');
    expect(runc?.features?.recursiveReadOnlyMounts).toBe(listed);
    expect(listed).toBe(true);
  });

  it('a plain readonly mount leaves its submount writable; a recursive read-only one does not', async () => {
    const plain = await probe({ readonly: true });
    expect(plain).toMatch(/Read-only file system\ntop=1\n/);
    expect(plain).toMatch(/\nsub=0\n$/);
    const recursive = await probe({ readonly: true, recursiveReadOnly: true });
    expect(recursive).toMatch(/Read-only file system\ntop=1\n/);
    expect(recursive).toMatch(/\/data\/sub\/file: Read-only file system\nsub=1\n$/);
    // The host's submount is untouched: still writable from outside.
    await fs.writeFile(path.join(host, 'data', 'sub', 'from-host'), 'x');
    await fs.rm(path.join(host, 'data', 'sub', 'from-host'));
  });

  it('refuses recursive_read_only without readonly, or with propagation other than private', async () => {
    const noRo = await codeOf(create({ readonly: false, recursiveReadOnly: true }));
    expect(noRo.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(noRo.details).toMatch(/recursive_read_only requires readonly/);
    for (const propagation of ['PROPAGATION_HOST_TO_CONTAINER', 'PROPAGATION_BIDIRECTIONAL']) {
      const bad = await codeOf(create({ readonly: true, recursiveReadOnly: true, propagation }));
      expect(bad.code, propagation).toBe(grpc.status.INVALID_ARGUMENT);
      expect(bad.details).toMatch(new RegExp(`requires PROPAGATION_PRIVATE, not ${propagation}`));
    }
    // Nothing of the refused containers is left.
    const left = (await fx.skiff.runtime.ListContainers({ filter: { podSandboxId: pod.id } })).containers ?? [];
    expect(left.every((c) => String(c.state) === 'CONTAINER_RUNNING')).toBe(true);
  });
});
