/**
 * The workload and Service kinds of the node's API, through its store: the
 * defaults the API server applies, validation by the node's own checks with
 * the messages kubectl prints, immutable fields, generation, the tables'
 * rows, the scale subresource's reading and writing, the field selectors,
 * and strategic merge of a template's containers by name.
 */
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { nodeKinds } from '../../src/api/kinds/index.js';
import { applyPatch } from '../../src/api/patch.js';
import { fromScale, toScale } from '../../src/api/scale.js';
import { Store } from '../../src/api/store.js';
import { toTable } from '../../src/api/table.js';
import type { ApiObject, Kind, Obj } from '../../src/api/types.js';

const T0 = Date.parse('2026-01-01T00:00:00Z');

function setup(now = () => T0) {
  const store = new Store({ kinds: nodeKinds('node-a'), now });
  const kind = (resource: string): Kind => store.kind(resource)!;
  return { store, kind };
}

function error(f: () => unknown): string {
  try {
    f();
  } catch (err) {
    if (err instanceof ApiError) return `${err.code} ${err.message}`;
    throw err;
  }
  return 'no error';
}

const template = (labels: Record<string, string>, extra: Obj = {}) => ({
  metadata: { labels },
  spec: { containers: [{ name: 'web', image: 'nginx:1.25', ports: [{ containerPort: 80 }] }], ...extra },
});
const deployment = (name: string, spec: Obj = {}) => ({ apiVersion: 'apps/v1', kind: 'Deployment', metadata: { name }, spec: { selector: { matchLabels: { app: name } }, template: template({ app: name }), ...spec } });
const job = (name: string, spec: Obj = {}) => ({ apiVersion: 'batch/v1', kind: 'Job', metadata: { name }, spec: { template: { spec: { restartPolicy: 'Never', containers: [{ name: 'c', image: 'busybox' }] } }, ...spec } });
const service = (name: string, spec: Obj = {}) => ({ apiVersion: 'v1', kind: 'Service', metadata: { name }, spec: { selector: { app: name }, ports: [{ port: 80 }], ...spec } });
const spec = (o: ApiObject) => o.spec as Obj;

