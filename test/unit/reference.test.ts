import { describe, expect, it } from 'vitest';
import { SkiffError } from '../../src/errors.js';
import { formatReference, isImageId, parseReference } from '../../src/image/reference.js';

const hex = 'a'.repeat(64);

describe('parseReference', () => {
  it.each([
    ['busybox', 'docker.io/library/busybox:latest'],
    ['busybox:1.36', 'docker.io/library/busybox:1.36'],
    ['library/busybox', 'docker.io/library/busybox:latest'],
    ['user/app:v1', 'docker.io/user/app:v1'],
    ['docker.io/library/busybox:latest', 'docker.io/library/busybox:latest'],
    ['index.docker.io/library/busybox', 'docker.io/library/busybox:latest'],
    ['127.0.0.1:5000/ns/name:tag', '127.0.0.1:5000/ns/name:tag'],
    ['localhost/app', 'localhost/app:latest'],
    ['localhost:5000/app', 'localhost:5000/app:latest'],
    ['registry.k8s.io/pause:3.9', 'registry.k8s.io/pause:3.9'],
    [`busybox@sha256:${hex}`, `docker.io/library/busybox@sha256:${hex}`],
    [`busybox:1.36@sha256:${hex}`, `docker.io/library/busybox:1.36@sha256:${hex}`],
    ['a.b/c/d/e_f__g-h.i:T_1.x-y', 'a.b/c/d/e_f__g-h.i:T_1.x-y'],
    ['[::1]:5000/app:1', '[::1]:5000/app:1'],
  ])('normalizes %s', (input, want) => {
    expect(formatReference(parseReference(input))).toBe(want);
  });

  it.each([
    ['', /empty/],
    ['docker.io/library/Busybox', /lowercase/],
    ['busybox:', /invalid tag/],
    ['busybox:bad/tag', /lowercase|invalid/],
    ['busybox@sha256:abc', /invalid (sha256 )?digest/],
    ['busybox@md5', /invalid digest/],
    ['a//b', /invalid repository/],
    ['-leading', /invalid repository/],
    [`x:${'t'.repeat(129)}`, /invalid tag/],
    ['host:port/app', /invalid registry host/],
  ])('refuses %s', (input, message) => {
    try {
      parseReference(input);
      expect.unreachable(`accepted ${input}`);
    } catch (err) {
      expect(err).toBeInstanceOf(SkiffError);
      expect((err as SkiffError).kind).toBe('InvalidArgument');
      expect((err as Error).message).toMatch(message);
    }
  });

  it('tells image ids from names', () => {
    expect(isImageId(hex)).toBe(true);
    expect(isImageId(`sha256:${hex}`)).toBe(true);
    expect(isImageId('busybox')).toBe(false);
    expect(isImageId(hex.slice(1))).toBe(false);
  });
});
