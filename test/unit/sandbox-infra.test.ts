import { describe, expect, it } from 'vitest';
import { needsInfra } from '../../src/sandbox/infra.js';
import { PhaseTrace } from '../../src/trace.js';

const pod = (pid: unknown) => ({ linux: { securityContext: { namespaceOptions: { pid } } } }) as unknown as Parameters<typeof needsInfra>[0];

describe('needsInfra: which pods run an infra process', () => {
  it.each([
    ['POD (shared PID namespace)', 'POD', true],
    ['the proto default 0 as a number', 0, true],
    ['CONTAINER (the kubelet default)', 'CONTAINER', false],
    ['NODE (host PID namespace)', 'NODE', false],
  ])('pid %s', (_what, pid, want) => {
    expect(needsInfra(pod(pid))).toBe(want);
  });

  it('keeps the infra when namespace options, the security context or linux are absent (all mean POD)', () => {
    expect(needsInfra({ linux: null } as never)).toBe(true);
    expect(needsInfra({ linux: { securityContext: null } } as never)).toBe(true);
    expect(needsInfra({ linux: { securityContext: { namespaceOptions: null } } } as never)).toBe(true);
  });
});

describe('PhaseTrace', () => {
  it('reports sequential phases and side-by-side steps with a total', async () => {
    const t = new PhaseTrace();
    await new Promise((r) => setTimeout(r, 20));
    t.mark('first');
    await Promise.all([t.time('a', () => new Promise((r) => setTimeout(r, 30))), t.time('b', async () => undefined)]);
    t.mark('both');
    const f = t.fields();
    expect(Object.keys(f).sort()).toEqual(['a', 'b', 'both', 'first', 'total']);
    expect(f.first).toBeGreaterThanOrEqual(15);
    expect(f.a).toBeGreaterThanOrEqual(25);
    expect(f.b).toBeLessThan(f.a!);
    expect(f.total).toBeGreaterThanOrEqual(f.first! + f.both! - 0.2);
  });
});
