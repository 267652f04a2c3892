/**
 * Services through the node's API on a real `skiff node`: the
 * endpoint-slice and endpoints controllers write what kubectl 1.35 and
 * 1.27 read (`get endpointslices`, `describe service`), the proxy programs
 * the cluster IP from the slices (a request from a pod reaches a replica),
 * scaling to 0 leaves the Service without endpoints, and the `kubernetes`
 * Service is there as the API server keeps it.
 */
import { spawnSync } from 'node:child_process';
import type { Endpoints, Service } from 'kubernetes-types/core/v1.js';
import type { EndpointSliceList } from 'kubernetes-types/discovery/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';

const APP = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "exit 0" TERM; hostname > /www/index.html; httpd -f -p 8080 -h /www & wait']
        ports: [{name: http, containerPort: 8080}]
        readinessProbe: {tcpSocket: {port: http}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports: [{name: web, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
`;

describe.skipIf(!isRoot)('Services and EndpointSlices through the node API, with real kubectl', () => {
  const node = new SkiffNode();
  const slices = () => node.getJson<EndpointSliceList>(['endpointslices', '-l', 'kubernetes.io/service-name=echo']);
  const readyIPs = async () =>
    (await slices()).items
      .flatMap((s) => s.endpoints ?? [])
      .filter((e) => e.conditions?.ready)
      .map((e) => e.addresses[0]!)
      .sort();

  beforeAll(async () => {
    await node.create();
    await node.kubectlOk(['apply', '-f', '-'], { input: APP });
  }, 180_000);

  afterAll(async () => {
    expect(await node.destroy()).toEqual({ mounts: [], processes: [] });
  }, 120_000);

  it('writes an EndpointSlice and an Endpoints of the ready replicas, as kubectl 1.35 and 1.27 show them', async () => {
    const ips = await waitFor('two ready endpoints', async () => {
      const ips = await readyIPs();
      return ips.length === 2 ? ips : undefined;
    }, 90_000);
    const list = await slices();
    expect(list.items).toHaveLength(1);
    const slice = list.items[0]!;
    expect(slice.addressType).toBe('IPv4');
    expect(slice.metadata?.labels?.['endpointslice.kubernetes.io/managed-by']).toBe('endpointslice-controller.k8s.io');
    expect(slice.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'Service', name: 'echo', controller: true });
    expect(slice.ports).toEqual([{ name: 'web', port: 8080, protocol: 'TCP' }]);
    for (const e of slice.endpoints) {
      expect(e.nodeName).toBe(node.nodeName);
      expect(e.conditions).toEqual({ ready: true, serving: true, terminating: false });
      expect(e.targetRef).toMatchObject({ kind: 'Pod', namespace: 'default' });
    }
    const table = await node.kubectlOk(['get', 'endpointslices']);
    expect(table).toMatch(/^NAME\s+ADDRESSTYPE\s+PORTS\s+ENDPOINTS\s+AGE/);
    expect(table).toMatch(new RegExp(`echo-\\S+\\s+IPv4\\s+8080\\s+${slice.endpoints.map((e) => e.addresses[0]!.replace(/\./g, '\\.')).join(',')}\\s`));
    const eps = await node.getJson<Endpoints>(['endpoints', 'echo']);
    expect(eps.subsets?.[0]?.addresses?.map((a) => a.ip).sort()).toEqual(ips);
    const pairs = ips.map((ip) => `${ip}:8080`).join(',');
    // kubectl 1.35 reads the slices, 1.27 the Endpoints: both name the two replicas.
    for (const bin of [undefined, KUBECTL_127]) {
      const out = await node.kubectlOk(['describe', 'service', 'echo'], { bin });
      expect(/\nEndpoints:\s+(\S+)/.exec(out)?.[1]?.split(',').sort().join(','), bin ?? '1.35').toBe(pairs);
    }
    expect(/echo\s+(\S+)/.exec(await node.kubectlOk(['get', 'endpoints', 'echo'], { bin: KUBECTL_127 }))?.[1]?.split(',').sort().join(',')).toBe(pairs);
  }, 120_000);

  it('routes a request from a pod to the cluster IP to a replica', async () => {
    const svc = await waitFor('echo to have a cluster IP', async () => {
      const s = await node.getJson<Service>(['service', 'echo']);
      return s.spec?.clusterIP ? s : undefined;
    }, 30_000);
    await waitFor('client running', async () => (await node.kubectl(['exec', 'client', '--', 'true'])).status === 0, 60_000);
    const pods = await node.getJson<{ items: Array<{ metadata: { name: string } }> }>(['pods', '-l', 'app=echo']);
    const names = pods.items.map((p) => p.metadata.name);
    const answer = await waitFor('an answer through the cluster IP', async () => {
      const r = await node.kubectl(['exec', 'client', '--', 'timeout', '3', 'wget', '-q', '-O', '-', `http://${svc.spec!.clusterIP}/`]);
      return r.status === 0 ? r.stdout.trim() : undefined;
    }, 30_000);
    expect(names).toContain(answer);
    // An edit of the Service (same uid, new resourceVersion) is programmed too.
    await node.kubectlOk(['patch', 'service', 'echo', '--type', 'json', '-p', '[{"op":"replace","path":"/spec/ports/0/port","value":81}]']);
    const again = await waitFor('an answer on the edited port', async () => {
      const r = await node.kubectl(['exec', 'client', '--', 'timeout', '3', 'wget', '-q', '-O', '-', `http://${svc.spec!.clusterIP}:81/`]);
      return r.status === 0 ? r.stdout.trim() : undefined;
    }, 30_000);
    expect(names).toContain(again);
  }, 120_000);

  it('holds a pod with a readiness gate out of its Service until someone sets the gate\'s condition, as the kubelet does', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: `apiVersion: v1
kind: Pod
metadata: {name: gated, labels: {app: gated}}
spec:
  terminationGracePeriodSeconds: 1
  readinessGates: [{conditionType: example.com/lb-ready}]
  containers:
  - name: web
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; httpd -f -p 8080 -h /www & wait']
---
apiVersion: v1
kind: Service
metadata: {name: gated}
spec:
  selector: {app: gated}
  ports: [{port: 80, targetPort: 8080}]
`,
    });
    type Cond = { type: string; status: string; reason?: string; message?: string };
    const conds = async () => new Map((await node.getJson<{ status: { conditions?: Cond[] } }>(['pod', 'gated'])).status.conditions?.map((c) => [c.type, c]) ?? []);
    const gatedEndpoint = async () => (await node.getJson<EndpointSliceList>(['endpointslices', '-l', 'kubernetes.io/service-name=gated'])).items.flatMap((x) => x.endpoints ?? [])[0];
    const held = await waitFor('the containers ready, the pod not', async () => {
      const c = await conds();
      return c.get('ContainersReady')?.status === 'True' ? c : undefined;
    }, 60_000);
    expect(held.get('Ready')).toMatchObject({ status: 'False', reason: 'ReadinessGatesNotReady', message: 'corresponding condition of pod readiness gate "example.com/lb-ready" does not exist.' });
    expect(await node.kubectlOk(['get', 'pod', 'gated', '-o', 'wide'])).toMatch(/gated\s+1\/1\s+Running\s.*\s0\/1\s*\n$/);
    await waitFor('the endpoint, not ready', async () => ((await gatedEndpoint())?.conditions?.ready === false ? true : undefined), 30_000);

    const setGate = (status: string) =>
      node.kubectlOk(['patch', 'pod', 'gated', '--subresource=status', '--type=json', '-p', JSON.stringify([{ op: 'add', path: '/status/conditions/-', value: { type: 'example.com/lb-ready', status } }])]);
    await setGate('True');
    await waitFor('the pod Ready', async () => ((await conds()).get('Ready')?.status === 'True' ? true : undefined), 30_000);
    await waitFor('the endpoint ready', async () => ((await gatedEndpoint())?.conditions?.ready === true ? true : undefined), 30_000);
    expect(await node.kubectlOk(['get', 'pod', 'gated', '-o', 'wide'])).toMatch(/\s1\/1\s*\n$/);
    // The gate's condition is kept through the agent's own status writes.
    await new Promise((r) => setTimeout(r, 2000));
    expect((await conds()).get('example.com/lb-ready')?.status).toBe('True');

    await node.kubectlOk(['patch', 'pod', 'gated', '--subresource=status', '--type=json', '-p', JSON.stringify([{ op: 'replace', path: '/status/conditions', value: [...(await conds()).values()].map((c) => (c.type === 'example.com/lb-ready' ? { ...c, status: 'False' } : c)) }])]);
    await waitFor('the pod not Ready again', async () => ((await conds()).get('Ready')?.status === 'False' ? true : undefined), 30_000);
    expect((await conds()).get('Ready')?.message).toBe('the status of pod readiness gate "example.com/lb-ready" is not "True", but False');
    await waitFor('the endpoint not ready again', async () => ((await gatedEndpoint())?.conditions?.ready === false ? true : undefined), 30_000);
    await node.kubectlOk(['delete', 'pod/gated', 'service/gated']);
  }, 120_000);

  it('has no endpoints once scaled to 0', async () => {
    await node.kubectlOk(['scale', 'deployment', 'echo', '--replicas', '0']);
    await waitFor('no endpoints left', async () => (await slices()).items.every((s) => (s.endpoints ?? []).length === 0), 60_000);
    expect((await slices()).items).toHaveLength(1); // the empty slice that says so
    // 1.27 reads the Endpoints (none: "<none>"); 1.31 and later read the slices, and the empty one
    // kube-controller-manager leaves formats as nothing at all, as against a real cluster.
    await waitFor('describe (1.27) to show <none>', async () => /Endpoints:\s+<none>\n/.test(await node.kubectlOk(['describe', 'service', 'echo'], { bin: KUBECTL_127 })), 30_000);
    expect(await node.kubectlOk(['describe', 'service', 'echo'])).toMatch(/\nEndpoints:[ \t]*\n/);
    expect(await node.kubectlOk(['get', 'endpointslices', '-l', 'kubernetes.io/service-name=echo'])).toMatch(/echo-\S+\s+IPv4\s+<unset>\s+<unset>\s/);
    const svc = await node.getJson<Service>(['service', 'echo']);
    const r = await node.kubectl(['exec', 'client', '--', 'timeout', '3', 'wget', '-q', '-O', '-', `http://${svc.spec!.clusterIP}/`]);
    expect(r.status).not.toBe(0);
  }, 120_000);

  it('keeps the kubernetes Service at the service CIDR\'s first address', async () => {
    const svc = await node.getJson<Service>(['service', 'kubernetes', '-n', 'default']);
    expect(svc.spec?.clusterIP).toBe('10.96.0.1');
    expect(svc.spec?.ports).toEqual([{ name: 'https', port: 443, protocol: 'TCP', targetPort: 6443 }]);
    expect(svc.metadata?.labels).toMatchObject({ component: 'apiserver', provider: 'kubernetes' });
    const slice = await node.getJson<{ metadata: { labels: Record<string, string> } }>(['endpointslice', 'kubernetes']);
    expect(slice.metadata.labels['kubernetes.io/service-name']).toBe('kubernetes');
    expect(await node.kubectlOk(['get', 'service', 'kubernetes'], { bin: KUBECTL_127 })).toMatch(/kubernetes\s+ClusterIP\s+10\.96\.0\.1\s+<none>\s+443\/TCP/);
  }, 60_000);
});

