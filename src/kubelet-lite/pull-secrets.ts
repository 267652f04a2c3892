/**
 * A pod's image pull secrets turned into the credentials for one image, as
 * the kubelet's credential keyring does it: the pod's `imagePullSecrets`
 * (or, when it names none, its ServiceAccount's, as the ServiceAccount
 * admission would have copied them), read from `kubernetes.io/dockerconfigjson`
 * and `kubernetes.io/dockercfg` Secrets, and matched against the image's
 * registry host, port and path, most specific first.
 */
import type { Pod, Secret } from 'kubernetes-types/core/v1.js';
import { secretData } from './env.js';
import type { ObjectLookup } from './model.js';

/** What goes to the runtime as CRI AuthConfig. */
export interface PullCredential {
  username: string;
  password: string;
  /** The config key it came from (for messages; never the secret itself). */
  key: string;
}

export interface PullSecretProblem {
  reason: 'FailedToRetrieveImagePullSecret';
  message: string;
}

/** A config with more entries than this is cut (a Secret is bounded by the API, but a credential is a pull each). */
export const MAX_CREDENTIALS_PER_IMAGE = 8;

const DOCKER_HOSTS = new Set(['docker.io', 'index.docker.io', 'registry-1.docker.io']);

interface Location {
  host: string;
  port: string;
  path: string;
}

/** A registry location without scheme; docker.io's aliases are one host. */
function parseLocation(raw: string): Location | undefined {
  let s = raw.trim();
  const scheme = /^[a-z][a-z0-9+.-]*:\/\//i.exec(s);
  if (scheme) s = s.slice(scheme[0].length);
  const slash = s.indexOf('/');
  const authority = slash < 0 ? s : s.slice(0, slash);
  let path = slash < 0 ? '' : s.slice(slash + 1);
  if (!authority || authority.includes('@')) return undefined;
  const m = /^([^:]+)(?::(\d{1,5}))?$/.exec(authority);
  if (!m) return undefined;
  let host = m[1]!.toLowerCase();
  if (DOCKER_HOSTS.has(host)) {
    host = 'docker.io';
    // `https://index.docker.io/v1/` is the old way of naming Docker Hub, not a path under it.
    if (path === 'v1' || path === 'v1/') path = '';
  }
  return { host, port: m[2] ?? '', path: path.replace(/\/+$/, '') };
}

/** The image's registry location: no registry part means Docker Hub, as the runtime reads it. */
export function imageLocation(image: string): Location | undefined {
  const noDigest = image.split('@')[0]!;
  const first = noDigest.indexOf('/');
  const head = first < 0 ? '' : noDigest.slice(0, first);
  const isRegistry = head !== '' && (head.includes('.') || head.includes(':') || head === 'localhost');
  let repo = isRegistry ? noDigest.slice(first + 1) : noDigest;
  // The tag belongs to the last path element only (a port's colon is in the host).
  const lastSlash = repo.lastIndexOf('/');
  const colon = repo.indexOf(':', lastSlash + 1);
  if (colon >= 0) repo = repo.slice(0, colon);
  if (!isRegistry) return { host: 'docker.io', port: '', path: repo.includes('/') ? repo : `library/${repo}` };
  const loc = parseLocation(`${head}/${repo}`);
  return loc;
}

/** Host labels may be globs (`*.example.com`), one label per `*`, as the keyring allows. */
function hostMatches(pattern: string, host: string): boolean {
  const p = pattern.split('.');
  const h = host.split('.');
  if (p.length !== h.length) return false;
  return p.every((label, i) => {
    if (!label.includes('*')) return label === h[i];
    const re = new RegExp(`^${label.split('*').map((x) => x.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('[^.]*')}$`);
    return re.test(h[i]!);
  });
}

/** Whether a config key covers the image: the same host and port, and the key's path a prefix of the image's (whole segments). */
function keyMatches(key: Location, image: Location): boolean {
  if (!hostMatches(key.host, image.host) || key.port !== image.port) return false;
  if (!key.path) return true;
  return image.path === key.path || image.path.startsWith(`${key.path}/`);
}

interface Entry {
  key: string;
  loc: Location;
  username: string;
  password: string;
}

