import type { RemoveImageRequest__Output } from '../gen/runtime/v1/RemoveImageRequest.js';
import type { RemoveImageResponse } from '../gen/runtime/v1/RemoveImageResponse.js';
import { invalidArgument } from '../errors.js';
import type { ImageService } from '../image/service.js';

/** Removes the image and every name it has; an image that is already gone is success. */
export function removeImage(images: ImageService) {
  return async (req: RemoveImageRequest__Output): Promise<RemoveImageResponse> => {
    const ref = req.image?.image ?? '';
    if (!ref) throw invalidArgument('RemoveImage: image.image is empty');
    await images.remove(ref);
    return {};
  };
}
