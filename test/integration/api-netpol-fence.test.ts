/**
 * The start-time fence on a real `skiff node`, with real packets: a pod a
 * NetworkPolicy selects does not run a moment without its rules, even when
 * writing the rules is slow. The node here holds every nft write back 4 s
 * (SKIFF_TEST_NETPOL_WRITE_DELAY_MS, a knob for tests only, standing for a
 * slow nft on a loaded node). A new pod's container connects out at its
 * very first instant: with the agent's hook (kubelet-lite/pod-network.ts)
 * the container starts only once its address is in the rules, so that
 * first connection is blocked; without the hook it starts while the write
 * is still held back, and its first connection gets through (this file's
 * case fails: checked by removing the hook from cli/node.ts).
 */
import { spawnSync } from 'node:child_process';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const DELAY_MS = 4000;

const pod = (name: string, labels: string, command: string, extra = '') => `
apiVersion: v1
kind: Pod
metadata: {name: ${name}, labels: ${labels}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, '${command}']
${extra}`;

describe.skipIf(!isRoot)('the start-time fence on a real skiff node whose nft writes are slow', () => {
  const node = new SkiffNode([], { SKIFF_TEST_NETPOL_WRITE_DELAY_MS: String(DELAY_MS) });
  useSkiffNode(node);

  /** The table's text in the node's namespace; empty when there is none. */
  const table = () => spawnSync('nsenter', [`--net=${node.ns.path}`, 'nft', 'list', 'table', 'inet', 'skiff-netpol'], { encoding: 'utf8' }).stdout;

  it("blocks a new pod's first connection, made at its container's very first instant", async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('server', '{app: server}', 'trap "exit 0" TERM; echo server-pod > /www/index.html; httpd -f -p 8080 -h /www & wait', '    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}') });
    const server = await waitFor('the server to be Ready with an IP', async () => {
      const p = await node.getJson<Pod>(['pod', 'server']);
      return p.status?.podIP && p.status.conditions?.find((c) => c.type === 'Ready')?.status === 'True' ? p : undefined;
    }, 120_000);
    const ip = server.status!.podIP!;
    await node.kubectlOk(['apply', '-f', '-'], { input: `apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: early-out}\nspec: {podSelector: {matchLabels: {app: early}}, policyTypes: [Egress]}\n` });
    // The policy's rules in the kernel (after the held-back write): the node knows the policy before the pod exists.
    await waitFor('the policy table in the kernel', async () => table().includes('chain egress'), 30_000);
    const t0 = Date.now();
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('early', '{app: early}', `if timeout 2 wget -q -O- http://${ip}:8080/ >/dev/null; then echo LEAKED; else echo FENCED; fi; sleep 100000`) });
    const log = await waitFor('the early pod to log its first attempt', async () => {
      const r = await node.kubectl(['logs', 'early']);
      return /LEAKED|FENCED/.test(r.stdout) ? r.stdout : undefined;
    }, 90_000);
    expect(log).toContain('FENCED');
    expect(log).not.toContain('LEAKED');
    // The container waited for the held-back write: it could not have started sooner.
    const started = (await node.getJson<Pod>(['pod', 'early'])).status?.containerStatuses?.[0]?.state?.running?.startedAt;
    expect(Date.parse(started!) - t0).toBeGreaterThanOrEqual(DELAY_MS - 1000);
    // The first try failed for the policy alone: without it the same pod reaches the server.
    await node.kubectlOk(['delete', 'netpol', 'early-out']);
    await waitFor('the early pod to reach the server', async () => {
      const r = await node.kubectl(['exec', 'early', '--', 'timeout', '3', 'wget', '-q', '-O-', `http://${ip}:8080/`], { timeoutMs: 20_000 });
      return r.status === 0 && r.stdout.includes('server-pod');
    }, 30_000);
  }, 240_000);
});
