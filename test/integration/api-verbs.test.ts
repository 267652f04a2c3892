/**
 * The kubectl verbs issue 23 lists, each run with kubectl 1.35 and with the
 * oldest kubectl the node image ships (1.27), against a real `skiff node`:
 * what each prints and what it leaves in the node, as a user of a cluster
 * would see it. 1.35's typed `create` and `run` send protobuf bodies.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_127, KUBECTL_135, SkiffNode } from '../helpers/skiff-node.js';

const WEB = 'skiff.local/demo-web:1';
const CLIENT = 'skiff.local/demo-client:1';
const versions = [
  { name: '1.35', bin: KUBECTL_135 },
  { name: '1.27', bin: KUBECTL_127 },
];
/** A container command that ends at once on SIGTERM (sh as PID 1 would otherwise ignore it for the whole grace period). */
const idle = (first: string) => `trap "exit 0" TERM; echo "${first}"; while true; do sleep 1 & wait $!; done`;

describe.skipIf(!isRoot)('kubectl verbs against a real skiff node', () => {
  const node = new SkiffNode();
  let tmp: string;
  const pod = (name: string) => node.getJson<Pod>(['pod', name]);
  const kubectl = (args: string[], bin = KUBECTL_135, opts: { input?: string; env?: Record<string, string> } = {}) => node.kubectl(args, { bin, ...opts });

  beforeAll(async () => {
    tmp = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-verbs-'));
    await node.create();
    await node.kubectlOk(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name: 'two', labels: { app: 'two' } },
        spec: {
          terminationGracePeriodSeconds: 2,
          containers: [
            { name: 'a', image: CLIENT, imagePullPolicy: 'Never', command: ['sh', '-c', 'trap "exit 0" TERM; i=0; while true; do i=$((i+1)); echo "a line $i"; sleep 1 & wait $!; done'] },
            { name: 'b', image: CLIENT, imagePullPolicy: 'Never', command: ['sh', '-c', idle('b started')] },
          ],
        },
      }),
    });
  }, 180_000);

  afterAll(async () => {
    expect(await node.destroy()).toEqual({ mounts: [], processes: [] });
    if (tmp) await fs.rm(tmp, { recursive: true, force: true });
  }, 120_000);

  it('creates typed objects from kubectl 1.35 protobuf bodies (create deployment|job|cronjob|service, run), and they run', async () => {
    expect(await node.kubectlOk(['create', 'deployment', 'web', `--image=${WEB}`, '--replicas=2', '--port=8080'])).toContain('deployment.apps/web created');
    expect(await node.kubectlOk(['create', 'deployment', 'none', `--image=${WEB}`, '--replicas=0'])).toContain('created');
    expect(await node.kubectlOk(['create', 'service', 'clusterip', 'web', '--tcp=80:8080'])).toContain('service/web created');
    expect(await node.kubectlOk(['create', 'job', 'hello', `--image=${CLIENT}`, '--', 'sh', '-c', 'echo job ran'])).toContain('job.batch/hello created');
    expect(await node.kubectlOk(['create', 'cronjob', 'tick', `--image=${CLIENT}`, '--schedule=*/5 * * * *', '--', 'echo', 'tick'])).toContain('cronjob.batch/tick created');
    expect(await node.kubectlOk(['run', 'solo', `--image=${WEB}`, '--image-pull-policy=Never', '--labels=app=solo,tier=one', '--env=GREETING=hi', '--command', '--', 'sh', '-c', idle('solo up')])).toContain('pod/solo created');
    // The oldest kubectl sends JSON for the same commands.
    expect(await node.kubectlOk(['create', 'deployment', 'old', `--image=${WEB}`], { bin: KUBECTL_127 })).toContain('deployment.apps/old created');

    const d = await node.getJson<{ spec: { replicas: number; template: { spec: { containers: Array<{ image: string; ports: unknown[] }> } } } }>(['deployment', 'web']);
    expect(d.spec.replicas).toBe(2);
    expect(d.spec.template.spec.containers[0]).toMatchObject({ image: WEB, ports: [{ containerPort: 8080, protocol: 'TCP' }] });
    // replicas: 0 is not the default 1: a zero the wire carries is kept where Go has a pointer.
    expect((await node.getJson<{ spec: { replicas: number } }>(['deployment', 'none'])).spec.replicas).toBe(0);
    expect((await node.getJson<{ spec: unknown }>(['service', 'web'])).spec).toMatchObject({ type: 'ClusterIP', selector: { app: 'web' }, ports: [{ port: 80, targetPort: 8080, protocol: 'TCP' }] });
    expect((await node.getJson<{ spec: unknown }>(['cronjob', 'tick'])).spec).toMatchObject({ schedule: '*/5 * * * *', jobTemplate: { spec: { template: { spec: { containers: [{ name: 'tick', command: ['echo', 'tick'] }] } } } } });
    expect((await pod('solo')).spec?.containers[0]).toMatchObject({ image: WEB, env: [{ name: 'GREETING', value: 'hi' }], command: ['sh', '-c', idle('solo up')] });

    await node.kubectlOk(['rollout', 'status', 'deployment/web', '--timeout=90s'], { timeoutMs: 100_000 });
    await node.kubectlOk(['wait', '--for=condition=complete', 'job/hello', '--timeout=60s'], { timeoutMs: 70_000 });
    expect(await node.kubectlOk(['logs', 'job/hello'])).toBe('job ran\n');
  }, 200_000);

  it('answers cluster-info and auth whoami with the admin credential', async () => {
    for (const v of versions) {
      expect(await node.kubectlOk(['cluster-info'], { bin: v.bin }), v.name).toMatch(/Kubernetes control plane.* is running at .*https:\/\/127\.0\.0\.1:6443/);
      const who = await kubectl(['auth', 'whoami'], v.bin);
      expect(who.stderr, v.name).toBe('');
      expect(who.stdout, v.name).toMatch(/Username\s+skiff-admin\n\s*Groups\s+\[system:masters system:authenticated\]/);
    }
    const review = JSON.parse(await node.kubectlOk(['auth', 'whoami', '-o', 'json'])) as { apiVersion: string; status: { userInfo: { username: string } } };
    expect(review.apiVersion).toBe('authentication.k8s.io/v1');
    expect(review.status.userInfo.username).toBe('skiff-admin');
    expect(await node.kubectlOk(['api-resources', '--api-group=authentication.k8s.io'])).toMatch(/selfsubjectreviews\s+authentication\.k8s\.io\/v1\s+false\s+SelfSubjectReview/);
  });

  it('answers auth can-i as for system:masters: yes, and every rule', async () => {
    for (const v of versions) {
      expect(await node.kubectlOk(['auth', 'can-i', 'create', 'pods'], { bin: v.bin }), v.name).toBe('yes\n');
      expect(await node.kubectlOk(['auth', 'can-i', 'delete', 'nodes', '--all-namespaces'], { bin: v.bin }), v.name).toBe('yes\n');
      expect(await node.kubectlOk(['auth', 'can-i', '--list'], { bin: v.bin }), v.name).toMatch(/^Resources\s+Non-Resource URLs\s+Resource Names\s+Verbs\n\*\.\*\s+\[\]\s+\[\]\s+\[\*\]\n\s+\[\*\]\s+\[\]\s+\[\*\]\n$/);
    }
  });

  it('kubectl run --rm -i prints the command\'s output and removes its pod; kubectl debug says ephemeral containers are not served', async () => {
    for (const v of versions) {
      const out = await node.kubectlOk(['run', `once-${v.name.replace('.', '')}`, '--image=skiff.local/demo-web:1', '--restart=Never', '--rm', '-i', '--command', '--', 'echo', 'from-run'], { bin: v.bin, timeoutMs: 90_000 });
      expect(out, v.name).toMatch(/^from-run\npod "once-\d+" deleted/);
    }
    const debug = await kubectl(['debug', 'two', '--image=skiff.local/demo-web:1', '--profile=general', '--', 'true']);
    expect(debug.status).not.toBe(0);
    expect(debug.stderr).toContain('ephemeral containers are disabled for this cluster');
  });

  it('runs the waits, logs and execs users type', async () => {
    for (const v of versions) {
      expect(await node.kubectlOk(['wait', '--for=condition=Ready', 'pod/two', '--timeout=60s'], { bin: v.bin, timeoutMs: 70_000 }), v.name).toContain('pod/two condition met');
    }
    await waitFor('three lines from container a', async () => (await node.kubectlOk(['logs', 'two', '-c', 'a'])).includes('a line 3'), 20_000);
    for (const v of versions) {
      expect(await node.kubectlOk(['logs', 'two', '-c', 'b'], { bin: v.bin }), v.name).toBe('b started\n');
      expect(await node.kubectlOk(['logs', 'two', '-c', 'a', '--tail=2'], { bin: v.bin }), v.name).toMatch(/^a line (\d+)\na line \d+\n$/);
      expect(await node.kubectlOk(['logs', 'deploy/web', '--tail=1'], { bin: v.bin }), v.name).toBe('');
      // exec -i: stdin reaches the process, its exit code is kubectl's.
      const r = await kubectl(['exec', '-i', 'two', '-c', 'b', '--', 'sh', '-c', 'tr a-z A-Z; exit 7'], v.bin, { input: 'hello stdin\n' });
      expect([r.status, r.stdout], v.name).toEqual([7, 'HELLO STDIN\n']);
      expect(r.stderr, v.name).toContain('command terminated with exit code 7');
      expect((await kubectl(['exec', 'two', '-c', 'b', '--', 'true'], v.bin)).status, v.name).toBe(0);
      expect((await kubectl(['exec', '-i', 'two', '-c', 'b', '--', 'wc', '-c'], v.bin, { input: 'abc' })).stdout.trim(), v.name).toBe('3');
    }
    // logs deploy/NAME picks one of the Deployment's pods.
    await node.kubectlOk(['create', 'deployment', 'talker', `--image=${CLIENT}`, '--', 'sh', '-c', idle('hello from talker')]);
    await node.kubectlOk(['rollout', 'status', 'deployment/talker', '--timeout=60s'], { timeoutMs: 70_000 });
    for (const v of versions) {
      expect(await waitFor(`logs deploy/talker (${v.name})`, async () => {
        const r = await kubectl(['logs', 'deploy/talker'], v.bin);
        return r.status === 0 && r.stdout === 'hello from talker\n' ? r.stdout : undefined;
      }, 20_000)).toBe('hello from talker\n');
    }
  }, 200_000);

  it('shows the previous instance with logs -p, after a restart and while it waits to restart', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name: 'crashy' },
        spec: {
          terminationGracePeriodSeconds: 1,
          volumes: [{ name: 'd', emptyDir: {} }],
          containers: [{ name: 'c', image: CLIENT, imagePullPolicy: 'Never', volumeMounts: [{ name: 'd', mountPath: '/d' }], command: ['sh', '-c', 'n=$(cat /d/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /d/n; echo "run $n"; exit 1'] }],
        },
      }),
    });
    // Between restarts the container waits out its back-off (10 s, then 20 s): that is where it is nearly all the time.
    const st = await waitFor('crashy restarted once and waiting', async () => {
      const s = (await pod('crashy')).status?.containerStatuses?.[0];
      return s && s.restartCount >= 1 && s.state?.waiting?.reason === 'CrashLoopBackOff' ? s : undefined;
    }, 60_000);
    expect(st.lastState?.terminated?.exitCode).toBe(1);
    for (const v of versions) {
      const r = await kubectl(['logs', 'crashy', '-p'], v.bin);
      expect([r.status, r.stderr], v.name).toEqual([0, '']);
      expect(r.stdout, v.name).toMatch(/^run \d+\n$/);
      // What `logs` shows without -p while it waits: the same last instance, as the kubelet answers.
      expect(await node.kubectlOk(['logs', 'crashy'], { bin: v.bin }), v.name).toBe(r.stdout);
    }
  }, 90_000);

  it('prints every kind of get -A output, and events', async () => {
    for (const v of versions) {
      const wide = await node.kubectlOk(['get', 'pods', '-A', '-o', 'wide'], { bin: v.bin });
      expect(wide, v.name).toMatch(new RegExp(`^NAMESPACE\\s+NAME\\s+READY\\s+STATUS\\s+RESTARTS\\s+AGE\\s+IP\\s+NODE\\s+NOMINATED NODE\\s+READINESS GATES\\n`));
      expect(wide, v.name).toMatch(new RegExp(`default\\s+two\\s+2/2\\s+Running\\s+0\\s+\\S+\\s+\\d+\\.\\d+\\.\\d+\\.\\d+\\s+${node.nodeName}\\s+<none>\\s+<none>`));
      const json = JSON.parse(await node.kubectlOk(['get', 'pods', '-A', '-o', 'json'], { bin: v.bin })) as { kind: string; items: Pod[] };
      expect(json.kind, v.name).toBe('List');
      const names = json.items.map((p) => p.metadata?.name).sort();
      expect(names, v.name).toEqual(expect.arrayContaining(['crashy', 'solo', 'two']));
      const yaml = await node.kubectlOk(['get', 'pods', '-A', '-o', 'yaml'], { bin: v.bin });
      expect(yaml, v.name).toMatch(/^apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\n/);
      expect(yaml, v.name).toContain('    name: two\n');
      const byName = (await node.kubectlOk(['get', 'pods', '-A', '-o', 'name'], { bin: v.bin })).trim().split('\n').sort();
      expect(byName, v.name).toEqual(names.map((n) => `pod/${n}`));
      expect(await node.kubectlOk(['get', 'pods', '-A', '-o', 'jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name}={.spec.nodeName}{"\\n"}{end}'], { bin: v.bin }), v.name).toContain(`default/two=${node.nodeName}\n`);
      const events = await node.kubectlOk(['events', '--for', 'pod/two'], { bin: v.bin });
      expect(events, v.name).toMatch(/^LAST SEEN\s+TYPE\s+REASON\s+OBJECT\s+MESSAGE\n/);
      expect(events, v.name).toMatch(/Normal\s+Started\s+Pod\/two\s+Started container b/);
      expect(await node.kubectlOk(['events', '-A'], { bin: v.bin }), v.name).toMatch(/default\s+\S+\s+Normal\s+Created\s+Pod\/solo\s+Created container solo/);
    }
  });

  it('describes a pod, a deployment, a service, the node and a job', async () => {
    const svc = await node.getJson<{ spec: { clusterIP: string } }>(['service', 'web']);
    for (const v of versions) {
      const describe = async (what: string[]) => {
        const r = await kubectl(['describe', ...what], v.bin);
        expect([r.status, r.stderr], `${v.name} describe ${what.join(' ')}`).toEqual([0, '']);
        return r.stdout;
      };
      const p = await describe(['pod', 'two']);
      expect(p).toMatch(new RegExp(`^Name:\\s+two\\nNamespace:\\s+default\\n`));
      expect(p).toMatch(new RegExp(`Node:\\s+${node.nodeName}/192\\.0\\.2\\.10`));
      expect(p).toMatch(/Status:\s+Running/);
      expect(p).toMatch(/Containers:\n\s+a:\n\s+Container ID:\s+skiff:\/\/[0-9a-f]{64}\n\s+Image:\s+skiff\.local\/demo-client:1/);
      expect(p).toMatch(/Ready\s+True/);
      expect(p).toMatch(/QoS Class:\s+BestEffort/);
      expect(p).toMatch(/Normal\s+Started\s+\S+\s+kubelet\s+.*Started container b/);
      const d = await describe(['deployment', 'web']);
      expect(d).toMatch(/Replicas:\s+2 desired \| 2 updated \| 2 total \| 2 available \| 0 unavailable/);
      expect(d).toMatch(/StrategyType:\s+RollingUpdate/);
      expect(d).toMatch(/Image:\s+skiff\.local\/demo-web:1/);
      expect(d).toMatch(/Available\s+True\s+MinimumReplicasAvailable/);
      expect(d).toMatch(/NewReplicaSet:\s+web-\S+ \(2\/2 replicas created\)/);
      const s = await describe(['service', 'web']);
      expect(s).toMatch(/Type:\s+ClusterIP/);
      expect(s).toMatch(new RegExp(`\\nIP:\\s+${svc.spec.clusterIP.replace(/\./g, '\\.')}\\n`));
      expect(s).toMatch(/Port:\s+80-8080\s+80\/TCP\nTargetPort:\s+8080\/TCP/);
      const n = await describe(['node', node.nodeName]);
      expect(n).toMatch(/Ready\s+True\s+.*KubeletReady/);
      expect(n).toMatch(/InternalIP:\s+192\.0\.2\.10/);
      expect(n).toMatch(/Container Runtime Version:\s+skiff:\/\//);
      expect(n).toMatch(/default\s+two\s+0 \(0%\)/);
      const j = await describe(['job', 'hello']);
      expect(j).toMatch(/Completions:\s+1/);
      expect(j).toMatch(/Pods Statuses:\s+0 Active \(0 Ready\) \/ 1 Succeeded \/ 0 Failed/);
      expect(j).toMatch(/Command:\n\s+sh\n\s+-c\n\s+echo job ran/);
    }
  });

  it('applies a kustomization directory with -k', async () => {
    const dir = path.join(tmp, 'kustomize');
    await fs.mkdir(dir);
    await fs.writeFile(path.join(dir, 'kustomization.yaml'), 'namespace: kus\nnamePrefix: k-\nlabels:\n- pairs: {team: blue}\n  includeSelectors: true\nresources: [ns.yaml, deploy.yaml, svc.yaml]\nconfigMapGenerator:\n- name: settings\n  literals: [GREETING=hi from kustomize]\nimages:\n- name: web-image\n  newName: skiff.local/demo-web\n  newTag: "1"\n');
    await fs.writeFile(path.join(dir, 'ns.yaml'), 'apiVersion: v1\nkind: Namespace\nmetadata: {name: kus}\n');
    await fs.writeFile(path.join(dir, 'deploy.yaml'), 'apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: kweb}}\n  template:\n    metadata: {labels: {app: kweb}}\n    spec:\n      containers:\n      - name: web\n        image: web-image\n        imagePullPolicy: Never\n        envFrom: [{configMapRef: {name: settings}}]\n');
    await fs.writeFile(path.join(dir, 'svc.yaml'), 'apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: kweb}\n  ports: [{port: 80, targetPort: 8080}]\n');
    const created = await node.kubectlOk(['apply', '-k', dir]);
    expect(created).toMatch(/namespace\/kus created\nconfigmap\/k-settings-\w+ created\nservice\/k-web created\ndeployment.apps\/k-web created\n/);
    expect(await node.kubectlOk(['apply', '-k', dir], { bin: KUBECTL_127 })).toMatch(/namespace\/kus unchanged\nconfigmap\/k-settings-\w+ unchanged\nservice\/k-web unchanged\ndeployment.apps\/k-web unchanged\n/);
    await node.kubectlOk(['rollout', 'status', '-n', 'kus', 'deployment/k-web', '--timeout=60s'], { timeoutMs: 70_000 });
    expect(await node.kubectlOk(['exec', '-n', 'kus', 'deploy/k-web', '--', 'sh', '-c', 'echo "$GREETING"'])).toBe('hi from kustomize\n');
    expect(await node.kubectlOk(['get', 'deploy,svc,cm', '-n', 'kus', '-l', 'team=blue', '-o', 'name'])).toMatch(/deployment.apps\/k-web\nservice\/k-web\nconfigmap\/k-settings-\w+\n/);
  }, 120_000);

  it('edits a Deployment through KUBE_EDITOR', async () => {
    const editor = path.join(tmp, 'editor.sh');
    // The editor kubectl starts on the file it wrote: the replicas and a label changed, as a user's hands would.
    await fs.writeFile(editor, '#!/bin/sh\nsed -i -e "/^    edited:/d" -e "s/^  replicas: [0-9]*/  replicas: $REPLICAS/" -e "s/^    app: web$/    app: web\\n    edited: \\"$REPLICAS\\"/" "$1"\n', { mode: 0o755 });
    for (const [v, replicas] of [[versions[0]!, 3], [versions[1]!, 1]] as const) {
      const out = await node.kubectlOk(['edit', 'deployment', 'web'], { bin: v.bin, env: { KUBE_EDITOR: editor, REPLICAS: String(replicas) } });
      expect(out, v.name).toContain('deployment.apps/web edited');
      const d = await node.getJson<{ metadata: { labels: Record<string, string> }; spec: { replicas: number } }>(['deployment', 'web']);
      expect([d.spec.replicas, d.metadata.labels.edited], v.name).toEqual([replicas, String(replicas)]);
      await node.kubectlOk(['rollout', 'status', 'deployment/web', '--timeout=60s'], { bin: v.bin, timeoutMs: 70_000 });
    }
    // An editor that changes nothing: kubectl says so and writes nothing.
    const r = await kubectl(['edit', 'deployment', 'web'], KUBECTL_135, { env: { KUBE_EDITOR: 'true' } });
    expect([r.status, r.stderr]).toEqual([0, 'Edit cancelled, no changes made.\n']);
  }, 120_000);

  it('restarts a pod\'s container from its new image on set image and edit, and refuses other pod spec changes', async () => {
    const before = (await pod('solo')).status!.containerStatuses![0]!;
    expect(before.image).toBe(WEB);
    expect(await node.kubectlOk(['set', 'image', 'pod/solo', `solo=${CLIENT}`])).toContain('pod/solo image updated');
    const after = await waitFor('solo running from the new image', async () => {
      const s = (await pod('solo')).status?.containerStatuses?.[0];
      return s?.image === CLIENT && s.state?.running ? s : undefined;
    }, 40_000);
    expect(after.restartCount).toBe(1);
    expect(after.containerID).not.toBe(before.containerID);
    expect(after.lastState?.terminated?.containerID).toBe(before.containerID);
    expect(await node.kubectlOk(['exec', 'solo', '--', 'sh', '-c', 'echo $GREETING'])).toBe('hi\n');
    expect(await node.kubectlOk(['events', '--for', 'pod/solo'])).toMatch(/Normal\s+Killing\s+Pod\/solo\s+Container solo definition changed, will be restarted/);

    // kubectl 1.27's edit of the image does the same.
    const editor = path.join(tmp, 'image-editor.sh');
    await fs.writeFile(editor, `#!/bin/sh\nsed -i "s#image: ${CLIENT}#image: ${WEB}#" "$1"\n`, { mode: 0o755 });
    expect(await node.kubectlOk(['edit', 'pod', 'solo'], { bin: KUBECTL_127, env: { KUBE_EDITOR: editor } })).toContain('pod/solo edited');
    const again = await waitFor('solo running from its first image again', async () => {
      const s = (await pod('solo')).status?.containerStatuses?.[0];
      return s?.image === WEB && s.state?.running ? s : undefined;
    }, 40_000);
    expect(again.restartCount).toBe(2);

    // Added tolerations are allowed, removing one is not; nor is anything else of the spec.
    const tol = { key: 'example.com/k', operator: 'Exists', effect: 'NoSchedule' };
    await node.kubectlOk(['patch', 'pod', 'solo', '--type=merge', '-p', JSON.stringify({ spec: { tolerations: [tol] } })]);
    expect((await pod('solo')).spec?.tolerations).toEqual([tol]);
    const forbidden = 'Forbidden: pod updates may not change fields other than `spec.containers[*].image`';
    for (const v of versions) {
      for (const patch of [[{ op: 'remove', path: '/spec/tolerations/0' }], [{ op: 'replace', path: '/spec/restartPolicy', value: 'Never' }], [{ op: 'add', path: '/spec/containers/0/env/-', value: { name: 'X', value: '1' } }]]) {
        const r = await kubectl(['patch', 'pod', 'solo', '--type=json', '-p', JSON.stringify(patch)], v.bin);
        expect(r.status, `${v.name} ${JSON.stringify(patch)}`).not.toBe(0);
        expect(r.stderr, v.name).toContain(`The Pod "solo" is invalid: spec: ${forbidden}`);
      }
    }
    expect((await pod('solo')).status?.containerStatuses?.[0]?.restartCount).toBe(2);
  }, 150_000);
});
