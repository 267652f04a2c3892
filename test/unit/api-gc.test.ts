/**
 * The garbage collector over the node API's store: background, foreground
 * and orphan cascading deletion, several owners, scope rules, dangling
 * references, manifest files' objects, pods deleted gracefully, the hostile
 * graphs (cycles, a 100,000-long chain, 10,000 owners) without stalling the
 * event loop, and a foreground deletion picked up again after a reopen.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { localClient, type ApiClient } from '../../src/api/client.js';
import { ApiError } from '../../src/api/errors.js';
import { GarbageCollector } from '../../src/api/gc.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { openApiDb, type Persistence } from '../../src/api/persist.js';
import { Store } from '../../src/api/store.js';
import type { ApiObject } from '../../src/api/types.js';
import { createLogger } from '../../src/log.js';

const log = createLogger('error');
const stops: Array<() => void> = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const s of stops.splice(0)) s();
  for (const d of dirs.splice(0)) await fs.rm(d, { recursive: true, force: true });
});

function world(opts: { persistence?: Persistence; maxObjects?: number; waitForOwners?: boolean } = {}) {
  const store = new Store({ kinds: nodeKinds('test-node'), garbageCollection: true, persistence: opts.persistence, maxObjects: opts.maxObjects, maxBytes: 1024 * 1024 * 1024 });
  const gc = new GarbageCollector({ store, log, waitForOwners: opts.waitForOwners });
  stops.push(() => {
    gc.stop();
    store.close();
  });
  return { store, gc, c: localClient(store) };
}

const ref = (o: ApiObject, extra: Record<string, unknown> = {}) => ({ apiVersion: o.apiVersion, kind: o.kind, name: o.metadata.name!, uid: o.metadata.uid!, ...extra });
const cm = (name: string, owners: object[] = [], meta: Record<string, unknown> = {}) => ({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, ...(owners.length ? { ownerReferences: owners } : {}), ...meta } });
const secret = (name: string, owners: object[] = [], meta: Record<string, unknown> = {}) => ({ apiVersion: 'v1', kind: 'Secret', metadata: { name, ...(owners.length ? { ownerReferences: owners } : {}), ...meta } });

async function names(c: ApiClient, resource: string, namespace = 'default'): Promise<string[]> {
  return (await c.list(resource, { namespace })).items.map((o) => o.metadata.name!);
}

async function gone(c: ApiClient, resource: string, namespace: string, name: string): Promise<boolean> {
  try {
    await c.get(resource, namespace, name);
    return false;
  } catch (err) {
    if (err instanceof ApiError && err.reason === 'NotFound') return true;
    throw err;
  }
}

async function reason(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof ApiError) return `${err.code} ${err.reason}: ${err.message}`;
    throw err;
  }
  return 'no error';
}

describe('the garbage collector', () => {
  it('deletes dependents in the background, transitively; one with several owners only when all are gone', async () => {
    const { c, gc } = world();
    const owner = await c.create('configmaps', 'default', cm('owner'));
    const other = await c.create('configmaps', 'default', cm('other'));
    const mid = await c.create('configmaps', 'default', cm('mid', [ref(owner)]));
    await c.create('secrets', 'default', secret('leaf', [ref(mid)]));
    await c.create('secrets', 'default', secret('shared', [ref(owner), ref(other)]));
    await c.create('secrets', 'default', secret('free'));
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['free', 'leaf', 'shared']);
    const out = await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Background' });
    expect(out.removed).toBe(true);
    await gc.settled();
    expect(await names(c, 'configmaps')).toEqual(['other']);
    // The shared one stays for its other owner, without the reference to the gone one.
    expect(await names(c, 'secrets')).toEqual(['free', 'shared']);
    expect((await c.get('secrets', 'default', 'shared')).metadata.ownerReferences).toEqual([ref(other)]);
    await c.delete('configmaps', 'default', 'other');
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['free']);
  });

  it('keeps a foreground owner, marked, until its blocking dependents are gone, recursively', async () => {
    const { c, gc } = world();
    const owner = await c.create('configmaps', 'default', cm('owner'));
    const child = await c.create('configmaps', 'default', cm('child', [ref(owner, { blockOwnerDeletion: true })]));
    // A grandchild someone else holds (its own finalizer) keeps the child, and so the owner.
    await c.create('secrets', 'default', secret('grandchild', [ref(child, { blockOwnerDeletion: true })], { finalizers: ['example.com/hold'] }));
    await c.create('secrets', 'default', secret('loose', [ref(owner)]));
    const out = await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Foreground' });
    expect(out.removed).toBe(false);
    expect(out.object.metadata.deletionTimestamp).toBeDefined();
    expect(out.object.metadata.finalizers).toEqual(['foregroundDeletion']);
    await gc.settled();
    // The non-blocking dependent goes too, without being waited for.
    expect(await gone(c, 'secrets', 'default', 'loose')).toBe(true);
    const kid = await c.get('configmaps', 'default', 'child');
    expect(kid.metadata.finalizers).toEqual(['foregroundDeletion']);
    const gk = await c.get('secrets', 'default', 'grandchild');
    expect(gk.metadata.deletionTimestamp).toBeDefined();
    expect((await c.get('configmaps', 'default', 'owner')).metadata.deletionTimestamp).toBeDefined();
    await c.patch('secrets', 'default', 'grandchild', 'merge', { metadata: { finalizers: null } });
    await gc.settled();
    expect(await names(c, 'configmaps')).toEqual([]);
    expect(await names(c, 'secrets')).toEqual([]);
  });

  it('orphans dependents: policy Orphan, orphanDependents, and an orphan finalizer the object carries', async () => {
    const { c, gc } = world();
    const a = await c.create('configmaps', 'default', cm('a'));
    const b = await c.create('configmaps', 'default', cm('b'));
    const d = await c.create('configmaps', 'default', cm('d', [], { finalizers: ['orphan'] }));
    await c.create('secrets', 'default', secret('of-a', [ref(a), ref(b)]));
    await c.create('secrets', 'default', secret('of-b', [ref(b)]));
    await c.create('secrets', 'default', secret('of-d', [ref(d)]));
    expect((await c.delete('configmaps', 'default', 'a', { propagationPolicy: 'Orphan' })).object.metadata.finalizers).toEqual(['orphan']);
    await c.delete('configmaps', 'default', 'b', { orphanDependents: true });
    await c.delete('configmaps', 'default', 'd');
    await gc.settled();
    expect(await names(c, 'configmaps')).toEqual([]);
    expect(await names(c, 'secrets')).toEqual(['of-a', 'of-b', 'of-d']);
    for (const s of (await c.list('secrets', { namespace: 'default' })).items) expect(s.metadata.ownerReferences).toBeUndefined();
  });

  it('a later delete changes the policy of one already waiting', async () => {
    const { c, gc } = world();
    const owner = await c.create('configmaps', 'default', cm('owner'));
    await c.create('secrets', 'default', secret('held', [ref(owner, { blockOwnerDeletion: true })], { finalizers: ['example.com/hold'] }));
    await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Foreground' });
    await gc.settled();
    expect((await c.get('configmaps', 'default', 'owner')).metadata.finalizers).toEqual(['foregroundDeletion']);
    // Background now: the owner goes at once, the held dependent stays until its own finalizer goes.
    await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Background' });
    expect(await gone(c, 'configmaps', 'default', 'owner')).toBe(true);
    await c.patch('secrets', 'default', 'held', 'merge', { metadata: { finalizers: null } });
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual([]);
  });

  it('waits for pod dependents to be really gone (deleted gracefully, then by the node with 0)', async () => {
    const { c, gc } = world();
    const owner = await c.create('configmaps', 'default', cm('owner'));
    await c.create('pods', 'default', { metadata: { name: 'p', ownerReferences: [ref(owner, { blockOwnerDeletion: true, controller: true })] }, spec: { containers: [{ name: 'c', image: 'busybox' }] } });
    await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Foreground' });
    await gc.settled();
    const pod = await c.get('pods', 'default', 'p');
    expect(pod.metadata.deletionTimestamp).toBeDefined();
    expect(pod.metadata.deletionGracePeriodSeconds).toBe(30);
    expect(await gone(c, 'configmaps', 'default', 'owner')).toBe(false);
    // The node has stopped it.
    await c.delete('pods', 'default', 'p', { gracePeriodSeconds: 0 });
    await gc.settled();
    expect(await gone(c, 'pods', 'default', 'p')).toBe(true);
    expect(await gone(c, 'configmaps', 'default', 'owner')).toBe(true);
  });

  it('looks an owner up in the dependent\'s namespace or the cluster; a reference to no one is garbage', async () => {
    const { c, gc } = world();
    await c.create('namespaces', '', { metadata: { name: 'a' } });
    await c.create('namespaces', '', { metadata: { name: 'b' } });
    const inA = await c.create('configmaps', 'a', cm('owner'));
    const node = await c.create('nodes', '', { apiVersion: 'v1', kind: 'Node', metadata: { name: 'n1' } });
    await c.create('secrets', 'a', secret('same-ns', [ref(inA)]));
    // The same name and uid, but in another namespace: no such owner there.
    await c.create('secrets', 'b', secret('other-ns', [ref(inA)]));
    await c.create('secrets', 'b', secret('of-node', [ref(node)]));
    await c.create('secrets', 'b', secret('of-nobody', [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'ghost', uid: '00000000-0000-0000-0000-000000000000' }]));
    await c.create('secrets', 'b', secret('of-unserved', [{ apiVersion: 'example.com/v1', kind: 'Widget', name: 'w', uid: '00000000-0000-0000-0000-000000000001' }]));
    // A cluster-scoped object cannot have a namespaced owner: never taken as gone.
    await c.create('namespaces', '', { metadata: { name: 'c', ownerReferences: [ref(inA)] } });
    await gc.settled();
    expect(await names(c, 'secrets', 'a')).toEqual(['same-ns']);
    expect(await names(c, 'secrets', 'b')).toEqual(['of-node', 'of-unserved']);
    await c.delete('nodes', '', 'n1');
    await c.delete('configmaps', 'a', 'owner');
    await gc.settled();
    expect(await names(c, 'secrets', 'a')).toEqual([]);
    expect(await names(c, 'secrets', 'b')).toEqual(['of-unserved']);
    expect(await gone(c, 'namespaces', '', 'c')).toBe(false);
  });

  it('never deletes a manifest file\'s object; its API dependents go when the file\'s object does, not before the files are in', async () => {
    const { store, c, gc } = world({ waitForOwners: true });
    const kind = store.kind('configmaps')!;
    const fileUid = '11111111-1111-1111-1111-111111111111';
    // Written through the API before the files are shown (as after a restart).
    await c.create('secrets', 'default', secret('api-made', [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'from-file', uid: fileUid }]));
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['api-made']);
    store.mirror(kind, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'from-file', uid: fileUid } }, 'the manifest file /etc/skiff/x.yaml');
    // A file's object naming a gone owner stays: the file owns it.
    store.mirror(kind, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'file-dependent', uid: '22222222-2222-2222-2222-222222222222', ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'ghost', uid: '33333333-3333-3333-3333-333333333333' }] } }, 'the manifest file /etc/skiff/y.yaml');
    gc.ownersShown();
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['api-made']);
    // An edit of the file gives its object a new uid: the same object still, its dependents stay.
    store.mirror(kind, { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'from-file', uid: '44444444-4444-4444-4444-444444444444', labels: { edited: 'yes' } } }, 'the manifest file /etc/skiff/x.yaml');
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['api-made']);
    expect(await names(c, 'configmaps')).toEqual(['file-dependent', 'from-file']);
    store.unmirror(kind, 'default', 'from-file');
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual([]);
    expect(await names(c, 'configmaps')).toEqual(['file-dependent']);
  });

  it('refuses malformed owner references and both GC finalizers at once, as the API server does', async () => {
    const { c } = world();
    expect(await reason(c.create('secrets', 'default', secret('s', [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'x' }])))).toBe('422 Invalid: Secret "s" is invalid: metadata.ownerReferences.uid: Invalid value: "": uid must not be empty');
    expect(await reason(c.create('secrets', 'default', secret('s', [{ apiVersion: 'v1', kind: 'Event', name: 'e', uid: 'u' }])))).toMatch(/Kind=Event is disallowed from being an owner/);
    expect(await reason(c.create('secrets', 'default', secret('s', [{ apiVersion: 'v1', kind: 'ConfigMap', name: 'x', uid: 'u1', controller: true }, { apiVersion: 'v1', kind: 'ConfigMap', name: 'y', uid: 'u2', controller: true }])))).toMatch(
      /Only one reference can have Controller set to true\. Found "true" in references for ConfigMap\/x and ConfigMap\/y/,
    );
    expect(await reason(c.create('secrets', 'default', secret('s', [], { finalizers: ['orphan', 'foregroundDeletion'] })))).toMatch(/finalizer orphan and foregroundDeletion cannot be both set/);
  });

  it('breaks ownership cycles: A owns B owns A, and one that owns itself, in the foreground and the background', async () => {
    const { c, gc } = world();
    for (const policy of ['Foreground', 'Background'] as const) {
      const a = await c.create('configmaps', 'default', cm('a'));
      const b = await c.create('configmaps', 'default', cm('b', [ref(a, { blockOwnerDeletion: true })]));
      await c.patch('configmaps', 'default', 'a', 'merge', { metadata: { ownerReferences: [ref(b, { blockOwnerDeletion: true })] } });
      const self = await c.create('configmaps', 'default', cm('self'));
      await c.patch('configmaps', 'default', 'self', 'merge', { metadata: { ownerReferences: [ref(self, { blockOwnerDeletion: true })] } });
      await gc.settled();
      expect(await names(c, 'configmaps')).toEqual(['a', 'b', 'self']);
      await c.delete('configmaps', 'default', 'a', { propagationPolicy: policy });
      await c.delete('configmaps', 'default', 'self', { propagationPolicy: policy });
      await gc.settled();
      expect(await names(c, 'configmaps')).toEqual([]);
    }
  });

  it('collects a 100,000-long chain and a dependent of 10,000 owners in bounded batches, the event loop answering meanwhile', { timeout: 240_000 }, async () => {
    const { store, c, gc } = world({ maxObjects: 200_000 });
    const kind = store.kind('configmaps')!;
    let prev = store.create(kind, 'default', cm('link-0'));
    for (let i = 1; i < 100_000; i++) prev = store.create(kind, 'default', cm(`link-${i}`, [ref(prev, { blockOwnerDeletion: true })]));
    const owners: object[] = [];
    for (let i = 0; i < 10_000; i++) owners.push(ref(store.create(kind, 'default', cm(`owner-${i}`, [], { labels: { owner: 'yes' } }))));
    store.create(store.kind('secrets')!, 'default', secret('many', owners));
    await gc.settled();
    // The loop's longest stall while the collector works.
    store.delete(kind, 'default', 'link-0', { propagationPolicy: 'Foreground' });
    store.deleteCollection(kind, { namespace: 'default', labelSelector: 'owner=yes' });
    let last = performance.now();
    let worst = 0;
    const tick = setInterval(() => {
      const t = performance.now();
      worst = Math.max(worst, t - last);
      last = t;
    }, 5);
    const began = performance.now();
    try {
      // Meanwhile a request is answered at once.
      const t0 = performance.now();
      await new Promise((r) => setTimeout(r, 20));
      await c.create('configmaps', 'default', cm('unrelated'));
      expect(performance.now() - t0).toBeLessThan(1000);
      expect(gc.pending).toBeGreaterThan(0);
      await gc.settled();
    } finally {
      clearInterval(tick);
    }
    console.log(`collected in ${Math.round(performance.now() - began)} ms, longest stall ${Math.round(worst)} ms`);
    expect(await names(c, 'configmaps')).toEqual(['unrelated']);
    expect(await names(c, 'secrets')).toEqual([]);
    expect(worst).toBeLessThan(500);
  });

  it('picks an interrupted foreground deletion up again after the store is reopened', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-gc-'));
    dirs.push(dir);
    const file = path.join(dir, 'api.db');
    {
      const { c, gc, store } = world({ persistence: openApiDb(file) });
      const owner = await c.create('configmaps', 'default', cm('owner'));
      await c.create('secrets', 'default', secret('held', [ref(owner, { blockOwnerDeletion: true })], { finalizers: ['example.com/hold'] }));
      await c.create('secrets', 'default', secret('free', [ref(owner)]));
      await c.delete('configmaps', 'default', 'owner', { propagationPolicy: 'Foreground' });
      // Stopped before the collector ran at all.
      gc.stop();
      store.close();
      stops.pop();
    }
    const { c, gc } = world({ persistence: openApiDb(file) });
    await gc.settled();
    expect(await names(c, 'secrets')).toEqual(['held']);
    expect((await c.get('configmaps', 'default', 'owner')).metadata.finalizers).toEqual(['foregroundDeletion']);
    await c.patch('secrets', 'default', 'held', 'merge', { metadata: { finalizers: null } });
    await gc.settled();
    expect(await names(c, 'configmaps')).toEqual([]);
    expect(await names(c, 'secrets')).toEqual([]);
  });
});
