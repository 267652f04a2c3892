import type { ContainerStatus, Pod } from 'kubernetes-types/core/v1.js';
import { describe, expect, it } from 'vitest';
import { describePod, formatTable, humanDuration, podCells, podHeader, podRow, probeText, qosClass } from '../../src/cli/kubectl-format.js';
import { exitCodeOfStatus, pickContainer, runtimeContainerId } from '../../src/cli/kubectl.js';

const now = new Date('2026-11-30T12:00:00Z');
const ago = (ms: number) => new Date(now.getTime() - ms).toISOString();
const MIN = 60_000;

const running = (name: string, ready = true, restartCount = 0, extra: Partial<ContainerStatus> = {}): ContainerStatus => ({
  name,
  ready,
  restartCount,
  image: 'busybox',
  imageID: '',
  state: { running: { startedAt: ago(10 * MIN) } },
  ...extra,
});

function pod(over: { spec?: Partial<Pod['spec']>; status?: Pod['status']; metadata?: Pod['metadata'] } = {}): Pod {
  return {
    metadata: { name: 'web', namespace: 'default', creationTimestamp: ago(3 * MIN), ...over.metadata },
    spec: { containers: [{ name: 'a' }, { name: 'b' }], ...over.spec } as Pod['spec'],
    status: { phase: 'Running', ...over.status },
  };
}

describe('humanDuration', () => {
  it.each([
    [-5000, '<invalid>'],
    [-500, '0s'],
    [0, '0s'],
    [119_000, '119s'],
    [120_000, '2m'],
    [185_000, '3m5s'],
    [15 * MIN, '15m'],
    [179 * MIN, '179m'],
    [3 * 60 * MIN, '3h'],
    [(5 * 60 + 20) * MIN, '5h20m'],
    [30 * 60 * MIN, '30h'],
    [3 * 24 * 60 * MIN, '3d'],
    [(3 * 24 + 5) * 60 * MIN, '3d5h'],
    [100 * 24 * 60 * MIN, '100d'],
    [(2 * 365 + 10) * 24 * 60 * MIN, '2y10d'],
    [9 * 365 * 24 * 60 * MIN, '9y'],
  ])('%d ms is %s', (ms, text) => expect(humanDuration(ms)).toBe(text));
});

