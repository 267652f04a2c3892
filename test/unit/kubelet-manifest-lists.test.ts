/**
 * What a manifest file holds beyond one object per document: Lists as
 * kubectl writes them, files of many thousand objects, the bounds that
 * replace a document count, kubectl's `\'` escape, and every object the
 * node does not act on named as skipped, in /manifests' list and the log.
 */
import { describe, expect, it } from 'vitest';
import type { Logger } from '../../src/log.js';
import { acceptEscapedApostrophes, MAX_NODES_PER_FILE, MAX_PROBLEMS_PER_FILE, parseManifest } from '../../src/kubelet-lite/manifests.js';
import { ObjectStore } from '../../src/kubelet-lite/store.js';
import { skipReason } from '../../src/kubelet-lite/skipped-kinds.js';
import { nodeKinds } from '../../src/api/kinds/index.js';

const service = (i: number) => `apiVersion: v1
kind: Service
metadata:
  name: svc-${i}
  labels: {app: a${i}}
spec:
  selector:
    app: a${i}
  ports:
  - name: http
    port: 80
    targetPort: 8080
`;

describe('Lists in a manifest', () => {
  it('unpacks a v1 List and a ConfigMapList into their items, each with its own line', () => {
    const text = `apiVersion: v1
kind: ConfigMapList
metadata: {resourceVersion: "12"}
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: one}
  data: {a: "1"}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: two, namespace: apps}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: web}
  spec:
    containers: [{name: c, image: busybox}]
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: d}
  spec: {selector: {matchLabels: {a: b}}, template: {metadata: {labels: {a: b}}, spec: {containers: [{name: c, image: busybox}]}}}
`;
    const m = parseManifest('list.yaml', text);
    expect(m.problems).toEqual([]);
    expect(m.objects.map((o) => [`${o.kind}/${o.namespace}/${o.name}`, o.source])).toEqual([
      ['ConfigMap/default/one', { file: 'list.yaml', document: 0, item: 0, line: 5 }],
      ['ConfigMap/apps/two', { file: 'list.yaml', document: 0, item: 1, line: 9 }],
      ['Pod/default/web', { file: 'list.yaml', document: 1, item: 0, line: 16 }],
      ['Deployment/default/d', { file: 'list.yaml', document: 1, item: 1, line: 21 }],
    ]);
  });

  it('refuses a nested List and an item without apiVersion or kind, each by its index and line, and loads the rest', () => {
    const text = `apiVersion: v1
kind: List
items:
- kind: ConfigMap
  metadata: {name: no-version}
- apiVersion: v1
  metadata: {name: no-kind}
- apiVersion: v1
  kind: List
  items:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: inner}}
- apiVersion: v1
  kind: Pod
  metadata: {name: bad}
  spec:
    containers: [{name: c}]
- 42
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: good}
`;
    const m = parseManifest('nested.yaml', text);
    expect(m.objects.map((o) => o.name)).toEqual(['good']);
    expect(m.problems).toEqual([
      { file: 'nested.yaml', line: 4, reason: 'items[0]: apiVersion: Required value' },
      { file: 'nested.yaml', line: 6, reason: 'items[1]: kind: Required value' },
      { file: 'nested.yaml', line: 8, reason: 'items[2]: a List inside a List is not unpacked; put its items in the outer list' },
      { file: 'nested.yaml', line: 16, object: 'Pod/default/bad', reason: 'items[3]: spec.containers[0].image: Required value' },
      { file: 'nested.yaml', line: 17, reason: 'items[4]: a List item must be an object, not number' },
    ]);
  });
});

