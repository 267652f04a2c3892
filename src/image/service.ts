/**
 * Images: pull (resolve → fetch → verify → unpack → record), look-up by
 * name, tag, digest or id, removal and garbage collection of the blobs and
 * snapshots no image needs.
 */
import { createHash } from 'node:crypto';
import { EventEmitter } from 'node:events';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable, Transform } from 'node:stream';
import pLimit from 'p-limit';
import type { Db } from '../db.js';
import { SkiffError, errorMessage, isErrno, isNoSpace, noSpaceAt, wrap } from '../errors.js';
import type { Logger } from '../log.js';
import type { ContentStore } from './content.js';
import { formatPlatform, hostPlatform, selectPlatform, type Platform } from './platform.js';
import { formatReference, isImageId, parseReference, repository, tagName, type Reference } from './reference.js';
import { Limits, MediaType, type Credentials, type FetchedManifest, type RegistryClient } from './registry.js';
import { cancelledError, isCancellation, PullCancelled, SharedWork } from './shared-work.js';
import type { ImageArchive, ArchiveLimits } from './archive.js';
import { findInLowers, type Snapshot, type Snapshotter } from './snapshot.js';
import type { ApplyResult } from './unpack.js';
import { lazyCode } from '../lazy-code.js';
import { parseJson } from './json.js';
import type { BlobSource, Descriptor } from './source.js';

export type { BlobSource, Descriptor };

/**
 * What unpacks layers (tar-stream, the layer thread) and reads image archives is loaded by the
 * first pull or import that needs it: an idle daemon holds none of it.
 */
const loadLayerCode = lazyCode('layer unpacking', () =>
  Promise.all([import('./unpack.js'), import('./layer-job.js'), import('./layer-thread.js')]).then(([unpack, job, thread]) => ({
    applyLayer: unpack.applyLayer,
    NeedsLowerLayers: job.NeedsLowerLayers,
    storeAndUnpack: thread.storeAndUnpack,
  })),
);

const loadArchiveCode = lazyCode('image archive', () =>
  Promise.all([import('./archive.js'), import('./import.js')]).then(([archive, imp]) => ({ ImageArchive: archive.ImageArchive, readImageArchive: imp.readImageArchive })),
);


export interface ImageConfig {
  architecture?: string;
  os?: string;
  config?: {
    User?: string;
    Env?: string[];
    Entrypoint?: string[] | null;
    Cmd?: string[] | null;
    WorkingDir?: string;
    StopSignal?: string;
    Labels?: Record<string, string>;
    ExposedPorts?: Record<string, unknown>;
    Volumes?: Record<string, unknown>;
  };
  rootfs?: { type?: string; diff_ids?: string[] };
  [k: string]: unknown;
}

export interface ImageRecord {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
  /** The config's User, for listing without parsing the whole config. */
  user: string;
  readonly config: ImageConfig;
  chainIds: string[];
  manifestDigest: string;
  pinned: boolean;
}

interface ImageRow {
  id: string;
  manifest_digest: string;
  config: string;
  size: number;
  chain_ids: string;
  blobs: string;
  created_at: number;
  image_user: string;
}

export interface ImageServiceDeps {
  db: Db;
  content: ContentStore;
  snapshots: Snapshotter;
  registry: RegistryClient;
  log: Logger;
  platform?: Platform;
  /** Image names that are never garbage collected by the kubelet (reported as pinned). */
  pinned?: string[];
  downloadConcurrency?: number;
  unpackConcurrency?: number;
  /** Where a compressed archive is decompressed for import (default: the system's temporary directory). */
  importTmpDir?: string;
}


/** How far a pull or import has come. */
export interface PullProgress {
  bytesDone: number;
  bytesTotal: number;
  layersDone: number;
  layersTotal: number;
}

/** An image that an import recorded. */
export interface ImportedImage {
  id: string;
  repoTags: string[];
  repoDigests: string[];
  size: number;
}

type ImageName = [string, 'tag' | 'digest'];

interface PreparedImage {
  id: string;
  manifestDigest: string;
  config: ImageConfig;
  size: number;
  chainIds: string[];
  blobs: string[];
}

interface Holder {
  hold(...keys: string[]): void;
  release(): void;
}

/**
 * Indexes followed from where a pull or import starts: one, as real images
 * have (a multi-platform index, or an archive's index.json entry naming one).
 * An index inside that is refused rather than followed.
 */
export const MAX_INDEX_DEPTH = 1;

