/** What a pull or an import reads an image from, and how it names the pieces. */
import type { Readable } from 'node:stream';
import type { Platform } from './platform.js';
import type { FetchedManifest } from './registry.js';

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: Partial<Platform>;
}

/** Where a pull or import reads manifests and blobs from: a registry session, or an archive. */
export interface BlobSource {
  /** The manifest or index named by a tag or digest, its digest verified. */
  manifest(tagOrDigest: string): Promise<FetchedManifest>;
  /** Exactly `desc.size` bytes; the store verifies the digest. */
  blob(desc: { digest: string; size: number }): Promise<Readable>;
  /** The work this source serves was abandoned. */
  readonly aborted: boolean;
}