describe('the bounds of one file', () => {
  it('loads a file of 10,000 Services whole', () => {
    const text = Array.from({ length: 10_000 }, (_, i) => service(i)).join('---\n');
    expect(text.length).toBeGreaterThan(1_100_000);
    const m = parseManifest('many.yaml', text);
    expect(m.problems).toEqual([]);
    expect(m.objects).toHaveLength(10_000);
    expect(m.objects.at(-1)!.name).toBe('svc-9999');
  }, 60_000);

  it('stops at the node bound and says where, keeping what came before', () => {
    const big = `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\nbinaryData: {}\nx: [${'0,'.repeat(600)}0]\n`;
    const text = [service(1), big, service(2), big.replace('name: big', 'name: big2'), service(3)].join('---\n');
    const m = parseManifest('nodes.yaml', text, { maxNodes: 1_000 });
    expect(m.objects.map((o) => o.name)).toEqual(['svc-1', 'big', 'svc-2']);
    expect(m.problems).toHaveLength(1);
    expect(m.problems[0]!.reason).toBe('the file is more than 1000 YAML nodes; the documents from line 33 on are not loaded (3 objects before it are)');
    expect(m.problems[0]!.line).toBe(33);
    expect(MAX_NODES_PER_FILE).toBeGreaterThanOrEqual(1_000_000);
  });

  it('bounds a file of many tiny documents by its nodes, not by a count', () => {
    // An empty document costs two nodes (itself and its null): a file of nothing but separators stops at the bound.
    const m = parseManifest('empty.yaml', '---\n'.repeat(5_000), { maxNodes: 2_000 });
    expect(m.problems.map((p) => p.reason)).toEqual(['the file is more than 2000 YAML nodes; the documents from line 1001 on are not loaded (0 objects before it are)']);
  });

  it('shares one alias allowance between all the documents of a file', () => {
    // Each document copies its anchor 20 times (about 1,000 nodes more than twice its size):
    // a file of them would have multiplied the old per-document allowance by its count.
    const doc = (i: number) => `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c${i}}\nx: &a [${'0,'.repeat(49)}0]\ny: [${Array(20).fill('*a').join(', ')}]\n`;
    const text = Array.from({ length: 200 }, (_, i) => doc(i)).join('---\n');
    const m = parseManifest('aliases.yaml', text);
    expect(m.objects.length).toBeGreaterThan(0);
    expect(m.objects.length).toBeLessThan(20);
    const refused = m.problems.filter((p) => /aliases expand it/.test(p.reason)).length;
    expect(refused + m.objects.length).toBe(Math.min(200, MAX_PROBLEMS_PER_FILE + m.objects.length));
  });

  it('keeps at most MAX_PROBLEMS_PER_FILE problems and counts the rest', () => {
    const m = parseManifest('bad.yaml', 'a: 1\n---\n'.repeat(500));
    expect(m.problems).toHaveLength(MAX_PROBLEMS_PER_FILE + 1);
    expect(m.problems.at(-1)!.reason).toBe(`and ${500 - MAX_PROBLEMS_PER_FILE} more problems in this file, not shown`);
  });
});

describe("kubectl's YAML", () => {
  it("takes \\' in a double-quoted scalar as an apostrophe, and nothing else changes", () => {
    const text = `apiVersion: v1
kind: ConfigMap
metadata: {name: quotes}
data:
  a: "it\\'s"
  b: "a \\\\' b"
  c: 'single \\' 
  d: plain \\'
  e: "two \\'x\\' on
    two lines"
---
apiVersion: v1
kind: Pod
metadata: {name: after}
spec: {containers: [{name: c}]}
`;
    const m = parseManifest('q.yaml', text);
    expect(m.objects[0]!.object.data).toEqual({ a: "it's", b: "a \\' b", c: 'single \\', d: "plain \\'", e: "two 'x' on two lines" });
    // Lines are unchanged: the pod after it is refused at its own line.
    expect(m.problems).toEqual([{ file: 'q.yaml', line: 15, object: 'Pod/default/after', reason: 'spec.containers[0].image: Required value' }]);
    expect(acceptEscapedApostrophes('a: b\n')).toBe('a: b\n');
  });

  it('says a projected podCertificate is not supported here', () => {
    const text = `apiVersion: v1
kind: Pod
metadata: {name: certs}
spec:
  containers: [{name: c, image: busybox}]
  volumes:
  - name: cert
    projected:
      sources:
      - podCertificate: {signerName: example.com/s, keyType: ED25519, credentialBundlePath: b.pem}
`;
    const m = parseManifest('cert.yaml', text);
    expect(m.problems).toHaveLength(1);
    expect(m.problems[0]!.reason).toBe('spec.volumes[0].projected.sources[0].podCertificate: Forbidden: podCertificate projected volumes are not supported by this node (it signs no pod certificates)');
    expect(m.problems[0]!.reason).not.toContain('must specify a projection type');
  });
});

