import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { parseManifest } from '../../src/kubelet-lite/manifests.js';
import type { StoredObject } from '../../src/kubelet-lite/model.js';
import { objectUid } from '../../src/kubelet-lite/store.js';
import {
  defaultPullPolicy,
  parseMilliQuantity,
  parseQuantity,
  podKey,
  tryParseQuantity,
  validateConfigMap,
  validatePod,
  validateSecret,
} from '../../src/kubelet-lite/validate.js';

type Obj = Record<string, unknown>;

function stored(object: Obj): StoredObject {
  const meta = (object.metadata ?? {}) as Obj;
  const namespace = typeof meta.namespace === 'string' ? meta.namespace : 'default';
  const name = String(meta.name ?? '');
  const kind = String(object.kind);
  return {
    apiVersion: String(object.apiVersion),
    kind,
    namespace,
    name,
    uid: objectUid('node', kind, namespace, name, object),
    object,
    source: { file: 'test.yaml', document: 0, line: 1 },
  };
}

/** A valid pod; `edit` changes the spec before validation. */
function podWith(edit: (spec: Obj, pod: Obj) => void = () => {}): StoredObject {
  const pod: Obj = {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: 'web', labels: { app: 'web' } },
    spec: { containers: [{ name: 'main', image: 'busybox:1.36' }] },
  };
  edit(pod.spec as Obj, pod);
  return stored(pod);
}
const c0 = (spec: Obj) => (spec.containers as Obj[])[0]!;

function valid(s: StoredObject): Pod {
  const r = validatePod(s);
  if (!r.ok) throw new Error(`expected a valid pod, got: ${r.reasons.join('; ')}`);
  return r.pod;
}
function reasons(s: StoredObject): string[] {
  const r = validatePod(s);
  return r.ok ? [] : r.reasons;
}

