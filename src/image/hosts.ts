/**
 * Registry endpoints for a registry host, from containerd's
 * `certs.d/<host>/hosts.toml` layout. Without a config directory or file, the
 * defaults apply: https to the host itself (docker.io → registry-1.docker.io),
 * plain http for loopback registries as containerd's CRI plugin does.
 */
import fs from 'node:fs/promises';
import { isIP } from 'node:net';
import path from 'node:path';
import { invalidArgument, isErrno, wrap } from '../errors.js';

export type Capability = 'pull' | 'resolve' | 'push';

export interface RegistryEndpoint {
  /** Base URL up to and including the API root, e.g. `https://host/v2`. */
  apiRoot: string;
  /** host[:port], for logging and credentials. */
  host: string;
  capabilities: Capability[];
  /** PEM contents of extra CAs to trust. */
  ca: string[];
  skipVerify: boolean;
  headers: Record<string, string[]>;
  /** True for mirrors (a `[host]` entry): requests carry `?ns=<registry>`. */
  mirror: boolean;
}

/**
 * True when `host` (with or without a port) names this machine: `localhost`,
 * an IPv4 address in 127.0.0.0/8 or `::1`. Parsed as an address, never
 * matched by prefix: `127.evil.example.com` is a remote name.
 */
export function isLoopbackHost(host: string): boolean {
  let h = host.trim().toLowerCase();
  const bracketed = /^\[([^\]]*)\](?::\d{1,5})?$/.exec(h);
  if (bracketed) h = bracketed[1]!;
  else if (isIP(h) !== 6) h = h.replace(/:\d{1,5}$/, '');
  if (h === 'localhost') return true;
  switch (isIP(h)) {
    case 4:
      return h.split('.')[0] === '127';
    case 6:
      return ipv6IsLoopback(h);
    default:
      return false;
  }
}

function ipv6IsLoopback(h: string): boolean {
  // ::1 in any spelling (0:0:0:0:0:0:0:1, ::0001); IPv4-mapped ::ffff:127.x.y.z too.
  const mapped = /^(?:0{0,4}:){0,5}:?ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h) ?? /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(h);
  if (mapped) return isIP(mapped[1]!) === 4 && mapped[1]!.split('.')[0] === '127';
  const [head = '', tail] = h.split('::');
  const groups = (s: string) => (s === '' ? [] : s.split(':'));
  const parts = tail === undefined ? groups(head) : [...groups(head), ...Array(8 - groups(head).length - groups(tail).length).fill('0'), ...groups(tail)];
  if (parts.length !== 8 || parts.some((p) => !/^[0-9a-f]{1,4}$/.test(p))) return false;
  return parts.slice(0, 7).every((p) => parseInt(p, 16) === 0) && parseInt(parts[7]!, 16) === 1;
}

export function defaultServer(registry: string): string {
  if (registry === 'docker.io') return 'https://registry-1.docker.io';
  return `${isLoopbackHost(registry) ? 'http' : 'https'}://${registry}`;
}

function candidateDirs(registry: string): string[] {
  const out: string[] = [];
  const m = /^(.*):(\d+)$/.exec(registry);
  if (m) out.push(`${m[1]}_${m[2]}_`);
  out.push(registry, '_default');
  return out;
}

async function readIfExists(file: string): Promise<string | undefined> {
  try {
    return await fs.readFile(file, 'utf8');
  } catch (err) {
    if (isErrno(err, 'ENOENT') || isErrno(err, 'ENOTDIR')) return undefined;
    throw err;
  }
}

function stringList(v: unknown, what: string): string[] {
  if (v === undefined) return [];
  if (typeof v === 'string') return [v];
  if (Array.isArray(v) && v.every((x) => typeof x === 'string')) return v as string[];
  throw invalidArgument(`${what} must be a string or an array of strings`);
}

async function endpointFrom(
  url: string,
  table: Record<string, unknown>,
  configDir: string,
  mirror: boolean,
): Promise<RegistryEndpoint> {
  let parsed: URL;
  try {
    parsed = new URL(url.includes('://') ? url : `https://${url}`);
  } catch {
    throw invalidArgument(`invalid registry URL "${url}"`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
    throw invalidArgument(`registry URL "${url}" must be http or https`);
  }
  const caps = stringList(table.capabilities, 'capabilities');
  const capabilities = (caps.length ? caps : ['pull', 'resolve', 'push']) as Capability[];
  const ca: string[] = [];
  for (const file of stringList(table.ca, 'ca')) {
    const full = path.isAbsolute(file) ? file : path.join(configDir, file);
    ca.push(await fs.readFile(full, 'utf8'));
  }
  const headers: Record<string, string[]> = {};
  const hdr = table.header;
  if (hdr && typeof hdr === 'object') {
    for (const [k, v] of Object.entries(hdr)) headers[k.toLowerCase()] = stringList(v, `header ${k}`);
  }
  let p = parsed.pathname.replace(/\/+$/, '');
  if (table.override_path !== true && !p.endsWith('/v2')) p += '/v2';
  return {
    apiRoot: `${parsed.protocol}//${parsed.host}${p}`,
    host: parsed.host,
    capabilities,
    ca,
    skipVerify: table.skip_verify === true,
    headers,
    mirror,
  };
}

/** Endpoints to try for `registry`, in order: mirrors first, then the server. */
export async function resolveEndpoints(configRoot: string | undefined, registry: string): Promise<RegistryEndpoint[]> {
  let text: string | undefined;
  let dir = '';
  if (configRoot) {
    for (const d of candidateDirs(registry)) {
      dir = path.join(configRoot, d);
      text = await readIfExists(path.join(dir, 'hosts.toml'));
      if (text !== undefined) break;
    }
  }
  if (text === undefined) return [await endpointFrom(defaultServer(registry), {}, '', false)];
  // The TOML parser is loaded for the first hosts.toml read: a node with none never loads it.
  const { parse: parseToml } = await import('smol-toml');
  let doc: Record<string, unknown>;
  try {
    doc = parseToml(text) as Record<string, unknown>;
  } catch (err) {
    throw wrap(err, `invalid ${path.join(dir, 'hosts.toml')}`, 'InvalidArgument');
  }
  const out: RegistryEndpoint[] = [];
  const hosts = (doc.host ?? {}) as Record<string, Record<string, unknown>>;
  for (const [url, table] of Object.entries(hosts)) out.push(await endpointFrom(url, table, dir, true));
  const server = typeof doc.server === 'string' ? doc.server : defaultServer(registry);
  out.push(await endpointFrom(server, doc, dir, false));
  return out;
}
