import type { ImageFsInfoResponse } from '../gen/runtime/v1/ImageFsInfoResponse.js';
import type { ImageService } from '../image/service.js';
import { nowWireNs } from '../container/time.js';

export function imageFsInfo(images: ImageService) {
  return async (): Promise<ImageFsInfoResponse> => {
    const u = await images.fsUsage();
    const usage = {
      timestamp: nowWireNs(),
      fsId: { mountpoint: u.mountpoint },
      usedBytes: { value: u.bytes },
      inodesUsed: { value: u.inodes },
    };
    return { imageFilesystems: [usage], containerFilesystems: [] };
  };
}
