import { describe, expect, it } from 'vitest';
import { EncodedList } from '../../src/server/encoded-list.js';
import { loadCri } from '../../src/server/proto.js';

const method = loadCri().runtime.v1.RuntimeService.service.ListContainers;

interface Rec {
  id: string;
  labels: Record<string, string>;
}

const toContainer = (r: Rec) => ({
  id: r.id,
  podSandboxId: `pod-${r.id}`,
  metadata: { name: `c-${r.id}`, attempt: 1 },
  image: { image: 'busybox', annotations: {} },
  imageRef: 'sha256:abc',
  state: 'CONTAINER_RUNNING' as const,
  createdAt: 1_700_000_000_000_000_000,
  labels: r.labels,
  annotations: { a: 'b' },
});

describe('EncodedList', () => {
  it('encodes a list a client decodes to the same containers, in order, as encoding it whole', () => {
    const list = new EncodedList((c: ReturnType<typeof toContainer>) => method.responseSerialize({ containers: [c] }), toContainer);
    const recs: Rec[] = [{ id: 'one', labels: { app: 'x' } }, { id: 'two', labels: {} }, { id: 'three', labels: { k: 'v', l: 'w' } }];
    const bytes = list.encode(recs);
    const whole = method.responseSerialize({ containers: recs.map(toContainer) });
    expect(method.responseDeserialize(bytes)).toEqual(method.responseDeserialize(whole));
    expect((method.responseDeserialize(bytes) as { containers: Array<{ id: string; labels: object }> }).containers.map((c) => [c.id, c.labels])).toEqual([
      ['one', { app: 'x' }],
      ['two', {}],
      ['three', { k: 'v', l: 'w' }],
    ]);
    expect(method.responseDeserialize(list.encode([]))).toEqual({ containers: [] });
  });

  it('encodes each record object once, and a replaced record again', () => {
    let encodes = 0;
    const list = new EncodedList((c: ReturnType<typeof toContainer>) => (encodes++, method.responseSerialize({ containers: [c] })), toContainer);
    const a = { id: 'a', labels: {} };
    const b = { id: 'b', labels: {} };
    list.encode([a, b]);
    list.encode([a, b]);
    list.encode([b]);
    expect(encodes).toBe(2);
    // A save stores a new object: its entry is encoded anew, and the answer shows the change.
    const a2 = { id: 'a', labels: { changed: 'yes' } };
    const out = method.responseDeserialize(list.encode([a2, b])) as { containers: Array<{ labels: object }> };
    expect(encodes).toBe(3);
    expect(out.containers[0]!.labels).toEqual({ changed: 'yes' });
  });

  it('answers the same records again with the bytes already joined, and any other list anew', () => {
    const list = new EncodedList((c: ReturnType<typeof toContainer>) => method.responseSerialize({ containers: [c] }), toContainer);
    const a = { id: 'a', labels: {} };
    const b = { id: 'b', labels: {} };
    const first = list.encode([a, b]);
    // A new array of the same records, as every list call makes.
    expect(list.encode([a, b])).toBe(first);
    const ids = (buf: Buffer) => (method.responseDeserialize(buf) as { containers: Array<{ id: string }> }).containers.map((c) => c.id);
    expect(ids(list.encode([b, a]))).toEqual(['b', 'a']);
    expect(ids(list.encode([a]))).toEqual(['a']);
    const b2 = { id: 'b', labels: { changed: 'yes' } };
    const changed = list.encode([a, b2]);
    expect(changed).not.toBe(first);
    expect((method.responseDeserialize(changed) as { containers: Array<{ labels: object }> }).containers[1]!.labels).toEqual({ changed: 'yes' });
    expect(ids(list.encode([a, b]))).toEqual(['a', 'b']);
    expect(ids(list.encode([]))).toEqual([]);
  });
});
