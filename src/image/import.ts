/**
 * Reads what an image archive holds: an OCI image layout (`ctr images
 * export`, `skopeo copy oci-archive:`, `docker save` since Docker 25) or a
 * classic `docker save` archive (manifest.json, <id>.json configs and
 * uncompressed layer tars). Nothing here stores anything: it names the
 * images and serves their manifests and blobs from the archive as a
 * registry session would, so that an import is verified, unpacked and
 * recorded by the same code as a pull.
 */
import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { SkiffError } from '../errors.js';
import { archiveName, type ImageArchive } from './archive.js';
import { digestOf, parseDigest, sha256Digest } from './content.js';
import { selectPlatform, hostPlatform, type Platform } from './platform.js';
import { parseReference, type Reference } from './reference.js';
import { Limits, MediaType, type FetchedManifest } from './registry.js';
import { parseJson } from './json.js';
import type { BlobSource, Descriptor } from './source.js';
import { cancelledError } from './shared-work.js';

/** Images named in one archive's index.json or manifest.json. */
export const MAX_ARCHIVE_IMAGES = 1024;

/** containerd's annotation for an image's full name, as `ctr images export` writes it. */
export const CONTAINERD_NAME = 'io.containerd.image.name';
/** OCI's annotation: a full reference, or (as containerd and Docker write it) only the tag. */
export const OCI_REF_NAME = 'org.opencontainers.image.ref.name';

export interface ArchiveImageEntry {
  /** The manifest or index the image starts from. */
  top: { digest: string };
  /** The names the archive gives it. */
  refs: Reference[];
  /** Whether `top` is a real manifest a registry would serve (so repo@digest names it). */
  digestKnown: boolean;
}

export interface ArchiveContents {
  format: 'oci' | 'docker';
  source: BlobSource;
  images: ArchiveImageEntry[];
  /** docker save's RepoTags by config digest, for an OCI layout whose index names nothing. */
  tagsByConfig: Map<string, Reference[]>;
}

function bad(archive: ImageArchive, why: string): SkiffError {
  return new SkiffError('InvalidArgument', `archive ${archive.label}: ${why}`);
}

const isObject = (v: unknown): v is Record<string, unknown> => v !== null && typeof v === 'object' && !Array.isArray(v);

/** Serves an archive's blobs by digest, and the manifests a classic docker save archive implies. */
class ArchiveSource implements BlobSource {
  constructor(
    private readonly archive: ImageArchive,
    /** Blobs stored under other names than blobs/<alg>/<hex>. */
    private readonly named: Map<string, string>,
    private readonly synthesized: Map<string, FetchedManifest>,
    private readonly signal?: AbortSignal,
  ) {}

  get aborted(): boolean {
    return this.signal?.aborted ?? false;
  }

  private fileOf(digest: string): string {
    const named = this.named.get(digest);
    if (named) return named;
    const { algorithm, hex } = parseDigest(digest);
    const name = `blobs/${algorithm}/${hex}`;
    if (!this.archive.has(name)) throw bad(this.archive, `blob ${digest} is missing (no ${name})`);
    return name;
  }

  async manifest(digest: string): Promise<FetchedManifest> {
    const made = this.synthesized.get(digest);
    if (made) return made;
    const { algorithm } = parseDigest(digest);
    const body = await this.archive.read(this.fileOf(digest), Limits.manifest, `manifest ${digest}`);
    const actual = digestOf(algorithm, body);
    if (actual !== digest) throw bad(this.archive, `digest mismatch: manifest ${digest} holds bytes of ${actual}`);
    const parsed = parseJson<unknown>(body, `manifest ${digest}`);
    let mediaType: string = MediaType.OciManifest;
    if (isObject(parsed)) {
      if (typeof parsed.mediaType === 'string') mediaType = parsed.mediaType;
      else if (parsed.schemaVersion === 1) mediaType = MediaType.DockerSchema1;
      else if (Array.isArray(parsed.manifests)) mediaType = MediaType.OciIndex;
    }
    return { digest, mediaType, body };
  }

