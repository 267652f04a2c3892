/**
 * Reading the manifest directory: which files count, how they are read
 * without trusting them, and how each YAML/JSON document becomes an object
 * or a ManifestProblem with the line it came from. Nothing here throws on
 * bad input: a bad document is a problem, and the other documents of the
 * same file still load.
 */
import { constants as fsConstants, existsSync, type BigIntStats } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { Worker } from 'node:worker_threads';
import { Composer, isAlias, isCollection, isNode, isPair, LineCounter, Parser, type Document, type Tags } from 'yaml';
import { errorMessage, isErrno } from '../errors.js';
import type { ManifestProblem, ObjectSource } from './model.js';
import { formatFieldPath, typeName, validateManifestObject, type FieldError, type FieldPath } from './validate.js';

/** A manifest larger than this is refused (the kubelet reads whole files; we bound them). */
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;
/**
 * What one file may cost to load, in YAML nodes (every scalar, collection,
 * pair and document counts one, an alias as many as it copies): a few MiB of
 * generated objects (10,000 Services are about 500,000) load whole, while a
 * file of nothing but tiny documents or aliases stops here, said once.
 */
export const MAX_NODES_PER_FILE = 2_000_000;
/** At most this many problems are kept for one file; the rest are counted in one more. */
export const MAX_PROBLEMS_PER_FILE = 100;
/** yaml's guard against billion-laughs: aliases may expand to at most this many nodes. */
export const MAX_ALIAS_COUNT = 100;
/**
 * yaml's alias count limits how many aliases there are, not how much they
 * copy: 99 aliases of a 400,000-element list are 40 million values. A
 * document may grow through its aliases to twice its written size and this.
 */
export const ALIAS_EXPANSION_SLACK = 10_000;

/**
 * The nodes of `doc` as written (each alias one node), or as loading builds
 * them (each alias a copy of its anchor), counted without building anything;
 * stops counting past `limit`. An alias inside what it names counts as too many.
 */
function nodeCount(doc: Document, expand: boolean, limit: number): number {
  const memo = new Map<unknown, number>();
  const size = (node: unknown): number => {
    if (!isNode(node) && !isPair(node)) return 1;
    const known = memo.get(node);
    if (known !== undefined) return known;
    // Until it is counted: a cycle through an alias is over the limit.
    memo.set(node, limit + 1);
    let n = 1;
    if (isAlias(node)) n = expand ? size(node.resolve(doc)) : 1;
    else if (isPair(node)) n = size(node.key) + size(node.value);
    else if (isCollection(node)) {
      for (const item of node.items) {
        n += size(item);
        if (n > limit) break;
      }
    }
    memo.set(node, n);
    return n;
  };
  return size(doc.contents);
}

/** One object of a manifest, before the store gives it a uid. */
export interface ParsedObject {
  apiVersion: string;
  kind: string;
  namespace: string;
  name: string;
  object: Record<string, unknown>;
  source: ObjectSource;
  /** The object's own uid and content revision, when it has them (from the node's API); else the uid is a hash of the content. */
  uid?: string;
  revision?: string;
}

/** What one file gave: its objects in document order and its problems. */
export interface ParsedManifest {
  file: string;
  objects: ParsedObject[];
  problems: ManifestProblem[];
}

/** The files the kubelet reads from a static pod directory: by extension, dotfiles never. */
export function isManifestName(name: string): boolean {
  if (name.startsWith('.') || name.includes('/')) return false;
  const ext = path.extname(name).toLowerCase();
  return ext === '.yaml' || ext === '.yml' || ext === '.json';
}

// YAML 1.1 is what the API machinery's YAML decoder speaks (`0644` is octal,
// `yes` a boolean); its tags that make non-JSON values are dropped, so a
// date stays a string and no Set, Map or byte array enters the store.
const NON_JSON_TAGS = new Set([
  'tag:yaml.org,2002:timestamp',
  'tag:yaml.org,2002:binary',
  'tag:yaml.org,2002:set',
  'tag:yaml.org,2002:omap',
  'tag:yaml.org,2002:pairs',
]);
function jsonTags(tags: Tags): Tags {
  return tags.filter((t) => !NON_JSON_TAGS.has(typeof t === 'string' ? `tag:yaml.org,2002:${t}` : t.tag));
}

