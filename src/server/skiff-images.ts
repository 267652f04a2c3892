/**
 * skiff.v1.Images: image archive import and pulls that stream their
 * progress, for the `skiff images` command. The daemon reads the archive
 * itself; the socket is root's alone, so the caller could read it too.
 */
import type { ServerStream } from './rpc.js';
import path from 'node:path';
import { SkiffError, errorMessage } from '../errors.js';
import type { Logger } from '../log.js';
import type { ImportRequest__Output } from '../gen/skiff/v1/ImportRequest.js';
import type { ImportProgress } from '../gen/skiff/v1/ImportProgress.js';
import type { PullRequest__Output } from '../gen/skiff/v1/PullRequest.js';
import type { PullProgress as PullProgressMessage } from '../gen/skiff/v1/PullProgress.js';
import type { ImageService, PullProgress } from '../image/service.js';
import { PullCancelled } from '../image/shared-work.js';
import { toServiceError } from './boundary.js';
import { statusName } from './status.js';

/** Progress messages are sent at most this often; the last one always. */
const PROGRESS_INTERVAL_MS = 100;

/**
 * Sends progress no faster than the interval, and none while the client is
 * not reading: a slow reader gets fewer updates, never a growing buffer.
 */
function progressWriter<T>(call: ServerStream, make: (p: PullProgress) => T): (p: PullProgress) => void {
  let last = 0;
  return (p) => {
    const now = Date.now();
    if (now - last < PROGRESS_INTERVAL_MS || call.writableLength > 0 || call.cancelled) return;
    last = now;
    call.write(make(p));
  };
}

function toProgress(p: PullProgress) {
  return { bytesDone: p.bytesDone, bytesTotal: p.bytesTotal, layersDone: p.layersDone, layersTotal: p.layersTotal };
}

function finish<T>(call: ServerStream, method: string, log: Logger, started: number, work: Promise<T>): void {
  work.then(
    (last) => {
      log.info('rpc', { method, ms: Date.now() - started, code: 'OK' });
      if (!call.cancelled) {
        call.write(last);
        call.end();
      }
    },
    (err: unknown) => {
      const e = toServiceError(err);
      log.info('rpc', { method, ms: Date.now() - started, code: statusName(e.code), error: errorMessage(err) });
      if (!call.cancelled) call.fail(e);
    },
  );
}

export function skiffImagesHandlers(images: ImageService, log: Logger) {
  return {
    Import: (call: ServerStream<ImportRequest__Output>) => {
      const started = Date.now();
      const file = call.request.path ?? '';
      const gone = new AbortController();
      call.once('cancelled', () => gone.abort(new PullCancelled(`import of ${file} cancelled: the client went away`)));
      let last: PullProgress = { bytesDone: 0, bytesTotal: 0, layersDone: 0, layersTotal: 0 };
      const send = progressWriter(call, (p) => ({ progress: toProgress(p) }));
      const work = (async (): Promise<ImportProgress> => {
        if (!file || !path.isAbsolute(file)) throw new SkiffError('InvalidArgument', `Import: path must be an absolute path on the daemon's host, not "${file}"`);
        const got = await images.importArchive(path.normalize(file), {
          signal: gone.signal,
          onProgress: (p) => {
            last = p;
            send(p);
          },
        });
        return { progress: toProgress(last), images: got.map((i) => ({ id: i.id, repoTags: i.repoTags, repoDigests: i.repoDigests, size: i.size })) };
      })();
      finish(call, 'skiff.v1.Images/Import', log, started, work);
    },
    Pull: (call: ServerStream<PullRequest__Output>) => {
      const started = Date.now();
      const image = call.request.image ?? '';
      const gone = new AbortController();
      call.once('cancelled', () => gone.abort(new PullCancelled(`pull of "${image}" cancelled: the client went away`)));
      let last: PullProgress = { bytesDone: 0, bytesTotal: 0, layersDone: 0, layersTotal: 0 };
      const send = progressWriter(call, (p) => ({ progress: toProgress(p) }));
      const work = (async (): Promise<PullProgressMessage> => {
        if (!image) throw new SkiffError('InvalidArgument', 'Pull: image is empty');
        const creds = call.request.username || call.request.password ? { username: call.request.username, password: call.request.password } : {};
        const id = await images.pull(image, creds, gone.signal, (p) => {
          last = p;
          send(p);
        });
        return { progress: toProgress(last), imageRef: id };
      })();
      finish(call, 'skiff.v1.Images/Pull', log, started, work);
    },
  };
}
