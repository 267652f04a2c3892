/**
 * The agent's persistentVolumeClaim and ephemeral volumes: the claim's bound
 * PV's host directory, a pod waiting (an error the worker retries) while the
 * claim is unbound, and a PV naming a path no PV may (stored before the API
 * refused it) never mounted.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { PodContext } from '../../src/kubelet-lite/model.js';
import { ObjectStore } from '../../src/kubelet-lite/store.js';
import { HostVolumeManager } from '../../src/kubelet-lite/volumes.js';

let root = '';
beforeEach(async () => {
  root = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-claimvol-'));
});
afterEach(() => fs.rm(root, { recursive: true, force: true }));

function setup(objects: Array<{ kind: string; namespace: string; name: string; uid: string; object: Record<string, unknown> }>) {
  const store = new ObjectStore({ nodeName: 'n1' });
  store.replaceFile('api', { objects: objects.map((o) => ({ apiVersion: 'v1', ...o, source: { file: 'api', document: 0, line: 0 } })), problems: [] });
  const pod: Pod = { metadata: { name: 'p', namespace: 'ns' }, spec: { containers: [{ name: 'c', image: 'i' }], volumes: [{ name: 'data', persistentVolumeClaim: { claimName: 'c1' } }, { name: 'tmp', ephemeral: { volumeClaimTemplate: { spec: {} } } }] } };
  const ctx: PodContext = { pod, uid: 'pod-uid', nodeName: 'n1', hostIP: '10.0.0.1', clusterDomain: 'cluster.local', clusterDNS: [], hostResolvConf: '', podDir: path.join(root, 'pods', 'pod-uid'), objects: store };
  return { ctx, vm: new HostVolumeManager({ rootDir: root, hostsFile: '/etc/hosts', node: { milliCpu: 1000, memoryBytes: 1 << 30 } }) };
}
const claim = (name: string, uid: string, volumeName?: string, owner?: string) => ({ kind: 'PersistentVolumeClaim', namespace: 'ns', name, uid, object: { metadata: { name, namespace: 'ns', ...(owner ? { ownerReferences: [{ uid: owner }] } : {}) }, spec: volumeName ? { volumeName } : {} } });
const pv = (name: string, p: string, claimName: string, claimUid: string) => ({ kind: 'PersistentVolume', namespace: '', name, uid: `pv-${name}`, object: { metadata: { name }, spec: { hostPath: { path: p, type: 'DirectoryOrCreate' }, claimRef: { namespace: 'ns', name: claimName, uid: claimUid } } } });

describe('claim volumes', () => {
  it('mounts the bound PV\'s directory for a claim and for an ephemeral volume\'s <pod>-<volume> claim the pod owns', async () => {
    const a = path.join(root, 'volumes', 'pv-a');
    const b = path.join(root, 'volumes', 'pv-b');
    const { ctx, vm } = setup([claim('c1', 'cu1', 'pv-a'), pv('pv-a', a, 'c1', 'cu1'), claim('p-tmp', 'cu2', 'pv-b', 'pod-uid'), pv('pv-b', b, 'p-tmp', 'cu2')]);
    const paths = await vm.setUp(ctx);
    expect(paths.get('data')).toBe(a);
    expect(paths.get('tmp')).toBe(b);
  });

  it('waits (an error naming why) for a claim not found, not bound, or bound to a PV that names another claim; refuses a claim the pod does not own', async () => {
    await expect(setup([]).vm.setUp(setup([]).ctx)).rejects.toThrow(/persistentvolumeclaim "c1" not found/);
    let s = setup([claim('c1', 'cu1')]);
    await expect(s.vm.setUp(s.ctx)).rejects.toThrow(/persistentvolumeclaim "c1" is not bound yet/);
    s = setup([claim('c1', 'cu1', 'pv-a'), pv('pv-a', path.join(root, 'volumes', 'pv-a'), 'c1', 'someone-else')]);
    await expect(s.vm.setUp(s.ctx)).rejects.toThrow(/persistentvolume "pv-a" is not bound to claim "ns\/c1" yet/);
    s = setup([claim('c1', 'cu1', 'pv-a'), pv('pv-a', path.join(root, 'volumes', 'pv-a'), 'c1', 'cu1'), claim('p-tmp', 'cu2', 'pv-b')]);
    await expect(s.vm.setUp(s.ctx)).rejects.toThrow(/PVC ns\/p-tmp was not created for pod ns\/p \(pod is not owner\)/);
  });

  it('never mounts a PV on /, /etc or the node\'s root dir, even one stored before the API refused them', async () => {
    for (const p of ['/', '/etc', root, path.join(root, 'pods'), path.join(root, 'volumes', 'someone-else')]) {
      const s = setup([claim('c1', 'cu1', 'pv-a'), pv('pv-a', p, 'c1', 'cu1')]);
      await expect(s.vm.setUp(s.ctx)).rejects.toThrow(/MountVolume.SetUp failed for volume "data" : persistentvolume "pv-a": path .* may not/);
    }
  });

  it("reads a file's claim as the node's API binds it: the API's copy stands in for the file's in get, not in the view", async () => {
    const a = path.join(root, 'volumes', 'pv-a');
    const store = new ObjectStore({ nodeName: 'n1' });
    const file = (volumeName?: string) => ({ apiVersion: 'v1', ...claim('c1', volumeName ? 'api-uid' : 'file-uid', volumeName), source: { file: '/m/db.yaml', document: 0, line: 1 } });
    store.replaceFile('/m/db.yaml', { objects: [file()], problems: [] });
    const { ctx, vm } = setup([]);
    ctx.objects = store;
    await expect(vm.setUp(ctx)).rejects.toThrow(/"c1" is not bound yet/);
    const changes: string[] = [];
    store.subscribe((cs) => changes.push(...cs.map((c) => `${c.type} ${c.object.source.file}`)));
    store.replaceFile('(the node API)', { objects: [{ ...file('pv-a'), source: { file: '(the node API)', document: 0, line: 0, amends: '/m/db.yaml' } }, { apiVersion: 'v1', ...pv('pv-a', a, 'c1', 'api-uid'), source: { file: '(the node API)', document: 0, line: 0 } }], problems: [] });
    expect((await vm.setUp({ ...ctx, pod: { ...ctx.pod, spec: { ...ctx.pod.spec!, volumes: [ctx.pod.spec!.volumes![0]!] } } })).get('data')).toBe(a);
    // The view, its changes and its problems are still the file's: no duplicate, no change for the stand-in.
    expect(store.list('PersistentVolumeClaim').map((o) => o.source.file)).toEqual(['/m/db.yaml']);
    expect(store.problems()).toEqual([]);
    expect(changes).toEqual(['added (the node API)']);
  });
});
