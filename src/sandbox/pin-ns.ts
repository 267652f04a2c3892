/**
 * A pod's network, IPC and UTS namespaces, made by the daemon itself with no
 * helper process (an `unshare` running a shell running `ip` cost 5-13 ms of
 * each RunPodSandbox here, before the network could be set up). These three
 * kinds belong to a thread, not to the process, so the calling thread moves
 * into new ones, names the pod and sets its loopback up, pins each with a
 * bind mount of /proc/thread-self/ns/<kind>, and moves back. It all runs
 * synchronously on the calling (JavaScript) thread: nothing else of the
 * daemon runs there meanwhile, and no child is spawned from it while it is
 * away. A thread that cannot move back would make the daemon's later
 * sockets and children the pod's: the daemon then stops at once.
 */
import fs from 'node:fs';
import { CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWUTS, loopbackUp, mount, sethostname, setns, unshare } from '../sys/libc.js';

export type PinnedKind = 'net' | 'ipc' | 'uts';

const FLAGS: Record<PinnedKind, number> = { net: CLONE_NEWNET, ipc: CLONE_NEWIPC, uts: CLONE_NEWUTS };
const MS_BIND = 4096;

/** The calling thread's own namespaces, opened once before it first leaves them. */
let home: Record<PinnedKind, number> | undefined;

/**
 * Makes a namespace of each kind in `pins` and binds it onto that file (which
 * must exist). With a UTS namespace, `hostname` names it; with a network
 * namespace, its loopback is up. Nothing is left mounted when it throws
 * before the mounts; the caller unmounts the pins it was given either way.
 */
export function pinNamespaces(pins: Partial<Record<PinnedKind, string>>, hostname: string): void {
  const kinds = (Object.keys(pins) as PinnedKind[]).filter((k) => pins[k]);
  if (!kinds.length) return;
  home ??= {
    net: fs.openSync('/proc/thread-self/ns/net', 'r'),
    ipc: fs.openSync('/proc/thread-self/ns/ipc', 'r'),
    uts: fs.openSync('/proc/thread-self/ns/uts', 'r'),
  };
  unshare(kinds.reduce((f, k) => f | FLAGS[k], 0));
  try {
    if (pins.uts) sethostname(hostname);
    if (pins.net) loopbackUp();
    for (const k of kinds) mount(`/proc/thread-self/ns/${k}`, pins[k]!, '', MS_BIND, '');
  } finally {
    for (const k of kinds) {
      try {
        setns(home[k], FLAGS[k]);
      } catch (err) {
        fs.writeSync(2, `skiff: cannot return to the daemon's own ${k} namespace after making a pod's (${(err as Error).message}): stopping\n`);
        process.abort();
      }
    }
  }
}
