/**
 * Seccomp for containers: the CRI's Localhost profiles (Docker's JSON format,
 * converted to the OCI form), RuntimeDefault, and Unconfined.
 *
 * skiff's default profile denies, with EPERM, the syscalls that let a
 * container reach the host kernel's global state (modules, kexec, reboot,
 * clocks, swap, keyrings, BPF, perf, namespaces and mounts without
 * CAP_SYS_ADMIN — unshare(2), and clone(2) with a namespace flag, as
 * Docker's profile does; clone3(2) gets ENOSYS so libc falls back to clone —
 * and the like) and allows the rest. It is a denylist, and so
 * looser than Docker's allowlist profile.
 */
import fs from 'node:fs/promises';
import { invalidArgument } from '../errors.js';

const DENIED = [
  'acct', 'add_key', 'bpf', 'clock_adjtime', 'clock_settime', 'create_module', 'delete_module', 'finit_module',
  'get_kernel_syms', 'get_mempolicy', 'init_module', 'ioperm', 'iopl', 'kcmp', 'kexec_file_load', 'kexec_load',
  'keyctl', 'lookup_dcookie', 'mbind', 'move_pages', 'name_to_handle_at', 'nfsservctl', 'open_by_handle_at',
  'perf_event_open', 'process_vm_readv', 'process_vm_writev', 'query_module', 'quotactl', 'reboot', 'request_key',
  'set_mempolicy', 'settimeofday', 'stime', 'swapoff', 'swapon', 'sysfs', '_sysctl', 'uselib', 'userfaultfd', 'ustat',
  'vm86', 'vm86old', 'syslog', 'fanotify_init',
];
/** Denied unless the container has CAP_SYS_ADMIN. */
const NEED_SYS_ADMIN = ['mount', 'umount', 'umount2', 'pivot_root', 'setns', 'unshare', 'fsopen', 'fsconfig', 'fsmount', 'fspick', 'move_mount', 'open_tree', 'sethostname', 'setdomainname'];

const ARCHES = ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32', 'SCMP_ARCH_AARCH64', 'SCMP_ARCH_ARM'];

/** clone(2) flags that make new namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET). */
export const NAMESPACE_CLONE_FLAGS = {
  CLONE_NEWNS: 0x00020000,
  CLONE_NEWCGROUP: 0x02000000,
  CLONE_NEWUTS: 0x04000000,
  CLONE_NEWIPC: 0x08000000,
  CLONE_NEWUSER: 0x10000000,
  CLONE_NEWPID: 0x20000000,
  CLONE_NEWNET: 0x40000000,
};
const EPERM = 1;
const ENOSYS = 38;

export function defaultProfile(caps: string[]): Record<string, unknown> {
  const sysAdmin = caps.includes('CAP_SYS_ADMIN');
  const syscalls: Array<Record<string, unknown>> = [{ names: sysAdmin ? DENIED : [...DENIED, ...NEED_SYS_ADMIN], action: 'SCMP_ACT_ERRNO', errnoRet: EPERM }];
  if (!sysAdmin) {
    // New namespaces through clone too (a new user namespace needs no capability at all).
    // Each flag is its own rule, since rules on one syscall are alternatives: refused when
    // (flags & F) == F for any one of them.
    for (const flag of Object.values(NAMESPACE_CLONE_FLAGS)) {
      syscalls.push({ names: ['clone'], action: 'SCMP_ACT_ERRNO', errnoRet: EPERM, args: [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }] });
    }
    // clone3 passes its flags in memory, where seccomp cannot look: ENOSYS makes libc fall back to clone.
    syscalls.push({ names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS });
  }
  return { defaultAction: 'SCMP_ACT_ALLOW', architectures: ARCHES, syscalls };
}

/** Docker's profile format → the OCI runtime spec's `linux.seccomp`. */
export function toOciSeccomp(profile: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = { defaultAction: profile.defaultAction };
  if (profile.defaultErrnoRet !== undefined) out.defaultErrnoRet = profile.defaultErrnoRet;
  const archMap = profile.archMap as Array<{ architecture: string; subArchitectures?: string[] }> | undefined;
  if (Array.isArray(profile.architectures)) out.architectures = profile.architectures;
  else if (archMap) out.architectures = archMap.flatMap((a) => [a.architecture, ...(a.subArchitectures ?? [])]);
  const syscalls = (profile.syscalls as Array<Record<string, unknown>> | undefined) ?? [];
  out.syscalls = syscalls.map((s) => {
    const { name, names, includes: _i, excludes: _e, comment: _c, ...rest } = s;
    return { names: (names as string[] | undefined) ?? (name ? [name as string] : []), ...rest };
  });
  if (typeof profile.defaultAction !== 'string') throw invalidArgument('seccomp profile has no defaultAction');
  return out;
}

export type SeccompChoice = { kind: 'unconfined' } | { kind: 'default' } | { kind: 'localhost'; path: string };

/**
 * What the request asks for: the `seccomp` field (SecurityProfile) wins over
 * the older `seccomp_profile_path` string ("runtime/default",
 * "docker/default", "unconfined", "localhost/<path>").
 */
export function seccompChoice(profile: { profileType?: string | number; localhostRef?: string } | null | undefined, legacyPath: string): SeccompChoice {
  if (profile) {
    const t = String(profile.profileType);
    if (t === 'RuntimeDefault' || t === '0') return { kind: 'default' };
    if (t === 'Unconfined' || t === '1') return { kind: 'unconfined' };
    if (t === 'Localhost' || t === '2') {
      if (!profile.localhostRef?.startsWith('/')) throw invalidArgument(`seccomp localhost profile "${profile.localhostRef}" must be an absolute path`);
      return { kind: 'localhost', path: profile.localhostRef };
    }
  }
  const p = legacyPath;
  if (p === '' || p === 'unconfined') return { kind: 'unconfined' };
  if (p === 'runtime/default' || p === 'docker/default') return { kind: 'default' };
  if (p.startsWith('localhost/')) return { kind: 'localhost', path: p.slice('localhost/'.length) };
  throw invalidArgument(`unknown seccomp profile "${p}": use runtime/default, unconfined or localhost/<path>`);
}

export async function loadSeccomp(choice: SeccompChoice, caps: string[], privileged: boolean): Promise<Record<string, unknown> | undefined> {
  if (privileged || choice.kind === 'unconfined') return undefined;
  if (choice.kind === 'default') return defaultProfile(caps);
  let text: string;
  try {
    text = await fs.readFile(choice.path, 'utf8');
  } catch (err) {
    throw invalidArgument(`cannot read seccomp profile ${choice.path}: ${(err as Error).message}`);
  }
  try {
    return toOciSeccomp(JSON.parse(text) as Record<string, unknown>);
  } catch (err) {
    throw invalidArgument(`seccomp profile ${choice.path} is not valid: ${(err as Error).message}`);
  }
}
