/** A small runnable image: Debian's static busybox with its applets as symlinks, and users. */
import { buildImage, busyboxEntries, type BuiltImage, type Compression, type Entry } from './oci.js';

export async function busyboxImage(config: Record<string, unknown> = {}, extraLayer?: Entry[], compression?: Compression): Promise<BuiltImage> {
  const entries = await busyboxEntries();
  return buildImage({
    layers: extraLayer ? [{ entries, compression }, { entries: extraLayer, compression }] : [{ entries, compression }],
    config: { config: { Env: ['PATH=/bin'], Cmd: ['sh'], ...config } },
  });
}
