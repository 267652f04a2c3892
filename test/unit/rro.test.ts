/**
 * Recursive read-only mounts in the OCI spec (the CRI's preconditions, the
 * `rro` option only where the handler applies it), and the handler feature
 * read from a runtime's features document.
 */
import { describe, expect, it } from 'vitest';
import { featuresFromDocument, probeFeatures } from '../../src/oci/features.js';
import { buildSpec, type PodContext } from '../../src/container/spec.js';
import { status } from '../../src/server/runtime-status.js';
import type { ContainerConfig__Output } from '../../src/gen/runtime/v1/ContainerConfig.js';
import type { Runner } from '../../src/sys/run.js';

const pod: PodContext = { sandboxId: 'sb', hostPid: false, hostsFile: '/sb/hosts', resolvFile: '/sb/resolv', hostnameFile: '/sb/hostname', cgroupParent: '/kubepods', sysctls: {} };

function spec(mount: Record<string, unknown>, supported = true) {
  const config = {
    metadata: { name: 'c', attempt: 0 },
    command: ['sh'],
    args: [],
    envs: [],
    mounts: [{ containerPath: '/data', hostPath: '/host/data', readonly: false, recursiveReadOnly: false, propagation: 'PROPAGATION_PRIVATE', ...mount }],
    devices: [],
    linux: null,
  } as unknown as ContainerConfig__Output;
  const s = buildSpec({ id: 'x', image: { config: {} }, config, pod, rootfs: '/r', user: { uid: 0, gid: 0, additionalGids: [] }, oomScoreAdjFloor: 0, recursiveReadOnlyMounts: supported });
  return s.mounts.find((m) => m.destination === '/data')!.options;
}

describe('recursive read-only mounts in the spec', () => {
  it('adds rro to a readonly, private mount that asks for it, and only then', () => {
    expect(spec({ readonly: true, recursiveReadOnly: true })).toEqual(['rbind', 'rprivate', 'ro', 'rro']);
    expect(spec({ readonly: true })).toEqual(['rbind', 'rprivate', 'ro']);
    expect(spec({})).toEqual(['rbind', 'rprivate', 'rw']);
  });

  it('refuses recursive_read_only without readonly, with non-private propagation, or on a handler without rro', () => {
    expect(() => spec({ readonly: false, recursiveReadOnly: true })).toThrow(/recursive_read_only requires readonly/);
    expect(() => spec({ readonly: true, recursiveReadOnly: true, propagation: 'PROPAGATION_HOST_TO_CONTAINER' })).toThrow(/requires PROPAGATION_PRIVATE/);
    expect(() => spec({ readonly: true, recursiveReadOnly: true, propagation: 'PROPAGATION_BIDIRECTIONAL' })).toThrow(/requires PROPAGATION_PRIVATE/);
    expect(() => spec({ readonly: true, recursiveReadOnly: true }, false)).toThrow(/not supported by this runtime handler/);
    for (const f of [() => spec({ readonly: false, recursiveReadOnly: true }), () => spec({ readonly: true, recursiveReadOnly: true }, false)]) {
      expect(f).toThrow(expect.objectContaining({ kind: 'InvalidArgument' }));
    }
  });
});

describe('handler features', () => {
  it('reads rro from the mount options a runtime lists', () => {
    expect(featuresFromDocument(JSON.stringify({ ociVersionMax: '1.0.2-dev', mountOptions: ['ro', 'rbind', 'rro'] }))).toEqual({ recursiveReadOnlyMounts: true });
    expect(featuresFromDocument(JSON.stringify({ mountOptions: ['ro', 'rbind', 'rnosuid'] }))).toEqual({ recursiveReadOnlyMounts: false });
    expect(featuresFromDocument('unknown command features')).toEqual({ recursiveReadOnlyMounts: false });
    expect(featuresFromDocument('{"mountOptions":"rro"}')).toEqual({ recursiveReadOnlyMounts: false });
  });

  it('treats a runtime without a features command (crun 1.8) as lacking it', async () => {
    const failing: Runner = async () => ({ code: 1, signal: null, stdout: '', stderr: 'unknown command features', timedOut: false });
    expect(await probeFeatures('/usr/bin/crun', failing)).toEqual({ recursiveReadOnlyMounts: false });
    const missing: Runner = async () => {
      throw new Error('ENOENT');
    };
    expect(await probeFeatures('/nope', missing)).toEqual({ recursiveReadOnlyMounts: false });
  });

  it('reports each handler\'s feature in Status', async () => {
    const handler = status({
      runtime: () => ({ ready: true }),
      network: () => ({ ready: true }),
      handlers: () => ['runc', 'crun'],
      features: (n) => ({ recursiveReadOnlyMounts: n === 'runc' }),
      info: () => ({}),
    });
    const r = await handler({ verbose: false });
    expect(r.runtimeHandlers).toEqual([
      { name: 'runc', features: { recursiveReadOnlyMounts: true, userNamespaces: false } },
      { name: 'crun', features: { recursiveReadOnlyMounts: false, userNamespaces: false } },
    ]);
  });
});
