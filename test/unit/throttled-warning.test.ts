import { describe, expect, it } from 'vitest';
import { createLogger, ThrottledWarning } from '../../src/log.js';

describe('ThrottledWarning', () => {
  it('writes the first at once, then one line per interval with the count, and stops when they stop', async () => {
    const lines: { msg: string; count: number; n?: number }[] = [];
    const w = new ThrottledWarning(createLogger('info', (l) => lines.push(JSON.parse(l))), 'refused', 100);
    for (let i = 0; i < 1000; i++) w.note({ n: i });
    expect(lines).toEqual([expect.objectContaining({ msg: 'refused', count: 1, n: 0 })]);
    await new Promise((r) => setTimeout(r, 180));
    expect(lines).toHaveLength(2);
    expect(lines[1]).toMatchObject({ count: 999, n: 999 });
    w.note({ n: 1000 });
    // Inside the second window: counted, not written.
    expect(lines).toHaveLength(2);
    await new Promise((r) => setTimeout(r, 250));
    expect(lines).toHaveLength(3);
    expect(lines[2]).toMatchObject({ count: 1, n: 1000 });
    // A quiet window ends the throttling: the next one is written at once.
    await new Promise((r) => setTimeout(r, 400));
    w.note({ n: 1001 });
    expect(lines).toHaveLength(4);
    w.note({ n: 1002 });
    w.flush();
    expect(lines).toHaveLength(5);
    expect(lines[4]).toMatchObject({ count: 1, n: 1002 });
  });
});
