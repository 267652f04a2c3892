/**
 * Cascading deletion on a real `skiff node`: a Deployment's ReplicaSet and
 * Pods (made by the node's controllers, owned through ownerReferences) go
 * with it in the foreground — the Deployment kept, marked, until its pods
 * are really stopped — and stay, without the reference, when orphaned.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const deployment = (name: string) => `
apiVersion: apps/v1
kind: Deployment
metadata: {name: ${name}}
spec:
  replicas: 2
  selector: {matchLabels: {app: ${name}}}
  template:
    metadata: {labels: {app: ${name}}}
    spec:
      terminationGracePeriodSeconds: 5
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "sleep 2; exit 0" TERM; while true; do sleep 1 & wait $!; done']
`;

const running = (p: Pod) => p.status?.phase === 'Running' && (p.status.containerStatuses ?? []).every((c) => c.state?.running);

describe.skipIf(!isRoot)('garbage collection on a real skiff node', () => {
  const node = new SkiffNode();
  const pods = async (app: string) => (await node.getJson<{ items: Pod[] }>(['pods', '-l', `app=${app}`])).items;

  useSkiffNode(node);

  it('kubectl delete --cascade=foreground keeps the Deployment until its pods have stopped, then all are gone', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: deployment('fg') });
    await node.kubectlOk(['rollout', 'status', 'deployment/fg', '--timeout=90s'], { timeoutMs: 100_000 });
    expect((await pods('fg')).filter(running)).toHaveLength(2);
    const deleting = node.kubectl(['delete', 'deployment', 'fg', '--cascade=foreground', '--timeout=90s'], { timeoutMs: 100_000 });
    // While its pods stop (2 s of their TERM trap), the Deployment is there, waiting for them.
    const seen = await waitFor('the Deployment waiting for its dependents', async () => {
      const r = await node.kubectl(['get', 'deployment', 'fg', '-o', 'jsonpath={.metadata.finalizers} {.metadata.deletionTimestamp}']);
      return r.status === 0 && /foregroundDeletion/.test(r.stdout) ? r.stdout : undefined;
    }, 30_000);
    expect(seen).toMatch(/\d{4}-/);
    const podsThen = await pods('fg');
    expect(podsThen.length).toBeGreaterThan(0);
    const done = await deleting;
    expect(done.status, done.stderr).toBe(0);
    expect(done.stdout).toContain('deployment.apps "fg" deleted');
    expect(await pods('fg')).toEqual([]);
    expect((await node.kubectlOk(['get', 'replicasets', '-l', 'app=fg', '-o', 'name'])).trim()).toBe('');
    expect((await node.kubectl(['get', 'deployment', 'fg'])).stderr).toContain('not found');
  }, 240_000);

  it('kubectl delete --cascade=orphan leaves the ReplicaSet and its pods running, without the reference; deleting the ReplicaSet then takes the pods', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: deployment('orph') });
    await node.kubectlOk(['rollout', 'status', 'deployment/orph', '--timeout=90s'], { timeoutMs: 100_000 });
    const before = (await pods('orph')).map((p) => p.metadata!.uid).sort();
    expect(before).toHaveLength(2);
    await node.kubectlOk(['delete', 'deployment', 'orph', '--cascade=orphan'], { timeoutMs: 60_000 });
    const rs = await node.getJson<{ items: Array<{ metadata: { name: string; ownerReferences?: unknown[] } }> }>(['replicasets', '-l', 'app=orph']);
    expect(rs.items).toHaveLength(1);
    expect(rs.items[0]!.metadata.ownerReferences).toBeUndefined();
    // The orphaned ReplicaSet is no one's now; the pods are still its, the same ones, running.
    const after = await pods('orph');
    expect(after.map((p) => p.metadata!.uid).sort()).toEqual(before);
    expect(after.every(running)).toBe(true);
    await node.kubectlOk(['delete', 'replicaset', rs.items[0]!.metadata.name], { timeoutMs: 60_000 });
    await waitFor('the orphaned ReplicaSet\'s pods gone', async () => ((await pods('orph')).length === 0 ? true : undefined), 60_000);
  }, 240_000);
});
