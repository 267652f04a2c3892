/**
 * helm 4 against a real `skiff node`, with a chart written by others: the
 * one `helm create` writes (the helm authors' starter chart: a
 * ServiceAccount, a Deployment with probes, a Service, a test hook),
 * generated at test time and changed only through values. install --wait,
 * upgrade with changed values, rollback, list and uninstall, which must take
 * everything the release made.
 */
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { repoRoot } from '../helpers/daemon.js';
import { waitFor } from '../helpers/registry.js';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const HELM = path.join(repoRoot, 'build', 'bin', 'helm');

interface Deploy {
  metadata: { annotations?: Record<string, string> };
  spec: { replicas: number; template: { spec: { serviceAccountName?: string; containers: Array<{ image: string }> } } };
  status: { readyReplicas?: number; updatedReplicas?: number };
}

describe.skipIf(!isRoot)('helm 4 with the starter chart on a real node', () => {
  const node = new SkiffNode();
  let home = '';
  let chart = '';
  const values = ['--set', 'image.repository=skiff.local/demo-web', '--set', 'image.tag=1', '--set', 'image.pullPolicy=Never', '--set', 'service.port=8080'];

  const helm = (args: string[], timeoutMs = 150_000) =>
    new Promise<{ code: number | null; out: string }>((resolve) => {
      const argv = node.ns.wrap([HELM, '--kubeconfig', node.dirs.kubeconfig, ...args]);
      const env = { ...process.env, HOME: home, HELM_CACHE_HOME: path.join(home, 'cache'), HELM_CONFIG_HOME: path.join(home, 'config'), HELM_DATA_HOME: path.join(home, 'data') };
      const c = spawn(argv[0]!, argv.slice(1), { env, cwd: home });
      let out = '';
      c.stdout.on('data', (b: Buffer) => (out += b.toString()));
      c.stderr.on('data', (b: Buffer) => (out += b.toString()));
      const timer = setTimeout(() => c.kill('SIGKILL'), timeoutMs);
      c.on('close', (code) => {
        clearTimeout(timer);
        resolve({ code, out });
      });
    });
  const helmOk = async (args: string[]) => {
    const r = await helm(args);
    expect(r.code, `helm ${args.join(' ')}:\n${r.out}`).toBe(0);
    return r.out;
  };
  const deploy = () => node.getJson<Deploy>(['deployment', 'web-demo']);
  /**
   * What the service answers from the node itself (its cluster IP is served
   * there too, as kube-proxy serves it). The test namespace has no default
   * route, which a host has: one for the service range stands in.
   */
  const fetchService = async () => {
    const ip = (await node.getJson<{ spec: { clusterIP: string } }>(['service', 'web-demo'])).spec.clusterIP;
    spawnSync('ip', ['-n', node.ns.name, 'route', 'replace', `${ip}/32`, 'dev', 'eth0']);
    const argv = node.ns.wrap(['timeout', '3', '/bin/busybox', 'wget', '-q', '-O', '-', `http://${ip}:8080/`]);
    return new Promise<string>((resolve) => {
      const c = spawn(argv[0]!, argv.slice(1));
      let out = '';
      c.stdout.on('data', (b: Buffer) => (out += b.toString()));
      c.on('close', (code) => resolve(code === 0 ? out : `exit ${code}`));
      // (busybox's -T crashes in Debian's static build: timeout(1) bounds the wait instead.)
    });
  };

  useSkiffNode(node);

  it('installs the chart and waits until its Deployment is ready, then its Service answers', async () => {
    home = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-helm-'));
    await helmOk(['create', 'demo']);
    chart = path.join(home, 'demo');
    const out = await helmOk(['install', 'web', chart, ...values, '--wait', '--timeout', '120s']);
    expect(out).toMatch(/STATUS: deployed/);
    expect(out).toMatch(/REVISION: 1/);
    const d = await deploy();
    expect(d.status.readyReplicas).toBe(1);
    expect(d.spec.template.spec.serviceAccountName).toBe('web-demo');
    expect(d.spec.template.spec.containers[0]!.image).toBe('skiff.local/demo-web:1');
    const sa = await node.getJson<{ metadata: { labels: Record<string, string> } }>(['serviceaccount', 'web-demo']);
    expect(sa.metadata.labels['app.kubernetes.io/managed-by']).toBe('Helm');
    expect(await node.kubectlOk(['get', 'sa'])).toMatch(/^NAME\s+SECRETS\s+AGE\ndefault\s+0\s+\S+\nweb-demo\s+0\s+\S+\n$/);
    await waitFor('the service to answer', async () => !(await fetchService()).startsWith('exit') || undefined, 30_000);
    expect(await fetchService()).toMatch(/<html|skiff/i);
    expect(await helmOk(['status', 'web'])).toMatch(/STATUS: deployed/);
  }, 240_000);

  it('upgrades with changed values, rolls back, and lists each revision', async () => {
    const up = await helmOk(['upgrade', 'web', chart, ...values, '--set', 'replicaCount=2', '--set', 'podLabels.tier=front', '--wait', '--timeout', '120s']);
    expect(up).toMatch(/REVISION: 2/);
    let d = await deploy();
    expect(d.spec.replicas).toBe(2);
    expect(d.status.readyReplicas).toBe(2);
    const labelled = await node.getJson<{ items: unknown[] }>(['pods', '-l', 'tier=front']);
    expect(labelled.items.length).toBeGreaterThanOrEqual(2);

    expect(await helmOk(['rollback', 'web', '1', '--wait', '--timeout', '120s'])).toMatch(/Rollback was a success/);
    d = await deploy();
    expect(d.spec.replicas).toBe(1);
    await waitFor('the rollback to settle at one ready pod', async () => {
      const pods = await node.getJson<{ items: Array<{ metadata: { labels?: Record<string, string>; deletionTimestamp?: string } }> }>(['pods', '-l', 'app.kubernetes.io/instance=web']);
      const live = pods.items.filter((p) => !p.metadata.deletionTimestamp);
      return (live.length === 1 && live[0]!.metadata.labels?.tier === undefined) || undefined;
    }, 60_000);
    expect(await helmOk(['list'])).toMatch(/^web\s+default\s+3\s+.*deployed\s+demo-0\.1\.0\s+1\.16\.0/m);
    const history = await helmOk(['history', 'web']);
    expect(history).toMatch(/^1\s.*superseded/m);
    expect(history).toMatch(/^2\s.*superseded/m);
    expect(history).toMatch(/^3\s.*deployed.*Rollback to 1/m);
  }, 300_000);

  it('uninstalls with everything the release made gone', async () => {
    expect(await helmOk(['uninstall', 'web', '--wait', '--timeout', '120s'])).toMatch(/release "web" uninstalled/);
    await waitFor('the release\'s pods gone', async () => (await node.getJson<{ items: unknown[] }>(['pods', '-l', 'app.kubernetes.io/instance=web'])).items.length === 0 || undefined, 60_000);
    expect(await node.kubectlOk(['get', 'deployments,replicasets,services,serviceaccounts,secrets,pods', '-o', 'name'])).toBe('service/kubernetes\nserviceaccount/default\n');
    expect(await helmOk(['list', '-q'])).toBe('');
    await fs.rm(home, { recursive: true, force: true });
  }, 200_000);
});