/** Counts bytes and layers for whoever listens; one per shared pull or import. */
class ProgressMeter extends EventEmitter {
  private bytesDone = 0;
  private bytesTotal = 0;
  private layersDone = 0;
  private layersTotal = 0;
  addTotal(bytes: number, layers: number): void {
    this.bytesTotal += bytes;
    this.layersTotal += layers;
    this.emit('progress');
  }
  addBytes(n: number): void {
    this.bytesDone += n;
    this.emit('progress');
  }
  layerDone(): void {
    this.layersDone++;
    this.emit('progress');
  }
  snapshot(): PullProgress {
    return { bytesDone: this.bytesDone, bytesTotal: this.bytesTotal, layersDone: this.layersDone, layersTotal: this.layersTotal };
  }
}

/** `source` with every blob byte it delivers counted into `progress`. */
function countingSource(source: BlobSource, progress: ProgressMeter): BlobSource {
  return {
    manifest: (ref) => source.manifest(ref),
    blob: async (desc) => {
      const body = await source.blob(desc);
      const counter = new Transform({
        highWaterMark: 1 << 20,
        transform(chunk: Buffer, _enc, cb) {
          progress.addBytes(chunk.length);
          cb(null, chunk);
        },
      });
      body.on('error', (e) => counter.destroy(e));
      counter.on('close', () => body.destroy());
      counter.on('error', () => {});
      return body.pipe(counter);
    },
    get aborted() {
      return source.aborted;
    },
  };
}

/**
 * `source`, with every blob download it started stopped at once by `stop`:
 * when one layer of a pull fails, the pull's other downloads end then,
 * rather than running to their end (or their stall timeout) for nothing.
 * What it stops fails as a cancellation, so that another pull sharing one
 * of those layers fetches it again for itself.
 */
function stoppableSource(source: BlobSource): { source: BlobSource; stop(cause: unknown): void } {
  const bodies = new Set<Readable>();
  let stopped: SkiffError | undefined;
  return {
    source: {
      manifest: (ref) => source.manifest(ref),
      blob: async (desc) => {
        if (stopped) throw stopped;
        const body = await source.blob(desc);
        if (stopped) {
          body.destroy(stopped);
          throw stopped;
        }
        bodies.add(body);
        body.once('close', () => bodies.delete(body));
        return body;
      },
      get aborted() {
        return source.aborted || stopped !== undefined;
      },
    },
    stop(cause) {
      stopped ??= new PullCancelled(`download stopped: another layer of the same pull failed: ${errorMessage(cause)}`);
      for (const b of bodies) b.destroy(stopped);
    },
  };
}

/** Tells garbage collection which snapshots containers stand on (their top chain ids). */
export type SnapshotUsers = () => Iterable<string>;

const MANIFEST_TYPES = new Set<string>([MediaType.OciManifest, MediaType.DockerManifest]);
const INDEX_TYPES = new Set<string>([MediaType.OciIndex, MediaType.DockerList]);

export function chainIds(diffIds: string[]): string[] {
  const out: string[] = [];
  for (const d of diffIds) {
    const prev = out[out.length - 1];
    out.push(prev ? `sha256:${createHash('sha256').update(`${prev} ${d}`).digest('hex')}` : d);
  }
  return out;
}

const isString = (v: unknown): v is string => typeof v === 'string';
const strings = (v: unknown): string[] | undefined => (Array.isArray(v) && v.every(isString) ? v : undefined);
const stringMap = (v: unknown): Record<string, string> | undefined =>
  v !== null && typeof v === 'object' && !Array.isArray(v) && Object.values(v).every(isString) ? (v as Record<string, string>) : undefined;
const keySet = (v: unknown): Record<string, unknown> | undefined =>
  v !== null && typeof v === 'object' && !Array.isArray(v) ? Object.fromEntries(Object.keys(v).map((k) => [k, {}])) : undefined;

/** Linux refuses to exec a single argument or environment string longer than this (MAX_ARG_STRLEN). */
const MAX_ARG_STRLEN = 128 << 10;
/** What skiff keeps of an image config: it is copied into every container's record and spec. */
const MAX_KEPT_CONFIG = 2 << 20;

/**
 * Refuses a config no container could run with (an environment or command
 * string longer than execve accepts), or whose kept part is so big that every
 * container made from it would carry megabytes in the daemon's memory.
 */
function checkConfigSizes(config: ImageConfig, what: string): void {
  const c = config.config ?? {};
  for (const [field, list] of [['Env', c.Env], ['Entrypoint', c.Entrypoint], ['Cmd', c.Cmd]] as const) {
    for (const v of list ?? []) {
      if (Buffer.byteLength(v) >= MAX_ARG_STRLEN) throw new SkiffError('InvalidArgument', `${what}: a ${field} string of ${Buffer.byteLength(v)} bytes, longer than Linux passes to a process`);
    }
  }
  const kept = Buffer.byteLength(JSON.stringify(config));
  if (kept > MAX_KEPT_CONFIG) throw new SkiffError('InvalidArgument', `${what}: its User, Env, command, labels, ports and volumes take ${kept} bytes, more than the ${MAX_KEPT_CONFIG} skiff accepts`);
}