describe('kubectl get pods columns', () => {
  it.each<[string, Pod, string, string]>([
    ['all ready', pod({ status: { phase: 'Running', containerStatuses: [running('a'), running('b')] } }), '2/2', 'Running'],
    ['one not ready', pod({ status: { phase: 'Running', containerStatuses: [running('a'), running('b', false)] } }), '1/2', 'Running'],
    ['pending, no statuses', pod({ status: { phase: 'Pending' } }), '0/2', 'Pending'],
    [
      'the first waiting container gives the reason',
      pod({
        status: {
          phase: 'Running',
          containerStatuses: [
            { name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { waiting: { reason: 'ImagePullBackOff' } } },
            { name: 'b', ready: false, restartCount: 0, image: '', imageID: '', state: { waiting: { reason: 'CrashLoopBackOff' } } },
          ],
        },
      }),
      '0/2',
      'ImagePullBackOff',
    ],
    [
      'a terminated container without reason shows its exit code, or its signal',
      pod({
        spec: { containers: [{ name: 'a' }] },
        status: { phase: 'Running', containerStatuses: [{ name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 3 } } }] },
      }),
      '0/1',
      'ExitCode:3',
    ],
    [
      'signal',
      pod({
        spec: { containers: [{ name: 'a' }] },
        status: { phase: 'Running', containerStatuses: [{ name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 137, signal: 9 } } }] },
      }),
      '0/1',
      'Signal:9',
    ],
    [
      'completed job',
      pod({
        spec: { containers: [{ name: 'a' }] },
        status: { phase: 'Succeeded', containerStatuses: [{ name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 0, reason: 'Completed' } } }] },
      }),
      '0/1',
      'Completed',
    ],
    [
      'Completed with another container still running and the pod not Ready is NotReady',
      pod({
        status: {
          phase: 'Running',
          containerStatuses: [{ name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 0, reason: 'Completed' } } }, running('b')],
        },
      }),
      '1/2',
      'NotReady',
    ],
    [
      '... and Running when the pod is Ready',
      pod({
        status: {
          phase: 'Running',
          conditions: [{ type: 'Ready', status: 'True' }],
          containerStatuses: [{ name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 0, reason: 'Completed' } } }, running('b')],
        },
      }),
      '1/2',
      'Running',
    ],
    [
      'init container running: Init:N/M',
      pod({
        spec: { initContainers: [{ name: 'i1' }, { name: 'i2' }] },
        status: {
          phase: 'Pending',
          initContainerStatuses: [
            { name: 'i1', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 0, reason: 'Completed' } } },
            { name: 'i2', ready: false, restartCount: 0, image: '', imageID: '', state: { running: {} } },
          ],
          containerStatuses: [
            { name: 'a', ready: false, restartCount: 0, image: '', imageID: '', state: { waiting: { reason: 'PodInitializing' } } },
            { name: 'b', ready: false, restartCount: 0, image: '', imageID: '', state: { waiting: { reason: 'PodInitializing' } } },
          ],
        },
      }),
      '0/2',
      'Init:1/2',
    ],
    [
      'init container crash-looping',
      pod({
        spec: { initContainers: [{ name: 'i1' }] },
        status: { phase: 'Pending', initContainerStatuses: [{ name: 'i1', ready: false, restartCount: 4, image: '', imageID: '', state: { waiting: { reason: 'CrashLoopBackOff' } } }] },
      }),
      '0/2',
      'Init:CrashLoopBackOff',
    ],
    [
      'init container failed without reason',
      pod({
        spec: { initContainers: [{ name: 'i1' }] },
        status: { phase: 'Failed', initContainerStatuses: [{ name: 'i1', ready: false, restartCount: 0, image: '', imageID: '', state: { terminated: { exitCode: 2 } } }] },
      }),
      '0/2',
      'Init:ExitCode:2',
    ],
    [
      'a started sidecar counts in READY and lets the pod on',
      pod({
        spec: { initContainers: [{ name: 'side', restartPolicy: 'Always' }], containers: [{ name: 'a' }] },
        status: {
          phase: 'Running',
          conditions: [{ type: 'Initialized', status: 'True' }],
          initContainerStatuses: [running('side', true, 0, { started: true })],
          containerStatuses: [running('a')],
        },
      }),
      '2/2',
      'Running',
    ],
    [
      'being deleted',
      pod({ metadata: { name: 'web', namespace: 'default', creationTimestamp: ago(MIN), deletionTimestamp: ago(0) }, status: { phase: 'Running', containerStatuses: [running('a'), running('b')] } }),
      '2/2',
      'Terminating',
    ],
    ['pod-level reason wins over the phase', pod({ status: { phase: 'Failed', reason: 'Evicted' } }), '0/2', 'Evicted'],
  ])('%s', (_name, p, ready, status) => {
    const r = podRow(p, now);
    expect(r.ready).toBe(ready);
    expect(r.status).toBe(status);
  });

  it('counts restarts with how long ago the last one was, as kubectl prints them', () => {
    const last = { terminated: { exitCode: 1, reason: 'Error', finishedAt: ago(5 * MIN) } };
    const older = { terminated: { exitCode: 1, reason: 'Error', finishedAt: ago(50 * MIN) } };
    const r = podRow(pod({ status: { phase: 'Running', containerStatuses: [running('a', true, 3, { lastState: last }), running('b', true, 2, { lastState: older })] } }), now);
    expect(r.restarts).toBe('5 (5m ago)');
    expect(podRow(pod({ status: { phase: 'Running', containerStatuses: [running('a'), running('b')] } }), now).restarts).toBe('0');
    // Restarts of an init container that finished count only while the pod initializes.
    const initDone = pod({
      spec: { initContainers: [{ name: 'i' }], containers: [{ name: 'a' }] },
      status: {
        phase: 'Running',
        conditions: [{ type: 'Initialized', status: 'True' }],
        initContainerStatuses: [{ name: 'i', ready: false, restartCount: 7, image: '', imageID: '', state: { terminated: { exitCode: 0, reason: 'Completed' } } }],
        containerStatuses: [running('a')],
      },
    });
    expect(podRow(initDone, now).restarts).toBe('0');
  });

  it('prints kubectl tables: -A adds NAMESPACE first, wide adds IP, NODE, NOMINATED NODE and READINESS GATES', () => {
    const p = pod({ spec: { containers: [{ name: 'a' }], nodeName: 'node-a' }, status: { phase: 'Running', podIP: '10.88.0.7', containerStatuses: [running('a')] } });
    const r = podRow(p, now);
    expect(formatTable([podHeader({ allNamespaces: false, wide: false }), podCells(r, { allNamespaces: false, wide: false })])).toBe(
      'NAME   READY   STATUS    RESTARTS   AGE\n' + 'web    1/1     Running   0          3m\n',
    );
    const wide = formatTable([podHeader({ allNamespaces: true, wide: true }), podCells(r, { allNamespaces: true, wide: true })]);
    expect(wide.split('\n')[0]).toBe('NAMESPACE   NAME   READY   STATUS    RESTARTS   AGE   IP          NODE     NOMINATED NODE   READINESS GATES');
    expect(wide.split('\n')[1]).toBe('default     web    1/1     Running   0          3m    10.88.0.7   node-a   <none>           <none>');
  });
});

