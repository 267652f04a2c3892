/**
 * The node's API driving a real `skiff node` with real kubectl: what a
 * client writes runs, the agent's view comes back as status, an edit is
 * an edit (no restart), a deletion is graceful, and objects written
 * through the API and their pods survive a kill -9 of the node.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { repoRoot } from '../helpers/daemon.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const APP = `
apiVersion: v1
kind: ConfigMap
metadata: {name: greeting}
data: {message: hello from the API}
---
apiVersion: v1
kind: Pod
metadata:
  name: api-web
  labels: {app: api-web}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: web
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "sleep 2; exit 0" TERM; echo "$MESSAGE"; while true; do sleep 1 & wait $!; done']
    env:
    - name: MESSAGE
      valueFrom: {configMapKeyRef: {name: greeting, key: message}}
`;

const FILE_POD = `
apiVersion: v1
kind: Pod
metadata: {name: from-file}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: sleeper
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, 'trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
`;

const running = (p: Pod) => p.status?.phase === 'Running' && (p.status.containerStatuses ?? []).every((c) => c.state?.running);

describe.skipIf(!isRoot)('the node API over a real skiff node, with real kubectl', () => {
  const node = new SkiffNode();
  const pod = (name: string) => node.getJson<Pod>(['pod', name]);

  useSkiffNode(node);

  it('runs a Pod created with kubectl apply, with its ConfigMap, and writes its status back', async () => {
    const out = await node.kubectlOk(['apply', '-f', '-'], { input: APP });
    expect(out).toContain('pod/api-web created');
    const p = await waitFor('api-web running', async () => {
      const p = await pod('api-web');
      return running(p) ? p : undefined;
    }, 60_000);
    expect(p.spec?.nodeName).toBe(node.nodeName);
    expect(p.status?.podIP).toMatch(/^\d+\.\d+\.\d+\.\d+$/);
    expect(p.status?.conditions?.find((c) => c.type === 'Ready')?.status).toBe('True');
    const wide = await node.kubectlOk(['get', 'pods', '-o', 'wide']);
    expect(wide).toMatch(new RegExp(`api-web\\s+1/1\\s+Running\\s+0\\s+\\S+\\s+${p.status!.podIP!.replace(/\./g, '\\.')}\\s+${node.nodeName}`));
    // The oldest kubectl the machine ships reads the same table.
    expect(await node.kubectlOk(['get', 'pods'], { bin: KUBECTL_127 })).toMatch(/api-web\s+1\/1\s+Running/);
    // The container got the ConfigMap's value: the agent read the API's ConfigMap.
    const logs = await waitFor('the container\'s first line', async () => {
      const r = spawnSync('nsenter', [`--net=${node.ns.path}`, 'timeout', '5', '/bin/busybox', 'wget', '-q', '-O', '-', 'http://127.0.0.1:10255/containerLogs/default/api-web/web'], { encoding: 'utf8' });
      return r.stdout.includes('hello') ? r.stdout : undefined;
    }, 20_000);
    expect(logs).toContain('hello from the API');
    // The agent's events are the API's: describe shows them, a field selector finds them.
    const described = await node.kubectlOk(['describe', 'pod', 'api-web']);
    expect(described).toMatch(/Normal\s+Started\s+\S+\s+kubelet\s+.*Started container web/);
    const events = await node.kubectlOk(['get', 'events', '--field-selector', 'involvedObject.name=api-web,reason=Created']);
    expect(events).toMatch(/Created\s+pod\/api-web\s+Created container web/);
  });

  it('registers its Node (Ready, capacity, nodeInfo, the pods on it) and renews its Lease', async () => {
    const nodes = await node.kubectlOk(['get', 'nodes', '-o', 'wide']);
    expect(nodes).toMatch(new RegExp(`${node.nodeName}\\s+Ready\\s+<none>\\s+\\S+\\s+v1\\.35\\.0-skiff\\S*\\s+192\\.0\\.2\\.10\\s+<none>\\s+.+skiff://`));
    const described = await node.kubectlOk(['describe', 'node', node.nodeName]);
    expect(described).toMatch(/Ready\s+True\s+.*KubeletReady\s+kubelet is posting ready status/);
    expect(described).toMatch(/pods:\s+110/);
    expect(described).toMatch(/Non-terminated Pods:\s+\(1 in total\)/);
    expect(described).toMatch(/default\s+api-web\s+/);
    const n = await node.getJson<{ metadata: { labels: Record<string, string> }; status: { capacity: Record<string, string>; nodeInfo: Record<string, string> } }>(['node', node.nodeName]);
    expect(n.metadata.labels).toMatchObject({ 'kubernetes.io/hostname': node.nodeName, 'kubernetes.io/os': 'linux' });
    expect(Number(n.status.capacity.cpu)).toBeGreaterThan(0);
    expect(n.status.nodeInfo.containerRuntimeVersion).toMatch(/^skiff:\/\//);
    const renewed = async () => (await node.getJson<{ spec: { renewTime: string; holderIdentity: string } }>(['lease', '-n', 'kube-node-lease', node.nodeName])).spec;
    const first = await renewed();
    expect(first.holderIdentity).toBe(node.nodeName);
    await waitFor('the lease renewed', async () => (await renewed()).renewTime !== first.renewTime, 25_000);
  }, 40_000);

  it('takes a label edit without restarting the pod, and refuses a spec edit as the API server does', async () => {
    const before = await pod('api-web');
    await node.kubectlOk(['label', 'pod', 'api-web', 'tier=front']);
    await new Promise((r) => setTimeout(r, 3000));
    const after = await pod('api-web');
    expect(after.metadata?.labels).toMatchObject({ app: 'api-web', tier: 'front' });
    expect(after.metadata?.uid).toBe(before.metadata?.uid);
    expect(after.status?.containerStatuses?.[0]?.containerID).toBe(before.status?.containerStatuses?.[0]?.containerID);
    expect(after.status?.containerStatuses?.[0]?.restartCount).toBe(0);
    const r = await node.kubectl(['patch', 'pod', 'api-web', '--type', 'merge', '-p', '{"spec":{"restartPolicy":"Never"}}']);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('pod updates may not change fields other than');
  });

  it('shows a manifest file\'s pod with its status, and refuses to delete it through the API, naming the file', async () => {
    const file = path.join(node.dirs.manifests, 'from-file.yaml');
    await fs.writeFile(file, FILE_POD);
    await waitFor('from-file running in the API', async () => running(await pod('from-file').catch(() => ({}) as Pod)), 60_000);
    const r = await node.kubectl(['delete', 'pod', 'from-file', '--wait=false']);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain(`pods "from-file" is defined by the manifest file ${file}: change or remove it there`);
  });

  it('keeps the API\'s objects and adopts their pods across a kill -9 of the node', async () => {
    const before = await pod('api-web');
    expect(await node.stopProcess('SIGKILL')).toBe('SIGKILL');
    await node.start();
    const after = await waitFor('api-web running after the restart', async () => {
      const p = await pod('api-web');
      return running(p) ? p : undefined;
    }, 60_000);
    expect(after.metadata?.uid).toBe(before.metadata?.uid);
    expect(after.metadata?.labels?.tier).toBe('front');
    // Adopted, not restarted: the same container, no restart counted.
    expect(after.status?.containerStatuses?.[0]?.containerID).toBe(before.status?.containerStatuses?.[0]?.containerID);
    expect(after.status?.containerStatuses?.[0]?.restartCount).toBe(0);
    expect((await node.getJson<{ data: Record<string, string> }>(['configmap', 'greeting'])).data.message).toBe('hello from the API');
  }, 120_000);

  it('runs the demo applied with kubectl: the Deployment\'s replicas, the Service with its cluster IP and node port, the Job to completion', async () => {
    const out = await node.kubectlOk(['apply', '-f', path.join(repoRoot, 'examples', 'demo')]);
    expect(out).toContain('deployment.apps/web created');
    await node.kubectlOk(['rollout', 'status', 'deployment/web', '--timeout=90s'], { timeoutMs: 100_000 });
    const web = await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web']);
    expect(web.items).toHaveLength(3);
    for (const p of web.items) {
      expect(running(p)).toBe(true);
      expect(p.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'ReplicaSet', controller: true });
    }
    await waitFor('the Service\'s cluster IP in the API', async () => (await node.getJson<{ spec: { clusterIP?: string } }>(['service', 'web'])).spec.clusterIP, 20_000);
    const allocated = await node.getJson<{ spec: { clusterIP: string; ports: Array<{ nodePort: number }> } }>(['service', 'web']);
    expect(allocated.spec.clusterIP).toMatch(/^10\./);
    expect(allocated.spec.ports[0]!.nodePort).toBe(30080);
    expect(await node.kubectlOk(['get', 'svc', 'web'])).toMatch(new RegExp(`web\\s+NodePort\\s+${allocated.spec.clusterIP.replace(/\./g, '\\.')}\\s+<none>\\s+80:30080/TCP`));
    await node.kubectlOk(['wait', '--for=condition=complete', 'job/hello', '--timeout=90s'], { timeoutMs: 100_000 });
    const deploy = await node.kubectlOk(['get', 'deploy', 'web']);
    expect(deploy).toMatch(/web\s+3\/3\s+3\s+3\s+/);
  }, 200_000);

  it('scales and restarts the Deployment through kubectl, and rollout status follows it with kubectl 1.35 and 1.27', async () => {
    await node.kubectlOk(['scale', 'deployment', 'web', '--replicas', '4']);
    await node.kubectlOk(['rollout', 'status', 'deployment/web', '--timeout=90s'], { timeoutMs: 100_000 });
    expect((await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web'])).items.filter(running)).toHaveLength(4);
    const before = new Set((await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web'])).items.map((p) => p.metadata!.name!));
    await node.kubectlOk(['rollout', 'restart', 'deployment/web']);
    await node.kubectlOk(['rollout', 'status', 'deployment/web', '--timeout=120s'], { bin: KUBECTL_127, timeoutMs: 130_000 });
    const after = await waitFor('only new replicas left', async () => {
      const ps = (await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web'])).items;
      return ps.length === 4 && ps.every((p) => !before.has(p.metadata!.name!) && running(p)) ? ps : undefined;
    }, 60_000);
    expect(after).toHaveLength(4);
    // Deleting a controller's pod through the API stops it, and its Deployment replaces it.
    const victim = after[0]!.metadata!.name!;
    const dry = await node.kubectl(['delete', 'pod', victim, '--dry-run=server']);
    expect(dry.status, dry.stderr).toBe(0);
    await node.kubectlOk(['delete', 'pod', victim], { timeoutMs: 60_000 });
    expect((await node.kubectl(['get', 'pod', victim])).stderr).toContain(`pods "${victim}" not found`);
    await waitFor('4 running replicas again, without the deleted one', async () => {
      const ps = (await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web'])).items;
      return ps.length === 4 && ps.every((p) => p.metadata!.name !== victim && running(p));
    }, 60_000);
    // A file's pod stays refused (the file defines it), with the file named: see the test above.
    // Deleting the Deployment takes its pods with it.
    await node.kubectlOk(['delete', '-f', path.join(repoRoot, 'examples', 'demo')]);
    await waitFor('the web pods gone', async () => (await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=web'])).items.length === 0, 60_000);
  }, 300_000);

  it('deletes a pod gracefully: Terminating while the agent stops it, then gone, its sandbox with it', async () => {
    const uid = (await pod('api-web')).metadata!.uid!;
    const deleting = node.kubectl(['delete', 'pod', 'api-web']);
    const marked = await waitFor('api-web marked for deletion', async () => {
      const p = await pod('api-web').catch(() => undefined);
      return p?.metadata?.deletionTimestamp ? p : undefined;
    }, 20_000);
    expect(marked.metadata?.deletionGracePeriodSeconds).toBe(3);
    const r = await deleting;
    expect(r.status, r.stderr).toBe(0);
    const gone = await node.kubectl(['get', 'pod', 'api-web']);
    expect(gone.status).not.toBe(0);
    expect(gone.stderr).toContain('pods "api-web" not found');
    // The agent has let go of it: its pod directory is gone.
    await waitFor('the sandbox removed', async () => !(await fs.readdir(path.join(node.dirs.kubelet, 'pods')).catch(() => [] as string[])).includes(uid), 30_000);
  }, 90_000);
});