  async blob(desc: { digest: string; size: number }): Promise<Readable> {
    if (this.signal?.aborted) throw cancelledError(this.signal.reason, `import of ${this.archive.label}`);
    const file = this.archive.file(this.fileOf(desc.digest));
    if (file.size !== desc.size) throw bad(this.archive, `blob ${desc.digest} is ${file.size} bytes, its descriptor says ${desc.size}`);
    return this.archive.open(file.name);
  }
}

/** A name from index.json's annotations, or none when it gives only a tag. */
function nameOf(archive: ImageArchive, annotations: unknown): Reference | undefined {
  if (!isObject(annotations)) return undefined;
  const full = annotations[CONTAINERD_NAME];
  const ref = annotations[OCI_REF_NAME];
  let name: string | undefined;
  if (typeof full === 'string' && full !== '') name = full;
  // A bare tag ("latest", "1.0") names nothing on its own; a reference has a repository.
  else if (typeof ref === 'string' && /[/:@]/.test(ref)) name = ref;
  if (name === undefined) return undefined;
  try {
    return parseReference(name);
  } catch (err) {
    throw bad(archive, `image name "${name}" in index.json: ${(err as Error).message}`);
  }
}

function checkDescriptor(archive: ImageArchive, d: unknown, where: string): Descriptor & { annotations?: unknown } {
  if (!isObject(d) || typeof d.digest !== 'string' || typeof d.mediaType !== 'string' || !Number.isSafeInteger(d.size) || (d.size as number) < 0) {
    throw bad(archive, `${where} has an entry without a digest, media type and size`);
  }
  try {
    parseDigest(d.digest);
  } catch (err) {
    throw bad(archive, `${where}: ${(err as Error).message}`);
  }
  return d as unknown as Descriptor & { annotations?: unknown };
}

async function readOci(archive: ImageArchive, platform: Platform): Promise<ArchiveImageEntry[]> {
  if (archive.has('oci-layout')) {
    const layout = parseJson<unknown>(await archive.read('oci-layout', 64 << 10), 'oci-layout');
    if (!isObject(layout) || typeof layout.imageLayoutVersion !== 'string' || !layout.imageLayoutVersion.startsWith('1.')) {
      throw bad(archive, `oci-layout does not name an image layout version 1.x`);
    }
  }
  const index = parseJson<unknown>(await archive.read('index.json', Limits.manifest), 'index.json');
  if (!isObject(index) || !Array.isArray(index.manifests)) throw bad(archive, 'index.json has no manifests list');
  if (index.manifests.length > MAX_ARCHIVE_IMAGES) throw bad(archive, `index.json lists ${index.manifests.length} manifests, more than the ${MAX_ARCHIVE_IMAGES} skiff imports`);
  const groups = new Map<string, Array<{ desc: Descriptor; ref?: Reference }>>();
  for (const raw of index.manifests) {
    const desc = checkDescriptor(archive, raw, 'index.json');
    const ref = nameOf(archive, desc.annotations);
    const key = ref ? `${ref.domain}/${ref.path}:${ref.tag ?? ''}@${ref.digest ?? ''}` : '';
    groups.set(key, [...(groups.get(key) ?? []), { desc, ref }]);
  }
  const out: ArchiveImageEntry[] = [];
  for (const members of groups.values()) {
    // Several platform manifests under one name (or none) with no index above them: pick this machine's, as a pull would.
    if (members.length > 1 && members.every((m) => m.desc.platform)) {
      const chosen = selectPlatform(members.map((m) => ({ ...m, platform: m.desc.platform })), platform);
      if (!chosen) throw bad(archive, `has no image for this machine's platform among ${members.map((m) => m.desc.digest).join(', ')}`);
      out.push({ top: { digest: chosen.desc.digest }, refs: chosen.ref ? [chosen.ref] : [], digestKnown: true });
      continue;
    }
    for (const m of members) out.push({ top: { digest: m.desc.digest }, refs: m.ref ? [m.ref] : [], digestKnown: true });
  }
  if (!out.length) throw bad(archive, 'index.json lists no images');
  return out;
}