/**
 * The part of an image config skiff uses, each field with the type the OCI
 * image spec gives it; a field of another type is dropped, as if the image
 * had not set it. The rest (history and anything else) is not kept: the
 * image config blob itself stays in the content store.
 */
export function normalizeConfig(raw: unknown): ImageConfig {
  const r = (raw !== null && typeof raw === 'object' ? raw : {}) as Record<string, unknown>;
  const c = (r.config !== null && typeof r.config === 'object' ? r.config : {}) as Record<string, unknown>;
  const rootfs = (r.rootfs !== null && typeof r.rootfs === 'object' ? r.rootfs : {}) as Record<string, unknown>;
  const config: NonNullable<ImageConfig['config']> = {};
  if (isString(c.User)) config.User = c.User;
  if (strings(c.Env)) config.Env = c.Env as string[];
  for (const k of ['Entrypoint', 'Cmd'] as const) if (c[k] === null || strings(c[k])) config[k] = c[k] as string[] | null;
  if (isString(c.WorkingDir)) config.WorkingDir = c.WorkingDir;
  if (isString(c.StopSignal)) config.StopSignal = c.StopSignal;
  if (stringMap(c.Labels)) config.Labels = c.Labels as Record<string, string>;
  if (keySet(c.ExposedPorts)) config.ExposedPorts = keySet(c.ExposedPorts);
  if (keySet(c.Volumes)) config.Volumes = keySet(c.Volumes);
  const out: ImageConfig = { config };
  if (isString(r.architecture)) out.architecture = r.architecture;
  if (isString(r.os)) out.os = r.os;
  if (isString(r.variant)) out.variant = r.variant;
  if (isString(r.created)) out.created = r.created;
  out.rootfs = { type: isString(rootfs.type) ? rootfs.type : 'layers', diff_ids: strings(rootfs.diff_ids) ?? [] };
  return out;
}

export class ImageService {
  private readonly pulls = new Map<string, { work: SharedWork<string>; progress: ProgressMeter }>();
  private readonly unpacks = new Map<string, Promise<Snapshot>>();
  /** Blobs and snapshots an unfinished pull is using: garbage collection leaves them. */
  private readonly leases = new Map<string, number>();
  /** Blobs a gc is deleting now: a pull waits for that to end before it takes one as present. */
  private readonly deleting = new Map<string, Promise<unknown>>();
  private readonly downloads: ReturnType<typeof pLimit>;
  private readonly unpackSlots: ReturnType<typeof pLimit>;
  private readonly platform: Platform;
  private readonly pinned: Set<string>;
  private snapshotUsers: SnapshotUsers = () => [];

  constructor(private readonly d: ImageServiceDeps) {
    this.downloads = pLimit(d.downloadConcurrency ?? 3);
    this.unpackSlots = pLimit(d.unpackConcurrency ?? 2);
    this.platform = d.platform ?? hostPlatform();
    this.pinned = new Set((d.pinned ?? []).map((n) => formatReference(parseReference(n))));
  }

  /**
   * Pulls `image`; concurrent pulls of the same reference share one. Returns
   * the image id. Aborting `signal` drops this caller; the downloads stop
   * when every caller sharing them has gone. `onProgress` hears the shared
   * pull's byte and layer counts as they change.
   */
  pull(image: string, creds: Credentials = {}, signal?: AbortSignal, onProgress?: (p: PullProgress) => void): Promise<string> {
    const ref = parseReference(image);
    const key = formatReference(ref);
    let shared = this.pulls.get(key);
    if (!shared) {
      const progress = new ProgressMeter();
      const forget = () => {
        if (this.pulls.get(key)?.work === s) this.pulls.delete(key);
      };
      const s: SharedWork<string> = new SharedWork((sig) => this.doPull(ref, creds, sig, progress), `pull of "${key}"`, forget);
      s.result.then(forget, forget);
      shared = { work: s, progress };
      this.pulls.set(key, shared);
    }
    if (!onProgress) return shared.work.join(signal);
    const meter = shared.progress;
    const listener = () => onProgress(meter.snapshot());
    meter.on('progress', listener);
    listener();
    return shared.work.join(signal).finally(() => meter.off('progress', listener));
  }

  private lease(keys: string[]): () => void {
    for (const k of keys) this.leases.set(k, (this.leases.get(k) ?? 0) + 1);
    return () => {
      for (const k of keys) {
        const n = (this.leases.get(k) ?? 1) - 1;
        if (n <= 0) this.leases.delete(k);
        else this.leases.set(k, n);
      }
    };
  }

  /** Holds blobs and snapshots against garbage collection until released (once). */
  private holder(): Holder {
    const releases: Array<() => void> = [];
    return {
      hold: (...keys: string[]) => {
        releases.push(this.lease(keys));
      },
      release: () => {
        for (const r of releases.splice(0)) r();
      },
    };
  }

