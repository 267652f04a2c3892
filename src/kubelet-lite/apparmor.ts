/**
 * The kubelet's AppArmor admission: a pod that asks for any profile other
 * than Unconfined (pod or container `securityContext.appArmorProfile`, or
 * the deprecated `container.apparmor.security.beta.kubernetes.io/<c>`
 * annotations) is not started on a host without AppArmor. It stays Pending
 * with reason AppArmor and its containers Blocked, as the kubelet's soft
 * admission leaves it; it never runs without the confinement it asked for.
 */
import fsp from 'node:fs/promises';
import path from 'node:path';
import type { Pod } from 'kubernetes-types/core/v1.js';
import type { PodValidation } from './model.js';

const ANNOTATION_PREFIX = 'container.apparmor.security.beta.kubernetes.io/';

/** Whether the pod asks for AppArmor confinement of any kind. */
export function appArmorRequired(pod: Pod): boolean {
  const spec = pod.spec;
  if (spec?.securityContext?.appArmorProfile && spec.securityContext.appArmorProfile.type !== 'Unconfined') return true;
  for (const c of [...(spec?.initContainers ?? []), ...(spec?.containers ?? []), ...(spec?.ephemeralContainers ?? [])]) {
    const p = c.securityContext?.appArmorProfile;
    if (p && p.type !== 'Unconfined') return true;
  }
  for (const [k, v] of Object.entries(pod.metadata?.annotations ?? {})) {
    if (k.startsWith(ANNOTATION_PREFIX) && v !== 'unconfined') return true;
  }
  return false;
}

/**
 * Why this host cannot enforce AppArmor, or undefined when it can: the
 * module's `enabled` parameter says Y and securityfs shows its interface.
 * `sys` is the sysfs root (injected by tests).
 */
export async function appArmorHostError(sys = '/sys'): Promise<string | undefined> {
  const enabled = await fsp.readFile(path.join(sys, 'module', 'apparmor', 'parameters', 'enabled'), 'utf8').catch(() => '');
  if (!enabled.trim().startsWith('Y')) return 'AppArmor is not enabled on the host';
  const fs = await fsp.stat(path.join(sys, 'kernel', 'security', 'apparmor')).catch(() => undefined);
  if (!fs?.isDirectory()) return 'AppArmor is enabled but securityfs is not mounted at /sys/kernel/security';
  return undefined;
}

/** A valid pod that asks for AppArmor on a host without it becomes a blocked one. */
export function admitAppArmor(v: PodValidation, hostError: string | undefined): PodValidation {
  if (!v.ok || hostError === undefined || !appArmorRequired(v.pod)) return v;
  return { ok: false, reasons: [`Cannot enforce AppArmor: ${hostError}`], reason: 'AppArmor', blocked: v.pod };
}
