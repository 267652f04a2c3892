import { describe, expect, it } from 'vitest';
import { parseDuration } from '../../src/cli/main.js';

describe('--image-pull-progress-timeout durations', () => {
  it.each([
    ['5m', 300_000],
    ['30s', 30_000],
    ['1h30m', 5_400_000],
    ['500ms', 500],
    ['1.5s', 1500],
    ['0', 0],
  ])('%s is %d ms', (s, ms) => expect(parseDuration(s)).toBe(ms));

  it.each(['', '5', 'm5', '5m3', 'five minutes', '-1s', '5 m'])('"%s" is refused', (s) => expect(parseDuration(s)).toBeUndefined());
});
