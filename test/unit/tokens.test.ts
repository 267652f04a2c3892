import { describe, expect, it } from 'vitest';
import { TokenStore } from '../../src/streaming/tokens.js';
import { execStatus } from '../../src/streaming/server.js';

describe('TokenStore', () => {
  it('hands a value out once, and never after it expires', () => {
    let now = 1000;
    const store = new TokenStore<string>(60_000, () => now);
    const a = store.issue('a');
    const b = store.issue('b');
    expect(a).not.toBe(b);
    expect(a).toMatch(/^[A-Za-z0-9_-]{32}$/);
    expect(store.take(a)).toBe('a');
    expect(store.take(a)).toBeUndefined();
    now += 60_001;
    expect(store.take(b)).toBeUndefined();
    expect(store.take('never-issued')).toBeUndefined();
  });
});

describe('execStatus', () => {
  it('is the kubelet\'s v4 status: Success, or Failure with the exit code as a cause', () => {
    expect(JSON.parse(execStatus(['true'], 0, null))).toEqual({ metadata: {}, status: 'Success' });
    expect(JSON.parse(execStatus(['false'], 1, null))).toMatchObject({ status: 'Failure', reason: 'NonZeroExitCode', details: { causes: [{ reason: 'ExitCode', message: '1' }] } });
  });
});

describe('TokenStore bounds', () => {
  it('refuses new tokens past its count or weight, and frees room as tokens are taken or expire', () => {
    let now = 1000;
    const store = new TokenStore<string>(60_000, () => now, { maxTokens: 3, maxBytes: 100 });
    const a = store.issue('a', 10);
    store.issue('b', 10);
    store.issue('c', 10);
    expect(() => store.issue('d', 10)).toThrow(/too many streaming requests/);
    expect(store.take(a)).toBe('a');
    const d = store.issue('d', 70);
    expect(() => store.issue('e', 1)).toThrow(/too many/);
    store.take(d);
    expect(() => store.issue('big', 101)).toThrow(/too many/);
    now += 60_001;
    // The two left expired: their room is free again.
    store.issue('f', 100);
    expect(store.size).toBe(1);
  });
});
