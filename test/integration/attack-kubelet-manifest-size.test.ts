/**
 * Manifest content the admin copied from elsewhere: 4 MiB (under the size
 * limit) of `[0,0,0,...]`. The yaml library needs seconds and gigabytes for
 * it; the agent must keep answering its status API, stay alive, report the
 * file in /manifests, and go on running the pods of the other files.
 */
import fs from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { podYaml, ready, startNode, type NodeFixture } from '../helpers/kubelet.js';
import { waitFor } from '../helpers/registry.js';

describe.skipIf(!isRoot)('attack kubelet-lite: a manifest that is cheap to write and dear to parse', () => {
  let node: NodeFixture;

  beforeAll(async () => {
    node = await startNode(inject('registryHost'), 'test/attack-kubelet-manifest-size');
  });

  afterAll(async () => {
    const leaks = await node?.cleanup();
    expect(leaks?.mounts ?? []).toEqual([]);
    expect(leaks?.processes ?? []).toEqual([]);
  });

  const rssMiB = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${node.agent.child.pid}/status`, 'utf8'))![1]) / 1024;

  it('parses it off the event loop, under a heap limit, and reports it', async () => {
    const text = 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: flat}\nx: [' + '0,'.repeat(2_000_000) + '0]\n';
    await node.write('flat.yaml', text);
    await node.write('web.yaml', podYaml('web', node.image, `  containers:
  - name: main
    image: IMAGE
    command: [sleep, "3600"]
`));
    let slowest = 0;
    let maxRss = 0;
    const problem = await waitFor('the file to be reported', async () => {
      const t = Date.now();
      const r = await node.get<{ items: { file: string; reason: string }[] }>('/manifests');
      slowest = Math.max(slowest, Date.now() - t);
      maxRss = Math.max(maxRss, rssMiB());
      return r.body.items.find((p) => path.basename(p.file) === 'flat.yaml');
    }, 40_000);
    expect(problem.reason).toMatch(/cannot parse/);
    expect(slowest).toBeLessThan(1000);
    // The parser's heap is capped (512 MiB); the agent never went far past it.
    expect(maxRss).toBeLessThan(1024);
    expect(node.agent.child.exitCode).toBeNull();
    await node.waitPod('web', ready, 'Ready');
    await node.remove('flat.yaml');
    await node.remove('web.yaml');
    await node.waitGone('web');
  }, 90_000);
});