describe('validatePod defaults (SetDefaults_*)', () => {
  it('applies the pod and container defaults to a copy', () => {
    const s = podWith();
    const pod = valid(s);
    expect(pod.spec).toMatchObject({
      restartPolicy: 'Always',
      dnsPolicy: 'ClusterFirst',
      terminationGracePeriodSeconds: 30,
      enableServiceLinks: true,
      securityContext: {},
      schedulerName: 'default-scheduler',
    });
    expect(pod.spec!.containers[0]).toMatchObject({
      imagePullPolicy: 'IfNotPresent',
      terminationMessagePath: '/dev/termination-log',
      terminationMessagePolicy: 'File',
    });
    expect(pod.metadata).toMatchObject({ namespace: 'default', uid: s.uid, name: 'web' });
    // The stored object is untouched.
    expect((s.object.spec as Obj).restartPolicy).toBeUndefined();
    expect((s.object.metadata as Obj).uid).toBeUndefined();
  });

  it('keeps values that are given', () => {
    const pod = valid(
      podWith((spec) => {
        Object.assign(spec, { restartPolicy: 'Never', dnsPolicy: 'Default', terminationGracePeriodSeconds: 0, enableServiceLinks: false });
        Object.assign(c0(spec), { imagePullPolicy: 'Never', terminationMessagePath: '/tmp/msg', terminationMessagePolicy: 'FallbackToLogsOnError' });
      }),
    );
    expect(pod.spec).toMatchObject({ restartPolicy: 'Never', dnsPolicy: 'Default', terminationGracePeriodSeconds: 0, enableServiceLinks: false });
    expect(pod.spec!.containers[0]).toMatchObject({ imagePullPolicy: 'Never', terminationMessagePath: '/tmp/msg', terminationMessagePolicy: 'FallbackToLogsOnError' });
  });

  it.each([
    ['busybox', 'Always'],
    ['busybox:latest', 'Always'],
    ['busybox:1.36', 'IfNotPresent'],
    ['localhost:5000/busybox', 'Always'],
    ['localhost:5000/busybox:1.0', 'IfNotPresent'],
    [`busybox@sha256:${'a'.repeat(64)}`, 'IfNotPresent'],
    [`localhost:5000/busybox@sha256:${'a'.repeat(64)}`, 'IfNotPresent'],
  ])('imagePullPolicy for %s is %s', (image, want) => {
    expect(defaultPullPolicy(image)).toBe(want);
    const pod = valid(podWith((spec) => (c0(spec).image = image)));
    expect(pod.spec!.containers[0]!.imagePullPolicy).toBe(want);
  });

  it('defaults ports, probes, hooks, env field refs and requests from limits', () => {
    const pod = valid(
      podWith((spec) => {
        Object.assign(c0(spec), {
          ports: [{ containerPort: 80 }, { containerPort: 53, protocol: 'UDP' }],
          livenessProbe: { httpGet: { port: 80 } },
          readinessProbe: { grpc: { port: 9000 }, periodSeconds: 3 },
          startupProbe: { tcpSocket: { port: 'http-alt' } },
          lifecycle: { preStop: { httpGet: { port: 8080, path: '/quit' } } },
          env: [{ name: 'POD', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } }],
          resources: { limits: { cpu: '500m', memory: '64Mi' }, requests: { cpu: '100m' } },
        });
        spec.initContainers = [{ name: 'init', image: 'busybox', resources: { limits: { memory: '1Gi' } } }];
      }),
    );
    const c = pod.spec!.containers[0]!;
    expect(c.ports).toEqual([
      { containerPort: 80, protocol: 'TCP' },
      { containerPort: 53, protocol: 'UDP' },
    ]);
    expect(c.livenessProbe).toEqual({ httpGet: { port: 80, path: '/', scheme: 'HTTP' }, timeoutSeconds: 1, periodSeconds: 10, successThreshold: 1, failureThreshold: 3 });
    expect(c.readinessProbe).toEqual({ grpc: { port: 9000, service: '' }, timeoutSeconds: 1, periodSeconds: 3, successThreshold: 1, failureThreshold: 3 });
    expect(c.startupProbe!.failureThreshold).toBe(3);
    expect(c.lifecycle!.preStop!.httpGet).toEqual({ port: 8080, path: '/quit', scheme: 'HTTP' });
    expect(c.env![0]!.valueFrom!.fieldRef).toEqual({ fieldPath: 'metadata.name', apiVersion: 'v1' });
    expect(c.resources).toEqual({ limits: { cpu: '500m', memory: '64Mi' }, requests: { cpu: '100m', memory: '64Mi' } });
    expect(pod.spec!.initContainers![0]!.resources!.requests).toEqual({ memory: '1Gi' });
    expect(pod.spec!.initContainers![0]!.imagePullPolicy).toBe('Always');
  });

  it('accepts hostUsers false alone, and hostUsers true with the host namespaces', () => {
    expect(valid(podWith((spec) => (spec.hostUsers = false))).spec!.hostUsers).toBe(false);
    valid(podWith((spec) => ((spec.hostUsers = true), (spec.hostNetwork = true), (spec.hostPID = true), (spec.hostIPC = true))));
  });

  it('defaults host ports to container ports on the host network', () => {
    const pod = valid(
      podWith((spec) => {
        spec.hostNetwork = true;
        c0(spec).ports = [{ containerPort: 8080 }];
      }),
    );
    expect(pod.spec!.containers[0]!.ports![0]!.hostPort).toBe(8080);
  });

  it('defaults volumes: a volume without a source is an emptyDir, modes 0644, hostPath type ""', () => {
    const pod = valid(
      podWith((spec) => {
        spec.volumes = [
          { name: 'scratch' },
          { name: 'cm', configMap: { name: 'c' } },
          { name: 'sec', secret: { secretName: 's', defaultMode: 0o400 } },
          { name: 'dapi', downwardAPI: { items: [{ path: 'name', fieldRef: { fieldPath: 'metadata.name' } }] } },
          { name: 'proj', projected: { sources: [{ serviceAccountToken: { path: 't' } }, { downwardAPI: { items: [{ path: 'ns', fieldRef: { fieldPath: 'metadata.namespace' } }] } }] } },
          { name: 'host', hostPath: { path: '/var/log' } },
        ];
      }),
    );
    const v = pod.spec!.volumes!;
    expect(v[0]).toEqual({ name: 'scratch', emptyDir: {} });
    expect(v[1]!.configMap!.defaultMode).toBe(420);
    expect(v[2]!.secret!.defaultMode).toBe(0o400);
    expect(v[3]!.downwardAPI).toEqual({ defaultMode: 420, items: [{ path: 'name', fieldRef: { fieldPath: 'metadata.name', apiVersion: 'v1' } }] });
    expect(v[4]!.projected!.defaultMode).toBe(420);
    expect(v[4]!.projected!.sources![0]!.serviceAccountToken!.expirationSeconds).toBe(3600);
    expect(v[4]!.projected!.sources![1]!.downwardAPI!.items![0]!.fieldRef!.apiVersion).toBe('v1');
    expect(v[5]!.hostPath).toEqual({ path: '/var/log', type: '' });
  });
});

