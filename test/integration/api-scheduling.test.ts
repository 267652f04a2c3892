/**
 * The one-node scheduler on a real `skiff node`, with real kubectl: a pod
 * whose nodeSelector or required node affinity the Node does not match,
 * whose requests do not fit, or that has scheduling gates stays Pending
 * with the scheduler's reason, and runs once it fits (the Node labelled,
 * the gate removed).
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const pod = (name: string, spec: string) => `
apiVersion: v1
kind: Pod
metadata: {name: ${name}}
spec:
  terminationGracePeriodSeconds: 1
${spec}
  containers:
  - name: web
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    resources: {requests: {cpu: "\${CPU}"}}
`;

describe.skipIf(!isRoot)('scheduling on a real node, with real kubectl', () => {
  const node = new SkiffNode();
  const get = (name: string) => node.getJson<Pod>(['pod', name]);
  const scheduled = async (name: string) => (await get(name)).status?.conditions?.find((c) => c.type === 'PodScheduled');
  const running = (name: string) => waitFor(`${name} running`, async () => ((await get(name)).status?.phase === 'Running' ? true : undefined), 60_000);
  const apply = (name: string, spec: string, cpu = '10m') => node.kubectlOk(['apply', '-f', '-'], { input: pod(name, spec).replace('${CPU}', cpu) });

  useSkiffNode(node);

  it('keeps a pod whose nodeSelector or node affinity does not match Pending, and places it once the Node is labelled', async () => {
    await apply('picky', '  nodeSelector: {disktype: ssd}');
    await apply('affine', '  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a, b]}]}]}}}');
    for (const name of ['picky', 'affine']) {
      const p = await get(name);
      expect(p.spec?.nodeName).toBeUndefined();
      expect(p.status?.phase).toBe('Pending');
      expect(await scheduled(name)).toMatchObject({ status: 'False', reason: 'Unschedulable', message: "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector." });
    }
    expect(await node.kubectlOk(['get', 'pod', 'picky'])).toMatch(/picky\s+0\/1\s+Pending/);
    await node.kubectlOk(['label', 'node', node.nodeName, 'disktype=ssd']);
    await running('picky');
    expect((await get('picky')).spec?.nodeName).toBe(node.nodeName);
    expect(await scheduled('picky')).toMatchObject({ status: 'True' });
    expect((await get('affine')).spec?.nodeName).toBeUndefined();
    await node.kubectlOk(['label', 'node', node.nodeName, 'zone=b']);
    await running('affine');
  }, 150_000);

  it('keeps a pod that asks for more cpu than the node has left Pending with Insufficient cpu', async () => {
    const allocatable = (await node.getJson<{ status: { allocatable: { cpu: string } } }>(['node', node.nodeName])).status.allocatable.cpu;
    await apply('greedy', '', String(Number(allocatable) + 1));
    expect(await scheduled('greedy')).toMatchObject({ status: 'False', reason: 'Unschedulable', message: '0/1 nodes are available: 1 Insufficient cpu.' });
    // What the others take is counted: a pod asking for all there is does not fit beside them.
    await apply('all', '', allocatable);
    expect(await scheduled('all')).toMatchObject({ status: 'False', message: '0/1 nodes are available: 1 Insufficient cpu.' });
    // Once the others are gone it fits, and is placed.
    await node.kubectlOk(['delete', 'pod', 'picky', 'affine', 'greedy', '--wait=true']);
    await running('all');
    await node.kubectlOk(['delete', 'pod', 'all', '--wait=true']);
  }, 150_000);

  it('holds a gated pod (SchedulingGated), refuses a new gate, and runs it when the gate is removed', async () => {
    await apply('gated', '  schedulingGates: [{name: example.com/ready}]');
    const p = await get('gated');
    expect(p.spec?.nodeName).toBeUndefined();
    expect(await scheduled('gated')).toMatchObject({ status: 'False', reason: 'SchedulingGated', message: 'Scheduling is blocked due to non-empty scheduling gates' });
    const added = await node.kubectl(['patch', 'pod', 'gated', '--type=json', '-p', '[{"op":"add","path":"/spec/schedulingGates/-","value":{"name":"example.com/more"}}]']);
    expect(added.status).not.toBe(0);
    expect(added.stderr).toContain("only deletion is allowed, but found new scheduling gate 'example.com/more'");
    await node.kubectlOk(['patch', 'pod', 'gated', '--type=json', '-p', '[{"op":"remove","path":"/spec/schedulingGates"}]']);
    await running('gated');
    expect(await scheduled('gated')).toMatchObject({ status: 'True' });
  }, 120_000);
});

describe.skipIf(!isRoot)('a node registered with --node-labels and --register-with-taints', () => {
  const node = new SkiffNode(['--node-labels', 'tier=edge,node-role.kubernetes.io/worker=', '--register-with-taints', 'dedicated=batch:NoSchedule']);
  const get = (name: string) => node.getJson<Pod>(['pod', name]);
  useSkiffNode(node);

  it('carries them on its Node, and places only the pods that tolerate the taint', async () => {
    const n = await waitFor('the Node', async () => {
      const r = await node.kubectl(['get', 'node', node.nodeName, '-o', 'json']);
      return r.status === 0 ? (JSON.parse(r.stdout) as { metadata: { labels: Record<string, string> }; spec: { taints?: object[] } }) : undefined;
    }, 30_000);
    expect(n.metadata.labels).toMatchObject({ tier: 'edge', 'node-role.kubernetes.io/worker': '', 'kubernetes.io/hostname': node.nodeName });
    expect(n.spec.taints).toEqual([{ key: 'dedicated', value: 'batch', effect: 'NoSchedule' }]);
    expect(await node.kubectlOk(['get', 'nodes'])).toMatch(new RegExp(`${node.nodeName}\\s+Ready\\s+worker\\s`));
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('plain', '').replace('${CPU}', '10m') });
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('tolerant', '  nodeSelector: {tier: edge}\n  tolerations: [{key: dedicated, operator: Equal, value: batch, effect: NoSchedule}]').replace('${CPU}', '10m') });
    await waitFor('tolerant running', async () => ((await get('tolerant')).status?.phase === 'Running' ? true : undefined), 60_000);
    const why = await waitFor('plain told why', async () => (await get('plain')).status?.conditions?.find((c) => c.type === 'PodScheduled' && c.status === 'False'), 30_000);
    expect(why.reason).toBe('Unschedulable');
    expect(why.message).toMatch(/untolerated taint \{dedicated: batch\}/);
    expect((await get('plain')).status?.phase).toBe('Pending');
    await node.kubectlOk(['delete', 'pod', 'plain', 'tolerant', '--wait=true']);
  }, 150_000);
});
