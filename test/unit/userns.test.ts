import { describe, expect, it } from 'vitest';
import { SkiffError } from '../../src/errors.js';
import { checkContainerUserns, hostIdOf, podUserns, sharedHostIds } from '../../src/sandbox/userns.js';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { mapText, unsearchableAncestor } from '../../src/sys/idmap.js';
import { joinsUserNamespaces, probeUserNamespaces } from '../../src/oci/features.js';
import { status } from '../../src/server/runtime-status.js';
import type { Runner } from '../../src/sys/run.js';
import { buildSpec, type PodContext } from '../../src/container/spec.js';
import { ociIdMappings } from '../../src/sandbox/service.js';
import type { UserNamespace__Output } from '../../src/gen/runtime/v1/UserNamespace.js';
import type { ContainerConfig__Output } from '../../src/gen/runtime/v1/ContainerConfig.js';

const r = (hostId: number, length = 65536, containerId = 0) => ({ hostId, containerId, length });
const opts = (o: Partial<UserNamespace__Output> & { mode?: string }): UserNamespace__Output => ({ mode: 'POD', uids: [], gids: [], ...o }) as UserNamespace__Output;
const noHost = { network: false, pid: false, ipc: false };

function refusal(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(SkiffError);
    expect((err as SkiffError).kind).toBe('InvalidArgument');
    return (err as Error).message;
  }
  throw new Error('not refused');
}