describe('validatePod validation (ValidatePod)', () => {
  const cases: [string, StoredObject, string][] = [
    ['a name that is not a DNS subdomain', podWith((_, p) => ((p.metadata as Obj).name = 'Web_1')), 'metadata.name: Invalid value: "Web_1"'],
    ['a name too long', podWith((_, p) => ((p.metadata as Obj).name = 'a'.repeat(254))), 'metadata.name: Invalid value'],
    ['a namespace that is not a DNS label', podWith((_, p) => ((p.metadata as Obj).namespace = 'a.b')), 'metadata.namespace: Invalid value: "a.b"'],
    ['a bad label value', podWith((_, p) => ((p.metadata as Obj).labels = { app: 'x y' })), 'metadata.labels: Invalid value: "x y"'],
    ['no spec', stored({ apiVersion: 'v1', kind: 'Pod', metadata: { name: 'a' } }), 'spec: Required value'],
    ['no containers', podWith((spec) => (spec.containers = [])), 'spec.containers: Required value'],
    ['containers missing', podWith((spec) => delete spec.containers), 'spec.containers: Required value'],
    ['a container without a name', podWith((spec) => delete c0(spec).name), 'spec.containers[0].name: Required value'],
    ['a container name that is not a DNS label', podWith((spec) => (c0(spec).name = 'Main')), 'spec.containers[0].name: Invalid value: "Main"'],
    [
      'a container name used twice across init and app containers',
      podWith((spec) => (spec.initContainers = [{ name: 'main', image: 'busybox' }])),
      'spec.containers[0].name: Duplicate value: "main"',
    ],
    [
      'the second container without an image',
      podWith((spec) => (spec.containers as Obj[]).push({ name: 'side' })),
      'spec.containers[1].image: Required value',
    ],
    ['an init container without an image', podWith((spec) => (spec.initContainers = [{ name: 'init' }])), 'spec.initContainers[0].image: Required value'],
    ['containerPort 0', podWith((spec) => (c0(spec).ports = [{ containerPort: 0 }])), 'spec.containers[0].ports[0].containerPort: Required value'],
    ['containerPort 70000', podWith((spec) => (c0(spec).ports = [{ containerPort: 70000 }])), 'spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive'],
    ['hostPort -1', podWith((spec) => (c0(spec).ports = [{ containerPort: 80, hostPort: -1 }])), 'spec.containers[0].ports[0].hostPort: Invalid value: -1'],
    [
      'a host port unlike the container port on the host network',
      podWith((spec) => ((spec.hostNetwork = true), (c0(spec).ports = [{ containerPort: 80, hostPort: 8080 }]))),
      'spec.containers[0].ports[0].hostPort: Invalid value: 8080: must match `containerPort` when `hostNetwork` is true',
    ],
    ['hostUsers false on the host network', podWith((spec) => ((spec.hostUsers = false), (spec.hostNetwork = true))), 'spec.hostNetwork: Forbidden: when `hostUsers` is false'],
    ['hostUsers false with the host PID namespace', podWith((spec) => ((spec.hostUsers = false), (spec.hostPID = true))), 'spec.hostPID: Forbidden: when `hostUsers` is false'],
    ['hostUsers false with the host IPC namespace', podWith((spec) => ((spec.hostUsers = false), (spec.hostIPC = true))), 'spec.hostIPC: Forbidden: when `hostUsers` is false'],
    ['hostUsers false on a windows pod', podWith((spec) => ((spec.hostUsers = false), (spec.os = { name: 'windows' }))), 'spec.hostUsers: Forbidden: cannot be set for a windows pod'],
    ['an env resourceFieldRef without a resource', podWith((spec) => (c0(spec).env = [{ name: 'A', valueFrom: { resourceFieldRef: {} } }])), 'spec.containers[0].env[0].valueFrom.resourceFieldRef.resource: Required value'],
    ['a huge invalid name, quoted short', podWith((_, p) => ((p.metadata as Obj).name = 'X'.repeat(100_000))), 'metadata.name: Invalid value: "XXXXXXXX'],
    ['protocol HTTP', podWith((spec) => (c0(spec).ports = [{ containerPort: 80, protocol: 'HTTP' }])), 'spec.containers[0].ports[0].protocol: Unsupported value: "HTTP": supported values: "SCTP", "TCP", "UDP"'],
    ['a bad port name', podWith((spec) => (c0(spec).ports = [{ containerPort: 80, name: 'http--x' }])), 'spec.containers[0].ports[0].name: Invalid value: "http--x"'],
    ['a duplicate port name', podWith((spec) => (c0(spec).ports = [{ containerPort: 80, name: 'http' }, { containerPort: 81, name: 'http' }])), 'spec.containers[0].ports[1].name: Duplicate value: "http"'],
    ['restartPolicy Sometimes', podWith((spec) => (spec.restartPolicy = 'Sometimes')), 'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"'],
    ['dnsPolicy Google', podWith((spec) => (spec.dnsPolicy = 'Google')), 'spec.dnsPolicy: Unsupported value: "Google"'],
    ['dnsPolicy None without nameservers', podWith((spec) => (spec.dnsPolicy = 'None')), 'spec.dnsConfig: Required value'],
    ['imagePullPolicy Sometimes', podWith((spec) => (c0(spec).imagePullPolicy = 'Sometimes')), 'spec.containers[0].imagePullPolicy: Unsupported value: "Sometimes": supported values: "Always", "IfNotPresent", "Never"'],
    ['terminationMessagePolicy wrong', podWith((spec) => (c0(spec).terminationMessagePolicy = 'Logs')), 'spec.containers[0].terminationMessagePolicy: Unsupported value: "Logs"'],
    ['a probe with no handler', podWith((spec) => (c0(spec).livenessProbe = { periodSeconds: 5 })), 'spec.containers[0].livenessProbe: Required value: must specify a handler type'],
    [
      'a probe with two handlers',
      podWith((spec) => (c0(spec).readinessProbe = { exec: { command: ['true'] }, tcpSocket: { port: 80 } })),
      'spec.containers[0].readinessProbe.tcpSocket: Forbidden: may not specify more than 1 handler type',
    ],
    ['a hook with no handler', podWith((spec) => (c0(spec).lifecycle = { postStart: {} })), 'spec.containers[0].lifecycle.postStart: Required value: must specify a handler type'],
    [
      'a hook with two handlers',
      podWith((spec) => (c0(spec).lifecycle = { preStop: { exec: { command: ['x'] }, sleep: { seconds: 1 } } })),
      'spec.containers[0].lifecycle.preStop.sleep: Forbidden: may not specify more than 1 handler type',
    ],
    ['an exec probe without a command', podWith((spec) => (c0(spec).livenessProbe = { exec: {} })), 'spec.containers[0].livenessProbe.exec.command: Required value'],
    ['an httpGet probe without a port', podWith((spec) => (c0(spec).livenessProbe = { httpGet: { path: '/' } })), 'spec.containers[0].livenessProbe.httpGet.port: Required value'],
    ['an httpGet probe with port 0', podWith((spec) => (c0(spec).livenessProbe = { httpGet: { port: 0 } })), 'spec.containers[0].livenessProbe.httpGet.port: Invalid value: 0'],
    ['an httpGet scheme FTP', podWith((spec) => (c0(spec).livenessProbe = { httpGet: { port: 80, scheme: 'FTP' } })), 'spec.containers[0].livenessProbe.httpGet.scheme: Unsupported value: "FTP"'],
    ['a negative probe period', podWith((spec) => (c0(spec).readinessProbe = { exec: { command: ['x'] }, periodSeconds: -1 })), 'spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1'],
    ['liveness successThreshold 2', podWith((spec) => (c0(spec).livenessProbe = { exec: { command: ['x'] }, successThreshold: 2 })), 'spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1'],
    ['startup successThreshold 3', podWith((spec) => (c0(spec).startupProbe = { exec: { command: ['x'] }, successThreshold: 3 })), 'spec.containers[0].startupProbe.successThreshold: Invalid value: 3: must be 1'],
    [
      'a readiness probe on an init container',
      podWith((spec) => (spec.initContainers = [{ name: 'init', image: 'busybox', readinessProbe: { exec: { command: ['x'] } } }])),
      'spec.initContainers[0].readinessProbe: Forbidden: may not be set for init containers without restartPolicy=Always',
    ],
    [
      'a liveness probe on an init container',
      podWith((spec) => (spec.initContainers = [{ name: 'init', image: 'busybox', livenessProbe: { exec: { command: ['x'] } } }])),
      'spec.initContainers[0].livenessProbe: Forbidden',
    ],
    [
      'an init container restartPolicy Never',
      podWith((spec) => (spec.initContainers = [{ name: 'init', image: 'busybox', restartPolicy: 'Never' }])),
      'spec.initContainers[0].restartPolicy: Unsupported value: "Never": supported values: "Always"',
    ],
    ['restartPolicy on an app container', podWith((spec) => (c0(spec).restartPolicy = 'Always')), 'spec.containers[0].restartPolicy: Forbidden'],
    ['a volume name used twice', podWith((spec) => (spec.volumes = [{ name: 'v', emptyDir: {} }, { name: 'v', emptyDir: {} }])), 'spec.volumes[1].name: Duplicate value: "v"'],
    ['a volume name that is not a DNS label', podWith((spec) => (spec.volumes = [{ name: 'My_Vol', emptyDir: {} }])), 'spec.volumes[0].name: Invalid value: "My_Vol"'],
    ['a volume without a name', podWith((spec) => (spec.volumes = [{ emptyDir: {} }])), 'spec.volumes[0].name: Required value'],
    [
      'a volume with two sources',
      podWith((spec) => (spec.volumes = [{ name: 'v', emptyDir: {}, hostPath: { path: '/tmp' } }])),
      'spec.volumes[0].hostPath: Forbidden: may not specify more than 1 volume type',
    ],
    ['a hostPath type Pipe', podWith((spec) => (spec.volumes = [{ name: 'v', hostPath: { path: '/tmp', type: 'Pipe' } }])), 'spec.volumes[0].hostPath.type: Unsupported value: "Pipe"'],
    ['a hostPath without a path', podWith((spec) => (spec.volumes = [{ name: 'v', hostPath: {} }])), 'spec.volumes[0].hostPath.path: Required value'],
    ['a configMap volume without a name', podWith((spec) => (spec.volumes = [{ name: 'v', configMap: {} }])), 'spec.volumes[0].configMap.name: Required value'],
    ['a secret volume without secretName', podWith((spec) => (spec.volumes = [{ name: 'v', secret: {} }])), 'spec.volumes[0].secret.secretName: Required value'],
    ['a defaultMode of 01000', podWith((spec) => (spec.volumes = [{ name: 'v', configMap: { name: 'c', defaultMode: 0o1000 } }])), 'spec.volumes[0].configMap.defaultMode: Invalid value: 512'],
    ['an item path with ..', podWith((spec) => (spec.volumes = [{ name: 'v', configMap: { name: 'c', items: [{ key: 'k', path: '../x' }] } }])), 'spec.volumes[0].configMap.items[0].path: Invalid value: "../x"'],
    ['a mount of a volume that does not exist', podWith((spec) => (c0(spec).volumeMounts = [{ name: 'nope', mountPath: '/x' }])), 'spec.containers[0].volumeMounts[0].name: Not found: "nope"'],
    ['a mount without a path', podWith((spec) => ((spec.volumes = [{ name: 'v' }]), (c0(spec).volumeMounts = [{ name: 'v' }]))), 'spec.containers[0].volumeMounts[0].mountPath: Required value'],
    [
      'two mounts on one path',
      podWith((spec) => ((spec.volumes = [{ name: 'v' }]), (c0(spec).volumeMounts = [{ name: 'v', mountPath: '/x' }, { name: 'v', mountPath: '/x' }]))),
      'spec.containers[0].volumeMounts[1].mountPath: Invalid value: "/x": must be unique',
    ],
    ['a subPath with ..', podWith((spec) => ((spec.volumes = [{ name: 'v' }]), (c0(spec).volumeMounts = [{ name: 'v', mountPath: '/x', subPath: 'a/../../b' }]))), 'spec.containers[0].volumeMounts[0].subPath: Invalid value'],
    ['a hostPath with ..', podWith((spec) => (spec.volumes = [{ name: 'v', hostPath: { path: '/var/lib/../../etc' } }])), `spec.volumes[0].hostPath.path: Invalid value: "/var/lib/../../etc": must not contain '..'`],
    [
      'a Localhost seccomp profile that climbs out of the seccomp directory',
      podWith((spec) => (spec.securityContext = { seccompProfile: { type: 'Localhost', localhostProfile: '../../../../../../etc/shadow' } })),
      `spec.securityContext.seccompProfile.localhostProfile: Invalid value: "../../../../../../etc/shadow": must not contain '..'`,
    ],
    [
      'an absolute Localhost seccomp profile on a container',
      podWith((spec) => (c0(spec).securityContext = { seccompProfile: { type: 'Localhost', localhostProfile: '/etc/shadow' } })),
      'spec.containers[0].securityContext.seccompProfile.localhostProfile: Invalid value: "/etc/shadow": must be a relative path',
    ],
    ['a Localhost seccomp profile without its file', podWith((spec) => (spec.securityContext = { seccompProfile: { type: 'Localhost' } })), 'spec.securityContext.seccompProfile.localhostProfile: Required value'],
    ['an unknown seccomp type', podWith((spec) => (spec.securityContext = { seccompProfile: { type: 'Lax' } })), 'spec.securityContext.seccompProfile.type: Unsupported value: "Lax"'],
    [
      'a profile file on a RuntimeDefault seccomp profile',
      podWith((spec) => (spec.securityContext = { seccompProfile: { type: 'RuntimeDefault', localhostProfile: 'p.json' } })),
      'spec.securityContext.seccompProfile.localhostProfile: Invalid value: "p.json": can only be set when seccomp type is Localhost',
    ],
    [
      'more than 100 containers',
      podWith((spec) => {
        spec.containers = Array.from({ length: 90 }, (_, i) => ({ name: `c${i}`, image: 'busybox' }));
        spec.initContainers = Array.from({ length: 11 }, (_, i) => ({ name: `i${i}`, image: 'busybox' }));
      }),
      'spec.containers: Too many: 101: a pod may have at most 100 containers and init containers together',
    ],
    ['an env var name with =', podWith((spec) => (c0(spec).env = [{ name: 'A=B', value: 'x' }])), 'spec.containers[0].env[0].name: Invalid value: "A=B"'],
    ['an env var name starting with a digit', podWith((spec) => (c0(spec).env = [{ name: '1A' }])), 'spec.containers[0].env[0].name: Invalid value: "1A"'],
    ['an env var without a name', podWith((spec) => (c0(spec).env = [{ value: 'x' }])), 'spec.containers[0].env[0].name: Required value'],
    [
      'an env var with value and valueFrom',
      podWith((spec) => (c0(spec).env = [{ name: 'A', value: 'x', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } }])),
      'spec.containers[0].env[0].valueFrom: Invalid value: "": may not be specified when `value` is not empty',
    ],
    [
      'an env fieldRef to an unknown field',
      podWith((spec) => (c0(spec).env = [{ name: 'A', valueFrom: { fieldRef: { fieldPath: 'spec.secret' } } }])),
      'spec.containers[0].env[0].valueFrom.fieldRef.fieldPath: Unsupported value: "spec.secret"',
    ],
    [
      'a configMapKeyRef without a key',
      podWith((spec) => (c0(spec).env = [{ name: 'A', valueFrom: { configMapKeyRef: { name: 'c' } } }])),
      'spec.containers[0].env[0].valueFrom.configMapKeyRef.key: Required value',
    ],
    ['a quantity that does not parse', podWith((spec) => (c0(spec).resources = { limits: { cpu: 'lots' } })), 'spec.containers[0].resources.limits.cpu: Invalid value: "lots": quantities must match'],
    [
      'requests above limits',
      podWith((spec) => (c0(spec).resources = { limits: { cpu: '500m' }, requests: { cpu: '1' } })),
      'spec.containers[0].resources.requests: Invalid value: "1": must be less than or equal to cpu limit of 500m',
    ],
    ['a negative quantity', podWith((spec) => (c0(spec).resources = { requests: { memory: '-1Mi' } })), 'spec.containers[0].resources.requests.memory: Invalid value: "-1Mi": must be greater than or equal to 0'],
    [
      'pod-level requests above limits',
      podWith((spec) => (spec.resources = { limits: { memory: '1Gi' }, requests: { memory: '2Gi' } })),
      'spec.resources.requests: Invalid value: "2Gi": must be less than or equal to memory limit of 1Gi',
    ],
    ['imagePullSecrets a string', podWith((spec) => (spec.imagePullSecrets = 'regcred')), 'spec.imagePullSecrets: Invalid type: expected array, got string'],
    ['a negative grace period', podWith((spec) => (spec.terminationGracePeriodSeconds = -5)), 'spec.terminationGracePeriodSeconds: Invalid value: -5'],
    ['a bad hostname', podWith((spec) => (spec.hostname = 'Not_A_Label')), 'spec.hostname: Invalid value: "Not_A_Label"'],
    ['a host alias without a valid IP', podWith((spec) => (spec.hostAliases = [{ ip: 'banana', hostnames: ['a'] }])), 'spec.hostAliases[0].ip: Invalid value: "banana"'],
  ];
  it.each(cases)('rejects %s', (_, s, want) => {
    const got = reasons(s);
    expect(got.some((r) => r.startsWith(want)), `reasons: ${JSON.stringify(got)}`).toBe(true);
  });

  it('reports a missing image once, without noise about the pull policy', () => {
    expect(reasons(podWith((spec) => delete c0(spec).image))).toEqual(['spec.containers[0].image: Required value']);
  });

  it('quotes values cut short in reasons', () => {
    const got = reasons(podWith((_, p) => ((p.metadata as Obj).name = 'X'.repeat(100_000))));
    expect(got.join('').length).toBeLessThan(400);
  });

  it('accepts sidecars (init containers with restartPolicy Always) with probes and hooks', () => {
    const pod = valid(
      podWith((spec) => {
        spec.initContainers = [
          {
            name: 'proxy',
            image: 'busybox',
            restartPolicy: 'Always',
            readinessProbe: { tcpSocket: { port: 15000 } },
            startupProbe: { exec: { command: ['true'] } },
            lifecycle: { preStop: { sleep: { seconds: 2 } } },
          },
        ];
        c0(spec).readinessProbe = { httpGet: { port: 'http' }, successThreshold: 3 };
        c0(spec).ports = [{ name: 'http', containerPort: 8080 }];
      }),
    );
    expect(pod.spec!.initContainers![0]!.readinessProbe!.timeoutSeconds).toBe(1);
  });

  it('lets unknown fields through (non-strict decoding)', () => {
    const pod = valid(
      podWith((spec, p) => {
        spec.someFutureField = { x: 1 };
        c0(spec).alsoUnknown = [1, 2];
        p.status = { phase: 'Running' };
      }),
    );
    expect((pod.spec as unknown as Obj).someFutureField).toEqual({ x: 1 });
  });

  it.each([
    ['containers a string', (spec: Obj) => (spec.containers = 'x'), 'spec.containers: Invalid type: expected array, got string'],
    ['a container a string', (spec: Obj) => (spec.containers = ['x']), 'spec.containers[0]: Invalid type: expected object, got string'],
    ['containerPort a string', (spec: Obj) => (c0(spec).ports = [{ containerPort: '80' }]), 'spec.containers[0].ports[0].containerPort: Invalid type: expected integer, got string'],
    ['ports an object', (spec: Obj) => (c0(spec).ports = { containerPort: 80 }), 'spec.containers[0].ports: Invalid type: expected array, got object'],
    ['command a string', (spec: Obj) => (c0(spec).command = 'sleep 1'), 'spec.containers[0].command: Invalid type: expected array, got string'],
    ['an arg a number', (spec: Obj) => (c0(spec).args = ['a', 1]), 'spec.containers[0].args[1]: Invalid type: expected string, got number'],
    ['env a map', (spec: Obj) => (c0(spec).env = { A: 'b' }), 'spec.containers[0].env: Invalid type: expected array, got object'],
    ['an env value a number', (spec: Obj) => (c0(spec).env = [{ name: 'A', value: 1 }]), 'spec.containers[0].env[0].value: Invalid type: expected string, got number'],
    ['image a number', (spec: Obj) => (c0(spec).image = 3), 'spec.containers[0].image: Invalid type: expected string, got number'],
    ['grace period a string', (spec: Obj) => (spec.terminationGracePeriodSeconds = '30'), 'spec.terminationGracePeriodSeconds: Invalid type: expected integer, got string'],
    ['grace period fractional', (spec: Obj) => (spec.terminationGracePeriodSeconds = 1.5), 'spec.terminationGracePeriodSeconds: Invalid value: 1.5: must be an integer'],
    ['hostNetwork a string', (spec: Obj) => (spec.hostNetwork = 'yes please'), 'spec.hostNetwork: Invalid type: expected boolean, got string'],
    ['volumes an object', (spec: Obj) => (spec.volumes = { a: {} }), 'spec.volumes: Invalid type: expected array, got object'],
    ['probe port a list', (spec: Obj) => (c0(spec).livenessProbe = { tcpSocket: { port: [80] } }), 'spec.containers[0].livenessProbe.tcpSocket.port: Invalid type: expected integer or string, got array'],
    ['limits a list', (spec: Obj) => (c0(spec).resources = { limits: ['1'] }), 'spec.containers[0].resources.limits: Invalid type: expected object, got array'],
    ['a label value a number', (_: Obj, p: Obj) => ((p.metadata as Obj).labels = { a: 1 }), 'metadata.labels.a: Invalid type: expected string, got number'],
    ['spec a list', (_: Obj, p: Obj) => (p.spec = []), 'spec: Invalid type: expected object, got array'],
    ['securityContext a string', (spec: Obj) => (spec.securityContext = 'privileged'), 'spec.securityContext: Invalid type: expected object, got string'],
    ['runAsUser a string', (spec: Obj) => (c0(spec).securityContext = { runAsUser: 'root' }), 'spec.containers[0].securityContext.runAsUser: Invalid type: expected integer, got string'],
  ] as [string, (spec: Obj, pod: Obj) => void, string][])('reports a type error, never a crash: %s', (_, edit, want) => {
    let got: string[] = [];
    expect(() => (got = reasons(podWith(edit)))).not.toThrow();
    expect(got, JSON.stringify(got)).toContain(want);
  });

  it('never throws on any value in any field it reads', () => {
    const junk = [null, 0, -1, 1.5, '', 'x', true, [], [null], {}, { a: null }, [[1]]];
    const fields = ['containers', 'initContainers', 'volumes', 'restartPolicy', 'dnsConfig', 'hostAliases', 'securityContext', 'dnsPolicy'];
    const cfields = ['name', 'image', 'ports', 'env', 'envFrom', 'resources', 'volumeMounts', 'livenessProbe', 'lifecycle', 'securityContext'];
    for (const j of junk) {
      for (const f of fields) expect(() => validatePod(podWith((spec) => (spec[f] = j)))).not.toThrow();
      for (const f of cfields) expect(() => validatePod(podWith((spec) => (c0(spec)[f] = j)))).not.toThrow();
    }
  });

  it('refuses an object that is not a v1 Pod', () => {
    const r = validatePod(stored({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'x' } }));
    expect(r.ok).toBe(false);
  });

  it('is what the manifest loader applies: an invalid pod is a problem at its line', () => {
    const m = parseManifest('p.yaml', 'apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  restartPolicy: Sometimes\n  containers:\n  - {name: c, image: x}\n');
    expect(m.problems).toEqual([
      { file: 'p.yaml', line: 5, object: 'Pod/default/p', reason: 'spec.restartPolicy: Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"' },
    ]);
  });
});

