/**
 * LoadBalancer Services on a real `skiff node` with real kubectl 1.35: the
 * node gives them its address as ServiceLB does (`kubectl get svc` shows it
 * as EXTERNAL-IP), the service port answers on that address, a Local one
 * gets a health-check node port from the API that answers as kube-proxy's,
 * and a Service the API server would refuse is refused with its message.
 */
import { spawn } from 'node:child_process';
import type { Service } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const NODE_IP = '192.0.2.10';

const APP = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 1
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "exit 0" TERM; echo echo-pod > /www/index.html; httpd -f -p 8080 -h /www & wait']
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: http}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: front}
spec:
  type: LoadBalancer
  selector: {app: echo}
  ports: [{name: web, port: 8081, targetPort: http}]
---
apiVersion: v1
kind: Service
metadata: {name: local}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  allocateLoadBalancerNodePorts: false
  selector: {app: echo}
  ports: [{name: web, port: 8082, targetPort: http}]
`;

const GET = `
const http = require('http');
http.get({ host: process.env.HOST, port: +process.env.PORT, path: '/', timeout: 3000 }, (res) => {
  let b = '';
  res.on('data', (c) => (b += c));
  res.on('end', () => process.stdout.write(JSON.stringify({ status: res.statusCode, body: b })));
}).on('error', (e) => process.stdout.write(JSON.stringify({ error: e.code })));
`;

describe.skipIf(!isRoot)('LoadBalancer Services on a real skiff node, with real kubectl', () => {
  const node = new SkiffNode();
  useSkiffNode(node);

  /** An HTTP GET from inside the node's network namespace (as another host on its network would send). */
  function get(host: string, port: number): Promise<{ status?: number; body?: string; error?: string }> {
    const child = spawn('nsenter', [`--net=${node.ns.path}`, process.execPath, '-e', GET], { env: { ...process.env, HOST: host, PORT: String(port) }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout!.on('data', (c) => (out += c));
    return new Promise((r) => child.on('close', () => r(JSON.parse(out || '{}'))));
  }

  it('gives a LoadBalancer the node address (kubectl shows it as EXTERNAL-IP) and answers the service port there', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: APP });
    // The address from ServiceLB, the cluster IP and node port from the proxy's allocations.
    const row = await waitFor('front to get the node address, its cluster IP and node port', async () => {
      const out = await node.kubectlOk(['get', 'svc', 'front', '--no-headers']);
      return out.includes(NODE_IP) && !out.includes('<none>') && /8081:\d+\/TCP/.test(out) ? out : undefined;
    }, 60_000);
    const svc = await node.getJson<Service>(['svc', 'front']);
    expect(svc.status?.loadBalancer?.ingress).toEqual([{ ip: NODE_IP, ipMode: 'VIP' }]);
    const nodePort = svc.spec!.ports![0]!.nodePort;
    // NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE
    expect(row.trim().split(/\s+/).slice(0, 5)).toEqual(['front', 'LoadBalancer', svc.spec!.clusterIP, NODE_IP, `8081:${nodePort}/TCP`]);
    const answer = await waitFor('the service port on the node address', async () => {
      const r = await get(NODE_IP, 8081);
      return r.status === 200 ? r : undefined;
    }, 60_000);
    expect(answer.body?.trim()).toBe('echo-pod');
    // And its node port, as for any LoadBalancer that allocates them.
    expect((await get(NODE_IP, nodePort!)).body?.trim()).toBe('echo-pod');
  }, 180_000);

  it('a Local one gets a health-check node port from the API, answered as kube-proxy answers it; no node ports when it asks for none', async () => {
    const svc = await waitFor('local to get its address', async () => {
      const s = await node.getJson<Service>(['svc', 'local']);
      return s.status?.loadBalancer?.ingress?.length ? s : undefined;
    }, 60_000);
    const hc = svc.spec!.healthCheckNodePort!;
    expect(hc).toBeGreaterThanOrEqual(30000);
    expect(hc).toBeLessThanOrEqual(32767);
    expect(svc.spec!.ports![0]!.nodePort).toBeUndefined();
    const health = await waitFor('the health check to see the local endpoint', async () => {
      const r = await get(NODE_IP, hc);
      return r.status === 200 ? r : undefined;
    }, 60_000);
    expect(JSON.parse(health.body!)).toEqual({ service: { namespace: 'default', name: 'local' }, localEndpoints: 1, serviceProxyHealthy: true });
    expect((await get(NODE_IP, 8082)).body?.trim()).toBe('echo-pod');
    // No endpoints: 503 with a count of 0.
    await node.kubectlOk(['scale', 'deployment', 'echo', '--replicas=0']);
    const down = await waitFor('the health check to see no endpoint', async () => {
      const r = await get(NODE_IP, hc);
      return r.status === 503 ? r : undefined;
    }, 60_000);
    expect(JSON.parse(down.body!).localEndpoints).toBe(0);
  }, 180_000);

  it('takes the address back from a Service that stops being a LoadBalancer', async () => {
    await node.kubectlOk(['patch', 'svc', 'front', '--type=merge', '-p', '{"spec":{"type":"ClusterIP"}}']);
    await waitFor('front to lose its address', async () => {
      const s = await node.getJson<Service>(['svc', 'front']);
      return !s.status?.loadBalancer?.ingress?.length;
    }, 30_000);
  }, 60_000);

  it('answers one Service per port on the node address: a second on a taken port stays pending until the first lets it go', async () => {
    const lb = (name: string) => `apiVersion: v1\nkind: Service\nmetadata: {name: ${name}}\nspec: {type: LoadBalancer, selector: {app: echo}, ports: [{port: 8083, targetPort: http}]}\n`;
    await node.kubectlOk(['apply', '-f', '-'], { input: lb('first') });
    await waitFor('first to get the node address', async () => (await node.getJson<Service>(['svc', 'first'])).status?.loadBalancer?.ingress?.length, 30_000);
    await node.kubectlOk(['apply', '-f', '-'], { input: lb('second') });
    // A LoadBalancer on another port is given the address all the same.
    await node.kubectlOk(['apply', '-f', '-'], { input: lb('third').replace('8083', '8084') });
    await waitFor('third to get the node address', async () => (await node.getJson<Service>(['svc', 'third'])).status?.loadBalancer?.ingress?.length, 30_000);
    const row = await node.kubectlOk(['get', 'svc', 'second', '--no-headers']);
    expect(row.trim().split(/\s+/)[3]).toBe('<pending>');
    await node.kubectlOk(['delete', 'svc', 'first']);
    const s = await waitFor('second to get the node address', async () => {
      const got = await node.getJson<Service>(['svc', 'second']);
      return got.status?.loadBalancer?.ingress?.length ? got : undefined;
    }, 30_000);
    expect(s.status?.loadBalancer?.ingress).toEqual([{ ip: NODE_IP, ipMode: 'VIP' }]);
  }, 90_000);

  it('refuses Services as the API server does, with its messages', async () => {
    const bad = (name: string, spec: string) => `apiVersion: v1\nkind: Service\nmetadata: {name: ${name}}\nspec: ${spec}\n`;
    const r1 = await node.kubectl(['apply', '-f', '-'], { input: bad('front_end', '{selector: {app: x}, ports: [{port: 80}]}') });
    expect(r1.status).not.toBe(0);
    expect(r1.stderr).toContain(`The Service "front_end" is invalid: metadata.name: Invalid value: "front_end": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character`);
    const r2 = await node.kubectl(['apply', '-f', '-'], { input: bad('np', '{selector: {app: x}, ports: [{port: 80, nodePort: 30123}]}') });
    expect(r2.stderr).toContain("The Service \"np\" is invalid: spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'");
    const r3 = await node.kubectl(['apply', '-f', '-'], { input: bad('sel', "{selector: {app: 'a b'}, ports: [{port: 80, protocol: ICMP}]}") });
    expect(r3.stderr).toContain('spec.ports[0].protocol: Unsupported value: "ICMP": supported values: "SCTP", "TCP", "UDP"');
    expect(r3.stderr).toContain('spec.selector: Invalid value: "a b": a valid label must be an empty string');
  }, 60_000);
});
