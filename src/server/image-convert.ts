/** ImageRecord → CRI Image message, shared by ListImages and ImageStatus. */
import type { Image } from '../gen/runtime/v1/Image.js';
import type { ImageRecord } from '../image/service.js';

export function imageUser(user: string | undefined): { uid?: number; username: string } {
  const u = (user ?? '').split(':')[0] ?? '';
  if (u === '') return { username: '' };
  if (/^\d+$/.test(u)) return { uid: Number(u), username: '' };
  return { username: u };
}

export function toCriImage(img: ImageRecord): Image {
  const { uid, username } = imageUser(img.user);
  return {
    id: img.id,
    repoTags: img.repoTags,
    repoDigests: img.repoDigests,
    size: img.size,
    uid: uid === undefined ? null : { value: uid },
    username,
    spec: { image: img.id, annotations: {}, userSpecifiedImage: '', runtimeHandler: '' },
    pinned: img.pinned,
  };
}
