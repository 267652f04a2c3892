/**
 * The storage kinds of the node's API through its store: PersistentVolumeClaim,
 * PersistentVolume and StorageClass defaults, validation with the API
 * server's messages, what may change after creation, the DefaultStorageClass
 * admission, the tables `kubectl get pvc,pv,sc` print, the host paths a PV
 * may not name, and a protobuf PV body's inline source.
 */
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { toTable } from '../../src/api/table.js';
import type { ApiObject, Kind, Obj } from '../../src/api/types.js';
import { decodeProtobuf } from '../../src/api/protobuf.js';

const T0 = Date.parse('2026-01-01T00:00:00Z');
const ROOT = '/var/lib/skiff-test';

function setup(now = () => T0) {
  const store = new Store({ kinds: nodeKinds('node-a', undefined, { rootDir: ROOT }), now });
  const kind = (resource: string): Kind => store.kind(resource)!;
  return { store, kind, pvcs: kind('persistentvolumeclaims'), pvs: kind('persistentvolumes'), scs: kind('storageclasses.storage.k8s.io') };
}

function error(f: () => unknown): string {
  try {
    f();
  } catch (err) {
    if (err instanceof ApiError) return `${err.code} ${err.message}`;
    throw err;
  }
  return 'no error';
}

const claim = (name: string, spec: Obj = {}) => ({ apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } }, ...spec } });
const volume = (name: string, spec: Obj = {}) => ({ apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name }, spec: { accessModes: ['ReadWriteOnce'], capacity: { storage: '5Gi' }, hostPath: { path: '/srv/data' }, ...spec } });
const sc = (name: string, extra: Obj = {}) => ({ apiVersion: 'storage.k8s.io/v1', kind: 'StorageClass', metadata: { name }, provisioner: 'example.com/disk', ...extra });
const spec = (o: ApiObject) => o.spec as Obj;

function table(k: Kind, o: ApiObject, now: number) {
  const t = toTable(k, [o], {}, 'None', now) as { columnDefinitions: Array<{ name: string; priority: number }>; rows: Array<{ cells: unknown[] }> };
  return { head: t.columnDefinitions.map((c) => (c.priority ? `(${c.name})` : c.name)).join(' '), row: t.rows[0]!.cells };
}

