import type { PullImageRequest__Output } from '../gen/runtime/v1/PullImageRequest.js';
import type { PullImageResponse } from '../gen/runtime/v1/PullImageResponse.js';
import type { EventEmitter } from 'node:events';
import { invalidArgument } from '../errors.js';
import type { Credentials } from '../image/registry.js';
import type { ImageService } from '../image/service.js';
import { PullCancelled } from '../image/shared-work.js';

export function credentialsFrom(auth: PullImageRequest__Output['auth']): Credentials {
  if (!auth) return {};
  const creds: Credentials = {};
  if (auth.username || auth.password) {
    creds.username = auth.username;
    creds.password = auth.password;
  } else if (auth.auth) {
    const decoded = Buffer.from(auth.auth, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    if (colon < 0) throw invalidArgument('auth.auth must be base64 of "username:password"');
    creds.username = decoded.slice(0, colon);
    creds.password = decoded.slice(colon + 1);
  }
  if (auth.identityToken) creds.identityToken = auth.identityToken;
  if (auth.registryToken) creds.registryToken = auth.registryToken;
  return creds;
}

export function pullImage(images: ImageService) {
  return async (req: PullImageRequest__Output, call?: EventEmitter): Promise<PullImageResponse> => {
    const image = req.image?.image ?? '';
    if (!image) throw invalidArgument('PullImage: image.image is empty');
    // The call says 'cancelled' when the client hangs up or its deadline passes: stop downloading for it then.
    const gone = new AbortController();
    const cancel = () => gone.abort(new PullCancelled(`pull of "${image}" cancelled: the client went away or its deadline passed`));
    call?.once('cancelled', cancel);
    try {
      const id = await images.pull(image, credentialsFrom(req.auth), gone.signal);
      return { imageRef: id };
    } finally {
      call?.off('cancelled', cancel);
    }
  };
}
