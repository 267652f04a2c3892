/**
 * Server-side apply and managed fields in the node API's store: the FieldsV1
 * encoding, the merge over keyed lists, removal of fields an applier drops,
 * conflicts (and force), ownership moving with Updates, dry run, and the
 * bounds on a hostile apply body.
 */
import { describe, expect, it } from 'vitest';
import { applyObject, parseApplyBody } from '../../src/api/apply.js';
import { ApiError } from '../../src/api/errors.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { typeOf } from '../../src/api/list-types.js';
import { compare, fieldSetOf, FieldSet, pathString, updateTracker } from '../../src/api/managed-fields.js';
import { applyPatch } from '../../src/api/patch.js';
import { Store, timestamp } from '../../src/api/store.js';
import type { ApiObject, Kind, Obj } from '../../src/api/types.js';

const KINDS = nodeKinds('test-node');
const kindOf = (plural: string): Kind => KINDS.find((k) => k.plural === plural)!;
const CM = kindOf('configmaps');
const POD = kindOf('pods');
const DEPLOY = kindOf('deployments');

function setup() {
  let t = Date.parse('2026-01-01T00:00:00Z');
  const store = new Store({ kinds: KINDS, now: () => t });
  const now = () => timestamp(t);
  const tick = () => (t += 1000);
  const apply = (kind: Kind, name: string, config: Obj, manager: string, extra: { force?: boolean; dryRun?: boolean; status?: boolean } = {}) =>
    applyObject(store, kind, 'default', name, config, { manager, force: extra.force ?? false, dryRun: extra.dryRun ?? false, status: extra.status ?? false, now });
  const tracker = (kind: Kind, manager: string, subresource?: string) =>
    updateTracker({ manager, apiVersion: kind.group ? `${kind.group}/${kind.version}` : kind.version, type: typeOf(kind), scope: subresource === 'status' ? 'status' : kind.status ? 'main' : 'all', subresource, now });
  const update = (kind: Kind, name: string, change: (o: Obj) => Obj, manager: string) =>
    store.patch(kind, 'default', name, (cur) => change(cur as Obj), { fields: tracker(kind, manager) });
  return { store, apply, update, tracker, tick };
}

const entry = (o: ApiObject, manager: string) => (o.metadata.managedFields ?? []).find((e) => e.manager === manager) as Obj | undefined;

