import fs from 'node:fs/promises';
import { appendFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { streamCriLog } from '../../src/kubelet-lite/cri-log.js';

function criLine(text: string): string {
  return `2026-12-02T06:00:00.000000001Z stdout F ${text}\n`;
}

describe('streamCriLog without follow', () => {
  let dir: string;
  beforeEach(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-crilog-'));
  });
  afterEach(async () => {
    await fs.rm(dir, { recursive: true, force: true });
  });

  async function read(tailLines: number | undefined, onWrite: () => void): Promise<string> {
    let out = '';
    await streamCriLog(
      { root: dir, path: '0.log' },
      {
        tailLines,
        follow: false,
        signal: new AbortController().signal,
        write: async (b) => {
          out += b.toString();
          onWrite();
        },
      },
    );
    return out;
  }

  it('gives the lines the file held when the tail was counted, not a line written while it reads', async () => {
    const file = path.join(dir, '0.log');
    await fs.writeFile(file, [1, 2, 3, 4].map((n) => criLine(`line ${n}`)).join(''));
    let n = 4;
    // The container keeps writing: one more line lands after each chunk the reader sends.
    const more = () => appendFileSync(file, criLine(`line ${++n}`));
    expect(await read(2, more)).toBe('line 3\nline 4\n');
    expect(await read(undefined, more)).toBe([1, 2, 3, 4, 5].map((k) => `line ${k}\n`).join(''));
  });
});
