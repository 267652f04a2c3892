import { describe, expect, it } from 'vitest';
import { countJsonValues, MAX_JSON_VALUES } from '../../src/image/json.js';
import { normalizeConfig } from '../../src/image/service.js';

describe('image config handling', () => {
  it('counts JSON values from above without parsing, ignoring brackets and commas inside strings', () => {
    const cases: unknown[] = [{}, [], 1, 'a,b[{', { a: [1, 2, { b: 'x,"y' }], c: null }, new Array(1000).fill({}), { s: '\\",,,' }];
    for (const v of cases) {
      const text = JSON.stringify(v);
      let real = 0;
      JSON.parse(text, () => void real++);
      const counted = countJsonValues(Buffer.from(text));
      expect(counted, text.slice(0, 40)).toBeGreaterThanOrEqual(real);
      expect(counted, text.slice(0, 40)).toBeLessThanOrEqual(2 * real + 1);
    }
    expect(countJsonValues(Buffer.from(`[${'{},'.repeat(MAX_JSON_VALUES)}{}]`))).toBeGreaterThan(MAX_JSON_VALUES);
  });

  it('keeps each config field only with the type the image spec gives it', () => {
    const c = normalizeConfig({
      architecture: 'amd64',
      os: 7,
      history: [{ created_by: 'x' }],
      rootfs: { type: 'layers', diff_ids: ['sha256:a'] },
      config: { User: 0, Env: 'PATH=/bin', Entrypoint: null, Cmd: ['sh', 1], WorkingDir: '/w', StopSignal: 15, Labels: { a: 'b' }, ExposedPorts: { '80/tcp': { x: 'y'.repeat(10) } }, Volumes: ['v'] },
    });
    expect(c).toEqual({
      architecture: 'amd64',
      rootfs: { type: 'layers', diff_ids: ['sha256:a'] },
      config: { Entrypoint: null, WorkingDir: '/w', Labels: { a: 'b' }, ExposedPorts: { '80/tcp': {} } },
    });
    expect(normalizeConfig(null)).toEqual({ config: {}, rootfs: { type: 'layers', diff_ids: [] } });
    expect(normalizeConfig({ config: [], rootfs: 'x' })).toEqual({ config: {}, rootfs: { type: 'layers', diff_ids: [] } });
  });
});
