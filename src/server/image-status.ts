import type { ImageStatusRequest__Output } from '../gen/runtime/v1/ImageStatusRequest.js';
import type { ImageStatusResponse } from '../gen/runtime/v1/ImageStatusResponse.js';
import { invalidArgument } from '../errors.js';
import type { ImageService } from '../image/service.js';
import { toCriImage } from './image-convert.js';

/** A missing image is not an error: the response simply has no image, as the CRI asks. */
export function imageStatus(images: ImageService) {
  return async (req: ImageStatusRequest__Output): Promise<ImageStatusResponse> => {
    const ref = req.image?.image ?? '';
    if (!ref) throw invalidArgument('ImageStatus: image.image is empty');
    const img = images.find(ref);
    if (!img) return { image: null, info: {} };
    const info: Record<string, string> = {};
    if (req.verbose) {
      info.info = JSON.stringify({
        id: img.id,
        manifestDigest: img.manifestDigest,
        chainID: img.chainIds[img.chainIds.length - 1] ?? '',
        imageSpec: img.config,
      });
    }
    return { image: toCriImage(img), info };
  };
}
