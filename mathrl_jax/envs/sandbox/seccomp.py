"""seccomp-bpf (libseccomp): the kernel refuses the system calls a program could harm the host with.

Where the sandbox has no namespaces, the audit hook can be switched off from Python (writing
through `ctypes.pointer` to the program's own objects fires no audit event; PEP 578: hooks are
not a sandbox), and Landlock governs files and TCP only. The filter installed here, in the user
program's process after Landlock and the rlimits, is what then remains between the program and
the host: it refuses (EPERM, ENOSYS for `clone3`), where processes are refused,

- new sockets of every family (`socket`; `socketpair` stays: a connected pair reaches nothing),
  so no UDP, no pathname or abstract AF_UNIX `connect`, no netlink;
- `execve`/`execveat` and new processes (`fork`, `vfork`, `clone` without `CLONE_THREAD`);
  threads (`clone` with `CLONE_THREAD`) only where a pids cgroup caps them; `clone3`'s flags
  lie behind a pointer seccomp cannot read, so it is answered ENOSYS and glibc falls back to
  `clone`;
- any process but the program's own: `kill`, `tkill`, `tgkill`, `rt_(tg)sigqueueinfo` to
  another pid, `prlimit64` on another pid, `setpriority`, `sched_set*`, `ioprio_set`,
  `migrate_pages`, `move_pages`, `ptrace`, `process_vm_*`, `process_madvise`, `kcmp`,
  `pidfd_*`; leaving the run's process group or session (`setsid`, `setpgid`) and changing
  the parent-death signal (`prctl(PR_SET_PDEATHSIG)`), so the time limit's kill reaches it;
and in every mode (`KERNEL_SURFACE`, `FILE_METADATA`; namespaces hold the rest there)

- changes to any file's metadata (`FILE_METADATA`: the `chmod`, `chown`, `*setxattr`,
  `*removexattr` and `utime` families, `file_setattr`, and the `FS_IOC_SETFLAGS` /
  `FS_IOC_FSSETXATTR` ioctls): Landlock governs none of them, and a program that could set
  `security.capability` or the set-user-ID bit on a host file it can only read made a
  root shell for any local user (issue 60);
- new namespaces (`unshare`, `setns`, and `clone` with any `CLONE_NEW*` flag; `clone3`'s flags
  lie behind a pointer seccomp cannot read, so it is answered ENOSYS and glibc falls back to
  `clone`);
- the host's System V and POSIX message-queue IPC, `io_uring` (its operations bypass
  seccomp), keyrings, `bpf`, `perf_event_open`, `userfaultfd`, device nodes (`mknod*`),
  file handles (`open_by_handle_at`, a container escape), mounts and namespaces, modules,
  clocks, host names, swap, reboot, raw I/O ports.

System calls of another ABI (i386's `int 0x80`, x32) are killed (libseccomp's default for a
foreign architecture). System calls newer than the installed libseccomp (numbers it cannot name, up
to `HIGHEST_SYSCALL`) are answered ENOSYS: a deny-list by name would let a call added to the kernel
after the library was built straight through (libseccomp 2.5.4 names none of Linux 6.13's
`setxattrat` and `removexattrat`, nor 6.17's `file_setattr`, each a metadata change). ENOSYS is what
the kernel itself answers for a call it lacks, so the C library's fallbacks still work.

Why a binding of our own, over libseccomp's C API through `ctypes`, rather than a package:
libseccomp compiles the filter (architecture checks, 64-bit argument comparisons), which is the
part worth keeping. The registry's bindings do not fit the sandbox's side: the official
`seccomp` package is source only (Cython and libseccomp's headers to build), and `pyseccomp`
finds the library with `ctypes.util.find_library`, which runs `ldconfig` in a subprocess, and
this side must never start a process or load `subprocess`. The library is opened by its soname.
nsjail and bubblewrap are programs, not on this machine nor shipped by a registry package.

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
"""

from __future__ import annotations

import errno
import functools

LIBRARY = "libseccomp.so.2"
"""The soname `dlopen` finds (libseccomp 2.x: Debian, Ubuntu, Fedora, Alpine, Arch ship it with systemd)."""