describe('skipped kinds', () => {
  const served = nodeKinds('n').map((k) => ({ apiVersion: k.group ? `${k.group}/${k.version}` : k.version, kind: k.kind }));

  it.each([
    ['admissionregistration.k8s.io/v1', 'ValidatingWebhookConfiguration', 'admission webhooks and policies are not run by this node'],
    ['networking.k8s.io/v1', 'Ingress', 'no ingress controller on this node'],
    ['autoscaling/v2', 'HorizontalPodAutoscaler', 'no autoscaler runs on this node (nor a metrics server)'],
    ['apiextensions.k8s.io/v1', 'CustomResourceDefinition', 'custom resource definitions are not served by this node'],
    ['cert-manager.io/v1', 'Certificate', 'a custom resource (cert-manager.io/v1); no controller for it on this node'],
    ['policy/v1beta1', 'PodDisruptionBudget', 'policy/v1beta1 is not served by this node; it serves PodDisruptionBudget as policy/v1'],
  ])('%s %s: %s', (apiVersion, kind, why) => {
    expect(skipReason({ apiVersion, kind }, served)).toBe(why);
  });

  it.each([
    ['v1', 'Pod'], ['v1', 'Service'], ['v1', 'ConfigMap'], ['v1', 'Secret'], ['v1', 'ServiceAccount'], ['v1', 'Namespace'],
    ['apps/v1', 'Deployment'], ['apps/v1', 'ReplicaSet'], ['apps/v1', 'StatefulSet'], ['apps/v1', 'DaemonSet'],
    ['batch/v1', 'Job'], ['batch/v1', 'CronJob'], ['policy/v1', 'PodDisruptionBudget'], ['v1', 'ReplicationController'],
    ['discovery.k8s.io/v1', 'EndpointSlice'], ['v1', 'PersistentVolumeClaim'], ['v1', 'PersistentVolume'], ['storage.k8s.io/v1', 'StorageClass'],
    ['rbac.authorization.k8s.io/v1', 'ClusterRole'], ['rbac.authorization.k8s.io/v1', 'RoleBinding'],
  ])('%s %s is served, not skipped', (apiVersion, kind) => {
    expect(skipReason({ apiVersion, kind }, served)).toBeUndefined();
  });

  it('names each skipped object in the problems and logs it once', () => {
    const lines: Array<[string, string, Record<string, unknown>]> = [];
    const log: Logger = {
      debug() {},
      info: (m, f) => lines.push(['info', m, f ?? {}]),
      warn: (m, f) => lines.push(['warn', m, f ?? {}]),
      error: (m, f) => lines.push(['error', m, f ?? {}]),
    };
    const store = new ObjectStore({ nodeName: 'n', log, actsOn: () => served });
    const text = `apiVersion: v1
kind: List
items:
- {apiVersion: autoscaling/v2, kind: HorizontalPodAutoscaler, metadata: {name: reader}}
- {apiVersion: networking.k8s.io/v1, kind: Ingress, metadata: {name: web}}
- {apiVersion: v1, kind: ServiceAccount, metadata: {name: app}}
- {apiVersion: v1, kind: ConfigMap, metadata: {name: conf}}
---
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
kind: Widget
apiVersion: example.com/v1
metadata: {name: w}
`;
    const m = parseManifest('/m/all.yaml', text);
    store.replaceFile('/m/all.yaml', m);
    expect(store.list().map((o) => o.kind).sort()).toEqual(['ConfigMap', 'HorizontalPodAutoscaler', 'Ingress', 'Namespace', 'ServiceAccount', 'Widget']);
    expect(store.problems()).toEqual([
      { file: '/m/all.yaml', line: 4, object: 'HorizontalPodAutoscaler/default/reader', reason: 'skipped: HorizontalPodAutoscaler — no autoscaler runs on this node (nor a metrics server)' },
      { file: '/m/all.yaml', line: 5, object: 'Ingress/default/web', reason: 'skipped: Ingress — no ingress controller on this node' },
      { file: '/m/all.yaml', line: 13, object: 'Widget/default/w', reason: 'skipped: Widget — a custom resource (example.com/v1); no controller for it on this node' },
    ]);
    expect(lines.map((l) => `${l[0]} ${l[1]}`)).toEqual([
      'info skipped: HorizontalPodAutoscaler — no autoscaler runs on this node (nor a metrics server)',
      'info skipped: Ingress — no ingress controller on this node',
      'info skipped: Widget — a custom resource (example.com/v1); no controller for it on this node',
    ]);
    // The same file again, and another file's change: nothing is logged twice.
    store.replaceFile('/m/all.yaml', parseManifest('/m/all.yaml', text));
    store.replaceFile('/m/b.yaml', parseManifest('/m/b.yaml', 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n'));
    expect(lines).toHaveLength(3);
  });

  it('logs a cut file once, where a proxy alone also logs it', () => {
    const lines: string[] = [];
    const log: Logger = { debug() {}, info() {}, warn: (m, f) => lines.push(`${m} ${JSON.stringify(f)}`), error() {} };
    const store = new ObjectStore({ nodeName: 'n', log });
    const m = parseManifest('/m/cut.yaml', `${service(1)}---\n${service(2)}`, { maxNodes: 30 });
    store.replaceFile('/m/cut.yaml', m);
    store.replaceFile('/m/cut.yaml', m);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain('the file is more than 30 YAML nodes');
    // Without actsOn nothing is called skipped: the proxy's store reads only Services.
    expect(store.problems().filter((p) => p.reason.startsWith('skipped'))).toEqual([]);
  });

  it('bounds what one change logs', () => {
    const lines: string[] = [];
    const log: Logger = { debug() {}, info: (m) => lines.push(m), warn: (m) => lines.push(m), error() {} };
    const store = new ObjectStore({ nodeName: 'n', log, actsOn: () => served });
    const text = Array.from({ length: 500 }, (_, i) => `{apiVersion: networking.k8s.io/v1, kind: Ingress, metadata: {name: r${i}}}`).join('\n---\n');
    store.replaceFile('/m/roles.yaml', parseManifest('/m/roles.yaml', text));
    expect(store.problems()).toHaveLength(500);
    expect(lines).toHaveLength(21);
    expect(lines.at(-1)).toBe('more manifest problems than are logged at once; all of them are on the status port at /manifests');
  });
});