/**
 * Parses one manifest's text. `file` names it in sources and problems.
 * A List document (`kind: List`, `ConfigMapList`…) stands for its items.
 * The file is bounded by its bytes, its YAML nodes (MAX_NODES_PER_FILE,
 * aliases counted as what they copy) and its problems kept, never by a
 * count of documents; a cut is a problem at the line where it happened.
 * Every object with apiVersion, kind and metadata.name is kept; v1 Pods,
 * ConfigMaps and Secrets are also validated, and an invalid one is a
 * problem pointing at the offending field's line.
 */
export function parseManifest(file: string, data: string | Uint8Array, limits: ParseLimits = {}): ParsedManifest {
  const maxNodes = limits.maxNodes ?? MAX_NODES_PER_FILE;
  const maxProblems = limits.maxProblems ?? MAX_PROBLEMS_PER_FILE;
  const result: ParsedManifest = { file, objects: [], problems: [] };
  const problem = (line: number, reason: string, object?: string) =>
    result.problems.push(object === undefined ? { file, line, reason } : { file, line, object, reason });

  let text: string;
  if (typeof data === 'string') {
    text = data;
  } else {
    if (data.byteLength > MAX_MANIFEST_BYTES) {
      problem(1, `file is ${data.byteLength} bytes, more than the limit of ${MAX_MANIFEST_BYTES}`);
      return result;
    }
    try {
      text = new TextDecoder('utf-8', { fatal: true }).decode(data);
    } catch {
      problem(1, 'not UTF-8 text');
      return result;
    }
  }
  if (text.length > MAX_MANIFEST_BYTES) {
    problem(1, `file is more than the limit of ${MAX_MANIFEST_BYTES} bytes`);
    return result;
  }
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  // YAML forbids most C0 controls anyway; a NUL is the mark of a binary file.
  const nul = text.indexOf('\0');
  if (nul >= 0) {
    problem(lineAt(text, nul), 'binary data (a NUL byte) in a manifest');
    return result;
  }

  text = acceptEscapedApostrophes(text);
  const lines = new LineCounter();
  const parser = new Parser(lines.addNewLine);
  const composer = new Composer({ version: '1.1', customTags: jsonTags, uniqueKeys: true, strict: false });
  const budget: LoadBudget = { nodesLeft: maxNodes, aliasSlackLeft: ALIAS_EXPANSION_SLACK, maxProblems, problemsDropped: 0 };
  let index = 0;
  let cutAt: number | undefined;
  try {
    for (const doc of composer.compose(parser.parse(text))) {
      if (!loadDocument(doc, index++, lines, result, budget)) {
        cutAt = lines.linePos(docStart(doc)).line;
        break;
      }
    }
  } catch (err) {
    // The parser is not expected to throw; if it does, the file is one problem, never a crash.
    problem(1, `cannot parse: ${errorMessage(err)}`);
    keepProblems(result, budget);
  }
  // Past the problem cap, these two still say what was not loaded and what is not shown.
  if (budget.problemsDropped > 0) {
    const last = result.problems.at(-1)?.line ?? 1;
    problem(last, `and ${budget.problemsDropped} more problems in this file, not shown`);
  }
  if (cutAt !== undefined) {
    problem(cutAt, `the file is more than ${maxNodes} YAML nodes; the documents from line ${cutAt} on are not loaded (${result.objects.length} objects before it are)`);
  }
  return result;
}

/** What is left of a file's bounds as its documents load. */
interface LoadBudget {
  nodesLeft: number;
  /** How far aliases may still copy beyond twice what is written, for the whole file. */
  aliasSlackLeft: number;
  maxProblems: number;
  problemsDropped: number;
}

/** The bounds of one file's parse, smaller in tests. */
export interface ParseLimits {
  maxNodes?: number;
  maxProblems?: number;
}

function keepProblems(out: ParsedManifest, budget: LoadBudget): void {
  const over = out.problems.length - budget.maxProblems;
  if (over > 0) {
    budget.problemsDropped += over;
    out.problems.length = budget.maxProblems;
  }
}

/**
 * kubectl's YAML reader takes `\'` in a double-quoted scalar as `'`; YAML
 * 1.2 has no such escape and the yaml library refuses it. Each one inside a
 * double-quoted scalar becomes `\x27`, the same character in an escape both
 * accept (on the same line, so every line number stays true).
 */