function thrown(f: () => unknown): ApiError {
  try {
    f();
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error('no error');
}

const deployment = (image: string, extra: Obj = {}) => ({
  apiVersion: 'apps/v1',
  kind: 'Deployment',
  metadata: { name: 'web' },
  spec: {
    ...extra,
    selector: { matchLabels: { app: 'web' } },
    template: { metadata: { labels: { app: 'web' } }, spec: { containers: [{ name: 'web', image, ports: [{ containerPort: 80 }] }] } },
  },
});

describe('FieldsV1', () => {
  it('encodes keyed items, set items and the item itself as the API server does', () => {
    const set = fieldSetOf(
      {
        metadata: { labels: { app: 'web' }, finalizers: ['a/b'] },
        spec: { containers: [{ name: 'web', image: 'nginx', args: ['-x'], ports: [{ containerPort: 80 }] }], tolerations: [{ key: 'k' }] },
      },
      typeOf(POD),
    );
    expect(set.toJSON()).toEqual({
      'f:metadata': { 'f:labels': { 'f:app': {} }, 'f:finalizers': { 'v:"a/b"': {} } },
      'f:spec': {
        'f:containers': {
          'k:{"name":"web"}': { '.': {}, 'f:args': {}, 'f:image': {}, 'f:name': {}, 'f:ports': { 'k:{"containerPort":80,"protocol":"TCP"}': { '.': {}, 'f:containerPort': {} } } },
        },
        'f:tolerations': {},
      },
    });
    expect(FieldSet.fromJSON(set.toJSON()).equals(set)).toBe(true);
    expect(set.paths().map(pathString)).toContain('.spec.containers[name="web"].ports[containerPort=80,protocol="TCP"].containerPort');
  });

  it('an Update owns the maps it adds ("." ) but not the value structs every object has', () => {
    const c = compare({ metadata: {} }, { metadata: { labels: { a: '1' } }, data: { k: 'v' } }, typeOf(CM));
    expect(c.added.toJSON()).toEqual({ 'f:data': { '.': {}, 'f:k': {} }, 'f:metadata': { 'f:labels': { '.': {}, 'f:a': {} } } });
  });
});

describe('apply', () => {
  it('creates, then merges, then removes the fields the applier no longer sets', () => {
    const { apply, update, store } = setup();
    const first = apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c', labels: { x: '1' } }, data: { a: '1', b: '2' } }, 'tool');
    expect(first.created).toBe(true);
    expect(entry(first.object, 'tool')).toEqual({
      manager: 'tool', operation: 'Apply', apiVersion: 'v1', time: '2026-01-01T00:00:00Z', fieldsType: 'FieldsV1',
      fieldsV1: { 'f:data': { 'f:a': {}, 'f:b': {} }, 'f:metadata': { 'f:labels': { 'f:x': {} } } },
    });
    // Another writer adds a key of its own; the applier drops b: b goes, c stays.
    update(CM, 'c', (o) => ({ ...o, data: { ...(o.data as Obj), c: '3' } }), 'editor');
    const second = apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' }, data: { a: '1' } }, 'tool');
    expect(second.created).toBe(false);
    expect(second.object.data).toEqual({ a: '1', c: '3' });
    expect(second.object.metadata.labels).toEqual({});
    expect(entry(second.object, 'editor')!.fieldsV1).toEqual({ 'f:data': { 'f:c': {} } });
    expect(store.get(CM, 'default', 'c').data).toEqual({ a: '1', c: '3' });
  });

  it('merges containers by name and keeps the fields of a container it does not mention', () => {
    const { apply } = setup();
    apply(DEPLOY, 'web', deployment('nginx:1'), 'a');
    const sidecar = { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web' }, spec: { template: { spec: { containers: [{ name: 'log', image: 'busybox' }] } } } };
    const out = apply(DEPLOY, 'web', sidecar, 'b').object;
    const containers = ((out.spec as Obj).template as { spec: { containers: Obj[] } }).spec.containers;
    expect(containers.map((c) => [c.name, c.image])).toEqual([['web', 'nginx:1'], ['log', 'busybox']]);
    expect((containers[0]!.ports as Obj[])[0]!.containerPort).toBe(80);
  });

  it('refuses a conflicting change with one cause per field, and force takes the fields over', () => {
    const { apply, update } = setup();
    apply(DEPLOY, 'web', deployment('nginx:1', { replicas: 1 }), 'a');
    // kubectl scale: an Update that moves spec.replicas to its manager.
    update(DEPLOY, 'web', (o) => ({ ...o, spec: { ...(o.spec as Obj), replicas: 3 } }), 'kubectl-scale');
    const err = thrown(() => apply(DEPLOY, 'web', deployment('nginx:2', { replicas: 1 }), 'a'));
    expect(err.code).toBe(409);
    expect(err.reason).toBe('Conflict');
    expect(err.message).toBe('Apply failed with 1 conflict: conflict with "kubectl-scale" using apps/v1: .spec.replicas');
    expect(err.details?.causes).toEqual([{ reason: 'FieldManagerConflict', message: 'conflict with "kubectl-scale" using apps/v1', field: '.spec.replicas' }]);
    // Two appliers disagreeing on two fields.
    const two = thrown(() => apply(DEPLOY, 'web', deployment('nginx:9', { replicas: 3, minReadySeconds: 0 }), 'b'));
    expect(two.message).toBe('Apply failed with 1 conflict: conflict with "a": .spec.template.spec.containers[name="web"].image');
    const out = apply(DEPLOY, 'web', deployment('nginx:2', { replicas: 1 }), 'a', { force: true }).object;
    expect((out.spec as Obj).replicas).toBe(1);
    expect(entry(out, 'kubectl-scale')).toBeUndefined();
  });

  it('shares a field applied with the same value, so neither conflicts', () => {
    const { apply } = setup();
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } }, 'x');
    const out = apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1', b: '2' } }, 'y').object;
    expect(entry(out, 'x')!.fieldsV1).toEqual({ 'f:data': { 'f:a': {} } });
    expect(entry(out, 'y')!.fieldsV1).toEqual({ 'f:data': { 'f:a': {}, 'f:b': {} } });
    // x drops a: y still owns it, so it stays.
    const after = apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: {} }, 'x').object;
    expect(after.data).toEqual({ a: '1', b: '2' });
  });

  it('a dry run answers the result and stores nothing', () => {
    const { apply, store } = setup();
    const made = apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } }, 'x', { dryRun: true });
    expect(made.created).toBe(true);
    expect(made.object.data).toEqual({ a: '1' });
    expect(() => store.get(CM, 'default', 'c')).toThrow(/not found/);
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } }, 'x');
    const rv = store.get(CM, 'default', 'c').metadata.resourceVersion;
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '2' } }, 'x', { dryRun: true });
    expect(store.get(CM, 'default', 'c').data).toEqual({ a: '1' });
    expect(store.get(CM, 'default', 'c').metadata.resourceVersion).toBe(rv);
  });

  it('an unchanged apply keeps the resourceVersion and the entry time', () => {
    const { apply, tick } = setup();
    const cfg = { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } };
    const a = apply(CM, 'c', cfg, 'x').object;
    tick();
    const b = apply(CM, 'c', cfg, 'x').object;
    expect(b.metadata.resourceVersion).toBe(a.metadata.resourceVersion);
    expect(b.metadata.managedFields).toEqual(a.metadata.managedFields);
  });

  it('a status apply changes only status and is recorded with its subresource', () => {
    const { apply, store } = setup();
    apply(DEPLOY, 'web', deployment('nginx:1'), 'a');
    const out = apply(DEPLOY, 'web', { apiVersion: 'apps/v1', kind: 'Deployment', spec: { replicas: 9 }, status: { replicas: 5 } }, 'ctl', { status: true }).object;
    expect((out.status as Obj).replicas).toBe(5);
    expect((out.spec as Obj).replicas).toBe(1);
    const e = entry(out, 'ctl')!;
    expect(e.subresource).toBe('status');
    expect(e.fieldsV1).toEqual({ 'f:status': { 'f:replicas': {} } });
    // The main resource's apply never touches status.
    const main = apply(DEPLOY, 'web', { ...deployment('nginx:1'), status: { replicas: 0 } }, 'a').object;
    expect((main.status as Obj).replicas).toBe(5);
    expect(store.get(DEPLOY, 'default', 'web').status).toEqual(main.status);
  });

  it('refuses an apply body with managedFields, without a kind, or with a different name', () => {
    const { apply } = setup();
    expect(thrown(() => apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { managedFields: [{}] } }, 'x')).message).toBe('metadata.managedFields must be nil');
    expect(thrown(() => apply(CM, 'c', { apiVersion: 'v1' }, 'x')).message).toBe('invalid object type: v1, Kind=');
    expect(thrown(() => apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'd' } }, 'x')).code).toBe(400);
    expect(thrown(() => applyObject(new Store({ kinds: KINDS }), CM, 'nope', 'c', { apiVersion: 'v1', kind: 'ConfigMap' }, { manager: 'x', force: false, dryRun: false, status: false, now: () => '' })).code).toBe(404);
  });

  it('refuses duplicate items of a keyed list', () => {
    const { apply } = setup();
    const dup = deployment('a');
    (dup.spec.template.spec.containers as Obj[]).push({ name: 'web', image: 'b' });
    expect(thrown(() => apply(DEPLOY, 'web', dup, 'x')).code).toBe(422);
  });
});

