import type { ListImagesRequest__Output } from '../gen/runtime/v1/ListImagesRequest.js';
import type { ListImagesResponse } from '../gen/runtime/v1/ListImagesResponse.js';
import type { ImageService } from '../image/service.js';
import { toCriImage } from './image-convert.js';

export function listImages(images: ImageService) {
  return async (req: ListImagesRequest__Output): Promise<ListImagesResponse> => {
    const wanted = req.filter?.image?.image ?? '';
    if (wanted) {
      const img = images.find(wanted);
      return { images: img ? [toCriImage(img)] : [] };
    }
    return { images: images.list().map(toCriImage) };
  };
}
