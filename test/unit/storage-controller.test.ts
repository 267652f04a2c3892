/**
 * The storage controller over a real store and a temporary root dir: the
 * default class, provisioning for a consumer, refusal of a claim larger
 * than the disk, reclaim Delete and Retain, pvc-protection, and the
 * hostile cases: a PV forged to look provisioned but naming another path,
 * links and mounts a container leaves in its volume.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject, Obj } from '../../src/api/types.js';
import { silentLogger } from '../../src/log.js';
import { StorageController } from '../../src/node/storage.js';
import { makeVolumeDir, removeVolumeDir, volumeDirName } from '../../src/node/volume-dirs.js';
import { isRoot } from '../helpers/env.js';

let base = '';
let root = '';
beforeEach(async () => {
  base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-storage-'));
  root = path.join(base, 'root');
});
afterEach(async () => {
  spawnSync('umount', ['-R', '-l', path.join(root, 'volumes')], { stdio: 'ignore' });
  await fs.rm(base, { recursive: true, force: true });
});

const exists = (p: string) => fs.lstat(p).then(() => true, () => false);

async function setup(capacity = 1 << 30) {
  const store = new Store({ kinds: nodeKinds('n1', undefined, { rootDir: root }) });
  const client = localClient(store);
  const ctl = new StorageController({ client, nodeName: 'n1', rootDir: root, log: silentLogger, capacity: async () => capacity, everyMs: 60_000 });
  await ctl.start();
  const sync = async () => {
    for (let i = 0; i < 4; i++) {
      await ctl.idle();
      await ctl.sync();
    }
  };
  const get = (r: string, ns: string, name: string) => client.get(r, ns, name);
  const events = async () => (await client.list('events')).items.map((e) => `${String(e.reason)}: ${String(e.message)}`);
  return { store, client, ctl, sync, get, events };
}

const claim = (name: string, spec: Obj = {}) => ({ apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Mi' } }, ...spec } });
const pod = (name: string, claimName: string) => ({ apiVersion: 'v1', kind: 'Pod', metadata: { name }, spec: { nodeName: 'n1', containers: [{ name: 'c', image: 'busybox' }], volumes: [{ name: 'data', persistentVolumeClaim: { claimName } }] } });
const spec = (o: ApiObject) => o.spec as Obj;
const status = (o: ApiObject) => (o.status ?? {}) as Obj;

describe('the storage controller', () => {
  it('waits for a consumer, provisions <root>/volumes/pvc-<uid> 0777, binds both, and reclaim Delete removes it with the claim', async () => {
    const { client, ctl, sync, get, events } = await setup();
    try {
      expect((await get('storageclasses.storage.k8s.io', '', 'local-path')).volumeBindingMode).toBe('WaitForFirstConsumer');
      const c = await client.create('persistentvolumeclaims', 'default', claim('data'));
      expect(spec(c).storageClassName).toBe('local-path');
      await sync();
      expect(status(await get('persistentvolumeclaims', 'default', 'data')).phase).toBe('Pending');
      expect(await events()).toContain('WaitForFirstConsumer: waiting for first consumer to be created before binding');
      await client.create('pods', 'default', pod('user', 'data'));
      await sync();
      const bound = await get('persistentvolumeclaims', 'default', 'data');
      const pvName = `pvc-${c.metadata.uid}`;
      expect(spec(bound).volumeName).toBe(pvName);
      expect(status(bound)).toMatchObject({ phase: 'Bound', capacity: { storage: '1Mi' }, accessModes: ['ReadWriteOnce'] });
      expect(bound.metadata.annotations).toMatchObject({ 'pv.kubernetes.io/bind-completed': 'yes', 'volume.kubernetes.io/selected-node': 'n1' });
      const pv = await get('persistentvolumes', '', pvName);
      expect(status(pv).phase).toBe('Bound');
      expect(spec(pv)).toMatchObject({ persistentVolumeReclaimPolicy: 'Delete', hostPath: { path: path.join(root, 'volumes', pvName), type: 'DirectoryOrCreate' } });
      const dir = path.join(root, 'volumes', pvName);
      expect((await fs.stat(dir)).mode & 0o777).toBe(0o777);
      await fs.writeFile(path.join(dir, 'f'), 'x');

      // pvc-protection: the claim waits for its pod.
      await client.delete('persistentvolumeclaims', 'default', 'data');
      await sync();
      expect((await get('persistentvolumeclaims', 'default', 'data')).metadata.deletionTimestamp).toBeDefined();
      expect(await exists(dir)).toBe(true);
      await client.delete('pods', 'default', 'user', { gracePeriodSeconds: 0 });
      await sync();
      await expect(get('persistentvolumeclaims', 'default', 'data')).rejects.toThrow(/not found/);
      await expect(get('persistentvolumes', '', pvName)).rejects.toThrow(/not found/);
      expect(await exists(dir)).toBe(false);
    } finally {
      await ctl.stop();
    }
  });

  it('refuses to provision a claim larger than the disk (1Ei), with an event; it stays Pending and nothing is made', async () => {
    const { client, ctl, sync, get, events } = await setup(10 << 20);
    try {
      await client.create('storageclasses.storage.k8s.io', '', { apiVersion: 'storage.k8s.io/v1', kind: 'StorageClass', metadata: { name: 'now' }, provisioner: 'skiff.io/local-path', volumeBindingMode: 'Immediate' });
      await client.create('persistentvolumeclaims', 'default', claim('huge', { storageClassName: 'now', resources: { requests: { storage: '1Ei' } } }));
      await sync();
      expect(status(await get('persistentvolumeclaims', 'default', 'huge')).phase).toBe('Pending');
      expect(await events()).toContain('ProvisioningFailed: failed to provision volume with StorageClass "now": requested 1Ei but the node\'s volume filesystem holds 10485760 bytes in all');
      expect((await client.list('persistentvolumes')).items).toEqual([]);
      expect(await exists(path.join(root, 'volumes'))).toBe(false);
    } finally {
      await ctl.stop();
    }
  });

  it('never deletes the path a forged "provisioned" PV names; Retain keeps a static volume Released', async () => {
    const { client, ctl, sync, get } = await setup();
    try {
      const victim = path.join(base, 'victim');
      await fs.mkdir(victim);
      await fs.writeFile(path.join(victim, 'precious'), 'x');
      await client.create('persistentvolumes', '', { apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name: 'forged', annotations: { 'pv.kubernetes.io/provisioned-by': 'skiff.io/local-path' } }, spec: { capacity: { storage: '1Gi' }, accessModes: ['ReadWriteOnce'], persistentVolumeReclaimPolicy: 'Delete', storageClassName: 'x', hostPath: { path: victim } } });
      await client.create('persistentvolumes', '', { apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name: 'kept' }, spec: { capacity: { storage: '1Gi' }, accessModes: ['ReadWriteOnce'], storageClassName: 'y', hostPath: { path: victim } } });
      await client.create('persistentvolumeclaims', 'default', claim('a', { storageClassName: 'x' }));
      await client.create('persistentvolumeclaims', 'default', claim('b', { storageClassName: 'y' }));
      await sync();
      expect(status(await get('persistentvolumes', '', 'forged')).phase).toBe('Bound');
      expect(status(await get('persistentvolumes', '', 'kept')).phase).toBe('Bound');
      await client.delete('persistentvolumeclaims', 'default', 'a');
      await client.delete('persistentvolumeclaims', 'default', 'b');
      await sync();
      const forged = await get('persistentvolumes', '', 'forged');
      expect(status(forged).phase).toBe('Failed');
      expect(String(status(forged).message)).toMatch(/is not its directory .*: not deleted/);
      expect(status(await get('persistentvolumes', '', 'kept')).phase).toBe('Released');
      expect(await fs.readFile(path.join(victim, 'precious'), 'utf8')).toBe('x');
    } finally {
      await ctl.stop();
    }
  });
});

describe('volume directories', () => {
  it('removes links a container planted, never their targets', async () => {
    const victim = path.join(base, 'victim');
    await fs.mkdir(victim);
    await fs.writeFile(path.join(victim, 'precious'), 'x');
    const dir = await makeVolumeDir(root, 'pvc-1');
    await fs.symlink(victim, path.join(dir, 'to-victim'));
    await fs.symlink('/', path.join(dir, 'to-root'));
    await fs.mkdir(path.join(dir, 'a', 'b'), { recursive: true });
    await fs.symlink(path.join(victim, 'precious'), path.join(dir, 'a', 'b', 'file'));
    await fs.writeFile(path.join(dir, 'a', 'data'), 'd');
    await removeVolumeDir(root, 'pvc-1');
    expect(await exists(dir)).toBe(false);
    expect(await fs.readFile(path.join(victim, 'precious'), 'utf8')).toBe('x');
    // Gone already: done.
    await removeVolumeDir(root, 'pvc-1');
  });

  it('does not follow <root>/volumes itself when it is a link, and takes no name that is a path', async () => {
    const victim = path.join(base, 'victim');
    await fs.mkdir(path.join(victim, 'pvc-2'), { recursive: true });
    await fs.writeFile(path.join(victim, 'pvc-2', 'precious'), 'x');
    await fs.mkdir(root, { recursive: true });
    await fs.symlink(victim, path.join(root, 'volumes'));
    await expect(removeVolumeDir(root, 'pvc-2')).rejects.toThrow();
    await expect(makeVolumeDir(root, 'pvc-3')).rejects.toThrow(/not a directory of its own/);
    expect(await fs.readFile(path.join(victim, 'pvc-2', 'precious'), 'utf8')).toBe('x');
    expect(() => volumeDirName('../etc')).toThrow(/is not a volume name/);
    expect(() => volumeDirName('a/b')).toThrow(/is not a volume name/);
  });

  it.skipIf(!isRoot)('stops at a mount inside the volume instead of emptying what it shows', async () => {
    const victim = path.join(base, 'victim');
    await fs.mkdir(victim);
    await fs.writeFile(path.join(victim, 'precious'), 'x');
    const dir = await makeVolumeDir(root, 'pvc-4');
    await fs.mkdir(path.join(dir, 'mnt'));
    expect(spawnSync('mount', ['--bind', victim, path.join(dir, 'mnt')]).status).toBe(0);
    try {
      await expect(removeVolumeDir(root, 'pvc-4')).rejects.toThrow(/mount point inside the volume/);
      expect(await fs.readFile(path.join(victim, 'precious'), 'utf8')).toBe('x');
    } finally {
      spawnSync('umount', [path.join(dir, 'mnt')]);
    }
  });
});