interface DockerSaveEntry {
  Config: string;
  RepoTags: string[];
  Layers: string[];
}

async function readDockerManifest(archive: ImageArchive): Promise<DockerSaveEntry[]> {
  const list = parseJson<unknown>(await archive.read('manifest.json', Limits.manifest), 'manifest.json');
  if (!Array.isArray(list)) throw bad(archive, 'manifest.json is not a list of images');
  if (list.length > MAX_ARCHIVE_IMAGES) throw bad(archive, `manifest.json lists ${list.length} images, more than the ${MAX_ARCHIVE_IMAGES} skiff imports`);
  return list.map((e, i) => {
    const ok = isObject(e) && typeof e.Config === 'string' && Array.isArray(e.Layers) && e.Layers.every((l) => typeof l === 'string');
    const tags = isObject(e) && e.RepoTags !== undefined && e.RepoTags !== null ? e.RepoTags : [];
    if (!ok || !Array.isArray(tags) || !tags.every((t) => typeof t === 'string')) throw bad(archive, `manifest.json entry ${i} has no Config and Layers`);
    return { Config: e.Config as string, RepoTags: tags as string[], Layers: e.Layers as string[] };
  });
}

function member(archive: ImageArchive, raw: string, what: string): string {
  const name = archiveName(raw);
  if (name === undefined || name === '') throw bad(archive, `${what} "${raw}" points outside the archive`);
  if (!archive.has(name)) throw bad(archive, `${what} ${name} is missing`);
  return name;
}

function parseTags(archive: ImageArchive, tags: string[]): Reference[] {
  return tags.map((t) => {
    try {
      return parseReference(t);
    } catch (err) {
      throw bad(archive, `RepoTag "${t}" in manifest.json: ${(err as Error).message}`);
    }
  });
}