  private async doPull(ref: Reference, creds: Credentials, signal: AbortSignal | undefined, progress: ProgressMeter): Promise<string> {
    const started = Date.now();
    const name = formatReference(ref);
    const session = await this.d.registry.session(ref, creds, signal);
    const holder = this.holder();
    try {
      const top = await session.manifest(ref.digest ?? ref.tag!);
      const image = await this.prepare(session, top, name, holder, progress);
      const names: ImageName[] = [[`${repository(ref)}@${top.digest}`, 'digest']];
      const tag = tagName(ref);
      if (tag) names.push([tag, 'tag']);
      this.record([{ image, names }]);
      this.d.log.info('image pulled', { image: name, id: image.id, layers: image.chainIds.length, bytes: image.size, ms: Date.now() - started });
      return image.id;
    } catch (err) {
      holder.release();
      await this.gc().catch((e) => this.d.log.warn('cleanup after failed pull failed', { error: errorMessage(e) }));
      // SQLite's disk-full names no file: the record being written is in the database.
      const e = isErrno(err, 'SQLITE_FULL') ? noSpaceAt(err, `the image record in ${this.d.db.name}`) : err;
      throw e instanceof SkiffError ? wrapPull(name, e) : wrap(e, `failed to pull image "${name}"`, 'Internal');
    } finally {
      holder.release();
    }
  }

  /**
   * Imports every image of an OCI image layout or `docker save` archive
   * (optionally gzip or zstd compressed), verifying each blob's digest and
   * unpacking each layer as a pull does. All or nothing: when any part of
   * the archive is refused, no image is recorded and the blobs and
   * snapshots it brought are collected.
   */
  async importArchive(file: string, opts: { signal?: AbortSignal; onProgress?: (p: PullProgress) => void; limits?: ArchiveLimits } = {}): Promise<ImportedImage[]> {
    const started = Date.now();
    const tmpDir = this.d.importTmpDir ?? os.tmpdir();
    const holder = this.holder();
    const progress = new ProgressMeter();
    const listener = () => opts.onProgress?.(progress.snapshot());
    if (opts.onProgress) progress.on('progress', listener);
    let archive: ImageArchive | undefined;
    try {
      const { ImageArchive, readImageArchive } = await loadArchiveCode();
      archive = await ImageArchive.open(file, tmpDir, opts.limits);
      const contents = await readImageArchive(archive, opts.signal, this.platform);
      const prepared: Array<{ image: PreparedImage; names: ImageName[] }> = [];
      for (const entry of contents.images) {
        if (opts.signal?.aborted) throw cancelledError(opts.signal.reason, `import of ${file}`);
        const label = entry.refs[0] ? formatReference(entry.refs[0]) : `image ${entry.top.digest} of ${file}`;
        const top = await contents.source.manifest(entry.top.digest);
        const image = await this.prepare(contents.source, top, label, holder, progress);
        const names: ImageName[] = [];
        for (const ref of [...entry.refs, ...(contents.tagsByConfig.get(image.id) ?? [])]) {
          const tag = tagName(ref);
          if (tag) names.push([tag, 'tag']);
          if (ref.digest) names.push([`${repository(ref)}@${ref.digest}`, 'digest']);
          else if (entry.digestKnown) names.push([`${repository(ref)}@${top.digest}`, 'digest']);
        }
        prepared.push({ image, names });
      }
      this.record(prepared);
      const out = prepared.map((p) => ({
        id: p.image.id,
        repoTags: [...new Set(p.names.filter(([, k]) => k === 'tag').map(([n]) => n))].sort(),
        repoDigests: [...new Set(p.names.filter(([, k]) => k === 'digest').map(([n]) => n))].sort(),
        size: p.image.size,
      }));
      this.d.log.info('archive imported', { archive: file, images: out.map((i) => ({ id: i.id, tags: i.repoTags })), ms: Date.now() - started });
      return out;
    } catch (err) {
      holder.release();
      await this.gc().catch((e) => this.d.log.warn('cleanup after failed import failed', { error: errorMessage(e) }));
      const e = isErrno(err, 'SQLITE_FULL') ? noSpaceAt(err, `the image record in ${this.d.db.name}`) : err;
      throw e instanceof SkiffError ? new SkiffError(e.kind, `failed to import ${file}: ${e.message}`, { cause: e }) : wrap(e, `failed to import ${file}`, 'Internal');
    } finally {
      holder.release();
      progress.off('progress', listener);
      await archive?.close();
    }
  }

