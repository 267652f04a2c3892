import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { ConfigMap, Container, Pod, Secret, Service } from 'kubernetes-types/core/v1.js';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { containerLogIn, KubeletConfigBuilder, pinSubpath, podHostname, safeSubpath, terminationLogHostPath } from '../../src/kubelet-lite/cri-config.js';
import { parseResolvConf, podDnsConfig } from '../../src/kubelet-lite/dns.js';
import { expand, formatMap, resolveEnv } from '../../src/kubelet-lite/env.js';
import { umount2 } from '../../src/sys/libc.js';
import { ContainerConfigError, type ContainerConfigOptions, type ObjectLookup, type PodContext } from '../../src/kubelet-lite/model.js';
import { containerResources, oomScoreAdj, qosClass, quantityMilli, quantityValue, resourceFieldValue } from '../../src/kubelet-lite/resources.js';
import { parseExact as parseQuantity } from '../../src/kubelet-lite/quantity.js';

const GiB = 1024 ** 3;
const node = { milliCpu: 4000, memoryBytes: 8 * GiB };

function lookup(configMaps: ConfigMap[] = [], secrets: Secret[] = []): ObjectLookup {
  const key = (o: { metadata?: { namespace?: string; name?: string } }) => `${o.metadata?.namespace ?? 'default'}/${o.metadata?.name}`;
  return {
    get: () => undefined,
    list: () => [],
    configMap: (ns, name) => configMaps.find((c) => key(c) === `${ns}/${name}`),
    secret: (ns, name) => secrets.find((s) => key(s) === `${ns}/${name}`),
  };
}

const b64 = (s: string) => Buffer.from(s).toString('base64');

const objects = lookup(
  [
    { metadata: { name: 'app-config', namespace: 'shop' }, data: { LEVEL: 'debug', 'bad key': 'x', '1ST': 'y', mode: 'fast' } },
    { metadata: { name: 'other', namespace: 'default' }, data: { K: 'wrong namespace' } },
  ],
  [{ metadata: { name: 'creds', namespace: 'shop' }, data: { password: b64('s3cr3t'), token: b64('tok') } }],
);

let podDir: string;
let tmp: string;
beforeEach(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kl-config-'));
  podDir = path.join(tmp, 'pods', 'uid-1');
  fs.mkdirSync(podDir, { recursive: true });
});
afterEach(() => fs.rmSync(tmp, { recursive: true, force: true }));

function ctx(pod: Pod, over: Partial<PodContext> = {}): PodContext {
  return {
    pod,
    uid: 'uid-1',
    nodeName: 'node-a',
    hostIP: '10.0.0.5',
    podIP: '10.88.0.7',
    clusterDomain: 'cluster.local',
    clusterDNS: ['10.96.0.10'],
    hostResolvConf: 'nameserver 192.168.1.1\nsearch corp.example lab.example\noptions timeout:2\n',
    podDir,
    objects,
    ...over,
  };
}

function opts(over: Partial<ContainerConfigOptions> = {}): ContainerConfigOptions {
  return { kind: 'app', restartCount: 0, image: 'sha256:abc', volumes: new Map(), ...over };
}

// subPath binds are recorded nowhere here: the pinning itself has its own tests below.
const builder = new KubeletConfigBuilder({ node, seccompProfileRoot: '/var/lib/kl/seccomp', pinSubpath: () => undefined });

function webPod(): Pod {
  return {
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: 'web', namespace: 'shop', labels: { app: 'web' }, annotations: { note: 'hi' } },
    spec: {
      restartPolicy: 'Always',
      dnsPolicy: 'ClusterFirst',
      terminationGracePeriodSeconds: 30,
      securityContext: { runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000], sysctls: [{ name: 'net.ipv4.ip_unprivileged_port_start', value: '0' }] },
      volumes: [{ name: 'conf', configMap: { name: 'app-config', defaultMode: 420 } }, { name: 'scratch', emptyDir: {} }],
      containers: [
        {
          name: 'main',
          image: 'busybox',
          imagePullPolicy: 'IfNotPresent',
          command: ['sh', '-c', 'echo $(GREETING) $$(NOT) $(MISSING)'],
          args: ['$(LEVEL)'],
          workingDir: '/data',
          ports: [
            { containerPort: 8080, hostPort: 18080, protocol: 'TCP' },
            { containerPort: 9090, protocol: 'TCP' },
          ],
          env: [
            { name: 'GREETING', value: 'hello' },
            { name: 'LEVEL', valueFrom: { configMapKeyRef: { name: 'app-config', key: 'LEVEL' } } },
            { name: 'MSG', value: '$(GREETING)-$(LEVEL)' },
            { name: 'POD', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
          ],
          resources: { requests: { cpu: '250m', memory: '256Mi' }, limits: { cpu: '500m', memory: '512Mi' } },
          volumeMounts: [
            { name: 'conf', mountPath: '/etc/app' },
            { name: 'scratch', mountPath: '/data', mountPropagation: 'HostToContainer' },
          ],
          securityContext: { allowPrivilegeEscalation: false, capabilities: { add: ['NET_ADMIN'], drop: ['ALL'] }, readOnlyRootFilesystem: true },
          terminationMessagePath: '/dev/termination-log',
          terminationMessagePolicy: 'File',
        },
      ],
    },
  };
}

