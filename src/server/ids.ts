/**
 * What the CRI door checks about the ids and names a client sends, before a
 * service looks anything up: an id that cannot be one (a path, a NUL, more
 * than 64 characters) and a name that would be unsafe in a path are
 * InvalidArgument, and an id of the other kind (a pod's id given as a
 * container's) says so instead of a bare NotFound.
 */
import net from 'node:net';
import { invalidArgument } from '../errors.js';

/** Shown in an error: quoted and escaped (NUL and control characters visible), and cut short. */
export function shown(s: string): string {
  const j = JSON.stringify(s.length > 80 ? `${s.slice(0, 80)}…` : s);
  return j;
}

/** A full id or a unique prefix of one: 1-64 characters, none of them a path separator, NUL or control. */
export function checkId(id: string, field: string, rpc: string): string {
  if (!id) throw invalidArgument(`${rpc}: ${field} is required`);
  // eslint-disable-next-line no-control-regex
  if (id.length > 64 || /[/\\\x00-\x1f\x7f\s]/.test(id) || id.includes('..')) {
    throw invalidArgument(`${rpc}: ${field} ${shown(id)} is not an id (ids are up to 64 characters, with no '/', '..', NUL, control characters or spaces)`);
  }
  return id;
}

/**
 * A metadata name, namespace or uid: it becomes part of file names and log
 * paths. A pod's also reach CNI plugins in CNI_ARGS (`K=V;K=V`, which has no
 * escaping), where a ';' or '=' would add arguments of the caller's choosing
 * (`IP=...` picks the pod's address): `cniArg` refuses those too.
 */
export function checkName(value: string, field: string, rpc: string, opts: { required?: boolean; cniArg?: boolean } = {}): void {
  if (!value) {
    if (opts.required) throw invalidArgument(`${rpc}: ${field} is required`);
    return;
  }
  // eslint-disable-next-line no-control-regex
  if (value.length > 253 || /[/\\\x00-\x1f\x7f]/.test(value) || value.includes('..')) {
    throw invalidArgument(`${rpc}: ${field} ${shown(value)} is not allowed (at most 253 characters, with no '/', '..', NUL or control characters)`);
  }
  if (opts.cniArg && /[;=]/.test(value)) throw invalidArgument(`${rpc}: ${field} ${shown(value)} is not allowed (no ';' or '=': it is passed to CNI plugins in CNI_ARGS)`);
}

/** A log path relative to the pod's log directory that stays inside it. */
export function checkLogPath(value: string, rpc: string): void {
  if (!value) return;
  // eslint-disable-next-line no-control-regex
  if (value.startsWith('/') || value.split('/').includes('..') || /[\x00-\x1f\x7f]/.test(value) || value.length > 4096) {
    throw invalidArgument(`${rpc}: log_path ${shown(value)} must be a relative path inside the pod's log directory`);
  }
}

/** Fails when `id` names nothing of the kind asked for but something of the other kind. */
export function notTheOtherKind(id: string, found: (id: string) => unknown, other: (id: string) => unknown, asked: string, actual: string, rpc: string): void {
  if (found(id)) return;
  let isOther = false;
  try {
    isOther = Boolean(other(id));
  } catch {
    // ambiguous among the other kind: not what this call is about
  }
  if (isOther) throw invalidArgument(`${rpc}: ${shown(id)} is the id of a ${actual}, not of a ${asked}`);
}

/** A pod's hostname: what the kernel takes (at most 64 bytes), and nothing that breaks the files it is written to. */
export function checkHostname(value: string, rpc: string): void {
  if (!value) return;
  // eslint-disable-next-line no-control-regex
  if (Buffer.byteLength(value) > 64 || /[\x00-\x20\x7f/]/.test(value)) {
    throw invalidArgument(`${rpc}: hostname ${shown(value)} is not a host name (at most 64 bytes, with no '/', spaces or control characters)`);
  }
}

/** Port mappings: ports in 0-65535 (0 means none) and, when given, a host IP that parses as one. */
export function checkPortMappings(mappings: Array<{ containerPort: number; hostPort: number; hostIp: string }>, rpc: string): void {
  for (const [i, m] of mappings.entries()) {
    for (const [field, port] of [['container_port', m.containerPort], ['host_port', m.hostPort]] as const) {
      if (!Number.isInteger(port) || port < 0 || port > 65535) throw invalidArgument(`${rpc}: port_mappings[${i}].${field} ${port} is not a port (0-65535)`);
    }
    if (m.hostPort > 0 && m.containerPort === 0) throw invalidArgument(`${rpc}: port_mappings[${i}] maps host port ${m.hostPort} to no container port`);
    if (m.hostIp && net.isIP(m.hostIp) === 0) throw invalidArgument(`${rpc}: port_mappings[${i}].host_ip ${shown(m.hostIp)} is not an IP address`);
  }
}