  /**
   * Resolves `top` (an index is followed to this machine's platform), then
   * fetches and verifies the config and every layer and unpacks the layers
   * into snapshots. Records nothing: the caller does, once everything it
   * wants is in place. What it stores stays held by `holder`.
   */
  private async prepare(source: BlobSource, top: FetchedManifest, name: string, holder: Holder, progress?: ProgressMeter): Promise<PreparedImage> {
    if (progress) source = countingSource(source, progress);
    holder.hold(top.digest);
    const blobs = [top.digest];
    await this.d.content.ingest({ digest: top.digest, size: top.body.length }, bufferStream(top.body));
    let manifestDesc: FetchedManifest = top;
    for (let depth = 0; ; depth++) {
      if (manifestDesc.mediaType === MediaType.DockerSchema1) {
        throw new SkiffError('InvalidArgument', `${name} uses Docker image manifest schema 1, which is deprecated and not supported`);
      }
      if (!INDEX_TYPES.has(manifestDesc.mediaType)) break;
      if (depth >= MAX_INDEX_DEPTH) {
        throw new SkiffError('InvalidArgument', `${name}: unsupported manifest media type "${manifestDesc.mediaType}" for ${manifestDesc.digest} inside an index (indexes nest at most ${MAX_INDEX_DEPTH} deep)`);
      }
      const index = parseJson<{ manifests?: Descriptor[] }>(manifestDesc.body, `index ${manifestDesc.digest}`);
      const entries = Array.isArray(index.manifests) ? index.manifests : [];
      const chosen = selectPlatform(entries, this.platform);
      if (!chosen) {
        const have = entries.map((m) => (m.platform ? formatPlatform(m.platform as Platform) : '?')).join(', ');
        throw new SkiffError('NotFound', `${name} has no image for platform ${formatPlatform(this.platform)} (it has: ${have || 'none'})`);
      }
      const m = await source.manifest(chosen.digest);
      holder.hold(m.digest);
      blobs.push(m.digest);
      await this.d.content.ingest({ digest: m.digest, size: m.body.length }, bufferStream(m.body));
      manifestDesc = m;
    }
    if (!MANIFEST_TYPES.has(manifestDesc.mediaType)) {
      throw new SkiffError('InvalidArgument', `${name}: unsupported manifest media type "${manifestDesc.mediaType}"`);
    }
    const manifest = parseJson<{ config?: Descriptor; layers?: Descriptor[] }>(manifestDesc.body, `manifest ${manifestDesc.digest}`);
    if (!manifest.config?.digest || !Array.isArray(manifest.layers)) {
      throw new SkiffError('InvalidArgument', `manifest ${manifestDesc.digest} has no config or layers`);
    }
    if (manifest.layers.length > Limits.layers) {
      throw new SkiffError('InvalidArgument', `manifest ${manifestDesc.digest} has ${manifest.layers.length} layers, more than the ${Limits.layers} skiff accepts`);
    }
    if (!(manifest.config.size <= Limits.config)) {
      throw new SkiffError('InvalidArgument', `image config ${manifest.config.digest} is ${manifest.config.size} bytes, more than the ${Limits.config} skiff accepts`);
    }
    if (progress) {
      let bytes = 0;
      for (const d of [manifest.config, ...manifest.layers]) if (!(await this.d.content.has(d.digest))) bytes += d.size;
      progress.addTotal(bytes, manifest.layers.length);
    }
    holder.hold(manifest.config.digest);
    blobs.push(manifest.config.digest);
    await this.fetchBlob(source, manifest.config);
    const raw = parseJson<{ rootfs?: { diff_ids?: unknown } }>(await this.d.content.readBytes(manifest.config.digest), `image config ${manifest.config.digest}`);
    if (raw?.rootfs?.diff_ids !== undefined && !strings(raw.rootfs.diff_ids)) {
      throw new SkiffError('InvalidArgument', `image config ${manifest.config.digest}: rootfs.diff_ids is not a list of strings`);
    }
    const config = normalizeConfig(raw);
    checkConfigSizes(config, `image config ${manifest.config.digest}`);
    const diffIds = config.rootfs?.diff_ids ?? [];
    if (diffIds.length !== manifest.layers.length) {
      throw new SkiffError('InvalidArgument', `image ${name}: ${manifest.layers.length} layers but ${diffIds.length} diff ids in its config`);
    }
    const chain = chainIds(diffIds);
    holder.hold(...chain, ...manifest.layers.map((l) => l.digest));
    blobs.push(...manifest.layers.map((l) => l.digest));

    // Layers download, verify and unpack at once, each into a directory of its own (bounded by the
    // download slots); the first to fail stops the others' downloads.
    const layers = stoppableSource(source);
    let firstFailure: { reason: unknown } | undefined;
    const committed: Array<Promise<Snapshot>> = [];
    manifest.layers.forEach((layer, i) => {
      const done = this.layer(layers.source, layer, diffIds[i]!, chain[i]!, i > 0 ? chain[i - 1] : undefined, committed[i - 1]);
      done.then(
        () => progress?.layerDone(),
        (reason: unknown) => {
          if (firstFailure) return;
          firstFailure = { reason };
          layers.stop(reason);
        },
      );
      committed.push(done);
    });
    // Wait for all, so that a failure leaves no unpack running when we clean up.
    await Promise.allSettled(committed);
    if (firstFailure) throw firstFailure.reason;

    // As containerd counts it: every blob of the image, index and manifest included.
    const size =
      top.body.length +
      (manifestDesc.digest !== top.digest ? manifestDesc.body.length : 0) +
      manifest.config.size +
      manifest.layers.reduce((a, l) => a + l.size, 0);
    return { id: manifest.config.digest, manifestDigest: manifestDesc.digest, config, size, chainIds: chain, blobs };
  }