describe('Updates', () => {
  it('record the fields they change under their manager and take them from others', () => {
    const { apply, update } = setup();
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1', b: '2' } }, 'x');
    const out = update(CM, 'c', (o) => ({ ...o, data: { a: 'changed', b: '2' } }), 'kubectl-edit');
    expect(entry(out, 'x')!.fieldsV1).toEqual({ 'f:data': { 'f:b': {} } });
    expect(entry(out, 'kubectl-edit')).toMatchObject({ operation: 'Update', apiVersion: 'v1', fieldsV1: { 'f:data': { 'f:a': {} } } });
  });

  it('let a client replace the entries with a valid list, and keep them when it sends none', () => {
    const { apply, update } = setup();
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } }, 'x');
    const kept = update(CM, 'c', (o) => ({ ...o, metadata: { ...(o.metadata as Obj), managedFields: [] }, data: { a: '1', z: '0' } }), 'y');
    expect(kept.metadata.managedFields!.map((e) => e.manager)).toEqual(['x', 'y']);
    const replaced = update(CM, 'c', (o) => ({ ...o, metadata: { ...(o.metadata as Obj), managedFields: [{ manager: 'moved', operation: 'Apply', apiVersion: 'v1', fieldsType: 'FieldsV1', fieldsV1: { 'f:data': { 'f:a': {} } } }] } }), 'y');
    expect(replaced.metadata.managedFields!.map((e) => e.manager)).toEqual(['moved']);
    const bad = thrown(() => update(CM, 'c', (o) => ({ ...o, metadata: { ...(o.metadata as Obj), managedFields: [{ manager: 'm', operation: 'Steal' }] } }), 'y'));
    expect(bad.code).toBe(422);
    // One empty entry strips them all.
    const reset = update(CM, 'c', (o) => ({ ...o, metadata: { ...(o.metadata as Obj), managedFields: [{}] }, data: { a: '1', z: '1' } }), 'y');
    expect(reset.metadata.managedFields).toBeUndefined();
    expect(reset.data).toEqual({ a: '1', z: '1' });
  });

  it('record a create with defaults owned by the creator, and merge strategic patches of containers by name', () => {
    const { store, tracker } = setup();
    const pod = store.create(POD, 'default', { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' }, spec: { containers: [{ name: 'c', image: 'busybox' }] } }, { fields: tracker(POD, 'kubectl-create') });
    const e = entry(pod, 'kubectl-create')!;
    const containers = (e.fieldsV1 as { 'f:spec': { 'f:containers': Obj } })['f:spec']['f:containers'];
    expect(Object.keys(containers)).toEqual(['k:{"name":"c"}']);
    expect((containers['k:{"name":"c"}'] as Obj)['.']).toEqual({});
    expect(e.fieldsV1).not.toHaveProperty(['f:status']);
    const patched = applyPatch('strategic', pod as Obj, { spec: { $setElementOrder: undefined, containers: [{ name: 'c', image: 'busybox:2' }] } });
    const c = ((patched.spec as Obj).containers as Obj[])[0]!;
    expect(c.image).toBe('busybox:2');
    expect(c.terminationMessagePath).toBe('/dev/termination-log');
  });

  it('keep at most ten Update managers, folding the oldest into ancient-changes', () => {
    const { apply, update, tick } = setup();
    apply(CM, 'c', { apiVersion: 'v1', kind: 'ConfigMap', data: {} }, 'x');
    let out: ApiObject | undefined;
    for (let i = 0; i < 14; i++) {
      tick();
      out = update(CM, 'c', (o) => ({ ...o, data: { ...(o.data as Obj), [`k${i}`]: 'v' } }), `m${i}`);
    }
    const updates = out!.metadata.managedFields!.filter((e) => e.operation === 'Update');
    expect(updates.length).toBe(10);
    expect(updates.map((e) => e.manager)).toContain('ancient-changes');
  });
});

