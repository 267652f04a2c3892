import { describe, expect, it } from 'vitest';
import { hostPlatform, selectPlatform } from '../../src/image/platform.js';
import { parseChallenge } from '../../src/image/registry.js';
import { chainIds } from '../../src/image/service.js';

describe('selectPlatform', () => {
  const entries = [
    { d: 'arm-v6', platform: { os: 'linux', architecture: 'arm', variant: 'v6' } },
    { d: 'arm-v7', platform: { os: 'linux', architecture: 'arm', variant: 'v7' } },
    { d: 'arm64', platform: { os: 'linux', architecture: 'arm64' } },
    { d: 'amd64', platform: { os: 'linux', architecture: 'amd64' } },
    { d: 'win', platform: { os: 'windows', architecture: 'amd64' } },
  ];
  it('matches os, architecture and variant', () => {
    expect(selectPlatform(entries, hostPlatform('x64'))?.d).toBe('amd64');
    expect(selectPlatform(entries, hostPlatform('arm'))?.d).toBe('arm-v7');
    expect(selectPlatform(entries, hostPlatform('arm64'))?.d).toBe('arm64');
    expect(selectPlatform(entries, { os: 'linux', architecture: 's390x' })).toBeUndefined();
  });
  it('prefers an entry without a variant for a platform without one', () => {
    const e = [
      { d: 'odd', platform: { os: 'linux', architecture: 'amd64', variant: 'v3' } },
      { d: 'plain', platform: { os: 'linux', architecture: 'amd64' } },
    ];
    expect(selectPlatform(e, hostPlatform('x64'))?.d).toBe('plain');
  });
});

describe('chainIds', () => {
  it('chains diff ids as the OCI image spec defines', () => {
    const a = `sha256:${'a'.repeat(64)}`;
    const b = `sha256:${'b'.repeat(64)}`;
    const [c1, c2] = chainIds([a, b]);
    expect(c1).toBe(a);
    // sha256("sha256:aaa… sha256:bbb…"), computed independently with sha256sum.
    expect(c2).toBe('sha256:ccd722928bd92476ba1745586fed6e45a102504185ad88cd89e01ff116fd146c');
  });
});

describe('parseChallenge', () => {
  it('reads bearer parameters, quoted and not', () => {
    expect(parseChallenge('Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull"')).toEqual({
      scheme: 'bearer',
      params: { realm: 'https://auth.example/token', service: 'registry.example', scope: 'repository:a/b:pull' },
    });
    expect(parseChallenge('Basic realm=x')).toEqual({ scheme: 'basic', params: { realm: 'x' } });
    expect(parseChallenge(undefined)).toBeUndefined();
  });
});