_ACT_ALLOW = 0x7FFF0000
_CMP_NE = 1
_CMP_EQ = 4
_CMP_MASKED_EQ = 7
_CLONE_THREAD = 0x00010000
_PR_SET_PDEATHSIG = 1
_FLTATR_CTL_OPTIMIZE = 8  # enum scmp_filter_attr (libseccomp >= 2.5)
_ARCH_NATIVE = 0

KERNEL_SURFACE = (
    "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "process_mrelease", "kcmp", "pidfd_getfd",
    "shmget", "shmat", "shmctl", "shmdt", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop",
    "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify",
    "mq_getsetattr", "io_uring_setup", "io_uring_enter", "io_uring_register", "keyctl", "add_key",
    "request_key", "bpf", "perf_event_open", "userfaultfd", "fanotify_init", "mknod", "mknodat",
    "open_by_handle_at", "name_to_handle_at", "mount", "umount2", "pivot_root", "chroot", "setns", "unshare",
    "move_mount", "open_tree", "fsopen", "fsmount", "fsconfig", "fspick", "mount_setattr",
    "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex",
    "sethostname", "setdomainname", "iopl", "ioperm", "vhangup", "uselib", "lookup_dcookie", "personality",
)  # fmt: skip
"""Refused (EPERM) in every mode: what a program computing an answer never needs."""

FILE_METADATA = (
    "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "chown32", "fchown32",
    "lchown32", "setxattr", "lsetxattr", "fsetxattr", "setxattrat", "removexattr", "lremovexattr", "fremovexattr",
    "removexattrat", "utime", "utimes", "utimensat", "futimesat", "utimensat_time64", "file_setattr",
)  # fmt: skip
"""Refused (EPERM) in every mode: mode bits, owners, extended attributes (file capabilities among them) and
times of any file, the working directory's included (a program computing an answer needs none of them;
`shutil.copy`'s mode copy then fails, `Path.touch` still creates a file)."""

METADATA_IOCTLS = (0x40086602, 0x40046602, 0x401C5820, 0x40087602, 0x40047602, 0x4008941A)
"""`FS_IOC_SETFLAGS`, `FS_IOC32_SETFLAGS` (`chattr +i`, `+a`), `FS_IOC_FSSETXATTR` (the same flags as xflags),
`FS_IOC_SETVERSION` and `FS_IOC32_SETVERSION` (the inode's generation), btrfs's `BTRFS_IOC_SUBVOL_SETFLAGS`:
refused in every mode. The kernel reads an ioctl's request as 32 bits, so only those are compared."""