/** One config's entries, or why it cannot be read. */
function configEntries(secret: Secret): { entries: Entry[] } | { error: string } {
  const type = secret.type ?? 'Opaque';
  const data = secretData(secret);
  let field: string;
  if (type === 'kubernetes.io/dockerconfigjson') field = '.dockerconfigjson';
  else if (type === 'kubernetes.io/dockercfg') field = '.dockercfg';
  else return { error: `is of type ${type}, not kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg` };
  const raw = data.get(field);
  if (raw === undefined) return { error: `has no ${field} key` };
  let parsed: unknown;
  try {
    parsed = JSON.parse(raw.toString('utf8'));
  } catch (err) {
    return { error: `has a ${field} that is not JSON (${(err as Error).message})` };
  }
  if (type === 'kubernetes.io/dockerconfigjson') parsed = isRecord(parsed) ? parsed.auths : undefined;
  if (!isRecord(parsed)) return { error: `has a ${field} without ${type === 'kubernetes.io/dockerconfigjson' ? 'an "auths" object' : 'an object of registries'}` };
  const entries: Entry[] = [];
  const bad: string[] = [];
  for (const [key, v] of Object.entries(parsed)) {
    const loc = parseLocation(key);
    if (!loc || !isRecord(v)) {
      bad.push(key);
      continue;
    }
    let username = typeof v.username === 'string' ? v.username : '';
    let password = typeof v.password === 'string' ? v.password : '';
    if (typeof v.auth === 'string' && v.auth !== '') {
      // As the kubelet reads it: `auth` (base64 of user:password) wins over the separate fields.
      const decoded = Buffer.from(v.auth, 'base64').toString('utf8');
      const colon = decoded.indexOf(':');
      if (colon < 0) {
        bad.push(key);
        continue;
      }
      username = decoded.slice(0, colon);
      password = decoded.slice(colon + 1);
    }
    if (!username && !password) {
      bad.push(key);
      continue;
    }
    entries.push({ key, loc, username, password });
  }
  if (entries.length === 0 && bad.length > 0) return { error: `has no usable credentials (entries ${bad.slice(0, 3).map((b) => JSON.stringify(b.slice(0, 100))).join(', ')}${bad.length > 3 ? ', ...' : ''} have no valid registry or auth)` };
  return { entries };
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The names of the pod's pull secrets: its own, else its ServiceAccount's. */
export function pullSecretNames(pod: Pod, objects: ObjectLookup): string[] {
  const own = (pod.spec?.imagePullSecrets ?? []).map((r) => r?.name ?? '').filter((n) => n !== '');
  if (own.length > 0 || (pod.spec?.imagePullSecrets ?? []).length > 0) return [...new Set(own)];
  const ns = pod.metadata?.namespace ?? 'default';
  const account = pod.spec?.serviceAccountName || pod.spec?.serviceAccount || 'default';
  const sa = objects.get('ServiceAccount', ns, account);
  if (!sa || sa.apiVersion !== 'v1') return [];
  const refs = (sa.object as { imagePullSecrets?: unknown }).imagePullSecrets;
  if (!Array.isArray(refs)) return [];
  const names = refs.map((r) => (isRecord(r) && typeof r.name === 'string' ? r.name : '')).filter((n) => n !== '');
  return [...new Set(names)];
}

/**
 * The credentials for `image` from the pod's pull secrets, most specific key
 * first (the keyring's order), and what could not be read. An empty list
 * means the pull goes anonymous.
 */
export function credentialsFor(pod: Pod, image: string, objects: ObjectLookup): { credentials: PullCredential[]; problems: PullSecretProblem[] } {
  const ns = pod.metadata?.namespace ?? 'default';
  const names = pullSecretNames(pod, objects);
  const problems: PullSecretProblem[] = [];
  const missing: string[] = [];
  const entries: Entry[] = [];
  for (const name of names) {
    const s = objects.secret(ns, name);
    if (!s) {
      missing.push(`${ns}/${name}`);
      continue;
    }
    const got = configEntries(s);
    if ('error' in got) problems.push({ reason: 'FailedToRetrieveImagePullSecret', message: `Image pull secret ${ns}/${name} ${got.error}; it is not used.` });
    else entries.push(...got.entries);
  }
  if (missing.length > 0) {
    problems.unshift({ reason: 'FailedToRetrieveImagePullSecret', message: `Unable to retrieve some image pull secrets (${missing.join(', ')}); attempting to pull the image may not succeed.` });
  }
  const loc = imageLocation(image);
  if (!loc) return { credentials: [], problems };
  const specificity = (e: Entry) => e.loc.host.length + e.loc.port.length + e.loc.path.length;
  const matching = entries.filter((e) => keyMatches(e.loc, loc)).sort((a, b) => specificity(b) - specificity(a));
  const seen = new Set<string>();
  const credentials: PullCredential[] = [];
  for (const e of matching) {
    const id = `${e.username}\0${e.password}`;
    if (seen.has(id)) continue;
    seen.add(id);
    credentials.push({ username: e.username, password: e.password, key: e.key });
    if (credentials.length >= MAX_CREDENTIALS_PER_IMAGE) break;
  }
  return { credentials, problems };
}
