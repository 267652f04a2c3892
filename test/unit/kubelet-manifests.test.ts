import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  isManifestName,
  listManifestFiles,
  MAX_MANIFEST_BYTES,
  parseManifest,
  readManifestFile,
} from '../../src/kubelet-lite/manifests.js';
import type { ObjectChange } from '../../src/kubelet-lite/model.js';
import { objectUid, ObjectStore } from '../../src/kubelet-lite/store.js';

const pod = (name: string, image = 'busybox:1.36', extra = '') => `apiVersion: v1
kind: Pod
metadata:
  name: ${name}
spec:
  containers:
  - name: main
    image: ${image}
${extra}`;

const summary = (changes: ObjectChange[]) => changes.map((c) => `${c.type} ${c.object.kind}/${c.object.namespace}/${c.object.name}`);

describe('parseManifest', () => {
  it('loads every good document of a multi-document file and reports the bad one with its line', () => {
    const text = [
      pod('first').trimEnd(), // lines 1-8
      '---',
      'apiVersion: v1', // 10
      'kind: Pod',
      'metadata:',
      '  name: second',
      'spec:',
      '  containers:',
      '  - name: main',
      '    image: ""', // 17: the offending node
      '---',
      'apiVersion: v1',
      'kind: ConfigMap',
      'metadata: {name: third, namespace: kube-system}',
      'data: {a: "1"}',
      '',
    ].join('\n');
    const m = parseManifest('/d/pods.yaml', text);
    expect(m.objects.map((o) => `${o.kind}/${o.namespace}/${o.name}@${o.source.document}:${o.source.line}`)).toEqual([
      'Pod/default/first@0:1',
      'ConfigMap/kube-system/third@2:19',
    ]);
    expect(m.problems).toHaveLength(1);
    expect(m.problems[0]).toMatchObject({ file: '/d/pods.yaml', object: 'Pod/default/second' });
    expect(m.problems[0]!.reason).toContain('spec.containers[0].image: Required value');
    expect(m.problems[0]!.line).toBe(17);
    // A missing field points at the object that should hold it: the container, line 16.
    const missing = parseManifest('/d/p.yaml', text.replace('    image: ""\n', ''));
    expect(missing.problems[0]!.line).toBe(16);
  });

  it('points a type error at the offending line and keeps the documents after a YAML syntax error', () => {
    const text = [
      pod('a', 'busybox', '    ports:\n    - containerPort: "80"').trimEnd(), // 1-10, containerPort on line 10
      '---',
      'a: [unclosed', // 12
      '---',
      pod('b'),
    ].join('\n');
    const m = parseManifest('f.yml', text);
    expect(m.objects.map((o) => o.name)).toEqual(['b']);
    expect(m.problems.map((p) => p.line)).toEqual([10, 13]);
    expect(m.problems[0]!.reason).toBe('spec.containers[0].ports[0].containerPort: Invalid type: expected integer, got string');
    expect(m.problems[1]!.reason).toMatch(/^invalid YAML: .*document starting at line 12/);
  });

  it('skips empty documents and comments silently', () => {
    const m = parseManifest('f.yaml', `---\n---\n# nothing here\n---\n${pod('x')}---\n\n`);
    expect(m.problems).toEqual([]);
    expect(m.objects.map((o) => o.name)).toEqual(['x']);
  });

  it('reads JSON manifests, tabs and all, and keeps every kind', () => {
    const json = JSON.stringify(
      { apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name: 'web' }, spec: { replicas: 2 } },
      null,
      '\t',
    );
    const m = parseManifest('d.json', json);
    expect(m.problems).toEqual([]);
    expect(m.objects[0]).toMatchObject({ apiVersion: 'apps/v1', kind: 'Deployment', namespace: 'default', name: 'web' });
  });

  it.each([
    ['no apiVersion', 'kind: Pod\nmetadata: {name: a}\n', 'apiVersion: Required value'],
    ['no kind', 'apiVersion: v1\nmetadata: {name: a}\n', 'kind: Required value'],
    ['no name', 'apiVersion: v1\nkind: Service\nmetadata: {}\n', 'metadata.name: Required value'],
    ['name of the wrong type', 'apiVersion: v1\nkind: Service\nmetadata: {name: [a]}\n', 'metadata.name: Invalid type: expected string, got array'],
    ['metadata a string', 'apiVersion: v1\nkind: Service\nmetadata: x\n', 'metadata: Invalid type: expected object, got string'],
    ['a list', '- a\n- b\n', 'a manifest must be an object, not array'],
    ['a scalar', 'hello\n', 'a manifest must be an object, not string'],
    ['containers a string', 'apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {containers: x}\n', 'spec.containers: Invalid type: expected array, got string'],
    ['duplicate keys', 'apiVersion: v1\nkind: Pod\nkind: Pod\nmetadata: {name: a}\n', 'invalid YAML'],
  ])('reports %s as a problem', (_, text, reason) => {
    const m = parseManifest('f.yaml', text);
    expect(m.objects).toEqual([]);
    expect(m.problems).toHaveLength(1);
    expect(m.problems[0]!.reason).toContain(reason);
  });

  it('reads YAML 1.1 as the API machinery does: octal modes, dates stay strings', () => {
    const m = parseManifest(
      'f.yaml',
      pod('a', 'busybox', '  volumes:\n  - name: v\n    configMap: {name: c, defaultMode: 0600}\n  nodeSelector: {since: 2001-12-14}\n'),
    );
    expect(m.problems).toEqual([]);
    const spec = m.objects[0]!.object.spec as { volumes: { configMap: { defaultMode: number } }[]; nodeSelector: Record<string, unknown> };
    expect(spec.volumes[0]!.configMap.defaultMode).toBe(0o600);
    expect(spec.nodeSelector.since).toBe('2001-12-14');
  });

  it('refuses few aliases of a big anchor, and keeps ordinary anchors', () => {
    // 99 aliases is under yaml's alias count; 99 copies of 20,000 values is not a manifest.
    const big = `x: &big [${'0,'.repeat(20_000)}0]\n` + Array.from({ length: 99 }, (_, i) => `y${i}: *big`).join('\n');
    const m = parseManifest('wide.yaml', `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: wide}\n${big}\n`);
    expect(m.objects).toEqual([]);
    expect(m.problems[0]!.reason).toMatch(/aliases expand it to more than \d+ nodes/);
    const ok = parseManifest('ok.yaml', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: ok}\nenvs: &e {A: "1", B: "2"}\ndata: *e\n');
    expect(ok.problems).toEqual([]);
    expect(ok.objects[0]!.object.data).toEqual({ A: '1', B: '2' });
  });

  it('refuses an alias bomb', () => {
    const bomb = [
      'apiVersion: v1',
      'kind: ConfigMap',
      'metadata: {name: bomb}',
      'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
      'b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]',
      'c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]',
      'd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]',
      'e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]',
      'f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]',
      'g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]',
      '---',
      'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: fine}',
    ].join('\n');
    const started = Date.now();
    const m = parseManifest('bomb.yaml', bomb);
    expect(Date.now() - started).toBeLessThan(2000);
    expect(m.problems).toHaveLength(1);
    expect(m.problems[0]!.reason).toMatch(/alias/i);
    expect(m.objects.map((o) => o.name)).toEqual(['fine']);
  });

  it('refuses binary garbage and text that is not UTF-8 without throwing', () => {
    let seed = 12345;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed & 0xff);
    const garbage = Uint8Array.from({ length: 64 * 1024 }, rnd);
    const m = parseManifest('g.yaml', garbage);
    expect(m.objects).toEqual([]);
    expect(m.problems).toHaveLength(1);
    const nul = parseManifest('n.yaml', Buffer.from('apiVersion: v1\nkind: Pod\0\n'));
    expect(nul.problems[0]).toMatchObject({ line: 2, reason: expect.stringContaining('NUL') });
    // Many random byte strings: whatever they are, the parser gives objects or problems, never an exception.
    for (let i = 0; i < 200; i++) {
      const bytes = Uint8Array.from({ length: 1 + (rnd() * 4) }, () => 0x20 + (rnd() % 0x5f));
      expect(() => parseManifest('r.yaml', bytes)).not.toThrow();
    }
  });

  it('survives absurdly deep nesting: that document is a problem, the next one loads', () => {
    const depth = 100_000;
    const text = `apiVersion: v1\nkind: Service\nmetadata: {name: deep}\nspec: ${'['.repeat(depth)}${']'.repeat(depth)}\n---\n${pod('after')}`;
    const started = Date.now();
    const m = parseManifest('deep.yaml', text);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(m.objects.map((o) => o.name)).toEqual(['after']);
    expect(m.problems).toHaveLength(1);
  });

  it('refuses text larger than the cap', () => {
    const m = parseManifest('big.yaml', Buffer.alloc(MAX_MANIFEST_BYTES + 1, 0x20));
    expect(m.problems[0]!.reason).toContain('more than the limit');
  });

  it.each([
    ['a.yaml', true],
    ['a.yml', true],
    ['a.json', true],
    ['A.YAML', true],
    ['.hidden.yaml', false],
    ['a.yaml~', false],
    ['a.yaml.swp', false],
    ['a.txt', false],
  ])('isManifestName(%s) is %s', (name, want) => {
    expect(isManifestName(name)).toBe(want);
  });
});

