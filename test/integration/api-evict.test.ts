/**
 * Eviction, PodDisruptionBudgets, cordon/uncordon/drain and the deletion's
 * grace period against a real `skiff node`, with real kubectl 1.35 and 1.27:
 * a budget blocks an eviction (429) and then allows it; a cordoned node is
 * tainted, shown SchedulingDisabled and keeps new pods Pending until
 * uncordoned; drain retries against a budget until --timeout, and drains
 * once the budget allows; `delete --grace-period=1` stops a pod that ignores
 * SIGTERM (30 s in its spec) in a few seconds.
 */
import type { Node, Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

/** A pod whose container ignores SIGTERM: only SIGKILL after the grace ends it. */
const stubborn = (name: string, labels: Record<string, string> = {}) => `
apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  labels: ${JSON.stringify({ app: name, ...labels })}
spec:
  terminationGracePeriodSeconds: 30
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "" TERM; while true; do sleep 1; done']
`;

const quick = (name: string, labels: Record<string, string> = {}) => `
apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  labels: ${JSON.stringify({ app: name, ...labels })}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
`;

const pdb = (name: string, app: string, minAvailable: number) => `
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: ${name}}
spec:
  minAvailable: ${minAvailable}
  selector: {matchLabels: {app: ${app}}}
`;

const ready = (p: Pod) => p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') === true;

describe.skipIf(!isRoot)('eviction, budgets, cordon and drain on a real skiff node, with real kubectl', () => {
  const node = new SkiffNode();
  const gone = async (name: string) => (await node.kubectl(['get', 'pod', name, '-o', 'name'])).stderr.includes('NotFound');
  const untilReady = (name: string) => waitFor(`${name} ready`, async () => ready(await node.getJson<Pod>(['pod', name])), 60_000);
  const untilAllowed = (name: string, n: number) =>
    waitFor(`${name} allows ${n}`, async () => {
      const b = await node.getJson<{ status?: { disruptionsAllowed?: number; observedGeneration?: number }; metadata: { generation?: number } }>(['pdb', name]);
      return b.status?.disruptionsAllowed === n && b.status.observedGeneration === b.metadata.generation;
    }, 30_000);
  const evictBody = (name: string) => JSON.stringify({ apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name, namespace: 'default' } });

  useSkiffNode(node);

  it('serves PodDisruptionBudgets with kubectl\'s columns and pods/eviction in discovery', async () => {
    const resources = await node.kubectlOk(['api-resources', '--api-group=policy']);
    expect(resources).toMatch(/poddisruptionbudgets\s+pdb\s+policy\/v1\s+true\s+PodDisruptionBudget/);
    await node.kubectlOk(['apply', '-f', '-'], { input: quick('guarded') + '---\n' + pdb('guard', 'guarded', 1) });
    await untilReady('guarded');
    await untilAllowed('guard', 0);
    const table = await node.kubectlOk(['get', 'pdb']);
    expect(table).toMatch(/^NAME\s+MIN AVAILABLE\s+MAX UNAVAILABLE\s+ALLOWED DISRUPTIONS\s+AGE\n/);
    expect(table).toMatch(/guard\s+1\s+N\/A\s+0\s+\d+s/);
    expect(await node.kubectlOk(['get', 'pdb'], { bin: KUBECTL_127 })).toMatch(/guard\s+1\s+N\/A\s+0/);
  }, 120_000);

  it('refuses an eviction the budget does not allow (429), then evicts once it does', async () => {
    for (const bin of [undefined, KUBECTL_127]) {
      const r = await node.kubectl(['create', '--raw', '/api/v1/namespaces/default/pods/guarded/eviction', '-f', '-'], { input: evictBody('guarded'), bin });
      expect(r.status).not.toBe(0);
      expect(r.stderr).toContain("Cannot evict pod as it would violate the pod's disruption budget.");
    }
    const still = await node.getJson<Pod>(['pod', 'guarded']);
    expect(still.metadata?.deletionTimestamp).toBeUndefined();
    await node.kubectlOk(['patch', 'pdb', 'guard', '--type=merge', '-p', '{"spec":{"minAvailable":0}}']);
    await untilAllowed('guard', 1);
    await node.kubectlOk(['create', '--raw', '/api/v1/namespaces/default/pods/guarded/eviction', '-f', '-'], { input: evictBody('guarded'), bin: KUBECTL_127 });
    // While it stops, the agent's status writes keep the eviction's DisruptionTarget.
    for (let i = 0; i < 5; i++) {
      const p = await node.getJson<Pod>(['pod', 'guarded']).catch(() => undefined);
      if (!p) break;
      expect(p.status?.conditions?.find((c) => c.type === 'DisruptionTarget')).toMatchObject({ status: 'True', reason: 'EvictionByEvictionAPI' });
      await new Promise((r) => setTimeout(r, 200));
    }
    await waitFor('guarded gone', () => gone('guarded'), 30_000);
    await node.kubectlOk(['delete', 'pdb', 'guard']);
  }, 120_000);

  it('cordons (taint, SchedulingDisabled, new pods Pending with the scheduler\'s reason) and uncordons (the pod runs)', async () => {
    expect(await node.kubectlOk(['cordon', node.nodeName])).toContain(`node/${node.nodeName} cordoned`);
    const tainted = await waitFor('the unschedulable taint', async () => {
      const n = await node.getJson<Node>(['node', node.nodeName]);
      return n.spec?.taints?.some((t) => t.key === 'node.kubernetes.io/unschedulable' && t.effect === 'NoSchedule') ? n : undefined;
    }, 30_000);
    expect(tainted.spec?.unschedulable).toBe(true);
    expect(await node.kubectlOk(['get', 'nodes'], { bin: KUBECTL_127 })).toMatch(new RegExp(`${node.nodeName}\\s+Ready,SchedulingDisabled`));
    await node.kubectlOk(['apply', '-f', '-'], { input: quick('late') });
    const pending = await node.getJson<Pod>(['pod', 'late']);
    expect(pending.spec?.nodeName).toBeUndefined();
    expect(pending.status?.phase).toBe('Pending');
    expect(pending.status?.conditions).toContainEqual(expect.objectContaining({ type: 'PodScheduled', status: 'False', reason: 'Unschedulable', message: '0/1 nodes are available: 1 node(s) were unschedulable.' }));
    // The node goes on with its reports (its Lease renewed every 10 s, its status when it changes) and leaves the spec as kubectl made it.
    const renewed = async () => (await node.getJson<{ spec?: { renewTime?: string } }>(['lease', '-n', 'kube-node-lease', node.nodeName])).spec?.renewTime;
    const before = await renewed();
    await waitFor('the lease renewed after the cordon', async () => (await renewed()) !== before, 30_000);
    const after = await node.getJson<Node>(['node', node.nodeName]);
    expect(after.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
    expect(after.spec?.unschedulable).toBe(true);
    expect((await node.getJson<Pod>(['pod', 'late'])).status?.phase).toBe('Pending');

    expect(await node.kubectlOk(['uncordon', node.nodeName], { bin: KUBECTL_127 })).toContain(`node/${node.nodeName} uncordoned`);
    await waitFor('the taint gone', async () => {
      const n = await node.getJson<Node>(['node', node.nodeName]);
      return !n.spec?.unschedulable && !(n.spec?.taints ?? []).some((t) => t.key === 'node.kubernetes.io/unschedulable');
    }, 30_000);
    await untilReady('late');
    const bound = await node.getJson<Pod>(['pod', 'late']);
    expect(bound.spec?.nodeName).toBe(node.nodeName);
    await node.kubectlOk(['delete', 'pod', 'late']);
  }, 150_000);

  it('drains through the eviction subresource: retries against a budget until --timeout, then drains once it allows', async () => {
    await node.kubectl(['uncordon', node.nodeName]); // whatever a failed test before left
    await node.kubectlOk(['apply', '-f', '-'], { input: quick('held') + '---\n' + pdb('hold', 'held', 1) });
    await untilReady('held');
    await untilAllowed('hold', 0);
    const start = Date.now();
    const blocked = await node.kubectl(['drain', node.nodeName, '--ignore-daemonsets', '--delete-emptydir-data', '--force', '--timeout=12s'], { timeoutMs: 60_000 });
    expect(blocked.status).not.toBe(0);
    expect(Date.now() - start).toBeGreaterThanOrEqual(10_000);
    expect(blocked.stderr).toContain('error when evicting pods/"held" -n "default" (will retry after 5s): Cannot evict pod as it would violate the pod\'s disruption budget.');
    expect(blocked.stderr + blocked.stdout).toMatch(/drain did not complete within 12s|global timeout reached: 12s/);
    expect((await node.getJson<Pod>(['pod', 'held'])).metadata?.deletionTimestamp).toBeUndefined();

    // The budget allows one: drain (kubectl 1.27 this time) evicts and waits for the pod to go.
    await node.kubectlOk(['patch', 'pdb', 'hold', '--type=merge', '-p', '{"spec":{"minAvailable":0}}']);
    await untilAllowed('hold', 1);
    const drained = await node.kubectl(['drain', node.nodeName, '--ignore-daemonsets', '--delete-emptydir-data', '--force', '--timeout=60s'], { bin: KUBECTL_127, timeoutMs: 90_000 });
    expect(drained.stderr + drained.stdout).toContain(`node/${node.nodeName} drained`);
    expect(drained.stdout).toContain('pod/held evicted');
    expect(await gone('held')).toBe(true);
    await node.kubectlOk(['uncordon', node.nodeName]);
    await node.kubectlOk(['delete', 'pdb', 'hold']);
  }, 180_000);

  it('stops a pod that ignores SIGTERM within the --grace-period given, not its spec\'s 30 s', async () => {
    await node.kubectl(['uncordon', node.nodeName]);
    await node.kubectlOk(['apply', '-f', '-'], { input: stubborn('stubborn') + '---\n' + stubborn('stubborn-now') + '---\n' + stubborn('stubborn-force') });
    for (const n of ['stubborn', 'stubborn-now', 'stubborn-force']) await untilReady(n);
    const timed = async (args: string[], bin?: string) => {
      const t = Date.now();
      await node.kubectlOk(args, { bin, timeoutMs: 60_000 });
      return Date.now() - t;
    };
    // kubectl delete waits until the pod is gone from the API, which is once the node has stopped it.
    expect(await timed(['delete', 'pod', 'stubborn', '--grace-period=1'])).toBeLessThan(12_000);
    expect(await timed(['delete', 'pod', 'stubborn-now', '--now'], KUBECTL_127)).toBeLessThan(12_000);
    // Forced: gone from the API at once; the node still stops its sandbox within a few seconds.
    await node.kubectlOk(['delete', 'pod', 'stubborn-force', '--force', '--grace-period=0']);
    const t = Date.now();
    await waitFor('stubborn-force stopped on the node', async () => !(await node.sandboxes()).some((s) => s.metadata.name === 'stubborn-force' && s.state === 'SANDBOX_READY'), 30_000);
    expect(Date.now() - t).toBeLessThan(12_000);
  }, 180_000);
});