export function acceptEscapedApostrophes(text: string): string {
  if (!text.includes("\\'")) return text;
  const at: number[] = [];
  // The CST names each double-quoted scalar with its offset; walked with a stack, so no nesting overflows it.
  const stack: unknown[] = [...new Parser().parse(text)];
  while (stack.length > 0) {
    const t = stack.pop();
    if (t === null || typeof t !== 'object') continue;
    if (Array.isArray(t)) {
      for (const x of t) stack.push(x);
      continue;
    }
    const tok = t as { type?: unknown; offset?: unknown; source?: unknown };
    if (tok.type === 'double-quoted-scalar' && typeof tok.source === 'string' && typeof tok.offset === 'number') {
      const src = tok.source;
      for (let i = src.indexOf('\\'); i >= 0; i = src.indexOf('\\', i + 2)) {
        if (src[i + 1] === "'") at.push(tok.offset + i);
      }
      continue;
    }
    for (const v of Object.values(tok)) if (v !== null && typeof v === 'object') stack.push(v);
  }
  if (at.length === 0) return text;
  at.sort((x, y) => x - y);
  let out = '';
  let from = 0;
  for (const i of at) {
    out += text.slice(from, i) + '\\x27';
    from = i + 2;
  }
  return out + text.slice(from);
}

function docStart(doc: Document.Parsed): number {
  const contents = doc.contents;
  if (isNode(contents) && contents.range) return contents.range[0];
  return doc.range[0];
}

/** False when the document would take the file past MAX_NODES_PER_FILE: it and the rest are not loaded. */
function loadDocument(doc: Document.Parsed, index: number, lines: LineCounter, out: ParsedManifest, budget: LoadBudget): boolean {
  const file = out.file;
  const startLine = lines.linePos(docStart(doc)).line;
  const problem = (p: ManifestProblem) => {
    out.problems.push(p);
    keepProblems(out, budget);
  };
  if (budget.nodesLeft <= 0) return false;
  budget.nodesLeft--; // the document itself: a file of empty documents is bounded too
  if (doc.errors.length > 0) {
    const err = doc.errors[0]!;
    const line = lines.linePos(err.pos[0]).line;
    const where = line === startLine ? '' : ` (in the document starting at line ${startLine})`;
    problem({ file, line, reason: `invalid YAML: ${firstLine(err.message)}${where}` });
    return true;
  }
  if (doc.contents === null) return true; // an empty document: skipped silently, as kubectl does

  let value: unknown;
  try {
    const written = nodeCount(doc, false, budget.nodesLeft + 1);
    if (written > budget.nodesLeft) return false;
    const allowed = 2 * written + budget.aliasSlackLeft;
    const loaded = nodeCount(doc, true, allowed);
    if (loaded > allowed) {
      problem({ file, line: startLine, reason: `cannot load document: its aliases expand it to more than ${allowed} nodes (${written} as written)` });
      return true;
    }
    if (loaded > budget.nodesLeft) return false;
    budget.nodesLeft -= loaded;
    budget.aliasSlackLeft -= Math.max(0, loaded - 2 * written);
    value = doc.toJS({ maxAliasCount: MAX_ALIAS_COUNT });
  } catch (err) {
    problem({ file, line: startLine, reason: `cannot load document: ${errorMessage(err)}` });
    return true;
  }
  if (value === null || value === undefined) return true;

  if (typeof value !== 'object' || Array.isArray(value)) {
    problem({ file, line: startLine, reason: `a manifest must be an object, not ${typeName(value)}` });
    return true;
  }
  const obj = value as Record<string, unknown>;
  const lineOf = (p: FieldPath) => nodeLine(doc, p, lines) ?? startLine;
  if (isList(obj)) {
    loadList(obj, index, lineOf, out, problem);
    return true;
  }
  loadObject(obj, { file, document: index, line: startLine }, lineOf, out, problem);
  return true;
}

/**
 * A List as `kubectl get -o yaml` writes it (`kind: List`, or `ConfigMapList`
 * and the like): kubectl applies its items, each as if it were a document.
 */
function isList(obj: Record<string, unknown>): boolean {
  return typeof obj.kind === 'string' && obj.kind.endsWith('List') && Array.isArray(obj.items);
}

