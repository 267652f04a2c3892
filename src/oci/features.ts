/**
 * What an OCI runtime handler can do, asked of the runtime itself rather than
 * assumed from its name: `<runtime> features` (OCI runtime features document)
 * lists the mount options it understands. A recursive read-only mount needs
 * the `rro` option (runc applies it with mount_setattr(2) and AT_RECURSIVE);
 * a runtime that does not list it — or has no `features` command, as crun 1.8
 * — might pass the option on as mount data and leave submounts writable, so
 * skiff reports the feature off for it and refuses such mounts.
 */
import type { Runner } from '../sys/run.js';

export interface HandlerFeatures {
  recursiveReadOnlyMounts: boolean;
}

export const NO_FEATURES: HandlerFeatures = { recursiveReadOnlyMounts: false };

/** Reads a features document; anything unexpected means "not supported". */
export function featuresFromDocument(text: string): HandlerFeatures {
  try {
    const doc = JSON.parse(text) as { mountOptions?: unknown };
    const opts = Array.isArray(doc.mountOptions) ? doc.mountOptions : [];
    return { recursiveReadOnlyMounts: opts.includes('rro') };
  } catch {
    return { ...NO_FEATURES };
  }
}

/** `<runtime> features`, or undefined when the runtime has no such command. */
export async function featuresDocument(binary: string, runner: Runner): Promise<string | undefined> {
  const r = await runner(binary, ['features'], { timeoutMs: 10_000 }).catch(() => undefined);
  return r && r.code === 0 ? r.stdout : undefined;
}

export async function probeFeatures(binary: string, runner: Runner): Promise<HandlerFeatures> {
  const doc = await featuresDocument(binary, runner);
  return doc === undefined ? { ...NO_FEATURES } : featuresFromDocument(doc);
}

/**
 * Whether a runtime can put a container in a user namespace it is given:
 * its features document lists the `user` namespace. (Idmapping the layers is
 * skiff's part, probed on the kernel separately.)
 */
export function joinsUserNamespaces(text: string): boolean {
  try {
    const doc = JSON.parse(text) as { linux?: { namespaces?: unknown } };
    return Array.isArray(doc.linux?.namespaces) && doc.linux.namespaces.includes('user');
  } catch {
    return false;
  }
}

/** Whether a runtime, by its features document (undefined: it has none), can join a user namespace. */
export function usernsSupport(binary: string, doc: string | undefined): { ok: true } | { ok: false; reason: string } {
  if (doc === undefined) return { ok: false, reason: `${binary} has no features command to say it supports user namespaces` };
  return joinsUserNamespaces(doc) ? { ok: true } : { ok: false, reason: `${binary} does not list the user namespace among its features` };
}

export async function probeUserNamespaces(binary: string, runner: Runner): Promise<{ ok: true } | { ok: false; reason: string }> {
  return usernsSupport(binary, await featuresDocument(binary, runner));
}