describe('readManifestFile (real files)', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-manifests-'));
  });
  afterEach(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('lists only manifest files directly in the directory, sorted, dotfiles and subdirectories ignored', async () => {
    await fs.writeFile(path.join(dir, 'b.yaml'), pod('b'));
    await fs.writeFile(path.join(dir, 'a.json'), '{}');
    await fs.writeFile(path.join(dir, '.a.yaml'), pod('hidden'));
    await fs.writeFile(path.join(dir, 'notes.txt'), 'x');
    await fs.mkdir(path.join(dir, 'sub.yaml'));
    await fs.mkdir(path.join(dir, 'sub'));
    await fs.writeFile(path.join(dir, 'sub', 'c.yaml'), pod('c'));
    const files = await listManifestFiles(dir);
    expect(files.map((f) => path.basename(f))).toEqual(['a.json', 'b.yaml', 'sub.yaml']);
    expect(await readManifestFile(path.join(dir, 'sub.yaml'))).toEqual({ kind: 'skipped' });
  });

  it('refuses a 10 MiB file without reading all of it into the parser', async () => {
    const f = path.join(dir, 'huge.yaml');
    await fs.writeFile(f, Buffer.alloc(10 * 1024 * 1024, 0x61));
    const r = await readManifestFile(f);
    expect(r.kind).toBe('parsed');
    if (r.kind !== 'parsed') return;
    expect(r.manifest.objects).toEqual([]);
    expect(r.manifest.problems[0]!.reason).toContain(`${10 * 1024 * 1024} bytes, more than the limit`);
  });

  it('never blocks on a FIFO, even one behind a symlink', async () => {
    const fifo = path.join(dir, 'pipe.yaml');
    execFileSync('mkfifo', [fifo]);
    await fs.symlink(fifo, path.join(dir, 'link.yaml'));
    const started = Date.now();
    const [a, b] = await Promise.all([readManifestFile(fifo), readManifestFile(path.join(dir, 'link.yaml'))]);
    expect(Date.now() - started).toBeLessThan(2000);
    expect(a).toMatchObject({ kind: 'skipped', problem: { reason: 'not a regular file' } });
    expect(b).toMatchObject({ kind: 'skipped', problem: { reason: 'not a regular file' } });
  });

  it('follows a symlink to a regular file, and a dangling one is gone', async () => {
    await fs.writeFile(path.join(dir, 'target.txt'), pod('linked'));
    await fs.symlink(path.join(dir, 'target.txt'), path.join(dir, 'l.yaml'));
    await fs.symlink(path.join(dir, 'nowhere'), path.join(dir, 'dangling.yaml'));
    const r = await readManifestFile(path.join(dir, 'l.yaml'));
    expect(r.kind === 'parsed' && r.manifest.objects.map((o) => o.name)).toEqual(['linked']);
    expect(await readManifestFile(path.join(dir, 'dangling.yaml'))).toEqual({ kind: 'gone' });
    expect(await readManifestFile(path.join(dir, 'missing.yaml'))).toEqual({ kind: 'gone' });
  });

  it('tells an empty file (being written) from one that defines nothing', async () => {
    await fs.writeFile(path.join(dir, 'empty.yaml'), '');
    await fs.writeFile(path.join(dir, 'comment.yaml'), '# nothing yet\n');
    expect(await readManifestFile(path.join(dir, 'empty.yaml'))).toEqual({ kind: 'empty' });
    expect(await readManifestFile(path.join(dir, 'comment.yaml'))).toMatchObject({ kind: 'parsed', manifest: { objects: [], problems: [] } });
  });

  it('reports a device node as not a regular file', async () => {
    await fs.symlink('/dev/zero', path.join(dir, 'zero.yaml'));
    const r = await readManifestFile(path.join(dir, 'zero.yaml'));
    expect(r).toMatchObject({ kind: 'skipped', problem: { reason: 'not a regular file' } });
  });

  it('reads a file of exactly the cap and refuses one byte more', async () => {
    const f = path.join(dir, 'grow.yaml');
    await fs.writeFile(f, pod('g'));
    const r = await readManifestFile(f);
    expect(r.kind === 'parsed' && r.manifest.objects.map((o) => o.name)).toEqual(['g']);
    // Exactly at the cap is fine (all comments); one byte more is refused.
    await fs.writeFile(f, Buffer.concat([Buffer.from(pod('cap')), Buffer.alloc(MAX_MANIFEST_BYTES - pod('cap').length - 1, 0x23), Buffer.from('\n')]));
    const atCap = await readManifestFile(f);
    expect(atCap.kind === 'parsed' && atCap.manifest.problems).toEqual([]);
    await fs.appendFile(f, '#');
    const over = await readManifestFile(f);
    expect(over.kind === 'parsed' && over.manifest.problems[0]!.reason).toContain('more than the limit');
  });

  it('gives a stamp that changes when the file does', async () => {
    const f = path.join(dir, 'p.yaml');
    await fs.writeFile(f, pod('p'));
    const r1 = await readManifestFile(f);
    await fs.writeFile(f, pod('p', 'busybox:1.37'));
    const r2 = await readManifestFile(f);
    expect(r1.kind === 'parsed' && r2.kind === 'parsed' && r1.stamp !== r2.stamp).toBe(true);
  });
});

