/**
 * The RuntimeDefault allowlist, judged the way the kernel filter would judge
 * a call: a small evaluator of the OCI rules (the same matching libseccomp
 * does — any one rule on a name whose argument conditions all hold decides;
 * otherwise the default action).
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { defaultProfile, loadSeccomp, seccompChoice, type OciSyscallRule } from '../../src/container/seccomp.js';
import { NAMESPACE_CLONE_FLAGS, SYSCALL_GROUPS } from '../../src/container/seccomp-profile.js';
import { DEFAULT_CAPS } from '../../src/container/spec.js';

type Verdict = 'allow' | number;

function argHolds(a: NonNullable<OciSyscallRule['args']>[number], args: number[]): boolean {
  const v = args[a.index] ?? 0;
  // Arguments are compared as 64-bit unsigned values; BigInt keeps 0xffffffff masks exact.
  if (a.op === 'SCMP_CMP_EQ') return BigInt(v) === BigInt(a.value);
  if (a.op === 'SCMP_CMP_MASKED_EQ') return (BigInt(v) & BigInt(a.value)) === BigInt(a.valueTwo);
  throw new Error(`evaluator does not know ${a.op}`);
}

function judge(profile: Record<string, unknown>, name: string, args: number[] = []): Verdict {
  const rules = (profile.syscalls as OciSyscallRule[]).filter((r) => r.names.includes(name));
  const hit = rules.find((r) => (r.args ?? []).every((a) => argHolds(a, args)));
  if (!hit) return profile.defaultErrnoRet as number;
  return hit.action === 'SCMP_ACT_ALLOW' ? 'allow' : hit.errnoRet!;
}

const EPERM = 1;
const ENOSYS = 38;
const plain = defaultProfile(DEFAULT_CAPS);
const withCap = (...caps: string[]) => defaultProfile([...DEFAULT_CAPS, ...caps]);

describe('RuntimeDefault seccomp allowlist', () => {
  it('refuses what it does not name with EPERM, on x86_64 with its i386 and x32 ABIs', () => {
    expect(plain).toMatchObject({ defaultAction: 'SCMP_ACT_ERRNO', defaultErrnoRet: EPERM, architectures: ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'] });
    for (const n of ['kexec_load', 'kexec_file_load', 'keyctl', 'add_key', 'request_key', 'swapon', 'swapoff', 'uselib', 'ustat', '_sysctl', 'nfsservctl', 'vm86', 'no_such_call']) {
      expect(judge(plain, n), n).toBe(EPERM);
    }
  });

  it('allows what ordinary programs use', () => {
    for (const n of ['read', 'write', 'openat', 'execve', 'exit_group', 'mmap', 'futex', 'rt_sigaction', 'wait4', 'socket', 'connect', 'epoll_pwait', 'clock_gettime', 'getrandom', 'statx', 'chown', 'setuid', 'arch_prctl', 'rseq', 'close_range', 'faccessat2', 'chroot', 'prlimit64', 'sched_setaffinity', 'setsid', 'kill']) {
      expect(judge(plain, n), n).toBe('allow');
    }
  });

  it('allows personality only for the plain, 32-bit and UNAME26 personas and the query', () => {
    for (const p of [0x0, 0x8, 0x20000, 0x20008, 0xffffffff]) expect(judge(plain, 'personality', [p]), p.toString(16)).toBe('allow');
    const ADDR_NO_RANDOMIZE = 0x0040000;
    const READ_IMPLIES_EXEC = 0x0400000;
    for (const p of [ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, 0x8 | ADDR_NO_RANDOMIZE, 0x20000 | ADDR_NO_RANDOMIZE, 0x1, 0xfffffffe]) {
      expect(judge(plain, 'personality', [p]), p.toString(16)).toBe(EPERM);
    }
  });

  it('refuses mount, namespaces and the other CAP_SYS_ADMIN calls without the capability, and allows them with it', () => {
    const adminCalls = ['mount', 'umount2', 'unshare', 'setns', 'pivot_root', 'open_tree', 'move_mount', 'fsopen', 'mount_setattr', 'sethostname', 'name_to_handle_at', 'quotactl'];
    for (const n of adminCalls) expect(judge(plain, n), n).toBe(EPERM);
    const admin = withCap('CAP_SYS_ADMIN');
    for (const n of adminCalls) expect(judge(admin, n), n).toBe('allow');
  });

  it('lets clone make processes and threads, refuses every namespace flag, and answers clone3 with ENOSYS, unless CAP_SYS_ADMIN', () => {
    const SIGCHLD = 17;
    const THREAD = 0x3d0f00; // what glibc's pthread_create passes
    expect(judge(plain, 'clone', [SIGCHLD])).toBe('allow');
    expect(judge(plain, 'clone', [THREAD])).toBe('allow');
    for (const [flag, v] of Object.entries(NAMESPACE_CLONE_FLAGS)) {
      expect(judge(plain, 'clone', [v | SIGCHLD]), flag).toBe(EPERM);
      expect(judge(plain, 'clone', [v | THREAD]), flag).toBe(EPERM);
    }
    expect(judge(plain, 'clone3')).toBe(ENOSYS);
    const admin = withCap('CAP_SYS_ADMIN');
    for (const v of Object.values(NAMESPACE_CLONE_FLAGS)) expect(judge(admin, 'clone', [v | SIGCHLD])).toBe('allow');
    expect(judge(admin, 'clone3')).toBe('allow');
  });

  it('lets any container read the clock state with adjtimex: the kernel itself guards changes with CAP_SYS_TIME', () => {
    expect(judge(plain, 'adjtimex')).toBe('allow');
    expect(judge(plain, 'clock_adjtime')).toBe(EPERM);
  });

  it('opens each capability-gated group only to a container holding one of its capabilities', () => {
    const table: Array<[string[], string[]]> = [
      [['CAP_SYS_PTRACE'], ['ptrace', 'process_vm_readv', 'process_vm_writev', 'kcmp', 'pidfd_getfd', 'userfaultfd']],
      [['CAP_SYS_MODULE'], ['init_module', 'finit_module', 'delete_module']],
      [['CAP_SYS_BOOT'], ['reboot']],
      [['CAP_SYS_TIME'], ['settimeofday', 'clock_settime', 'clock_adjtime']],
      [['CAP_SYS_NICE'], ['mbind', 'set_mempolicy', 'move_pages']],
      [['CAP_BPF', 'CAP_SYS_ADMIN'], ['bpf']],
      [['CAP_PERFMON', 'CAP_SYS_ADMIN'], ['perf_event_open']],
      [['CAP_SYSLOG', 'CAP_SYS_ADMIN'], ['syslog']],
      [['CAP_SYS_PACCT'], ['acct']],
      [['CAP_SYS_RAWIO'], ['iopl', 'ioperm']],
      [['CAP_SYS_TTY_CONFIG'], ['vhangup']],
      [['CAP_DAC_READ_SEARCH'], ['open_by_handle_at']],
    ];
    for (const [caps, calls] of table) {
      for (const n of calls) {
        expect(judge(plain, n), `${n} without ${caps}`).toBe(EPERM);
        for (const c of caps) expect(judge(withCap(c), n), `${n} with ${c}`).toBe('allow');
        // Another capability does not open it.
        expect(judge(withCap('CAP_NET_ADMIN'), n), `${n} with CAP_NET_ADMIN`).toBe(EPERM);
      }
    }
    // kexec stays closed even with the capability that governs it in the kernel.
    expect(judge(withCap('CAP_SYS_BOOT'), 'kexec_load')).toBe(EPERM);
    // A container without CAP_SYS_CHROOT (dropped) loses chroot.
    expect(judge(defaultProfile(DEFAULT_CAPS.filter((c) => c !== 'CAP_SYS_CHROOT')), 'chroot')).toBe(EPERM);
  });

  it('never names a syscall twice with different verdicts and no arguments to tell them apart (libseccomp would refuse the filter)', () => {
    const all = ['CAP_SYS_ADMIN', 'CAP_SYS_PTRACE', 'CAP_SYS_MODULE', 'CAP_SYS_BOOT', 'CAP_SYS_TIME', 'CAP_SYS_NICE', 'CAP_SYS_RESOURCE', 'CAP_BPF', 'CAP_PERFMON', 'CAP_SYSLOG', 'CAP_SYS_PACCT', 'CAP_SYS_RAWIO', 'CAP_SYS_TTY_CONFIG', 'CAP_DAC_READ_SEARCH'];
    for (const caps of [DEFAULT_CAPS, [...DEFAULT_CAPS, ...all]]) {
      const seen = new Map<string, string>();
      for (const r of defaultProfile(caps).syscalls as OciSyscallRule[]) {
        if (r.args?.length) continue;
        for (const n of r.names) {
          const v = `${r.action}/${r.errnoRet ?? ''}`;
          expect(seen.get(n) ?? v, n).toBe(v);
          seen.set(n, v);
        }
      }
    }
    for (const g of SYSCALL_GROUPS) expect(g.why.length, g.names.join(',')).toBeGreaterThan(20);
  });

  it('answers io_uring with ENOSYS so its users fall back to ordinary calls', () => {
    for (const n of ['io_uring_setup', 'io_uring_enter', 'io_uring_register']) expect(judge(withCap('CAP_SYS_ADMIN'), n)).toBe(ENOSYS);
  });
});

describe('seccompChoice', () => {
  it('refuses a legacy localhost/ path that is not absolute, as localhost_ref', () => {
    expect(() => seccompChoice(undefined, 'localhost/profiles/p.json')).toThrow(/must name an absolute path/);
    expect(seccompChoice(undefined, 'localhost//var/lib/p.json')).toEqual({ kind: 'localhost', path: '/var/lib/p.json' });
  });
});

describe('loadSeccomp', () => {
  it('gives no filter for Unconfined and privileged containers, the allowlist for RuntimeDefault, and converts a Localhost file', async () => {
    expect(await loadSeccomp({ kind: 'unconfined' }, DEFAULT_CAPS, false)).toBeUndefined();
    expect(await loadSeccomp({ kind: 'default' }, DEFAULT_CAPS, true)).toBeUndefined();
    expect(await loadSeccomp({ kind: 'default' }, DEFAULT_CAPS, false)).toEqual(plain);
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'skiff-seccomp-'));
    try {
      const file = path.join(dir, 'p.json');
      await fs.writeFile(file, JSON.stringify({ defaultAction: 'SCMP_ACT_ALLOW', syscalls: [{ names: ['personality'], action: 'SCMP_ACT_ERRNO' }] }));
      expect(await loadSeccomp({ kind: 'localhost', path: file }, DEFAULT_CAPS, false)).toEqual({ defaultAction: 'SCMP_ACT_ALLOW', syscalls: [{ names: ['personality'], action: 'SCMP_ACT_ERRNO' }] });
      await fs.writeFile(file, '{not json');
      await expect(loadSeccomp({ kind: 'localhost', path: file }, DEFAULT_CAPS, false)).rejects.toThrow(/not valid/);
      await expect(loadSeccomp({ kind: 'localhost', path: path.join(dir, 'absent.json') }, DEFAULT_CAPS, false)).rejects.toThrow(/cannot read/);
      // Nested past any real profile: refused here, not an INTERNAL error when the spec is written.
      const deep = `${'['.repeat(100_000)}1${']'.repeat(100_000)}`;
      await fs.writeFile(file, `{"defaultAction":"SCMP_ACT_ALLOW","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW","args":${deep}}]}`);
      await expect(loadSeccomp({ kind: 'localhost', path: file }, DEFAULT_CAPS, false)).rejects.toThrow(/nests deeper than 16 levels/);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });
});
