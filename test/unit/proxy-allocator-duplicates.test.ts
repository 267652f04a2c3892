/** The allocator given one Service twice in a list (two manifests with one namespace/name). */
import { describe, expect, it } from 'vitest';
import { Allocator } from '../../src/proxy/service.js';
import { serviceObject } from '../helpers/proxy-fixtures.js';

const svc = (name: string, clusterIP: string, port: number) => serviceObject('ns', name, { clusterIP, selector: { app: name }, ports: [{ name: 'p', port, targetPort: 8080 }] });
const summary = (r: ReturnType<Allocator['resolve']>) => ({
  services: r.services.map((s) => `${s.key} ${s.ports.map((p) => `${p.clusterIP}:${p.port}`).join(',')}`),
  problems: r.problems.map((p) => `${p.service}: ${p.reason}`),
});

describe('Allocator with one Service twice in the list', () => {
  it('answers it once, as the last given, and the answers after it are those a fresh allocator gives', () => {
    const a = new Allocator('10.96.0.0/16');
    a.resolve([svc('x', '10.96.0.10', 80), svc('y', '10.96.0.11', 80)]);
    // Both copies were allocated under one key: the answer had ns/x twice, at the first's address with the second's port.
    expect(summary(a.resolve([svc('x', '10.96.0.10', 80), svc('x', '10.96.0.12', 81), svc('y', '10.96.0.11', 80)]))).toEqual({ services: ['ns/x 10.96.0.12:81', 'ns/y 10.96.0.11:80'], problems: [] });
    const now = [svc('x', '10.96.0.12', 81), svc('y', '10.96.0.11', 80)];
    expect(summary(a.resolve(now))).toEqual(summary(new Allocator('10.96.0.0/16').resolve(now)));
    // x holds 10.96.0.12: y asking for it is refused, x stays.
    const taken = [svc('x', '10.96.0.12', 81), svc('y', '10.96.0.12', 80)];
    expect(summary(a.resolve(taken))).toEqual({ services: ['ns/x 10.96.0.12:81'], problems: ['ns/y: clusterIP 10.96.0.12 is already taken by ns/x'] });
  });
});