function loadList(
  list: Record<string, unknown>,
  index: number,
  lineOf: (p: FieldPath) => number,
  out: ParsedManifest,
  problem: (p: ManifestProblem) => void,
): void {
  const file = out.file;
  const items = list.items as unknown[];
  items.forEach((item, i) => {
    const at = (p: FieldPath) => lineOf(['items', i, ...p]);
    const where = `items[${i}]`;
    if (item === null || typeof item !== 'object' || Array.isArray(item)) {
      problem({ file, line: at([]), reason: `${where}: a List item must be an object, not ${typeName(item)}` });
      return;
    }
    const obj = item as Record<string, unknown>;
    if (isList(obj)) {
      problem({ file, line: at([]), reason: `${where}: a ${String(obj.kind)} inside a ${String(list.kind)} is not unpacked; put its items in the outer list` });
      return;
    }
    // The item's own line, and its index in the List: two items of one document never share a source.
    loadObject(obj, { file, document: index, item: i, line: at([]) }, at, out, (p) => problem({ ...p, reason: `${where}: ${p.reason}` }));
  });
}

function loadObject(
  obj: Record<string, unknown>,
  source: ObjectSource,
  lineOf: (p: FieldPath) => number,
  out: ParsedManifest,
  problem: (p: ManifestProblem) => void,
): void {
  const file = out.file;
  const header = objectHeader(obj);
  if ('error' in header) {
    problem({ file, line: lineOf(header.error.path), reason: formatError(header.error) });
    return;
  }
  const { apiVersion, kind, namespace, name } = header;
  const id = `${kind}/${namespace}/${name}`;
  const errors = validateManifestObject(obj);
  if (errors.length > 0) {
    problem({ file, line: lineOf(errors[0]!.path), object: id, reason: errors.map(formatError).join('; ') });
    return;
  }
  out.objects.push({ apiVersion, kind, namespace, name, object: obj, source });
}

/** apiVersion, kind and metadata.name/namespace of any object, or the first thing wrong with them. */
export function objectHeader(
  obj: Record<string, unknown>,
): { apiVersion: string; kind: string; namespace: string; name: string } | { error: FieldError } {
  const str = (v: unknown) => typeof v === 'string' && v !== '';
  if (!str(obj.apiVersion)) return { error: { path: ['apiVersion'], message: 'Required value' } };
  if (!str(obj.kind)) return { error: { path: ['kind'], message: 'Required value' } };
  const meta = obj.metadata;
  if (meta === undefined || meta === null) return { error: { path: ['metadata', 'name'], message: 'Required value' } };
  if (typeof meta !== 'object' || Array.isArray(meta)) {
    return { error: { path: ['metadata'], message: `Invalid type: expected object, got ${typeName(meta)}` } };
  }
  const m = meta as Record<string, unknown>;
  if (m.name === undefined || m.name === null || m.name === '') return { error: { path: ['metadata', 'name'], message: 'Required value' } };
  if (typeof m.name !== 'string') return { error: { path: ['metadata', 'name'], message: `Invalid type: expected string, got ${typeName(m.name)}` } };
  let namespace = 'default';
  if (m.namespace !== undefined && m.namespace !== null && m.namespace !== '') {
    if (typeof m.namespace !== 'string') {
      return { error: { path: ['metadata', 'namespace'], message: `Invalid type: expected string, got ${typeName(m.namespace)}` } };
    }
    namespace = m.namespace;
  }
  return { apiVersion: obj.apiVersion as string, kind: obj.kind as string, namespace, name: m.name };
}

function formatError(e: FieldError): string {
  return `${formatFieldPath(e.path)}: ${e.message}`;
}

/** The line of the deepest node on `p` that exists in the document (a missing field points at its parent). */
function nodeLine(doc: Document.Parsed, p: FieldPath, lines: LineCounter): number | undefined {
  for (let n = p.length; n >= 0; n--) {
    let node: unknown;
    try {
      node = n === 0 ? doc.contents : doc.getIn(p.slice(0, n), true);
    } catch {
      continue;
    }
    if (isNode(node) && node.range) {
      // A collection's range starts at its first entry, which is the right line for "this field".
      return lines.linePos(node.range[0]).line;
    }
    if (n === 0 || isCollection(node)) break;
  }
  return undefined;
}

function lineAt(text: string, offset: number): number {
  let line = 1;
  for (let i = text.indexOf('\n'); i >= 0 && i < offset; i = text.indexOf('\n', i + 1)) line++;
  return line;
}

function firstLine(s: string): string {
  const i = s.indexOf('\n');
  return i < 0 ? s : s.slice(0, i);
}


// ---------------------------------------------------------------- reading files

