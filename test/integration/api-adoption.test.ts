/**
 * Adoption and release on a real `skiff node` with real kubectl, as
 * kube-controller-manager's controllers do them: a workload deleted with
 * `--cascade=orphan` and made again takes back what it left (the same
 * ReplicaSet, the same pods, no second set made), and a pod relabelled out
 * of its ReplicaSet's selector is let go and replaced.
 */
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

interface Meta {
  metadata: { name: string; uid: string; ownerReferences?: Array<{ kind: string; name: string; uid: string; controller?: boolean }> };
}
interface List<T> {
  items: T[];
}

const workload = (kind: string, name: string, extra = '') => `apiVersion: apps/v1
kind: ${kind}
metadata: {name: ${name}}
spec:
  replicas: 2
${extra}  selector: {matchLabels: {app: ${name}}}
  template:
    metadata: {labels: {app: ${name}}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: c
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "exit 0" TERM; sleep 100000 & wait']
`;

describe.skipIf(!isRoot)('controllers adopt orphans and release what they no longer select', () => {
  const node = new SkiffNode();
  useSkiffNode(node);

  const apply = (yaml: string) => node.kubectlOk(['apply', '-f', '-'], { input: yaml });
  const pods = async (app: string) => (await node.getJson<List<Meta>>(['pods', '-l', `app=${app}`])).items;
  const uids = (items: Meta[]) => items.map((i) => i.metadata.uid).sort();
  const owner = (o: Meta) => o.metadata.ownerReferences?.find((r) => r.controller);
  /** Two pods, each with a Ready condition True. */
  const twoReady = (app: string) =>
    waitFor(`two ready ${app} pods`, async () => {
      const list = await node.getJson<List<Meta & { status?: { conditions?: Array<{ type: string; status: string }> } }>>(['pods', '-l', `app=${app}`]);
      return list.items.length === 2 && list.items.every((p) => p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) ? list.items : undefined;
    }, 90_000);

  /** Deletes the workload leaving its dependents, and waits until they no longer name it. */
  const orphan = async (resource: string, name: string, app: string) => {
    await node.kubectlOk(['delete', resource, name, '--cascade=orphan']);
    await waitFor('the orphans to lose their owner', async () => ((await pods(app)).every((p) => !owner(p)) ? true : undefined), 30_000);
  };

  it('a Deployment made again takes back its ReplicaSet and pods, and makes no more', async () => {
    await apply(workload('Deployment', 'dep'));
    const before = await twoReady('dep');
    const rs = (await node.getJson<List<Meta>>(['replicasets', '-l', 'app=dep'])).items;
    expect(rs).toHaveLength(1);
    await node.kubectlOk(['delete', 'deployment', 'dep', '--cascade=orphan']);
    await waitFor('the ReplicaSet to lose its owner', async () => (!owner(await node.getJson<Meta>(['replicaset', rs[0]!.metadata.name])) ? true : undefined), 30_000);
    await apply(workload('Deployment', 'dep'));
    const dep = await node.getJson<Meta>(['deployment', 'dep']);
    await waitFor('the ReplicaSet adopted', async () => (owner(await node.getJson<Meta>(['replicaset', rs[0]!.metadata.name]))?.uid === dep.metadata.uid ? true : undefined), 30_000);
    await node.kubectlOk(['rollout', 'status', 'deployment/dep', '--timeout=60s']);
    // Given time to make more, it made none: the same pods, the same single ReplicaSet.
    await new Promise((r) => setTimeout(r, 3000));
    expect(uids(await pods('dep'))).toEqual(uids(before));
    expect(uids((await node.getJson<List<Meta>>(['replicasets', '-l', 'app=dep'])).items)).toEqual(uids(rs));
    await node.kubectlOk(['delete', 'deployment', 'dep']);
  }, 180_000);

  it('a ReplicaSet made again adopts the pods it left; a pod relabelled out of it is released and replaced', async () => {
    await apply(workload('ReplicaSet', 'rs'));
    const before = await twoReady('rs');
    await orphan('replicaset', 'rs', 'rs');
    await apply(workload('ReplicaSet', 'rs'));
    const rs = await node.getJson<Meta>(['replicaset', 'rs']);
    await waitFor('both pods adopted', async () => ((await pods('rs')).every((p) => owner(p)?.uid === rs.metadata.uid) ? true : undefined), 30_000);
    await new Promise((r) => setTimeout(r, 3000));
    expect(uids(await pods('rs'))).toEqual(uids(before));

    const out = before[0]!.metadata.name;
    await node.kubectlOk(['label', 'pod', out, 'app=debug', '--overwrite']);
    await waitFor('the relabelled pod released', async () => (!owner(await node.getJson<Meta>(['pod', out])) ? true : undefined), 30_000);
    const now = await twoReady('rs');
    expect(now.map((p) => p.metadata.name)).not.toContain(out);
    // Released, not deleted: it runs on for whoever wanted it out of the set.
    expect(await node.kubectlOk(['get', 'pod', out, '-o', 'jsonpath={.status.phase}'])).toBe('Running');
    await node.kubectlOk(['delete', 'replicaset', 'rs']);
    await node.kubectlOk(['delete', 'pod', out]);
  }, 180_000);

  it('a StatefulSet made again adopts its pods and its revision, and is whole at once', async () => {
    const sts = workload('StatefulSet', 'sts', '  serviceName: sts\n');
    await apply(sts);
    const before = await twoReady('sts');
    await orphan('statefulset', 'sts', 'sts');
    // A user's pod with the set's labels but not a member's name: upstream's StatefulSet leaves it alone.
    await apply(`apiVersion: v1
kind: Pod
metadata: {name: sts-debug, labels: {app: sts}}
spec:
  terminationGracePeriodSeconds: 1
  containers: [{name: c, image: skiff.local/demo-web:1, imagePullPolicy: Never}]
`);
    await apply(sts);
    const set = await node.getJson<Meta>(['statefulset', 'sts']);
    const members = async () => (await pods('sts')).filter((p) => p.metadata.name !== 'sts-debug');
    await waitFor('both pods adopted', async () => ((await members()).every((p) => owner(p)?.uid === set.metadata.uid) ? true : undefined), 30_000);
    await node.kubectlOk(['rollout', 'status', 'statefulset/sts', '--timeout=60s']);
    expect(uids(await members())).toEqual(uids(before));
    expect(owner(await node.getJson<Meta>(['pod', 'sts-debug']))).toBeUndefined();
    const revisions = (await node.getJson<List<Meta>>(['controllerrevisions', '-l', 'app=sts'])).items;
    expect(revisions).toHaveLength(1);
    expect(owner(revisions[0]!)?.uid).toBe(set.metadata.uid);
    expect(await node.kubectlOk(['get', 'statefulset', 'sts', '-o', 'jsonpath={.status.readyReplicas}'])).toBe('2');
  }, 180_000);
});