describe.skipIf(!isRoot)('a skiff node with --proxy-mode nftables', () => {
  const node = new SkiffNode(['--proxy-mode', 'nftables']);

  beforeAll(async () => {
    await node.create();
    await node.kubectlOk(['apply', '-f', '-'], { input: APP });
  }, 180_000);

  afterAll(async () => {
    expect(await node.destroy()).toEqual({ mounts: [], processes: [] });
  }, 120_000);

  it('programs its Services in the nftables table, and a pod reaches a replica by cluster IP and by name', async () => {
    const svc = await waitFor('echo to have a cluster IP', async () => {
      const s = await node.getJson<Service>(['service', 'echo']);
      return s.spec?.clusterIP ? s : undefined;
    }, 30_000);
    await waitFor('client running', async () => (await node.kubectl(['exec', 'client', '--', 'true'])).status === 0, 60_000);
    const names = (await node.getJson<{ items: Array<{ metadata: { name: string } }> }>(['pods', '-l', 'app=echo'])).items.map((p) => p.metadata.name);
    for (const target of [svc.spec!.clusterIP!, 'echo']) {
      const answer = await waitFor(`an answer through ${target}`, async () => {
        const r = await node.kubectl(['exec', 'client', '--', 'timeout', '3', 'wget', '-q', '-O', '-', `http://${target}/`]);
        return r.status === 0 ? r.stdout.trim() : undefined;
      }, 30_000);
      expect(names).toContain(answer);
    }
    // The rules are the nftables mode's: the table and its verdict map hold the Service; iptables has no KUBE-SERVICES.
    const nft = spawnSync('ip', ['netns', 'exec', node.ns.name, 'nft', 'list', 'map', 'ip', 'kube-proxy', 'service-ips'], { encoding: 'utf8' });
    expect(nft.status, nft.stderr).toBe(0);
    expect(nft.stdout).toContain(`${svc.spec!.clusterIP} . tcp . 80`);
    const ipt = spawnSync('ip', ['netns', 'exec', node.ns.name, 'iptables', '-t', 'nat', '-S', 'KUBE-SERVICES'], { encoding: 'utf8' });
    expect(ipt.status).not.toBe(0);
  }, 120_000);
});
