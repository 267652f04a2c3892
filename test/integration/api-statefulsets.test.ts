/**
 * StatefulSets, DaemonSet histories, bare ReplicaSets and ReplicationControllers
 * on a real `skiff node`, driven by real kubectl 1.35: a StatefulSet of 3
 * OrderedReady pods comes up in order (seen through a watch), scales down
 * from the top, rolls a template change from the highest ordinal, and
 * `rollout history/undo` read and restore its ControllerRevisions; a
 * DaemonSet's history likewise; a ReplicaSet no Deployment owns and an RC
 * run their pods.
 */
import { spawn } from 'node:child_process';
import type { Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { isRoot } from '../helpers/env.js';
import { waitFor } from '../helpers/registry.js';
import { KUBECTL_135, SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

const podSpec = (message: string) => `
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, 'trap "exit 0" TERM; echo ${message}; while true; do sleep 1 & wait $!; done']
        readinessProbe: {exec: {command: ['true']}, initialDelaySeconds: 1, periodSeconds: 1}`;

const statefulSet = (replicas: number, message: string) => `
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: ${replicas}
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec:${podSpec(message)}
`;

describe.skipIf(!isRoot)('StatefulSets, DaemonSet revisions, ReplicaSets and RCs on the node API, with real kubectl', () => {
  const node = new SkiffNode();
  const live = async (selector: string) => (await node.getJson<{ items: Pod[] }>(['pods', '-l', selector])).items.filter((p) => !p.metadata?.deletionTimestamp);
  const stsRolled = () => node.kubectlOk(['rollout', 'status', 'statefulset/db', '--timeout=120s'], { timeoutMs: 130_000 });
  const revisionOf = (p: Pod) => p.metadata?.labels?.['controller-revision-hash'];

  /** A kubectl watch of pods, each event as name, deleting, ready, in the order they came. */
  const podWatch = (selector: string) => {
    const events: Array<{ name: string; deleting: boolean; ready: boolean }> = [];
    const jsonpath = 'jsonpath={.metadata.name}{"|"}{.metadata.deletionTimestamp}{"|"}{.status.conditions[?(@.type=="Ready")].status}{"\\n"}';
    const argv = node.ns.wrap([KUBECTL_135, '--kubeconfig', node.dirs.kubeconfig, 'get', 'pods', '-l', selector, '-w', '-o', jsonpath]);
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'pipe'] });
    let buf = '';
    child.stdout.on('data', (b: Buffer) => {
      buf += b.toString();
      const lines = buf.split('\n');
      buf = lines.pop()!;
      for (const l of lines) {
        const [name, deleting, ready] = l.trim().split('|');
        if (name) events.push({ name, deleting: !!deleting, ready: ready === 'True' });
      }
    });
    return { events, stop: () => child.kill() };
  };

  useSkiffNode(node);

  it('brings db-0, db-1, db-2 up in order, each Ready before the next is made', async () => {
    const w = podWatch('app=db');
    try {
      await new Promise((r) => setTimeout(r, 1000));
      await node.kubectlOk(['apply', '-f', '-'], { input: statefulSet(3, 'one') });
      await stsRolled();
      await waitFor('the watch to see db-2 Ready', async () => w.events.some((e) => e.name === 'db-2' && e.ready) || undefined, 30_000);
    } finally {
      w.stop();
    }
    const events = w.events;
    const firstSeen = (n: string) => events.findIndex((e) => e.name === n);
    const firstReady = (n: string) => events.findIndex((e) => e.name === n && e.ready);
    const text = events.map((e) => `${e.name}:${e.ready}`).join(' ');
    expect(firstSeen('db-0'), text).toBe(0);
    expect(firstReady('db-0'), text).toBeLessThan(firstSeen('db-1'));
    expect(firstReady('db-1'), text).toBeLessThan(firstSeen('db-2'));
    const pods = await live('app=db');
    expect(pods.map((p) => p.metadata?.name).sort()).toEqual(['db-0', 'db-1', 'db-2']);
    for (const p of pods) {
      expect(p.spec?.hostname).toBe(p.metadata?.name);
      expect(p.spec?.subdomain).toBe('db');
      expect(p.metadata?.labels?.['statefulset.kubernetes.io/pod-name']).toBe(p.metadata?.name);
    }
    expect(await node.kubectlOk(['get', 'sts', 'db'])).toMatch(/db\s+3\/3/);
    expect(await node.kubectlOk(['get', 'controllerrevisions'])).toMatch(/db-\w+\s+statefulset\.apps\/db\s+1\s/);
  }, 180_000);

  it('rolls a template change from the highest ordinal down; rollout history and undo restore revision 1', async () => {
    const before = await live('app=db');
    const rev1 = revisionOf(before[0]!)!;
    await node.kubectlOk(['apply', '-f', '-'], { input: statefulSet(3, 'two') });
    // The order pods go: watched by their deletionTimestamps, as they are set.
    const w = podWatch('app=db');
    try {
      await waitFor('every pod on the new revision', async () => {
        const sts = await node.getJson<{ status: { updateRevision?: string; currentRevision?: string; updatedReplicas?: number; readyReplicas?: number } }>(['sts', 'db']);
        return (sts.status.updateRevision !== rev1 && sts.status.currentRevision === sts.status.updateRevision && sts.status.readyReplicas === 3) || undefined;
      }, 150_000);
    } finally {
      w.stop();
    }
    const order: string[] = [];
    for (const e of w.events) if (e.deleting && !order.includes(e.name)) order.push(e.name);
    expect(order).toEqual(['db-2', 'db-1', 'db-0']);
    await stsRolled();
    expect(await node.kubectlOk(['rollout', 'history', 'statefulset/db'])).toMatch(/REVISION\s+CHANGE-CAUSE\n1\s+<none>\n2\s+<none>/);
    expect(await node.kubectlOk(['rollout', 'history', 'statefulset/db', '--revision=1'])).toContain("echo one");

    expect(await node.kubectlOk(['rollout', 'undo', 'statefulset/db'])).toContain('rolled back');
    await waitFor('every pod back on revision 1', async () => ((await live('app=db')).filter((p) => revisionOf(p) === rev1 && p.status?.phase === 'Running').length === 3) || undefined, 150_000);
    await stsRolled();
    expect(await node.kubectlOk(['rollout', 'history', 'statefulset/db'])).toMatch(/REVISION\s+CHANGE-CAUSE\n2\s+<none>\n3\s+<none>/);
  }, 400_000);

  it('scales down with kubectl scale from the highest ordinal, one at a time', async () => {
    const w = podWatch('app=db');
    try {
      await new Promise((r) => setTimeout(r, 500));
      await node.kubectlOk(['scale', 'statefulset/db', '--replicas=1']);
      await waitFor('db-1 and db-2 gone', async () => ((await node.getJson<{ items: Pod[] }>(['pods', '-l', 'app=db'])).items.length === 1) || undefined, 90_000);
    } finally {
      w.stop();
    }
    const gone: string[] = [];
    for (const e of w.events) if (e.deleting && !gone.includes(e.name)) gone.push(e.name);
    // db-1 is marked only once db-2 is gone: no event of db-1 deleting comes before db-2's last.
    const lastOf2 = w.events.map((e) => e.name).lastIndexOf('db-2');
    expect(w.events.findIndex((e) => e.name === 'db-1' && e.deleting)).toBeGreaterThan(lastOf2);
    expect(gone).toEqual(['db-2', 'db-1']);
    expect((await live('app=db')).map((p) => p.metadata?.name)).toEqual(['db-0']);
    await node.kubectlOk(['delete', 'statefulset', 'db']);
  }, 120_000);

  it('keeps a DaemonSet\'s templates as ControllerRevisions: rollout history and undo', async () => {
    const ds = (message: string) => `
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:${podSpec(message)}
`;
    const rolled = () => node.kubectlOk(['rollout', 'status', 'daemonset/agent', '--timeout=90s'], { timeoutMs: 100_000 });
    await node.kubectlOk(['apply', '-f', '-'], { input: ds('one') });
    await rolled();
    const first = revisionOf((await live('app=agent'))[0]!);
    await node.kubectlOk(['apply', '-f', '-'], { input: ds('two') });
    await waitFor('the new pod', async () => (await live('app=agent')).find((p) => revisionOf(p) !== first && p.status?.phase === 'Running'), 90_000);
    await rolled();
    expect(await node.kubectlOk(['rollout', 'history', 'daemonset/agent'])).toMatch(/REVISION\s+CHANGE-CAUSE\n1\s+<none>\n2\s+<none>/);
    expect(await node.kubectlOk(['rollout', 'history', 'daemonset/agent', '--revision=1'])).toContain('echo one');
    expect(await node.kubectlOk(['rollout', 'undo', 'daemonset/agent'])).toContain('rolled back');
    await waitFor('the first template\'s pod again', async () => (await live('app=agent')).find((p) => revisionOf(p) === first && p.status?.phase === 'Running'), 90_000);
    await rolled();
    expect(await node.kubectlOk(['rollout', 'history', 'daemonset/agent'])).toMatch(/\n2\s+<none>\n3\s+<none>/);
    expect(await node.kubectlOk(['get', 'controllerrevisions', `agent-${first}`])).toMatch(new RegExp(`agent-${first}\\s+daemonset\\.apps/agent\\s+3\\s`));
    await node.kubectlOk(['delete', 'daemonset', 'agent']);
  }, 300_000);

  it('runs a ReplicaSet of its own and a ReplicationController, scaled by kubectl', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: `
apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: bare}
spec:
  replicas: 2
  selector: {matchLabels: {app: bare}}
  template:
    metadata: {labels: {app: bare}}
    spec:${podSpec('bare')}
---
apiVersion: v1
kind: ReplicationController
metadata: {name: old}
spec:
  replicas: 2
  template:
    metadata: {labels: {app: old}}
    spec:${podSpec('old')}
`,
    });
    const running = (sel: string, n: number) => waitFor(`${n} pods of ${sel} running`, async () => ((await live(sel)).filter((p) => p.status?.phase === 'Running').length === n && (await live(sel)).length === n) || undefined, 90_000);
    await running('app=bare', 2);
    await running('app=old', 2);
    for (const p of await live('app=old')) expect(p.metadata?.ownerReferences?.[0]).toMatchObject({ kind: 'ReplicationController', name: 'old', controller: true });
    await waitFor('the RC\'s status', async () => /old\s+2\s+2\s+2\s/.test(await node.kubectlOk(['get', 'rc', 'old'])) || undefined, 30_000);
    await node.kubectlOk(['scale', 'rc/old', '--replicas=3']);
    await node.kubectlOk(['scale', 'rs/bare', '--replicas=1']);
    await running('app=old', 3);
    await running('app=bare', 1);
    await node.kubectlOk(['delete', 'rc', 'old']);
    await node.kubectlOk(['delete', 'rs', 'bare']);
    await waitFor('their pods gone', async () => ((await live('app=old')).length === 0 && (await live('app=bare')).length === 0) || undefined, 60_000);
  }, 240_000);

  it('gives each ordinal its own claim from volumeClaimTemplates, whose data survives a pod delete and a kill -9 of the node', async () => {
    await node.kubectlOk(['apply', '-f', '-'], {
      input: `
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: data}
spec:
  replicas: 3
  serviceName: data
  selector: {matchLabels: {app: data}}
  template:
    metadata: {labels: {app: data}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: skiff.local/demo-web:1
        imagePullPolicy: Never
        command: [sh, -c, '[ -f /data/first ] || hostname > /data/first; echo start >> /data/starts; trap "exit 0" TERM; while true; do sleep 1 & wait $!; done']
        readinessProbe: {exec: {command: [test, -f, /data/first]}, periodSeconds: 1}
        volumeMounts: [{name: www, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: www}
    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 16Mi}}}
`,
    });
    await node.kubectlOk(['rollout', 'status', 'statefulset/data', '--timeout=120s'], { timeoutMs: 130_000 });
    const claims = await node.getJson<{ items: Array<{ metadata: { name: string }; status: { phase: string } }> }>(['pvc', '-l', 'app=data']);
    expect(claims.items.map((c) => [c.metadata.name, c.status.phase]).sort()).toEqual([['www-data-0', 'Bound'], ['www-data-1', 'Bound'], ['www-data-2', 'Bound']]);
    const read = (pod: string, file: string) => node.kubectlOk(['exec', pod, '--', 'cat', `/data/${file}`]);
    for (const i of [0, 1, 2]) expect(await read(`data-${i}`, 'first')).toBe(`data-${i}\n`);

    const uid = (await node.getJson<Pod>(['pod', 'data-1'])).metadata!.uid;
    await node.kubectlOk(['delete', 'pod', 'data-1', '--wait=true']);
    await waitFor('data-1 again, Ready', async () => {
      const p = (await live('app=data')).find((x) => x.metadata?.name === 'data-1');
      return (p && p.metadata?.uid !== uid && p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True')) || undefined;
    }, 90_000);
    expect(await read('data-1', 'first')).toBe('data-1\n');
    expect(await read('data-1', 'starts')).toBe('start\nstart\n');

    expect(await node.stopProcess('SIGKILL')).toBe('SIGKILL');
    await node.start();
    await node.kubectlOk(['rollout', 'status', 'statefulset/data', '--timeout=120s'], { timeoutMs: 130_000 });
    await node.kubectlOk(['delete', 'pod', 'data-2', '--wait=true']);
    await node.kubectlOk(['rollout', 'status', 'statefulset/data', '--timeout=120s'], { timeoutMs: 130_000 });
    await waitFor('data-2 back', async () => (await read('data-2', 'starts').catch(() => '')) === 'start\nstart\n' || undefined, 60_000);
    expect(await read('data-2', 'first')).toBe('data-2\n');
    expect(await read('data-0', 'starts')).toBe('start\n');
    await node.kubectlOk(['delete', 'statefulset', 'data', '--wait=true']);
    // Retained by default (whenDeleted: Retain): the claims outlive the set.
    expect(await node.kubectlOk(['get', 'pvc', '-o', 'name'])).toMatch(/persistentvolumeclaim\/www-data-0\n/);
  }, 400_000);
});
