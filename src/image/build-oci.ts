/**
 * Builds OCI images from explicit tar entries, with no registry and no
 * network: layers (Docker or OCI media types, gzip/zstd/none), configs,
 * manifests, indexes, and OCI image layout archives of them. Used by the
 * demo image script and by the tests, which also need hostile archives:
 * entry names are written as given.
 */
import { createHash } from 'node:crypto';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs/promises';
import zlib from 'node:zlib';

export interface Entry {
  name: string;
  type?: 'file' | 'directory' | 'symlink' | 'link' | 'character-device' | 'block-device' | 'fifo';
  data?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  linkname?: string;
  mtime?: Date;
  devmajor?: number;
  devminor?: number;
  /** xattrs, written as pax SCHILY.xattr records with their exact bytes. */
  xattrs?: Record<string, Buffer>;
}

export type Compression = 'gzip' | 'zstd' | 'none';

export function sha256(b: Buffer | string): string {
  return `sha256:${createHash('sha256').update(b).digest('hex')}`;
}

function paxRecord(key: string, value: Buffer): Buffer {
  const body = Buffer.concat([Buffer.from(` ${key}=`), value, Buffer.from('\n')]);
  let len = body.length + 1;
  while (String(len).length + body.length !== len) len = String(len).length + body.length;
  return Buffer.concat([Buffer.from(String(len)), body]);
}

const typeflags: Record<NonNullable<Entry['type']>, string> = {
  file: '0',
  link: '1',
  symlink: '2',
  'character-device': '3',
  'block-device': '4',
  directory: '5',
  fifo: '6',
};

function octal(n: number, width: number): string {
  return n.toString(8).padStart(width - 1, '0') + '\0';
}

/** One 512-byte ustar header; names are written as given, hostile ones included. */
function header(name: string, typeflag: string, size: number, e: Partial<Entry>): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100, 'utf8');
  h.write(octal(e.mode ?? 0o644, 8), 100, 'ascii');
  h.write(octal(e.uid ?? 0, 8), 108, 'ascii');
  h.write(octal(e.gid ?? 0, 8), 116, 'ascii');
  h.write(octal(size, 12), 124, 'ascii');
  h.write(octal(Math.floor((e.mtime ?? new Date('2023-11-14T22:13:20Z')).getTime() / 1000), 12), 136, 'ascii');
  h.write('        ', 148, 'ascii');
  h.write(typeflag, 156, 'ascii');
  h.write(e.linkname ?? '', 157, 100, 'utf8');
  h.write('ustar\u000000', 257, 'binary');
  h.write(octal(e.devmajor ?? 0, 8), 329, 'ascii');
  h.write(octal(e.devminor ?? 0, 8), 337, 'ascii');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'ascii');
  return h;
}

function padded(b: Buffer): Buffer[] {
  const rem = b.length % 512;
  return rem ? [b, Buffer.alloc(512 - rem)] : [b];
}

/** A tar archive of `entries`, in order, ending with the two zero blocks. */
export async function tarOf(entries: Entry[]): Promise<Buffer> {
  const out: Buffer[] = [];
  for (const e of entries) {
    const type = e.type ?? 'file';
    const data = type === 'file' ? (e.data === undefined ? Buffer.alloc(0) : Buffer.isBuffer(e.data) ? e.data : Buffer.from(e.data)) : Buffer.alloc(0);
    const records: Buffer[] = [];
    if (Buffer.byteLength(e.name) > 100) records.push(paxRecord('path', Buffer.from(e.name)));
    if (e.linkname && Buffer.byteLength(e.linkname) > 100) records.push(paxRecord('linkpath', Buffer.from(e.linkname)));
    for (const [k, v] of Object.entries(e.xattrs ?? {})) records.push(paxRecord(`SCHILY.xattr.${k}`, v));
    if (records.length) {
      const pax = Buffer.concat(records);
      out.push(header('PaxHeaders/entry', 'x', pax.length, {}), ...padded(pax));
    }
    const mode = e.mode ?? (type === 'directory' ? 0o755 : 0o644);
    out.push(header(e.name.slice(0, 100), typeflags[type], data.length, { ...e, mode }), ...padded(data));
  }
  out.push(Buffer.alloc(1024));
  return Buffer.concat(out);
}

