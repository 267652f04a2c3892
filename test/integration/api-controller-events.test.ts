/**
 * The controllers' and the scheduler's events on a real `skiff node`, as
 * kubectl describe shows them from a cluster: ScalingReplicaSet on a
 * Deployment, SuccessfulCreate/SuccessfulDelete on its ReplicaSet,
 * Completed on a Job, Scheduled on a Pod.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const deployment = `
apiVersion: apps/v1
kind: Deployment
metadata: {name: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: shop}}
  template:
    metadata: {labels: {app: shop}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - {name: web, image: skiff.local/demo-web:1, imagePullPolicy: Never}
---
apiVersion: batch/v1
kind: Job
metadata: {name: once}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: job, image: skiff.local/demo-client:1, imagePullPolicy: Never, command: [sh, -c, 'echo done']}
`;

interface Ev { reason: string; message: string; type: string; count: number; source: { component: string }; involvedObject: { kind: string; name: string } }

describe.skipIf(!isRoot)('controller events on a real node, with real kubectl', () => {
  const node = new SkiffNode();
  const events = async (selector: string) => (await node.getJson<{ items: Ev[] }>(['events', '--field-selector', selector])).items;

  useSkiffNode(node);

  it('writes ScalingReplicaSet, SuccessfulCreate, SuccessfulDelete, Completed and Scheduled as upstream controllers do', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: deployment });
    await node.kubectlOk(['rollout', 'status', 'deployment/shop', '--timeout=90s'], { timeoutMs: 100_000 });
    const rs = (await node.kubectlOk(['get', 'rs', '-l', 'app=shop', '-o', 'jsonpath={.items[0].metadata.name}'])).trim();
    await node.kubectlOk(['scale', 'deployment/shop', '--replicas=1']);
    await waitFor('the scale-down event', async () => (await events('involvedObject.kind=Deployment,involvedObject.name=shop')).some((e) => e.message.includes('from 2 to 1')) || undefined, 30_000);

    const onDeployment = await events('involvedObject.kind=Deployment,involvedObject.name=shop');
    expect(onDeployment.map((e) => [e.reason, e.message, e.source.component])).toEqual([
      ['ScalingReplicaSet', `Scaled up replica set ${rs} from 0 to 2`, 'deployment-controller'],
      ['ScalingReplicaSet', `Scaled down replica set ${rs} from 2 to 1`, 'deployment-controller'],
    ]);
    await waitFor('the ReplicaSet\'s delete event', async () => (await events(`involvedObject.kind=ReplicaSet,involvedObject.name=${rs}`)).some((e) => e.reason === 'SuccessfulDelete') || undefined, 30_000);
    const onRs = await events(`involvedObject.kind=ReplicaSet,involvedObject.name=${rs}`);
    expect(onRs.filter((e) => e.reason === 'SuccessfulCreate').map((e) => e.message)).toEqual([expect.stringMatching(new RegExp(`^Created pod: ${rs}-`)), expect.stringMatching(new RegExp(`^Created pod: ${rs}-`))]);
    expect(onRs.filter((e) => e.reason === 'SuccessfulDelete')).toHaveLength(1);

    for (const bin of [undefined, KUBECTL_127]) {
      const described = await node.kubectlOk(['describe', 'deployment', 'shop'], { bin });
      expect(described).toMatch(new RegExp(`Normal\\s+ScalingReplicaSet\\s+\\S+\\s+deployment-controller\\s+Scaled up replica set ${rs} from 0 to 2`));
    }

    await node.kubectlOk(['wait', '--for=condition=complete', 'job/once', '--timeout=60s'], { timeoutMs: 70_000 });
    await waitFor('the Completed event', async () => (await events('involvedObject.kind=Job,involvedObject.name=once')).some((e) => e.reason === 'Completed') || undefined, 30_000);
    expect(await node.kubectlOk(['describe', 'job', 'once'])).toMatch(/Normal\s+SuccessfulCreate\s+\S+\s+job-controller\s+Created pod: once-\S+\n\s+Normal\s+Completed\s+\S+\s+job-controller\s+Job completed/);

    const pod = (await node.getJson<{ items: Array<{ metadata: { name: string; deletionTimestamp?: string } }> }>(['pods', '-l', 'app=shop'])).items.find((p) => !p.metadata.deletionTimestamp)!.metadata.name;
    await waitFor('the Scheduled event', async () => (await events(`involvedObject.name=${pod}`)).some((e) => e.reason === 'Scheduled') || undefined, 30_000);
    const described = await node.kubectlOk(['describe', 'pod', pod]);
    // First, as the scheduler's comes before the kubelet's.
    expect(described).toMatch(new RegExp(`Events:[\\s\\S]*?\\n\\s+Normal\\s+Scheduled\\s+\\S+\\s+default-scheduler\\s+Successfully assigned default/${pod} to ${node.nodeName}\\n`));
  }, 240_000);

  it('names each manifest document the node skips, or cannot load, in a Warning event on it', async () => {
    const file = path.join(node.dirs.manifests, 'skipped.yaml');
    await fs.writeFile(`${file}.tmp`, `apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: reader}
spec: {scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: web}, maxReplicas: 3}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: front, namespace: default}
spec: {defaultBackend: {service: {name: web, port: {number: 80}}}}
---
apiVersion: v1
kind: Pod
metadata: {name: empty}
spec: {containers: []}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: Not_A_Name}
`);
    await fs.rename(`${file}.tmp`, file);
    const got = await waitFor('the problems as events', async () => {
      const items = (await events('type=Warning')).filter((e) => e.message.includes('skipped.yaml'));
      return items.length >= 4 ? items : undefined;
    }, 30_000);
    const by = (kind: string) => got.find((e) => e.involvedObject.kind === kind);
    expect(by('HorizontalPodAutoscaler')).toMatchObject({ reason: 'Skipped', involvedObject: { name: 'reader' } });
    expect(by('HorizontalPodAutoscaler')!.message).toMatch(/^skipped: HorizontalPodAutoscaler — no autoscaler runs on this node \(nor a metrics server\) \(.*skipped\.yaml, line 1\)$/);
    expect(by('Ingress')).toMatchObject({ reason: 'Skipped', involvedObject: { name: 'front' } });
    expect(by('Pod')).toMatchObject({ reason: 'FailedToLoad', involvedObject: { name: 'empty' } });
    // One the agent took but the API refuses is named too.
    expect(by('ConfigMap')).toMatchObject({ reason: 'FailedToLoad', involvedObject: { name: 'Not_A_Name' } });
    expect(by('ConfigMap')!.message).toMatch(/metadata\.name: Invalid value: "Not_A_Name".*skipped\.yaml/);
    // kubectl get events lists them where a user looks, once each.
    const table = await node.kubectlOk(['get', 'events', '--field-selector', 'reason=Skipped']);
    expect(table).toMatch(/Warning\s+Skipped\s+horizontalpodautoscaler\/reader\s+skipped: HorizontalPodAutoscaler/);
    await new Promise((r) => setTimeout(r, 1_500));
    expect((await events('reason=Skipped')).filter((e) => e.message.includes('skipped.yaml')).every((e) => e.count === 1)).toBe(true);
    await fs.rm(file);
  }, 60_000);
});