describe('PersistentVolumeClaim', () => {
  it('defaults volumeMode Filesystem and phase Pending; needs access modes and a positive storage request', () => {
    const { store, pvcs } = setup();
    const c = store.create(pvcs, 'default', claim('data'));
    expect(spec(c).volumeMode).toBe('Filesystem');
    expect(c.status).toEqual({ phase: 'Pending' });
    expect(error(() => store.create(pvcs, 'default', claim('a', { accessModes: [] })))).toBe('422 PersistentVolumeClaim "a" is invalid: spec.accessModes: Required value: at least 1 access mode is required');
    expect(error(() => store.create(pvcs, 'default', claim('b', { accessModes: ['ReadWriteSometimes'] })))).toMatch(/spec\.accessModes: Unsupported value: "ReadWriteSometimes": supported values: "ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"/);
    expect(error(() => store.create(pvcs, 'default', claim('c', { accessModes: ['ReadWriteOncePod', 'ReadOnlyMany'] })))).toMatch(/may not use ReadWriteOncePod with other access modes/);
    expect(error(() => store.create(pvcs, 'default', claim('d', { resources: {} })))).toBe('422 PersistentVolumeClaim "d" is invalid: spec.resources[storage]: Required value');
    expect(error(() => store.create(pvcs, 'default', claim('e', { resources: { requests: { storage: 'lots' } } })))).toMatch(/spec\.resources\[storage\]: Invalid value: "lots": quantities must match/);
    expect(error(() => store.create(pvcs, 'default', claim('f', { resources: { requests: { storage: '0' } } })))).toMatch(/must be greater than zero/);
    expect(error(() => store.create(pvcs, 'default', claim('g', { volumeMode: 'Tape' })))).toMatch(/spec\.volumeMode: Unsupported value: "Tape"/);
    expect(error(() => store.create(pvcs, 'default', claim('h', { storageClassName: 'Not_A_Name' })))).toMatch(/spec\.storageClassName: Invalid value/);
    expect(error(() => store.create(pvcs, 'default', claim('i', { volumeName: '../../etc' })))).toMatch(/spec\.volumeName: Invalid value: "\.\.\/\.\.\/etc"/);
    // 1Ei is a valid quantity: the claim is taken (the provisioner says why it cannot make it).
    expect(store.create(pvcs, 'default', claim('huge', { resources: { requests: { storage: '1Ei' } } })).metadata.name).toBe('huge');
  });

  it('keeps its spec but for the volume named once, a class given once, and a bound claim growing', () => {
    const { store, pvcs } = setup();
    const c = store.create(pvcs, 'default', claim('data'));
    const change = (f: (s: Obj) => void) => () =>
      store.patch(pvcs, 'default', 'data', (cur) => {
        f(cur.spec as Obj);
        return cur;
      });
    expect(error(change((s) => (s.accessModes = ['ReadWriteMany'])))).toBe('422 PersistentVolumeClaim "data" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims');
    // Not bound yet: the request may not change either.
    expect(error(change((s) => ((s.resources as Obj).requests = { storage: '2Gi' })))).toMatch(/spec: Forbidden: spec is immutable/);
    expect(error(change((s) => (s.storageClassName = 'fast')))).toBe('no error');
    expect(error(change((s) => (s.storageClassName = 'slow')))).toMatch(/spec is immutable/);
    expect(error(change((s) => (s.volumeName = 'pv-1')))).toBe('no error');
    expect(error(change((s) => (s.volumeName = 'pv-2')))).toMatch(/spec is immutable/);
    store.patch(pvcs, 'default', 'data', (cur) => ({ ...cur, status: { phase: 'Bound', capacity: { storage: '1Gi' }, accessModes: ['ReadWriteOnce'] } }), { status: true });
    expect(error(change((s) => ((s.resources as Obj).requests = { storage: '2Gi' })))).toBe('no error');
    expect(error(change((s) => ((s.resources as Obj).requests = { storage: '1Gi' })))).toBe('422 PersistentVolumeClaim "data" is invalid: spec.resources.requests.storage: Forbidden: field can not be less than previous value');
    expect(c.metadata.name).toBe('data');
  });

  it('gets the default StorageClass when it names none (the newest default wins), and keeps "" as no class', () => {
    let now = T0;
    const { store, pvcs, scs } = setup(() => now);
    expect(spec(store.create(pvcs, 'default', claim('before'))).storageClassName).toBeUndefined();
    store.create(scs, '', sc('old', { metadata: { name: 'old', annotations: { 'storageclass.kubernetes.io/is-default-class': 'true' } } }));
    now += 5000;
    store.create(scs, '', sc('new', { metadata: { name: 'new', annotations: { 'storageclass.kubernetes.io/is-default-class': 'true' } } }));
    store.create(scs, '', sc('other'));
    expect(spec(store.create(pvcs, 'default', claim('none'))).storageClassName).toBe('new');
    expect(spec(store.create(pvcs, 'default', claim('empty', { storageClassName: '' }))).storageClassName).toBe('');
    expect(spec(store.create(pvcs, 'default', claim('named', { storageClassName: 'other' }))).storageClassName).toBe('other');
  });

  it('prints the columns kubectl get pvc prints, bound and not', () => {
    const { store, pvcs } = setup();
    const c = store.create(pvcs, 'default', claim('data', { storageClassName: 'local-path' }));
    const t = table(pvcs, c, T0 + 90_000);
    expect(t.head).toBe('Name Status Volume Capacity Access Modes StorageClass VolumeAttributesClass Age (VolumeMode)');
    expect(t.row).toEqual(['data', 'Pending', '', '', '', 'local-path', '<unset>', '90s', 'Filesystem']);
    store.patch(pvcs, 'default', 'data', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), volumeName: 'pvc-1' } }));
    const b = store.patch(pvcs, 'default', 'data', (cur) => ({ ...cur, status: { phase: 'Bound', capacity: { storage: '1Gi' }, accessModes: ['ReadWriteMany', 'ReadWriteOnce'] } }), { status: true });
    expect(table(pvcs, b, T0 + 90_000).row).toEqual(['data', 'Bound', 'pvc-1', '1Gi', 'RWO,RWX', 'local-path', '<unset>', '90s', 'Filesystem']);
  });
});

