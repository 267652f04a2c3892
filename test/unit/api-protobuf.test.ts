/**
 * The protobuf request bodies kubectl 1.35 and client-go send, decoded into
 * the JSON the store takes. The bodies are written here by a small encoder
 * of the wire format, with field numbers as k8s.io/api's .proto files give
 * them, so a wrong number in the decoder's table shows up.
 */
import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { decodeDeleteOptions, decodeProtobuf } from '../../src/api/protobuf.js';

type Value = string | number | bigint | boolean | Buffer | Field[];
type Field = [number, Value];

function varint(v: bigint): Buffer {
  const out: number[] = [];
  let x = BigInt.asUintN(64, v);
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x > 0n) b |= 0x80;
    out.push(b);
  } while (x > 0n);
  return Buffer.from(out);
}

function msg(fields: Field[]): Buffer {
  const parts: Buffer[] = [];
  for (const [no, v] of fields) {
    if (typeof v === 'number' || typeof v === 'bigint' || typeof v === 'boolean') {
      parts.push(varint(BigInt(no << 3)), varint(BigInt(typeof v === 'boolean' ? Number(v) : v)));
    } else {
      const bytes = typeof v === 'string' ? Buffer.from(v) : Buffer.isBuffer(v) ? v : msg(v);
      parts.push(varint(BigInt((no << 3) | 2)), varint(BigInt(bytes.length)), bytes);
    }
  }
  return Buffer.concat(parts);
}

const entry = (no: number, k: string, v: Value): Field => [no, [[1, k], [2, v]]];
/** runtime.Unknown: typeMeta (apiVersion 1, kind 2), raw 2, contentEncoding 3, contentType 4. */
const body = (apiVersion: string, kind: string, object: Field[]) =>
  Buffer.concat([Buffer.from('k8s\0', 'binary'), msg([[1, [[1, apiVersion], [2, kind]]], [2, msg(object)], [3, ''], [4, '']])]);

function refused(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return err;
    throw err;
  }
  throw new Error('not refused');
}

// A Deployment as `kubectl create deployment web --image=nginx --replicas=0 -- sleep ""` writes it: Go writes
// every non-pointer field, so empty strings, zero numbers and an empty creationTimestamp are all on the wire.
const container: Field[] = [
  [1, 'web'], [2, 'nginx'], [3, 'sleep'], [3, ''], [5, ''],
  [6, [[3, 8080], [4, 'TCP'], [1, 'http']]],
  [7, [[1, 'X'], [2, '1']]],
  [8, [entry(1, 'cpu', [[1, '500m']]), entry(2, 'memory', [[1, '64Mi']])]],
  [15, [[4, 0n], [5, true]]],
  [13, '/dev/termination-log'], [14, 'IfNotPresent'], [16, false], [17, false], [18, false],
  [99, 'a field from a newer release'],
];
const deployment: Field[] = [
  [1, [[1, 'web'], [2, ''], [3, 'default'], [5, ''], [6, ''], [7, 0], [8, []], entry(11, 'app', 'web'), entry(12, 'note', '')]],
  [2, [
    [1, 0],
    [2, [entry(1, 'app', 'web')]],
    [3, [[1, [entry(11, 'app', 'web'), [8, []]]], [2, [[2, container], [3, 'Always'], [4, 0], [6, 'ClusterFirst'], [11, false]]]]],
    [4, [[1, 'RollingUpdate'], [2, [[1, [[1, 0], [2, 0]]], [2, [[1, 1], [3, '25%']]]]]]],
    [5, 0], [6, 0], [7, false], [9, 600],
  ]],
  [3, [[1, 0], [2, 0]]],
];