  /** Records images and their names in one transaction: all of them, or none. */
  private record(images: Array<{ image: PreparedImage; names: ImageName[] }>): void {
    this.d.db.transaction(() => {
      const upsert = this.d.db.prepare(
        `INSERT INTO images (id, manifest_digest, config, image_user, size, chain_ids, blobs, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT(id) DO UPDATE SET manifest_digest = excluded.manifest_digest, size = excluded.size,
           chain_ids = excluded.chain_ids, blobs = (SELECT json_group_array(DISTINCT value) FROM
           (SELECT value FROM json_each(images.blobs) UNION SELECT value FROM json_each(excluded.blobs)))`,
      );
      const put = this.d.db.prepare('INSERT OR REPLACE INTO image_names (name, image_id, kind) VALUES (?, ?, ?)');
      for (const { image: p, names } of images) {
        upsert.run(p.id, p.manifestDigest, JSON.stringify(p.config), p.config.config?.User ?? '', p.size, JSON.stringify(p.chainIds), JSON.stringify(p.blobs), Date.now());
        for (const [n, kind] of names) put.run(n, p.id, kind);
      }
    })();
  }

  private async fetchBlob(session: BlobSource, desc: Descriptor): Promise<void> {
    try {
      await this.fetchBlobOnce(session, desc);
    } catch (err) {
      // Another pull's download we joined was cancelled; ours still wants the blob.
      if (isCancellation(err) && !session.aborted) return this.fetchBlob(session, desc);
      throw err;
    }
  }

  /** Whether the store has the blob, once a deletion of it that a gc already began has ended. */
  private async present(digest: string): Promise<boolean> {
    await this.deleting.get(digest)?.catch(() => undefined);
    return this.d.content.has(digest);
  }

  private async fetchBlobOnce(session: BlobSource, desc: Descriptor): Promise<void> {
    if (await this.present(desc.digest)) return;
    await this.downloads(async () => {
      if (await this.present(desc.digest)) return;
      const body = await session.blob(desc);
      try {
        await this.d.content.ingest({ digest: desc.digest, size: desc.size }, body);
      } catch (err) {
        throw wrap(err, `failed to fetch blob ${desc.digest}`, 'Unavailable');
      }
    });
  }

  private layer(
    session: BlobSource,
    layer: Descriptor,
    diffId: string,
    chainId: string,
    parent: string | undefined,
    parentDone: Promise<Snapshot> | undefined,
  ): Promise<Snapshot> {
    const existing = this.d.snapshots.get(chainId);
    if (existing) return this.fetchBlob(session, layer).then(() => existing);
    const running = this.unpacks.get(chainId);
    if (running) {
      // An unpack another pull started and then abandoned: redo it for this one.
      return running.catch((err: unknown) => {
        if (isCancellation(err) && !session.aborted) return this.layer(session, layer, diffId, chainId, parent, parentDone);
        throw err;
      });
    }
    const work = (async () => {
      try {
        return await this.downloads(() => this.unpackLayer(session, layer, diffId, chainId, parent, false));
      } catch (err) {
        if (!(err instanceof (await loadLayerCode()).NeedsLowerLayers)) throw err;
        // A hardlink into a lower layer: wait for the parent outside any slot, then go again from the stored blob.
        await parentDone;
        return this.unpackSlots(() => this.unpackLayer(session, layer, diffId, chainId, parent, true));
      }
    })().finally(() => this.unpacks.delete(chainId));
    this.unpacks.set(chainId, work);
    return work;
  }

