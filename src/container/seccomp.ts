/**
 * Seccomp for containers: the CRI's Localhost profiles (Docker's JSON format,
 * converted to the OCI form), RuntimeDefault, and Unconfined.
 *
 * RuntimeDefault is an allowlist (seccomp-profile.ts holds it as data, one
 * commented group per purpose): anything it does not name is refused with
 * EPERM. Groups gated on a capability are added only when the container's
 * bounding set holds it, so adding CAP_SYS_ADMIN brings mount(2) and the
 * namespace calls back, CAP_SYS_PTRACE brings ptrace(2), and so on.
 */
import { errorMessage, invalidArgument } from '../errors.js';
import { readSmallRegularFile } from '../sys/small-file.js';
import { ARCHITECTURES, EPERM, SYSCALL_GROUPS, type SyscallGroup } from './seccomp-profile.js';

export { NAMESPACE_CLONE_FLAGS } from './seccomp-profile.js';

export interface OciSyscallRule {
  names: string[];
  action: 'SCMP_ACT_ALLOW' | 'SCMP_ACT_ERRNO';
  errnoRet?: number;
  args?: Array<{ index: number; value: number; valueTwo: number; op: string }>;
}

function applies(g: SyscallGroup, caps: Set<string>): boolean {
  if (g.anyCap && !g.anyCap.some((c) => caps.has(c))) return false;
  if (g.noneOfCaps && g.noneOfCaps.some((c) => caps.has(c))) return false;
  return true;
}

/** The RuntimeDefault profile, in OCI form, for a container whose bounding set is `caps`. */
export function defaultProfile(caps: string[]): Record<string, unknown> {
  const held = new Set(caps);
  const syscalls: OciSyscallRule[] = [];
  for (const g of SYSCALL_GROUPS) {
    if (!applies(g, held)) continue;
    const base: OciSyscallRule = g.errno === undefined ? { names: [...g.names], action: 'SCMP_ACT_ALLOW' } : { names: [...g.names], action: 'SCMP_ACT_ERRNO', errnoRet: g.errno };
    if (!g.argAlternatives) {
      syscalls.push(base);
      continue;
    }
    // Rules on one syscall are alternatives: the call passes when any one matches.
    for (const a of g.argAlternatives) syscalls.push({ ...base, names: [...g.names], args: [{ index: a.index, value: a.value, valueTwo: a.valueTwo ?? 0, op: a.op }] });
  }
  return { defaultAction: 'SCMP_ACT_ERRNO', defaultErrnoRet: EPERM, architectures: [...ARCHITECTURES], syscalls };
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
  if (p.startsWith('localhost/')) {
    const file = p.slice('localhost/'.length);
    // As for localhost_ref: a path relative to the daemon's working directory means nothing to the caller.
    if (!file.startsWith('/')) throw invalidArgument(`seccomp profile "${p}" must name an absolute path (localhost/<absolute path>)`);
    return { kind: 'localhost', path: file };
  }
  throw invalidArgument(`unknown seccomp profile "${p}": use runtime/default, unconfined or localhost/<path>`);
}

/**
 * The most a Localhost profile may weigh. A profile is a short JSON list of
 * syscalls (the RuntimeDefault one is about 30 KiB written out); the bound
 * keeps a request naming /dev/zero or a huge file from costing memory.
 */
export const MAX_PROFILE_BYTES = 1024 * 1024;

/** A real profile nests five levels (profile, syscalls, rule, args, arg); deeper ones only break what handles them later. */
const MAX_PROFILE_DEPTH = 16;

/** Whether `v` nests objects or arrays deeper than `max`, walked without recursion. */
function depthOver(v: unknown, max: number): boolean {
  const stack: Array<[unknown, number]> = [[v, 1]];
  while (stack.length) {
    const [x, d] = stack.pop()!;
    if (typeof x !== 'object' || x === null) continue;
    if (d > max) return true;
    for (const child of Object.values(x as Record<string, unknown>)) if (typeof child === 'object' && child !== null) stack.push([child, d + 1]);
  }
  return false;
}

/** The actions the kernel knows; anything else is refused here, never echoed from the file. */
const ACTIONS = new Set(['SCMP_ACT_KILL', 'SCMP_ACT_KILL_PROCESS', 'SCMP_ACT_KILL_THREAD', 'SCMP_ACT_TRAP', 'SCMP_ACT_ERRNO', 'SCMP_ACT_TRACE', 'SCMP_ACT_ALLOW', 'SCMP_ACT_LOG', 'SCMP_ACT_NOTIFY']);

export async function loadSeccomp(choice: SeccompChoice, caps: string[], privileged: boolean): Promise<Record<string, unknown> | undefined> {
  if (privileged || choice.kind === 'unconfined') return undefined;
  if (choice.kind === 'default') return defaultProfile(caps);
  let text: string;
  try {
    // Never a FIFO or device (either could hold a thread or stream forever), never more than the bound.
    text = (await readSmallRegularFile(choice.path, MAX_PROFILE_BYTES)).toString('utf8');
  } catch (err) {
    throw invalidArgument(`cannot read seccomp profile ${choice.path}: ${errorMessage(err)}`);
  }
  // The messages below never quote the file: its path came from the caller, its bytes may be anyone's secret.
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw invalidArgument(`seccomp profile ${choice.path} is not valid JSON`);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw invalidArgument(`seccomp profile ${choice.path} is not a JSON object`);
  if (depthOver(parsed, MAX_PROFILE_DEPTH)) throw invalidArgument(`seccomp profile ${choice.path} nests deeper than ${MAX_PROFILE_DEPTH} levels`);
  const profile = parsed as Record<string, unknown>;
  if (typeof profile.defaultAction !== 'string' || !ACTIONS.has(profile.defaultAction)) throw invalidArgument(`seccomp profile ${choice.path} has no valid defaultAction`);
  if (profile.syscalls !== undefined && !Array.isArray(profile.syscalls)) throw invalidArgument(`seccomp profile ${choice.path}: syscalls must be a list`);
  try {
    return toOciSeccomp(profile);
  } catch {
    throw invalidArgument(`seccomp profile ${choice.path} is not valid`);
  }
}