export function compress(raw: Buffer, c: Compression): Buffer {
  if (c === 'gzip') return zlib.gzipSync(raw, { level: 1 });
  if (c === 'zstd') {
    const r = spawnSync('zstd', ['-q', '-c', '-1'], { input: raw, maxBuffer: 1 << 30 });
    if (r.status !== 0) throw new Error(`zstd failed: ${r.stderr}`);
    return r.stdout;
  }
  return raw;
}

export interface Blob {
  digest: string;
  mediaType: string;
  data: Buffer;
}

export interface BuiltImage {
  manifest: Blob;
  config: Blob;
  layers: Blob[];
  diffIds: string[];
}

export interface ImageSpec {
  layers: Array<{ entries: Entry[]; compression?: Compression } | { raw: Buffer; compression?: Compression }>;
  format?: 'oci' | 'docker';
  config?: Record<string, unknown>;
  architecture?: string;
  os?: string;
}

const T = {
  oci: {
    manifest: 'application/vnd.oci.image.manifest.v1+json',
    config: 'application/vnd.oci.image.config.v1+json',
    layer: { gzip: 'application/vnd.oci.image.layer.v1.tar+gzip', zstd: 'application/vnd.oci.image.layer.v1.tar+zstd', none: 'application/vnd.oci.image.layer.v1.tar' },
    index: 'application/vnd.oci.image.index.v1+json',
  },
  docker: {
    manifest: 'application/vnd.docker.distribution.manifest.v2+json',
    config: 'application/vnd.docker.container.image.v1+json',
    layer: { gzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip', zstd: 'application/vnd.docker.image.rootfs.diff.tar.zstd', none: 'application/vnd.docker.image.rootfs.diff.tar' },
    index: 'application/vnd.docker.distribution.manifest.list.v2+json',
  },
};

export async function buildImage(spec: ImageSpec): Promise<BuiltImage> {
  const fmt = spec.format ?? 'oci';
  const layers: Blob[] = [];
  const diffIds: string[] = [];
  for (const l of spec.layers) {
    const raw = 'raw' in l ? l.raw : await tarOf(l.entries);
    const c = l.compression ?? 'gzip';
    const data = compress(raw, c);
    diffIds.push(sha256(raw));
    layers.push({ digest: sha256(data), mediaType: T[fmt].layer[c], data });
  }
  const configJson = {
    architecture: spec.architecture ?? 'amd64',
    os: spec.os ?? 'linux',
    config: { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'], Cmd: ['sh'] },
    rootfs: { type: 'layers', diff_ids: diffIds },
    ...spec.config,
  };
  const cdata = Buffer.from(JSON.stringify(configJson));
  const config = { digest: sha256(cdata), mediaType: T[fmt].config, data: cdata };
  const mdata = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: T[fmt].manifest,
      config: { mediaType: config.mediaType, digest: config.digest, size: cdata.length },
      layers: layers.map((l) => ({ mediaType: l.mediaType, digest: l.digest, size: l.data.length })),
    }),
  );
  return { manifest: { digest: sha256(mdata), mediaType: T[fmt].manifest, data: mdata }, config, layers, diffIds };
}

export function buildIndex(entries: Array<{ image: BuiltImage; platform: { os: string; architecture: string; variant?: string } }>, format: 'oci' | 'docker' = 'oci'): Blob {
  const data = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: T[format].index,
      manifests: entries.map((e) => ({
        mediaType: e.image.manifest.mediaType,
        digest: e.image.manifest.digest,
        size: e.image.manifest.data.length,
        platform: e.platform,
      })),
    }),
  );
  return { digest: sha256(data), mediaType: T[format].index, data };
}


/**
 * A minimal root filesystem around a static busybox: the binary, one symlink
 * per applet it lists, /etc/passwd and /etc/group with root, app (1000) and
 * nobody, and the usual directories.
 */