  /**
   * Unpacks a layer into a new snapshot. A blob not yet stored is fetched
   * once and each chunk both written to the content store (verified there)
   * and unpacked, on a layer thread; the snapshot is committed only if both
   * succeed.
   */
  private async unpackLayer(
    session: BlobSource,
    layer: Descriptor,
    diffId: string,
    chainId: string,
    parent: string | undefined,
    parentReady: boolean,
  ): Promise<Snapshot> {
    const { applyLayer, NeedsLowerLayers, storeAndUnpack } = await loadLayerCode();
    const dir = await this.d.snapshots.prepare();
    let body: Readable | undefined;
    try {
      if (!(await this.present(layer.digest))) body = await session.blob(layer);
    } catch (err) {
      // No download (the registry failed, or another layer of the pull already did): nothing to keep.
      await this.d.snapshots.abort(dir);
      throw err;
    }
    const lookupLower = async (rel: string) => {
      if (!parent) return undefined;
      if (!parentReady) throw new NeedsLowerLayers();
      return this.findInLowers(parent, rel);
    };
    let unpacked: PromiseSettledResult<ApplyResult>;
    let fetched: PromiseSettledResult<unknown> = { status: 'fulfilled', value: undefined };
    if (!body) {
      unpacked = (await Promise.allSettled([applyLayer(dir, this.d.content.read(layer.digest), { lookupLower })]))[0];
    } else {
      // Downloaded once, and at once stored and unpacked (on a layer thread); the snapshot is committed only if both succeed.
      const ingest = this.d.content.ingestFile({ digest: layer.digest, size: layer.size });
      const lower = !parent ? undefined : parentReady ? this.d.snapshots.lowerDirs(parent) : 'later';
      const outcome = await storeAndUnpack({ dir, blobTmp: ingest.path, algorithm: ingest.algorithm, lower }, body);
      unpacked = outcome.unpacked.ok ? { status: 'fulfilled', value: outcome.unpacked.value } : { status: 'rejected', reason: outcome.unpacked.error };
      const stored = outcome.stored;
      try {
        if (!stored.ok) throw stored.error;
        // The blob is kept even when its unpack failed: a layer done again reads it from the store.
        fetched = { status: 'fulfilled', value: await ingest.commit(stored.value) };
      } catch (err) {
        if (!stored.ok) await ingest.abort();
        fetched = { status: 'rejected', reason: wrap(err, `failed to fetch blob ${layer.digest}`, 'Unavailable') };
      }
    }
    try {
      // A full disk fails both copies; the unpack, the bigger writer, names the cause.
      if (unpacked.status === 'rejected' && isNoSpace(unpacked.reason)) {
        throw wrap(noSpaceAt(unpacked.reason, `unpacking into ${path.dirname(dir)}`), `failed to unpack layer ${layer.digest}`);
      }
      if (fetched.status === 'rejected') throw fetched.reason;
      if (unpacked.status === 'rejected') {
        if (unpacked.reason instanceof NeedsLowerLayers) throw unpacked.reason;
        throw wrap(unpacked.reason, `failed to unpack layer ${layer.digest}`);
      }
      const result = unpacked.value;
      if (result.diffId !== diffId) {
        throw new SkiffError('InvalidArgument', `layer ${layer.digest} unpacked to diff id ${result.diffId}, its image config says ${diffId}`);
      }
      return this.d.snapshots.commit(chainId, parent, dir, result);
    } catch (err) {
      await this.d.snapshots.abort(dir);
      throw err;
    }
  }

  private async findInLowers(chainId: string, rel: string): Promise<string | undefined> {
    return findInLowers(this.d.snapshots.lowerDirs(chainId), rel);
  }

  /**
   * Image records. Each config stays in the database until asked for:
   * listing images, or the kubelet's ImageStatus calls, must not load them.
   */
  private rows(where = '', ...args: unknown[]): ImageRecord[] {
    const rows = this.d.db.prepare(`SELECT id, manifest_digest, size, chain_ids, created_at, image_user FROM images ${where} ORDER BY created_at, id`).all(...args) as Array<Omit<ImageRow, 'config'>>;
    // An image removed meanwhile has no config left: acquire() loads it while the image is there.
    const configOf = (id: string): string => (this.d.db.prepare('SELECT config FROM images WHERE id = ?').get(id) as { config: string } | undefined)?.config ?? '{}';
    const names = this.d.db.prepare('SELECT name, image_id, kind FROM image_names').all() as Array<{ name: string; image_id: string; kind: string }>;
    return rows.map((r) => {
      const mine = names.filter((n) => n.image_id === r.id);
      const repoTags = mine.filter((n) => n.kind === 'tag').map((n) => n.name).sort();
      let config: ImageConfig | undefined;
      return {
        id: r.id,
        repoTags,
        repoDigests: mine.filter((n) => n.kind === 'digest').map((n) => n.name).sort(),
        size: r.size,
        user: r.image_user,
        // Parsed only when asked for: listing images must not cost a parse of every config.
        get config() {
          return (config ??= normalizeConfig(JSON.parse(configOf(r.id))));
        },
        chainIds: JSON.parse(r.chain_ids) as string[],
        manifestDigest: r.manifest_digest,
        pinned: repoTags.some((t) => this.pinned.has(t)),
      };
    });
  }

  list(): ImageRecord[] {
    return this.rows();
  }