describe('defaults', () => {
  it('a Deployment gets replicas, a 25%/25% rolling update, history, a deadline and pod defaults on its template', () => {
    const { store, kind } = setup();
    const d = store.create(kind('deployments.apps'), 'default', deployment('web'));
    expect(d.apiVersion).toBe('apps/v1');
    expect(spec(d)).toMatchObject({ replicas: 1, revisionHistoryLimit: 10, progressDeadlineSeconds: 600, strategy: { type: 'RollingUpdate', rollingUpdate: { maxSurge: '25%', maxUnavailable: '25%' } } });
    const pod = (spec(d).template as Obj).spec as Obj;
    expect(pod).toMatchObject({ restartPolicy: 'Always', dnsPolicy: 'ClusterFirst', schedulerName: 'default-scheduler', terminationGracePeriodSeconds: 30, securityContext: {} });
    expect((pod.containers as Obj[])[0]).toMatchObject({ imagePullPolicy: 'IfNotPresent', terminationMessagePath: '/dev/termination-log', ports: [{ containerPort: 80, protocol: 'TCP' }] });
    expect(d.status).toEqual({});
    expect(d.metadata.generation).toBe(1);
    // Recreate has no rollingUpdate to default.
    const r = store.create(kind('deployments.apps'), 'default', deployment('re', { strategy: { type: 'Recreate' } }));
    expect(spec(r).strategy).toEqual({ type: 'Recreate' });
  });

  it('a Service gets ClusterIP, no affinity, TCP ports aimed at themselves, cluster traffic policy and one IPv4 family', () => {
    const { store, kind } = setup();
    const s = store.create(kind('services'), 'default', service('web', { ports: [{ name: 'http', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 }] }));
    expect(spec(s)).toEqual({
      selector: { app: 'web' },
      ports: [
        { name: 'http', port: 80, protocol: 'TCP', targetPort: 80 },
        { name: 'dns', port: 53, protocol: 'UDP', targetPort: 5353 },
      ],
      type: 'ClusterIP',
      sessionAffinity: 'None',
      internalTrafficPolicy: 'Cluster',
      ipFamilyPolicy: 'SingleStack',
      ipFamilies: ['IPv4'],
    });
    expect(s.status).toEqual({ loadBalancer: {} });
    const np = store.create(kind('services'), 'default', service('np', { type: 'NodePort', clusterIP: '10.96.0.10', sessionAffinity: 'ClientIP' }));
    expect(spec(np)).toMatchObject({ externalTrafficPolicy: 'Cluster', clusterIPs: ['10.96.0.10'], sessionAffinityConfig: { clientIP: { timeoutSeconds: 10800 } } });
    const headless = store.create(kind('services'), 'default', { apiVersion: 'v1', kind: 'Service', metadata: { name: 'h' }, spec: { clusterIP: 'None', ports: [{ port: 80 }] } });
    expect(spec(headless)).toMatchObject({ clusterIPs: ['None'], ipFamilyPolicy: 'RequireDualStack' });
  });

  it('a Job gets one completion, six retries, NonIndexed, not suspended, and a selector and labels of its own uid', () => {
    const { store, kind } = setup();
    const j = store.create(kind('jobs.batch'), 'default', job('once'));
    const uid = j.metadata.uid!;
    expect(spec(j)).toMatchObject({ completions: 1, parallelism: 1, backoffLimit: 6, completionMode: 'NonIndexed', suspend: false, manualSelector: false, podReplacementPolicy: 'TerminatingOrFailed' });
    expect(spec(j).selector).toEqual({ matchLabels: { 'batch.kubernetes.io/controller-uid': uid } });
    const labels = { 'batch.kubernetes.io/controller-uid': uid, 'batch.kubernetes.io/job-name': 'once', 'controller-uid': uid, 'job-name': 'once' };
    expect(((spec(j).template as Obj).metadata as Obj).labels).toEqual(labels);
    expect(j.metadata.labels).toEqual(labels);
    // Parallelism alone leaves completions unset; a failure policy replaces only failed pods.
    const p = store.create(kind('jobs.batch'), 'default', job('par', { parallelism: 3, podFailurePolicy: { rules: [{ action: 'Ignore', onExitCodes: { operator: 'In', values: [42] } }] } }));
    expect(spec(p).completions).toBeUndefined();
    expect(spec(p).podReplacementPolicy).toBe('Failed');
    // Labels of its own are kept; a manual selector is not generated.
    const own = store.create(kind('jobs.batch'), 'default', { ...job('own', { manualSelector: true, selector: { matchLabels: { x: 'y' } } }), metadata: { name: 'own', labels: { team: 'a' } } });
    expect(own.metadata.labels).toEqual({ team: 'a' });
    expect(spec(own).selector).toEqual({ matchLabels: { x: 'y' } });
  });

  it('a CronJob gets Allow, not suspended, history limits 3 and 1, and pod defaults deep in its job template', () => {
    const { store, kind } = setup();
    const c = store.create(kind('cronjobs.batch'), 'default', { apiVersion: 'batch/v1', kind: 'CronJob', metadata: { name: 'tick' }, spec: { schedule: '*/5 * * * *', jobTemplate: { spec: job('x').spec } } });
    expect(spec(c)).toMatchObject({ concurrencyPolicy: 'Allow', suspend: false, successfulJobsHistoryLimit: 3, failedJobsHistoryLimit: 1 });
    const js = (spec(c).jobTemplate as Obj).spec as Obj;
    expect(js.backoffLimit).toBeUndefined(); // a Job's defaults are the Job's, when it is made
    expect((js.template as Obj).spec).toMatchObject({ dnsPolicy: 'ClusterFirst', restartPolicy: 'Never' });
  });

  it('DaemonSets, StatefulSets and ReplicaSets get theirs', () => {
    const { store, kind } = setup();
    const body = (k: string, name: string, extra: Obj = {}) => ({ apiVersion: 'apps/v1', kind: k, metadata: { name }, spec: { selector: { matchLabels: { app: name } }, template: template({ app: name }), ...extra } });
    const ds = store.create(kind('daemonsets.apps'), 'default', body('DaemonSet', 'ds'));
    expect(spec(ds)).toMatchObject({ revisionHistoryLimit: 10, updateStrategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 0 } } });
    expect(ds.status).toEqual({ currentNumberScheduled: 0, desiredNumberScheduled: 0, numberMisscheduled: 0, numberReady: 0 });
    const sts = store.create(kind('statefulsets.apps'), 'default', body('StatefulSet', 'db', { serviceName: 'db' }));
    expect(spec(sts)).toMatchObject({
      replicas: 1,
      revisionHistoryLimit: 10,
      podManagementPolicy: 'OrderedReady',
      updateStrategy: { type: 'RollingUpdate', rollingUpdate: { partition: 0 } },
      persistentVolumeClaimRetentionPolicy: { whenDeleted: 'Retain', whenScaled: 'Retain' },
    });
    const rs = store.create(kind('replicasets.apps'), 'default', body('ReplicaSet', 'rs'));
    expect(spec(rs).replicas).toBe(1);
  });
});

