/**
 * NetworkPolicy on a real `skiff node`, with real kubectl and real packets
 * between its pods (busybox wget and nslookup inside them): default deny,
 * allow by pod label, by namespace label, by CIDR with an exception, by
 * named port, a label change, through a Service's cluster IP (ingress, and
 * egress judged on the backend after DNAT), from another host through its
 * node port and a LoadBalancer's address (judged at the backend pod),
 * default-deny egress with service DNS allowed only by a policy, and a
 * policy's removal seen by the next connection, a new pod fenced before
 * its first container runs. The node itself still
 * reaches a fenced pod (its readiness probe keeps it Ready).
 */
import { spawnSync } from 'node:child_process';
import type { Pod, Service } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const pod = (name: string, ns: string, labels: string, command: string, extra = '') => `
apiVersion: v1
kind: Pod
metadata: {name: ${name}, namespace: ${ns}, labels: ${labels}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, '${command}']
${extra}`;

const SERVE = 'trap "exit 0" TERM; echo server-pod > /www/index.html; httpd -f -p 8080 -h /www & httpd -f -p 9090 -h /www & wait';
const SLEEP = 'trap "exit 0" TERM; sleep 100000 & wait';

const APP = `
apiVersion: v1
kind: Namespace
metadata: {name: team-a, labels: {team: a}}
---
apiVersion: v1
kind: Namespace
metadata: {name: team-b, labels: {team: b}}
---
${pod('server', 'default', '{app: server}', SERVE, `    ports: [{name: http, containerPort: 8080}, {containerPort: 9090}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}`)}
---
${pod('client', 'default', '{role: client}', SLEEP)}
---
${pod('stranger', 'default', '{role: stranger}', SLEEP)}
---
${pod('friend', 'team-a', '{role: client}', SLEEP)}
---
${pod('foe', 'team-b', '{role: client}', SLEEP)}
---
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  type: NodePort
  selector: {app: server}
  ports: [{name: web, port: 80, targetPort: http}]
`;

const policy = (name: string, spec: string) => `apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: ${name}}\nspec: ${spec}\n`;