describe('sandbox config', () => {
  it('matches the golden config for a ClusterFirst pod with a host port and sysctls', () => {
    expect(builder.sandboxConfig(ctx(webPod()), 2)).toEqual({
      metadata: { name: 'web', namespace: 'shop', uid: 'uid-1', attempt: 2 },
      hostname: 'web',
      logDirectory: path.join(podDir, 'logs'),
      dnsConfig: {
        servers: ['10.96.0.10'],
        searches: ['shop.svc.cluster.local', 'svc.cluster.local', 'cluster.local', 'corp.example', 'lab.example'],
        options: ['ndots:5'],
      },
      portMappings: [{ protocol: 'TCP', containerPort: 8080, hostPort: 18080, hostIp: '' }],
      labels: {
        app: 'web',
        'io.kubernetes.pod.name': 'web',
        'io.kubernetes.pod.namespace': 'shop',
        'io.kubernetes.pod.uid': 'uid-1',
        'io.skiff.kubelet-lite/managed': 'true',
        'io.skiff.kubelet-lite/node': 'node-a',
      },
      annotations: { note: 'hi' },
      linux: {
        cgroupParent: '',
        sysctls: { 'net.ipv4.ip_unprivileged_port_start': '0' },
        securityContext: {
          namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' },
          runAsUser: { value: 1000 },
          runAsGroup: { value: 3000 },
          supplementalGroups: [2000, 4000],
          privileged: false,
          seccomp: { profileType: 'Unconfined' },
        },
      },
    });
  });

  it.each([
    [{ hostNetwork: true }, { network: 'NODE', pid: 'CONTAINER', ipc: 'POD' }],
    [{ hostPID: true, hostIPC: true }, { network: 'POD', pid: 'NODE', ipc: 'NODE' }],
    [{ shareProcessNamespace: true }, { network: 'POD', pid: 'POD', ipc: 'POD' }],
  ])('namespaces for %j', (spec, want) => {
    const pod = webPod();
    Object.assign(pod.spec!, spec);
    expect(builder.sandboxConfig(ctx(pod), 0).linux?.securityContext?.namespaceOptions).toEqual(want);
    expect(builder.containerConfig(ctx(pod), pod.spec!.containers[0], opts({ volumes: vols() })).linux?.securityContext?.namespaceOptions).toEqual(want);
  });

  it('gives a hostUsers:false pod and each of its containers the user namespace of its allocated range', () => {
    const pod = webPod();
    pod.spec!.hostUsers = false;
    const range = { hostId: 131072, containerId: 0, length: 65536 };
    const want = { network: 'POD', pid: 'CONTAINER', ipc: 'POD', usernsOptions: { mode: 'POD', uids: [range], gids: [range] } };
    const c = ctx(pod, { userns: { hostId: 131072, length: 65536 } });
    expect(builder.sandboxConfig(c, 0).linux?.securityContext?.namespaceOptions).toEqual(want);
    for (const spec of [pod.spec!.containers[0]!, { name: 'init', image: 'busybox' }]) {
      expect(builder.containerConfig(c, spec, opts({ volumes: vols() })).linux?.securityContext?.namespaceOptions).toEqual(want);
    }
    // The uid and gid lists are separate objects (a caller changing one must not change the other).
    const opt = builder.sandboxConfig(c, 0).linux?.securityContext?.namespaceOptions?.usernsOptions;
    expect(opt?.uids?.[0]).not.toBe(opt?.gids?.[0]);
  });

  it('never configures a hostUsers:false pod without a range (it would run in the host user namespace)', () => {
    const pod = webPod();
    pod.spec!.hostUsers = false;
    expect(() => builder.sandboxConfig(ctx(pod), 0)).toThrow(ContainerConfigError);
    expect(() => builder.containerConfig(ctx(pod), pod.spec!.containers[0]!, opts({ volumes: vols() }))).toThrow(/no user namespace range has been allocated/);
  });

  it('asks for the node user namespace for hostUsers:true, and says nothing when it is unset', () => {
    const pod = webPod();
    pod.spec!.hostUsers = true;
    expect(builder.sandboxConfig(ctx(pod, { userns: { hostId: 65536, length: 65536 } }), 0).linux?.securityContext?.namespaceOptions?.usernsOptions).toEqual({ mode: 'NODE', uids: [], gids: [] });
    expect(builder.sandboxConfig(ctx(webPod()), 0).linux?.securityContext?.namespaceOptions).not.toHaveProperty('usernsOptions');
  });

  it('uses spec.hostname, cuts long names to 63 without a trailing dash, and leaves the host name to host-network pods', () => {
    expect(podHostname({ metadata: { name: 'p' }, spec: { hostname: 'h1', containers: [] } })).toBe('h1');
    const long = 'a'.repeat(62) + '-b' + 'c'.repeat(10);
    expect(podHostname({ metadata: { name: long }, spec: { containers: [] } })).toBe('a'.repeat(62));
    const pod = webPod();
    pod.spec!.hostNetwork = true;
    expect(builder.sandboxConfig(ctx(pod), 0).hostname).toBe('');
  });

  it('setHostnameAsFQDN gives the kernel the FQDN, refused beyond 64 characters', () => {
    const pod = webPod();
    pod.spec!.subdomain = 'web';
    expect(builder.sandboxConfig(ctx(pod), 0).hostname).toBe('web');
    pod.spec!.setHostnameAsFQDN = true;
    expect(builder.sandboxConfig(ctx(pod), 0).hostname).toBe('web.web.shop.svc.cluster.local');
    pod.spec!.hostname = 'h'.repeat(40);
    expect(() => builder.sandboxConfig(ctx(pod), 0)).toThrow(/FQDN .* is too long \(64 characters is the max, 67 characters requested\)/);
  });

  it('is privileged when any container is, and takes the pod seccomp profile', () => {
    const pod = webPod();
    pod.spec!.initContainers = [{ name: 'init', image: 'busybox', securityContext: { privileged: true } }];
    pod.spec!.securityContext = { seccompProfile: { type: 'RuntimeDefault' } };
    const sc = builder.sandboxConfig(ctx(pod), 0).linux?.securityContext;
    expect(sc?.privileged).toBe(true);
    expect(sc?.seccomp).toEqual({ profileType: 'RuntimeDefault' });
  });
});

function vols(): Map<string, string> {
  const conf = path.join(podDir, 'volumes', 'kubernetes.io~configmap', 'conf');
  const scratch = path.join(podDir, 'volumes', 'kubernetes.io~empty-dir', 'scratch');
  fs.mkdirSync(conf, { recursive: true });
  fs.mkdirSync(scratch, { recursive: true });
  return new Map([
    ['conf', conf],
    ['scratch', scratch],
  ]);
}