export type ReadResult =
  | { kind: 'parsed'; manifest: ParsedManifest; stamp: string }
  /** The file is not there (any more): whatever it defined goes. */
  | { kind: 'gone' }
  /**
   * No bytes at all: a file being written (`gen > job.yaml` truncates it before the
   * generator's first write), not a file that means to define nothing (that file is
   * removed). As the kubelet does, what it defined before still stands.
   */
  | { kind: 'empty' }
  /** Not a manifest the agent reads (a FIFO, a device, a directory): reported, never opened for a blocking read. */
  | { kind: 'skipped'; problem?: ManifestProblem }
  /**
   * What the file says could not be found out just now: an I/O error (out of
   * file descriptors or memory, EIO, EACCES…) or the parser gave up (too
   * slow, out of its heap, its thread failed). Says nothing about the
   * content: what the file defined before still stands, and it is read again.
   */
  | { kind: 'unread'; cause: ReadFailure; problem: ManifestProblem };

/** Why a file was not read: `io` errors pass quickly; `parser` ones cost a parse each try. */
export type ReadFailure = 'io' | 'parser';

/** A file's text to its objects and problems, or the parser's failure to tell. */
export interface ManifestParser {
  parse(file: string, data: Uint8Array): Promise<ParseOutcome>;
}
export type ParseOutcome = { manifest: ParsedManifest } | { failed: ManifestProblem };

/** An error that means the path names nothing readable as a file: the file is gone. */
function isGone(err: unknown): boolean {
  return isErrno(err, 'ENOENT') || isErrno(err, 'ENOTDIR') || isErrno(err, 'ELOOP');
}

/**
 * Reads one manifest file without trusting it: symlinks are followed only to
 * regular files, the open never blocks (O_NONBLOCK, then fstat to be sure it
 * is still a regular file), and at most MAX_MANIFEST_BYTES+1 bytes are read.
 * `stamp` identifies the version read (inode, size, times) so a rescan can
 * skip unchanged files.
 */
export async function readManifestFile(file: string, parser: ManifestParser = isolatedParser): Promise<ReadResult> {
  const unread = (cause: ReadFailure, reason: string): ReadResult => ({ kind: 'unread', cause, problem: { file, line: 1, reason } });
  let st;
  try {
    st = await fs.stat(file);
  } catch (err) {
    if (isGone(err)) return { kind: 'gone' };
    return unread('io', `cannot read: ${errorMessage(err)}`);
  }
  if (st.isDirectory()) return { kind: 'skipped' }; // subdirectories are ignored, as the kubelet does
  if (!st.isFile()) return { kind: 'skipped', problem: { file, line: 1, reason: 'not a regular file' } };

  let handle;
  try {
    handle = await fs.open(file, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK | fsConstants.O_NOCTTY);
  } catch (err) {
    if (isGone(err)) return { kind: 'gone' };
    return unread('io', `cannot open: ${errorMessage(err)}`);
  }
  let data: Buffer;
  let stamp: string;
  try {
    const fst = await handle.stat({ bigint: true });
    if (!fst.isFile()) return { kind: 'skipped', problem: { file, line: 1, reason: 'not a regular file' } };
    stamp = fileStamp(fst);
    if (fst.size > BigInt(MAX_MANIFEST_BYTES)) {
      return {
        kind: 'parsed',
        stamp,
        manifest: { file, objects: [], problems: [{ file, line: 1, reason: `file is ${fst.size} bytes, more than the limit of ${MAX_MANIFEST_BYTES}` }] },
      };
    }
    // Read to EOF but never more than the cap + 1, whatever the size said (the file may grow while read).
    const limit = MAX_MANIFEST_BYTES + 1;
    let buf = Buffer.alloc(Math.min(Number(fst.size) + 4096, limit));
    let len = 0;
    for (;;) {
      if (len === buf.length) {
        if (buf.length >= limit) break;
        const bigger = Buffer.alloc(Math.min(buf.length * 2, limit));
        buf.copy(bigger, 0, 0, len);
        buf = bigger;
      }
      const { bytesRead } = await handle.read(buf, len, buf.length - len, len);
      if (bytesRead === 0) break;
      len += bytesRead;
    }
    data = buf.subarray(0, len);
  } catch (err) {
    return unread('io', `cannot read: ${errorMessage(err)}`);
  } finally {
    await handle.close().catch(() => undefined);
  }
  if (data.length === 0) return { kind: 'empty' };
  const parsed = await parser.parse(file, data);
  if ('failed' in parsed) return { kind: 'unread', cause: 'parser', problem: parsed.failed };
  return { kind: 'parsed', stamp, manifest: parsed.manifest };
}

