import { describe, it } from 'vitest';
import { spawnSync } from 'node:child_process';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const SERVE = 'trap "exit 0" TERM; echo server-pod > /www/index.html; httpd -f -p 8080 -h /www & wait';
const SLEEP = 'trap "exit 0" TERM; sleep 100000 & wait';
const pod = (name: string, ns: string, labels: string, command: string) => `apiVersion: v1
kind: Pod
metadata: {name: ${name}, namespace: ${ns}, labels: ${labels}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: main, image: skiff.local/demo-web:1, imagePullPolicy: Never, command: [sh, -c, '${command}']}
`;
const log = (...a: unknown[]) => console.log('ZZ', ...a);

describe('attack', () => {
  const node = new SkiffNode();
  useSkiffNode(node);
  const rss = () => { const pid = node.child?.pid; const r = spawnSync('ps', ['-o', 'rss=', '--ppid', String(pid), '-p', String(pid)], { encoding: 'utf8' }); return r.stdout.trim().replace(/\s+/g, ','); };
  const nft = () => spawnSync('ip', ['netns', 'exec', node.ns.name, 'nft', 'list', 'table', 'inet', 'skiff-netpol'], { encoding: 'utf8' });
  async function reach(from: string, ip: string, port = 8080): Promise<boolean> {
    const r = await node.kubectl(['exec', from, '--', 'timeout', '3', 'wget', '-q', '-O-', `http://${ip}:${port}/`], { timeoutMs: 20_000 });
    return r.status === 0 && r.stdout.includes('server-pod');
  }
  const step = async (name: string, f: () => Promise<void>) => { const t = Date.now(); try { await f(); } catch (e) { log(name, 'THREW', String(e).slice(0, 400)); } log(name, 'took', Date.now() - t, 'ms; rss', rss()); };
  const ip = async (p: string) => ((await node.getJson<{ status: { podIP: string } }>(['pod', p])).status.podIP);

  it('probes', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: [pod('server', 'default', '{app: server}', SERVE), pod('victim', 'default', '{app: victim}', SERVE), pod('client', 'default', '{role: client}', SLEEP)].join('---\n') });
    await node.kubectlOk(['wait', '--for=condition=Ready', 'pod/server', 'pod/victim', 'pod/client', '--timeout=120s'], { timeoutMs: 130_000 });
    const sip = await ip('server'); const vip = await ip('victim');
    log('baseline reach server', await reach('client', sip), 'victim', await reach('client', vip));

    await step('deny-server', async () => {
      await node.kubectlOk(['apply', '-f', '-'], { input: 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-server}\nspec: {podSelector: {matchLabels: {app: server}}, policyTypes: [Ingress]}\n' });
      await waitFor('deny', async () => !(await reach('client', sip)), 30_000).catch(() => log('deny never took'));
      log('after deny-server: server reachable', await reach('client', sip));
    });

    // 1. status podIP forgery
    await step('status-forge', async () => {
      const r = await node.kubectl(['patch', 'pod', 'server', '--subresource=status', '--type=merge', '-p', '{"status":{"podIP":"10.88.200.200","podIPs":[{"ip":"10.88.200.200"}]}}']);
      log('patch status', r.status, r.stdout.trim(), r.stderr.trim().slice(0, 200));
      await new Promise((res) => setTimeout(res, 2500));
      log('after forge: podIP', await ip('server'), 'server reachable', await reach('client', sip));
      log('nft has sip', nft().stdout.includes(sip));
    });

    // 2. long-name policy => comment too long?
    const long = 'a'.repeat(240);
    await step('long-name', async () => {
      const r = await node.kubectl(['apply', '-f', '-'], { input: `apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: ${long}}\nspec: {podSelector: {matchLabels: {nobody: x}}, ingress: [{}]}\n` });
      log('apply long', r.status, r.stderr.trim().slice(0, 200));
      await node.kubectlOk(['apply', '-f', '-'], { input: 'apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-victim}\nspec: {podSelector: {matchLabels: {app: victim}}, policyTypes: [Ingress]}\n' });
      await new Promise((res) => setTimeout(res, 4000));
      log('victim (deny-victim after long policy) reachable', await reach('client', vip));
      log('server still denied?', !(await reach('client', sip)));
      const ev = await node.kubectl(['get', 'events', '--field-selector', 'reason=FailedToApplyNetworkPolicy', '-o', 'custom-columns=M:.message', '--no-headers']);
      log('events', ev.stdout.split('\n').slice(0, 2).join(' | ').slice(0, 400));
      log('node log nft err', (node.log.match(/nft -f failed[^"]*/g) ?? []).slice(-1).join('').slice(0, 300));
      await node.kubectl(['delete', 'networkpolicy', long]);
      await waitFor('victim fenced', async () => !(await reach('client', vip)), 30_000).catch(() => log('victim never fenced after removing long'));
    });

    // 3. hostile policy sizes
    await step('10k-ports', async () => {
      const ports = Array.from({ length: 10000 }, (_, i) => ({ port: i + 1, protocol: 'TCP' }));
      const p = { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: 'many-ports' }, spec: { podSelector: { matchLabels: { app: 'server' } }, ingress: [{ ports }] } };
      const r = await node.kubectl(['apply', '-f', '-'], { input: JSON.stringify(p), timeoutMs: 120_000 });
      log('apply 10k ports', r.status, r.stderr.trim().slice(0, 200));
      await new Promise((res) => setTimeout(res, 5000));
      log('server reach port 8080 (allowed by 10k ports)', await reach('client', sip));
      const t = Date.now(); const g = await node.kubectl(['get', 'pods'], { timeoutMs: 30_000 }); log('get pods status', g.status, Date.now() - t, 'ms');
      log('nft lines', nft().stdout.split('\n').length);
      await node.kubectl(['delete', 'networkpolicy', 'many-ports']);
    });
    await step('100k-ports', async () => {
      const ports = Array.from({ length: 100000 }, (_, i) => ({ port: (i % 65535) + 1, protocol: 'UDP' }));
      const p = { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: 'huge-ports' }, spec: { podSelector: { matchLabels: { app: 'victim' } }, ingress: [{ ports }] } };
      const r = await node.kubectl(['apply', '--server-side', '-f', '-'], { input: JSON.stringify(p), timeoutMs: 120_000 });
      log('apply 100k ports', r.status, r.stderr.trim().slice(0, 200));
      await new Promise((res) => setTimeout(res, 8000));
      log('victim reachable (should be denied)', await reach('client', vip));
      log('node log nft err', (node.log.match(/nft -f failed[^"]*/g) ?? []).slice(-1).join('').slice(0, 300));
      await node.kubectl(['delete', 'networkpolicy', 'huge-ports'], { timeoutMs: 60_000 });
    });
    await step('except-10k', async () => {
      const except = Array.from({ length: 20000 }, (_, i) => `10.${100 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}/32`);
      const p = { apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: 'big-except' }, spec: { podSelector: { matchLabels: { app: 'server' } }, ingress: [{ from: [{ ipBlock: { cidr: '10.0.0.0/8', except } }] }] } };
      const r = await node.kubectl(['apply', '--server-side', '-f', '-'], { input: JSON.stringify(p), timeoutMs: 120_000 });
      log('apply 20k except', r.status, r.stderr.trim().slice(0, 200));
      await new Promise((res) => setTimeout(res, 8000));
      log('server reach (allowed by 10/8)', await reach('client', sip));
      log('node log nft err', (node.log.match(/nft -f failed[^"]*/g) ?? []).slice(-1).join('').slice(0, 300));
      await node.kubectl(['delete', 'networkpolicy', 'big-except'], { timeoutMs: 60_000 });
    });
    await step('1500-policies', async () => {
      const docs = Array.from({ length: 1500 }, (_, i) => ({ apiVersion: 'networking.k8s.io/v1', kind: 'NetworkPolicy', metadata: { name: `p${i}` }, spec: { podSelector: { matchLabels: { [`k${i}`]: 'v' } }, ingress: [{ from: [{ podSelector: { matchLabels: { [`f${i}`]: 'v' } } }], ports: [{ port: i + 1 }] }] } }));
      const r = await node.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: docs }), timeoutMs: 300_000 });
      log('apply 1500', r.status, r.stderr.trim().slice(0, 200));
      await new Promise((res) => setTimeout(res, 5000));
      log('server still denied', !(await reach('client', sip)));
      log('nft lines', nft().stdout.split('\n').length);
      await node.kubectl(['delete', 'networkpolicy', '-l', 'nothing!=x', '--field-selector', 'metadata.name!=deny-server,metadata.name!=deny-victim'], { timeoutMs: 300_000 });
    });
    // 4. RBAC odd
    await step('rbac', async () => {
      for (const name of ['..', '.', '%2F', 'a/b', 'x'.repeat(300)]) {
        const r = await node.kubectl(['create', 'role', name, '--verb=get', '--resource=pods']);
        log('role name', JSON.stringify(name.slice(0, 10)), r.status, (r.stdout + r.stderr).trim().slice(0, 160));
      }
      const g = await node.kubectl(['get', '--raw', '/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/%2E%2E']); log('get %2E%2E', g.status, (g.stdout + g.stderr).slice(0, 160));
      const g2 = await node.kubectl(['get', '--raw', '/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles/..%2F..%2Fsecrets']); log('get ..%2F', g2.status, (g2.stdout + g2.stderr).slice(0, 160));
      await node.kubectlOk(['create', 'role', 'r1', '--verb=get', '--resource=pods']);
      await node.kubectlOk(['create', 'role', 'r2', '--verb=get', '--resource=pods']);
      await node.kubectlOk(['create', 'rolebinding', 'b1', '--role=r1', '--user=u']);
      const rr = await node.kubectl(['patch', 'rolebinding', 'b1', '--type=merge', '-p', '{"roleRef":{"name":"r2"}}']); log('roleRef change', rr.status, (rr.stdout + rr.stderr).trim().slice(0, 200));
      const rules = Array.from({ length: 20000 }, (_, i) => ({ apiGroups: [''], resources: [`r${i}`], verbs: ['get'] }));
      const big = await node.kubectl(['apply', '--server-side', '-f', '-'], { input: JSON.stringify({ apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: { name: 'big' }, rules }), timeoutMs: 120_000 });
      log('20k-rule clusterrole', big.status, (big.stdout + big.stderr).trim().slice(0, 200));
      const agg = await node.kubectl(['apply', '-f', '-'], { input: JSON.stringify({ apiVersion: 'rbac.authorization.k8s.io/v1', kind: 'ClusterRole', metadata: { name: 'agg' }, aggregationRule: { clusterRoleSelectors: [{ matchExpressions: [{ key: 'x', operator: 'Bogus' }] }] } }) });
      log('bad aggregation', agg.status, (agg.stdout + agg.stderr).trim().slice(0, 200));
    });
    // 5. metrics
    await step('metrics', async () => {
      for (const sel of ['a in (', 'x'.repeat(100000) + '=y', Array.from({ length: 5000 }, (_, i) => `k${i}=v`).join(',')]) {
        const r = await node.kubectl(['get', '--raw', `/apis/metrics.k8s.io/v1beta1/pods?labelSelector=${encodeURIComponent(sel)}`], { timeoutMs: 30_000 });
        log('metrics sel', sel.length, r.status, (r.stdout + r.stderr).trim().slice(0, 160));
      }
      const t = await node.kubectl(['top', 'pods', '-A'], { timeoutMs: 30_000 }); log('top', t.status, (t.stdout + t.stderr).trim().slice(0, 300));
      const f = await node.kubectl(['get', '--raw', '/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/%2E%2E'], { timeoutMs: 30_000 }); log('metrics ..', f.status, (f.stdout + f.stderr).trim().slice(0, 160));
    });
    // 6. restart: IP reuse — delete victim, create new unselected pod, see if it gets victim's IP and is fenced/unfenced wrongly
    await step('ip-reuse', async () => {
      await node.kubectlOk(['delete', 'pod', 'victim', '--wait=true'], { timeoutMs: 60_000 });
      await node.kubectlOk(['apply', '-f', '-'], { input: pod('victim2', 'default', '{app: victim}', SERVE) });
      await node.kubectlOk(['wait', '--for=condition=Ready', 'pod/victim2', '--timeout=60s'], { timeoutMs: 70_000 });
      const v2 = await ip('victim2'); log('victim2 ip', v2, 'old', vip, 'reachable (should be no)', await reach('client', v2));
    });
    log('final rss', rss());
  }, 1_500_000);
});
