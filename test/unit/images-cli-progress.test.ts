import { describe, expect, it } from 'vitest';
import { formatBytes, grpcTarget, ProgressView } from '../../src/cli/images.js';

function sink(isTTY: boolean) {
  const out = { text: '', isTTY, columns: 200, write: (s: string) => ((out.text += s), true) };
  return out;
}

describe('skiff images progress', () => {
  const p = (bytesDone: number, bytesTotal: number, layersDone: number, layersTotal: number) => ({ bytesDone, bytesTotal, layersDone, layersTotal });

  it('prints plain lines when not a terminal: one per finished layer or every 2 s, and the end', () => {
    let now = 0;
    const out = sink(false);
    const v = new ProgressView('pulling x', out, () => now);
    v.update(p(0, 4 << 20, 0, 2));
    now = 500;
    v.update(p(1 << 20, 4 << 20, 0, 2)); // no news: skipped
    now = 1000;
    v.update(p(2 << 20, 4 << 20, 1, 2));
    now = 3500;
    v.update(p(3 << 20, 4 << 20, 1, 2)); // 2 s since the last line
    now = 4000;
    v.update(p(4 << 20, 4 << 20, 2, 2));
    v.update(p(4 << 20, 4 << 20, 2, 2), true); // same news as the line before
    v.done();
    expect(out.text.split('\n').filter(Boolean)).toEqual([
      'pulling x: 0 B / 4.0 MiB  0 B/s  layers 0/2',
      'pulling x: 2.0 MiB / 4.0 MiB  2.0 MiB/s  layers 1/2',
      'pulling x: 3.0 MiB / 4.0 MiB  877.7 KiB/s  layers 1/2',
      'pulling x: 4.0 MiB / 4.0 MiB  1.0 MiB/s  layers 2/2',
    ]);
  });

  it('redraws one line with a bar on a terminal, and ends it', () => {
    let now = 0;
    const out = sink(true);
    const v = new ProgressView('pulling x', out, () => now);
    v.update(p(0, 100, 0, 1));
    now = 1000;
    v.update(p(50, 100, 0, 1));
    v.update(p(100, 100, 1, 1), true);
    v.done();
    const frames = out.text.split('\r\x1b[2K').filter(Boolean);
    expect(frames).toHaveLength(3);
    expect(frames[1]).toBe(`pulling x [===========>            ] 50 B / 100 B  50 B/s  layers 0/1`);
    expect(frames[2]).toBe(`pulling x [========================] 100 B / 100 B  100 B/s  layers 1/1\n`);
  });

  it('formats sizes and endpoints', () => {
    expect(formatBytes(0)).toBe('0 B');
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(5 * 2 ** 30)).toBe('5.0 GiB');
    expect(grpcTarget('unix:///run/skiff/skiff.sock')).toBe('unix:/run/skiff/skiff.sock');
    expect(grpcTarget('/run/x.sock')).toBe('unix:/run/x.sock');
    expect(() => grpcTarget('tcp://1.2.3.4:5')).toThrow(/unix socket/);
  });
});
