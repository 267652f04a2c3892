/**
 * skiff's RuntimeDefault seccomp profile, as data: an allowlist. Anything not
 * named here is refused with EPERM. Each group says who may use it and why;
 * seccomp.ts turns the groups into an OCI `linux.seccomp` for a container's
 * capability set.
 *
 * A name the installed libseccomp does not know is skipped by runc (it logs
 * and goes on), so newer syscalls can be listed before every host knows them.
 * runc also answers ENOSYS, not EPERM, for syscall numbers above the highest
 * one the filter names, so software probing a brand-new syscall falls back.
 */

export interface SyscallArg {
  index: number;
  value: number;
  valueTwo?: number;
  op: 'SCMP_CMP_EQ' | 'SCMP_CMP_MASKED_EQ';
}

export interface SyscallGroup {
  /** Why these are allowed (or refused, or gated), in a line or two. */
  why: string;
  names: string[];
  /** Allowed only when the container holds at least one of these capabilities. */
  anyCap?: string[];
  /** Allowed only when the container holds none of these (the restricted twin of a gated group). */
  noneOfCaps?: string[];
  /** One rule per entry; the call passes when any one of them matches. */
  argAlternatives?: SyscallArg[];
  /** 'allow' (default), or an errno to answer instead of the default EPERM. */
  errno?: number;
}

export const EPERM = 1;
export const ENOSYS = 38;

/** clone(2) flags that make new namespaces. */
export const NAMESPACE_CLONE_FLAGS = {
  CLONE_NEWNS: 0x00020000,
  CLONE_NEWCGROUP: 0x02000000,
  CLONE_NEWUTS: 0x04000000,
  CLONE_NEWIPC: 0x08000000,
  CLONE_NEWUSER: 0x10000000,
  CLONE_NEWPID: 0x20000000,
  CLONE_NEWNET: 0x40000000,
};
export const NAMESPACE_CLONE_MASK = Object.values(NAMESPACE_CLONE_FLAGS).reduce((a, b) => a | b, 0);

/** personality(2) values a container may ask for; see the personality group. */
export const ALLOWED_PERSONAS = {
  PER_LINUX: 0x0,
  PER_LINUX32: 0x8,
  UNAME26: 0x20000,
  PER_LINUX32_UNAME26: 0x20008,
  QUERY: 0xffffffff,
};

/** x86_64 hosts run 64-bit, i386 and x32 binaries; the filter covers all three ABIs. */
export const ARCHITECTURES = ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'];

const SYS_ADMIN = ['CAP_SYS_ADMIN'];

