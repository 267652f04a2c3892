/**
 * `skiff images import|ls|rm|pull`: the running daemon's images, through its
 * socket (CRI's ImageService, and skiff.v1.Images for archive import and
 * pulls with progress).
 */
import * as grpc from '@grpc/grpc-js';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import type { ImageServiceClient } from '../gen/runtime/v1/ImageService.js';
import type { Image__Output } from '../gen/runtime/v1/Image.js';
import type { ImageStatusResponse__Output } from '../gen/runtime/v1/ImageStatusResponse.js';
import type { ListImagesResponse__Output } from '../gen/runtime/v1/ListImagesResponse.js';
import type { ImagesClient } from '../gen/skiff/v1/Images.js';
import type { Progress__Output } from '../gen/skiff/v1/Progress.js';
import { loadCri, loadSkiff } from '../server/proto.js';

export const IMAGES_HELP = `Usage:
  skiff images import FILE...   load image archives into the running daemon: OCI image layouts
                                (ctr images export, skopeo oci-archive:, docker save since 25)
                                or docker save archives, as .tar, .tar.gz or .tar.zst
  skiff images ls [-q]          list images (-q: ids only)
  skiff images rm REF...        remove images by name, id or id prefix
  skiff images pull REF         pull an image from its registry, showing progress

Flags:
  --runtime-endpoint URL   the daemon's socket (default unix:///run/skiff/skiff.sock)
`;

const DEFAULT_ENDPOINT = 'unix:///run/skiff/skiff.sock';

/** `unix:///run/x.sock`, `unix:/run/x.sock` or a bare path, as crictl takes them. */
export function grpcTarget(endpoint: string): string {
  if (endpoint.startsWith('unix://')) return `unix:${endpoint.slice('unix://'.length)}`;
  if (endpoint.startsWith('unix:')) return endpoint;
  if (endpoint.startsWith('/')) return `unix:${endpoint}`;
  throw new Error(`--runtime-endpoint must be a unix socket (unix:///path), not "${endpoint}"`);
}

interface Clients {
  cri: ImageServiceClient;
  skiff: ImagesClient;
  close(): void;
}

function connect(endpoint: string): Clients {
  const target = grpcTarget(endpoint);
  const cri = new (loadCri().runtime.v1.ImageService)(target, grpc.credentials.createInsecure());
  const skiff = new (loadSkiff().skiff.v1.Images)(target, grpc.credentials.createInsecure());
  return {
    cri,
    skiff,
    close: () => {
      cri.close();
      skiff.close();
    },
  };
}

function unaryCall<Req, Res>(fn: (req: Req, md: grpc.Metadata, opts: grpc.CallOptions, cb: grpc.requestCallback<Res>) => unknown, req: Req): Promise<Res> {
  return new Promise((resolve, reject) => fn(req, new grpc.Metadata(), { deadline: Date.now() + 60_000 }, (err, res) => (err ? reject(err) : resolve(res!))));
}

/** What a failed call says, without gRPC's "2 UNKNOWN:" prefix. */
function failure(err: unknown): string {
  const e = err as grpc.ServiceError;
  if (e && typeof e.code === 'number') {
    if (e.code === grpc.status.UNAVAILABLE && /connect|No connection|ENOENT|ECONNREFUSED/i.test(e.details ?? '')) return `cannot reach the skiff daemon: ${(e.details ?? '').replace(/\.? ?Resolution note:.*$/s, '')}`;
    return e.details || e.message;
  }
  return err instanceof Error ? err.message : String(err);
}

