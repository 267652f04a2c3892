import { describe, expect, it } from 'vitest';
import { SkiffError, isNoSpace, noSpaceAt, wrap } from '../../src/errors.js';

const errno = (code: string, message = `${code}: something, write`) => Object.assign(new Error(message), { code });

describe('full-disk errors', () => {
  it('recognises ENOSPC, EDQUOT and SQLITE_FULL anywhere along the cause chain', () => {
    expect(isNoSpace(errno('ENOSPC'))).toBe(true);
    expect(isNoSpace(errno('EDQUOT'))).toBe(true);
    expect(isNoSpace(errno('SQLITE_FULL'))).toBe(true);
    expect(isNoSpace(new Error('outer', { cause: new Error('mid', { cause: errno('ENOSPC') }) }))).toBe(true);
    expect(isNoSpace(errno('ENOENT'))).toBe(false);
    expect(isNoSpace(new SkiffError('Internal', 'x'))).toBe(false);
  });

  it('names the path and keeps ResourceExhausted through wrap, whatever the fallback', () => {
    const e = noSpaceAt(errno('ENOSPC'), 'blob sha256:ab (writing /root/ingest/ab-1)') as SkiffError;
    expect(e.kind).toBe('ResourceExhausted');
    expect(e.message).toBe('no space left on device for blob sha256:ab (writing /root/ingest/ab-1): ENOSPC: something, write');
    expect(wrap(e, 'failed to fetch blob', 'Unavailable').kind).toBe('ResourceExhausted');
    expect(wrap(errno('ENOSPC'), 'failed', 'Unavailable').kind).toBe('ResourceExhausted');
    const other = errno('EIO');
    expect(noSpaceAt(other, 'x')).toBe(other);
    expect(noSpaceAt(e, 'again')).toBe(e);
  });
});
