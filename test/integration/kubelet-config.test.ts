/**
 * kubelet-lite's CRI configs and volumes on the real runtime: a Pod becomes a
 * sandbox and a container on a real `skiff cri` (runc, conmon, CNI), and what
 * runs inside is checked through ExecSync against what the Pod says.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { ConfigMap, Pod, Secret } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { KubeletConfigBuilder, terminationLogHostPath } from '../../src/kubelet-lite/cri-config.js';
import type { ObjectLookup, PodContext } from '../../src/kubelet-lite/model.js';
import { HostVolumeManager } from '../../src/kubelet-lite/volumes.js';
import { isRoot } from '../helpers/env.js';
import { startPodFixture, type PodFixture } from '../helpers/pods.js';
import { waitFor } from '../helpers/registry.js';

const configMaps: ConfigMap[] = [{ metadata: { name: 'app-config', namespace: 'shop' }, data: { 'app.conf': 'color=blue\n', LEVEL: 'debug' } }];
const secrets: Secret[] = [{ metadata: { name: 'creds', namespace: 'shop' }, data: { password: Buffer.from('s3cr3t').toString('base64') } }];
const objects: ObjectLookup = {
  get: () => undefined,
  list: () => [],
  configMap: (ns, name) => configMaps.find((c) => c.metadata?.namespace === ns && c.metadata?.name === name),
  secret: (ns, name) => secrets.find((s) => s.metadata?.namespace === ns && s.metadata?.name === name),
};

const pod: Pod = {
  apiVersion: 'v1',
  kind: 'Pod',
  metadata: { name: 'cfgpod', namespace: 'shop', labels: { app: 'cfg' } },
  spec: {
    restartPolicy: 'Always',
    dnsPolicy: 'ClusterFirst',
    terminationGracePeriodSeconds: 5,
    hostAliases: [{ ip: '10.9.9.9', hostnames: ['db.internal'] }],
    securityContext: { runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000], runAsNonRoot: true },
    volumes: [
      { name: 'conf', configMap: { name: 'app-config', items: [{ key: 'app.conf', path: 'app.conf' }], defaultMode: 0o440 } },
      { name: 'scratch', emptyDir: {} },
    ],
    containers: [
      {
        name: 'main',
        image: 'busybox',
        // The kubelet expands $(VAR) before the shell sees it, quotes or not; $$ keeps a literal $( for the shell's single quotes.
        command: ['sh', '-c', "echo '$(GREETING) from $(POD_NAME) $$(KEPT)' > /scratch/cmd-out; echo started; exec sleep 1000"],
        env: [
          { name: 'GREETING', value: 'hello' },
          { name: 'LEVEL', valueFrom: { configMapKeyRef: { name: 'app-config', key: 'LEVEL' } } },
          { name: 'PASSWORD', valueFrom: { secretKeyRef: { name: 'creds', key: 'password' } } },
          { name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
          { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
          { name: 'COMBINED', value: '$(LEVEL)-$(POD_NAME)' },
        ],
        volumeMounts: [
          { name: 'conf', mountPath: '/etc/app' },
          { name: 'scratch', mountPath: '/scratch' },
          { name: 'scratch', mountPath: '/per-pod', subPathExpr: 'by-pod/$(POD_NAME)' },
        ],
        resources: { requests: { cpu: '100m', memory: '32Mi' }, limits: { cpu: '500m', memory: '64Mi' } },
        terminationMessagePath: '/dev/termination-log',
        terminationMessagePolicy: 'File',
      },
    ],
  },
};

describe.skipIf(!isRoot)('kubelet-lite configs on a real skiff runtime', () => {
  let fx: PodFixture | undefined;
  let vm: HostVolumeManager;
  let ctx: PodContext;
  let sandboxId = '';
  let containerId = '';

  beforeAll(async () => {
    fx = await startPodFixture(inject('registryHost'), 'test/kl-config');
    const rootDir = path.join(fx.dirs.base, 'kubelet');
    vm = new HostVolumeManager({ rootDir });
    ctx = {
      pod,
      uid: 'kl-uid-1',
      nodeName: 'node-a',
      hostIP: '127.0.0.1',
      clusterDomain: 'cluster.local',
      clusterDNS: ['10.96.0.10'],
      hostResolvConf: 'nameserver 192.0.2.53\nsearch corp.example\n',
      podDir: path.join(rootDir, 'pods', 'kl-uid-1'),
      objects,
    };
  });

  afterAll(async () => {
    if (!fx) return;
    if (sandboxId) {
      await fx.skiff.runtime.StopPodSandbox({ podSandboxId: sandboxId }).catch(() => undefined);
      await fx.skiff.runtime.RemovePodSandbox({ podSandboxId: sandboxId }).catch(() => undefined);
    }
    await vm?.tearDown(ctx.uid).catch(() => undefined);
    const leaks = await fx.cleanup();
    expect(leaks.mounts, 'mounts left behind').toEqual([]);
    expect(leaks.processes, 'processes left behind').toEqual([]);
  });

  async function exec(cmd: string): Promise<{ out: string; err: string; code: number }> {
    const r = await fx!.skiff.runtime.ExecSync({ containerId, cmd: ['sh', '-c', cmd], timeout: 10 });
    return { out: Buffer.from(r.stdout!).toString(), err: Buffer.from(r.stderr!).toString(), code: r.exitCode ?? -1 };
  }

  it('runs the Pod as it says: env, command expansion, volumes, user, /etc/hosts, DNS, termination message', async () => {
    const skiff = fx!.skiff;
    const builder = new KubeletConfigBuilder();
    const volumes = await vm.setUp(ctx);
    const sandboxConfig = builder.sandboxConfig(ctx, 0);
    sandboxId = (await skiff.runtime.RunPodSandbox({ config: sandboxConfig })).podSandboxId!;
    ctx.podIP = (await skiff.runtime.PodSandboxStatus({ podSandboxId: sandboxId })).status!.network!.ip!;
    expect(ctx.podIP).toMatch(/^10\.88\./);
    const etcHosts = await vm.writeEtcHosts(ctx);
    const config = builder.containerConfig(ctx, pod.spec!.containers[0], { kind: 'app', restartCount: 0, image: fx!.image, volumes, etcHosts, imageUser: {} });
    containerId = (await skiff.runtime.CreateContainer({ podSandboxId: sandboxId, config, sandboxConfig })).containerId!;
    await skiff.runtime.StartContainer({ containerId });

    const log = path.join(ctx.podDir, 'logs', 'main', '0.log');
    await waitFor('the container to log', async () => (await fs.readFile(log, 'utf8').catch(() => '')).includes('started'));

    const ids = (await exec('id -u; id -g; id -G')).out.split('\n');
    expect(ids.slice(0, 2)).toEqual(['1000', '3000']);
    expect(ids[2].split(' ').sort()).toEqual(['2000', '3000', '4000']);
    const env = (await exec('env')).out;
    expect(env).toContain('GREETING=hello\n');
    expect(env).toContain('LEVEL=debug\n');
    expect(env).toContain('PASSWORD=s3cr3t\n');
    expect(env).toContain('POD_NAME=cfgpod\n');
    expect(env).toContain(`POD_IP=${ctx.podIP}\n`);
    expect(env).toContain('COMBINED=debug-cfgpod\n');
    expect((await exec('cat /scratch/cmd-out')).out).toBe('hello from cfgpod $(KEPT)\n');

    // The configMap volume: the key, its mode, read-only.
    expect((await exec('cat /etc/app/app.conf')).out).toBe('color=blue\n');
    expect((await exec('ls /etc/app')).out).toBe('app.conf\n');
    // defaultMode 0440, group-owned by the fsGroup: readable by the pod's user, by no one else.
    expect((await exec('stat -L -c %a:%g /etc/app/app.conf')).out).toBe('440:2000\n');
    const ro = await exec('(echo x > /etc/app/new) 2>&1; echo rc=$?');
    expect(ro.out).toMatch(/Read-only file system/);
    // The emptyDir: writable by the pod's user; the subPathExpr lands inside it.
    expect((await exec('echo per-pod > /per-pod/f && cat /scratch/by-pod/cfgpod/f')).out).toBe('per-pod\n');
    expect(await fs.readFile(path.join(volumes.get('scratch')!, 'by-pod', 'cfgpod', 'f'), 'utf8')).toBe('per-pod\n');

    const hosts = (await exec('cat /etc/hosts')).out;
    expect(hosts).toMatch(/^# Kubernetes-managed hosts file\.\n127\.0\.0\.1\tlocalhost\n/);
    expect(hosts).toContain(`${ctx.podIP}\tcfgpod\n`);
    expect(hosts).toContain('# Entries added by HostAliases.\n10.9.9.9\tdb.internal\n');
    expect((await exec('hostname')).out).toBe('cfgpod\n');
    const resolv = (await exec('cat /etc/resolv.conf')).out;
    expect(resolv).toContain('nameserver 10.96.0.10');
    expect(resolv).toMatch(/search shop\.svc\.cluster\.local svc\.cluster\.local cluster\.local corp\.example/);
    expect(resolv).toContain('ndots:5');

    // The container's memory limit reached the cgroup.
    const limit = (await exec('cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes')).out.trim();
    expect(limit).toBe(String(64 * 1024 * 1024));

    // The termination message: written in the container, read on the host.
    await exec('echo bye > /dev/termination-log');
    expect(await fs.readFile(terminationLogHostPath(ctx.podDir, 'main', 0), 'utf8')).toBe('bye\n');
  });

  it('refresh() updates the configMap volume inside the running container', async () => {
    expect(containerId).not.toBe('');
    configMaps[0] = { ...configMaps[0], data: { 'app.conf': 'color=green\n', LEVEL: 'debug' } };
    await vm.refresh(ctx);
    expect((await exec('cat /etc/app/app.conf')).out).toBe('color=green\n');
  });
});
