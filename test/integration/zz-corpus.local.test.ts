import fs from 'node:fs/promises';
import { execFileSync } from 'node:child_process';
import { describe, it } from 'vitest';
import { SkiffNode } from '../helpers/skiff-node.js';
import { useSkiffNode } from '../helpers/use-skiff-node.js';

describe('corpus', () => {
  const node = new SkiffNode();
  useSkiffNode(node);
  it('applies', async () => {
    const files = execFileSync('find', ['/tmp/corpus', '-name', '*.y*ml']).toString().trim().split('\n').sort();
    const out: Array<{ file: string; ok: boolean; msg: string }> = [];
    for (const f of files) {
      const r = await node.kubectl(['apply', '--dry-run=server', '-f', f]);
      out.push({ file: f, ok: r.status === 0, msg: (r.stderr || '').slice(0, 600) });
    }
    await fs.writeFile('/tmp/corpus-result.json', JSON.stringify(out, null, 1));
  }, 900_000);
});