/** The first bytes of an archive member: enough to tell gzip and zstd from a plain tar. */
async function magic(archive: ImageArchive, name: string): Promise<'gzip' | 'zstd' | 'none'> {
  const f = archive.file(name);
  if (f.size < 4) return 'none';
  const stream = archive.open(name);
  const chunks: Buffer[] = [];
  let got = 0;
  for await (const c of stream as AsyncIterable<Buffer>) {
    chunks.push(c);
    got += c.length;
    if (got >= 4) break;
  }
  stream.destroy();
  const b = Buffer.concat(chunks);
  if (b[0] === 0x1f && b[1] === 0x8b) return 'gzip';
  if (b.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  return 'none';
}

async function hashMember(archive: ImageArchive, name: string): Promise<string> {
  const h = createHash('sha256');
  for await (const c of archive.open(name) as AsyncIterable<Buffer>) h.update(c);
  return `sha256:${h.digest('hex')}`;
}

const DOCKER_LAYER = { none: 'application/vnd.docker.image.rootfs.diff.tar', gzip: 'application/vnd.docker.image.rootfs.diff.tar.gzip', zstd: 'application/vnd.docker.image.rootfs.diff.tar.zstd' } as const;

/**
 * A classic docker save archive has no manifests: each image gets the
 * Docker v2 manifest a registry would serve for it, made from its config and
 * layer files. Uncompressed layers (what Docker writes) are named by their
 * diff ids, which the store then verifies as their digests.
 */
async function readDockerSave(archive: ImageArchive, named: Map<string, string>, synthesized: Map<string, FetchedManifest>, signal?: AbortSignal): Promise<ArchiveImageEntry[]> {
  const out: ArchiveImageEntry[] = [];
  const layerKinds = new Map<string, { kind: 'gzip' | 'zstd' | 'none'; digest?: string }>();
  for (const [i, e] of (await readDockerManifest(archive)).entries()) {
    if (signal?.aborted) throw cancelledError(signal.reason, `import of ${archive.label}`);
    const configName = member(archive, e.Config, `config of image ${i}`);
    const configBytes = await archive.read(configName, Limits.config, `image config ${configName}`);
    const configDigest = sha256Digest(configBytes);
    named.set(configDigest, configName);
    const config = parseJson<unknown>(configBytes, `image config ${configName}`);
    const rootfs = isObject(config) && isObject(config.rootfs) ? config.rootfs : {};
    const diffIds = Array.isArray(rootfs.diff_ids) && rootfs.diff_ids.every((d) => typeof d === 'string') ? (rootfs.diff_ids as string[]) : undefined;
    if (!diffIds) throw bad(archive, `image config ${configName} has no rootfs.diff_ids`);
    if (diffIds.length !== e.Layers.length) throw bad(archive, `image ${i} has ${e.Layers.length} layers but ${diffIds.length} diff ids in its config`);
    if (e.Layers.length > Limits.layers) throw bad(archive, `image ${i} has ${e.Layers.length} layers, more than the ${Limits.layers} skiff accepts`);
    const layers: Descriptor[] = [];
    for (const [j, raw] of e.Layers.entries()) {
      const name = member(archive, raw, `layer ${j} of image ${i}`);
      // Images share layers: each file is looked at (and a compressed one hashed) once.
      let seen = layerKinds.get(name);
      if (!seen) {
        const k = await magic(archive, name);
        seen = { kind: k, digest: k === 'none' ? undefined : await hashMember(archive, name) };
        layerKinds.set(name, seen);
      }
      const kind = seen.kind;
      const digest = seen.digest ?? diffIds[j]!;
      try {
        parseDigest(digest);
      } catch (err) {
        throw bad(archive, `layer ${name}: ${(err as Error).message}`);
      }
      const known = named.get(digest);
      if (known !== undefined && known !== name && archive.file(known).size !== archive.file(name).size) {
        throw bad(archive, `layers ${known} and ${name} claim the same digest ${digest}`);
      }
      named.set(digest, known ?? name);
      layers.push({ mediaType: DOCKER_LAYER[kind], digest, size: archive.file(name).size });
    }
    const body = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: MediaType.DockerManifest,
        config: { mediaType: 'application/vnd.docker.container.image.v1+json', digest: configDigest, size: configBytes.length },
        layers,
      }),
    );
    const digest = sha256Digest(body);
    synthesized.set(digest, { digest, mediaType: MediaType.DockerManifest, body });
    out.push({ top: { digest }, refs: parseTags(archive, e.RepoTags), digestKnown: false });
  }
  if (!out.length) throw bad(archive, 'manifest.json lists no images');
  return out;
}

/** Tells the archive's format and lists its images; throws a clear error for anything else. */
export async function readImageArchive(archive: ImageArchive, signal?: AbortSignal, platform: Platform = hostPlatform()): Promise<ArchiveContents> {
  const named = new Map<string, string>();
  const synthesized = new Map<string, FetchedManifest>();
  const source = new ArchiveSource(archive, named, synthesized, signal);
  const tagsByConfig = new Map<string, Reference[]>();
  if (archive.has('index.json')) {
    const images = await readOci(archive, platform);
    // Docker 25+ writes both: its manifest.json may name images the index leaves unnamed.
    if (archive.has('manifest.json')) {
      for (const e of await readDockerManifest(archive)) {
        const m = /^blobs\/(sha256)\/([a-f0-9]{64})$/.exec(archiveName(e.Config) ?? '');
        if (m) tagsByConfig.set(`${m[1]}:${m[2]}`, parseTags(archive, e.RepoTags));
      }
    }
    return { format: 'oci', source, images, tagsByConfig };
  }
  if (archive.has('manifest.json')) {
    return { format: 'docker', source, images: await readDockerSave(archive, named, synthesized, signal), tagsByConfig };
  }
  throw bad(archive, 'is neither an OCI image layout (no index.json) nor a docker save archive (no manifest.json)');
}