export const SYSCALL_GROUPS: SyscallGroup[] = [
  {
    why: 'Files and directories: opening, reading, writing, metadata and links. The kernel still applies permissions, DAC and the mount flags.',
    names: [
      'access', 'faccessat', 'faccessat2', 'open', 'openat', 'openat2', 'creat', 'close', 'close_range',
      'read', 'readv', 'pread64', 'preadv', 'preadv2', 'write', 'writev', 'pwrite64', 'pwritev', 'pwritev2',
      'lseek', '_llseek', 'stat', 'stat64', 'lstat', 'lstat64', 'fstat', 'fstat64', 'fstatat64', 'newfstatat', 'statx',
      'statfs', 'statfs64', 'fstatfs', 'fstatfs64', 'getdents', 'getdents64', 'getcwd', 'chdir', 'fchdir',
      'mkdir', 'mkdirat', 'rmdir', 'unlink', 'unlinkat', 'rename', 'renameat', 'renameat2',
      'link', 'linkat', 'symlink', 'symlinkat', 'readlink', 'readlinkat', 'mknod', 'mknodat',
      'chmod', 'fchmod', 'fchmodat', 'fchmodat2', 'chown', 'chown32', 'fchown', 'fchown32', 'fchownat', 'lchown', 'lchown32',
      'truncate', 'truncate64', 'ftruncate', 'ftruncate64', 'fallocate', 'fadvise64', 'fadvise64_64', 'readahead',
      'fsync', 'fdatasync', 'sync', 'syncfs', 'sync_file_range', 'flock', 'umask',
      'utime', 'utimes', 'utimensat', 'utimensat_time64', 'futimesat',
      'getxattr', 'lgetxattr', 'fgetxattr', 'setxattr', 'lsetxattr', 'fsetxattr',
      'listxattr', 'llistxattr', 'flistxattr', 'removexattr', 'lremovexattr', 'fremovexattr',
      'copy_file_range', 'sendfile', 'sendfile64', 'splice', 'tee', 'vmsplice', 'cachestat',
      'fcntl', 'fcntl64', 'ioctl', 'dup', 'dup2', 'dup3', 'pipe', 'pipe2', 'memfd_create',
    ],
  },
  {
    why: 'Waiting for descriptors, events and timers: every event loop needs these.',
    names: [
      'poll', 'ppoll', 'ppoll_time64', 'select', '_newselect', 'pselect6', 'pselect6_time64',
      'epoll_create', 'epoll_create1', 'epoll_ctl', 'epoll_ctl_old', 'epoll_wait', 'epoll_wait_old', 'epoll_pwait', 'epoll_pwait2',
      'eventfd', 'eventfd2', 'signalfd', 'signalfd4', 'inotify_init', 'inotify_init1', 'inotify_add_watch', 'inotify_rm_watch',
      'fanotify_mark', 'timerfd_create', 'timerfd_gettime', 'timerfd_gettime64', 'timerfd_settime', 'timerfd_settime64',
      'io_setup', 'io_destroy', 'io_submit', 'io_cancel', 'io_getevents', 'io_pgetevents', 'io_pgetevents_time64',
    ],
  },
  {
    why: 'Memory of the process itself. Locking is bounded by RLIMIT_MEMLOCK; protection keys only narrow access.',
    names: [
      'brk', 'mmap', 'mmap2', 'munmap', 'mremap', 'mprotect', 'madvise', 'mincore', 'msync', 'remap_file_pages',
      'mlock', 'mlock2', 'mlockall', 'munlock', 'munlockall', 'pkey_alloc', 'pkey_free', 'pkey_mprotect',
      'membarrier', 'memfd_secret', 'map_shadow_stack', 'mseal',
    ],
  },
  {
    why: 'Processes, threads, signals and identity inside the container. Changing ids and capabilities is still checked by the kernel against what the container holds.',
    names: [
      'fork', 'vfork', 'execve', 'execveat', 'exit', 'exit_group', 'wait4', 'waitid', 'waitpid',
      'kill', 'tkill', 'tgkill', 'rt_sigaction', 'rt_sigpending', 'rt_sigprocmask', 'rt_sigqueueinfo', 'rt_sigreturn',
      'rt_sigsuspend', 'rt_sigtimedwait', 'rt_sigtimedwait_time64', 'rt_tgsigqueueinfo', 'sigaltstack', 'sigprocmask', 'sigreturn',
      'pause', 'restart_syscall', 'pidfd_open', 'pidfd_send_signal', 'process_mrelease',
      'getpid', 'getppid', 'gettid', 'getpgid', 'getpgrp', 'setpgid', 'getsid', 'setsid',
      'getuid', 'getuid32', 'geteuid', 'geteuid32', 'getgid', 'getgid32', 'getegid', 'getegid32',
      'getresuid', 'getresuid32', 'getresgid', 'getresgid32', 'getgroups', 'getgroups32',
      'setuid', 'setuid32', 'setgid', 'setgid32', 'setreuid', 'setreuid32', 'setregid', 'setregid32',
      'setresuid', 'setresuid32', 'setresgid', 'setresgid32', 'setgroups', 'setgroups32',
      'setfsuid', 'setfsuid32', 'setfsgid', 'setfsgid32', 'capget', 'capset', 'prctl', 'seccomp',
      'set_tid_address', 'set_robust_list', 'get_robust_list', 'rseq', 'futex', 'futex_time64', 'futex_waitv',
      'futex_wake', 'futex_wait', 'futex_requeue', 'set_thread_area', 'get_thread_area', 'arch_prctl', 'modify_ldt',
      'landlock_create_ruleset', 'landlock_add_rule', 'landlock_restrict_self',
    ],
  },
  {
    why: 'Scheduling and limits of the container\'s own tasks. Raising a priority or a hard limit still needs CAP_SYS_NICE or CAP_SYS_RESOURCE in the kernel, so these need no gate here.',
    names: [
      'sched_yield', 'sched_getaffinity', 'sched_setaffinity', 'sched_getattr', 'sched_setattr', 'sched_getparam',
      'sched_setparam', 'sched_getscheduler', 'sched_setscheduler', 'sched_get_priority_max', 'sched_get_priority_min',
      'sched_rr_get_interval', 'sched_rr_get_interval_time64', 'getpriority', 'setpriority', 'ioprio_get', 'ioprio_set',
      'getrlimit', 'setrlimit', 'ugetrlimit', 'prlimit64', 'getrusage', 'getcpu',
    ],
  },
  {
    why: 'Reading clocks, sleeping and interval timers. Setting the clock is a separate, gated group; adjtimex is here because NTP tools use it to read the clock state, and the kernel itself demands CAP_SYS_TIME before it changes anything.',
    names: [
      'time', 'gettimeofday', 'clock_gettime', 'clock_gettime64', 'clock_getres', 'clock_getres_time64',
      'clock_nanosleep', 'clock_nanosleep_time64', 'nanosleep', 'alarm', 'getitimer', 'setitimer', 'times',
      'timer_create', 'timer_delete', 'timer_getoverrun', 'timer_gettime', 'timer_gettime64', 'timer_settime', 'timer_settime64',
      'adjtimex',
    ],
  },
  {
    why: 'Sockets, in the pod\'s own network namespace.',
    names: [
      'socket', 'socketpair', 'socketcall', 'bind', 'listen', 'accept', 'accept4', 'connect', 'shutdown',
      'getsockname', 'getpeername', 'getsockopt', 'setsockopt', 'send', 'sendto', 'sendmsg', 'sendmmsg',
      'recv', 'recvfrom', 'recvmsg', 'recvmmsg', 'recvmmsg_time64',
    ],
  },
  {
    why: 'System V and POSIX IPC, scoped to the pod\'s IPC namespace.',
    names: [
      'ipc', 'msgget', 'msgsnd', 'msgrcv', 'msgctl', 'semget', 'semop', 'semtimedop', 'semtimedop_time64', 'semctl',
      'shmget', 'shmat', 'shmdt', 'shmctl', 'mq_open', 'mq_unlink', 'mq_timedsend', 'mq_timedsend_time64',
      'mq_timedreceive', 'mq_timedreceive_time64', 'mq_notify', 'mq_getsetattr',
    ],
  },
  {
    why: 'Facts about the system a program commonly asks for (uname, sysinfo, random bytes).',
    names: ['uname', 'sysinfo', 'getrandom'],
  },
  {
    why: 'chroot is harmless inside the container\'s own root, but only with the capability that governs it.',
    names: ['chroot'],
    anyCap: ['CAP_SYS_CHROOT'],
  },
  {
    why: 'personality(2) only for the plain Linux persona, the 32-bit one and the 2.6-uname variant, and for the query: ADDR_NO_RANDOMIZE and the other flags would let a process weaken its own hardening (turn off ASLR, make memory executable).',
    names: ['personality'],
    argAlternatives: Object.values(ALLOWED_PERSONAS).map((value) => ({ index: 0, value, op: 'SCMP_CMP_EQ' as const })),
  },
  {
    why: 'Without CAP_SYS_ADMIN, a thread or a process may be cloned but no namespace made: a new user namespace needs no capability and would open kernel code meant for privileged users.',
    names: ['clone'],
    noneOfCaps: SYS_ADMIN,
    argAlternatives: [{ index: 0, value: NAMESPACE_CLONE_MASK, valueTwo: 0, op: 'SCMP_CMP_MASKED_EQ' }],
  },
  {
    why: 'Without CAP_SYS_ADMIN, clone3 answers ENOSYS: its flags live in memory where seccomp cannot see them, and ENOSYS makes libc fall back to clone, which is checked.',
    names: ['clone3'],
    noneOfCaps: SYS_ADMIN,
    errno: ENOSYS,
  },
  {
    why: 'io_uring bypasses seccomp for the operations it carries and has been a steady source of kernel bugs; ENOSYS makes its users fall back to ordinary calls.',
    names: ['io_uring_setup', 'io_uring_enter', 'io_uring_register'],
    errno: ENOSYS,
  },
  {
    why: 'CAP_SYS_ADMIN: mounts, namespaces, host and domain names, file handles, quotas and fanotify; all reach beyond the container unless the capability was granted on purpose.',
    names: [
      'clone', 'clone3', 'unshare', 'setns', 'mount', 'umount', 'umount2', 'pivot_root', 'mount_setattr',
      'fsopen', 'fsconfig', 'fsmount', 'fspick', 'move_mount', 'open_tree', 'sethostname', 'setdomainname',
      'name_to_handle_at', 'fanotify_init', 'lookup_dcookie', 'quotactl', 'quotactl_fd',
    ],
    anyCap: SYS_ADMIN,
  },
  {
    why: 'CAP_DAC_READ_SEARCH: opening a file by handle skips path permission checks (the classic container breakout).',
    names: ['open_by_handle_at'],
    anyCap: ['CAP_DAC_READ_SEARCH'],
  },
  {
    why: 'CAP_SYS_PTRACE: tracing and reading or writing other processes\' memory.',
    names: ['ptrace', 'process_vm_readv', 'process_vm_writev', 'process_madvise', 'kcmp', 'pidfd_getfd'],
    anyCap: ['CAP_SYS_PTRACE'],
  },
  {
    why: 'CAP_SYS_MODULE: loading and unloading kernel modules.',
    names: ['init_module', 'finit_module', 'delete_module', 'create_module', 'query_module', 'get_kernel_syms'],
    anyCap: ['CAP_SYS_MODULE'],
  },
  {
    why: 'CAP_SYS_BOOT: reboot (kexec stays refused to everyone: it replaces the host kernel).',
    names: ['reboot'],
    anyCap: ['CAP_SYS_BOOT'],
  },
  {
    why: 'CAP_SYS_TIME: the clock is not namespaced, so setting it changes the host\'s time.',
    names: ['settimeofday', 'stime', 'clock_settime', 'clock_settime64', 'clock_adjtime', 'clock_adjtime64'],
    anyCap: ['CAP_SYS_TIME'],
  },
  {
    why: 'CAP_SYS_NICE: NUMA memory placement and moving pages, which act on memory the host shares out.',
    names: ['get_mempolicy', 'set_mempolicy', 'set_mempolicy_home_node', 'mbind', 'move_pages', 'migrate_pages'],
    anyCap: ['CAP_SYS_NICE'],
  },
  {
    why: 'CAP_SYS_PTRACE, the capability the kernel itself asks for when unprivileged userfaultfd is off: it lets a process stall the kernel on a page fault, a common step in exploits.',
    names: ['userfaultfd'],
    anyCap: ['CAP_SYS_PTRACE'],
  },
  {
    why: 'CAP_BPF (or CAP_SYS_ADMIN on older kernels): BPF programs run in the host kernel.',
    names: ['bpf'],
    anyCap: ['CAP_BPF', 'CAP_SYS_ADMIN'],
  },
  {
    why: 'CAP_PERFMON (or CAP_SYS_ADMIN): performance counters observe the whole machine.',
    names: ['perf_event_open'],
    anyCap: ['CAP_PERFMON', 'CAP_SYS_ADMIN'],
  },
  {
    why: 'CAP_SYSLOG (or CAP_SYS_ADMIN): the kernel log is the host\'s.',
    names: ['syslog'],
    anyCap: ['CAP_SYSLOG', 'CAP_SYS_ADMIN'],
  },
  {
    why: 'CAP_SYS_PACCT: process accounting writes host-wide records.',
    names: ['acct'],
    anyCap: ['CAP_SYS_PACCT'],
  },
  {
    why: 'CAP_SYS_RAWIO: direct access to I/O ports.',
    names: ['iopl', 'ioperm'],
    anyCap: ['CAP_SYS_RAWIO'],
  },
  {
    why: 'CAP_SYS_TTY_CONFIG: hanging up the controlling terminal.',
    names: ['vhangup'],
    anyCap: ['CAP_SYS_TTY_CONFIG'],
  },
];
