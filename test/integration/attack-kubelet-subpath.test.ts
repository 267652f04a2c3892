/**
 * A container races the agent's subPath check (the CVE-2017-1002101 shape):
 * it waits for the agent to create a subPath directory in a shared emptyDir,
 * then swaps it for a symlink to the host's /. The check passed on the
 * directory; the runtime bind-mounts the path, following the symlink. The
 * agent must mount what it checked (a bind of the opened directory), never
 * a path the container can still change.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

describe.skipIf(!isRoot)('attack kubelet-lite: subPath symlink swap after the check', () => {
  let node: NodeFixture;
  let victim: string;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/attack-kubelet-subpath');
    victim = path.join(node.pods.dirs.base, 'victim');
    await fs.mkdir(victim, { recursive: true });
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  it('mounts the directory it checked, not the host path a container swapped in', async () => {
    // The sidecar spins (shell builtins only, no forks) until the agent creates "x", then swaps it for a
    // symlink to /; after a while it takes the symlink away so that a refused attempt gets another chance.
    const swapper = [
      'cd /shared',
      'i=0',
      'while [ $i -lt 5 ]; do',
      '  while [ ! -d x ] || [ -L x ]; do :; done',
      '  mv x old$i; ln -s / x; echo swapped $i',
      '  sleep 4; rm -f x; i=$((i+1))',
      'done',
      'exec sleep 3600',
    ].join('\n');
    const victim1 = path.join(victim, 'pwned');
    await node.write('swap.yaml', podYaml('swap', node.image, `  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: shared
    emptyDir: {}
  initContainers:
  - name: swapper
    image: IMAGE
    restartPolicy: Always
    command: [sh, -c, ${JSON.stringify(swapper)}]
    volumeMounts:
    - name: shared
      mountPath: /shared
  containers:
  - name: victim
    image: IMAGE
    command: [sh, -c, ${JSON.stringify(`touch /mnt${victim1} 2>/dev/null && echo escaped; ls /mnt | head -3; exec sleep 3600`)}]
    volumeMounts:
    - name: shared
      mountPath: /mnt
      subPath: x
`));
    let last: Pod | undefined;
    // However the race went, the victim container must run or be refused, and the host file must never appear.
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      last = await node.pod('swap');
      const st = last && containerStatus(last, 'victim');
      if (st?.state?.running) break;
      await new Promise((r) => setTimeout(r, 300));
    }
    await new Promise((r) => setTimeout(r, 1000));
    const escaped = await fs.stat(victim1).then(() => true, () => false);
    const log = await node.get<string>('/containerLogs/default/swap/victim');
    expect({ escaped, log: log.body }).toEqual({ escaped: false, log: expect.not.stringContaining('escaped') });
    // Refusing every subPath would also keep the host safe: the container runs, on the directory that was checked.
    expect(last && containerStatus(last, 'victim')?.state?.running).toBeTruthy();
    await node.remove('swap.yaml');
    await node.waitGone('swap');
  });

  it('still mounts a configMap key with subPath as a file, again after a restart', async () => {
    await node.write('cm.yaml', `apiVersion: v1
kind: ConfigMap
metadata:
  name: app
data:
  app.conf: "color=blue"
---
` + podYaml('cmsub', node.image, `  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  volumes:
  - name: conf
    configMap: {name: app}
  containers:
  - name: main
    image: IMAGE
    command: [sh, -c, "cat /etc/app.conf; echo; [ -f /etc/app.conf ] || echo NOT-A-FILE; exit 1"]
    volumeMounts:
    - name: conf
      mountPath: /etc/app.conf
      subPath: app.conf
`));
    await node.waitPod('cmsub', (p) => (containerStatus(p, 'main')?.restartCount ?? 0) >= 1 && !!containerStatus(p, 'main')?.lastState?.terminated, 'restarted', 60_000);
    // The restarted instance had its own bind of the file, made over the first one's.
    await waitFor('the second instance to print the file', async () => {
      const p = await node.pod('cmsub');
      if ((containerStatus(p!, 'main')?.restartCount ?? 0) < 1) return undefined;
      const log = await node.get<string>('/containerLogs/default/cmsub/main');
      return log.body === 'color=blue\n' ? true : undefined;
    }, 30_000);
    await node.remove('cm.yaml');
    await node.waitGone('cmsub');
  });
});