export async function busyboxEntries(binary = '/bin/busybox'): Promise<Entry[]> {
  const bin = await fs.readFile(binary);
  const listed = spawnSync(binary, ['--list'], { encoding: 'utf8' });
  if (listed.status !== 0) throw new Error(`${binary} --list failed: ${listed.stderr || listed.error?.message}`);
  const applets = listed.stdout.split('\n').filter((a) => a && a !== 'busybox');
  return [
    { name: 'bin/', type: 'directory' },
    { name: 'bin/busybox', data: bin, mode: 0o755 },
    ...applets.map((a) => ({ name: `bin/${a}`, type: 'symlink' as const, linkname: 'busybox' })),
    { name: 'etc/', type: 'directory' },
    { name: 'etc/passwd', data: 'root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' },
    { name: 'etc/group', data: 'root:x:0:\napp:x:1000:\nextra:x:3000:app\nnogroup:x:65534:\n' },
    { name: 'home/', type: 'directory' },
    { name: 'home/app/', type: 'directory', uid: 1000, gid: 1000 },
    { name: 'root/', type: 'directory', mode: 0o700 },
    { name: 'tmp/', type: 'directory', mode: 0o1777 },
  ];
}

/** What one entry of an archive's index.json points at: an image, or an index of images. */
export type ArchiveImage = { name?: string; image: BuiltImage } | { name?: string; index: Blob; images: BuiltImage[] };

/** The tag part of a name (`latest` of `docker.io/library/busybox:latest`), as `ctr images export` writes it. */
function tagOf(name: string): string | undefined {
  const slash = name.lastIndexOf('/');
  const colon = name.lastIndexOf(':');
  return colon > slash ? name.slice(colon + 1) : undefined;
}

function blobsOf(images: BuiltImage[]): Blob[] {
  return images.flatMap((i) => [i.manifest, i.config, ...i.layers]);
}

/**
 * An OCI image layout as one tar, as `ctr images export` and
 * `skopeo copy oci-archive:` write it: oci-layout, index.json (each entry
 * named with containerd's and OCI's annotations) and blobs/sha256/<hex>.
 */
export async function ociArchive(entries: ArchiveImage[]): Promise<Buffer> {
  const blobs = new Map<string, Buffer>();
  const manifests = entries.map((e) => {
    const top = 'index' in e ? e.index : e.image.manifest;
    for (const b of [...('index' in e ? [e.index] : []), ...blobsOf('index' in e ? e.images : [e.image])]) blobs.set(b.digest, b.data);
    const annotations: Record<string, string> = {};
    if (e.name) {
      annotations['io.containerd.image.name'] = e.name;
      const tag = tagOf(e.name);
      if (tag) annotations['org.opencontainers.image.ref.name'] = tag;
    }
    return { mediaType: top.mediaType, digest: top.digest, size: top.data.length, ...(e.name ? { annotations } : {}) };
  });
  const index = { schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests };
  return tarOf([
    { name: 'oci-layout', data: JSON.stringify({ imageLayoutVersion: '1.0.0' }) },
    { name: 'index.json', data: JSON.stringify(index) },
    { name: 'blobs/', type: 'directory' },
    { name: 'blobs/sha256/', type: 'directory' },
    ...[...blobs].map(([digest, data]) => ({ name: `blobs/sha256/${digest.slice(7)}`, data })),
  ]);
}

/**
 * A classic `docker save` archive (before Docker 25): <hex>.json configs,
 * one <dir>/layer.tar per layer (uncompressed, as Docker writes them),
 * manifest.json with RepoTags, and the legacy `repositories` file.
 * `image` must have been built with uncompressed layers.
 */
export async function dockerSaveArchive(images: Array<{ tags: string[]; image: BuiltImage }>): Promise<Buffer> {
  const out: Entry[] = [];
  const manifest: Array<{ Config: string; RepoTags: string[]; Layers: string[] }> = [];
  for (const { tags, image } of images) {
    const configName = `${image.config.digest.slice(7)}.json`;
    const layers: string[] = [];
    image.layers.forEach((l, i) => {
      const dir = createHash('sha256').update(`${image.config.digest} ${i}`).digest('hex');
      out.push({ name: `${dir}/`, type: 'directory' }, { name: `${dir}/VERSION`, data: '1.0' }, { name: `${dir}/layer.tar`, data: l.data });
      layers.push(`${dir}/layer.tar`);
    });
    out.push({ name: configName, data: image.config.data });
    manifest.push({ Config: configName, RepoTags: tags, Layers: layers });
  }
  out.push({ name: 'manifest.json', data: JSON.stringify(manifest) });
  return tarOf(out);
}
