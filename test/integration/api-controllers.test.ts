/**
 * The workload controllers on the node's API, seen by real kubectl against
 * a real `skiff node`: a Deployment owns ReplicaSets that own its pods, so
 * `rollout history`, `rollout undo` and `describe deployment` work; a
 * manifest file's Deployment gets its ReplicaSet too; a kill -9 of the node
 * keeps the same pods; deleting a Deployment takes its ReplicaSets and pods.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const deployment = (name: string, message: string, replicas = 2) => `
apiVersion: apps/v1
kind: Deployment
metadata: {name: ${name}}
spec:
  replicas: ${replicas}
  selector: {matchLabels: {app: ${name}}}
  strategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 1}}
  template:
    metadata: {labels: {app: ${name}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "exit 0" TERM; echo ${message}; while true; do sleep 1 & wait $!; done']
`;

interface Rs {
  metadata: { name: string; uid: string; annotations?: Record<string, string>; ownerReferences?: Array<{ kind: string; name: string; uid: string; controller?: boolean }> };
  spec: { replicas: number };
  status: { replicas?: number; readyReplicas?: number };
}

describe.skipIf(!isRoot)('the workload controllers on the node API, with real kubectl', () => {
  const node = new SkiffNode();
  const pods = async (selector: string) => (await node.getJson<{ items: Pod[] }>(['pods', '-l', selector])).items;
  const live = async (selector: string) => (await pods(selector)).filter((p) => !p.metadata?.deletionTimestamp);
  const sets = async (selector: string) => (await node.getJson<{ items: Rs[] }>(['rs', '-l', selector])).items;
  const rolledOut = (name: string) => node.kubectlOk(['rollout', 'status', `deployment/${name}`, '--timeout=90s'], { timeoutMs: 100_000 });

  useSkiffNode(node);

  it('makes a ReplicaSet that owns the Deployment\'s pods, shown by get, describe and rollout history', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: deployment('shop', 'one') });
    await rolledOut('shop');
    const d = await node.getJson<{ metadata: { uid: string; annotations: Record<string, string> } }>(['deployment', 'shop']);
    const [rs, ...more] = await sets('app=shop');
    expect(more).toEqual([]);
    expect(rs!.metadata.ownerReferences).toEqual([expect.objectContaining({ kind: 'Deployment', name: 'shop', uid: d.metadata.uid, controller: true })]);
    expect(rs!.metadata.annotations?.['deployment.kubernetes.io/revision']).toBe('1');
    expect(d.metadata.annotations['deployment.kubernetes.io/revision']).toBe('1');
    expect(rs!.status).toMatchObject({ replicas: 2, readyReplicas: 2 });
    for (const p of await live('app=shop')) expect(p.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'ReplicaSet', name: rs!.metadata.name, uid: rs!.metadata.uid });
    expect(await node.kubectlOk(['get', 'rs'])).toMatch(new RegExp(`${rs!.metadata.name}\\s+2\\s+2\\s+2`));
    for (const bin of [undefined, KUBECTL_127]) {
      const described = await node.kubectlOk(['describe', 'deployment', 'shop'], { bin });
      expect(described).toMatch(new RegExp(`NewReplicaSet:\\s+${rs!.metadata.name} \\(2/2 replicas created\\)`));
    }
    expect(await node.kubectlOk(['rollout', 'history', 'deployment/shop'])).toMatch(/REVISION\s+CHANGE-CAUSE\n1\s+<none>/);
  }, 150_000);

  it('rolls out a new template into a second ReplicaSet, and rollout undo goes back to the first one as revision 3', async () => {
    const [first] = await sets('app=shop');
    await node.kubectlOk(['set', 'env', 'deployment/shop', 'COLOUR=blue']);
    await rolledOut('shop');
    const after = await sets('app=shop');
    expect(after).toHaveLength(2);
    const second = after.find((s) => s.metadata.name !== first!.metadata.name)!;
    expect(second.metadata.annotations?.['deployment.kubernetes.io/revision']).toBe('2');
    expect(after.find((s) => s.metadata.name === first!.metadata.name)!.spec.replicas).toBe(0);
    await waitFor('only the new pods', async () => (await pods('app=shop')).every((p) => p.metadata?.ownerReferences?.[0]?.name === second.metadata.name) || undefined, 60_000);
    expect(await node.kubectlOk(['rollout', 'history', 'deployment/shop'])).toMatch(/\n1\s+<none>\n2\s+<none>/);

    expect(await node.kubectlOk(['rollout', 'undo', 'deployment/shop'])).toContain('rolled back');
    await rolledOut('shop');
    const back = await sets('app=shop');
    expect(back.map((s) => s.metadata.name).sort()).toEqual(after.map((s) => s.metadata.name).sort());
    const reused = back.find((s) => s.metadata.name === first!.metadata.name)!;
    expect(reused.metadata.annotations?.['deployment.kubernetes.io/revision']).toBe('3');
    expect(reused.spec.replicas).toBe(2);
    await waitFor('the first template\'s pods again', async () => (await pods('app=shop')).every((p) => p.metadata?.ownerReferences?.[0]?.name === first!.metadata.name) || undefined, 60_000);
    expect(await node.kubectlOk(['rollout', 'history', 'deployment/shop'])).toMatch(/\n2\s+<none>\n3\s+<none>/);
    // kubectl 1.27 reads the same history.
    expect(await node.kubectlOk(['rollout', 'history', 'deployment/shop'], { bin: KUBECTL_127 })).toMatch(/\n2\s+<none>\n3\s+<none>/);
  }, 240_000);

  it('keeps the same pods and ReplicaSets across a kill -9 of the node', async () => {
    const before = (await live('app=shop')).map((p) => `${p.metadata?.name}/${p.metadata?.uid}`).sort();
    const rsBefore = (await sets('app=shop')).map((s) => s.metadata.uid).sort();
    expect(await node.stopProcess('SIGKILL')).toBe('SIGKILL');
    await node.start();
    await rolledOut('shop');
    // A few seconds for a wrong controller to act.
    await new Promise((r) => setTimeout(r, 3000));
    expect((await live('app=shop')).map((p) => `${p.metadata?.name}/${p.metadata?.uid}`).sort()).toEqual(before);
    expect((await sets('app=shop')).map((s) => s.metadata.uid).sort()).toEqual(rsBefore);
    for (const p of await live('app=shop')) expect(p.status?.containerStatuses?.[0]?.restartCount).toBe(0);
  }, 180_000);

  it('gives a manifest file\'s Deployment its ReplicaSet, and keeps it through an edit of the file', async () => {
    const file = path.join(node.dirs.manifests, 'filed.yaml');
    await fs.writeFile(file, deployment('filed', 'from-a-file', 1));
    const rs = await waitFor('the file Deployment\'s ReplicaSet', async () => (await sets('app=filed'))[0], 60_000);
    await waitFor('its pod running', async () => (await live('app=filed')).find((p) => p.status?.phase === 'Running'), 60_000);
    const d = await node.getJson<{ metadata: { uid: string } }>(['deployment', 'filed']);
    expect(rs.metadata.ownerReferences?.[0]).toMatchObject({ kind: 'Deployment', uid: d.metadata.uid });
    await fs.writeFile(file, deployment('filed', 'from-a-file', 2));
    await waitFor('two pods', async () => ((await live('app=filed')).filter((p) => p.status?.phase === 'Running').length === 2) || undefined, 60_000);
    const now = await sets('app=filed');
    expect(now.map((s) => s.metadata.uid)).toEqual([rs.metadata.uid]);
    await fs.rm(file);
    await waitFor('the file Deployment\'s ReplicaSet and pods gone', async () => ((await sets('app=filed')).length === 0 && (await pods('app=filed')).length === 0) || undefined, 60_000);
  }, 180_000);

  it('takes a deleted Deployment\'s ReplicaSets and pods with it', async () => {
    await node.kubectlOk(['delete', 'deployment', 'shop']);
    await waitFor('the ReplicaSets and pods gone', async () => ((await sets('app=shop')).length === 0 && (await pods('app=shop')).length === 0) || undefined, 60_000);
    expect((await node.sandboxes()).filter((s) => s.metadata.name.startsWith('shop-') && s.state === 'SANDBOX_READY')).toEqual([]);
  }, 120_000);
});
