/**
 * The node's API driven by real kubectl binaries: 1.35 (from the npm
 * package, unpacked into build/bin by scripts/unpack-kubectl.sh) and 1.27
 * (the oldest the node image ships). The API runs in its own process on a
 * free port, with its real store, database and credentials, so a test can
 * kill -9 it; one test goes through a whole `skiff node` in a network namespace.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import https from 'node:https';
import os from 'node:os';
import path from 'node:path';
import tls from 'node:tls';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../helpers/daemon.js';
import { isRoot } from '../helpers/env.js';
import { TestNetns } from '../helpers/netns.js';
import { ApiProcess, KUBECTL_127, KUBECTL_135, run } from '../helpers/api-process.js';
import { freePort, waitFor } from '../helpers/registry.js';

const versions = [
  { name: '1.35', bin: KUBECTL_135, present: fs.existsSync(KUBECTL_135) },
  { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
];

if (!versions[0]!.present) throw new Error(`${KUBECTL_135} is missing: run ./scripts/unpack-kubectl.sh (scripts/setup.sh does) after npm ci`);

describe.skipIf(!isRoot)('the node API with real kubectl', () => {
  let base: string;
  let api: ApiProcess;

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-api-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort(), { SKIFF_API_MAX_UNREAD: String(64 * 1024), SKIFF_API_MAX_LIST_BYTES: String(4 * 1024 * 1024) });
    await api.start();
  }, 60_000);

  afterAll(async () => {
    await api?.kill('SIGTERM');
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  it('writes its credentials 0600 and refuses requests without a valid one with a 401 Status', async () => {
    for (const f of ['pki/ca.key', 'pki/server.key', 'pki/admin.key', 'admin.kubeconfig', 'api.db']) expect(fs.statSync(path.join(api.dir, f)).mode & 0o777, f).toBe(0o600);
    const cfg = fs.readFileSync(api.kubeconfig, 'utf8');
    const wrongToken = path.join(base, 'token.kubeconfig');
    await fsp.writeFile(wrongToken, cfg.replace(/client-certificate-data: .*/, 'token: not-a-token').replace(/ *client-key-data: .*\n/, ''));
    for (const v of versions.filter((x) => x.present)) {
      const r = await run(v.bin, ['get', 'ns'], { KUBECONFIG: wrongToken });
      expect(r.code, v.name).not.toBe(0);
      expect(r.stderr, v.name).toMatch(/error: You must be logged in to the server \((Unauthorized|the server has asked for the client to provide credentials)\)/);
    }
    // An empty kubeconfig names no server at all: kubectl fails before it reaches ours.
    const empty = path.join(base, 'empty.kubeconfig');
    await fsp.writeFile(empty, '');
    expect((await run(KUBECTL_135, ['get', 'ns'], { KUBECONFIG: empty })).code).not.toBe(0);
    // No client certificate at all.
    const bare = await new Promise<string>((resolve, reject) => {
      https.get({ host: '127.0.0.1', port: api.port, path: '/api/v1/namespaces', rejectUnauthorized: false }, (res) => {
        let t = '';
        res.on('data', (b: Buffer) => (t += b.toString()));
        res.on('end', () => resolve(`${res.statusCode} ${t}`));
      }).on('error', reject);
    });
    expect(bare).toBe('401 {"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}');
  });

  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}${v.present ? '' : ` (skipped: ${v.bin} is not installed)`}`, () => {
      const ns = `t${v.name.replace('.', '')}`;
      const k = (args: string[], input?: string) => run(v.bin, args, { KUBECONFIG: api.kubeconfig }, input);
      const ok = async (args: string[], input?: string) => {
        const r = await k(args, input);
        expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).toBe(0);
        return r.stdout;
      };

      it('version, api-resources, get ns', async () => {
        expect(await ok(['version'])).toMatch(/Server Version: .*v1\.35\.0-skiff/);
        const res = await ok(['api-resources']);
        expect(res).toMatch(/^configmaps\s+cm\s+v1\s+true\s+ConfigMap$/m);
        expect(res).toMatch(/^namespaces\s+ns\s+v1\s+false\s+Namespace$/m);
        expect(res).toMatch(/^secrets\s+v1\s+true\s+Secret$/m);
        expect(res).toMatch(/^events\s+ev\s+v1\s+true\s+Event$/m);
        const list = await ok(['get', 'ns']);
        expect(list.split('\n')[0]).toMatch(/^NAME\s+STATUS\s+AGE$/);
        for (const n of ['default', 'kube-system', 'kube-public', 'kube-node-lease']) expect(list).toMatch(new RegExp(`^${n}\\s+Active\\s+\\d+s$`, 'm'));
        await ok(['create', 'namespace', ns]);
      });

      it("a kind it does not serve gets the API's own answer: CRDs are listed (none), and one cannot be made", async () => {
        // kubectl's validation looks among the CRDs for a kind it does not know; with none, it names the kind as a cluster would.
        const old = await k(['apply', '-f', '-'], 'apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: old}\nspec: {}\n');
        expect(old.code).not.toBe(0);
        expect(old.stderr).toContain('no matches for kind "Deployment" in version "extensions/v1beta1"');
        expect(old.stderr).not.toContain('failed to check CRD');
        expect((await k(['get', 'crd'])).stderr).toContain('No resources found');
        expect(await ok(['api-resources', '--api-group', 'apiextensions.k8s.io', '--no-headers'])).toMatch(/^customresourcedefinitions\s+crd,crds\s+apiextensions\.k8s\.io\/v1\s+false\s+CustomResourceDefinition$/m);
        const crd = await k(['apply', '-f', '-'], 'apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {name: widgets.example.com}\nspec: {group: example.com, names: {kind: Widget, plural: widgets}, scope: Namespaced, versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]}\n');
        expect(crd.code).not.toBe(0);
        expect(crd.stderr).toContain('this node serves no custom resources');
      });

      it('create configmap; get -o yaml|json|name|wide; label, annotate, patch three ways; delete', async () => {
        expect(await ok(['-n', ns, 'create', 'configmap', 'web', '--from-literal=a=1', '--from-literal=b=2'])).toBe('configmap/web created\n');
        expect(await ok(['-n', ns, 'get', 'cm', 'web', '-o', 'yaml'])).toMatch(/^data:\n {2}a: "1"\n {2}b: "2"\nkind: ConfigMap\n/m);
        const json = JSON.parse(await ok(['-n', ns, 'get', 'cm', 'web', '-o', 'json'])) as { metadata: { uid: string; resourceVersion: string; namespace: string } };
        expect(json.metadata.namespace).toBe(ns);
        expect(json.metadata.uid).toMatch(/^[0-9a-f-]{36}$/);
        expect(await ok(['-n', ns, 'get', 'cm', '-o', 'name'])).toBe('configmap/web\n');
        expect(await ok(['-n', ns, 'get', 'cm', '-o', 'wide'])).toMatch(/^NAME\s+DATA\s+AGE\nweb\s+2\s+\d+s\n$/);
        expect(await ok(['-n', ns, 'label', 'cm', 'web', 'tier=front'])).toBe('configmap/web labeled\n');
        // kubectl 1.27 prints "annotate", later ones "annotated".
        expect(await ok(['-n', ns, 'annotate', 'cm', 'web', 'note=hello'])).toMatch(/^configmap\/web annotated?\n$/);
        await ok(['-n', ns, 'patch', 'cm', 'web', '--type', 'merge', '-p', '{"data":{"merged":"yes","a":null}}']);
        await ok(['-n', ns, 'patch', 'cm', 'web', '--type', 'json', '-p', '[{"op":"add","path":"/data/json","value":"yes"}]']);
        await ok(['-n', ns, 'patch', 'cm', 'web', '--type', 'strategic', '-p', '{"data":{"strategic":"yes"}}']);
        const after = JSON.parse(await ok(['-n', ns, 'get', 'cm', 'web', '-o', 'json'])) as { data: Record<string, string>; metadata: { labels: object; annotations: object; resourceVersion: string } };
        expect(after.data).toEqual({ b: '2', merged: 'yes', json: 'yes', strategic: 'yes' });
        expect(after.metadata.labels).toEqual({ tier: 'front' });
        expect(after.metadata.annotations).toEqual({ note: 'hello' });
        expect(Number(after.metadata.resourceVersion)).toBeGreaterThan(Number(json.metadata.resourceVersion));
        expect(await ok(['-n', ns, 'get', 'cm', '-l', 'tier=front', '-o', 'name'])).toBe('configmap/web\n');
        expect(await ok(['-n', ns, 'get', 'cm', '--field-selector', 'metadata.name=nope', '-o', 'name'])).toBe('');
        const bad = await k(['-n', ns, 'patch', 'cm', 'web', '--type', 'json', '-p', '[{"op":"test","path":"/data/b","value":"9"}]']);
        expect(bad.code).not.toBe(0);
        expect(bad.stderr).toContain('testing value /data/b failed');
        expect(await ok(['-n', ns, 'delete', 'cm', 'web'])).toMatch(/^configmap "web" deleted/);
        const gone = await k(['-n', ns, 'get', 'cm', 'web']);
        expect(gone.stderr).toContain('Error from server (NotFound): configmaps "web" not found');
      });

      it('get -w sees a change as it happens', async () => {
        await ok(['-n', ns, 'create', 'configmap', 'watched', '--from-literal=a=1']);
        const w = spawn(v.bin, ['-n', ns, 'get', 'cm', 'watched', '-w', '--output-watch-events'], { env: { ...process.env, KUBECONFIG: api.kubeconfig } });
        let out = '';
        w.stdout.on('data', (b: Buffer) => (out += b.toString()));
        try {
          await waitFor('the first row', async () => /watched\s+1\s/.test(out), 20_000);
          await ok(['-n', ns, 'patch', 'cm', 'watched', '--type', 'merge', '-p', '{"data":{"b":"2"}}']);
          await waitFor('the change', async () => /MODIFIED\s+watched\s+2\s/.test(out), 20_000);
          await ok(['-n', ns, 'delete', 'cm', 'watched']);
          await waitFor('the deletion', async () => /DELETED\s+watched\s+2\s/.test(out), 20_000);
        } finally {
          w.kill();
        }
      });

      it('apply -f creates, then updates with the last-applied annotation; --dry-run=server changes nothing', async () => {
        const file = path.join(base, `applied-${ns}.yaml`);
        const manifest = (data: string) => `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: ${ns}\n  labels: {app: web}\ndata:\n${data}`;
        await fsp.writeFile(file, manifest('  one: "1"\n  two: "2"\n'));
        expect(await ok(['apply', '-f', file])).toBe('configmap/applied created\n');
        await fsp.writeFile(file, manifest('  one: "1"\n  three: "3"\n'));
        expect(await ok(['apply', '-f', file])).toBe('configmap/applied configured\n');
        const o = JSON.parse(await ok(['-n', ns, 'get', 'cm', 'applied', '-o', 'json'])) as { data: object; metadata: { annotations: Record<string, string> } };
        expect(o.data).toEqual({ one: '1', three: '3' });
        expect(JSON.parse(o.metadata.annotations['kubectl.kubernetes.io/last-applied-configuration']!)).toMatchObject({ data: { one: '1', three: '3' } });
        expect(await ok(['apply', '-f', file])).toBe('configmap/applied unchanged\n');
        // A misspelt field is refused: kubectl asks the server to validate strictly.
        await fsp.writeFile(file, `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: typo, namespace: ${ns}}\ndatta: {a: b}\n`);
        const typo = await k(['apply', '-f', file]);
        expect(typo.stderr).toContain('strict decoding error: unknown field "datta"');
        expect(await ok(['-n', ns, 'create', 'configmap', 'dry', '--from-literal=a=1', '--dry-run=server', '-o', 'name'])).toBe('configmap/dry\n');
        expect((await k(['-n', ns, 'get', 'cm', 'dry'])).stderr).toContain('not found');
        await ok(['-n', ns, 'delete', 'cm', 'applied', '--dry-run=server']);
        await ok(['-n', ns, 'get', 'cm', 'applied']);
      });

      it('create secret generic, get secret; delete ns takes its objects with it', async () => {
        expect(await ok(['-n', ns, 'create', 'secret', 'generic', 'creds', '--from-literal=password=hunter2'])).toBe('secret/creds created\n');
        expect(await ok(['-n', ns, 'get', 'secret'])).toMatch(/^NAME\s+TYPE\s+DATA\s+AGE\ncreds\s+Opaque\s+1\s+\d+s\n$/);
        expect(await ok(['-n', ns, 'get', 'secret', 'creds', '-o', 'jsonpath={.data.password}'])).toBe(Buffer.from('hunter2').toString('base64'));
        expect(await ok(['delete', 'ns', ns])).toMatch(new RegExp(`^namespace "${ns}" deleted`));
        expect((await k(['get', 'ns', ns])).stderr).toContain(`namespaces "${ns}" not found`);
        expect(await ok(['get', 'cm,secret', '-A', '-o', 'name'])).not.toContain(ns);
        const refused = await k(['delete', 'ns', 'default']);
        expect(refused.stderr).toContain('this namespace may not be deleted');
      });
    });
  }

  it('keeps what was written across kill -9, and the resourceVersion goes on from where it was', async () => {
    const k = (args: string[]) => run(KUBECTL_135, args, { KUBECONFIG: api.kubeconfig });
    expect((await k(['create', 'configmap', 'survivor', '--from-literal=a=1'])).code).toBe(0);
    const before = JSON.parse((await k(['get', 'cm', 'survivor', '-o', 'json'])).stdout) as { metadata: { resourceVersion: string; uid: string } };
    await api.kill('SIGKILL');
    await api.start();
    const after = JSON.parse((await k(['get', 'cm', 'survivor', '-o', 'json'])).stdout) as { metadata: { resourceVersion: string; uid: string } };
    expect(after.metadata).toMatchObject(before.metadata);
    expect((await k(['create', 'configmap', 'next'])).code).toBe(0);
    const next = JSON.parse((await k(['get', 'cm', 'next', '-o', 'json'])).stdout) as { metadata: { resourceVersion: string } };
    expect(Number(next.metadata.resourceVersion)).toBe(Number(before.metadata.resourceVersion) + 1);
  });

  it('answers a 4 MiB body with 413 and keeps serving', async () => {
    const big = JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'big' }, data: { a: 'x'.repeat(4 * 1024 * 1024) } });
    const r = await api.request('POST', '/api/v1/namespaces/default/configmaps', big, { 'Content-Type': 'application/json' });
    expect(r.status).toBe(413);
    expect(JSON.parse(r.body)).toMatchObject({ kind: 'Status', reason: 'RequestEntityTooLarge', code: 413 });
    expect((await api.request('GET', '/api/v1/namespaces/default/configmaps/big')).status).toBe(404);
  });

  it('a watch too old for the history gets a 410 Expired event; bookmarks come when asked for', async () => {
    const r = await api.request('GET', '/api/v1/namespaces/default/configmaps?watch=true&resourceVersion=1&timeoutSeconds=2');
    expect(r.status).toBe(200);
    // After the restart the history starts at the current version: version 1 is gone.
    expect(JSON.parse(r.body.trim())).toMatchObject({ type: 'ERROR', object: { kind: 'Status', code: 410, reason: 'Expired' } });
    const b = await api.request('GET', '/api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true&timeoutSeconds=2');
    expect(b.body.split('\n').filter(Boolean).map((l) => (JSON.parse(l) as { type: string }).type)).toContain('BOOKMARK');
  });

  it('serves aggregated discovery in the version asked for, and the legacy documents otherwise', async () => {
    const aggregated = (v: string) => `application/json;g=apidiscovery.k8s.io;v=${v};as=APIGroupDiscoveryList,application/json`;
    for (const v of ['v2', 'v2beta1']) {
      const r = JSON.parse((await api.request('GET', '/api', undefined, { Accept: aggregated(v) })).body) as { apiVersion: string; items: Array<{ versions: Array<{ resources: Array<{ resource: string }> }> }> };
      expect(r.apiVersion).toBe(`apidiscovery.k8s.io/${v}`);
      expect(r.items[0]!.versions[0]!.resources.map((x) => x.resource)).toEqual(expect.arrayContaining(['configmaps', 'events', 'namespaces', 'nodes', 'pods', 'secrets', 'services']));
    }
    expect(JSON.parse((await api.request('GET', '/api')).body)).toMatchObject({ kind: 'APIVersions', versions: ['v1'] });
    const groups = JSON.parse((await api.request('GET', '/apis')).body) as { kind: string; groups: Array<{ name: string; preferredVersion: { groupVersion: string } }> };
    expect(groups.kind).toBe('APIGroupList');
    expect(groups.groups.map((g) => g.name)).toEqual(expect.arrayContaining(['apps', 'batch', 'coordination.k8s.io']));
    expect(groups.groups).toContainEqual(expect.objectContaining({ name: 'coordination.k8s.io', preferredVersion: { groupVersion: 'coordination.k8s.io/v1', version: 'v1' } }));
    expect(JSON.parse((await api.request('GET', '/apis/coordination.k8s.io/v1')).body)).toMatchObject({ kind: 'APIResourceList', groupVersion: 'coordination.k8s.io/v1', resources: [{ name: 'leases', kind: 'Lease' }] });
    // The status subresource is listed beside its resource, as kubectl's discovery expects.
    expect((JSON.parse((await api.request('GET', '/api/v1')).body) as { resources: Array<{ name: string }> }).resources.map((x) => x.name)).toEqual(expect.arrayContaining(['pods', 'pods/status', 'nodes/status']));
    expect(JSON.parse((await api.request('GET', '/api/v1')).body)).toMatchObject({ kind: 'APIResourceList', groupVersion: 'v1' });
  });

  it('bounds the bytes of lists sent at once: a list over the bound waits (429) while a client sits on a large one', async () => {
    await api.request('POST', '/api/v1/namespaces', JSON.stringify({ metadata: { name: 'biglists' } }), { 'Content-Type': 'application/json' });
    for (let i = 0; i < 3; i++) {
      const r = await api.request('POST', '/api/v1/namespaces/biglists/configmaps', JSON.stringify({ metadata: { name: `big${i}` }, data: { a: 'y'.repeat(2_000_000) } }), { 'Content-Type': 'application/json' });
      expect(r.status).toBe(201);
    }
    // A client that asks for the 6 MB list and reads none of it holds its bytes.
    const pki = path.join(api.dir, 'pki');
    const stalled = https.request({ host: '127.0.0.1', port: api.port, path: '/api/v1/namespaces/biglists/configmaps', ca: fs.readFileSync(path.join(pki, 'ca.crt')), cert: fs.readFileSync(path.join(pki, 'admin.crt')), key: fs.readFileSync(path.join(pki, 'admin.key')) });
    const res = await new Promise<import('node:http').IncomingMessage>((resolve) => stalled.on('response', resolve).end());
    res.pause();
    expect(res.statusCode).toBe(200);
    const second = await api.request('GET', '/api/v1/namespaces/biglists/configmaps');
    expect(second.status).toBe(429);
    expect(JSON.parse(second.body)).toMatchObject({ reason: 'TooManyRequests', code: 429 });
    // The bound counts bytes: a small list still fits beside it.
    expect((await api.request('GET', '/api/v1/namespaces')).status).toBe(200);
    // Once that client goes, lists are served again.
    stalled.destroy();
    await waitFor('the large list to be served again', async () => (await api.request('GET', '/api/v1/namespaces/biglists/configmaps')).status === 200, 10_000);
    await api.request('DELETE', '/api/v1/namespaces/biglists');
  });

  it('answers malformed requests with the API Status of each reason', async () => {
    const status = async (method: string, p: string, body?: string, type = 'application/json') => {
      const r = await api.request(method, p, body, body === undefined ? {} : { 'Content-Type': type });
      const s = JSON.parse(r.body) as { reason: string; code: number; details?: { causes?: Array<{ field: string }> } };
      return `${r.status} ${s.reason} ${s.details?.causes?.map((c) => c.field).join(',') ?? ''}`.trim();
    };
    const cms = '/api/v1/namespaces/default/configmaps';
    expect(await status('POST', cms, '{not json')).toBe('400 BadRequest');
    expect(await status('GET', '/api/v1/nothings')).toBe('404 NotFound');
    expect(await status('POST', `${cms}/x`, '{}')).toBe('405 MethodNotAllowed');
    expect(await status('POST', cms, JSON.stringify({ metadata: { name: 'Bad_Name', labels: { 'a b': 'c' } } }))).toBe('422 Invalid metadata.name,metadata.labels');
    expect(await status('POST', cms, JSON.stringify({ metadata: { name: 'once' } }))).toMatch(/^201/);
    expect(await status('POST', cms, JSON.stringify({ metadata: { name: 'once' } }))).toBe('409 AlreadyExists');
    expect(await status('PUT', `${cms}/once`, JSON.stringify({ metadata: { name: 'once', resourceVersion: '1' } }))).toBe('409 Conflict');
    expect(await status('PATCH', `${cms}/once`, '{}', 'text/plain')).toBe('415 UnsupportedMediaType');
    expect(await status('GET', `${cms}?labelSelector=${encodeURIComponent('a in (b')}`)).toBe('400 BadRequest');
    await api.request('DELETE', `${cms}/once`);
  });

  it('closes a connection whose request headers do not arrive within 10 s', async () => {
    const pki = path.join(api.dir, 'pki');
    const socket = tls.connect({ host: '127.0.0.1', port: api.port, ca: fs.readFileSync(path.join(pki, 'ca.crt')), cert: fs.readFileSync(path.join(pki, 'admin.crt')), key: fs.readFileSync(path.join(pki, 'admin.key')) });
    await new Promise<void>((r) => socket.once('secureConnect', () => r()));
    const started = Date.now();
    socket.write('GET /api/v1/namespaces HTTP/1.1\r\nHost: api\r\n'); // and never the blank line
    socket.resume();
    socket.on('error', () => undefined);
    await new Promise<void>((r) => socket.once('close', () => r()));
    expect(Date.now() - started).toBeGreaterThanOrEqual(9_000);
    expect(Date.now() - started).toBeLessThan(15_000);
  }, 30_000);

  it('sends a watch from no version all current objects, even past the unread bound', async () => {
    const payload = 'z'.repeat(100 * 1024); // 5 of them: far past the 64 KiB this server allows unread
    for (let i = 0; i < 5; i++) await api.request('POST', '/api/v1/namespaces/kube-public/configmaps', JSON.stringify({ metadata: { name: `listed-${i}` }, data: { a: payload } }), { 'Content-Type': 'application/json' });
    const r = await api.request('GET', '/api/v1/namespaces/kube-public/configmaps?watch=true&timeoutSeconds=1');
    expect(r.body.split('\n').filter(Boolean).map((l) => `${(JSON.parse(l) as { type: string; object: { metadata: { name: string } } }).type} ${(JSON.parse(l) as { object: { metadata: { name: string } } }).object.metadata.name}`)).toEqual([0, 1, 2, 3, 4].map((i) => `ADDED listed-${i}`));
    await api.request('DELETE', '/api/v1/namespaces/kube-public/configmaps');
  });

  it('drops a watcher that does not read, and goes on serving', async () => {
    const pki = path.join(api.dir, 'pki');
    const socket = tls.connect({ host: '127.0.0.1', port: api.port, ca: fs.readFileSync(path.join(pki, 'ca.crt')), cert: fs.readFileSync(path.join(pki, 'admin.crt')), key: fs.readFileSync(path.join(pki, 'admin.key')) });
    await new Promise<void>((r) => socket.once('secureConnect', () => r()));
    socket.write('GET /api/v1/namespaces/default/configmaps?watch=true HTTP/1.1\r\nHost: api\r\n\r\n');
    socket.pause(); // never reads: the kernel's buffers fill, then the server's
    let closed = false;
    let received = 0;
    socket.on('close', () => (closed = true));
    socket.on('error', () => undefined);
    const payload = 'y'.repeat(200 * 1024);
    const objects = 120; // 24 MB: far more than the kernel buffers between the two ends (about 4 MB here)
    for (let i = 0; i < objects; i++) {
      const r = await api.request('POST', '/api/v1/namespaces/default/configmaps', JSON.stringify({ metadata: { name: `flood-${i}` }, data: { a: payload } }), { 'Content-Type': 'application/json' });
      expect(r.status).toBe(201);
    }
    // Now read: a watch still open would go on for its 30 minutes; a dropped one ends, short of what was written.
    socket.on('data', (b: Buffer) => (received += b.length));
    socket.resume();
    await waitFor('the dropped watch to end', async () => closed || undefined, 20_000);
    expect(received).toBeLessThan((objects * payload.length) / 2);
    socket.destroy();
    await api.request('DELETE', '/api/v1/namespaces/default/configmaps');
    expect((await api.request('GET', '/healthz')).body).toBe('ok');
  });
});

describe.skipIf(!isRoot)('the API through skiff node', () => {
  let base: string;
  let ns: TestNetns;
  let child: ChildProcess | undefined;
  let log = '';
  const bin = path.join(repoRoot, 'bin', 'skiff.js');

  async function startNode(): Promise<string> {
    log = '';
    const argv = ns.wrap([
      process.execPath, bin, 'node', '--manifests', path.join(base, 'manifests'), '--images-dir', path.join(base, 'images'),
      '--socket', path.join(base, 'skiff.sock'), '--root', path.join(base, 'root'), '--state', path.join(base, 'state'), '--root-dir', path.join(base, 'kubelet'),
      '--cni-conf-dir', path.join(base, 'net.d'), '--registry-config', path.join(base, 'certs.d'), '--status-address', '127.0.0.1:0',
      '--node-name', 'api-node', '--api-address', '127.0.0.1:6443', '--dns-address', '',
    ]);
    child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    child.stdout!.on('data', (b: Buffer) => (log += b.toString()));
    child.stderr!.on('data', (b: Buffer) => (log += b.toString()));
    const m = await waitFor('skiff node to print its KUBECONFIG', async () => {
      if (child!.exitCode !== null) throw new Error(`skiff node exited ${child!.exitCode}: ${log}`);
      return /export KUBECONFIG=(\S+)/.exec(log) ?? undefined;
    }, 60_000);
    return m[1]!;
  }

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-api-node-'));
    for (const d of ['manifests', 'images', 'net.d']) await fsp.mkdir(path.join(base, d));
    await fsp.writeFile(path.join(base, 'manifests', 'settings.yaml'), 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-file}\ndata: {greeting: hello}\n');
    ns = new TestNetns().create();
  });

  afterAll(async () => {
    if (child && child.exitCode === null) {
      const exited = new Promise((r) => child!.once('exit', r));
      child.kill('SIGTERM');
      await exited;
    }
    if (ns) {
      spawnSync('nsenter', [`--net=${ns.path}`, process.execPath, bin, 'proxy', '--cleanup']);
      await ns.destroy();
    }
    if (base) await fsp.rm(base, { recursive: true, force: true });
  }, 60_000);

  it('serves kubectl on --api-address, and what was written survives kill -9 of the node', async () => {
    const kubeconfig = await startNode();
    expect(kubeconfig).toBe(path.join(base, 'kubelet', 'admin.kubeconfig'));
    const k = (args: string[]) => run(KUBECTL_135, args, { KUBECONFIG: kubeconfig }, undefined, ['nsenter', `--net=${ns.path}`]);
    expect((await k(['get', 'ns'])).stdout).toMatch(/^kube-system\s+Active/m);
    expect((await k(['create', 'configmap', 'node-cm', '--from-literal=a=1'])).stdout).toBe('configmap/node-cm created\n');
    const rv = Number((await k(['get', 'cm', 'node-cm', '-o', 'jsonpath={.metadata.resourceVersion}'])).stdout);
    await new Promise<void>((r) => {
      child!.once('exit', () => r());
      child!.kill('SIGKILL');
    });
    await startNode();
    expect((await k(['get', 'cm', 'node-cm', '-o', 'jsonpath={.data.a}'])).stdout).toBe('1');
    expect((await k(['create', 'configmap', 'second'])).code).toBe(0);
    expect(Number((await k(['get', 'cm', 'second', '-o', 'jsonpath={.metadata.resourceVersion}'])).stdout)).toBeGreaterThan(rv);
  });

  it("shows the manifest directory's objects read-only, naming their file, and follows the file", async () => {
    const kubeconfig = path.join(base, 'kubelet', 'admin.kubeconfig');
    const k = (args: string[]) => run(KUBECTL_135, args, { KUBECONFIG: kubeconfig }, undefined, ['nsenter', `--net=${ns.path}`]);
    const file = path.join(base, 'manifests', 'settings.yaml');
    expect((await k(['get', 'cm', 'from-file', '-o', 'jsonpath={.data.greeting}'])).stdout).toBe('hello');
    for (const args of [['delete', 'cm', 'from-file'], ['label', 'cm', 'from-file', 'a=b'], ['patch', 'cm', 'from-file', '-p', '{"data":{"x":"y"}}']]) {
      const r = await k(args);
      expect(r.code, args.join(' ')).not.toBe(0);
      expect(r.stderr).toContain(`configmaps "from-file" is defined by the manifest file ${file}: change or remove it there`);
    }
    await fsp.writeFile(file, 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: from-file}\ndata: {greeting: edited}\n');
    await waitFor('the edit to show', async () => (await k(['get', 'cm', 'from-file', '-o', 'jsonpath={.data.greeting}'])).stdout === 'edited' || undefined, 20_000);
    await fsp.rm(file);
    await waitFor('the removal to show', async () => (await k(['get', 'cm', 'from-file'])).stderr.includes('not found') || undefined, 20_000);
  });
});