export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${n} B` : `${v.toFixed(1)} ${units[i]}`;
}

/**
 * Draws progress: on a terminal a bar redrawn in place, otherwise a plain
 * line when a layer completes or every few seconds, so logs stay readable.
 */
export class ProgressView {
  private readonly started: number;
  private lastLine = 0;
  private lastLayers = -1;
  private drawn = false;

  constructor(
    private readonly what: string,
    private readonly out: NodeJS.WriteStream | { write(s: string): boolean; isTTY?: boolean; columns?: number },
    private readonly now: () => number = Date.now,
  ) {
    this.started = now();
  }

  line(p: Progress__Output): string {
    const secs = Math.max((this.now() - this.started) / 1000, 0.001);
    const rate = `${formatBytes(Math.round(Number(p.bytesDone) / secs))}/s`;
    const total = Number(p.bytesTotal);
    const bytes = total > 0 ? `${formatBytes(Number(p.bytesDone))} / ${formatBytes(total)}` : formatBytes(Number(p.bytesDone));
    return `${bytes}  ${rate}  layers ${p.layersDone}/${p.layersTotal}`;
  }

  update(p: Progress__Output | null | undefined, final = false): void {
    if (!p) return;
    if (this.out.isTTY) {
      const total = Number(p.bytesTotal);
      const width = 24;
      const frac = total > 0 ? Math.min(1, Number(p.bytesDone) / total) : final ? 1 : 0;
      const full = Math.round(frac * width);
      const bar = `[${'='.repeat(Math.max(0, full - 1))}${full > 0 ? (full === width ? '=' : '>') : ''}${' '.repeat(width - full)}]`;
      let text = `${this.what} ${bar} ${this.line(p)}`;
      const cols = (this.out as NodeJS.WriteStream).columns;
      if (cols && text.length > cols - 1) text = text.slice(0, cols - 1);
      this.out.write(`\r\x1b[2K${text}`);
      this.drawn = true;
      return;
    }
    const t = this.now();
    if (final || p.layersDone !== this.lastLayers || t - this.lastLine >= 2000) {
      const text = `${this.what}: ${this.line(p)}\n`;
      // The last update and the final one are often the same news.
      if (final && p.layersDone === this.lastLayers && t - this.lastLine < 2000) return;
      this.lastLine = t;
      this.lastLayers = p.layersDone;
      this.out.write(text);
    }
  }

  /** Ends the in-place line, if one was drawn. */
  done(): void {
    if (this.drawn) this.out.write('\n');
    this.drawn = false;
  }
}

function stream<Res extends { progress?: Progress__Output | null }>(call: grpc.ClientReadableStream<Res>, view: ProgressView): Promise<Res> {
  return new Promise((resolve, reject) => {
    let last: Res | undefined;
    call.on('data', (m: Res) => {
      last = m;
      view.update(m.progress);
    });
    call.on('error', (err) => {
      view.done();
      reject(err);
    });
    call.on('end', () => {
      if (last) view.update(last.progress, true);
      view.done();
      if (last) resolve(last);
      else reject(new Error('the daemon ended the call without an answer'));
    });
  });
}

async function importCmd(c: Clients, files: string[]): Promise<number> {
  if (!files.length) throw new Error('skiff images import: name at least one archive');
  let failed = 0;
  for (const f of files) {
    let file: string;
    try {
      // The daemon opens the file itself and follows no symlink: send it the real path.
      file = await fsp.realpath(path.resolve(f));
    } catch (err) {
      process.stderr.write(`skiff: ${f}: ${(err as Error).message}\n`);
      failed++;
      continue;
    }
    try {
      const view = new ProgressView(`importing ${path.basename(f)}`, process.stdout);
      const last = await stream(c.skiff.Import({ path: file }), view);
      for (const img of last.images) {
        const names = img.repoTags.length ? img.repoTags.join(', ') : '<none>';
        process.stdout.write(`imported ${names} ${img.id} (${formatBytes(Number(img.size))})\n`);
      }
    } catch (err) {
      process.stderr.write(`skiff: ${failure(err)}\n`);
      failed++;
    }
  }
  return failed ? 1 : 0;
}

function splitName(tag: string): [string, string] {
  const slash = tag.lastIndexOf('/');
  const colon = tag.lastIndexOf(':');
  return colon > slash ? [tag.slice(0, colon), tag.slice(colon + 1)] : [tag, '<none>'];
}

async function lsCmd(c: Clients, quiet: boolean): Promise<number> {
  const res = await unaryCall<object, ListImagesResponse__Output>(c.cri.ListImages.bind(c.cri), {});
  const images = [...res.images].sort((a, b) => (a.repoTags[0] ?? a.id).localeCompare(b.repoTags[0] ?? b.id));
  if (quiet) {
    for (const i of images) process.stdout.write(`${i.id}\n`);
    return 0;
  }
  const rows: string[][] = [['IMAGE', 'TAG', 'IMAGE ID', 'SIZE']];
  const idOf = (i: Image__Output) => i.id.replace(/^sha256:/, '').slice(0, 13);
  for (const i of images) {
    const size = formatBytes(Number(i.size));
    if (!i.repoTags.length) {
      const repo = i.repoDigests[0] ? i.repoDigests[0].split('@')[0]! : '<none>';
      rows.push([repo, '<none>', idOf(i), size]);
    }
    for (const t of i.repoTags) rows.push([...splitName(t), idOf(i), size]);
  }
  const widths = rows[0]!.map((_, col) => Math.max(...rows.map((r) => r[col]!.length)));
  for (const r of rows) process.stdout.write(`${r.map((v, col) => (col === r.length - 1 ? v : v.padEnd(widths[col]! + 3))).join('')}\n`);
  return 0;
}

async function rmCmd(c: Clients, refs: string[]): Promise<number> {
  if (!refs.length) throw new Error('skiff images rm: name at least one image');
  let failed = 0;
  for (const ref of refs) {
    try {
      const st = await unaryCall<object, ImageStatusResponse__Output>(c.cri.ImageStatus.bind(c.cri), { image: { image: ref } });
      if (!st.image) {
        process.stderr.write(`skiff: no such image: ${ref}\n`);
        failed++;
        continue;
      }
      await unaryCall(c.cri.RemoveImage.bind(c.cri), { image: { image: st.image.id } });
      process.stdout.write(`removed ${ref} (${st.image.id})\n`);
    } catch (err) {
      process.stderr.write(`skiff: ${ref}: ${failure(err)}\n`);
      failed++;
    }
  }
  return failed ? 1 : 0;
}

async function pullCmd(c: Clients, refs: string[]): Promise<number> {
  if (refs.length !== 1) throw new Error('skiff images pull: name one image');
  const ref = refs[0]!;
  try {
    const last = await stream(c.skiff.Pull({ image: ref }), new ProgressView(`pulling ${ref}`, process.stdout));
    process.stdout.write(`pulled ${ref} ${last.imageRef}\n`);
    return 0;
  } catch (err) {
    process.stderr.write(`skiff: ${failure(err)}\n`);
    return 1;
  }
}

export async function imagesCommand(args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({
    args,
    options: {
      'runtime-endpoint': { type: 'string', default: DEFAULT_ENDPOINT },
      quiet: { type: 'boolean', short: 'q' },
      help: { type: 'boolean', short: 'h' },
    },
    strict: true,
    allowPositionals: true,
  });
  const [sub, ...rest] = positionals;
  if (values.help || sub === undefined || sub === 'help') {
    process.stdout.write(IMAGES_HELP);
    return 0;
  }
  if (!['import', 'load', 'ls', 'list', 'rm', 'remove', 'pull'].includes(sub)) {
    process.stderr.write(`skiff images: unknown command "${sub}"\n\n${IMAGES_HELP}`);
    return 2;
  }
  const c = connect(values['runtime-endpoint']!);
  try {
    switch (sub) {
      case 'import':
      case 'load':
        return await importCmd(c, rest);
      case 'ls':
      case 'list':
        return await lsCmd(c, !!values.quiet);
      case 'rm':
      case 'remove':
        return await rmCmd(c, rest);
      default:
        return await pullCmd(c, rest);
    }
  } catch (err) {
    if ((err as grpc.ServiceError)?.code !== undefined) throw new Error(failure(err));
    throw err;
  } finally {
    c.close();
  }
}