describe('validation', () => {
  it('refuses workloads as the controllers would, naming the group and the field', () => {
    const { store, kind } = setup();
    const deploy = kind('deployments.apps');
    expect(error(() => store.create(deploy, 'default', deployment('neg', { replicas: -1 })))).toBe('422 Deployment.apps "neg" is invalid: spec.replicas: must be at least 0, got -1');
    expect(error(() => store.create(deploy, 'default', deployment('other', { selector: { matchLabels: { app: 'x' } } })))).toBe(
      '422 Deployment.apps "other" is invalid: spec.selector: does not match the template\'s labels (spec.template.metadata.labels)',
    );
    expect(error(() => store.create(deploy, 'default', deployment('huge', { replicas: 2_000_000_000 })))).toContain('spec.replicas: must be at most 100000');
    // The agent's pod checks run on the template, with the template's path.
    expect(error(() => store.create(deploy, 'default', deployment('port', { template: template({ app: 'port' }, { containers: [{ name: 'web', image: 'nginx', ports: [{ containerPort: 70000 }] }] }) })))).toMatch(
      /^422 Deployment\.apps "port" is invalid: spec\.template\.spec\.containers\[0\]\.ports\[0\]\.containerPort: Invalid value: 70000/,
    );
    expect(error(() => store.create(kind('jobs.batch'), 'default', job('always', { template: { spec: { containers: [{ name: 'c', image: 'busybox' }] } } })))).toBe(
      '422 Job.batch "always" is invalid: spec.template.spec.restartPolicy: a Job\'s pods need restartPolicy OnFailure or Never, got "Always"',
    );
    expect(error(() => store.create(kind('cronjobs.batch'), 'default', { apiVersion: 'batch/v1', kind: 'CronJob', metadata: { name: 'nos' }, spec: { jobTemplate: { spec: job('x').spec } } }))).toBe(
      '422 CronJob.batch "nos" is invalid: spec.schedule: required (a cron schedule such as "*/5 * * * *")',
    );
    expect(error(() => store.create(kind('statefulsets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 's' }, spec: { selector: { matchLabels: { a: 'b' } }, template: template({ a: 'b' }), podManagementPolicy: 'Random' } }))).toBe(
      '422 StatefulSet.apps "s" is invalid: spec.podManagementPolicy: must be one of OrderedReady, Parallel, got "Random"',
    );
  });

  it('refuses a Service as the API server validates one', () => {
    const { store, kind } = setup();
    expect(error(() => store.create(kind('services'), 'default', service('two', { ports: [{ port: 80 }, { port: 81 }] })))).toBe('422 Service "two" is invalid: [spec.ports[0].name: Required value, spec.ports[1].name: Required value]');
    expect(error(() => store.create(kind('services'), 'default', service('np', { ports: [{ port: 80, nodePort: 30080 }] })))).toBe("422 Service \"np\" is invalid: spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'");
    expect(error(() => store.create(kind('services'), 'default', service('sel', { selector: { 'app/x/y': 'a b' } })))).toMatch(/^422 Service "sel" is invalid: \[spec\.selector: Invalid value: "app\/x\/y": .*, spec\.selector: Invalid value: "a b": a valid label must be/);
    expect(error(() => store.create(kind('services'), 'default', service('en', { type: 'ExternalName' })))).toBe('422 Service "en" is invalid: spec.externalName: Required value');
    expect(error(() => store.create(kind('services'), 'default', service('etp', { externalTrafficPolicy: 'Local' })))).toBe('422 Service "etp" is invalid: spec.externalTrafficPolicy: Invalid value: "Local": may only be set for externally-accessible services');
    expect(error(() => store.create(kind('services'), 'default', service('hl', { type: 'NodePort', clusterIP: 'None' })))).toBe('422 Service "hl" is invalid: spec.clusterIPs[0]: Invalid value: "None": may not be set to \'None\' for NodePort services');
    expect(error(() => store.create(kind('services'), 'default', service('aff', { sessionAffinity: 'Sticky' })))).toBe('422 Service "aff" is invalid: spec.sessionAffinity: Unsupported value: "Sticky": supported values: "ClientIP", "None"');
    // Accepted as the API server accepts them: a LoadBalancer (with a health-check port allocated) and a headless targetPort 0.
    const lb = store.create(kind('services'), 'default', service('lb', { type: 'LoadBalancer', externalTrafficPolicy: 'Local' }));
    expect((lb.spec as { healthCheckNodePort: number }).healthCheckNodePort).toBeGreaterThanOrEqual(30000);
    const hl = store.create(kind('services'), 'default', service('hl0', { clusterIP: 'None', ports: [{ port: 5432, targetPort: 0 }] }));
    expect((hl.spec as { ports: Array<{ targetPort: number }> }).ports[0]!.targetPort).toBe(5432);
    // nodePort 0 is unset, as an int32's zero is: none on a ClusterIP Service; on a NodePort one, left for the proxy to allocate.
    const z = store.create(kind('services'), 'default', service('np0', { ports: [{ port: 80, nodePort: 0 }] }));
    expect((z.spec as { ports: Array<{ nodePort?: number }> }).ports[0]!.nodePort).toBeUndefined();
    const zn = store.create(kind('services'), 'default', service('np0n', { type: 'NodePort', ports: [{ port: 80, nodePort: 0 }] }));
    expect((zn.spec as { ports: Array<{ nodePort?: number }> }).ports[0]!.nodePort).toBeUndefined();
    expect(error(() => store.create(kind('services'), 'default', service('Bad')))).toMatch(/^422 Service "Bad" is invalid: metadata\.name: Invalid value: "Bad"/);
  });
});

describe('immutable fields and generation', () => {
  it('a workload selector, a Job template, a Service clusterIP and a StatefulSet spec refuse changes as the API server does', () => {
    const { store, kind } = setup();
    const deploy = kind('deployments.apps');
    store.create(deploy, 'default', deployment('web'));
    const moved = (o: ApiObject) => ({ ...o, spec: { ...spec(o), selector: { matchLabels: { app: 'other' } }, template: template({ app: 'other' }) } });
    expect(error(() => store.update(deploy, 'default', 'web', moved(store.get(deploy, 'default', 'web'))))).toBe(
      '422 Deployment.apps "web" is invalid: spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"app":"other"}, MatchExpressions:[]v1.LabelSelectorRequirement(nil)}: field is immutable',
    );
    for (const [resource, k] of [['daemonsets.apps', 'DaemonSet'], ['replicasets.apps', 'ReplicaSet']] as const) {
      store.create(kind(resource), 'default', { apiVersion: 'apps/v1', kind: k, metadata: { name: 'x' }, spec: { selector: { matchLabels: { app: 'x' } }, template: template({ app: 'x' }) } });
      expect(error(() => store.update(kind(resource), 'default', 'x', moved(store.get(kind(resource), 'default', 'x'))))).toContain(`${k}.apps "x" is invalid: spec.selector: Invalid value: v1.LabelSelector{`);
    }

    const jobs = kind('jobs.batch');
    store.create(jobs, 'default', job('once'));
    const j = store.get(jobs, 'default', 'once');
    const t = structuredClone(spec(j).template) as Obj;
    ((t.spec as Obj).containers as Obj[])[0]!.image = 'busybox:2';
    expect(error(() => store.update(jobs, 'default', 'once', { ...j, spec: { ...spec(j), template: t } }))).toMatch(/^422 Job\.batch "once" is invalid: spec\.template: Invalid value: .*: field is immutable$/);
    expect(error(() => store.update(jobs, 'default', 'once', { ...j, spec: { ...spec(j), selector: { matchLabels: { a: 'b' } } } }))).toContain('spec.selector: Invalid value: v1.LabelSelector{MatchLabels:map[string]string{"a":"b"}');
    // What may change does, and bumps the generation.
    expect(store.update(jobs, 'default', 'once', { ...j, spec: { ...spec(j), suspend: true } }).metadata.generation).toBe(2);

    const svcs = kind('services');
    store.create(svcs, 'default', service('web', { clusterIP: '10.96.0.20' }));
    const s = store.get(svcs, 'default', 'web');
    expect(error(() => store.update(svcs, 'default', 'web', { ...s, spec: { ...spec(s), clusterIP: '10.96.0.21', clusterIPs: ['10.96.0.21'] } }))).toBe(
      '422 Service "web" is invalid: spec.clusterIPs[0]: Invalid value: []string{"10.96.0.21"}: may not change once set',
    );
    // A write that leaves the address out keeps it (as the API server patches allocated values back in).
    const { clusterIP: _ip, clusterIPs: _ips, ...rest } = spec(s);
    expect(spec(store.update(svcs, 'default', 'web', { ...s, spec: { ...rest, ports: [{ port: 8080 }] } }))).toMatchObject({ clusterIP: '10.96.0.20', clusterIPs: ['10.96.0.20'], ports: [{ port: 8080, targetPort: 8080 }] });

    const sts = kind('statefulsets.apps');
    store.create(sts, 'default', { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 'db' }, spec: { serviceName: 'db', selector: { matchLabels: { app: 'db' } }, template: template({ app: 'db' }) } });
    const st = store.get(sts, 'default', 'db');
    expect(error(() => store.update(sts, 'default', 'db', { ...st, spec: { ...spec(st), serviceName: 'other' } }))).toBe(
      "422 StatefulSet.apps \"db\" is invalid: spec: Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden",
    );
    expect(store.update(sts, 'default', 'db', { ...st, spec: { ...spec(st), replicas: 3 } }).metadata.generation).toBe(2);
  });

  it('generation moves with the spec only: not with labels, nor with status', () => {
    const { store, kind } = setup();
    const deploy = kind('deployments.apps');
    store.create(deploy, 'default', deployment('web'));
    const restarted = store.patch(deploy, 'default', 'web', (cur) => applyPatch('strategic', cur, { spec: { template: { metadata: { annotations: { 'kubectl.kubernetes.io/restartedAt': '2026-01-01T00:00:00Z' } } } } }));
    expect(restarted.metadata.generation).toBe(2);
    const labelled = store.patch(deploy, 'default', 'web', (cur) => applyPatch('merge', cur, { metadata: { labels: { team: 'a' } } }));
    expect(labelled.metadata.generation).toBe(2);
    const status = store.patch(deploy, 'default', 'web', (cur) => applyPatch('merge', cur, { status: { replicas: 1, readyReplicas: 1 } }), { status: true });
    expect(status.metadata.generation).toBe(2);
    expect(status.status).toEqual({ replicas: 1, readyReplicas: 1 });
    // A write of the object keeps the status the node wrote.
    const again = store.patch(deploy, 'default', 'web', (cur) => applyPatch('merge', cur, { status: null, spec: { replicas: 2 } }));
    expect(again.status).toEqual({ replicas: 1, readyReplicas: 1 });
    expect(again.metadata.generation).toBe(3);
  });
});

describe('tables', () => {
  it('print the columns kubectl prints, wide ones at priority 1', () => {
    const { store, kind } = setup();
    const later = T0 + 125_000;
    const cells = (resource: string, o: ApiObject) => {
      const k = kind(resource);
      const t = toTable(k, [o], {}, 'None', later) as { columnDefinitions: Array<{ name: string; priority: number }>; rows: Array<{ cells: unknown[] }> };
      return { head: t.columnDefinitions.map((c) => (c.priority ? `(${c.name})` : c.name)).join(' '), row: t.rows[0]!.cells };
    };
    const d = store.create(kind('deployments.apps'), 'default', deployment('web', { replicas: 3 }));
    const dStatus = store.patch(kind('deployments.apps'), 'default', 'web', (cur) => ({ ...cur, status: { readyReplicas: 2, updatedReplicas: 3, availableReplicas: 2 } }), { status: true });
    expect(cells('deployments.apps', d).head).toBe('Name Ready Up-to-date Available Age (Containers) (Images) (Selector)');
    expect(cells('deployments.apps', dStatus).row).toEqual(['web', '2/3', 3, 2, '2m5s', 'web', 'nginx:1.25', 'app=web']);

    const s = store.create(kind('services'), 'default', service('web', { type: 'NodePort', clusterIP: '10.96.0.7', ports: [{ port: 80, nodePort: 30080 }], externalIPs: ['192.0.2.1'] }));
    expect(cells('services', s)).toEqual({ head: 'Name Type Cluster-IP External-IP Port(s) Age (Selector)', row: ['web', 'NodePort', '10.96.0.7', '192.0.2.1', '80:30080/TCP', '2m5s', 'app=web'] });
    const plain = store.create(kind('services'), 'default', { apiVersion: 'v1', kind: 'Service', metadata: { name: 'bare' }, spec: { ports: [{ port: 53, protocol: 'UDP' }] } });
    expect(cells('services', plain).row).toEqual(['bare', 'ClusterIP', '<none>', '<none>', '53/UDP', '2m5s', '<none>']);

    const j = store.create(kind('jobs.batch'), 'default', job('once'));
    expect(cells('jobs.batch', j).head).toBe('Name Status Completions Duration Age (Containers) (Images) (Selector)');
    expect(cells('jobs.batch', j).row).toEqual(['once', 'Running', '0/1', '', '2m5s', 'c', 'busybox', `batch.kubernetes.io/controller-uid=${j.metadata.uid}`]);
    const done = store.patch(kind('jobs.batch'), 'default', 'once', (cur) => ({ ...cur, status: { succeeded: 1, startTime: '2026-01-01T00:00:10Z', completionTime: '2026-01-01T00:00:55Z', conditions: [{ type: 'Complete', status: 'True' }] } }), { status: true });
    expect(cells('jobs.batch', done).row.slice(0, 4)).toEqual(['once', 'Complete', '1/1', '45s']);
    const par = store.create(kind('jobs.batch'), 'default', job('par', { parallelism: 3 }));
    expect(cells('jobs.batch', par).row[2]).toBe('0/1 of 3');

    const c = store.create(kind('cronjobs.batch'), 'default', { apiVersion: 'batch/v1', kind: 'CronJob', metadata: { name: 'tick' }, spec: { schedule: '*/5 * * * *', timeZone: 'Etc/UTC', jobTemplate: { spec: job('x').spec } } });
    expect(cells('cronjobs.batch', c)).toEqual({ head: 'Name Schedule Timezone Suspend Active Last Schedule Age (Containers) (Images) (Selector)', row: ['tick', '*/5 * * * *', 'Etc/UTC', 'False', 0, '<none>', '2m5s', 'c', 'busybox', '<none>'] });

    const ds = store.create(kind('daemonsets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'DaemonSet', metadata: { name: 'ds' }, spec: { selector: { matchLabels: { app: 'ds' } }, template: template({ app: 'ds' }, { nodeSelector: { 'kubernetes.io/os': 'linux' } }) } });
    expect(cells('daemonsets.apps', ds)).toEqual({
      head: 'Name Desired Current Ready Up-to-date Available Node Selector Age (Containers) (Images) (Selector)',
      row: ['ds', 0, 0, 0, 0, 0, 'kubernetes.io/os=linux', '2m5s', 'web', 'nginx:1.25', 'app=ds'],
    });
    const rs = store.create(kind('replicasets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'ReplicaSet', metadata: { name: 'rs' }, spec: { replicas: 2, selector: { matchExpressions: [{ key: 'app', operator: 'In', values: ['rs', 'a'] }] }, template: template({ app: 'rs' }) } });
    expect(cells('replicasets.apps', rs)).toEqual({ head: 'Name Desired Current Ready Age (Containers) (Images) (Selector)', row: ['rs', 2, 0, 0, '2m5s', 'web', 'nginx:1.25', 'app in (a,rs)'] });
    const sts = store.create(kind('statefulsets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 'db' }, spec: { selector: { matchLabels: { app: 'db' } }, template: template({ app: 'db' }) } });
    expect(cells('statefulsets.apps', sts)).toEqual({ head: 'Name Ready Age (Containers) (Images)', row: ['db', '0/1', '2m5s', 'web', 'nginx:1.25'] });
    // A ReplicationController's selector and labels default to its template's labels, as the API server defaults them.
    const rc = store.create(kind('replicationcontrollers'), 'default', { apiVersion: 'v1', kind: 'ReplicationController', metadata: { name: 'rc' }, spec: { replicas: 2, template: template({ app: 'rc', tier: 'x' }) } });
    expect((rc.spec as Record<string, unknown>).selector).toEqual({ app: 'rc', tier: 'x' });
    expect(rc.metadata.labels).toEqual({ app: 'rc', tier: 'x' });
    expect(cells('replicationcontrollers', rc)).toEqual({ head: 'Name Desired Current Ready Age (Containers) (Images) (Selector)', row: ['rc', 2, 0, 0, '2m5s', 'web', 'nginx:1.25', 'app=rc,tier=x'] });
    const cr = store.create(kind('controllerrevisions.apps'), 'default', {
      apiVersion: 'apps/v1',
      kind: 'ControllerRevision',
      metadata: { name: 'ds-abc', ownerReferences: [{ apiVersion: 'apps/v1', kind: 'DaemonSet', name: 'ds', uid: ds.metadata.uid, controller: true }] },
      data: { spec: { template: { $patch: 'replace' } } },
      revision: 3,
    });
    expect(cells('controllerrevisions.apps', cr)).toEqual({ head: 'Name Controller Revision Age', row: ['ds-abc', 'daemonset.apps/ds', 3, '2m5s'] });
  });

  it('keeps a ControllerRevision\'s data as written; refuses a ReplicationController whose selector misses its template', () => {
    const { store } = setup();
    const kind = (r: string) => store.kind(r)!;
    const cr = store.create(kind('controllerrevisions.apps'), 'default', { apiVersion: 'apps/v1', kind: 'ControllerRevision', metadata: { name: 'r' }, data: { a: 1 }, revision: 1 });
    expect(() => store.update(kind('controllerrevisions.apps'), 'default', 'r', { ...cr, data: { a: 2 } })).toThrow(/field is immutable/);
    expect(store.update(kind('controllerrevisions.apps'), 'default', 'r', { ...cr, revision: 4 }).revision).toBe(4);
    expect(() => store.create(kind('controllerrevisions.apps'), 'default', { apiVersion: 'apps/v1', kind: 'ControllerRevision', metadata: { name: 'neg' }, revision: -1 })).toThrow(/greater than or equal to 0/);
    expect(() =>
      store.create(kind('replicationcontrollers'), 'default', {
        apiVersion: 'v1',
        kind: 'ReplicationController',
        metadata: { name: 'bad' },
        spec: { selector: { app: 'other' }, template: { metadata: { labels: { app: 'rc' } }, spec: { containers: [{ name: 'c', image: 'busybox' }] } } },
      }),
    ).toThrow(/selector/);
  });

  it('puts every one of them in `all`, with kubectl\'s short names', () => {
    const { store } = setup();
    const all = store.kindList().filter((k) => k.categories?.includes('all'));
    expect(all.map((k) => `${k.plural}:${k.shortNames.join('/')}`)).toEqual(['pods:po', 'replicationcontrollers:rc', 'services:svc', 'daemonsets:ds', 'deployments:deploy', 'replicasets:rs', 'statefulsets:sts', 'jobs:', 'cronjobs:cj']);
    expect(all.every((k) => k.status)).toBe(true);
    expect(store.kindList().filter((k) => k.scale).map((k) => k.plural)).toEqual(['replicationcontrollers', 'deployments', 'replicasets', 'statefulsets']);
  });
});

describe('scale', () => {
  it('reads a Scale from the object and writes only its replicas back, through the kind\'s own validation', () => {
    const { store, kind } = setup();
    const deploy = kind('deployments.apps');
    store.create(deploy, 'default', deployment('web'));
    store.patch(deploy, 'default', 'web', (cur) => ({ ...cur, status: { replicas: 1 } }), { status: true });
    const cur = store.get(deploy, 'default', 'web');
    expect(toScale(deploy, cur)).toEqual({
      kind: 'Scale',
      apiVersion: 'autoscaling/v1',
      metadata: { name: 'web', namespace: 'default', uid: cur.metadata.uid, resourceVersion: cur.metadata.resourceVersion, creationTimestamp: cur.metadata.creationTimestamp },
      spec: { replicas: 1 },
      status: { replicas: 1, selector: 'app=web' },
    });
    const scaled = store.patch(deploy, 'default', 'web', (c) => fromScale(deploy, c, applyPatch('merge', toScale(deploy, c) as Obj, { spec: { replicas: 5 } })));
    expect(spec(scaled).replicas).toBe(5);
    expect(scaled.metadata.generation).toBe(2);
    expect(scaled.status).toEqual({ replicas: 1 });
    // A Scale's resourceVersion is a precondition.
    expect(error(() => store.patch(deploy, 'default', 'web', (c) => fromScale(deploy, c, { spec: { replicas: 2 }, metadata: { resourceVersion: cur.metadata.resourceVersion } })))).toMatch(/^409 Operation cannot be fulfilled on deployments "web"/);
    expect(error(() => store.patch(deploy, 'default', 'web', (c) => fromScale(deploy, c, { spec: { replicas: -1 } })))).toBe('422 Scale.autoscaling "web" is invalid: spec.replicas: Invalid value: -1: must be greater than or equal to 0');
    expect(error(() => store.patch(deploy, 'default', 'web', (c) => fromScale(deploy, c, { spec: { replicas: 200_000 } })))).toContain('Deployment.apps "web" is invalid: spec.replicas: must be at most 100000');
    const sts = kind('statefulsets.apps');
    store.create(sts, 'default', { apiVersion: 'apps/v1', kind: 'StatefulSet', metadata: { name: 'db' }, spec: { selector: { matchLabels: { app: 'db' } }, template: template({ app: 'db' }) } });
    expect(spec(store.patch(sts, 'default', 'db', (c) => fromScale(sts, c, { spec: { replicas: 3 } }))).replicas).toBe(3);
  });
});

describe('field selectors', () => {
  it('jobs by status.successful, replicasets by status.replicas; others refused as the API server refuses them', () => {
    const { store, kind } = setup();
    const jobs = kind('jobs.batch');
    store.create(jobs, 'default', job('a'));
    store.create(jobs, 'default', job('b'));
    store.patch(jobs, 'default', 'b', (cur) => ({ ...cur, status: { succeeded: 1 } }), { status: true });
    expect(store.list(jobs, { fieldSelector: 'status.successful=1' }).items.map((o) => o.metadata.name)).toEqual(['b']);
    expect(store.list(jobs, { fieldSelector: 'status.successful=0' }).items.map((o) => o.metadata.name)).toEqual(['a']);
    store.create(kind('replicasets.apps'), 'default', { apiVersion: 'apps/v1', kind: 'ReplicaSet', metadata: { name: 'rs' }, spec: { selector: { matchLabels: { app: 'rs' } }, template: template({ app: 'rs' }) } });
    expect(store.list(kind('replicasets.apps'), { fieldSelector: 'status.replicas=0' }).items).toHaveLength(1);
    expect(error(() => store.list(kind('deployments.apps'), { fieldSelector: 'spec.replicas=1' }))).toBe('400 field label not supported: spec.replicas');
  });
});

describe('strategic merge of a pod template', () => {
  it('merges containers by name, and their ports, env and mounts by key, as kubectl apply expects', () => {
    const cur = deployment('web') as Obj;
    ((((cur.spec as Obj).template as Obj).spec as Obj).containers as Obj[]).push({ name: 'side', image: 'busybox', env: [{ name: 'A', value: '1' }] });
    // What kubectl apply sends when only two images changed and an env var was added.
    const patch = {
      spec: {
        template: {
          spec: {
            '$setElementOrder/containers': [{ name: 'web' }, { name: 'side' }],
            containers: [
              { name: 'web', image: 'nginx:1.26' },
              { name: 'side', image: 'busybox:2', env: [{ name: 'B', value: '2' }] },
            ],
          },
        },
      },
    };
    const out = applyPatch('strategic', cur, patch);
    expect((((out.spec as Obj).template as Obj).spec as Obj).containers).toEqual([
      { name: 'web', image: 'nginx:1.26', ports: [{ containerPort: 80 }] },
      { name: 'side', image: 'busybox:2', env: [{ name: 'A', value: '1' }, { name: 'B', value: '2' }] },
    ]);
    // A Service's ports merge by port.
    const svc = applyPatch('strategic', service('web', { ports: [{ name: 'http', port: 80, targetPort: 8080 }, { name: 'm', port: 9090 }] }), { spec: { ports: [{ port: 80, targetPort: 8081 }] } });
    expect((svc.spec as Obj).ports).toEqual([{ name: 'http', port: 80, targetPort: 8081 }, { name: 'm', port: 9090 }]);
  });

  it('refuses a Service whose cluster IP or node port another holds, or whose node port is out of range, as the allocators do', () => {
    const { store, kind } = setup();
    const svc = kind('services');
    store.create(svc, 'default', service('s1', { type: 'NodePort', clusterIP: '10.96.0.50', ports: [{ port: 80, nodePort: 30080 }] }));
    expect(error(() => store.create(svc, 'other', service('s2', { clusterIP: '10.96.0.50', ports: [{ port: 80 }] })))).toContain('spec.clusterIPs: Invalid value: []string{"10.96.0.50"}: failed to allocate IP 10.96.0.50: provided IP is already allocated');
    expect(error(() => store.create(svc, 'default', service('s3', { type: 'NodePort', ports: [{ port: 81, nodePort: 30080 }] })))).toContain('spec.ports[0].nodePort: Invalid value: 30080: provided port is already allocated');
    expect(error(() => store.create(svc, 'default', service('s5', { type: 'NodePort', ports: [{ port: 80, nodePort: 22 }] })))).toContain('The range of valid ports is 30000-32767');
    // The same port for another protocol is free, and a Service keeps its own on update.
    store.create(svc, 'default', service('s4', { type: 'NodePort', ports: [{ port: 53, protocol: 'UDP', nodePort: 30080 }] }));
    const s1 = store.get(svc, 'default', 's1');
    expect(error(() => store.update(svc, 'default', 's1', { ...s1, metadata: { ...s1.metadata, labels: { a: 'b' } } }))).toBe('no error');
  });
});