  /** Finds an image by name (tag or digest), by id, or by a unique id prefix. */
  find(nameOrId: string): ImageRecord | undefined {
    const s = nameOrId.trim();
    if (isImageId(s)) {
      const id = s.startsWith('sha256:') ? s : `sha256:${s}`;
      return this.rows('WHERE id = ?', id)[0];
    }
    let ref: Reference | undefined;
    try {
      ref = parseReference(s);
    } catch (err) {
      if (!/^(sha256:)?[a-f0-9]{3,63}$/.test(s)) throw err;
    }
    if (ref) {
      const key = ref.digest ? `${repository(ref)}@${ref.digest}` : tagName(ref)!;
      const row = this.d.db.prepare('SELECT image_id FROM image_names WHERE name = ?').get(key) as { image_id: string } | undefined;
      if (row) return this.rows('WHERE id = ?', row.image_id)[0];
    }
    if (/^(sha256:)?[a-f0-9]{3,63}$/.test(s)) {
      const prefix = s.startsWith('sha256:') ? s : `sha256:${s}`;
      const hits = this.rows('WHERE substr(id, 1, ?) = ?', prefix.length, prefix);
      if (hits.length === 1) return hits[0];
    }
    return undefined;
  }

  /**
   * Finds an image and holds its snapshots against garbage collection until
   * `release` is called. A container being created stands on them before its
   * record (which keeps them from then on) exists; the look-up and the hold
   * happen with no await between them, so a RemoveImage either comes first
   * (the image is not found) or leaves the snapshots in place.
   */
  acquire(nameOrId: string): { image: ImageRecord; release: () => Promise<void> } | undefined {
    const image = this.find(nameOrId);
    if (!image) return undefined;
    void image.config;
    let release: (() => void) | undefined = this.lease([...image.chainIds]);
    return {
      image,
      release: async () => {
        if (!release) return;
        release();
        release = undefined;
        // Removed while held: what only the hold kept goes now, so ImageFsInfo is current when the call returns.
        if (!this.find(image.id)) await this.gc().catch((err) => this.d.log.warn('snapshot cleanup after a released hold failed', { error: errorMessage(err) }));
      },
    };
  }

  /** Removes the image with all its names; removing a missing image is not an error. */
  async remove(nameOrId: string): Promise<boolean> {
    const img = this.find(nameOrId);
    if (!img) return false;
    this.d.db.prepare('DELETE FROM images WHERE id = ?').run(img.id);
    await this.gc();
    this.d.log.info('image removed', { id: img.id, tags: img.repoTags });
    return true;
  }

  /** Containers use snapshots as their lower dirs: those outlive the removal of their image. */
  setSnapshotUsers(users: SnapshotUsers): void {
    this.snapshotUsers = users;
  }

  /** Deletes the snapshots and blobs that no image or container refers to and no pull holds. */
  async gc(): Promise<void> {
    const rows = this.d.db.prepare('SELECT chain_ids, blobs FROM images').all() as Array<{ chain_ids: string; blobs: string }>;
    const keep = new Set<string>(this.leases.keys());
    for (const top of this.snapshotUsers()) {
      for (let cur: string | undefined = top; cur && !keep.has(cur); cur = this.d.snapshots.get(cur)?.parent) keep.add(cur);
    }
    for (const r of rows) {
      for (const c of JSON.parse(r.chain_ids) as string[]) keep.add(c);
      for (const b of JSON.parse(r.blobs) as string[]) keep.add(b);
    }
    // A pull that started since `keep` was made holds its leases by now: each is looked at again
    // right before its removal, and a blob being deleted is waited for before a pull trusts it.
    // Children first, so a parent is never removed while a child still names it.
    for (const s of this.d.snapshots.list().reverse()) {
      if (!keep.has(s.chainId) && !this.leases.has(s.chainId) && !this.unpacks.has(s.chainId)) await this.d.snapshots.remove(s.chainId);
    }
    for (const b of await this.d.content.list()) {
      if (keep.has(b.digest) || this.leases.has(b.digest)) continue;
      const deleting = this.d.content.delete(b.digest);
      this.deleting.set(b.digest, deleting);
      try {
        await deleting;
      } finally {
        if (this.deleting.get(b.digest) === deleting) this.deleting.delete(b.digest);
      }
    }
  }

  async fsUsage(): Promise<{ mountpoint: string; bytes: number; inodes: number }> {
    const snap = this.d.snapshots.usage();
    const blobs = await this.d.content.list();
    return {
      mountpoint: this.d.snapshots.mountpoint,
      bytes: snap.bytes + blobs.reduce((a, b) => a + b.size, 0),
      inodes: snap.inodes + blobs.length,
    };
  }
}

function wrapPull(name: string, err: SkiffError): SkiffError {
  return new SkiffError(err.kind, `failed to pull image "${name}": ${err.message}`, { cause: err });
}

function bufferStream(buf: Buffer): Readable {
  return Readable.from([buf]);
}
