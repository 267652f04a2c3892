/**
 * A crash-looping container fills its termination-log file before every
 * exit. Each instance has its own file under the pod directory on the host;
 * when the agent removes a dead instance it must remove that file (and the
 * message it kept) too, or the host disk fills one file per restart.
 */
import fs from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { containerStatus, podYaml, startNode, type NodeFixture } from '../helpers/kubelet.js';

describe.skipIf(!isRoot)('attack kubelet-lite: termination-log files of removed containers', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/attack-kubelet-termlog');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  it('keeps the files of the instances it keeps, not one per restart', async () => {
    await node.write('fill.yaml', podYaml('fill', node.image, `  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: fill
    image: IMAGE
    command: [sh, -c, "head -c 4000000 /dev/zero > /dev/termination-log; exit 1"]
`));
    // Instances 0, 1 and 2: the first is removed once the second has exited (10 s and 20 s of back-off).
    const p = await node.waitPod('fill', (x) => (containerStatus(x, 'fill')?.restartCount ?? 0) >= 2, 'restarted twice', 90_000);
    const uid = p.metadata!.uid!;
    const dir = path.join(node.rootDir, 'pods', uid, 'containers', 'fill');
    const files = (await fs.readdir(dir)).filter((f) => f.endsWith('.termination-log')).sort();
    expect(files).not.toContain('0.termination-log');
    expect(files.length).toBeLessThanOrEqual(2);
    // The message of the instance kept for lastState is still there, cut to 4 KiB.
    expect(containerStatus(p, 'fill')?.lastState?.terminated?.message?.length).toBe(4096);
    await node.remove('fill.yaml');
    await node.waitGone('fill');
  }, 120_000);

  it('still falls back to the log, which it finds under the pod log directory', async () => {
    await node.write('fb.yaml', podYaml('fb', node.image, `  restartPolicy: Never
  containers:
  - name: main
    image: IMAGE
    terminationMessagePolicy: FallbackToLogsOnError
    command: [sh, -c, "echo oops-from-the-log; exit 2"]
`));
    const p = await node.waitPod('fb', (x) => !!containerStatus(x, 'main')?.state?.terminated, 'terminated', 60_000);
    expect(containerStatus(p, 'main')?.state?.terminated?.message).toBe('oops-from-the-log');
    await node.remove('fb.yaml');
    await node.waitGone('fb');
  });
});
