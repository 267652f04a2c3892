/**
 * What a pod's `userns_options` may ask for, checked before anything is made.
 *
 * Supported: NODE (or no options: the host's user namespace, as before) and
 * POD with one uid range and one gid range that map the pod's root (container
 * id 0) to unprivileged host ids — the shape the kubelet sends (a block of
 * 65536 ids at a multiple of 65536). Everything else is refused rather than
 * half-applied: CONTAINER and TARGET modes (the kubelet never asks for them),
 * POD without mappings (skiff does not pick host ids itself), several ranges,
 * ranges that do not start at container id 0, and ranges that would map the
 * host's root or its other users and groups (ids below 65536), or wrap past
 * the 32-bit id space.
 */
import { invalidArgument } from '../errors.js';
import type { UserNamespace__Output } from '../gen/runtime/v1/UserNamespace.js';
import type { IdMap } from '../sys/idmap.js';

export interface PodUserns {
  uids: IdMap[];
  gids: IdMap[];
}

/**
 * Host ids below this are the host's own: system users and groups (daemon, disk, shadow, nobody)
 * and login users. A pod mapped onto them would be, on the host, whoever has those ids (a process
 * running as one could ptrace the pod's, a socket would take the pod for it). The kubelet keeps
 * them for the host and gives pods blocks of 65536 above them.
 */
const HOST_RESERVED = 65536;

/** The largest valid id is 2^32 - 2: (uid_t)-1 means "no id". */
const MAX_ID = 0xfffffffe;

function oneRange(kind: 'uid' | 'gid', maps: UserNamespace__Output['uids']): IdMap {
  if (maps.length === 0) throw invalidArgument(`user namespace mode POD needs a ${kind} mapping (skiff does not choose host ids itself)`);
  if (maps.length > 1) throw invalidArgument(`user namespace: ${maps.length} ${kind} mappings given; only one range is supported`);
  const m = maps[0]!;
  const r = { containerId: Number(m.containerId), hostId: Number(m.hostId), length: Number(m.length) };
  if (r.containerId !== 0) throw invalidArgument(`user namespace: the ${kind} mapping must start at container id 0 (the pod's root), not ${r.containerId}`);
  if (r.length < 1) throw invalidArgument(`user namespace: the ${kind} mapping has length ${r.length}`);
  if (r.hostId === 0) throw invalidArgument(`user namespace: the ${kind} mapping would map the host's root (host id 0) into the pod`);
  if (r.hostId < HOST_RESERVED) {
    throw invalidArgument(`user namespace: the ${kind} mapping's host ids start at ${r.hostId}, among the host's own users and groups (below ${HOST_RESERVED}, which the kubelet never gives a pod): the pod's processes would be those host ${kind}s`);
  }
  if (r.hostId + r.length - 1 > MAX_ID) throw invalidArgument(`user namespace: the ${kind} mapping ${r.hostId}+${r.length} goes past the largest id ${MAX_ID}`);
  return r;
}

/**
 * The pod's user namespace, or undefined for the host's. `hostNamespaces`
 * names the namespaces the pod shares with the host: none may be shared with
 * a user namespace (the kubelet refuses these combinations too).
 */
export function podUserns(opts: UserNamespace__Output | null | undefined, hostNamespaces: { network: boolean; pid: boolean; ipc: boolean }): PodUserns | undefined {
  if (!opts) return undefined;
  const mode = String(opts.mode ?? 'POD');
  if (mode === 'NODE') {
    if (opts.uids.length || opts.gids.length) throw invalidArgument('user namespace mode NODE takes no uid/gid mappings');
    return undefined;
  }
  if (mode !== 'POD') throw invalidArgument(`user namespace mode ${mode} is not supported (only NODE and POD are)`);
  const uids = [oneRange('uid', opts.uids)];
  const gids = [oneRange('gid', opts.gids)];
  const shared = (['network', 'pid', 'ipc'] as const).filter((k) => hostNamespaces[k]);
  if (shared.length) throw invalidArgument(`a pod with a user namespace cannot share the host's ${shared.join(', ')} namespace${shared.length > 1 ? 's' : ''}`);
  return { uids, gids };
}

/**
 * A container's copy of the options must say what its pod says: its
 * processes join the pod's user namespace, never another.
 */
export function checkContainerUserns(opts: UserNamespace__Output | null | undefined, pod: PodUserns | undefined): void {
  if (!opts) return;
  const mode = String(opts.mode ?? 'POD');
  const wanted = mode === 'NODE' && !opts.uids.length && !opts.gids.length ? undefined : podUserns(opts, { network: false, pid: false, ipc: false });
  const key = (l: IdMap[] | undefined) => (l ?? []).map((m) => `${m.containerId}:${m.hostId}:${m.length}`).join(',');
  const same = (a: IdMap[] | undefined, b: IdMap[] | undefined) => key(a) === key(b);
  if (!wanted !== !pod || !same(wanted?.uids, pod?.uids) || !same(wanted?.gids, pod?.gids)) {
    throw invalidArgument(`the container's user namespace options (mode ${mode}) differ from its pod's (${pod ? 'POD' : 'NODE'}): a container runs in its pod's user namespace`);
  }
}

/** The host id of an id inside the pod (ids outside the range have none: -1). */
export function hostIdOf(maps: IdMap[], id: number): number {
  for (const m of maps) if (id >= m.containerId && id < m.containerId + m.length) return m.hostId + (id - m.containerId);
  return -1;
}

/** Which of two pods' ranges share host ids ('uid' or 'gid'), if any. */
export function sharedHostIds(a: PodUserns, b: PodUserns): 'uid' | 'gid' | undefined {
  const meet = (x: IdMap[], y: IdMap[]) => x.some((m) => y.some((n) => m.hostId < n.hostId + n.length && n.hostId < m.hostId + m.length));
  if (meet(a.uids, b.uids)) return 'uid';
  if (meet(a.gids, b.gids)) return 'gid';
  return undefined;
}