describe('hostile apply bodies', () => {
  it('refuses a YAML alias bomb before expanding it', () => {
    const lines = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'];
    for (let i = 1; i < 9; i++) lines.push(`${String.fromCharCode(97 + i)}: &${String.fromCharCode(97 + i)} [${Array(10).fill(`*${String.fromCharCode(96 + i)}`).join(',')}]`);
    const start = Date.now();
    const err = thrown(() => parseApplyBody(`apiVersion: v1\nkind: ConfigMap\ndata:\n${lines.map((l) => `  ${l}`).join('\n')}\n`, false));
    expect(err.code).toBe(413);
    expect(Date.now() - start).toBeLessThan(2000);
  });

  it('refuses deep nesting in YAML and in JSON, and a body with too many fields', () => {
    expect(thrown(() => parseApplyBody(`${'['.repeat(5000)}${']'.repeat(5000)}`, false)).code).toBe(400);
    expect(thrown(() => parseApplyBody(`{"a":${'['.repeat(5000)}${']'.repeat(5000)}}`, false)).code).toBe(400);
    let deep = 'x: 1';
    for (let i = 0; i < 300; i++) deep = `a:\n${deep.split('\n').map((l) => `  ${l}`).join('\n')}`;
    expect(thrown(() => parseApplyBody(deep, false)).code).toBe(413);
    const many = Array.from({ length: 150_000 }, (_, i) => `k${i}: v`).join('\n');
    expect([400, 413]).toContain(thrown(() => parseApplyBody(many, false)).code);
  });

  it('takes YAML 1.1 and JSON, and refuses duplicate keys only under Strict', () => {
    expect(parseApplyBody('apiVersion: v1\nkind: ConfigMap\ndata:\n  a: "1"\n', false)).toEqual({ apiVersion: 'v1', kind: 'ConfigMap', data: { a: '1' } });
    expect(parseApplyBody('{"apiVersion":"v1","kind":"ConfigMap"}', true)).toEqual({ apiVersion: 'v1', kind: 'ConfigMap' });
    expect(thrown(() => parseApplyBody('a: 1\na: 2\n', true)).code).toBe(400);
    expect(thrown(() => parseApplyBody('- 1\n', false)).code).toBe(400);
  });
});
