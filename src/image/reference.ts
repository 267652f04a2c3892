/**
 * Image references as the kubelet sends them, normalized the way the docker
 * reference library (and so containerd) does: `busybox` is
 * `docker.io/library/busybox:latest`.
 */
import { invalidArgument } from '../errors.js';

export interface Reference {
  /** Registry host, with port if any: `docker.io`, `127.0.0.1:5000`. */
  domain: string;
  /** Repository path inside the registry: `library/busybox`. */
  path: string;
  tag?: string;
  digest?: string;
}

const DEFAULT_DOMAIN = 'docker.io';
const component = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const tagRe = /^[\w][\w.-]{0,127}$/;
const digestRe = /^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$/;
const sha256Re = /^sha256:[a-f0-9]{64}$/;
const domainRe = /^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?$|^\[[a-fA-F0-9:]+\](?::[0-9]+)?$/;

export function isImageId(s: string): boolean {
  return /^(sha256:)?[a-f0-9]{64}$/.test(s);
}

export function parseReference(input: string): Reference {
  const s = input.trim();
  if (s === '') throw invalidArgument('image reference is empty');
  if (s.length > 4096) throw invalidArgument('image reference is too long');
  let rest = s;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!digestRe.test(digest)) throw invalidArgument(`invalid digest "${digest}" in image reference "${s}"`);
    if (digest.startsWith('sha256:') && !sha256Re.test(digest)) {
      throw invalidArgument(`invalid sha256 digest "${digest}" in image reference "${s}"`);
    }
  }
  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!tagRe.test(tag)) throw invalidArgument(`invalid tag "${tag}" in image reference "${s}"`);
  }
  if (rest === '') throw invalidArgument(`image reference "${s}" has no repository name`);

  let domain = DEFAULT_DOMAIN;
  let path = rest;
  const slash = rest.indexOf('/');
  if (slash >= 0) {
    const first = rest.slice(0, slash);
    if (first.includes('.') || first.includes(':') || first === 'localhost' || first !== first.toLowerCase()) {
      domain = first;
      path = rest.slice(slash + 1);
    }
  }
  if (domain === 'index.docker.io') domain = DEFAULT_DOMAIN;
  if (!domainRe.test(domain)) throw invalidArgument(`invalid registry host "${domain}" in image reference "${s}"`);
  if (domain === DEFAULT_DOMAIN && !path.includes('/')) path = `library/${path}`;
  for (const part of path.split('/')) {
    if (!component.test(part)) {
      throw invalidArgument(`invalid repository name "${path}" in image reference "${s}" (must be lowercase letters, digits and separators)`);
    }
  }
  if (domain.length + 1 + path.length > 255) throw invalidArgument(`repository name in "${s}" is longer than 255 characters`);
  if (!tag && !digest) tag = 'latest';
  return { domain, path, tag, digest };
}

/** `docker.io/library/busybox` */
export function repository(ref: Reference): string {
  return `${ref.domain}/${ref.path}`;
}

/** The normalized full string: `repo:tag`, `repo@digest` or `repo:tag@digest`. */
export function formatReference(ref: Reference): string {
  return `${repository(ref)}${ref.tag ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
}

/** What the image is tagged as in the store (`repo:tag`), if it has a tag. */
export function tagName(ref: Reference): string | undefined {
  return ref.tag ? `${repository(ref)}:${ref.tag}` : undefined;
}