describe('protobuf request bodies', () => {
  it('decodes a Deployment as JSON would carry it: zeros of pointer fields kept, the rest dropped, unknown fields left out', () => {
    expect(decodeProtobuf(body('apps/v1', 'Deployment', deployment))).toEqual({
      apiVersion: 'apps/v1',
      kind: 'Deployment',
      metadata: { name: 'web', namespace: 'default', labels: { app: 'web' }, annotations: { note: '' } },
      spec: {
        replicas: 0,
        selector: { matchLabels: { app: 'web' } },
        template: {
          metadata: { labels: { app: 'web' } },
          spec: {
            containers: [{
              name: 'web', image: 'nginx', command: ['sleep', ''],
              ports: [{ containerPort: 8080, protocol: 'TCP', name: 'http' }],
              env: [{ name: 'X', value: '1' }],
              resources: { limits: { cpu: '500m' }, requests: { memory: '64Mi' } },
              securityContext: { runAsUser: 0, runAsNonRoot: true },
              terminationMessagePath: '/dev/termination-log', imagePullPolicy: 'IfNotPresent',
            }],
            restartPolicy: 'Always', terminationGracePeriodSeconds: 0, dnsPolicy: 'ClusterFirst',
          },
        },
        strategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 0, maxSurge: '25%' } },
        revisionHistoryLimit: 0,
        progressDeadlineSeconds: 600,
      },
      // The same name in the status keeps its zero too; the store resets a created object's status anyway.
      status: { replicas: 0 },
    });
  });

  it('decodes times, negative numbers, bytes, string ports and nested kinds of other groups', () => {
    const pod = decodeProtobuf(body('v1', 'Pod', [
      [1, [[1, 'p'], [8, [[1, 1767225600], [2, 0]]], [10, -1n], [13, [[1, 'ReplicaSet'], [3, 'rs'], [4, 'u-1'], [5, 'apps/v1'], [6, true]]], [14, 'a/b']]],
      [2, [[2, [[1, 'c'], [2, 'busybox']]], [5, 30], [22, [[1, 'k'], [2, 'Exists'], [4, 'NoExecute'], [5, 0]]]]],
    ]));
    expect(pod.metadata).toEqual({ name: 'p', creationTimestamp: '2026-01-01T00:00:00Z', deletionGracePeriodSeconds: -1, ownerReferences: [{ kind: 'ReplicaSet', name: 'rs', uid: 'u-1', apiVersion: 'apps/v1', controller: true }], finalizers: ['a/b'] });
    expect(pod.spec).toEqual({ containers: [{ name: 'c', image: 'busybox' }], activeDeadlineSeconds: 30, tolerations: [{ key: 'k', operator: 'Exists', effect: 'NoExecute', tolerationSeconds: 0 }] });

    const svc = decodeProtobuf(body('v1', 'Service', [[1, [[1, 's']]], [2, [[1, [[1, 'http'], [2, 'TCP'], [3, 80], [4, [[1, 1], [2, 0], [3, 'web']]], [5, 0]]], entry(2, 'app', 'web'), [4, 'ClusterIP']]]]));
    expect(svc.spec).toEqual({ ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 'web' }], selector: { app: 'web' }, type: 'ClusterIP' });

    const secret = decodeProtobuf(body('v1', 'Secret', [[1, [[1, 's']]], entry(2, 'k', Buffer.from([0, 255])), [3, 'Opaque']]));
    expect(secret).toMatchObject({ data: { k: 'AP8=' }, type: 'Opaque' });

    const cron = decodeProtobuf(body('batch/v1', 'CronJob', [[1, [[1, 'c']]], [2, [[1, '*/5 * * * *'], [5, [[2, [[7, 0], [6, [[2, [[2, [[1, 'c'], [2, 'busybox']]], [3, 'OnFailure']]]]]]]]], [6, 0], [4, false]]]]));
    expect(cron.spec).toEqual({ schedule: '*/5 * * * *', jobTemplate: { spec: { backoffLimit: 0, template: { spec: { containers: [{ name: 'c', image: 'busybox' }], restartPolicy: 'OnFailure' } } } }, successfulJobsHistoryLimit: 0, suspend: false });

    const lease = decodeProtobuf(body('coordination.k8s.io/v1', 'Lease', [[1, [[1, 'n'], [3, 'kube-node-lease']]], [2, [[1, 'n'], [2, 40], [4, [[1, 1767225600], [2, 123_456_789]]]]]]));
    expect(lease.spec).toEqual({ holderIdentity: 'n', leaseDurationSeconds: 40, renewTime: '2026-01-01T00:00:00.123456Z' });
    expect(decodeProtobuf(body('authentication.k8s.io/v1', 'SelfSubjectReview', [[1, []]]))).toEqual({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview', metadata: {} });
  });

  it('decodes DeleteOptions, a grace period of 0 included', () => {
    expect(decodeDeleteOptions(body('v1', 'DeleteOptions', [[1, 0], [2, [[1, 'u'], [2, '5']]], [4, 'Foreground'], [5, 'All']]))).toEqual({ gracePeriodSeconds: 0, preconditions: { uid: 'u', resourceVersion: '5' }, propagationPolicy: 'Foreground', dryRun: ['All'] });
  });

  it('refuses kinds it does not know with 415, and hostile bodies with 400, without crashing', () => {
    expect(refused(() => decodeProtobuf(body('example.com/v1', 'Widget', [[1, [[1, 'w']]]]))).reason).toBe('UnsupportedMediaType');
    // A message inside a kind is not a kind.
    expect(refused(() => decodeProtobuf(body('v1', 'PodSpec', []))).reason).toBe('UnsupportedMediaType');
    const good = body('v1', 'Pod', [[1, [[1, 'p']]]]);
    for (let cut = 1; cut < good.length; cut++) {
      const e = (() => {
        try {
          decodeProtobuf(good.subarray(0, cut));
          return undefined;
        } catch (err) {
          return err;
        }
      })();
      if (e !== undefined) expect(e, `cut at ${cut}`).toBeInstanceOf(ApiError);
    }
    const bad = (b: Buffer) => refused(() => decodeProtobuf(b));
    expect(bad(Buffer.from('{"kind":"Pod"}')).message).toMatch(/no k8s magic/);
    // A length past the end, a varint that never ends, a message field sent as a number, a wire type that does not exist.
    expect(bad(Buffer.concat([Buffer.from('k8s\0', 'binary'), Buffer.from([0x12, 0xff, 0xff, 0x03, 0x01])])).reason).toBe('BadRequest');
    expect(bad(Buffer.concat([Buffer.from('k8s\0', 'binary'), Buffer.alloc(20, 0xff)])).reason).toBe('BadRequest');
    expect(bad(body('v1', 'Pod', [[2, 7]])).message).toMatch(/field spec in the wrong wire type 0/);
    expect(bad(body('v1', 'Pod', [[1, Buffer.from([0x0f])]])).message).toMatch(/wire type 7/);
    // More values than any object has: refused before they are all built.
    const args: Field[] = Array.from({ length: 100_001 }, (): Field => [4, 'a']);
    expect(bad(body('v1', 'Pod', [[2, [[2, [[1, 'c'], ...args]]]]])).message).toMatch(/more than 100000 values/);
    // Embedded JSON (managedFields) that is not JSON.
    expect(bad(body('v1', 'Pod', [[1, [[17, [[1, 'kubectl'], [7, [[1, '{not json']]]]]]]])).message).toMatch(/not JSON/);
  });

  it('counts fields as it reads them, known or not, and refuses a body of 1.5M empty ones with 413 at once', () => {
    // Two bytes a field (tag, length 0): 1.5M of them in 3 MB. Before, fields the table does not know were
    // skipped uncounted after the whole list was built (1.4 s and +140 MiB through the server), and the body taken.
    const empty = (no: number) => {
      const b = Buffer.alloc(3_000_000);
      for (let i = 0; i < b.length; i += 2) b[i] = (no << 3) | 2;
      return b;
    };
    const magic = Buffer.from('k8s\0', 'binary');
    const typeMeta = (apiVersion: string, kind: string) => msg([[1, [[1, apiVersion], [2, kind]]]]);
    const cases: Record<string, [(b: Buffer) => unknown, Buffer]> = {
      'unknown fields of a ConfigMap': [decodeProtobuf, Buffer.concat([magic, typeMeta('v1', 'ConfigMap'), msg([[2, empty(15)]])])],
      'empty data entries of a ConfigMap': [decodeProtobuf, Buffer.concat([magic, typeMeta('v1', 'ConfigMap'), msg([[2, empty(2)]])])],
      'unknown fields of the envelope': [decodeProtobuf, Buffer.concat([magic, typeMeta('v1', 'ConfigMap'), empty(9)])],
      'unknown fields of DeleteOptions': [decodeDeleteOptions, Buffer.concat([magic, typeMeta('v1', 'DeleteOptions'), msg([[2, empty(15)]])])],
    };
    for (const [what, [decode, hostile]] of Object.entries(cases)) {
      const t0 = performance.now();
      const e = refused(() => decode(hostile));
      expect(e.reason, what).toBe('RequestEntityTooLarge');
      expect(e.message, what).toMatch(/more than 100000 values/);
      expect(performance.now() - t0, what).toBeLessThan(300);
    }
    // A ConfigMap of 1,000 keys is far within the budget.
    const data: Field[] = Array.from({ length: 1000 }, (_, i) => entry(2, `k${i}`, 'v'));
    expect(Object.keys(decodeProtobuf(body('v1', 'ConfigMap', [[1, [[1, 'cm']]], ...data])).data as object)).toHaveLength(1000);
  });
});