describe('PersistentVolume', () => {
  it('defaults reclaim Retain, volumeMode Filesystem, phase Pending; needs capacity, access modes and exactly one source', () => {
    const { store, pvs } = setup();
    const v = store.create(pvs, '', volume('pv1'));
    expect(spec(v)).toMatchObject({ persistentVolumeReclaimPolicy: 'Retain', volumeMode: 'Filesystem', hostPath: { path: '/srv/data', type: '' } });
    expect(v.status).toEqual({ phase: 'Pending' });
    expect(v.metadata.namespace).toBeUndefined();
    expect(error(() => store.create(pvs, '', volume('a', { capacity: undefined })))).toBe('422 PersistentVolume "a" is invalid: spec.capacity: Required value');
    expect(error(() => store.create(pvs, '', volume('b', { accessModes: undefined })))).toBe('422 PersistentVolume "b" is invalid: spec.accessModes: Required value: must specify at least 1 access mode');
    expect(error(() => store.create(pvs, '', volume('c', { hostPath: undefined })))).toBe('422 PersistentVolume "c" is invalid: spec: Required value: must specify a volume type');
    expect(error(() => store.create(pvs, '', volume('d', { nfs: { server: '127.0.0.1', path: '/x' } })))).toBe('422 PersistentVolume "d" is invalid: spec.nfs: Forbidden: may not specify more than 1 volume type');
    expect(error(() => store.create(pvs, '', volume('e', { capacity: { storage: '1Gi', cpu: '1' } })))).toMatch(/spec\.capacity: Unsupported value: "cpu": supported values: "storage"/);
    expect(error(() => store.create(pvs, '', volume('f', { persistentVolumeReclaimPolicy: 'Shred' })))).toMatch(/spec\.persistentVolumeReclaimPolicy: Unsupported value: "Shred"/);
    expect(error(() => store.create(pvs, '', volume('g', { hostPath: undefined, local: { path: '/srv/local' } })))).toBe('422 PersistentVolume "g" is invalid: spec.nodeAffinity: Required value: Local volume requires node affinity');
    expect(error(() => store.create(pvs, '', volume('h', { hostPath: undefined, local: { path: 'rel' }, nodeAffinity: { required: { nodeSelectorTerms: [{}] } } })))).toMatch(/spec\.local\.path: Invalid value: "rel": must be an absolute path/);
  });

  it('refuses a hostPath or local PV on /, system directories, or the node root dir (but its own volumes/<pv>)', () => {
    const { store, pvs } = setup();
    const refused = (name: string, p: string, source = 'hostPath') =>
      error(() => store.create(pvs, '', volume(name, { hostPath: undefined, [source]: { path: p }, nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: 'kubernetes.io/hostname', operator: 'In', values: ['node-a'] }] }] } } })));
    expect(refused('root', '/')).toBe('422 PersistentVolume "root" is invalid: spec.hostPath.path: Forbidden: "/" may not be the root directory: a volume there would hand a pod the whole filesystem of the node');
    expect(refused('root2', '//./')).toMatch(/Forbidden: .* may not be the root directory/);
    expect(refused('etc', '/etc')).toMatch(/spec\.hostPath\.path: Forbidden: "\/etc" may not be \/etc/);
    expect(refused('shadow', '/etc/shadow')).toMatch(/Forbidden/);
    expect(refused('proc', '/proc/1/root', 'local')).toMatch(/spec\.local\.path: Forbidden/);
    expect(refused('up', '/srv/../etc')).toMatch(/must not contain '\.\.'/);
    expect(refused('rootdir', ROOT)).toMatch(/may not hold the node's root directory/);
    expect(refused('parent', '/var/lib')).toMatch(/Forbidden/);
    expect(refused('pods', `${ROOT}/pods`)).toMatch(/may not be under the node's root directory/);
    expect(refused('other', `${ROOT}/volumes/someone-else`)).toMatch(/may not be under the node's root directory/);
    expect(refused('own', `${ROOT}/volumes/own`)).toBe('no error');
    expect(refused('data', '/srv/data')).toBe('no error');
  });

  it('keeps its source and node affinity; prints the columns kubectl get pv prints', () => {
    const { store, pvs } = setup();
    store.create(pvs, '', volume('pv1', { storageClassName: 'manual' }));
    expect(error(() => store.patch(pvs, '', 'pv1', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), hostPath: { path: '/srv/other' } } })))).toBe('422 PersistentVolume "pv1" is invalid: spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation');
    const v = store.patch(pvs, '', 'pv1', (cur) => ({ ...cur, spec: { ...(cur.spec as Obj), claimRef: { namespace: 'default', name: 'data' } } }));
    const t = table(pvs, v, T0 + 600_000);
    expect(t.head).toBe('Name Capacity Access Modes Reclaim Policy Status Claim StorageClass VolumeAttributesClass Reason Age (VolumeMode)');
    expect(t.row).toEqual(['pv1', '5Gi', 'RWO', 'Retain', 'Pending', 'default/data', 'manual', '<unset>', '', '10m', 'Filesystem']);
  });

  it('decodes a protobuf body with its source inline, as the JSON form has it', () => {
    // PersistentVolume{metadata{name:"pb"}, spec{hostPath(3){path:"/srv/pb"}}} in the k8s protobuf envelope.
    const lenDelim = (no: number, b: Buffer) => Buffer.concat([Buffer.from([(no << 3) | 2, b.length]), b]);
    const str = (no: number, s: string) => lenDelim(no, Buffer.from(s));
    const source = lenDelim(3, str(1, '/srv/pb'));
    const pv = Buffer.concat([lenDelim(1, str(1, 'pb')), lenDelim(2, lenDelim(2, source))]);
    const unknown = Buffer.concat([lenDelim(1, Buffer.concat([str(1, 'v1'), str(2, 'PersistentVolume')])), lenDelim(2, pv)]);
    const o = decodeProtobuf(Buffer.concat([Buffer.from([0x6b, 0x38, 0x73, 0x00]), unknown]));
    expect(o).toEqual({ apiVersion: 'v1', kind: 'PersistentVolume', metadata: { name: 'pb' }, spec: { hostPath: { path: '/srv/pb' } } });
  });
});

