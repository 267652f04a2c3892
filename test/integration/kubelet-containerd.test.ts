/**
 * kubelet-lite is a plain CRI client: the same agent runs a pod through
 * containerd 1.6 (which has no container event stream, so the agent relists).
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { busyboxImage } from '../helpers/busybox.js';
import { containerdPresent, startContainerd, type RunningContainerd } from '../helpers/containerd.js';
import { isRoot } from '../helpers/env.js';
import { AgentProcess, containerStatus, ready } from '../helpers/kubelet.js';
import { TestNetns } from '../helpers/netns.js';
import { Pusher } from '../helpers/oci.js';
import { freePort, waitFor } from '../helpers/registry.js';

describe.skipIf(!isRoot || !containerdPresent)('kubelet-lite against containerd', () => {
  let base: string;
  let ns: TestNetns;
  let ctrd: RunningContainerd | undefined;
  let agent: AgentProcess | undefined;
  let status: string;
  let image: string;
  const manifests = () => path.join(base, 'manifests');

  beforeAll(async () => {
    const host = inject('registryHost');
    const pusher = new Pusher(`http://${host}`);
    await pusher.image('test/kubelet-ctrd', 'v1', await busyboxImage());
    // containerd's sandboxes need a pause image: a busybox that sleeps does the job.
    await pusher.image('test/kubelet-ctrd-pause', 'v1', await busyboxImage({ Entrypoint: ['/bin/sleep', '2147483647'], Cmd: [] }));
    image = `${host}/test/kubelet-ctrd:v1`;
    base = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-ctrd-'));
    await fs.mkdir(manifests());
    ns = new TestNetns().create();
    await ns.bridgePort(Number(host.split(':')[1]), base);
    ctrd = await startContainerd(base, ns, host, `${host}/test/kubelet-ctrd-pause:v1`);
    const port = await freePort();
    agent = await new AgentProcess(
      ['--manifests', manifests(), '--runtime-endpoint', `unix://${ctrd.socket}`, '--status-address', `127.0.0.1:${port}`, '--root-dir', path.join(base, 'kubelet'), '--node-name', 'ctrd-node', '--log-level', 'debug'],
      (a) => ns.wrap(a),
    ).start();
    status = `http://127.0.0.1:${await ns.exposePort(port, base)}`;
  });

  afterAll(async () => {
    await agent?.stop();
    if (ctrd) {
      // Remove what the agent left (it leaves pods running on purpose) through crictl's equivalent: the agent's own deletion path ran in the test.
      await ctrd.stop();
    }
    await ns?.destroy();
    if (base) await fs.rm(base, { recursive: true, force: true });
  });

  const pod = async (name: string): Promise<Pod | undefined> => {
    const r = await fetch(`${status}/pods/default/${name}`);
    return r.status === 200 ? ((await r.json()) as Pod) : undefined;
  };

  it('runs a pod with a readiness probe through containerd, then removes it when the manifest goes', async () => {
    await fs.writeFile(
      path.join(manifests(), 'p.yaml'),
      `apiVersion: v1
kind: Pod
metadata: {name: viactrd}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: c
    image: ${image}
    command: [sh, -c, "touch /tmp/ready; exec sleep 3600"]
    readinessProbe:
      exec: {command: [test, -f, /tmp/ready]}
      periodSeconds: 1
`,
    );
    const p = await waitFor('viactrd Ready', async () => {
      const x = await pod('viactrd');
      return x && ready(x) ? x : undefined;
    }, 90_000).catch(async (err) => {
      throw new Error(`${(err as Error).message}\nagent: ${agent!.log.split('\n').slice(-30).join('\n')}\ncontainerd: ${(await ctrd!.log()).split('\n').slice(-20).join('\n')}`);
    });
    expect(containerStatus(p, 'c')?.containerID).toMatch(/^containerd:\/\/[0-9a-f]{64}$/);
    expect(p.status?.podIP).toMatch(/^10\.99\./);
    await fs.rm(path.join(manifests(), 'p.yaml'));
    await waitFor('viactrd to be gone', async () => ((await pod('viactrd')) ? undefined : true), 60_000);
  });
});