NEW_NAMESPACE_FLAGS = (0x00000080, 0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
"""`CLONE_NEWTIME`, `CLONE_NEWNS`, `CLONE_NEWCGROUP`, `CLONE_NEWUTS`, `CLONE_NEWIPC`, `CLONE_NEWUSER`, `CLONE_NEWPID`,
`CLONE_NEWNET`: a `clone` with any of them is refused in every mode (as `unshare` is)."""

HIGHEST_SYSCALL = 1023
"""Numbers up to this one that the installed libseccomp cannot name are refused (ENOSYS) as unknown (Linux 6.18's
highest on x86_64 is 469; the margin covers a kernel newer than the library by several years)."""

NO_PROCESSES = (
    "socket", "execve", "execveat", "fork", "vfork", "pidfd_open", "pidfd_send_signal", "setpriority",
    "sched_setscheduler", "sched_setparam", "sched_setaffinity", "sched_setattr", "ioprio_set", "migrate_pages",
    "move_pages", "get_robust_list", "setsid", "setpgid",
)  # fmt: skip
"""Refused (EPERM) where processes are refused (no namespaces): with the argument rules in `apply_seccomp`."""

SIGNALS_TO_SELF_ONLY = ("kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo")
"""Where processes are refused, refused unless their first argument (pid, thread group) is the program's own pid."""


@functools.cache
def load_library():
    """libseccomp, opened by its soname (`dlopen`: no `ldconfig`), its functions typed."""
    import ctypes

    lib = ctypes.CDLL(LIBRARY, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p  # a malloc'ed name, or NULL
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_attr_set.restype = ctypes.c_int
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    lib.seccomp_rule_add_array.restype = ctypes.c_int
    lib.seccomp_load.restype = ctypes.c_int
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


@functools.cache
def seccomp_available() -> bool:
    """Whether libseccomp loads here and the kernel has seccomp filters (`/proc/self/status` has `Seccomp:`)."""
    try:
        load_library()
        with open("/proc/self/status") as f:
            return any(line.startswith("Seccomp:") for line in f)
    except (OSError, AttributeError):
        return False


def unknown_syscalls() -> list[int]:
    """System call numbers up to `HIGHEST_SYSCALL` that the installed libseccomp cannot name on this architecture:
    calls newer than the library, refused as unknown (and gaps in the table, which the kernel refuses anyway)."""
    import ctypes

    lib = load_library()
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    unknown = []
    for number in range(HIGHEST_SYSCALL + 1):
        name = lib.seccomp_syscall_resolve_num_arch(_ARCH_NATIVE, number)
        if name:
            libc.free(name)
        else:
            unknown.append(number)
    return unknown


def apply_seccomp(own_pid: int, processes_allowed: bool, threads_allowed: bool) -> None:
    """Installs the filter (see the module docstring) on this process and every thread and child it makes.

    `processes_allowed` (namespaces, a pids cgroup and Landlock confine them) keeps only the refusals of every
    mode (`KERNEL_SURFACE`, `FILE_METADATA`, new namespaces, unknown calls): the namespaces already hold sockets,
    processes and signals. Otherwise `own_pid`, the program's pid, is the one signal and limit target allowed,
    and `threads_allowed` (a pids cgroup caps them) lets `clone` with `CLONE_THREAD` through. Raises OSError if
    libseccomp or the kernel refuses; the caller must then not run the program.
    """
    import ctypes

    class ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
        _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]

    lib = load_library()
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    context = lib.seccomp_init(_ACT_ALLOW)
    if not context:
        raise OSError(errno.ENOMEM, "seccomp_init")

    def refuse(name_or_number, code=errno.EPERM, *comparisons):
        if isinstance(name_or_number, int):
            number = name_or_number
        else:
            number = lib.seccomp_syscall_resolve_name(name_or_number.encode())
            if number < 0:  # not a system call of this architecture (ioperm on arm64, say)
                return
        args = (ArgCmp * max(len(comparisons), 1))(*(ArgCmp(*c) for c in comparisons))
        result = lib.seccomp_rule_add_array(context, 0x00050000 | code, number, len(comparisons), args)
        if result < 0:
            raise OSError(-result, f"seccomp_rule_add {name_or_number}")

    try:
        # A binary tree of the rules, not a chain: the unknown numbers below add some hundreds of them.
        lib.seccomp_attr_set(context, _FLTATR_CTL_OPTIMIZE, 2)  # libseccomp < 2.5 lacks it: a chain then
        for name in KERNEL_SURFACE + FILE_METADATA:
            refuse(name)
        for request in METADATA_IOCTLS:
            refuse("ioctl", errno.EPERM, (1, _CMP_MASKED_EQ, 0xFFFFFFFF, request))
        refuse("clone3", errno.ENOSYS)
        if not processes_allowed:
            for name in NO_PROCESSES:
                refuse(name)
            for name in SIGNALS_TO_SELF_ONLY:
                refuse(name, errno.EPERM, (0, _CMP_NE, own_pid, 0))
            refuse("prlimit64", errno.EPERM, (0, _CMP_NE, 0, 0))  # glibc's getrlimit / setrlimit pass pid 0
            # The kernel reads prctl's option as 32 bits: compare those only (0x100000001 is PR_SET_PDEATHSIG too).
            refuse("prctl", errno.EPERM, (0, _CMP_MASKED_EQ, 0xFFFFFFFF, _PR_SET_PDEATHSIG))
        if processes_allowed or threads_allowed:
            if not processes_allowed:
                refuse("clone", errno.EPERM, (0, _CMP_MASKED_EQ, _CLONE_THREAD, 0))
            for flag in NEW_NAMESPACE_FLAGS:
                refuse("clone", errno.EPERM, (0, _CMP_MASKED_EQ, flag, flag))
        else:
            refuse("clone")
        for number in unknown_syscalls():
            refuse(number, errno.ENOSYS)
        result = lib.seccomp_load(context)
        if result < 0:
            raise OSError(-result, "seccomp_load")
    finally:
        lib.seccomp_release(context)
