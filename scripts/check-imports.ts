/**
 * `npm run lint`'s layering check: every relative import in src/ (static,
 * `export … from`, dynamic `import()`, type-only included) must point where
 * docs/architecture.md allows, and no set of files may import each other in
 * a cycle. Prints each offence with its file and line; exits 1 on any.
 *
 * Usage: npx tsx scripts/check-imports.ts [SRC_DIR] (default src)
 */
import fs from 'node:fs';
import path from 'node:path';

/** A folder of src/ ('.' is the shared top-level modules), and what it may import besides itself and shared. */
const ALLOWED: Record<string, readonly string[]> = {
  cli: ['*'],
  server: ['image', 'sandbox', 'container', 'streaming', 'oci', 'sys', 'gen'],
  streaming: ['container', 'oci', 'sys', 'gen'],
  container: ['sandbox', 'image', 'oci', 'sys', 'gen'],
  sandbox: ['oci', 'sys', 'gen'],
  image: ['sys'],
  oci: ['sys'],
  sys: [],
  // The agent runs Pods only; the workload controllers reach it through the node's API store (node/).
  'kubelet-lite': ['sys', 'gen', 'server/proto.ts'],
  controllers: [],
  proxy: ['sys'],
  // NetworkPolicy as nft rules: a pure renderer and the one nft -f that applies it.
  netpol: ['sys'],
  // The API's kinds reuse the agent's field validation until it moves beneath them (issue 23), the workload
  // controllers' checks for Deployments, Jobs and the rest, and the proxy's reading of a Service's spec: one
  // validator per kind, so the API refuses exactly what the node could not run.
  api: ['sys', 'kubelet-lite/validate.ts', 'kubelet-lite/host-paths.ts', 'kubelet-lite/quantity.ts', 'controllers/validate.ts', 'proxy/service.ts', 'proxy/service-validation.ts', 'netpol/cidr.ts'],
  // Joins the parts of a whole node (the API and the agent) as a cluster joins them.
  node: ['api', 'kubelet-lite', 'controllers', 'proxy', 'netpol', 'sys'],
  '.': [],
  gen: ['gen'],
};
/** Shared modules that assemble a part, as cli does: they may import any folder. */
const ASSEMBLIES = new Set(['daemon.ts']);

interface Edge {
  from: string;
  to: string;
  line: number;
}

const IMPORT = /(?:\bfrom\s*|\bimport\s*\(\s*|^\s*import\s+)'(\.{1,2}\/[^']+)'/gm;

function listTs(dir: string): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...listTs(p));
    else if (e.name.endsWith('.ts') && !e.name.endsWith('.d.ts')) out.push(p);
  }
  return out;
}

/** The edges of one file: each relative import resolved to a .ts file under src. */
function edgesOf(file: string, src: string): Edge[] {
  const text = fs.readFileSync(file, 'utf8');
  const out: Edge[] = [];
  for (const m of text.matchAll(IMPORT)) {
    const target = path.resolve(path.dirname(file), m[1]!).replace(/\.js$/, '.ts');
    const line = text.slice(0, m.index).split('\n').length;
    out.push({ from: path.relative(src, file), to: path.relative(src, target), line });
  }
  return out;
}

/** The folder a src-relative path belongs to ('.' for top-level files; gen/* folds into gen). */
function folderOf(rel: string): string {
  const parts = rel.split(path.sep);
  return parts.length === 1 ? '.' : parts[0]!;
}

function allowed(e: Edge): boolean {
  const from = folderOf(e.from);
  const to = folderOf(e.to);
  if (from === to || to === '.') return true;
  if (from === '.' && ASSEMBLIES.has(e.from)) return true;
  const rules = ALLOWED[from];
  if (!rules) return false;
  return rules.includes('*') || rules.includes(to) || rules.includes(e.to);
}

/** Strongly connected components of more than one file (Tarjan), each a cycle of imports. */
function cycles(nodes: string[], next: Map<string, string[]>): string[][] {
  let index = 0;
  const idx = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  const visit = (v: string) => {
    idx.set(v, index);
    low.set(v, index++);
    stack.push(v);
    onStack.add(v);
    for (const w of next.get(v) ?? []) {
      if (!idx.has(w)) {
        visit(w);
        low.set(v, Math.min(low.get(v)!, low.get(w)!));
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v)!, idx.get(w)!));
    }
    if (low.get(v) === idx.get(v)) {
      const comp: string[] = [];
      let w: string;
      do {
        w = stack.pop()!;
        onStack.delete(w);
        comp.push(w);
      } while (w !== v);
      if (comp.length > 1) found.push(comp.sort());
    }
  };
  for (const v of nodes) if (!idx.has(v)) visit(v);
  return found;
}

export function checkImports(src: string): string[] {
  const files = listTs(src).filter((f) => !path.relative(src, f).startsWith(`gen${path.sep}`));
  const problems: string[] = [];
  const next = new Map<string, string[]>();
  for (const f of files) {
    const rel = path.relative(src, f);
    const edges = edgesOf(f, src);
    next.set(rel, edges.map((e) => e.to));
    for (const e of edges) {
      if (!allowed(e)) problems.push(`src/${e.from}:${e.line}: ${folderOf(e.from)} may not import ${e.to.startsWith('..') ? e.to : `src/${e.to}`} (see docs/architecture.md)`);
    }
  }
  for (const c of cycles([...next.keys()], next)) problems.push(`import cycle: ${c.map((f) => `src/${f}`).join(' ↔ ')}`);
  return problems;
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('check-imports.ts')) {
  const src = path.resolve(process.argv[2] ?? 'src');
  const problems = checkImports(src);
  for (const p of problems) process.stderr.write(`${p}\n`);
  if (problems.length) process.exit(1);
  process.stdout.write('imports: every arrow allowed, no cycles\n');
}
