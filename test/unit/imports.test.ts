/** The layering of docs/architecture.md, as `npm run lint` checks it: on the real tree, and on trees made to break it. */
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { checkImports } from '../../scripts/check-imports.js';

const repoRoot = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');

describe('import rules', () => {
  let tmp: string | undefined;
  afterEach(() => {
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
    tmp = undefined;
  });

  function tree(files: Record<string, string>): string {
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'skiff-imports-'));
    for (const [f, text] of Object.entries(files)) {
      fs.mkdirSync(path.dirname(path.join(tmp, f)), { recursive: true });
      fs.writeFileSync(path.join(tmp, f), text);
    }
    return tmp;
  }

  it('holds for src/', () => {
    expect(checkImports(path.join(repoRoot, 'src'))).toEqual([]);
  });

  it('refuses an arrow up the layers, naming the file and line', () => {
    const src = tree({
      'sandbox/service.ts': "import { x } from '../sys/a.js';\nimport type { OciRuntime } from '../container/oci.js';\n",
      'sys/a.ts': 'export const x = 1;\n',
      'container/oci.ts': 'export type OciRuntime = {};\n',
      'controllers/deployment.ts': "import type { StoredObject } from '../kubelet-lite/model.js';\n",
      'kubelet-lite/model.ts': 'export type StoredObject = {};\n',
    });
    expect(checkImports(src)).toEqual([
      'src/controllers/deployment.ts:1: controllers may not import src/kubelet-lite/model.ts (see docs/architecture.md)',
      'src/sandbox/service.ts:2: sandbox may not import src/container/oci.ts (see docs/architecture.md)',
    ]);
  });

  it('finds a cycle, through dynamic and type-only imports too', () => {
    const src = tree({
      'image/service.ts': "const load = () => import('./import.js');\nexport function parseJson() {}\n",
      'image/import.ts': "import type { parseJson } from './service.js';\n",
      'image/ok.ts': "import { parseJson } from './service.js';\n",
    });
    expect(checkImports(src)).toEqual(['import cycle: src/image/import.ts ↔ src/image/service.ts']);
  });
});