describe('quantities', () => {
  it.each([
    ['100m', 0.1],
    ['1.5', 1.5],
    ['64Mi', 64 * 1024 * 1024],
    ['1Ki', 1024],
    ['1G', 1e9],
    ['2e3', 2000],
    ['1E', 1e18],
    ['5n', 5e-9],
    ['250u', 250e-6],
    ['.5', 0.5],
    ['+3k', 3000],
    ['-1', -1],
    ['1.5Gi', 1.5 * 2 ** 30],
    [2, 2],
  ] as [string | number, number][])('%s is %d', (q, want) => {
    expect(parseQuantity(q)).toBeCloseTo(want, 12);
    expect(tryParseQuantity(q)).toBeCloseTo(want, 12);
  });

  it.each(['', 'lots', '1.2.3', '1KB', '1 Mi', 'Mi', '1e', '0x10', '1mi', '--1'])('%j is not a quantity', (q) => {
    expect(tryParseQuantity(q)).toBeUndefined();
    expect(() => parseQuantity(q)).toThrow(/quantity/);
  });

  it.each([
    ['100m', 100],
    ['0.3', 300],
    ['1', 1000],
    ['1.5', 1500],
    ['0.0001', 1],
    ['250m', 250],
  ])('milli value of %s is %d (rounded up)', (q, want) => {
    expect(parseMilliQuantity(q)).toBe(want);
  });
});