/** What identifies one version of a file: inode, size and times (ctime moves with any write, chmod or rename). */
export function fileStamp(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

/** How long one file may take to parse, and how much heap the parser may use. */
export const PARSE_TIMEOUT_MS = 10_000;
export const PARSE_HEAP_MB = 512;
const IDLE_WORKER_MS = 5_000;

/**
 * parseManifest on a worker thread, one file at a time: the yaml library
 * needs about 500 bytes of heap per node and parses about a MiB a second, so
 * a 4 MiB file of `[0,0,0,...]` held the agent's event loop for 11 s and
 * grew its heap past 2 GiB. Here it costs a problem in /manifests instead.
 * A parse that times out, runs out of heap or loses its thread is a
 * failure (`failed`), not an answer about the file. Without the compiled
 * worker (tests running the TypeScript sources) it parses in place.
 */
export class IsolatedParser implements ManifestParser {
  private worker: Worker | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  private queue: Promise<unknown> = Promise.resolve();
  private readonly script: URL;
  private readonly available: boolean;

  /** `worker`: the thread's script (tests run the TypeScript source through a loader). */
  constructor(private readonly opts: { timeoutMs?: number; heapMb?: number; worker?: URL } = {}) {
    this.script = opts.worker ?? new URL('./manifest-worker.js', import.meta.url);
    this.available = this.script.protocol === 'file:' && existsSync(fileURLToPath(this.script));
  }

  parse(file: string, data: Uint8Array): Promise<ParseOutcome> {
    if (!this.available) return Promise.resolve({ manifest: parseManifest(file, data) });
    const run = () => this.run(file, data);
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => undefined);
    // A parser thread is a V8 isolate (~10 MiB): it goes when no file has come for a while.
    void p.finally(() => {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      this.idleTimer = setTimeout(() => {
        const w = this.worker;
        this.worker = undefined;
        void w?.terminate();
      }, IDLE_WORKER_MS);
      this.idleTimer.unref();
    });
    return p;
  }

  private spawn(): Worker {
    const w = new Worker(this.script, { resourceLimits: { maxOldGenerationSizeMb: this.opts.heapMb ?? PARSE_HEAP_MB } });
    w.unref();
    // A thread given up on (timed out, or idle) may still fail on its way out, e.g. out of
    // memory while being terminated: with no listener that 'error' would end the agent.
    w.on('error', () => undefined);
    return w;
  }

  private run(file: string, data: Uint8Array): Promise<ParseOutcome> {
    const timeoutMs = this.opts.timeoutMs ?? PARSE_TIMEOUT_MS;
    return new Promise((resolve) => {
      if (this.idleTimer) clearTimeout(this.idleTimer);
      const w = (this.worker ??= this.spawn());
      const failed = (reason: string): ParseOutcome => ({ failed: { file, line: 1, reason } });
      const cleanup = () => {
        clearTimeout(timer);
        w.off('message', onMessage);
        w.off('error', onError);
        w.off('exit', onExit);
      };
      const fail = (reason: string) => {
        cleanup();
        // The next file gets a fresh thread.
        if (this.worker === w) this.worker = undefined;
        void w.terminate();
        resolve(failed(reason));
      };
      const onMessage = (m: { manifest?: ParsedManifest; error?: string }) => {
        cleanup();
        resolve(m.manifest ? { manifest: m.manifest } : failed(`cannot parse: ${m.error ?? 'no answer'}`));
      };
      const onError = (err: Error & { code?: string }) =>
        fail(err.code === 'ERR_WORKER_OUT_OF_MEMORY' ? `cannot parse: needs more than ${this.opts.heapMb ?? PARSE_HEAP_MB} MiB of memory` : `cannot parse: ${errorMessage(err)}`);
      const onExit = () => fail('cannot parse: the parser stopped');
      const timer = setTimeout(() => fail(`cannot parse: took more than ${timeoutMs / 1000} s`), timeoutMs);
      w.on('message', onMessage);
      w.on('error', onError);
      w.on('exit', onExit);
      w.postMessage({ file, data });
    });
  }
}

const isolatedParser = new IsolatedParser();

/** The manifest files directly in `dir`, sorted by name (the order that decides duplicates). */
export async function listManifestFiles(dir: string): Promise<string[]> {
  const names = await fs.readdir(dir);
  return names.filter(isManifestName).sort().map((n) => path.join(dir, n));
}
