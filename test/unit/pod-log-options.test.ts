import { describe, expect, it } from 'vitest';
import { ApiError } from '../../src/api/errors.js';
import { containerOf, logOptionsOf } from '../../src/api/pod-subresources.js';
import { CriLogDecoder } from '../../src/kubelet-lite/cri-log.js';

const q = (s: string) => new URLSearchParams(s);
const refusal = (fn: () => unknown): { code: number; message: string } => {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return { code: err.code, message: err.message };
    throw err;
  }
  throw new Error('not refused');
};

describe('pods/log options, as the API server validates them', () => {
  const now = Date.parse('2026-01-01T00:00:10Z');
  it('reads every option kubectl sends', () => {
    expect(logOptionsOf(q('follow=true&previous=true&timestamps=true&tailLines=3&limitBytes=10&sinceSeconds=5'), 'p', now)).toEqual({
      follow: true, previous: true, timestamps: true, tailLines: 3, limitBytes: 10, since: now - 5000,
    });
    expect(logOptionsOf(q('sinceTime=2026-01-01T00:00:00Z'), 'p', now).since).toBe(Date.parse('2026-01-01T00:00:00Z'));
    expect(logOptionsOf(q(''), 'p', now)).toEqual({ follow: false, previous: false, timestamps: false, tailLines: undefined, limitBytes: undefined, since: undefined });
  });
  it('refuses what kube-apiserver refuses, naming the field', () => {
    expect(refusal(() => logOptionsOf(q('sinceSeconds=0'), 'p', now))).toEqual({ code: 422, message: 'PodLogOptions "p" is invalid: sinceSeconds: Invalid value: 0: must be greater than 0' });
    expect(refusal(() => logOptionsOf(q('tailLines=-1'), 'p', now))).toEqual({ code: 422, message: 'PodLogOptions "p" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0' });
    expect(refusal(() => logOptionsOf(q('limitBytes=0'), 'p', now)).code).toBe(422);
    expect(refusal(() => logOptionsOf(q('sinceSeconds=1&sinceTime=2026-01-01T00:00:00Z'), 'p', now)).message).toContain('at most one of `sinceTime` or `sinceSeconds` may be specified');
    expect(refusal(() => logOptionsOf(q('tailLines=x'), 'p', now)).code).toBe(400);
    expect(refusal(() => logOptionsOf(q('sinceTime=yesterday'), 'p', now)).code).toBe(400);
    expect(refusal(() => logOptionsOf(q('follow=maybe'), 'p', now)).code).toBe(400);
  });
});

describe('the container a streaming request names', () => {
  const pod = { spec: { initContainers: [{ name: 'init' }], containers: [{ name: 'a' }, { name: 'b' }] } };
  it("is the pod's only container when none is named", () => {
    expect(containerOf({ spec: { containers: [{ name: 'only' }] } }, 'p', '')).toBe('only');
  });
  it('must be named in a pod of several, with the choices listed as the API server lists them', () => {
    expect(refusal(() => containerOf(pod, 'p', ''))).toEqual({ code: 400, message: 'a container name must be specified for pod p, choose one of: [init a b]' });
  });
  it('must be one of the pod’s (init containers count)', () => {
    expect(containerOf(pod, 'p', 'init')).toBe('init');
    expect(refusal(() => containerOf(pod, 'p', 'c'))).toEqual({ code: 400, message: 'container c is not valid for pod p' });
  });
});

describe('CriLogDecoder since', () => {
  const lines = [
    '2026-01-01T00:00:01.000000001Z stdout F early',
    '2026-01-01T00:00:01.500000000Z stdout P early-par',
    '2026-01-01T00:00:03.000000000Z stdout F t-continued',
    '2026-01-01T00:00:02.000000000Z stderr P late-',
    '2026-01-01T00:00:02.100000000Z stderr F line',
    '2026-01-01T00:00:05.000000000+00:00 stdout F last',
  ].join('\n') + '\n';
  it('leaves out logical lines that began before it, continuations and all', () => {
    const d = new CriLogDecoder({ since: Date.parse('2026-01-01T00:00:02Z') });
    expect(d.feed(Buffer.from(lines)).toString()).toBe('late-line\nlast\n');
  });
  it('with timestamps, stamps only the lines it keeps', () => {
    const d = new CriLogDecoder({ since: Date.parse('2026-01-01T00:00:04Z'), timestamps: true });
    expect(d.feed(Buffer.from(lines)).toString()).toBe('2026-01-01T00:00:05.000000000+00:00 last\n');
  });
  it('keeps everything without it', () => {
    expect(new CriLogDecoder().feed(Buffer.from(lines)).toString()).toBe('early\nearly-part-continued\nlate-line\nlast\n');
  });
});
