/**
 * A manifest directory as users fill it, on a real `skiff kubelet` over a
 * real `skiff cri`: a List file (as `kubectl get -o yaml` writes one) runs
 * its pods with the ConfigMaps beside them, a file of more than a thousand
 * documents loads to its last one, kubectl's `\'` escape is taken, and every
 * object the node does not act on is named with why on /manifests and once
 * in the agent's log.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

type Problem = { file: string; line: number; object?: string; reason: string };

const idOf = (p: Pod, c: string) => containerStatus(p, c)?.containerID?.replace(/^[a-z]+:\/\//, '') ?? '';

describe.skipIf(!isRoot)('kubelet-lite: Lists, big files and skipped kinds', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-manifest-lists');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function exec(p: Pod, script: string): Promise<string> {
    const r = await node.pods.skiff.runtime.ExecSync({ containerId: idOf(p, 'c'), cmd: ['sh', '-c', script], timeout: 10 });
    return Buffer.from(r.stdout ?? '').toString();
  }

  const podItem = (name: string, cm: string, indent: string) =>
    `apiVersion: v1
kind: Pod
metadata: {name: ${name}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: ${node.image}
    command: [sleep, "3600"]
    env:
    - name: MSG
      valueFrom: {configMapKeyRef: {name: ${cm}, key: msg}}
    - name: QUOTED
      value: "it\\'s here"
`.replace(/\n(?=.)/g, `\n${indent}`);

  it('runs the pods of a List, unpacked with the ConfigMaps of a ConfigMapList beside it', async () => {
    await node.write('list.yaml', `apiVersion: v1
kind: ConfigMapList
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: greeting}
  data: {msg: hello-from-a-list}
---
apiVersion: v1
kind: List
metadata: {resourceVersion: ""}
items:
- ${podItem('from-list', 'greeting', '  ')}- apiVersion: v1
  kind: List
  items: []
`);
    const p = await node.waitPod('from-list', ready, 'Ready', 90_000);
    expect(await exec(p, 'echo "$MSG|$QUOTED"')).toBe("hello-from-a-list|it's here\n");
    const r = await node.get<{ items: Problem[] }>('/manifests');
    expect(r.body.items.filter((x) => x.file.endsWith('list.yaml'))).toEqual([
      expect.objectContaining({ line: 27, reason: 'items[1]: a List inside a List is not unpacked; put its items in the outer list' }),
    ]);
  });

  it('loads a file of 1,500 documents to its last one', async () => {
    const cms = Array.from({ length: 1_500 }, (_, i) => `apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm-${i}}\ndata: {msg: number-${i}}\n`);
    await node.write('many.yaml', [...cms, podItem('after-many', 'cm-1499', '')].join('---\n'));
    const p = await node.waitPod('after-many', ready, 'Ready', 90_000);
    expect(await exec(p, 'echo $MSG')).toBe('number-1499\n');
  });

  it('names every object it does not act on in /manifests and once in the log', async () => {
    await node.write('cluster.yaml', `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: reader}
webhooks: []
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web}
spec: {rules: [{http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny}
spec: {podSelector: {}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: web}
spec: {scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}, maxReplicas: 3}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
---
apiVersion: v1
kind: Namespace
metadata: {name: apps}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: app}
`);
    const skipped = await waitFor('the skipped kinds on /manifests', async () => {
      const r = await node.get<{ items: Problem[] }>('/manifests');
      const mine = r.body.items.filter((x) => x.file.endsWith('cluster.yaml'));
      return mine.length >= 4 ? mine : undefined;
    });
    expect(skipped.map((x) => [x.line, x.object, x.reason])).toEqual([
      [1, 'ValidatingWebhookConfiguration/default/reader', 'skipped: ValidatingWebhookConfiguration — admission webhooks and policies are not run by this node'],
      [6, 'Ingress/default/web', 'skipped: Ingress — no ingress controller on this node'],
      [16, 'HorizontalPodAutoscaler/default/web', 'skipped: HorizontalPodAutoscaler — no autoscaler runs on this node (nor a metrics server)'],
      [21, 'CustomResourceDefinition/default/widgets.example.com', 'skipped: CustomResourceDefinition — custom resource definitions are not served by this node'],
    ]);
    // The Pods, ConfigMaps, the Namespace, the ServiceAccount and the NetworkPolicy are acted on: none is called skipped.
    const all = (await node.get<{ items: Problem[] }>('/manifests')).body.items;
    expect(all.filter((x) => x.reason.startsWith('skipped:') && !x.file.endsWith('cluster.yaml'))).toEqual([]);
    // A rescan or another file's change does not log them again.
    await node.write('other.yaml', podItem('other', 'greeting', ''));
    await node.waitPod('other', ready, 'Ready', 90_000);
    const logged = node.agent.log.split('\n').filter((l) => l.includes('skipped: ValidatingWebhookConfiguration — admission webhooks'));
    expect(logged).toHaveLength(1);
    expect(logged[0]).toContain('cluster.yaml');
  });
});
