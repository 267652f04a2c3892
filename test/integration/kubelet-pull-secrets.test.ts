/**
 * Image pull secrets through a real agent and runtime: a registry that
 * wants a username and password (basic auth in front of the real
 * registry) serves a pod whose `imagePullSecrets` (or ServiceAccount) name a
 * kubernetes.io/dockerconfigjson or dockercfg Secret, and refuses the pod
 * that has none (ErrImagePull). A missing or malformed secret is an event.
 */
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { Front } from '../helpers/front.js';
import { containerStatus, podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';

const USER = 'puller';
const PASS = 'pw-7f3a';

const b64 = (s: string) => Buffer.from(s).toString('base64');

describe.skipIf(!isRoot)('kubelet-lite: image pull secrets against a registry with basic auth', () => {
  let node: NodeFixture;
  let front: Front;
  let image: string;

  beforeAll(async () => {
    const reg = inject('registryHost');
    node = await startNode(reg, 'test/kubelet-pull-secrets');
    front = await new Front({ upstream: `http://${reg}`, auth: { kind: 'basic', user: USER, pass: PASS } }).start();
    await node.pods.ns.bridgePort(Number(front.host.split(':')[1]), node.pods.dirs.base);
    image = `${front.host}/test/kubelet-pull-secrets:v1`;
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    await front?.close();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const pod = (name: string, extra: string) =>
    podYaml(name, image, `  terminationGracePeriodSeconds: 1
${extra}  containers:
  - name: main
    image: IMAGE
    imagePullPolicy: Always
    command: [sleep, "3600"]
`);

  const pullFailed = (p: Pod) => ['ErrImagePull', 'ImagePullBackOff'].includes(containerStatus(p, 'main')?.state?.waiting?.reason ?? '');

  it('fails with ErrImagePull without credentials, and says the registry refused', async () => {
    await node.write('anon.yaml', pod('anon', ''));
    const p = await node.waitPod('anon', pullFailed, 'the pull to fail');
    expect(containerStatus(p, 'main')?.state?.waiting?.message ?? '').toMatch(/Failed to pull image|Back-off pulling image/);
    const failed = (await node.events('anon')).find((e) => e.reason === 'Failed');
    expect(failed?.message).toMatch(/needs a username and password|unauthorized|refused/i);
    await node.remove('anon.yaml');
    await node.waitGone('anon');
  });

  it('pulls with a kubernetes.io/dockerconfigjson secret named by the pod (https:// key, auth field)', async () => {
    const config = JSON.stringify({ auths: { [`https://${front.host}`]: { auth: b64(`${USER}:${PASS}`) } } });
    await node.write('json.yaml', `apiVersion: v1
kind: Secret
metadata:
  name: regcred
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: ${b64(config)}
---
${pod('withjson', '  imagePullSecrets:\n  - name: regcred\n')}`);
    await node.waitPod('withjson', ready, 'ready after pulling with the secret');
    await node.remove('json.yaml');
    await node.waitGone('withjson');
  });

  it("pulls with the ServiceAccount's pull secrets (a dockercfg secret keyed by host and repository path) when the pod names none", async () => {
    const config = JSON.stringify({ [`${front.host}/test`]: { username: USER, password: PASS } });
    await node.write('sa.yaml', `apiVersion: v1
kind: Secret
metadata:
  name: oldcred
type: kubernetes.io/dockercfg
data:
  .dockercfg: ${b64(config)}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: builder
imagePullSecrets:
- name: oldcred
---
${pod('viasa', '  serviceAccountName: builder\n')}`);
    await node.waitPod('viasa', ready, 'ready after pulling with the ServiceAccount\'s secret');
    await node.remove('sa.yaml');
    await node.waitGone('viasa');
  });

  it('a missing secret and a malformed one are Warning events, and the pull goes on with the secret that works', async () => {
    const good = JSON.stringify({ auths: { [front.host]: { username: USER, password: PASS } } });
    // A wrong password for another registry and a path that does not cover the image: neither is tried.
    const other = JSON.stringify({ auths: { 'other.example:5000': { username: 'x', password: 'y' }, [`${front.host}/elsewhere`]: { username: USER, password: 'wrong' } } });
    await node.write('mixed.yaml', `apiVersion: v1
kind: Secret
metadata:
  name: broken
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: ${b64('{"auths": [not json')}
---
apiVersion: v1
kind: Secret
metadata:
  name: other
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: ${b64(other)}
---
apiVersion: v1
kind: Secret
metadata:
  name: good
type: kubernetes.io/dockerconfigjson
data:
  .dockerconfigjson: ${b64(good)}
---
${pod('mixed', '  imagePullSecrets:\n  - name: nosuch\n  - name: broken\n  - name: other\n  - name: good\n')}`);
    await node.waitPod('mixed', ready, 'ready with the good secret');
    const events = (await node.events('mixed')).filter((e) => e.reason === 'FailedToRetrieveImagePullSecret');
    expect(events.every((e) => e.type === 'Warning')).toBe(true);
    expect(events.map((e) => e.message)).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/Unable to retrieve some image pull secrets \(default\/nosuch\)/),
        expect.stringMatching(/default\/broken has a \.dockerconfigjson that is not JSON/),
      ]),
    );
    // Only the credential that covers the image was sent: no failed logins.
    expect((await node.events('mixed')).filter((e) => e.reason === 'Failed')).toEqual([]);
    await node.remove('mixed.yaml');
    await node.waitGone('mixed');
  });
});