describe('validateConfigMap / validateSecret', () => {
  it('accepts good objects and defaults them', () => {
    const cm = validateConfigMap(stored({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' } }));
    expect(cm.ok && cm.configMap.data).toEqual({});
    const s = validateSecret(stored({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 's' }, data: { 'tls.crt': 'aGVs\nbG8=' }, stringData: { x: 'y' } }));
    expect(s.ok && s.secret).toMatchObject({ type: 'Opaque', data: { 'tls.crt': 'aGVsbG8=', x: 'eQ==' } });
  });

  it.each([
    [{ data: { 'a/b': 'x' } }, 'data: Invalid value: "a/b"'],
    [{ data: { '..x': 'x' } }, 'data: Invalid value: "..x"'],
    [{ data: { a: 1 } }, 'data.a: Invalid type: expected string, got number'],
    [{ data: 'x' }, 'data: Invalid type: expected object, got string'],
    [{ data: { a: 'x' }, binaryData: { a: 'eA==' } }, 'data: Invalid value: "a": duplicate of key present in binaryData'],
    [{ binaryData: { b: 'not base64!' } }, 'binaryData.b: Invalid value'],
  ])('rejects the ConfigMap %j', (extra, want) => {
    const r = validateConfigMap(stored({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'c' }, ...extra }));
    expect(r.ok ? [] : r.reasons).toContainEqual(expect.stringContaining(want));
  });

  it.each([
    [{ data: { a: 'not base64!' } }, 'data.a: Invalid value: "<secret data>": illegal base64 data'],
    [{ data: { a: 'aGVsbG8' } }, 'data.a: Invalid value'],
    [{ data: { 'a b': 'eA==' } }, 'data: Invalid value: "a b"'],
    [{ stringData: { k: 5 } }, 'stringData.k: Invalid type'],
  ])('rejects the Secret %j without echoing its value', (extra, want) => {
    const r = validateSecret(stored({ apiVersion: 'v1', kind: 'Secret', metadata: { name: 's' }, ...extra }));
    const got = r.ok ? [] : r.reasons;
    expect(got).toContainEqual(expect.stringContaining(want));
    expect(got.join()).not.toContain('not base64');
  });
});

describe('podKey', () => {
  it('joins namespace and name', () => {
    expect(podKey('kube-system', 'etcd')).toBe('kube-system/etcd');
  });
});
