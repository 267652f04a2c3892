/**
 * kubelet-lite with the objects pods depend on (ConfigMaps, Secrets, shared
 * volumes) and with manifests that are wrong: every assertion through the
 * status API of a real `skiff kubelet` over a real `skiff cri`.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

const idOf = (p: Pod, c: string) => containerStatus(p, c)?.containerID?.replace(/^[a-z]+:\/\//, '') ?? '';

describe.skipIf(!isRoot)('kubelet-lite: ConfigMaps, Secrets, volumes and bad manifests', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/kubelet-manifests');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  async function exec(p: Pod, container: string, script: string): Promise<string> {
    const r = await node.pods.skiff.runtime.ExecSync({ containerId: idOf(p, container), cmd: ['sh', '-c', script], timeout: 10 });
    return Buffer.from(r.stdout ?? '').toString();
  }

  const configMap = (msg: string) => `apiVersion: v1
kind: ConfigMap
metadata:
  name: page
data:
  msg: ${msg}
`;

  it('updates a configMap volume in place when the ConfigMap changes, without restarting the container', async () => {
    await node.write('cm.yaml', configMap('one'));
    await node.write('cmpod.yaml', podYaml('cmpod', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
    volumeMounts: [{name: cfg, mountPath: /cfg}]
  volumes:
  - name: cfg
    configMap:
      name: page
`));
    const p = await node.waitPod('cmpod', ready, 'Ready');
    expect(await exec(p, 'c', 'cat /cfg/msg')).toBe('one');
    await node.write('cm.yaml', configMap('two'));
    await waitFor('the mounted file to say two', async () => ((await exec(p, 'c', 'cat /cfg/msg')) === 'two' ? true : undefined), 20_000);
    expect(containerStatus((await node.pod('cmpod'))!, 'c')?.restartCount).toBe(0);
  });

  it('gives a container a Secret as env, and two containers one emptyDir', async () => {
    await node.write('secret.yaml', `apiVersion: v1
kind: Secret
metadata:
  name: creds
data:
  password: ${Buffer.from('s3cr3t').toString('base64')}
---
${podYaml('two', node.image, `  containers:
  - name: writer
    image: IMAGE
    command: [sh, -c, "echo \\"$PASS\\" > /data/x; exec sleep 3600"]
    env:
    - name: PASS
      valueFrom:
        secretKeyRef: {name: creds, key: password}
    volumeMounts: [{name: data, mountPath: /data}]
  - name: reader
    image: IMAGE
    command: [sleep, "3600"]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    emptyDir: {}
`)}`);
    const p = await node.waitPod('two', ready, 'Ready');
    expect(await exec(p, 'writer', 'echo $PASS')).toBe('s3cr3t\n');
    await waitFor('the reader to see the writer\'s file', async () => ((await exec(p, 'reader', 'cat /data/x 2>/dev/null')) === 's3cr3t\n' ? true : undefined));
  });

  it('shows a missing Secret key as CreateContainerConfigError, and starts once it exists', async () => {
    await node.write('needs.yaml', podYaml('needs', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
    env:
    - name: TOKEN
      valueFrom:
        secretKeyRef: {name: later, key: token}
`));
    const waiting = await node.waitPod('needs', (x) => containerStatus(x, 'c')?.state?.waiting?.reason === 'CreateContainerConfigError', 'CreateContainerConfigError');
    expect(containerStatus(waiting, 'c')?.state?.waiting?.message).toMatch(/later/);
    await node.write('later.yaml', `apiVersion: v1
kind: Secret
metadata: {name: later}
stringData: {token: abc}
`);
    const p = await node.waitPod('needs', ready, 'Ready once the Secret exists', 30_000);
    expect(await exec(p, 'c', 'echo $TOKEN')).toBe('abc\n');
  });

  it('reports a manifest that does not parse with its file and line, and runs the good one beside it', async () => {
    await node.write('bad.yaml', 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: broken\n spec: [\n');
    await node.write('good.yaml', podYaml('good', node.image, `  containers:
  - name: c
    image: IMAGE
    command: [sleep, "3600"]
`));
    await node.waitPod('good', ready, 'Ready');
    const problems = await waitFor('the bad manifest to be reported', async () => {
      const r = await node.get<Array<{ file: string; line: number; reason: string }>>('/manifests');
      const list = Array.isArray(r.body) ? r.body : ((r.body as unknown as { items?: Array<{ file: string; line: number; reason: string }> }).items ?? []);
      return list.some((x) => x.file.endsWith('bad.yaml')) ? list : undefined;
    });
    const bad = problems.find((x) => x.file.endsWith('bad.yaml'))!;
    expect(bad.line).toBeGreaterThan(0);
    expect(bad.reason.length).toBeGreaterThan(0);
  });

  it('shows invalid pods with a clear reason in their status and never runs them', async () => {
    await node.write('invalid.yaml', `apiVersion: v1
kind: Pod
metadata: {name: wrongtypes}
spec:
  containers: "not a list"
---
apiVersion: v1
kind: Pod
metadata: {name: noimage}
spec:
  containers:
  - name: c
---
apiVersion: v1
kind: Pod
metadata: {name: badport}
spec:
  containers:
  - name: c
    image: busybox
    ports: [{containerPort: "eighty"}]
`);
    const wrong = await node.waitPod('wrongtypes', (x) => x.status?.reason === 'InvalidManifest', 'reported invalid');
    expect(wrong.status?.phase).toBe('Failed');
    expect(wrong.status?.message).toMatch(/invalid\.yaml:\d+: .*spec\.containers/);
    const noimage = await node.waitPod('noimage', (x) => x.status?.reason === 'InvalidManifest', 'reported invalid');
    expect(noimage.status?.message).toMatch(/spec\.containers\[0\]\.image: Required value/);
    const badport = await node.waitPod('badport', (x) => x.status?.reason === 'InvalidManifest', 'reported invalid');
    expect(badport.status?.message).toMatch(/invalid\.yaml:\d+: spec\.containers\[0\]\.ports\[0\]\.containerPort: Invalid type/);
    const sbs = await node.pods.skiff.runtime.ListPodSandbox({ filter: { labelSelector: { 'io.kubernetes.pod.name': 'noimage' } } });
    expect(sbs.items ?? []).toEqual([]);
    expect((await node.get('/healthz')).status).toBe(200);
  });

  it('shows ErrImagePull, then ImagePullBackOff, for an image the registry does not have', async () => {
    await node.write('missing.yaml', podYaml('missing', `${inject('registryHost')}/test/does-not-exist:v9`, `  containers:
  - name: c
    image: IMAGE
`));
    await node.waitPod('missing', (x) => containerStatus(x, 'c')?.state?.waiting?.reason === 'ErrImagePull', 'ErrImagePull');
    const p = await node.waitPod('missing', (x) => containerStatus(x, 'c')?.state?.waiting?.reason === 'ImagePullBackOff', 'ImagePullBackOff', 30_000);
    expect(p.status?.phase).toBe('Pending');
    const failed = (await node.events('missing')).filter((e) => e.reason === 'Failed');
    expect(failed[0]?.message).toMatch(/Failed to pull image/);
  });

  it('serves metrics with the pod start latency and running pods', async () => {
    const r = await node.get<string>('/metrics');
    expect(r.status).toBe(200);
    expect(r.body).toMatch(/kubelet_pod_start_duration_seconds_count \d+/);
    expect(r.body).toMatch(/kubelet_running_pods \d+/);
  });
});