describe('kubectl describe pod', () => {
  it('shows the pod, its containers with state, probes and restarts, conditions, volumes, QoS and events', () => {
    const p: Pod = {
      metadata: { name: 'web', namespace: 'shop', uid: 'u1', labels: { app: 'web', tier: 'front' }, creationTimestamp: ago(20 * MIN) },
      spec: {
        nodeName: 'node-a',
        containers: [
          {
            name: 'main',
            image: 'busybox:1.36',
            ports: [{ containerPort: 8080 }],
            livenessProbe: { httpGet: { path: '/healthz', port: 8080 }, periodSeconds: 5 },
            readinessProbe: { exec: { command: ['cat', '/tmp/ready'] } },
            volumeMounts: [{ name: 'cfg', mountPath: '/etc/cfg', readOnly: true }],
          },
        ],
        volumes: [{ name: 'cfg', configMap: { name: 'web-config' } }],
      },
      status: {
        phase: 'Running',
        hostIP: '192.168.1.5',
        podIP: '10.88.0.9',
        podIPs: [{ ip: '10.88.0.9' }],
        startTime: '2026-11-30T11:40:00Z',
        conditions: [
          { type: 'Initialized', status: 'True' },
          { type: 'Ready', status: 'False' },
        ],
        containerStatuses: [
          {
            name: 'main',
            ready: false,
            restartCount: 2,
            image: 'busybox:1.36',
            imageID: 'sha256:abc',
            containerID: 'skiff://0123',
            state: { running: { startedAt: '2026-11-30T11:55:00Z' } },
            lastState: { terminated: { exitCode: 137, reason: 'Error', startedAt: '2026-11-30T11:50:00Z', finishedAt: '2026-11-30T11:54:59Z' } },
          },
        ],
      },
    };
    const events = [
      {
        metadata: { name: 'web.1' },
        involvedObject: { kind: 'Pod', name: 'web', namespace: 'shop', uid: 'u1' },
        type: 'Warning',
        reason: 'Unhealthy',
        message: 'Liveness probe failed: HTTP probe failed with statuscode: 500',
        count: 6,
        firstTimestamp: ago(10 * MIN),
        lastTimestamp: ago(2 * MIN),
        source: { component: 'kubelet', host: 'node-a' },
      },
    ];
    const text = describePod(p, events, now);
    expect(text).toContain('Name:             web\n');
    expect(text).toContain('Namespace:        shop\n');
    expect(text).toContain('Node:             node-a/192.168.1.5\n');
    expect(text).toContain('Start Time:       Mon, 30 Nov 2026 11:40:00 +0000\n');
    expect(text).toContain('Labels:           app=web\n                  tier=front\n');
    expect(text).toContain('Status:           Running\n');
    expect(text).toContain('IP:               10.88.0.9\n');
    expect(text).toMatch(/^Containers:\n {2}main:\n {4}Container ID: +skiff:\/\/0123$/m);
    expect(text).toMatch(/^ {4}State: +Running\n {6}Started: +Mon, 30 Nov 2026 11:55:00 \+0000$/m);
    expect(text).toMatch(/^ {4}Last State: +Terminated\n {6}Reason: +Error\n {6}Exit Code: +137$/m);
    expect(text).toMatch(/^ {4}Ready: +False$/m);
    expect(text).toMatch(/^ {4}Restart Count: +2$/m);
    expect(text).toMatch(/^ {4}Liveness: +http-get http:\/\/:8080\/healthz delay=0s timeout=1s period=5s #success=1 #failure=3$/m);
    expect(text).toMatch(/^ {4}Readiness: +exec \[cat \/tmp\/ready\] delay=0s/m);
    expect(text).toMatch(/^ {6}\/etc\/cfg from cfg \(ro\)$/m);
    expect(text).toMatch(/^Conditions:\n {2}Type +Status\n {2}Initialized +True\n {2}Ready +False$/m);
    expect(text).toMatch(/^Volumes:\n {2}cfg:\n {4}Type: +ConfigMap \(a volume populated by a ConfigMap\)\n {4}Name: +web-config$/m);
    expect(text).toMatch(/^QoS Class: +BestEffort$/m);
    expect(text).toMatch(/^Events:\n {2}Type +Reason +Age +From +Message\n {2}---- +------ +---- +---- +-------\n {2}Warning +Unhealthy +2m \(x6 over 10m\) +kubelet +Liveness probe failed: HTTP probe failed with statuscode: 500$/m);
    expect(describePod({ ...p, metadata: { ...p.metadata, labels: {} } }, [], now)).toMatch(/^Labels: +<none>$[\s\S]*^Events: +<none>$/m);
  });

  it('gives the QoS class the API server would', () => {
    const c = (resources: object) => pod({ spec: { containers: [{ name: 'a', resources }] } });
    expect(qosClass(c({}))).toBe('BestEffort');
    expect(qosClass(c({ limits: { cpu: '1', memory: '1Gi' } }))).toBe('Guaranteed');
    expect(qosClass(c({ limits: { cpu: '1', memory: '1Gi' }, requests: { cpu: '500m' } }))).toBe('Burstable');
    expect(qosClass(c({ requests: { memory: '1Gi' } }))).toBe('Burstable');
    expect(probeText({ tcpSocket: { port: 'http' }, initialDelaySeconds: 3 })).toBe('tcp-socket :http delay=3s timeout=1s period=10s #success=1 #failure=3');
  });
});

describe('exec and logs helpers', () => {
  it('reads the exit code from the status channel', () => {
    expect(exitCodeOfStatus('')).toEqual({ code: 0 });
    expect(exitCodeOfStatus('{"metadata":{},"status":"Success"}')).toEqual({ code: 0 });
    expect(
      exitCodeOfStatus(JSON.stringify({ status: 'Failure', reason: 'NonZeroExitCode', message: 'command terminated with non-zero exit code', details: { causes: [{ reason: 'ExitCode', message: '3' }] } })),
    ).toEqual({ code: 3 });
    expect(exitCodeOfStatus(JSON.stringify({ status: 'Failure', message: 'container not running' }))).toEqual({ code: 1, message: 'container not running' });
    expect(runtimeContainerId('containerd://abc')).toBe('abc');
    expect(runtimeContainerId('skiff://0123')).toBe('0123');
    expect(runtimeContainerId(undefined)).toBeUndefined();
  });

  it('picks the only container, and names the choices when there are several', () => {
    const one = pod({ spec: { containers: [{ name: 'only' }] } });
    expect(pickContainer(one, undefined, 'logs')).toBe('only');
    const two = pod();
    expect(() => pickContainer(two, undefined, 'logs')).toThrow('a container name must be specified for pod web, choose one of: [a b]');
    expect(pickContainer(two, undefined, 'exec')).toBe('a');
    expect(pickContainer(two, 'b', 'logs')).toBe('b');
    expect(() => pickContainer(two, 'zzz', 'logs')).toThrow('container zzz is not valid for pod web');
  });
});
