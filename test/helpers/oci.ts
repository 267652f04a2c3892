/**
 * Builds test images in memory (layers from explicit entries, Docker or OCI
 * media types, indexes) and pushes them to a registry over the distribution API.
 */
import { type Blob, type BuiltImage, sha256 } from '../../src/image/build-oci.js';

export * from '../../src/image/build-oci.js';

/** Pushes blobs and manifests with plain HTTP to a registry at `base` (http://127.0.0.1:port). */
export class Pusher {
  constructor(readonly base: string) {}

  async blob(repo: string, data: Buffer): Promise<string> {
    const digest = sha256(data);
    const head = await fetch(`${this.base}/v2/${repo}/blobs/${digest}`, { method: 'HEAD' });
    if (head.ok) return digest;
    const start = await fetch(`${this.base}/v2/${repo}/blobs/uploads/`, { method: 'POST' });
    if (start.status !== 202) throw new Error(`upload start ${start.status}: ${await start.text()}`);
    const loc = new URL(start.headers.get('location')!, this.base);
    loc.searchParams.set('digest', digest);
    const put = await fetch(loc, { method: 'PUT', body: new Uint8Array(data), headers: { 'content-type': 'application/octet-stream' } });
    if (put.status !== 201) throw new Error(`upload ${put.status}: ${await put.text()}`);
    return digest;
  }

  async manifest(repo: string, ref: string, m: Blob): Promise<string> {
    const res = await fetch(`${this.base}/v2/${repo}/manifests/${ref}`, {
      method: 'PUT',
      body: new Uint8Array(m.data),
      headers: { 'content-type': m.mediaType },
    });
    if (res.status !== 201) throw new Error(`manifest put ${res.status}: ${await res.text()}`);
    return m.digest;
  }

  async image(repo: string, tag: string, img: BuiltImage): Promise<string> {
    for (const l of img.layers) await this.blob(repo, l.data);
    await this.blob(repo, img.config.data);
    await this.manifest(repo, img.manifest.digest, img.manifest);
    return this.manifest(repo, tag, img.manifest);
  }

  async index(repo: string, tag: string, images: BuiltImage[], index: Blob): Promise<string> {
    for (const img of images) await this.image(repo, img.manifest.digest, img);
    return this.manifest(repo, tag, index);
  }
}
