/**
 * RBAC objects on the node's API, with real kubectl 1.35 and 1.27: a chart's
 * or manifest's ServiceAccount, ClusterRole, ClusterRoleBinding, Role and
 * RoleBinding apply whole and print as a cluster prints them; kubectl's
 * typed `create role|clusterrole|rolebinding|clusterrolebinding` (protobuf
 * bodies in 1.35) work; bad ones are refused with the API server's
 * messages, and a binding's roleRef cannot change. Nothing is enforced: the
 * node's one user is in system:masters (docs/api.md).
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiProcess, KUBECTL_127, KUBECTL_135, run } from '../helpers/api-process.js';
import { isRoot } from '../helpers/env.js';
import { freePort } from '../helpers/registry.js';

const versions = [
  { name: '1.35', bin: KUBECTL_135, present: fs.existsSync(KUBECTL_135) },
  { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
];

const rbac = (ns: string) => `apiVersion: v1
kind: ServiceAccount
metadata: {name: prom, namespace: ${ns}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "${ns}:prom-reader"}
rules:
- apiGroups: [""]
  resources: [pods, services, endpoints]
  verbs: [get, list, watch]
- nonResourceURLs: [/metrics]
  verbs: [get]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "${ns}:prom"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "${ns}:prom-reader"}
subjects:
- {kind: ServiceAccount, name: prom, namespace: ${ns}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: config-editor, namespace: ${ns}}
rules:
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [settings]
  verbs: [get, update]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: edit-settings, namespace: ${ns}}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: config-editor}
subjects:
- {kind: User, name: alice, apiGroup: rbac.authorization.k8s.io}
- {kind: ServiceAccount, name: prom}
`;

describe.skipIf(!isRoot)('RBAC objects on the node API with real kubectl', () => {
  let base: string;
  let api: ApiProcess;

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-api-rbac-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort());
    await api.start();
  }, 60_000);

  afterAll(async () => {
    await api?.stop();
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}`, () => {
      const ns = `rbac-${v.name.replace('.', '-')}`;
      const k = (args: string[], input?: string) => run(v.bin, args, { KUBECONFIG: api.kubeconfig }, input);
      const ok = async (args: string[], input?: string) => {
        const r = await k(args, input);
        expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).toBe(0);
        return r.stdout;
      };

      it('applies a manifest of RBAC objects whole and prints them as a cluster does', async () => {
        await ok(['create', 'namespace', ns]);
        const out = await ok(['apply', '-f', '-'], rbac(ns));
        expect(out).toContain(`clusterrole.rbac.authorization.k8s.io/${ns}:prom-reader created`);
        expect(out).toContain('rolebinding.rbac.authorization.k8s.io/edit-settings created');
        expect(await ok(['get', 'clusterrole', `${ns}:prom-reader`])).toMatch(new RegExp(`^NAME\\s+CREATED AT\\n${ns}:prom-reader\\s+\\d{4}-\\d\\d-\\d\\dT`));
        expect(await ok(['get', 'rolebinding', '-n', ns, '-o', 'wide'])).toMatch(/NAME\s+ROLE\s+AGE\s+USERS\s+GROUPS\s+SERVICEACCOUNTS\nedit-settings\s+Role\/config-editor\s+\d+s\s+alice\s+\/prom/);
        expect(await ok(['get', 'clusterrolebinding', `${ns}:prom`])).toMatch(new RegExp(`${ns}:prom\\s+ClusterRole/${ns}:prom-reader`));
        const role = JSON.parse(await ok(['get', 'role', 'config-editor', '-n', ns, '-o', 'json'])) as { rules: unknown[] };
        expect(role.rules).toEqual([{ apiGroups: [''], resources: ['configmaps'], resourceNames: ['settings'], verbs: ['get', 'update'] }]);
        // Applied again unchanged: nothing to do.
        expect(await ok(['apply', '-f', '-'], rbac(ns))).toContain('rolebinding.rbac.authorization.k8s.io/edit-settings unchanged');
        expect(await ok(['api-resources', '--api-group', 'rbac.authorization.k8s.io', '--no-headers'])).toMatch(/clusterrolebindings\s+rbac\.authorization\.k8s\.io\/v1\s+false\s+ClusterRoleBinding[\s\S]*roles\s+rbac\.authorization\.k8s\.io\/v1\s+true\s+Role/);
      });

      it('creates them with the typed create commands', async () => {
        await ok(['create', 'role', 'pod-reader', '-n', ns, '--verb=get,list', '--resource=pods']);
        await ok(['create', 'clusterrole', `${ns}-nodes`, '--verb=get', '--resource=nodes']);
        await ok(['create', 'rolebinding', 'read-pods', '-n', ns, '--role=pod-reader', '--user=bob', `--serviceaccount=${ns}:prom`]);
        await ok(['create', 'clusterrolebinding', `${ns}-nodes`, `--clusterrole=${ns}-nodes`, '--group=ops']);
        const rb = JSON.parse(await ok(['get', 'rolebinding', 'read-pods', '-n', ns, '-o', 'json'])) as { roleRef: object; subjects: object[] };
        expect(rb.roleRef).toEqual({ apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'pod-reader' });
        expect(rb.subjects).toEqual([{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'bob' }, { kind: 'ServiceAccount', name: 'prom', namespace: ns }]);
        const cr = JSON.parse(await ok(['get', 'clusterrole', `${ns}-nodes`, '-o', 'json'])) as { rules: object[] };
        expect(cr.rules).toEqual([{ apiGroups: [''], resources: ['nodes'], verbs: ['get'] }]);
      });

      it("refuses what the API server refuses, and a change of a binding's roleRef", async () => {
        const bad = await k(['apply', '-f', '-'], `apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bad, namespace: ${ns}}
rules:
- resources: [pods]
  verbs: []
- nonResourceURLs: [/healthz]
  verbs: [get]
`);
        expect(bad.code).not.toBe(0);
        expect(bad.stderr).toContain('rules[0].verbs: Required value: verbs must contain at least one value');
        expect(bad.stderr).toContain('rules[0].apiGroups: Required value: resource rules must supply at least one api group');
        expect(bad.stderr).toContain('rules[1].nonResourceURLs: Invalid value: ["/healthz"]: namespaced rules cannot apply to non-resource URLs');
        const ref = await k(['apply', '-f', '-'], `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: bad-ref}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: x}
subjects: [{kind: ServiceAccount, name: prom}]
`);
        expect(ref.stderr).toContain('roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"');
        expect(ref.stderr).toContain('subjects[0].namespace: Required value');
        const agg = await k(['apply', '-f', '-'], `apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: bad-aggregate}
aggregationRule:
  clusterRoleSelectors:
  - matchLabels: {rbac.example.com/aggregate: "true"}
  - matchExpressions: [{key: tier, operator: Near, values: [a]}]
`);
        expect(agg.code).not.toBe(0);
        expect(agg.stderr).toContain('aggregationRule.clusterRoleSelectors[1].matchExpressions[0].operator: Invalid value: "Near": not a valid selector operator');
        const change = await k(['patch', 'rolebinding', 'edit-settings', '-n', ns, '--type=merge', '-p', '{"roleRef":{"name":"pod-reader"}}']);
        expect(change.code).not.toBe(0);
        expect(change.stderr).toContain('cannot change roleRef');
        await ok(['delete', 'namespace', ns, '--wait=false']);
      });
    });
  }
});