describe('StorageClass', () => {
  it('defaults reclaim Delete and Immediate binding, validates, keeps its provisioner and parameters, prints (default)', () => {
    const { store, scs } = setup();
    const c = store.create(scs, '', sc('fast', { metadata: { name: 'fast', annotations: { 'storageclass.kubernetes.io/is-default-class': 'true' } }, parameters: { tier: 'gold' } }));
    expect(c).toMatchObject({ apiVersion: 'storage.k8s.io/v1', reclaimPolicy: 'Delete', volumeBindingMode: 'Immediate' });
    expect(error(() => store.create(scs, '', { ...sc('x'), provisioner: undefined }))).toBe('422 StorageClass.storage.k8s.io "x" is invalid: provisioner: Required value');
    expect(error(() => store.create(scs, '', sc('y', { reclaimPolicy: 'Recycle' })))).toMatch(/reclaimPolicy: Unsupported value: "Recycle": supported values: "Delete", "Retain"/);
    expect(error(() => store.create(scs, '', sc('z', { volumeBindingMode: 'Later' })))).toMatch(/volumeBindingMode: Unsupported value: "Later"/);
    expect(error(() => store.patch(scs, '', 'fast', (cur) => ({ ...cur, parameters: { tier: 'silver' } })))).toMatch(/parameters: Forbidden: updates to parameters are forbidden\./);
    expect(error(() => store.patch(scs, '', 'fast', (cur) => ({ ...cur, provisioner: 'other.io/x' })))).toMatch(/provisioner: Forbidden: updates to provisioner are forbidden\./);
    expect(error(() => store.patch(scs, '', 'fast', (cur) => ({ ...cur, allowVolumeExpansion: true })))).toBe('no error');
    const t = table(scs, store.get(scs, '', 'fast'), T0 + 3 * 3600_000);
    expect(t.head).toBe('Name Provisioner ReclaimPolicy VolumeBindingMode AllowVolumeExpansion Age');
    expect(t.row).toEqual(['fast (default)', 'example.com/disk', 'Delete', 'Immediate', true, '3h']);
  });
});