describe('ObjectStore', () => {
  const parsed = (file: string, text: string) => parseManifest(file, text);

  it('reports added, modified and deleted objects per file, with uids that follow the content', () => {
    const store = new ObjectStore({ nodeName: 'node-a' });
    const seen: string[][] = [];
    store.subscribe((c) => seen.push(summary(c)));
    expect(summary(store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', `${pod('p')}---\n${pod('q')}`)))).toEqual([
      'added Pod/default/p',
      'added Pod/default/q',
    ]);
    const uid1 = store.get('Pod', 'default', 'p')!.uid;
    expect(uid1).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-8[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    // Same content written again (even reformatted): nothing changes, the uid stays.
    const reformatted = JSON.stringify({ kind: 'Pod', apiVersion: 'v1', spec: { containers: [{ image: 'busybox:1.36', name: 'main' }] }, metadata: { name: 'p' } });
    expect(store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', `${reformatted}\n---\n${pod('q')}`))).toEqual([]);
    expect(store.get('Pod', 'default', 'p')!.uid).toBe(uid1);
    // An edit: modified, with a new uid; q is gone from the file.
    const changes = store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', pod('p', 'busybox:1.37')));
    expect(summary(changes)).toEqual(['deleted Pod/default/q', 'modified Pod/default/p']);
    expect(changes[1]!.object.uid).not.toBe(uid1);
    expect(summary(store.removeFile('/d/a.yaml'))).toEqual(['deleted Pod/default/p']);
    expect(store.removeFile('/d/a.yaml')).toEqual([]);
    expect(seen).toEqual([
      ['added Pod/default/p', 'added Pod/default/q'],
      ['deleted Pod/default/q', 'modified Pod/default/p'],
      ['deleted Pod/default/p'],
    ]);
    expect(store.list()).toEqual([]);
  });

  it('makes uids depend on the node name and ignores metadata.uid, as for static pods', () => {
    const o = { apiVersion: 'v1', kind: 'Pod', metadata: { name: 'p' } };
    const a = objectUid('node-a', 'Pod', 'default', 'p', o);
    expect(objectUid('node-b', 'Pod', 'default', 'p', o)).not.toBe(a);
    expect(objectUid('node-a', 'Pod', 'default', 'p', { ...o, metadata: { name: 'p', uid: 'chosen' } })).toBe(a);
    expect(objectUid('node-a', 'Pod', 'other', 'p', o)).not.toBe(a);
  });

  it('lets the first file by name win a duplicate, reports the other, and hands over when the winner goes', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    store.replaceFile('/d/b.yaml', parsed('/d/b.yaml', pod('dup', 'from-b')));
    const changes = store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', pod('dup', 'from-a')));
    // a.yaml sorts first: it takes over from b.yaml.
    expect(summary(changes)).toEqual(['modified Pod/default/dup']);
    expect(store.get('Pod', 'default', 'dup')!.source.file).toBe('/d/a.yaml');
    expect(store.problems()).toEqual([
      { file: '/d/b.yaml', line: 1, object: 'Pod/default/dup', reason: 'duplicate of Pod/default/dup in file /d/a.yaml (line 1); ignored' },
    ]);
    const handover = store.removeFile('/d/a.yaml');
    expect(summary(handover)).toEqual(['modified Pod/default/dup']);
    expect((handover[0]!.object.object.spec as { containers: { image: string }[] }).containers[0]!.image).toBe('from-b');
    expect(store.problems()).toEqual([]);
  });

  it('reports a duplicate inside one file; the first document wins', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', `${pod('x', 'one')}---\n${pod('x', 'two')}`));
    expect(store.list('Pod')).toHaveLength(1);
    expect(store.problems()).toMatchObject([{ file: '/d/a.yaml', line: 10, reason: expect.stringContaining('duplicate of Pod/default/x') }]);
  });

  it('keeps parse problems per file and drops them with the file', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    store.replaceFile('/d/bad.yaml', parsed('/d/bad.yaml', 'a: [\n'));
    store.replaceFile('/d/fifo.yaml', { objects: [], problems: [{ file: '/d/fifo.yaml', line: 1, reason: 'not a regular file' }] });
    expect(store.problems().map((p) => p.file)).toEqual(['/d/bad.yaml', '/d/fifo.yaml']);
    store.removeFile('/d/bad.yaml');
    expect(store.problems().map((p) => p.file)).toEqual(['/d/fifo.yaml']);
  });

  it('keeps what a file defined when it could not be read, with the failure as a problem until it is read again', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    const seen: string[][] = [];
    store.subscribe((c) => seen.push(summary(c)));
    store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', `${pod('p')}---\nnot: [valid\n`));
    const uid = store.get('Pod', 'default', 'p')!.uid;
    const failure = { file: '/d/a.yaml', line: 1, reason: 'cannot open: EMFILE: too many open files' };
    expect(store.keepFile('/d/a.yaml', failure)).toEqual([]);
    expect(store.keepFile('/d/a.yaml', failure)).toEqual([]);
    expect(store.get('Pod', 'default', 'p')!.uid).toBe(uid);
    // The failure is shown beside the problems of the content still in force.
    expect(store.problems()).toMatchObject([
      { file: '/d/a.yaml', line: 1, reason: 'cannot open: EMFILE: too many open files; keeping the object it defined when last read' },
      { file: '/d/a.yaml', reason: expect.stringContaining('invalid YAML') },
    ]);
    // Read again: the failure goes; what the file says now is what counts.
    expect(summary(store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', pod('p'))))).toEqual([]);
    expect(store.problems()).toEqual([]);
    // A file the store has nothing from: only the problem, as before.
    expect(store.keepFile('/d/b.yaml', { file: '/d/b.yaml', line: 1, reason: 'cannot parse: took more than 10 s' })).toEqual([]);
    expect(store.problems()).toEqual([{ file: '/d/b.yaml', line: 1, reason: 'cannot parse: took more than 10 s' }]);
    expect(seen).toEqual([['added Pod/default/p'], [], [], []]);
  });

  it('serves typed ConfigMaps and Secrets as the API would: stringData merged into base64 data', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    store.replaceFile(
      '/d/c.yaml',
      parsed(
        '/d/c.yaml',
        [
          'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg, namespace: ns1}\ndata: {"app.conf": "x=1"}',
          'apiVersion: v1\nkind: Secret\nmetadata: {name: sec, namespace: ns1}\ndata: {a: aGVsbG8=, b: b2xk}\nstringData: {b: new, c: "ü"}',
          'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: empty}',
          'apiVersion: v1\nkind: Service\nmetadata: {name: svc}\nspec: {ports: [{port: 80}]}',
        ].join('\n---\n'),
      ),
    );
    expect(store.configMap('ns1', 'cfg')!.data).toEqual({ 'app.conf': 'x=1' });
    expect(store.configMap('default', 'empty')!.data).toEqual({});
    expect(store.configMap('default', 'cfg')).toBeUndefined();
    const s = store.secret('ns1', 'sec')!;
    expect(s.type).toBe('Opaque');
    expect(s.stringData).toBeUndefined();
    expect(s.data).toEqual({ a: 'aGVsbG8=', b: Buffer.from('new').toString('base64'), c: Buffer.from('ü').toString('base64') });
    expect(store.list('Service').map((o) => o.name)).toEqual(['svc']);
  });

  it('hands out copies: changing what it returned changes nothing inside', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', pod('p')));
    const got = store.get('Pod', 'default', 'p')!;
    (got.object.metadata as { name: string }).name = 'changed';
    got.uid = 'x';
    expect(store.get('Pod', 'default', 'p')!.uid).not.toBe('x');
    expect((store.get('Pod', 'default', 'p')!.object.metadata as { name: string }).name).toBe('p');
  });

  it('keeps calling other listeners when one throws', () => {
    const store = new ObjectStore({ nodeName: 'n' });
    const got: number[] = [];
    store.subscribe(() => {
      throw new Error('listener bug');
    });
    const off = store.subscribe((c) => got.push(c.length));
    store.replaceFile('/d/a.yaml', parsed('/d/a.yaml', pod('p')));
    off();
    store.removeFile('/d/a.yaml');
    expect(got).toEqual([1]);
  });
});