describe('container config', () => {
  it('matches the golden config for a representative container', () => {
    const volumes = vols();
    const etcHosts = path.join(podDir, 'etc-hosts');
    const cfg = builder.containerConfig(ctx(webPod()), webPod().spec!.containers[0], opts({ restartCount: 3, volumes, etcHosts }));
    const hash = cfg.annotations?.['io.kubernetes.container.hash'];
    expect(hash).toMatch(/^[0-9a-f]+$/);
    expect(cfg).toEqual({
      metadata: { name: 'main', attempt: 3 },
      image: { image: 'sha256:abc', userSpecifiedImage: 'busybox' },
      command: ['sh', '-c', 'echo hello $(NOT) $(MISSING)'],
      args: ['debug'],
      workingDir: '/data',
      envs: [
        { key: 'GREETING', value: Buffer.from('hello') },
        { key: 'LEVEL', value: Buffer.from('debug') },
        { key: 'MSG', value: Buffer.from('hello-debug') },
        { key: 'POD', value: Buffer.from('web') },
      ],
      mounts: [
        { containerPath: '/etc/app', hostPath: volumes.get('conf'), readonly: true, propagation: 'PROPAGATION_PRIVATE' },
        { containerPath: '/data', hostPath: volumes.get('scratch'), readonly: false, propagation: 'PROPAGATION_HOST_TO_CONTAINER' },
        { containerPath: '/etc/hosts', hostPath: etcHosts, readonly: false, propagation: 'PROPAGATION_PRIVATE' },
        { containerPath: '/dev/termination-log', hostPath: terminationLogHostPath(podDir, 'main', 3), readonly: false, propagation: 'PROPAGATION_PRIVATE' },
      ],
      labels: {
        'io.kubernetes.container.name': 'main',
        'io.kubernetes.pod.name': 'web',
        'io.kubernetes.pod.namespace': 'shop',
        'io.kubernetes.pod.uid': 'uid-1',
        'io.skiff.kubelet-lite/managed': 'true',
        'io.skiff.kubelet-lite/node': 'node-a',
        'io.skiff.kubelet-lite/container-type': 'app',
      },
      annotations: {
        'io.kubernetes.container.hash': hash,
        'io.kubernetes.container.restartCount': '3',
        'io.skiff.kubelet-lite/image': 'busybox',
        'io.kubernetes.container.terminationMessagePath': '/dev/termination-log',
        'io.kubernetes.container.terminationMessagePolicy': 'File',
        'io.kubernetes.pod.terminationGracePeriod': '30',
      },
      logPath: 'main/3.log',
      stdin: false,
      stdinOnce: false,
      tty: false,
      linux: {
        resources: { cpuShares: 256, cpuPeriod: 100000, cpuQuota: 50000, memoryLimitInBytes: 512 * 1024 * 1024, oomScoreAdj: 969 },
        securityContext: {
          namespaceOptions: { network: 'POD', pid: 'CONTAINER', ipc: 'POD' },
          runAsUser: { value: 1000 },
          runAsGroup: { value: 3000 },
          supplementalGroups: [2000, 4000],
          privileged: false,
          capabilities: { addCapabilities: ['NET_ADMIN'], dropCapabilities: ['ALL'] },
          readonlyRootfs: true,
          noNewPrivs: true,
          seccomp: { profileType: 'Unconfined' },
        },
      },
    });
    // The termination message file exists, empty, writable by any container user.
    const st = fs.statSync(terminationLogHostPath(podDir, 'main', 3));
    expect(st.size).toBe(0);
    expect(st.mode & 0o777).toBe(0o666);
    // Names read back from the runtime (anyone with crictl can make a container carrying a pod's labels)
    // never lead the agent's reads and deletes of this file out of the pod's directory.
    for (const bad of ['../../etc', '..', 'a/b', '']) expect(() => terminationLogHostPath(podDir, bad, 0)).toThrow(/no termination log/);
    expect(() => terminationLogHostPath(podDir, 'main', NaN)).toThrow(/no termination log/);
  });

  it('passes the AppArmor profile to the runtime: the container\'s, else the pod\'s, else the deprecated annotation\'s', () => {
    const sc = (pod: Pod) => builder.containerConfig(ctx(pod), pod.spec!.containers[0]!, opts({ volumes: vols() })).linux?.securityContext;
    const pod = webPod();
    expect(sc(pod)?.apparmor).toBeUndefined();
    pod.metadata!.annotations = { 'container.apparmor.security.beta.kubernetes.io/main': 'localhost/k8s-deny' };
    expect(sc(pod)).toMatchObject({ apparmor: { profileType: 'Localhost', localhostRef: 'k8s-deny' }, apparmorProfile: 'localhost/k8s-deny' });
    pod.spec!.securityContext = { appArmorProfile: { type: 'RuntimeDefault' } };
    expect(sc(pod)).toMatchObject({ apparmor: { profileType: 'RuntimeDefault' }, apparmorProfile: 'runtime/default' });
    pod.spec!.containers[0]!.securityContext = { appArmorProfile: { type: 'Unconfined' } };
    expect(sc(pod)).toMatchObject({ apparmor: { profileType: 'Unconfined' }, apparmorProfile: 'unconfined' });
  });

  it('takes a log path the runtime reports only under the pod log directory', () => {
    // Relative (as given in the config) or absolute (as a runtime reports it), inside the logs: served.
    expect(containerLogIn(podDir, 'main/0.log')).toBe(path.join(podDir, 'logs/main/0.log'));
    expect(containerLogIn(podDir, path.join(podDir, 'logs/main/1.log'))).toBe(path.join(podDir, 'logs/main/1.log'));
    // A runtime that joins whatever a CRI client gave (containerd does) must not make the status API serve host files.
    for (const bad of ['../../../../etc/shadow', '/etc/shadow', path.join(podDir, 'etc-hosts'), path.join(podDir, 'logs'), '']) {
      expect(containerLogIn(podDir, bad)).toBeUndefined();
    }
  });

  it('changes its hash when the container spec changes', () => {
    const a = builder.containerConfig(ctx(webPod()), webPod().spec!.containers[0], opts({ volumes: vols() }));
    const c2 = { ...webPod().spec!.containers[0], image: 'busybox:2' };
    const b = builder.containerConfig(ctx(webPod()), c2, opts({ volumes: vols() }));
    expect(a.annotations!['io.kubernetes.container.hash']).not.toBe(b.annotations!['io.kubernetes.container.hash']);
  });

  it('leaves /etc/hosts to a container that mounts its own', () => {
    const pod = webPod();
    pod.spec!.containers[0].volumeMounts!.push({ name: 'scratch', mountPath: '/etc/hosts', subPath: 'hosts' });
    const cfg = builder.containerConfig(ctx(pod), pod.spec!.containers[0], opts({ volumes: vols(), etcHosts: '/x/etc-hosts' }));
    expect(cfg.mounts!.filter((m) => m.containerPath === '/etc/hosts')).toHaveLength(1);
    expect(cfg.mounts!.find((m) => m.containerPath === '/etc/hosts')!.hostPath).not.toBe('/x/etc-hosts');
  });

  it('container security settings override the pod; the image user is left to the runtime, group and all', () => {
    const pod = webPod();
    const c: Container = { name: 'c', image: 'i', securityContext: { runAsUser: 5, seccompProfile: { type: 'Localhost', localhostProfile: 'prof.json' }, privileged: true } };
    let sc = builder.containerConfig(ctx(pod), c, opts()).linux!.securityContext!;
    expect(sc.runAsUser).toEqual({ value: 5 });
    expect(sc.runAsGroup).toEqual({ value: 3000 });
    expect(sc.privileged).toBe(true);
    expect(sc.noNewPrivs).toBe(false);
    expect(sc.seccomp).toEqual({ profileType: 'Localhost', localhostRef: '/var/lib/kl/seccomp/prof.json' });
    delete pod.spec!.securityContext;
    // The image's uid alone would lose the image's group ("1000:1000" ran as gid 0): nothing is sent.
    sc = builder.containerConfig(ctx(pod), { name: 'c', image: 'i' }, opts({ imageUser: { uid: 65534 } })).linux!.securityContext!;
    expect(sc.runAsUser).toBeUndefined();
    expect(sc.runAsGroup).toBeUndefined();
    sc = builder.containerConfig(ctx(pod), { name: 'c', image: 'i' }, opts({ imageUser: { username: 'nobody' } })).linux!.securityContext!;
    expect(sc.runAsUser).toBeUndefined();
    expect(sc.runAsUsername).toBeUndefined();
    // A group from the pod needs a user beside it in CRI: the image's.
    sc = builder.containerConfig(ctx(pod), { name: 'c', image: 'i', securityContext: { runAsGroup: 7 } }, opts({ imageUser: { uid: 65534 } })).linux!.securityContext!;
    expect(sc.runAsUser).toEqual({ value: 65534 });
    expect(sc.runAsGroup).toEqual({ value: 7 });
    sc = builder.containerConfig(ctx(pod), { name: 'c', image: 'i', securityContext: { runAsGroup: 7 } }, opts({ imageUser: { username: 'nobody' } })).linux!.securityContext!;
    expect(sc.runAsUsername).toBe('nobody');
    sc = builder.containerConfig(ctx(pod), { name: 'c', image: 'i' }, opts()).linux!.securityContext!;
    expect(sc.runAsUser).toBeUndefined();
    expect(() => builder.containerConfig(ctx(pod), { name: 'c', image: 'i', securityContext: { seccompProfile: { type: 'Localhost' } } }, opts())).toThrow(
      /localhostProfile must be set/,
    );
    for (const bad of ['../../../../etc/shadow', '/etc/shadow', 'a/../../b']) {
      expect(() => builder.containerConfig(ctx(pod), { name: 'c', image: 'i', securityContext: { seccompProfile: { type: 'Localhost', localhostProfile: bad } } }, opts())).toThrow(
        /must be a path beneath \/var\/lib\/kl\/seccomp without '\.\.'/,
      );
    }
  });

  it.each([
    ['runAsUser 0', { runAsNonRoot: true, runAsUser: 0 }, undefined, /runAsUser breaks non-root policy/],
    ['image uid 0', { runAsNonRoot: true }, { uid: 0 }, /container has runAsNonRoot and image will run as root/],
    ['no image user', { runAsNonRoot: true }, {}, /container has runAsNonRoot and image will run as root/],
    ['non-numeric', { runAsNonRoot: true }, { username: 'app' }, /container has runAsNonRoot and image has non-numeric user \(app\), cannot verify user is non-root/],
    ['image uid 1000', { runAsNonRoot: true }, { uid: 1000 }, null],
    ['runAsUser 7 over root image', { runAsNonRoot: true, runAsUser: 7 }, { uid: 0 }, null],
    ['runAsNonRoot false', { runAsNonRoot: false }, { uid: 0 }, null],
  ])('runAsNonRoot: %s', (_n, sc, imageUser, err) => {
    const pod: Pod = { metadata: { name: 'p', namespace: 'default' }, spec: { containers: [{ name: 'c', image: 'i', securityContext: sc }] } };
    const run = () => builder.containerConfig(ctx(pod), pod.spec!.containers[0], opts({ imageUser }));
    if (err) {
      expect(run).toThrow(ContainerConfigError);
      expect(run).toThrow(err);
    } else expect(run).not.toThrow();
  });

  it('runAsNonRoot set on the pod applies to its containers', () => {
    const pod: Pod = { metadata: { name: 'p' }, spec: { securityContext: { runAsNonRoot: true }, containers: [{ name: 'c', image: 'i' }] } };
    expect(() => builder.containerConfig(ctx(pod), pod.spec!.containers[0], opts({ imageUser: { uid: 0 } }))).toThrow(/image will run as root/);
  });

  it('refuses Bidirectional propagation for an unprivileged container and a mount of an unknown volume', () => {
    const pod = webPod();
    const c: Container = { name: 'c', image: 'i', volumeMounts: [{ name: 'scratch', mountPath: '/m', mountPropagation: 'Bidirectional' }] };
    expect(() => builder.containerConfig(ctx(pod), c, opts({ volumes: vols() }))).toThrow(/only to privileged containers/);
    c.securityContext = { privileged: true };
    expect(builder.containerConfig(ctx(pod), c, opts({ volumes: vols() })).mounts![0].propagation).toBe('PROPAGATION_BIDIRECTIONAL');
    const d: Container = { name: 'd', image: 'i', volumeMounts: [{ name: 'nope', mountPath: '/m' }] };
    expect(() => builder.containerConfig(ctx(pod), d, opts())).toThrow('cannot find volume "nope" to mount into container "d"');
  });

  it('a missing ConfigMap, key or Secret is a ContainerConfigError with the kubelet message', () => {
    const cases: Array<[Container['env'], string]> = [
      [[{ name: 'A', valueFrom: { configMapKeyRef: { name: 'gone', key: 'k' } } }], 'configmap "gone" not found'],
      [[{ name: 'A', valueFrom: { configMapKeyRef: { name: 'app-config', key: 'nokey' } } }], "couldn't find key nokey in ConfigMap shop/app-config"],
      [[{ name: 'A', valueFrom: { configMapKeyRef: { name: 'other', key: 'K' } } }], 'configmap "other" not found'],
      [[{ name: 'A', valueFrom: { secretKeyRef: { name: 'gone', key: 'k' } } }], 'secret "gone" not found'],
      [[{ name: 'A', valueFrom: { secretKeyRef: { name: 'creds', key: 'nokey' } } }], "couldn't find key nokey in Secret shop/creds"],
    ];
    for (const [env, msg] of cases) {
      const c: Container = { name: 'c', image: 'i', env };
      let err: unknown;
      try {
        builder.containerConfig(ctx(webPod()), c, opts());
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(ContainerConfigError);
      expect((err as Error).message).toBe(msg);
    }
    const c: Container = { name: 'c', image: 'i', envFrom: [{ secretRef: { name: 'gone' } }] };
    expect(() => builder.containerConfig(ctx(webPod()), c, opts())).toThrow('secret "gone" not found');
  });
});

describe('env', () => {
  it.each([
    ['$(A)', 'a'],
    ['$$(A)', '$(A)'],
    ['$$$(A)', '$a'],
    ['$(UNSET)', '$(UNSET)'],
    ['x$(A', 'x$(A'],
    ['$A', '$A'],
    ['end$', 'end$'],
    ['$(A)$(B)', 'ab'],
    ['$()', '$()'],
    ['($(A))', '(a)'],
    ['$$', '$'],
    ['a$-b', 'a$-b'],
    ['$(A)$$$$(B)', 'a$$(B)'],
  ])('expands %j to %j', (input, want) => {
    const m = new Map([
      ['A', 'a'],
      ['B', 'b'],
    ]);
    expect(expand(input, (k) => m.get(k))).toBe(want);
  });

  it('resolves envFrom (prefix, invalid keys skipped, optional), secrets decoded, refs to earlier vars only, optional refs left out', () => {
    const pod = webPod();
    const c: Container = {
      name: 'c',
      image: 'i',
      envFrom: [{ configMapRef: { name: 'app-config' }, prefix: 'CFG_' }, { secretRef: { name: 'creds' } }, { configMapRef: { name: 'absent', optional: true } }],
      env: [
        { name: 'EARLY', value: '$(LATE)' },
        { name: 'LATE', value: 'late' },
        { name: 'PW', valueFrom: { secretKeyRef: { name: 'creds', key: 'password' } } },
        { name: 'OPT', valueFrom: { configMapKeyRef: { name: 'absent', key: 'k', optional: true } } },
        { name: 'OPTKEY', valueFrom: { secretKeyRef: { name: 'creds', key: 'none', optional: true } } },
        { name: 'CFG_mode', value: 'override $(CFG_mode)' },
        { name: 'EMPTY', value: '' },
      ],
    };
    const { env, invalidKeys } = resolveEnv(ctx(pod), c, node);
    expect([...env]).toEqual([
      ['CFG_1ST', 'y'],
      ['CFG_LEVEL', 'debug'],
      ['CFG_mode', 'override fast'],
      ['password', 's3cr3t'],
      ['token', 'tok'],
      ['EARLY', '$(LATE)'],
      ['LATE', 'late'],
      ['PW', 's3cr3t'],
      ['EMPTY', ''],
    ]);
    expect(invalidKeys).toEqual(['CFG_bad key']);
    const warnings: string[] = [];
    builder.containerConfig(ctx(pod), c, opts({ warnings }));
    expect(warnings).toEqual(['Keys [CFG_bad key] from the EnvFrom configMap shop/app-config were skipped since they are considered invalid environment variable names.']);
  });

  it('service links: the namespace\'s Services and default/kubernetes, overridable and referable', () => {
    const svc = (ns: string, name: string, clusterIP: string, ports: Array<{ name?: string; port: number; protocol?: string }>): Service => ({
      metadata: { namespace: ns, name },
      spec: { clusterIP, ports },
    });
    const services = [
      svc('shop', 'redis-main', '10.96.0.20', [{ name: 'db', port: 6379 }, { name: 'metrics', port: 9121, protocol: 'UDP' }]),
      svc('default', 'kubernetes', '10.96.0.1', [{ name: 'https', port: 443 }]),
      svc('other', 'elsewhere', '10.96.0.30', [{ port: 80 }]),
      svc('shop', 'headless', 'None', [{ port: 80 }]),
    ];
    const c: Container = { name: 'c', image: 'i', env: [{ name: 'URL', value: 'redis://$(REDIS_MAIN_SERVICE_HOST):$(REDIS_MAIN_SERVICE_PORT_DB)' }, { name: 'KUBERNETES_SERVICE_PORT', value: '8443' }] };
    const env = resolveEnv(ctx(webPod()), c, node, services).env;
    expect(Object.fromEntries(env)).toEqual({
      KUBERNETES_SERVICE_HOST: '10.96.0.1',
      KUBERNETES_SERVICE_PORT: '8443',
      KUBERNETES_SERVICE_PORT_HTTPS: '443',
      KUBERNETES_PORT: 'tcp://10.96.0.1:443',
      KUBERNETES_PORT_443_TCP: 'tcp://10.96.0.1:443',
      KUBERNETES_PORT_443_TCP_PROTO: 'tcp',
      KUBERNETES_PORT_443_TCP_PORT: '443',
      KUBERNETES_PORT_443_TCP_ADDR: '10.96.0.1',
      REDIS_MAIN_SERVICE_HOST: '10.96.0.20',
      REDIS_MAIN_SERVICE_PORT: '6379',
      REDIS_MAIN_SERVICE_PORT_DB: '6379',
      REDIS_MAIN_SERVICE_PORT_METRICS: '9121',
      REDIS_MAIN_PORT: 'tcp://10.96.0.20:6379',
      REDIS_MAIN_PORT_6379_TCP: 'tcp://10.96.0.20:6379',
      REDIS_MAIN_PORT_6379_TCP_PROTO: 'tcp',
      REDIS_MAIN_PORT_6379_TCP_PORT: '6379',
      REDIS_MAIN_PORT_6379_TCP_ADDR: '10.96.0.20',
      REDIS_MAIN_PORT_9121_UDP: 'udp://10.96.0.20:9121',
      REDIS_MAIN_PORT_9121_UDP_PROTO: 'udp',
      REDIS_MAIN_PORT_9121_UDP_PORT: '9121',
      REDIS_MAIN_PORT_9121_UDP_ADDR: '10.96.0.20',
      URL: 'redis://10.96.0.20:6379',
    });
    const noLinks = webPod();
    noLinks.spec!.enableServiceLinks = false;
    expect([...resolveEnv(ctx(noLinks), { name: 'c', image: 'i' }, node, services).env.keys()].every((k) => k.startsWith('KUBERNETES_'))).toBe(true);
    // Through the builder, Services come from the manifest objects.
    const withObjects = { ...objects, list: (kind?: string) => (kind === 'Service' ? services.map((o) => ({ object: o as unknown as Record<string, unknown> }) as never) : []) };
    const cfg = new KubeletConfigBuilder({ node }).containerConfig(ctx(webPod(), { objects: withObjects }), { name: 'c', image: 'i' }, opts());
    expect(cfg.envs!.find((e) => e.key === 'REDIS_MAIN_SERVICE_HOST')?.value).toEqual(Buffer.from('10.96.0.20'));
  });

  it('fieldRef: names, labels, annotations, node, IPs (the host IP on the host network)', () => {
    const pod = webPod();
    pod.metadata!.labels = { app: 'web', tier: 'a"b' };
    pod.spec!.serviceAccountName = 'robot';
    const fields = [
      'metadata.name',
      'metadata.namespace',
      'metadata.uid',
      "metadata.labels['app']",
      "metadata.labels['none']",
      "metadata.annotations['note']",
      'metadata.labels',
      'spec.nodeName',
      'spec.serviceAccountName',
      'status.podIP',
      'status.podIPs',
      'status.hostIP',
    ];
    const c: Container = { name: 'c', image: 'i', env: fields.map((f, i) => ({ name: `F${i}`, valueFrom: { fieldRef: { fieldPath: f } } })) };
    expect([...resolveEnv(ctx(pod), c, node).env.values()]).toEqual([
      'web',
      'shop',
      'uid-1',
      'web',
      '',
      'hi',
      'app="web"\ntier="a\\"b"',
      'node-a',
      'robot',
      '10.88.0.7',
      '10.88.0.7',
      '10.0.0.5',
    ]);
    pod.spec!.hostNetwork = true;
    expect(resolveEnv(ctx(pod), { name: 'c', image: 'i', env: [{ name: 'IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } }] }, node).env.get('IP')).toBe('10.0.0.5');
  });

  it('resourceFieldRef: divisors round up, an open limit is the node capacity, another container by name', () => {
    const pod = webPod();
    pod.spec!.containers.push({ name: 'side', image: 'i', resources: { limits: { memory: '1Gi' } } });
    const ref = (resource: string, divisor?: string, containerName?: string) => ({ name: resource + (divisor ?? '') + (containerName ?? ''), valueFrom: { resourceFieldRef: { resource, divisor, containerName } } });
    const c: Container = {
      ...pod.spec!.containers[0],
      env: [ref('limits.cpu'), ref('limits.cpu', '1m'), ref('requests.memory', '1Mi'), ref('limits.memory'), ref('limits.cpu', undefined, 'side'), ref('requests.cpu', '1m', 'side'), ref('limits.memory', '1Mi', 'side')],
    };
    expect([...resolveEnv(ctx(pod), c, node).env.values()]).toEqual(['1', '500', '256', String(512 * 1024 * 1024), '4', '0', '1024']);
  });

  it('formats a whole label map as the downward API does', () => {
    expect(formatMap({ b: 'x\ny', a: '1', c: 'tab\there\u0001' })).toBe('a="1"\nb="x\\ny"\nc="tab\\there\\x01"');
  });
});

describe('subPath', () => {
  it('creates missing directories under the volume and resolves symlinks that stay inside', () => {
    const vol = path.join(tmp, 'vol');
    fs.mkdirSync(path.join(vol, 'real'), { recursive: true });
    fs.symlinkSync('real', path.join(vol, 'link'));
    expect(safeSubpath(vol, 'a/b')).toBe(path.join(fs.realpathSync(vol), 'a/b'));
    expect(fs.statSync(path.join(vol, 'a/b')).isDirectory()).toBe(true);
    expect(safeSubpath(vol, 'link/x')).toBe(path.join(fs.realpathSync(vol), 'real/x'));
  });

  it("gives new subPath directories the volume's mode, whatever the umask", () => {
    const vol = path.join(tmp, 'vol');
    fs.mkdirSync(vol);
    fs.chmodSync(vol, 0o777);
    const old = process.umask(0o022);
    try {
      safeSubpath(vol, 'x/y');
    } finally {
      process.umask(old);
    }
    expect(fs.statSync(path.join(vol, 'x')).mode & 0o777).toBe(0o777);
    expect(fs.statSync(path.join(vol, 'x/y')).mode & 0o777).toBe(0o777);
  });

  it.each([
    ['../x', /must not contain '..'/],
    ['a/../../x', /must not contain '..'/],
    ['/etc', /must not be an absolute path/],
    ['out/x', /not within volume path/],
    ['out', /not within volume path/],
    ['abs', /not within volume path/],
    ['chain/etc', /not within volume path/],
  ])('refuses %j', (sub, err) => {
    const vol = path.join(tmp, 'vol');
    const outside = path.join(tmp, 'outside');
    fs.mkdirSync(vol, { recursive: true });
    fs.mkdirSync(outside, { recursive: true });
    fs.symlinkSync('../outside', path.join(vol, 'out'));
    fs.symlinkSync('/etc', path.join(vol, 'abs'));
    fs.symlinkSync('abs', path.join(vol, 'chain'));
    expect(() => safeSubpath(vol, sub)).toThrow(err);
    // Nothing was created outside.
    expect(fs.readdirSync(outside)).toEqual([]);
  });

  it.skipIf(process.getuid?.() !== 0)("refuses a mount target whose directory the pod swapped for a symlink, mounting nothing there", () => {
    const vol = path.join(tmp, 'vol2');
    const outside = path.join(tmp, 'outside2');
    fs.mkdirSync(path.join(vol, 'a'), { recursive: true });
    fs.mkdirSync(outside);
    const root = fs.realpathSync(vol);
    // <agent root>/pods/u/volume-subpaths/v -> a host directory, as a hostPath onto the pod dir could make it.
    fs.mkdirSync(path.join(tmp, 'agent/pods/u/volume-subpaths'), { recursive: true });
    fs.symlinkSync(outside, path.join(tmp, 'agent/pods/u/volume-subpaths/v'));
    const target = path.join(tmp, 'agent/pods/u/volume-subpaths/v/c/0');
    expect(() => pinSubpath(root, safeSubpath(vol, 'a'), target, path.join(tmp, 'agent'))).toThrow(/is not a directory of its own/);
    expect(fs.readdirSync(outside)).toEqual([]);
    expect(fs.readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(outside);
  });

  it.skipIf(process.getuid?.() !== 0)('binds what was checked, and refuses a component swapped for a symlink since', () => {
    const vol = path.join(tmp, 'vol');
    const outside = path.join(tmp, 'outside');
    fs.mkdirSync(path.join(vol, 'a/b'), { recursive: true });
    fs.mkdirSync(outside);
    fs.writeFileSync(path.join(outside, 'secret'), 'host');
    fs.writeFileSync(path.join(vol, 'a/b/file'), 'vol');
    const root = fs.realpathSync(vol);
    const checked = safeSubpath(vol, 'a/b');
    const target = path.join(tmp, 'subpaths/v/c/0');
    // The container swaps b for a symlink out of the volume after the check: nothing is mounted.
    fs.renameSync(path.join(vol, 'a/b'), path.join(vol, 'a/old'));
    fs.symlinkSync(outside, path.join(vol, 'a/b'));
    expect(() => pinSubpath(root, checked, target)).toThrow(ContainerConfigError);
    fs.unlinkSync(path.join(vol, 'a/b'));
    fs.renameSync(path.join(vol, 'a/old'), path.join(vol, 'a/b'));
    pinSubpath(root, checked, target);
    try {
      // A later swap changes nothing in what the runtime will mount.
      fs.renameSync(path.join(vol, 'a/b'), path.join(vol, 'a/old'));
      fs.symlinkSync(outside, path.join(vol, 'a/b'));
      expect(fs.readdirSync(target)).toEqual(['file']);
      // A restart binds again over the old bind, and a file subPath gets a file.
      fs.unlinkSync(path.join(vol, 'a/b'));
      pinSubpath(root, path.join(root, 'a/old/file'), target.replace(/0$/, '1'));
      expect(fs.readFileSync(target.replace(/0$/, '1'), 'utf8')).toBe('vol');
      pinSubpath(root, path.join(root, 'a/old'), target);
      expect(fs.readdirSync(target)).toEqual(['file']);
      // A name that only starts with '..' (the atomic writer's version directories) is inside.
      fs.mkdirSync(path.join(vol, '..2026_11_30'));
      fs.writeFileSync(path.join(vol, '..2026_11_30/key'), 'cm');
      pinSubpath(root, path.join(root, '..2026_11_30/key'), target.replace(/0$/, '1'));
      expect(fs.readFileSync(target.replace(/0$/, '1'), 'utf8')).toBe('cm');
    } finally {
      for (const t of [target, target, target.replace(/0$/, '1'), target.replace(/0$/, '1')]) {
        try {
          umount2(t, 2);
        } catch {
          // not mounted
        }
      }
    }
  });

  it('subPathExpr expands with the env, and refuses a variable without a value', () => {
    const pod = webPod();
    const volumes = vols();
    const c: Container = {
      name: 'c',
      image: 'i',
      env: [{ name: 'POD', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } }],
      volumeMounts: [{ name: 'scratch', mountPath: '/logs', subPathExpr: 'logs/$(POD)' }],
    };
    const pinned: Array<Array<string | undefined>> = [];
    const b = new KubeletConfigBuilder({ node, pinSubpath: (...args) => void pinned.push(args) });
    const cfg = b.containerConfig(ctx(pod), c, opts({ volumes }));
    const root = fs.realpathSync(volumes.get('scratch')!);
    // The runtime mounts the agent's bind of the checked directory, never the path in the volume.
    expect(cfg.mounts![0].hostPath).toBe(path.join(podDir, 'volume-subpaths/scratch/c/0'));
    expect(pinned).toEqual([[root, path.join(root, 'logs/web'), path.join(podDir, 'volume-subpaths/scratch/c/0'), path.dirname(path.dirname(podDir))]]);
    c.volumeMounts![0].subPathExpr = '$(NOPE)/x';
    expect(() => b.containerConfig(ctx(pod), c, opts({ volumes }))).toThrow('missing value for NOPE');
  });
});

describe('QoS and resources', () => {
  const pod = (containers: Container[], init: Container[] = []): Pod => ({ metadata: { name: 'p' }, spec: { containers, initContainers: init } });
  const c = (requests?: Record<string, string>, limits?: Record<string, string>): Container => ({ name: 'c', image: 'i', resources: { requests, limits } });

  it.each([
    ['nothing', pod([c()]), 'BestEffort'],
    ['only ephemeral-storage', pod([c({ 'ephemeral-storage': '1Gi' })]), 'BestEffort'],
    ['zero requests', pod([c({ cpu: '0' })]), 'BestEffort'],
    ['equal', pod([c({ cpu: '1', memory: '1Gi' }, { cpu: '1', memory: '1Gi' })]), 'Guaranteed'],
    ['limits only (requests default to them)', pod([c(undefined, { cpu: '500m', memory: '128Mi' })]), 'Guaranteed'],
    ['same value, other units', pod([c({ cpu: '1000m', memory: '1024Mi' }, { cpu: '1', memory: '1Gi' })]), 'Guaranteed'],
    ['request below limit', pod([c({ cpu: '500m', memory: '1Gi' }, { cpu: '1', memory: '1Gi' })]), 'Burstable'],
    ['cpu only', pod([c({ cpu: '1' }, { cpu: '1' })]), 'Burstable'],
    ['one container without limits', pod([c(undefined, { cpu: '1', memory: '1Gi' }), c()]), 'Burstable'],
    ['an init container without limits', pod([c(undefined, { cpu: '1', memory: '1Gi' })], [c({ cpu: '100m' })]), 'Burstable'],
    ['an init container guaranteed too', pod([c(undefined, { cpu: '1', memory: '1Gi' })], [c(undefined, { cpu: '2', memory: '2Gi' })]), 'Guaranteed'],
    ['only an init container requests', pod([c()], [c({ memory: '1Mi' })]), 'Burstable'],
  ])('%s → %s', (_n, p, want) => {
    expect(qosClass(p)).toBe(want);
  });

  it.each([
    ['Guaranteed', pod([c(undefined, { cpu: '1', memory: '1Gi' })]), -997],
    ['BestEffort', pod([c()]), 1000],
    ['Burstable 1/8 of memory', pod([c({ memory: '1Gi' })]), 875],
    ['Burstable no memory request', pod([c({ cpu: '1' })]), 999],
    ['Burstable tiny request', pod([c({ memory: '1' })]), 999],
    ['Burstable request over node memory', pod([c({ memory: '16Gi' })]), 3],
    ['Burstable all the memory', pod([c({ memory: '8Gi' })]), 3],
  ])('oom_score_adj %s → %d', (_n, p, want) => {
    expect(oomScoreAdj(p, p.spec!.containers[0], node)).toBe(want);
  });

  it('a sidecar scores no higher than the lowest app container; a plain init container keeps its own', () => {
    const app = c({ memory: '4Gi' });
    const side: Container = { ...c({ memory: '1Gi' }), name: 'side', restartPolicy: 'Always' };
    const init: Container = { ...c({ memory: '1Gi' }), name: 'init' };
    const p = pod([app], [side, init]);
    expect(oomScoreAdj(p, app, node)).toBe(500);
    expect(oomScoreAdj(p, side, node)).toBe(500);
    expect(oomScoreAdj(p, init, node)).toBe(875);
  });

  it('node-critical pods get the Guaranteed score', () => {
    const p = pod([c()]);
    p.spec!.priorityClassName = 'system-node-critical';
    expect(oomScoreAdj(p, p.spec!.containers[0], node)).toBe(-997);
  });

  it.each([
    [c(), { cpuShares: 2, cpuQuota: 0 }],
    [c({ cpu: '1m' }), { cpuShares: 2, cpuQuota: 0 }],
    [c({ cpu: '100m' }), { cpuShares: 102, cpuQuota: 0 }],
    [c({ cpu: '2' }, { cpu: '4' }), { cpuShares: 2048, cpuQuota: 400000 }],
    [c(undefined, { cpu: '5m' }), { cpuShares: 5, cpuQuota: 1000 }],
    [c(undefined, { cpu: '0.5', memory: '100M' }), { cpuShares: 512, cpuQuota: 50000, memoryLimitInBytes: 100_000_000 }],
    [c({ cpu: '1000' }), { cpuShares: 262144, cpuQuota: 0 }],
  ])('cpu/memory for %j', (ct, want) => {
    const r = containerResources(pod([ct]), ct, node);
    expect(r).toMatchObject({ cpuPeriod: 100000, ...want });
    if (!('memoryLimitInBytes' in want)) expect(r.memoryLimitInBytes).toBeUndefined();
  });

  it.each([
    ['250m', 0.25 * 1000, 1],
    ['1', 1000, 1],
    ['1.5', 1500, 2],
    ['128Mi', 128 * 1024 * 1024 * 1000, 128 * 1024 * 1024],
    ['1e3', 1e6, 1000],
    ['2k', 2e6, 2000],
    ['1G', 1e12, 1e9],
    ['0.1m', 1, 1],
    ['.5', 500, 1],
  ])('quantity %s', (q, milli, value) => {
    expect(quantityMilli(q)).toBe(milli);
    expect(quantityValue(q)).toBe(value);
  });

  it('refuses malformed quantities', () => {
    for (const q of ['', 'abc', '1Kb', '1..2', '--1', '1 Mi']) expect(() => parseQuantity(q), q).toThrow();
  });

  it('resource values round up by divisor', () => {
    const ct = c({ cpu: '250m', memory: '1000' });
    expect(resourceFieldValue(ct, 'requests.cpu', undefined, node)).toBe('1');
    expect(resourceFieldValue(ct, 'requests.cpu', '100m', node)).toBe('3');
    expect(resourceFieldValue(ct, 'requests.memory', '1Ki', node)).toBe('1');
    expect(() => resourceFieldValue(ct, 'limits.gpu', undefined, node)).toThrow(/unsupported container resource/);
  });
});

describe('DNS', () => {
  const host = 'nameserver 192.168.1.1\nnameserver 192.168.1.2\n# comment\nsearch corp.example. lab.example\noptions timeout:2 attempts:3\n';
  const inputs = { clusterDomain: 'cluster.local', clusterDNS: ['10.96.0.10'], hostResolvConf: host };
  const pod = (spec: Partial<NonNullable<Pod['spec']>>): Pod => ({ metadata: { name: 'p', namespace: 'ns1' }, spec: { containers: [], ...spec } });
  const clusterSearch = ['ns1.svc.cluster.local', 'svc.cluster.local', 'cluster.local', 'corp.example', 'lab.example'];
  const hostCfg = { servers: ['192.168.1.1', '192.168.1.2'], searches: ['corp.example', 'lab.example'], options: ['timeout:2', 'attempts:3'] };

  it.each([
    ['ClusterFirst', pod({ dnsPolicy: 'ClusterFirst' }), inputs, { servers: ['10.96.0.10'], searches: clusterSearch, options: ['ndots:5'] }],
    ['ClusterFirst on the host network is Default', pod({ dnsPolicy: 'ClusterFirst', hostNetwork: true }), inputs, hostCfg],
    ['ClusterFirstWithHostNet', pod({ dnsPolicy: 'ClusterFirstWithHostNet', hostNetwork: true }), inputs, { servers: ['10.96.0.10'], searches: clusterSearch, options: ['ndots:5'] }],
    ['ClusterFirst without cluster DNS falls back', pod({ dnsPolicy: 'ClusterFirst' }), { ...inputs, clusterDNS: [] }, hostCfg],
    ['Default', pod({ dnsPolicy: 'Default' }), inputs, hostCfg],
    ['None', pod({ dnsPolicy: 'None', dnsConfig: { nameservers: ['1.1.1.1'], searches: ['a.b'], options: [{ name: 'ndots', value: '2' }, { name: 'edns0' }] } }), inputs, {
      servers: ['1.1.1.1'],
      searches: ['a.b'],
      options: ['ndots:2', 'edns0'],
    }],
    ['ClusterFirst + dnsConfig merged', pod({ dnsPolicy: 'ClusterFirst', dnsConfig: { nameservers: ['10.96.0.10', '8.8.8.8'], searches: ['cluster.local', 'extra.example'], options: [{ name: 'ndots', value: '1' }, { name: 'rotate' }] } }), inputs, {
      servers: ['10.96.0.10', '8.8.8.8'],
      searches: [...clusterSearch, 'extra.example'],
      options: ['ndots:1', 'rotate'],
    }],
    ['Default + too many nameservers', pod({ dnsPolicy: 'Default', dnsConfig: { nameservers: ['1.1.1.1', '2.2.2.2'] } }), inputs, { ...hostCfg, servers: ['192.168.1.1', '192.168.1.2', '1.1.1.1'] }],
  ])('%s', (_n, p, inp, want) => {
    expect(podDnsConfig(p, inp)).toEqual(want);
  });

  it('keeps 32 search domains and drops overlong ones', () => {
    const searches = Array.from({ length: 40 }, (_, i) => `d${i}.example`);
    const p = pod({ dnsPolicy: 'None', dnsConfig: { searches: ['x'.repeat(300), ...searches] } });
    const got = podDnsConfig(p, inputs).searches!;
    expect(got).toEqual(searches.slice(0, 31));
  });

  it('parses resolv.conf as the kubelet does: the last search line wins, trailing dots go', () => {
    expect(parseResolvConf('search a.\nsearch b. c\n; x\nnameserver 1.2.3.4\noptions ndots:1\noptions ndots:3 rotate')).toEqual({
      servers: ['1.2.3.4'],
      searches: ['b', 'c'],
      options: ['ndots:3', 'rotate'],
    });
  });
});
