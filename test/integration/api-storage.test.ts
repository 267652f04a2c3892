/**
 * Storage on a real `skiff node`, driven by real kubectl: the built-in
 * local-path provisioner as the default StorageClass (WaitForFirstConsumer,
 * reclaim Delete), a pod's data surviving the pod's deletion and the node's
 * kill -9, reclaim Delete removing the directory and Retain keeping it,
 * static hostPath PVs, ephemeral volumes, pvc-protection, and the hostile
 * inputs: a hostPath PV on /, a PV pointing outside the provisioner's
 * directory, symlinks a container plants in its volume, a claim of 1Ei.
 */
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import type { PersistentVolume, PersistentVolumeClaim, Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const claim = (name: string, extra = '') => `
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ${name}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 64Mi}}
${extra}`;

const pod = (name: string, claimName: string, script: string, volume?: string) => `
apiVersion: v1
kind: Pod
metadata: {name: ${name}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: c
    image: skiff.local/demo-web:1
    imagePullPolicy: Never
    command: [sh, -c, '${script}; trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
${volume ?? `    persistentVolumeClaim: {claimName: ${claimName}}`}
`;

const running = (p: Pod) => p.status?.phase === 'Running' && (p.status.containerStatuses ?? []).every((c) => c.state?.running);

describe.skipIf(!isRoot)('storage on a real skiff node, with real kubectl', () => {
  const node = new SkiffNode();
  useSkiffNode(node);
  const volumes = () => path.join(node.dirs.kubelet, 'volumes');
  const getPvc = (name: string) => node.getJson<PersistentVolumeClaim>(['pvc', name]);
  const exists = (p: string) => fs.stat(p).then(() => true, () => false);
  const runningPod = (name: string) =>
    waitFor(`${name} running`, async () => {
      const p = await node.getJson<Pod>(['pod', name]);
      return running(p) ? p : undefined;
    }, 90_000);
  const gone = (args: string[]) => waitFor(`${args.join(' ')} gone`, async () => (await node.kubectl(['get', ...args])).stderr.includes('NotFound'), 60_000);
  const exec = (podName: string, cmd: string) => node.kubectlOk(['exec', podName, '--', 'sh', '-c', cmd]);

  it('has local-path as the default StorageClass, printed as kubectl prints it', async () => {
    const out = await waitFor('the default class', async () => {
      const r = await node.kubectl(['get', 'sc']);
      return r.stdout.includes('local-path') ? r.stdout : undefined;
    }, 30_000);
    expect(out).toMatch(/^NAME\s+PROVISIONER\s+RECLAIMPOLICY\s+VOLUMEBINDINGMODE\s+ALLOWVOLUMEEXPANSION\s+AGE\n/);
    expect(out).toMatch(/local-path \(default\)\s+skiff\.io\/local-path\s+Delete\s+WaitForFirstConsumer\s+false\s+\d+s/);
    expect(await node.kubectlOk(['api-resources', '--api-group', 'storage.k8s.io'])).toMatch(/storageclasses\s+sc\s+storage\.k8s\.io\/v1\s+false\s+StorageClass/);
  });

  it('provisions a claim once a pod uses it; the data survives the pod, a new pod and a kill -9 of the node', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: claim('data') });
    let c = await getPvc('data');
    // The DefaultStorageClass admission gave it the class; nothing uses it yet, so it waits.
    expect(c.spec?.storageClassName).toBe('local-path');
    expect(c.metadata?.finalizers).toContain('kubernetes.io/pvc-protection');
    await waitFor('the WaitForFirstConsumer event', async () => (await node.kubectlOk(['get', 'events', '--field-selector', 'involvedObject.name=data'])).includes('waiting for first consumer'), 30_000);
    expect((await getPvc('data')).status?.phase).toBe('Pending');

    await node.kubectlOk(['apply', '-f', '-'], { input: pod('writer', 'data', 'echo kept > /data/hello') });
    await runningPod('writer');
    c = await waitFor('data bound', async () => {
      const x = await getPvc('data');
      return x.status?.phase === 'Bound' ? x : undefined;
    }, 30_000);
    const pvName = c.spec!.volumeName!;
    expect(pvName).toBe(`pvc-${c.metadata!.uid}`);
    expect(c.metadata?.annotations?.['pv.kubernetes.io/bind-completed']).toBe('yes');
    const pv = await node.getJson<PersistentVolume>(['pv', pvName]);
    expect(pv.spec).toMatchObject({ persistentVolumeReclaimPolicy: 'Delete', storageClassName: 'local-path', hostPath: { path: path.join(volumes(), pvName) }, claimRef: { name: 'data', namespace: 'default', uid: c.metadata!.uid } });
    expect(pv.metadata?.finalizers).toContain('kubernetes.io/pv-protection');
    expect((await fs.stat(path.join(volumes(), pvName))).mode & 0o777).toBe(0o777);
    expect(await waitFor('the pod\'s file', () => fs.readFile(path.join(volumes(), pvName, 'hello'), 'utf8').catch(() => undefined), 10_000)).toBe('kept\n');

    // kubectl get pvc,pv,sc prints the binding as upstream does.
    const table = await node.kubectlOk(['get', 'pvc,pv,sc']);
    expect(table).toMatch(/NAME\s+STATUS\s+VOLUME\s+CAPACITY\s+ACCESS MODES\s+STORAGECLASS\s+VOLUMEATTRIBUTESCLASS\s+AGE\n/);
    expect(table).toMatch(new RegExp(`persistentvolumeclaim/data\\s+Bound\\s+${pvName}\\s+64Mi\\s+RWO\\s+local-path\\s+<unset>\\s+\\d+s`));
    expect(table).toMatch(/NAME\s+CAPACITY\s+ACCESS MODES\s+RECLAIM POLICY\s+STATUS\s+CLAIM\s+STORAGECLASS\s+VOLUMEATTRIBUTESCLASS\s+REASON\s+AGE\n/);
    expect(table).toMatch(new RegExp(`persistentvolume/${pvName}\\s+64Mi\\s+RWO\\s+Delete\\s+Bound\\s+default/data\\s+local-path\\s+<unset>\\s+\\d+s`));
    expect(table).toMatch(/storageclass\.storage\.k8s\.io\/local-path \(default\)\s+skiff\.io\/local-path/);

    // The pod goes and another comes: same claim, same data.
    await node.kubectlOk(['delete', 'pod', 'writer', '--wait=true']);
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('reader', 'data', 'echo again >> /data/hello') });
    await runningPod('reader');
    await waitFor('the second line', async () => (await exec('reader', 'cat /data/hello')) === 'kept\nagain\n', 10_000);

    // kill -9 of the node: it comes back with the claim, the volume and the data.
    expect(await node.stopProcess('SIGKILL')).toBe('SIGKILL');
    await node.start();
    await runningPod('reader');
    expect((await getPvc('data')).status?.phase).toBe('Bound');
    expect(await exec('reader', 'cat /data/hello')).toBe('kept\nagain\n');

    // Deleting the claim waits for the pod that uses it (pvc-protection), then reclaim Delete removes the directory.
    await node.kubectlOk(['delete', 'pvc', 'data', '--wait=false']);
    await new Promise((r) => setTimeout(r, 1500));
    expect(await node.kubectlOk(['get', 'pvc', 'data'])).toMatch(/data\s+Terminating/);
    expect(await exists(path.join(volumes(), pvName, 'hello'))).toBe(true);
    await node.kubectlOk(['delete', 'pod', 'reader', '--wait=true']);
    await gone(['pvc', 'data']);
    await gone(['pv', pvName]);
    await waitFor('the volume directory removed', async () => !(await exists(path.join(volumes(), pvName))), 30_000);
  }, 400_000);

  it('binds a static hostPath PV by class and size; Retain keeps it Released with its data', async () => {
    const dir = path.join(node.base, 'static');
    // Writable by the image's user, as an administrator prepares a static volume's directory.
    await fs.mkdir(dir, { recursive: true, mode: 0o777 });
    await fs.chmod(dir, 0o777);
    await node.kubectlOk(['apply', '-f', '-'], {
      input: `
apiVersion: v1
kind: PersistentVolume
metadata: {name: static-small}
spec:
  capacity: {storage: 10Mi}
  accessModes: [ReadWriteOnce]
  storageClassName: manual
  hostPath: {path: ${path.join(node.base, 'too-small')}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: static-big}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteOnce, ReadWriteMany]
  storageClassName: manual
  hostPath: {path: ${dir}, type: Directory}
---${claim('manual-claim', '  storageClassName: manual')}`,
    });
    const c = await waitFor('manual-claim bound', async () => {
      const x = await getPvc('manual-claim');
      return x.status?.phase === 'Bound' ? x : undefined;
    }, 30_000);
    expect(c.spec?.volumeName).toBe('static-big');
    expect(c.status?.capacity?.storage).toBe('1Gi');
    expect((await node.getJson<PersistentVolume>(['pv', 'static-small'])).status?.phase).toBe('Available');
    await node.kubectlOk(['apply', '-f', '-'], { input: pod('static-user', 'manual-claim', 'echo static > /data/s') });
    await runningPod('static-user');
    expect(await waitFor('the pod\'s file', () => fs.readFile(path.join(dir, 's'), 'utf8').catch(() => undefined), 10_000)).toBe('static\n');
    await node.kubectlOk(['delete', 'pod', 'static-user', '--wait=true']);
    await node.kubectlOk(['delete', 'pvc', 'manual-claim', '--wait=true']);
    const pv = await waitFor('static-big released', async () => {
      const x = await node.getJson<PersistentVolume>(['pv', 'static-big']);
      return x.status?.phase === 'Released' ? x : undefined;
    }, 30_000);
    expect(pv.spec?.persistentVolumeReclaimPolicy).toBe('Retain');
    expect(await node.kubectlOk(['get', 'pv', 'static-big'])).toMatch(/static-big\s+1Gi\s+RWO,RWX\s+Retain\s+Released\s+default\/manual-claim\s+manual/);
    expect(await fs.readFile(path.join(dir, 's'), 'utf8')).toBe('static\n');
  }, 200_000);

  it('makes an ephemeral volume\'s claim owned by its pod, and it goes with the pod', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: pod('eph', '', 'echo e > /data/e', `    ephemeral:
      volumeClaimTemplate:
        spec:
          accessModes: [ReadWriteOnce]
          resources: {requests: {storage: 8Mi}}`),
    });
    await runningPod('eph');
    const c = await getPvc('eph-data');
    expect(c.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'Pod', name: 'eph', controller: true });
    expect(c.status?.phase).toBe('Bound');
    const dir = path.join(volumes(), c.spec!.volumeName!);
    expect(await waitFor('the pod\'s file', () => fs.readFile(path.join(dir, 'e'), 'utf8').catch(() => undefined), 10_000)).toBe('e\n');
    await node.kubectlOk(['delete', 'pod', 'eph', '--wait=true']);
    await gone(['pvc', 'eph-data']);
    await waitFor('the ephemeral volume removed', async () => !(await exists(dir)), 30_000);
  }, 200_000);

  it('keeps a pod whose claim cannot bind waiting, with the reason, and runs it once the claim binds', async () => {
    await node.kubectlOk(['apply', '-f', '-'], { input: `${claim('later', '  storageClassName: nobody-has-this')}\n---${pod('waiter', 'later', 'true')}` });
    const p = await waitFor('waiter told why', async () => {
      const x = await node.getJson<Pod>(['pod', 'waiter']);
      const w = x.status?.containerStatuses?.[0]?.state?.waiting;
      return x.status?.phase === 'Pending' && /not bound/.test(JSON.stringify(x.status)) ? { x, w } : undefined;
    }, 60_000);
    expect(p.x.status?.phase).toBe('Pending');
    await waitFor('the claim\'s event', async () => /storageclass\.storage\.k8s\.io "nobody-has-this" not found/.test(await node.kubectlOk(['get', 'events', '--field-selector', 'involvedObject.name=later'])), 30_000);
    // A PV of that class appears: the claim binds, the pod starts.
    const dir = path.join(node.base, 'later');
    await fs.mkdir(dir, { recursive: true });
    await node.kubectlOk(['apply', '-f', '-'], { input: `apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: later-pv}\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  storageClassName: nobody-has-this\n  hostPath: {path: ${dir}}\n` });
    await runningPod('waiter');
    await node.kubectlOk(['delete', 'pod', 'waiter', '--wait=true']);
  }, 200_000);

  it('binds a claim a manifest file defines and runs the file\'s pod on it; the claim stays the file\'s', async () => {
    const file = path.join(node.dirs.manifests, 'db.yaml');
    await fs.writeFile(`${file}.tmp`, `${claim('filed')}\n---${pod('filed-db', 'filed', 'echo from-file > /data/f')}`);
    await fs.rename(`${file}.tmp`, file);
    const c = await waitFor('the file\'s claim bound', async () => {
      const x = await getPvc('filed');
      return x.status?.phase === 'Bound' ? x : undefined;
    }, 90_000);
    expect(c.spec?.storageClassName).toBe('local-path');
    expect(c.metadata?.annotations?.['pv.kubernetes.io/bind-completed']).toBe('yes');
    const pvName = c.spec!.volumeName!;
    expect(await waitFor('the file pod\'s data', () => fs.readFile(path.join(volumes(), pvName, 'f'), 'utf8').catch(() => undefined), 90_000)).toBe('from-file\n');
    // The binding is the node's; the spec is still the file's.
    const r = await node.kubectl(['patch', 'pvc', 'filed', '--type=merge', '-p', '{"spec":{"resources":{"requests":{"storage":"128Mi"}}}}']);
    expect(r.stderr).toMatch(/is defined by the manifest file .*db\.yaml/);
    // The file read again (touched, unchanged) keeps the binding.
    await fs.writeFile(`${file}.tmp`, await fs.readFile(file));
    await fs.rename(`${file}.tmp`, file);
    await new Promise((res) => setTimeout(res, 1_500));
    expect((await getPvc('filed')).spec?.volumeName).toBe(pvName);
    await fs.rm(file);
    await gone(['pvc', 'filed']);
    await waitFor('the volume reclaimed', async () => !(await exists(path.join(volumes(), pvName))), 60_000);
  }, 240_000);

  describe('hostile input', () => {
    it('refuses a hostPath PV on /, /etc or the node\'s root dir', async () => {
      for (const p of ['/', '/etc', node.dirs.kubelet, path.join(node.dirs.kubelet, 'pods')]) {
        const r = await node.kubectl(['apply', '-f', '-'], { input: `apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: evil}\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  hostPath: {path: ${p}}\n` });
        expect(r.status).toBe(1);
        expect(r.stderr).toMatch(/PersistentVolume "evil" is invalid: spec\.hostPath\.path: Forbidden: /);
      }
    });

    it('never deletes outside its directory: a PV naming another path as if provisioned, and symlinks planted by the container', async () => {
      // The victim outside: a PV that claims to be the provisioner's (annotation, reclaim Delete) but points at it.
      const victim = path.join(node.base, 'victim');
      await fs.mkdir(victim, { recursive: true });
      await fs.writeFile(path.join(victim, 'precious'), 'x');
      await node.kubectlOk(['apply', '-f', '-'], {
        input: `apiVersion: v1\nkind: PersistentVolume\nmetadata:\n  name: forged\n  annotations: {pv.kubernetes.io/provisioned-by: skiff.io/local-path}\nspec:\n  capacity: {storage: 1Gi}\n  accessModes: [ReadWriteOnce]\n  persistentVolumeReclaimPolicy: Delete\n  storageClassName: forged\n  hostPath: {path: ${victim}}\n---${claim('forged-claim', '  storageClassName: forged')}`,
      });
      await waitFor('forged-claim bound', async () => (await getPvc('forged-claim')).status?.phase === 'Bound', 30_000);
      await node.kubectlOk(['delete', 'pvc', 'forged-claim', '--wait=true']);
      const pv = await waitFor('forged failed', async () => {
        const x = await node.getJson<PersistentVolume>(['pv', 'forged']);
        return x.status?.phase === 'Failed' ? x : undefined;
      }, 30_000);
      expect(pv.status?.message).toMatch(/is not its directory .*: not deleted/);
      expect(await fs.readFile(path.join(victim, 'precious'), 'utf8')).toBe('x');

      // A container links its volume to the victim (and to /): reclaim removes the links, never their targets.
      await node.kubectlOk(['apply', '-f', '-'], { input: `${claim('linky')}\n---${pod('linker', 'linky', `ln -s ${victim} /data/to-victim; ln -s / /data/to-root; mkdir -p /data/d; ln -s ${path.join(victim, 'precious')} /data/d/file`)}` });
      await runningPod('linker');
      const pvName = (await getPvc('linky')).spec!.volumeName!;
      expect((await fs.lstat(path.join(volumes(), pvName, 'to-victim'))).isSymbolicLink()).toBe(true);
      await node.kubectlOk(['delete', 'pod', 'linker', '--wait=true']);
      await node.kubectlOk(['delete', 'pvc', 'linky', '--wait=true']);
      await waitFor('linky\'s directory removed', async () => !(await exists(path.join(volumes(), pvName))), 30_000);
      expect(await fs.readFile(path.join(victim, 'precious'), 'utf8')).toBe('x');
      expect(spawnSync('test', ['-d', '/etc']).status).toBe(0);
    }, 200_000);

    it('takes a claim of 1Ei and says why it cannot be provisioned; it stays Pending', async () => {
      await node.kubectlOk(['apply', '-f', '-'], {
        input: `apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: local-now}\nprovisioner: skiff.io/local-path\nvolumeBindingMode: Immediate\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: huge}\nspec:\n  storageClassName: local-now\n  accessModes: [ReadWriteOnce]\n  resources: {requests: {storage: 1Ei}}\n`,
      });
      const events = await waitFor('ProvisioningFailed', async () => {
        const out = await node.kubectlOk(['get', 'events', '--field-selector', 'involvedObject.name=huge']);
        return out.includes('ProvisioningFailed') ? out : undefined;
      }, 30_000);
      expect(events).toMatch(/requested 1Ei but the node's volume filesystem holds \d+ bytes in all/);
      expect((await getPvc('huge')).status?.phase).toBe('Pending');
      expect((await fs.readdir(volumes()).catch(() => [])).length).toBe(0);
      // An Immediate claim of a size that fits is provisioned at once, with no pod.
      await node.kubectlOk(['apply', '-f', '-'], { input: claim('now', '  storageClassName: local-now') });
      await waitFor('now bound', async () => (await getPvc('now')).status?.phase === 'Bound', 30_000);
      await node.kubectlOk(['delete', 'pvc', 'now', 'huge', '--wait=true']);
    }, 120_000);
  });
});
