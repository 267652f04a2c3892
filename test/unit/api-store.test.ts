/**
 * The node API's generic store through its in-process client: resourceVersion,
 * generation, finalizers, namespace deletion, selectors, pages, watch from a
 * version with a bounded history, watchers cut off when they fall behind,
 * patches, and persistence across a reopen of the same database.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { localClient } from '../../src/api/client.js';
import { ApiError } from '../../src/api/errors.js';
import { nodeKinds } from '../../src/api/kinds/index.js';

const KINDS = nodeKinds('test-node');
import { applyPatch } from '../../src/api/patch.js';
import { openApiDb } from '../../src/api/persist.js';
import { Store } from '../../src/api/store.js';
import type { WatchEvent } from '../../src/api/types.js';

const dirs: string[] = [];
afterEach(async () => {
  for (const d of dirs.splice(0)) await fs.rm(d, { recursive: true, force: true });
});

async function reason(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof ApiError) return `${err.code} ${err.reason}: ${err.message}`;
    throw err;
  }
  return 'no error';
}

const cm = (name: string, data: Record<string, string> = {}, labels?: Record<string, string>) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, ...(labels ? { labels } : {}) }, data });
const until = (pred: () => boolean) =>
  new Promise<void>((resolve, reject) => {
    const end = Date.now() + 2000;
    const tick = () => (pred() ? resolve() : Date.now() > end ? reject(new Error('timed out')) : setTimeout(tick, 5));
    tick();
  });

describe('the API store', () => {
  it('starts with the system namespaces and gives every write the next resourceVersion', async () => {
    const c = localClient(new Store({ kinds: KINDS }));
    const ns = await c.list('namespaces');
    expect(ns.items.map((n) => n.metadata.name)).toEqual(['default', 'kube-node-lease', 'kube-public', 'kube-system']);
    expect(ns.items[0]!.status).toEqual({ phase: 'Active' });
    const a = await c.create('configmaps', 'default', cm('a', { k: 'v' }));
    expect(Number(a.metadata.resourceVersion)).toBe(Number(ns.resourceVersion) + 1);
    expect(a.metadata.uid).toMatch(/^[0-9a-f-]{36}$/);
    expect(a.metadata.creationTimestamp).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
    const b = await c.update('configmaps', 'default', 'a', { ...a, data: { k: 'w' } });
    expect(Number(b.metadata.resourceVersion)).toBe(Number(a.metadata.resourceVersion) + 1);
    // A write that changes nothing keeps the version; a stale version is a Conflict.
    expect((await c.update('configmaps', 'default', 'a', b)).metadata.resourceVersion).toBe(b.metadata.resourceVersion);
    expect(await reason(c.update('configmaps', 'default', 'a', { ...a, data: { k: 'x' } }))).toMatch(/^409 Conflict: Operation cannot be fulfilled on configmaps "a": the object has been modified/);
    expect(await reason(c.create('configmaps', 'default', cm('a')))).toBe('409 AlreadyExists: configmaps "a" already exists');
    expect(await reason(c.get('configmaps', 'default', 'nope'))).toBe('404 NotFound: configmaps "nope" not found');
    expect(await reason(c.create('configmaps', 'nowhere', cm('a')))).toBe('404 NotFound: namespaces "nowhere" not found');
    expect(await reason(c.create('configmaps', 'default', cm('Bad_Name')))).toMatch(/^422 Invalid: ConfigMap "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name"/);
  });

  it('bumps generation on spec changes only, and folds Secret stringData into data', async () => {
    const c = localClient(new Store({ kinds: KINDS }));
    const ns = await c.create('namespaces', '', { metadata: { name: 'team' } });
    expect(ns.metadata.generation).toBe(1);
    expect(ns.metadata.labels).toEqual({ 'kubernetes.io/metadata.name': 'team' });
    const relabelled = await c.patch('namespaces', '', 'team', 'merge', { metadata: { labels: { a: 'b' } } });
    expect(relabelled.metadata.generation).toBe(1);
    const s = await c.create('secrets', 'team', { metadata: { name: 's' }, stringData: { password: 'hunter2' }, data: { other: 'eA==' } });
    expect(s.data).toEqual({ other: 'eA==', password: Buffer.from('hunter2').toString('base64') });
    expect(s.stringData).toBeUndefined();
    expect(s.type).toBe('Opaque');
    expect(await reason(c.patch('secrets', 'team', 's', 'merge', { type: 'kubernetes.io/tls' }))).toMatch(/^422 Invalid: .*type: Invalid value: "kubernetes.io\/tls": field is immutable/);
  });

  it('marks an object with finalizers and removes it when the last one goes; a namespace takes its contents with it', async () => {
    const c = localClient(new Store({ kinds: KINDS }));
    await c.create('namespaces', '', { metadata: { name: 'doomed' } });
    await c.create('configmaps', 'doomed', { ...cm('held'), metadata: { name: 'held', finalizers: ['example.com/hold'] } });
    await c.create('configmaps', 'doomed', cm('free'));
    const del = await c.delete('configmaps', 'doomed', 'held');
    expect(del.removed).toBe(false);
    expect(del.object.metadata.deletionTimestamp).toBeDefined();
    expect(await reason(c.patch('configmaps', 'doomed', 'held', 'merge', { metadata: { finalizers: ['example.com/hold', 'more'] } }))).toMatch(/no new finalizers can be added/);
    const ns = await c.delete('namespaces', '', 'doomed');
    expect(ns.removed).toBe(false);
    expect(ns.object.status).toEqual({ phase: 'Terminating' });
    expect(await reason(c.get('configmaps', 'doomed', 'free'))).toMatch(/^404/);
    expect(await reason(c.create('configmaps', 'doomed', cm('late')))).toBe('403 Forbidden: unable to create new content in namespace doomed because it is being terminated');
    await c.patch('configmaps', 'doomed', 'held', 'json', [{ op: 'remove', path: '/metadata/finalizers' }]);
    expect(await reason(c.get('configmaps', 'doomed', 'held'))).toMatch(/^404/);
    expect(await reason(c.get('namespaces', '', 'doomed'))).toBe('404 NotFound: namespaces "doomed" not found');
    expect(await reason(c.delete('namespaces', '', 'default'))).toBe('403 Forbidden: namespaces "default" is forbidden: this namespace may not be deleted');
  });

  it('lists with label and field selectors, in pages', async () => {
    const c = localClient(new Store({ kinds: KINDS }));
    for (let i = 0; i < 7; i++) await c.create('configmaps', 'default', cm(`c${i}`, {}, { n: String(i), even: String(i % 2 === 0) }));
    await c.create('configmaps', 'kube-system', cm('other', {}, { n: '0' }));
    const names = async (o: object) => (await c.list('configmaps', o)).items.map((x) => `${x.metadata.namespace}/${x.metadata.name}`);
    expect(await names({ labelSelector: 'even=true,n notin (0,2)' })).toEqual(['default/c4', 'default/c6']);
    expect(await names({ labelSelector: 'n=0' })).toEqual(['default/c0', 'kube-system/other']);
    expect(await names({ namespace: 'default', labelSelector: '!even' })).toEqual([]);
    expect(await names({ fieldSelector: 'metadata.namespace!=default' })).toEqual(['kube-system/other']);
    expect(await names({ fieldSelector: 'metadata.name=c3' })).toEqual(['default/c3']);
    expect(await reason(c.list('configmaps', { fieldSelector: 'spec.nodeName=x' }))).toBe('400 BadRequest: field label not supported: spec.nodeName');
    expect(await reason(c.list('configmaps', { labelSelector: 'a in (b' }))).toMatch(/^400 BadRequest/);
    const seen: string[] = [];
    let token: string | undefined;
    do {
      const page = await c.list('configmaps', { namespace: 'default', limit: 3, continue: token });
      seen.push(...page.items.map((x) => x.metadata.name!));
      token = page.continue;
    } while (token);
    expect(seen).toEqual(['c0', 'c1', 'c2', 'c3', 'c4', 'c5', 'c6']);
  });

  it('watches from a resourceVersion, sees selector changes as ADDED/DELETED, and answers 410 for one the history lost', async () => {
    const store = new Store({ kinds: KINDS, watch: { maxEvents: 5 } });
    const c = localClient(store);
    const a = await c.create('configmaps', 'default', cm('a', {}, { app: 'web' }));
    const events: WatchEvent[] = [];
    const w = await c.watch('configmaps', { namespace: 'default', labelSelector: 'app=web', resourceVersion: a.metadata.resourceVersion }, (e) => events.push(e));
    await c.create('configmaps', 'default', cm('b', {}, { app: 'db' }));
    await c.patch('configmaps', 'default', 'b', 'merge', { metadata: { labels: { app: 'web' } } });
    await c.patch('configmaps', 'default', 'a', 'merge', { metadata: { labels: { app: 'gone' } } });
    await c.delete('configmaps', 'default', 'b');
    await until(() => events.length === 3);
    expect(events.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual(['ADDED b', 'DELETED a', 'DELETED b']);
    w.stop();
    // From the start: every object as ADDED first.
    const initial: WatchEvent[] = [];
    (await c.watch('configmaps', { namespace: 'default' }, (e) => initial.push(e))).stop;
    await until(() => initial.length === 1);
    expect(initial[0]!.type).toBe('ADDED');
    for (let i = 0; i < 6; i++) await c.create('configmaps', 'default', cm(`x${i}`));
    expect(await reason(c.watch('configmaps', { resourceVersion: a.metadata.resourceVersion }, () => undefined))).toMatch(/^410 Expired: too old resource version/);
  });

  it('cuts off an in-process watcher that lets events pile up, and tells it', async () => {
    const store = new Store({ kinds: KINDS });
    const c = localClient(store, { maxQueued: 3 });
    let closedWith = '';
    const got: WatchEvent[] = [];
    await c.watch('configmaps', { resourceVersion: store.resourceVersion }, (e) => got.push(e), (r) => (closedWith = r));
    // Synchronous writes: the watcher's queue cannot drain in between.
    for (let i = 0; i < 10; i++) store.create(store.kind('configmaps')!, 'default', cm(`f${i}`));
    await until(() => closedWith !== '');
    expect(closedWith).toBe('the watcher fell behind');
    expect(store.watchers).toBe(0);
    expect(got.length).toBeLessThanOrEqual(3);
  });

  it("shows a manifest file's object read-only, naming the file, and never keeps it in the database", async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-api-'));
    dirs.push(dir);
    const file = path.join(dir, 'api.db');
    const store = new Store({ kinds: KINDS, persistence: openApiDb(file) });
    const c = localClient(store);
    const kind = store.kind('secrets')!;
    expect(store.mirror(kind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'filed', uid: 'u-1' }, stringData: { a: 'b' } }, 'the manifest file /m/s.yaml')).toBe(true);
    const got = await c.get('secrets', 'default', 'filed');
    expect(got.data).toEqual({ a: Buffer.from('b').toString('base64') });
    expect(got.metadata.uid).toBe('u-1');
    const why = 'configmaps "filed" is defined by the manifest file /m/s.yaml: change or remove it there'.replace('configmaps', 'secrets');
    expect(await reason(c.delete('secrets', 'default', 'filed'))).toBe(`409 Conflict: ${why}`);
    expect(await reason(c.patch('secrets', 'default', 'filed', 'merge', { data: { x: 'eQ==' } }))).toBe(`409 Conflict: ${why}`);
    expect(await reason(c.create('secrets', 'default', { metadata: { name: 'filed' } }))).toMatch(/^409 AlreadyExists/);
    // One written through the API keeps its name against a file's.
    await c.create('secrets', 'default', { metadata: { name: 'mine' } });
    expect(store.mirror(kind, { apiVersion: 'v1', kind: 'Secret', metadata: { name: 'mine' } }, 'the manifest file /m/t.yaml')).toBe(false);
    const rv = Number(store.resourceVersion);
    store.close();
    const again = new Store({ kinds: KINDS, persistence: openApiDb(file) });
    expect(await reason(localClient(again).get('secrets', 'default', 'filed'))).toMatch(/^404/);
    expect(Number(again.resourceVersion)).toBe(rv);
    again.close();
  });

  it("lets the node bind a file's claim (volumeName, class, binding annotations) but not change the rest, and keeps the binding when the file is read again", async () => {
    const store = new Store({ kinds: KINDS });
    const c = localClient(store);
    const kind = store.kind('persistentvolumeclaims')!;
    const filed = { apiVersion: 'v1', kind: 'PersistentVolumeClaim', metadata: { name: 'db', uid: 'u-2' }, spec: { accessModes: ['ReadWriteOnce'], resources: { requests: { storage: '1Gi' } } } };
    expect(store.mirror(kind, structuredClone(filed), 'the manifest file /m/db.yaml')).toBe(true);
    const got = await c.get('persistentvolumeclaims', 'default', 'db');
    const bound = { ...got, metadata: { ...got.metadata, annotations: { 'pv.kubernetes.io/bind-completed': 'yes' } }, spec: { ...(got.spec as object), volumeName: 'pv-1', storageClassName: 'local-path' } };
    const after = await c.update('persistentvolumeclaims', 'default', 'db', bound);
    expect(after.spec).toMatchObject({ volumeName: 'pv-1', storageClassName: 'local-path' });
    // Anything else is still the file's: a size, a label, or a second binding.
    const why = /^409 Conflict: persistentvolumeclaims "db" is defined by the manifest file \/m\/db\.yaml/;
    expect(await reason(c.patch('persistentvolumeclaims', 'default', 'db', 'merge', { spec: { resources: { requests: { storage: '2Gi' } } } }))).toMatch(why);
    expect(await reason(c.patch('persistentvolumeclaims', 'default', 'db', 'merge', { metadata: { labels: { a: 'b' } } }))).toMatch(why);
    expect(await reason(c.patch('persistentvolumeclaims', 'default', 'db', 'merge', { spec: { volumeName: 'pv-2' } }))).toMatch(why);
    // The file read again, unchanged: the binding stays, and nothing is written.
    const rv = store.resourceVersion;
    expect(store.mirror(kind, structuredClone(filed), 'the manifest file /m/db.yaml')).toBe(true);
    expect(store.resourceVersion).toBe(rv);
    expect((await c.get('persistentvolumeclaims', 'default', 'db')).spec).toMatchObject({ volumeName: 'pv-1', storageClassName: 'local-path' });
    // A file that names its own class keeps it.
    expect(store.mirror(kind, { ...structuredClone(filed), spec: { ...filed.spec, storageClassName: 'fast' } }, 'the manifest file /m/db.yaml')).toBe(true);
    expect((await c.get('persistentvolumeclaims', 'default', 'db')).spec).toMatchObject({ volumeName: 'pv-1', storageClassName: 'fast' });
    store.close();
  });

  it('refuses writes beyond the bytes it may hold, and counts what a deletion frees', async () => {
    const c = localClient(new Store({ kinds: KINDS, maxBytes: 50_000 }));
    await c.create('configmaps', 'default', cm('a', { v: 'x'.repeat(30_000) }));
    expect(await reason(c.create('configmaps', 'default', cm('b', { v: 'x'.repeat(30_000) })))).toBe("403 Forbidden: the node's API holds at most 50000 bytes of objects");
    await c.delete('configmaps', 'default', 'a');
    await c.create('configmaps', 'default', cm('b', { v: 'x'.repeat(30_000) }));
  });

  it('refuses a watch beyond the most it serves at once with 429', async () => {
    const c = localClient(new Store({ kinds: KINDS, watch: { maxWatchers: 2 } }));
    const a = await c.watch('configmaps', {}, () => undefined);
    await c.watch('secrets', {}, () => undefined);
    expect(await reason(c.watch('events', {}, () => undefined))).toBe('429 TooManyRequests: too many watches (at most 2)');
    a.stop();
    await new Promise((r) => setImmediate(r));
    (await c.watch('events', {}, () => undefined)).stop();
  });

  it('keeps objects and the resourceVersion counter in SQLite across a reopen', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-api-'));
    dirs.push(dir);
    const file = path.join(dir, 'api.db');
    const first = new Store({ kinds: KINDS, persistence: openApiDb(file) });
    const c1 = localClient(first);
    await c1.create('configmaps', 'default', cm('kept', { a: '1' }));
    const gone = await c1.create('configmaps', 'default', cm('gone'));
    await c1.delete('configmaps', 'default', 'gone');
    const last = Number(first.resourceVersion);
    first.close();
    expect((await fs.stat(file)).mode & 0o777).toBe(0o600);
    const second = new Store({ kinds: KINDS, persistence: openApiDb(file) });
    const c2 = localClient(second);
    expect((await c2.get('configmaps', 'default', 'kept')).data).toEqual({ a: '1' });
    expect(await reason(c2.get('configmaps', 'default', 'gone'))).toMatch(/^404/);
    expect(Number(second.resourceVersion)).toBe(last);
    const next = await c2.create('configmaps', 'default', cm('after'));
    expect(Number(next.metadata.resourceVersion)).toBe(last + 1);
    expect(Number(gone.metadata.resourceVersion)).toBeLessThan(last);
    second.close();
  });
});

describe('patches', () => {
  const base = { metadata: { name: 'x', finalizers: ['a'], ownerReferences: [{ uid: '1', name: 'one' }] }, data: { k: 'v', drop: 'me' } };
  it('strategic merge: maps merge, null deletes, finalizers merge as a set, ownerReferences by uid, directives', () => {
    const out = applyPatch('strategic', base, {
      metadata: { finalizers: ['b', 'a'], ownerReferences: [{ uid: '2', name: 'two' }, { uid: '1', $patch: 'delete' }] },
      data: { drop: null, n: 'new' },
    });
    expect(out).toEqual({ metadata: { name: 'x', finalizers: ['a', 'b'], ownerReferences: [{ uid: '2', name: 'two' }] }, data: { k: 'v', n: 'new' } });
    expect(applyPatch('strategic', base, { data: { $patch: 'replace', only: '1' } }).data).toEqual({ only: '1' });
    expect(applyPatch('strategic', base, { data: { $retainKeys: ['k'], extra: 'y' } }).data).toEqual({ k: 'v' });
    expect((applyPatch('strategic', base, { metadata: { '$deleteFromPrimitiveList/finalizers': ['a'] } }).metadata as { finalizers: string[] }).finalizers).toEqual([]);
  });
  it('JSON patch: test, move, copy, and errors as 422', () => {
    expect(applyPatch('json', base, [{ op: 'test', path: '/data/k', value: 'v' }, { op: 'move', from: '/data/drop', path: '/data/moved' }, { op: 'copy', from: '/data/k', path: '/data/k2' }]).data).toEqual({ k: 'v', moved: 'me', k2: 'v' });
    expect(() => applyPatch('json', base, [{ op: 'test', path: '/data/k', value: 'no' }])).toThrow(/testing value \/data\/k failed/);
    expect(() => applyPatch('json', base, [{ op: 'remove', path: '/nope/x' }])).toThrow(/missing path/);
    // Copies that would double the document each time stop at a byte budget, not at memory.
    const doubling = Array.from({ length: 40 }, (_, i) => ({ op: 'copy', from: '/data', path: `/d${i}` }));
    expect(() => applyPatch('json', { data: { big: 'x'.repeat(1 << 20) } }, doubling)).toThrow(/may copy at most/);
  });
  it('refuses documents nested deeper than any object', () => {
    let deep: unknown = 'leaf';
    for (let i = 0; i < 200; i++) deep = { a: deep };
    expect(() => applyPatch('merge', base, deep)).toThrow(/nested more than 100 levels/);
  });
});
