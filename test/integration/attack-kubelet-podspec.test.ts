/**
 * Pod specs written to make the node read host files, take root's group,
 * change the kernel for everyone, or outrun a deletion, through a real
 * agent and runtime. Each is refused with the API's or the kubelet's
 * answer, or bounded, and the node keeps running its other pods.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { busyboxImage } from '../helpers/busybox.js';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { Pusher } from '../helpers/oci.js';
import { waitFor } from '../helpers/registry.js';

const exitedWith = (name: string) => (p: import('kubernetes-types/core/v1.js').Pod) => !!containerStatus(p, name)?.state?.terminated;

describe.skipIf(!isRoot)('attack kubelet-lite: hostile pod specs', () => {
  let node: NodeFixture;
  let seccompDir: string;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/attack-kubelet-podspec', ['--allowed-unsafe-sysctls', 'net.core.somaxconn']);
    seccompDir = path.join(node.rootDir, 'seccomp');
    await fs.mkdir(seccompDir, { recursive: true });
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  it('refuses a localhostProfile that climbs out of the seccomp directory, and never reads the target', async () => {
    const secret = path.join(node.pods.dirs.base, 'host-secret');
    await fs.writeFile(secret, 'root:$6$HOSTSECRET:19000:0:99999:7:::\n');
    const climb = path.relative(seccompDir, secret);
    expect(climb).toMatch(/^\.\.\//);
    await node.write('climb.yaml', podYaml('climb', node.image, `  securityContext:
    seccompProfile: {type: Localhost, localhostProfile: "${climb}"}
  containers:
  - name: main
    image: IMAGE
    command: [sleep, "1000"]
`));
    const p = await node.waitPod('climb', (x) => x.status?.phase === 'Failed', 'refused');
    expect(p.status?.reason).toBe('InvalidManifest');
    expect(p.status?.message).toContain(`spec.securityContext.seccompProfile.localhostProfile: Invalid value: "${climb}": must not contain '..'`);
    const all = JSON.stringify((await node.get('/pods')).body) + JSON.stringify((await node.get('/events')).body);
    expect(all).not.toContain('HOSTSECRET');
    await node.remove('climb.yaml');
    await node.waitGone('climb');
  });

  it('a profile in the seccomp directory that is a FIFO, a device link or not JSON fails the container, quoting nothing, and holds nothing', async () => {
    spawnSync('mkfifo', [path.join(seccompDir, 'fifo.json')]);
    await fs.symlink('/dev/zero', path.join(seccompDir, 'zero.json'));
    await fs.writeFile(path.join(seccompDir, 'text.json'), 'password=HOSTSECRET\n');
    const pods = ['fifo', 'zero', 'text'];
    for (const n of pods) {
      await node.write(`${n}.yaml`, podYaml(`prof-${n}`, node.image, `  containers:
  - name: main
    image: IMAGE
    command: [sleep, "1000"]
    securityContext:
      seccompProfile: {type: Localhost, localhostProfile: ${n}.json}
`));
    }
    for (const n of pods) {
      const p = await node.waitPod(`prof-${n}`, (x) => containerStatus(x, 'main')?.state?.waiting?.reason === 'CreateContainerError', 'CreateContainerError');
      const msg = containerStatus(p, 'main')!.state!.waiting!.message!;
      expect(msg).toMatch(n === 'text' ? /is not valid JSON/ : /not a regular file/);
      expect(msg).not.toContain('HOSTSECRET');
    }
    // The runtime was never held: a plain pod still starts at once.
    await node.write('plain.yaml', podYaml('plain', node.image, `  containers:
  - name: main
    image: IMAGE
    command: [sleep, "1000"]
`));
    await node.waitPod('plain', (x) => !!containerStatus(x, 'main')?.state?.running, 'running', 30_000);
    for (const n of [...pods, 'plain']) await node.remove(`${n}.yaml`);
    for (const n of pods) await node.waitGone(`prof-${n}`);
    await node.waitGone('plain');
  });

  it("runs an image's User uid:gid with the image's group, not root's or /etc/passwd's", async () => {
    const img = await busyboxImage({ User: '1000:2000' });
    await new Pusher(`http://${inject('registryHost')}`).image('test/busybox-user', 'v1', img);
    const image = `${inject('registryHost')}/test/busybox-user:v1`;
    await node.write('ids.yaml', podYaml('ids', image, `  restartPolicy: Never
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "id > /dev/termination-log"]
`));
    const p = await node.waitPod('ids', exitedWith('main'), 'exited');
    expect(containerStatus(p, 'main')?.state?.terminated?.message).toMatch(/^uid=1000(\(\w+\))? gid=2000(\(\w+\))?(\s|$)/);
    // A pod's runAsGroup still wins, with the image's user.
    await node.write('ids2.yaml', podYaml('ids2', image, `  restartPolicy: Never
  securityContext: {runAsGroup: 3000}
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "id > /dev/termination-log"]
`));
    const p2 = await node.waitPod('ids2', exitedWith('main'), 'exited');
    expect(containerStatus(p2, 'main')?.state?.terminated?.message).toMatch(/^uid=1000(\(\w+\))? gid=3000(\(\w+\))?(\s|$)/);
    await node.remove('ids.yaml');
    await node.remove('ids2.yaml');
    await node.waitGone('ids');
    await node.waitGone('ids2');
  });

  it('fails a pod setting an unsafe sysctl with SysctlForbidden, and runs safe and allowed ones', async () => {
    await node.write('msg.yaml', podYaml('msg', node.image, `  securityContext:
    sysctls: [{name: kernel.msgmax, value: "65536"}]
  containers:
  - name: main
    image: IMAGE
    command: [sleep, "1000"]
`));
    const p = await node.waitPod('msg', (x) => x.status?.phase === 'Failed', 'refused');
    expect(p.status?.reason).toBe('SysctlForbidden');
    expect(p.status?.message).toBe('forbidden sysctl: "kernel.msgmax" not allowlisted');
    await node.write('ok.yaml', podYaml('okctl', node.image, `  restartPolicy: Never
  securityContext:
    sysctls: [{name: net.ipv4.ip_local_port_range, value: "20000 30000"}, {name: net.core.somaxconn, value: "1234"}]
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "cat /proc/sys/net/ipv4/ip_local_port_range /proc/sys/net/core/somaxconn > /dev/termination-log"]
`));
    const ok = await node.waitPod('okctl', exitedWith('main'), 'exited');
    expect(containerStatus(ok, 'main')?.state?.terminated?.message?.split(/\s+/).filter(Boolean)).toEqual(['20000', '30000', '1234']);
    // On the host's network, a net sysctl would change the host's: refused even when safe.
    await node.write('hostnet.yaml', podYaml('hostnetctl', node.image, `  hostNetwork: true
  securityContext:
    sysctls: [{name: net.ipv4.ip_local_port_range, value: "20000 30000"}]
  containers:
  - name: main
    image: IMAGE
    command: [sleep, "1000"]
`));
    const hn = await node.waitPod('hostnetctl', (x) => x.status?.phase === 'Failed', 'refused');
    expect(hn.status?.message).toBe('forbidden sysctl: "net.ipv4.ip_local_port_range" not allowed with host net enabled');
    for (const f of ['msg', 'ok', 'hostnet']) await node.remove(`${f}.yaml`);
    for (const n of ['msg', 'okctl', 'hostnetctl']) await node.waitGone(n);
  });

  it('a memory emptyDir with sizeLimit "0" is bounded by the pod\'s memory limit, not unlimited', async () => {
    await node.write('mem.yaml', podYaml('mem', node.image, `  restartPolicy: Never
  volumes:
  - name: m
    emptyDir: {medium: Memory, sizeLimit: "0"}
  containers:
  - name: main
    image: IMAGE
    resources: {limits: {memory: 48Mi}}
    volumeMounts: [{name: m, mountPath: /m}]
    command: [sh, -c, "df -k /m | tail -1 > /dev/termination-log"]
`));
    const p = await node.waitPod('mem', exitedWith('main'), 'exited');
    // Filesystem 1K-blocks Used Available Use% Mounted on
    const cols = containerStatus(p, 'mem' === 'mem' ? 'main' : '')?.state?.terminated?.message?.trim().split(/\s+/) ?? [];
    expect(Number(cols[1])).toBe(48 * 1024);
    await node.remove('mem.yaml');
    await node.waitGone('mem');
  });

  it("refuses a hostPath with '..' and a pod of more than 100 containers, as the API server would", async () => {
    await node.write('dots.yaml', podYaml('dots', node.image, `  volumes:
  - name: h
    hostPath: {path: /var/lib/../../etc}
  containers:
  - name: main
    image: IMAGE
    volumeMounts: [{name: h, mountPath: /h}]
`));
    const p = await node.waitPod('dots', (x) => x.status?.phase === 'Failed', 'refused');
    expect(p.status?.message).toContain(`spec.volumes[0].hostPath.path: Invalid value: "/var/lib/../../etc": must not contain '..'`);
    const many = Array.from({ length: 101 }, (_, i) => `  - {name: c${i}, image: IMAGE, command: [sleep, "1000"]}`).join('\n');
    await node.write('many.yaml', podYaml('many', node.image, `  containers:\n${many}\n`));
    const m = await node.waitPod('many', (x) => x.status?.phase === 'Failed', 'refused');
    expect(m.status?.message).toContain('spec.containers: Too many: 101: a pod may have at most 100 containers and init containers together');
    await node.remove('dots.yaml');
    await node.remove('many.yaml');
    await node.waitGone('dots');
    await node.waitGone('many');
  });

  it('a pod removed while its containers are starting stops starting them', async () => {
    const count = 80;
    const creates = () => (node.pods.skiff.log.match(/"method":"[^"]*CreateContainer"/g) ?? []).length;
    const before = creates();
    const containers = Array.from({ length: count }, (_, i) => `  - {name: c${i}, image: IMAGE, command: [sleep, "1000"]}`).join('\n');
    await node.write('wide.yaml', podYaml('wide', node.image, `  terminationGracePeriodSeconds: 1\n  containers:\n${containers}\n`));
    await waitFor('ten containers of the wide pod to be created', async () => (creates() - before >= 10 ? true : undefined), 60_000);
    await node.remove('wide.yaml');
    await node.waitGone('wide', 120_000);
    const made = creates() - before;
    console.log(`wide pod: ${made} of ${count} containers created before the removal won`);
    // The removal is seen within a sync step or two: far fewer than all of them were ever created.
    expect(made, `${made} of ${count} containers created`).toBeLessThan(count / 2);
    const left = ((await node.pods.skiff.runtime.ListContainers({})).containers ?? []).filter((c: { labels?: Record<string, string> }) => c.labels?.['io.kubernetes.pod.name'] === 'wide');
    expect(left).toEqual([]);
  }, 180_000);
  it('a pod removed while its postStart hook blocks goes at once, not after the hook\'s whole grace period', async () => {
    // The hook's bound is the grace period (10 minutes here); the container itself stops within a second of SIGTERM.
    await node.write('hook.yaml', podYaml('hook', node.image, `  terminationGracePeriodSeconds: 600
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
    lifecycle:
      postStart:
        exec: {command: [sleep, "3600"]}
`));
    await waitFor('the hook container to start', async () => ((await node.events('hook')).some((e) => e.reason === 'Started') ? true : undefined), 60_000);
    const t0 = Date.now();
    await node.remove('hook.yaml');
    await node.waitGone('hook', 45_000);
    expect(Date.now() - t0).toBeLessThan(45_000);
    // Cancelled by the deletion, not failed: no FailedPostStartHook for it.
    expect((await node.events('hook')).filter((e) => e.reason === 'FailedPostStartHook')).toEqual([]);
  }, 120_000);
});