describe.skipIf(!isRoot)('NetworkPolicy on a real skiff node, with real packets between pods', () => {
  const node = new SkiffNode();
  useSkiffNode(node);
  const ips: Record<string, string> = {};

  /** One HTTP GET from a pod; true when the server's page came back. */
  async function reach(from: string, host: string, port: number): Promise<boolean> {
    const [ns, name] = from.includes('/') ? from.split('/') : ['default', from];
    const r = await node.kubectl(['exec', '-n', ns!, name!, '--', 'timeout', '3', 'wget', '-q', '-O-', `http://${host}:${port}/`], { timeoutMs: 20_000 });
    return r.status === 0 && r.stdout.includes('server-pod');
  }

  /** Polls until `from` reaching host:port is `want` (rules are written shortly after a change). */
  async function expectReach(from: string, host: string, port: number, want: boolean): Promise<void> {
    await waitFor(`${from} → ${host}:${port} to be ${want ? 'allowed' : 'blocked'}`, async () => (await reach(from, host, port)) === want, 30_000);
  }

  async function apply(yaml: string): Promise<void> {
    await node.kubectlOk(['apply', '-f', '-'], { input: yaml });
  }

  it('runs the pods, and every pod reaches the server while no policy exists', async () => {
    await apply(APP);
    for (const name of ['default/server', 'default/client', 'default/stranger', 'team-a/friend', 'team-b/foe']) {
      const [ns, n] = name.split('/');
      const p = await waitFor(`${name} to run with an IP`, async () => {
        const o = await node.getJson<Pod>(['pod', '-n', ns!, n!]);
        return o.status?.podIP && o.status.phase === 'Running' ? o : undefined;
      }, 120_000);
      ips[n!] = p.status!.podIP!;
    }
    await waitFor('the server to be Ready', async () => (await node.getJson<Pod>(['pod', 'server'])).status?.conditions?.find((c) => c.type === 'Ready')?.status === 'True', 60_000);
    expect(await reach('client', ips.server!, 8080)).toBe(true);
    expect(await reach('team-b/foe', ips.server!, 9090)).toBe(true);
  }, 240_000);

  it('default deny ingress: no pod reaches the server, the node still does (the probe keeps it Ready)', async () => {
    await apply(policy('deny-server', '{podSelector: {matchLabels: {app: server}}}'));
    const listed = await node.kubectlOk(['get', 'netpol']);
    expect(listed).toMatch(/NAME\s+POD-SELECTOR\s+AGE/);
    expect(listed).toMatch(/deny-server\s+app=server\s+/);
    await expectReach('client', ips.server!, 8080, false);
    expect(await reach('team-a/friend', ips.server!, 8080)).toBe(false);
    // The kubelet's probe comes from the node itself: allowed, so the pod stays Ready.
    await new Promise((r) => setTimeout(r, 3000));
    expect((await node.getJson<Pod>(['pod', 'server'])).status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
  }, 120_000);

  it('puts back a forged pod status at once, so a fenced pod stays fenced', async () => {
    // The node reads pod addresses from the API's status: one a client forges must not unfence the real address.
    await node.kubectlOk(['patch', 'pod', 'server', '--subresource=status', '--type=merge', '-p', '{"status":{"podIP":"10.88.200.200","podIPs":[{"ip":"10.88.200.200"}],"phase":"Succeeded"}}']);
    await waitFor('the real status back', async () => {
      const p = await node.getJson<Pod>(['pod', 'server']);
      return p.status?.podIP === ips.server && p.status?.phase === 'Running' ? true : undefined;
    }, 10_000);
    for (let i = 0; i < 3; i++) expect(await reach('client', ips.server!, 8080)).toBe(false);
  }, 60_000);

  it('allows by pod label and named port: the client on http, not the stranger, not the unnamed port', async () => {
    await apply(policy('allow-client', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{podSelector: {matchLabels: {role: client}}}], ports: [{port: http}]}]}'));
    await expectReach('client', ips.server!, 8080, true);
    expect(await reach('client', ips.server!, 9090)).toBe(false);
    expect(await reach('stranger', ips.server!, 8080)).toBe(false);
    // A pod selector alone is the policy's namespace: the same labels elsewhere do not count.
    expect(await reach('team-a/friend', ips.server!, 8080)).toBe(false);
    // A label change moves a pod in and out of a peer's set.
    await node.kubectlOk(['label', 'pod', 'stranger', 'role=client', '--overwrite']);
    await expectReach('stranger', ips.server!, 8080, true);
    await node.kubectlOk(['label', 'pod', 'stranger', 'role=stranger', '--overwrite']);
    await expectReach('stranger', ips.server!, 8080, false);
  }, 120_000);

  it('judges a connection to the Service cluster IP at the backend pod', async () => {
    const svc = await waitFor('the server Service to get a cluster IP', async () => {
      const s = await node.getJson<Service>(['svc', 'server']);
      return s.spec?.clusterIP ? s : undefined;
    }, 30_000);
    const vip = svc.spec!.clusterIP!;
    await expectReach('client', vip, 80, true);
    expect(await reach('stranger', vip, 80)).toBe(false);
  }, 120_000);

  it('judges egress to a Service cluster IP at the backend pod (after DNAT): allowed when the rule allows the backend, blocked otherwise', async () => {
    const vip = (await node.getJson<Service>(['svc', 'server'])).spec!.clusterIP!;
    // The client may send only to pods labelled app=nobody: the Service's backend is not one.
    await apply(policy('client-out', '{podSelector: {matchLabels: {role: client}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: nobody}}}]}]}'));
    await expectReach('client', vip, 80, false);
    expect(await reach('client', ips.server!, 8080)).toBe(false);
    // To the server pods on their named port http (8080): the Service's port is 80, so only the backend's address and port can match.
    await apply(policy('client-out', '{podSelector: {matchLabels: {role: client}}, policyTypes: [Egress], egress: [{to: [{podSelector: {matchLabels: {app: server}}}], ports: [{port: http}]}]}'));
    await expectReach('client', vip, 80, true);
    expect(await reach('client', ips.server!, 8080)).toBe(true);
    expect(await reach('client', ips.server!, 9090)).toBe(false);
    await node.kubectlOk(['delete', 'netpol', 'client-out']);
    await expectReach('client', ips.server!, 9090, false); // still the server's ingress: only http for the client
  }, 120_000);

  it('allows by namespace label, and by both selectors together', async () => {
    await apply(policy('allow-team-a', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{namespaceSelector: {matchLabels: {team: a}}, podSelector: {matchLabels: {role: client}}}], ports: [{port: 9090}]}]}'));
    await expectReach('team-a/friend', ips.server!, 9090, true);
    expect(await reach('team-b/foe', ips.server!, 9090)).toBe(false);
    // Its own namespace is not team-a: the default client still has only port http.
    expect(await reach('client', ips.server!, 9090)).toBe(false);
  }, 120_000);

  it('allows by CIDR with an exception', async () => {
    await apply(policy('allow-cidr', `{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{ipBlock: {cidr: ${ips.foe}/24, except: [${ips.stranger}/32]}}], ports: [{port: 8080, endPort: 8081}]}]}`));
    await expectReach('team-b/foe', ips.server!, 8080, true);
    expect(await reach('stranger', ips.server!, 8080)).toBe(false);
  }, 120_000);

  it('a policy removed is seen by the next connection', async () => {
    for (const n of ['allow-client', 'allow-team-a', 'allow-cidr']) await node.kubectlOk(['delete', 'netpol', n]);
    await expectReach('team-b/foe', ips.server!, 8080, false);
    await node.kubectlOk(['delete', 'netpol', 'deny-server']);
    await expectReach('stranger', ips.server!, 8080, true);
  }, 120_000);

  it('default deny egress stops service DNS too, until a policy allows port 53', async () => {
    const lookup = async () => {
      const r = await node.kubectl(['exec', 'client', '--', 'timeout', '4', 'nslookup', 'server.default.svc.cluster.local'], { timeoutMs: 20_000 });
      return r.status === 0 && r.stdout.includes('Address');
    };
    expect(await lookup()).toBe(true);
    await apply(policy('client-egress', '{podSelector: {matchLabels: {role: client}}, policyTypes: [Egress]}'));
    await waitFor('DNS to be blocked', async () => !(await lookup()), 30_000);
    expect(await reach('client', ips.server!, 8080)).toBe(false);
    await apply(policy('client-dns', '{podSelector: {matchLabels: {role: client}}, egress: [{ports: [{port: 53, protocol: UDP}, {port: 53, protocol: TCP}]}]}'));
    await waitFor('DNS to be allowed', lookup, 30_000);
    // Only DNS: the server is still out of reach, and the stranger (not selected) is not fenced.
    expect(await reach('client', ips.server!, 8080)).toBe(false);
    expect(await reach('stranger', ips.server!, 8080)).toBe(true);
    for (const n of ['client-egress', 'client-dns']) await node.kubectlOk(['delete', 'netpol', n]);
    await expectReach('client', ips.server!, 8080, true);
  }, 180_000);

  it('fences a new pod before its first container runs: its very first connection is judged', async () => {
    await apply(policy('early-out', '{podSelector: {matchLabels: {app: early}}, policyTypes: [Egress]}'));
    // Written while the policy is already in force; the container tries at once, before the API shows its IP.
    await apply(pod('early', 'default', '{app: early}', `if timeout 2 wget -q -O- http://${ips.server}:8080/ >/dev/null; then echo LEAKED; else echo FENCED; fi; sleep 100000`));
    const log = await waitFor('the early pod to log its first attempt', async () => {
      const r = await node.kubectl(['logs', 'early']);
      return /LEAKED|FENCED/.test(r.stdout) ? r.stdout : undefined;
    }, 90_000);
    // (busybox's shell may add "Terminated" for the wget that timeout stopped)
    expect(log).toContain('FENCED');
    expect(log).not.toContain('LEAKED');
    // And the same pod reaches the server once the policy is gone: the first try failed for the policy alone.
    await node.kubectlOk(['delete', 'netpol', 'early-out']);
    await expectReach('early', ips.server!, 8080, true);
    await node.kubectlOk(['delete', 'pod', 'early', '--wait=false']);
  }, 150_000);

  /**
   * Another host on the node's network, 192.0.2.20: the far end of eth0's veth, moved into a namespace
   * of its own for `body`; `get(port)` is an HTTP GET from it to the node's address 192.0.2.10.
   */
  async function fromOutside(body: (get: (port: number) => boolean) => Promise<void>): Promise<void> {
    const outside = `skiff-np-out-${process.pid}`;
    const ip = (...args: string[]) => {
      const r = spawnSync('ip', args, { encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`ip ${args.join(' ')}: ${r.stderr}`);
    };
    const get = (port: number) => spawnSync('ip', ['netns', 'exec', outside, 'timeout', '3', 'busybox', 'wget', '-q', '-O-', `http://192.0.2.10:${port}/`], { encoding: 'utf8' }).stdout.includes('server-pod');
    ip('netns', 'add', outside);
    try {
      ip('-n', node.ns.name, 'link', 'set', 'eth0-peer', 'netns', outside);
      ip('-n', outside, 'addr', 'add', '192.0.2.20/24', 'dev', 'eth0-peer');
      ip('-n', outside, 'link', 'set', 'eth0-peer', 'up');
      await body(get);
    } finally {
      spawnSync('ip', ['-n', outside, 'link', 'set', 'eth0-peer', 'netns', node.ns.name]);
      spawnSync('ip', ['-n', node.ns.name, 'link', 'set', 'eth0-peer', 'up']);
      spawnSync('ip', ['netns', 'del', outside]);
    }
  }

  it('judges a connection from another host to the node port at the backend pod, by its source address', async () => {
    const svc = await node.getJson<Service>(['svc', 'server']);
    const nodePort = svc.spec!.ports![0]!.nodePort!;
    try {
      await fromOutside(async (getPort) => {
        const get = () => getPort(nodePort);
        await waitFor('the node port from the other host', async () => get(), 30_000);
        await apply(policy('deny-server', '{podSelector: {matchLabels: {app: server}}}'));
        await apply(policy('from-net', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.20/32]}}]}]}'));
        await waitFor('the other host to be blocked', async () => !get(), 30_000);
        await apply(policy('from-net', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{ipBlock: {cidr: 192.0.2.0/24}}]}]}'));
        await waitFor('the other host to be allowed', async () => get(), 30_000);
        // Pods are not in 192.0.2.0/24: still fenced.
        expect(await reach('client', ips.server!, 8080)).toBe(false);
      });
    } finally {
      for (const n of ['deny-server', 'from-net']) await node.kubectl(['delete', 'netpol', n, '--ignore-not-found']);
    }
  }, 150_000);

  it("judges a connection to a LoadBalancer Service's address (ServiceLB's: the node's) at the backend pod", async () => {
    await apply(`apiVersion: v1
kind: Service
metadata: {name: server-lb}
spec:
  type: LoadBalancer
  selector: {app: server}
  ports: [{name: web, port: 8083, targetPort: http}]
`);
    await waitFor('server-lb to get the node address', async () => (await node.getJson<Service>(['svc', 'server-lb'])).status?.loadBalancer?.ingress?.[0]?.ip === '192.0.2.10' || undefined, 60_000);
    try {
      await fromOutside(async (get) => {
        await waitFor('the load balancer from the other host', async () => get(8083), 30_000);
        await expectReach('client', '192.0.2.10', 8083, true);
        // Ingress to the server from pods labelled role=client only: the other host and the stranger pod are out.
        await apply(policy('deny-server', '{podSelector: {matchLabels: {app: server}}}'));
        await apply(policy('lb-clients', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{podSelector: {matchLabels: {role: client}}}]}]}'));
        await waitFor('the other host to be blocked', async () => !get(8083), 30_000);
        await expectReach('stranger', '192.0.2.10', 8083, false);
        expect(await reach('client', '192.0.2.10', 8083)).toBe(true);
        // The other host by its address, judged at the backend too.
        await apply(policy('lb-outside', '{podSelector: {matchLabels: {app: server}}, ingress: [{from: [{ipBlock: {cidr: 192.0.2.20/32}}]}]}'));
        await waitFor('the other host to be allowed', async () => get(8083), 30_000);
        expect(await reach('stranger', '192.0.2.10', 8083)).toBe(false);
      });
    } finally {
      for (const n of ['deny-server', 'lb-clients', 'lb-outside']) await node.kubectl(['delete', 'netpol', n, '--ignore-not-found']);
      await node.kubectl(['delete', 'svc', 'server-lb', '--ignore-not-found']);
    }
  }, 180_000);

  it('refuses policies the API server refuses, with its messages', async () => {
    const r = await node.kubectl(['apply', '-f', '-'], {
      input: policy('bad', '{podSelector: {}, policyTypes: [Sideways], ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [192.168.0.0/16]}, podSelector: {}}], ports: [{port: http, endPort: 90}, {protocol: ICMP, port: 80, endPort: 70}]}]}'),
    });
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('The NetworkPolicy "bad" is invalid');
    expect(r.stderr).toContain('spec.policyTypes[0]: Unsupported value: "Sideways": supported values: "Ingress", "Egress"');
    expect(r.stderr).toContain('spec.ingress[0].from[0]: Forbidden: may not specify both ipBlock and another peer');
    expect(r.stderr).toContain('spec.ingress[0].from[0].ipBlock.except[0]: Invalid value: "192.168.0.0/16": must be a strict subset of `cidr`');
    expect(r.stderr).toContain('spec.ingress[0].ports[0].endPort: Invalid value: 90: may not be specified when `port` is non-numeric');
    expect(r.stderr).toContain('spec.ingress[0].ports[1].protocol: Unsupported value: "ICMP": supported values: "TCP", "UDP", "SCTP"');
    expect(r.stderr).toContain('spec.ingress[0].ports[1].endPort: Invalid value: 80: must be greater than or equal to `port`');
  }, 60_000);
});
