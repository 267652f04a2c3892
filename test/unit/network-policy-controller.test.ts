/**
 * The node's NetworkPolicy controller over a real API store (localClient),
 * with nft as a recording fake: nothing is written while no policy exists;
 * a policy, a pod's address, a label or a namespace's label changing writes
 * the table again (only the set elements that changed, when nothing else did); the agent's hook has a pod's address in the rules before
 * the API shows it; a failed write is a Warning event on the policy; the
 * last policy gone removes the table.
 */
import type { Event } from 'kubernetes-types/core/v1.js';
import { afterEach, describe, expect, it } from 'vitest';
import { localClient, type ApiClient } from '../../src/api/client.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { Store } from '../../src/api/store.js';
import { silentLogger } from '../../src/log.js';
import { ControllerEvents } from '../../src/node/controller-events.js';
import { NetworkPolicyController } from '../../src/node/network-policy.js';
import type { RunOptions, RunResult } from '../../src/sys/run.js';

const POLICIES = 'networkpolicies.networking.k8s.io';

let current: { store: Store; controller: NetworkPolicyController } | undefined;
afterEach(() => {
  current?.controller.stop();
  current?.store.close();
  current = undefined;
});

async function setup() {
  const store = new Store({ kinds: nodeKinds('node-a') });
  const client = localClient(store);
  const writes: string[] = [];
  const nft = { fail: false };
  const runner = async (_cmd: string, _args: string[], opts?: RunOptions): Promise<RunResult> => {
    writes.push(String(opts?.input));
    return nft.fail ? { code: 1, signal: null, stdout: '', stderr: 'Error: Could not process rule: Operation not permitted', timedOut: false } : { code: 0, signal: null, stdout: '', stderr: '', timedOut: false };
  };
  const events = new ControllerEvents({ instance: 'test' });
  const recorded: Event[] = [];
  events.watch((_type, e) => void recorded.push(e));
  const controller = new NetworkPolicyController({ client, log: silentLogger, events, runner, retryMs: 60_000 });
  await controller.start();
  current = { store, controller };
  return { store, client, writes, nft, controller, recorded };
}

async function addPod(client: ApiClient, name: string, labels: Record<string, string>, ip?: string) {
  const pod = await client.create('pods', 'default', { metadata: { name, labels }, spec: { containers: [{ name: 'c', image: 'busybox', ports: [{ name: 'http', containerPort: 8080 }] }] } });
  if (!ip) return pod;
  return client.update('pods', 'default', name, { ...pod, status: { phase: 'Running', podIP: ip, podIPs: [{ ip }] } }, { status: true });
}

/** Waits for the controller's writes to settle. */
async function settle(controller: NetworkPolicyController): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await new Promise((r) => setTimeout(r, 20));
    await controller.idle();
  }
}

const last = (writes: string[]) => writes.at(-1) ?? '';

describe('NetworkPolicyController', () => {
  it('writes nothing while no policy exists, then the table on every change, and removes it with the last policy', async () => {
    const { client, writes, controller } = await setup();
    await addPod(client, 'web', { app: 'web' }, '10.88.0.2');
    await settle(controller);
    expect(writes).toEqual([]);

    await client.create(POLICIES, 'default', { metadata: { name: 'deny' }, spec: { podSelector: { matchLabels: { app: 'web' } } } });
    await settle(controller);
    expect(last(writes)).toContain('set ingress_isolated {\n    type ipv4_addr\n    elements = { 10.88.0.2 }');

    // A label change takes the pod out of the selection.
    const pod = await client.get('pods', 'default', 'web');
    await client.update('pods', 'default', 'web', { ...pod, metadata: { ...pod.metadata, labels: { app: 'other' } } });
    await settle(controller);
    // Only an element changed: a delta, not the whole table.
    expect(last(writes)).toContain('delete element inet skiff-netpol ingress_isolated { 10.88.0.2 }');
    expect(last(writes)).not.toContain('chain');

    await client.delete(POLICIES, 'default', 'deny');
    await settle(controller);
    expect(last(writes)).toBe('table inet skiff-netpol {}\ndelete table inet skiff-netpol\n');
    const n = writes.length;
    await addPod(client, 'web2', { app: 'web' }, '10.88.0.3');
    await settle(controller);
    expect(writes.length).toBe(n);
  });

  it("follows a namespace's labels for a namespaceSelector", async () => {
    const { client, writes, controller } = await setup();
    await client.create('namespaces', '', { metadata: { name: 'team-a' } });
    const friend = await client.create('pods', 'team-a', { metadata: { name: 'friend' }, spec: { containers: [{ name: 'c', image: 'busybox' }] } });
    await client.update('pods', 'team-a', 'friend', { ...friend, status: { phase: 'Running', podIP: '10.88.0.9' } }, { status: true });
    await addPod(client, 'web', { app: 'web' }, '10.88.0.2');
    await client.create(POLICIES, 'default', { metadata: { name: 'from-team' }, spec: { podSelector: {}, ingress: [{ from: [{ namespaceSelector: { matchLabels: { team: 'a' } } }] }] } });
    await settle(controller);
    expect(last(writes)).not.toContain('10.88.0.9');
    const ns = await client.get('namespaces', '', 'team-a');
    await client.update('namespaces', '', 'team-a', { ...ns, metadata: { ...ns.metadata, labels: { ...ns.metadata.labels, team: 'a' } } });
    await settle(controller);
    expect(last(writes)).toMatch(/^add element inet skiff-netpol s\d+ \{ 10\.88\.0\.9 \}$/m);
  });

  it("has the agent's pod in the rules before the API shows its address", async () => {
    const { client, writes, controller } = await setup();
    await client.create(POLICIES, 'default', { metadata: { name: 'deny' }, spec: { podSelector: {} } });
    const pod = await addPod(client, 'new', { app: 'new' });
    await settle(controller);
    expect(last(writes)).not.toContain('10.88.0.7');
    await controller.podReady(pod as never, '10.88.0.7');
    expect(last(writes)).toContain('add element inet skiff-netpol ingress_isolated { 10.88.0.7 }');
  });

  it('a failed write is a Warning event on each policy, and the hook fails with it', async () => {
    const { client, nft, controller, recorded } = await setup();
    nft.fail = true;
    await client.create(POLICIES, 'default', { metadata: { name: 'deny' }, spec: { podSelector: {} } });
    await settle(controller);
    const e = recorded.find((x) => x.reason === 'FailedToApplyNetworkPolicy');
    expect(e).toMatchObject({ type: 'Warning', involvedObject: { kind: 'NetworkPolicy', name: 'deny', namespace: 'default' } });
    expect(e?.message).toContain('Operation not permitted');
    const pod = await addPod(client, 'p', {});
    await expect(controller.podReady(pod as never, '10.88.0.8')).rejects.toThrow('nft -f failed (exit 1)');
  });
});
