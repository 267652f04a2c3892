/**
 * Getting a container's image as its pull policy says: Never, IfNotPresent or
 * Always, with failures shown as ErrImagePull and then ImagePullBackOff while
 * the image's back-off runs. Pulls of one image are shared by every pod
 * that asks for it at once.
 */
import { createHash } from 'node:crypto';
import type { Container, Pod } from 'kubernetes-types/core/v1.js';
import type { PodSandboxConfig } from '../gen/runtime/v1/PodSandboxConfig.js';
import { errorMessage } from '../errors.js';
import { Backoff, IMAGE_BACKOFF } from './backoff.js';
import type { CriEndpoint } from './cri-client.js';
import type { ObjectLookup } from './model.js';
import { credentialsFor, type PullCredential } from './pull-secrets.js';

export interface ImageUser {
  uid?: number;
  username?: string;
}

export type ImageResult =
  | { ok: true; imageRef: string; user: ImageUser }
  | { ok: false; reason: 'ErrImagePull' | 'ImagePullBackOff' | 'ErrImageNeverPull' | 'InvalidImageName'; message: string };

export interface ImageEvents {
  (type: 'Normal' | 'Warning', reason: string, message: string): void;
}

/** Pulls take as long as they take; the kubelet's image pulls have no deadline of their own either. */
const PULL_TIMEOUT_MS = 30 * 60_000;

export class ImageManager {
  private readonly backoff = new Backoff(IMAGE_BACKOFF);
  private readonly inflight = new Map<string, Promise<string>>();

  constructor(
    private readonly cri: CriEndpoint,
    private readonly now: () => number = Date.now,
  ) {}

  private async present(image: string): Promise<{ ref: string; user: ImageUser } | undefined> {
    const st = await this.cri.images.imageStatus({ image: { image }, verbose: false });
    if (!st.image) return undefined;
    const user: ImageUser = {};
    if (st.image.uid) user.uid = Number(st.image.uid.value);
    if (st.image.username) user.username = st.image.username;
    return { ref: st.image.id, user };
  }

  /** `objects`: where the pod's image pull secrets (and its ServiceAccount) are read from. */
  async ensure(pod: Pod, container: Container, sandbox: PodSandboxConfig, event: ImageEvents, objects?: ObjectLookup): Promise<ImageResult> {
    const image = container.image ?? '';
    if (!image.trim()) return { ok: false, reason: 'InvalidImageName', message: 'the image name is empty' };
    const policy = container.imagePullPolicy ?? 'IfNotPresent';
    let have: { ref: string; user: ImageUser } | undefined;
    try {
      have = await this.present(image);
    } catch (err) {
      return { ok: false, reason: 'ErrImagePull', message: `failed to inspect image "${image}": ${errorMessage(err)}` };
    }
    if (policy === 'Never') {
      if (have) return { ok: true, imageRef: have.ref, user: have.user };
      const message = `Container image "${image}" is not present with pull policy of Never`;
      event('Warning', 'ErrImageNeverPull', message);
      return { ok: false, reason: 'ErrImageNeverPull', message };
    }
    if (policy === 'IfNotPresent' && have) {
      event('Normal', 'Pulled', `Container image "${image}" already present on machine`);
      return { ok: true, imageRef: have.ref, user: have.user };
    }
    const key = `${pod.metadata?.uid ?? ''}/${image}`;
    const now = this.now();
    const last = this.lastFailure.get(key);
    if (last !== undefined && this.backoff.blockedUntil(key, last, now) !== undefined) {
      const message = `Back-off pulling image "${image}"`;
      event('Normal', 'BackOff', message);
      return { ok: false, reason: 'ImagePullBackOff', message };
    }
    const { credentials, problems } = objects ? credentialsFor(pod, image, objects) : { credentials: [], problems: [] };
    for (const p of problems) event('Warning', p.reason, p.message);
    event('Normal', 'Pulling', `Pulling image "${image}"`);
    const started = this.now();
    try {
      await this.pullWith(image, sandbox, credentials);
      const after = await this.present(image);
      if (!after) throw new Error('the runtime does not list the image after pulling it');
      this.lastFailure.delete(key);
      this.backoff.reset(key);
      event('Normal', 'Pulled', `Successfully pulled image "${image}" in ${((this.now() - started) / 1000).toFixed(3)}s`);
      return { ok: true, imageRef: after.ref, user: after.user };
    } catch (err) {
      const message = `Failed to pull image "${image}": ${grpcDetails(err)}`;
      this.lastFailure.set(key, this.now());
      this.backoff.next(key, this.now());
      event('Warning', 'Failed', message);
      return { ok: false, reason: 'ErrImagePull', message };
    }
  }

  private readonly lastFailure = new Map<string, number>();

  /**
   * As the kubelet pulls: anonymously when no credential matches the image,
   * else with each matching one in turn until one works (the errors of all
   * of them when none does).
   */
  private async pullWith(image: string, sandbox: PodSandboxConfig, credentials: PullCredential[]): Promise<string> {
    if (credentials.length === 0) return this.pull(image, sandbox, undefined);
    const errors: unknown[] = [];
    for (const c of credentials) {
      try {
        return await this.pull(image, sandbox, c);
      } catch (err) {
        errors.push(err);
      }
    }
    if (errors.length === 1) throw errors[0];
    throw new Error(`[${errors.map((e) => grpcDetails(e)).join(', ')}]`);
  }

  /** Pulls of one image with the same credential (or none) are shared; another pod's credential is its own pull. */
  private pull(image: string, sandbox: PodSandboxConfig, cred: PullCredential | undefined): Promise<string> {
    const key = cred ? `${image}\0${createHash('sha256').update(`${cred.username}\0${cred.password}`).digest('hex')}` : image;
    let p = this.inflight.get(key);
    if (!p) {
      const auth = cred ? { auth: { username: cred.username, password: cred.password } } : {};
      p = this.cri.images
        .pullImage({ image: { image }, sandboxConfig: sandbox, ...auth }, PULL_TIMEOUT_MS)
        .then((r) => r.imageRef)
        .finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  forgetPod(uid: string): void {
    this.backoff.forget(`${uid}/`);
    for (const k of this.lastFailure.keys()) if (k.startsWith(`${uid}/`)) this.lastFailure.delete(k);
  }
}

/** A gRPC error's details without the "2 UNKNOWN:" prefix grpc-js puts in the message. */
export function grpcDetails(err: unknown): string {
  const d = (err as { details?: unknown } | null)?.details;
  return typeof d === 'string' && d ? d : errorMessage(err);
}