describe('podUserns: what a pod may ask of its user namespace', () => {
  it('is the host user namespace without options, or with mode NODE', () => {
    expect(podUserns(null, noHost)).toBeUndefined();
    expect(podUserns(opts({ mode: 'NODE' }), noHost)).toBeUndefined();
    // NODE goes with shared host namespaces as before.
    expect(podUserns(opts({ mode: 'NODE' }), { network: true, pid: true, ipc: true })).toBeUndefined();
  });

  it('takes POD with one range each, root first, the shape the kubelet sends', () => {
    expect(podUserns(opts({ uids: [r(65536 * 3)], gids: [r(65536 * 4, 1000)] }), noHost)).toEqual({ uids: [r(196608)], gids: [r(262144, 1000)] });
  });

  it.each([
    ['mode CONTAINER', opts({ mode: 'CONTAINER', uids: [r(100000)], gids: [r(100000)] }), /mode CONTAINER is not supported/],
    ['mode TARGET', opts({ mode: 'TARGET', uids: [r(100000)], gids: [r(100000)] }), /mode TARGET is not supported/],
    ['POD without uids', opts({ gids: [r(100000)] }), /needs a uid mapping/],
    ['POD without gids', opts({ uids: [r(100000)] }), /needs a gid mapping/],
    ['two uid ranges', opts({ uids: [r(100000, 10), r(200000, 10, 10)], gids: [r(100000)] }), /2 uid mappings given/],
    ['a range not at container id 0', opts({ uids: [r(100000, 10, 1)], gids: [r(100000)] }), /must start at container id 0/],
    ['an empty range', opts({ uids: [r(100000, 0)], gids: [r(100000)] }), /length 0/],
    ["the host's root", opts({ uids: [r(100000)], gids: [r(0)] }), /gid mapping would map the host's root/],
    ["the host's users (host ids below 65536)", opts({ uids: [r(1000)], gids: [r(100000)] }), /uid mapping's host ids start at 1000, among the host's own users/],
    ["the host's groups (host ids below 65536)", opts({ uids: [r(100000)], gids: [r(65535, 1)] }), /gid mapping's host ids start at 65535,/],
    ['a range past 2^32-2', opts({ uids: [r(0xfffffffe, 2)], gids: [r(100000)] }), /goes past the largest id/],
    ['NODE with mappings', opts({ mode: 'NODE', uids: [r(100000)], gids: [r(100000)] }), /mode NODE takes no uid\/gid mappings/],
  ])('refuses %s', (_name, o, message) => {
    expect(refusal(() => podUserns(o, noHost))).toMatch(message);
  });

  it('refuses a user namespace in a pod sharing the host network, pid or ipc namespace', () => {
    const o = opts({ uids: [r(100000)], gids: [r(100000)] });
    expect(refusal(() => podUserns(o, { ...noHost, network: true }))).toMatch(/cannot share the host's network namespace$/);
    expect(refusal(() => podUserns(o, { network: false, pid: true, ipc: true }))).toMatch(/host's pid, ipc namespaces$/);
  });
});

describe('checkContainerUserns: a container joins its pod user namespace', () => {
  const pod = { uids: [r(100000)], gids: [r(100000)] };
  it('takes no options, or the pod own', () => {
    expect(() => checkContainerUserns(null, pod)).not.toThrow();
    expect(() => checkContainerUserns(opts({ uids: [r(100000)], gids: [r(100000)] }), pod)).not.toThrow();
    expect(() => checkContainerUserns(opts({ mode: 'NODE' }), undefined)).not.toThrow();
  });
  it('refuses other mappings, or NODE in a POD pod and POD in a NODE pod', () => {
    expect(refusal(() => checkContainerUserns(opts({ uids: [r(200000)], gids: [r(100000)] }), pod))).toMatch(/differ from its pod's/);
    expect(refusal(() => checkContainerUserns(opts({ mode: 'NODE' }), pod))).toMatch(/differ from its pod's/);
    expect(refusal(() => checkContainerUserns(opts({ uids: [r(100000)], gids: [r(100000)] }), undefined))).toMatch(/differ from its pod's/);
  });
});

describe('sharedHostIds: two pods are one kernel user where their host ranges meet', () => {
  const pod = (u: number, g = u, len = 65536) => ({ uids: [r(u, len)], gids: [r(g, len)] });
  it('finds uid or gid ranges that meet, and none for ranges side by side', () => {
    expect(sharedHostIds(pod(65536), pod(65536 * 2))).toBeUndefined();
    expect(sharedHostIds(pod(65536), pod(65536 * 2 - 1))).toBe('uid');
    expect(sharedHostIds(pod(100000, 300000), pod(500000, 300000, 1))).toBe('gid');
    expect(sharedHostIds(pod(100000, 300000, 10), pod(100009, 400000, 1))).toBe('uid');
    expect(sharedHostIds(pod(100000, 300000, 10), pod(100010, 400000, 1))).toBeUndefined();
  });
});

describe('mappings', () => {
  it('finds host ids, and none outside the range', () => {
    expect(hostIdOf([r(100000)], 0)).toBe(100000);
    expect(hostIdOf([r(100000)], 65535)).toBe(165535);
    expect(hostIdOf([r(100000)], 65536)).toBe(-1);
  });
  it('writes /proc uid_map lines inside-first', () => {
    expect(mapText([r(100000)])).toBe('0 100000 65536\n');
  });
  it('puts the pod user namespace and its mappings in a container spec', () => {
    const pod: PodContext = {
      sandboxId: 's',
      netns: '/n',
      hostPid: false,
      infraPid: 42,
      hostsFile: '/h',
      resolvFile: '/r',
      hostnameFile: '/hn',
      cgroupParent: '/skiff',
      sysctls: {},
      userns: { path: '/pod/ns/user', ...ociIdMappings({ uids: [r(100000)], gids: [r(300000, 10)] }) },
    };
    const config = { metadata: { name: 'c' }, command: ['true'], args: [], envs: [], mounts: [], devices: [], annotations: {}, linux: null, tty: false, workingDir: '' } as unknown as ContainerConfig__Output;
    const spec = buildSpec({ id: 'x', image: { config: {} }, config, pod, rootfs: '/r', user: { uid: 0, gid: 0, additionalGids: [] }, oomScoreAdjFloor: 0 });
    expect(spec.linux.namespaces).toContainEqual({ type: 'user', path: '/pod/ns/user' });
    expect(spec.linux.namespaces).toContainEqual({ type: 'pid', path: '/proc/42/ns/pid' });
    expect(spec.linux.uidMappings).toEqual([{ containerID: 0, hostID: 100000, size: 65536 }]);
    expect(spec.linux.gidMappings).toEqual([{ containerID: 0, hostID: 300000, size: 10 }]);
    const plain = buildSpec({ id: 'x', image: { config: {} }, config, pod: { ...pod, userns: undefined }, rootfs: '/r', user: { uid: 0, gid: 0, additionalGids: [] }, oomScoreAdjFloor: 0 });
    expect(plain.linux.namespaces.map((n) => n.type)).not.toContain('user');
    expect(plain.linux).not.toHaveProperty('uidMappings');
  });
  it('refuses mounts that ask for their own id mappings', () => {
    const config = { metadata: { name: 'c' }, command: ['true'], args: [], envs: [], devices: [], annotations: {}, linux: null, tty: false, workingDir: '', mounts: [{ containerPath: '/d', hostPath: '/h', readonly: false, propagation: 'PROPAGATION_PRIVATE', uidMappings: [{ hostId: 1, containerId: 0, length: 1 }], gidMappings: [] }] } as unknown as ContainerConfig__Output;
    const pod: PodContext = { sandboxId: 's', hostPid: false, hostsFile: '/h', resolvFile: '/r', hostnameFile: '/hn', cgroupParent: '/skiff', sysctls: {} };
    expect(refusal(() => buildSpec({ id: 'x', image: { config: {} }, config, pod, rootfs: '/r', user: { uid: 0, gid: 0, additionalGids: [] }, oomScoreAdjFloor: 0 }))).toMatch(/uid\/gid mappings on a mount are not supported/);
  });
});

describe('Status and the start-up probes', () => {
  it('reports userNamespaces per handler as probed', async () => {
    const handler = status({
      runtime: () => ({ ready: true }),
      network: () => ({ ready: true }),
      handlers: () => ['runc', 'crun'],
      features: () => ({ recursiveReadOnlyMounts: true }),
      userNamespaces: (n) => n === 'runc',
      info: () => ({}),
    });
    const r = await handler({ verbose: false });
    expect(r.runtimeHandlers?.map((h) => [h.name, h.features?.userNamespaces])).toEqual([
      ['runc', true],
      ['crun', false],
    ]);
  });

  it('lists the default handler a second time under the name "", as containerd does, for pods that name none', async () => {
    const handler = status({
      runtime: () => ({ ready: true }),
      network: () => ({ ready: true }),
      handlers: () => ['runc', 'crun'],
      defaultHandler: 'crun',
      features: (n) => ({ recursiveReadOnlyMounts: n === 'runc' }),
      userNamespaces: (n) => n === 'crun',
      info: () => ({}),
    });
    const r = await handler({ verbose: false });
    expect(r.runtimeHandlers?.map((h) => [h.name, h.features?.userNamespaces, h.features?.recursiveReadOnlyMounts])).toEqual([
      ['runc', false, true],
      ['crun', true, false],
      ['', true, false],
    ]);
  });

  it('needs the runtime to list the user namespace among its features', async () => {
    expect(joinsUserNamespaces(JSON.stringify({ linux: { namespaces: ['mount', 'user', 'pid'] } }))).toBe(true);
    expect(joinsUserNamespaces(JSON.stringify({ linux: { namespaces: ['mount', 'pid'] } }))).toBe(false);
    expect(joinsUserNamespaces('unknown command features')).toBe(false);
    const failing: Runner = async () => ({ code: 1, signal: null, stdout: '', stderr: 'unknown command features', timedOut: false });
    expect(await probeUserNamespaces('/usr/bin/crun', failing)).toEqual({ ok: false, reason: expect.stringMatching(/no features command/) });
  });

  it('finds the first directory others cannot pass through', async () => {
    const base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-userns-unit-'));
    try {
      await fs.mkdir(path.join(base, 'a', 'b'), { recursive: true });
      await fs.chmod(base, 0o711);
      await fs.chmod(path.join(base, 'a'), 0o700);
      expect(await unsearchableAncestor(path.join(base, 'a', 'b'))).toBe(path.join(base, 'a'));
      await fs.chmod(path.join(base, 'a'), 0o711);
      expect(await unsearchableAncestor(path.join(base, 'a', 'b'))).toBeUndefined();
    } finally {
      await fs.rm(base, { recursive: true, force: true });
    }
  });
});
