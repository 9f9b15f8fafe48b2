"""The program's credentials: a uid and gid that own nothing on the host, no capabilities, no new privileges.

Landlock governs no metadata call (`chmod`, `chown`, `setxattr`, `utime`, `ioctl(FS_IOC_SETFLAGS)`), and the
kernel lets the owner of a file (or a holder of `CAP_FOWNER` / `CAP_CHOWN` / `CAP_SETFCAP`) change its mode,
owner, times, extended attributes and inode flags. A program running as root, or in a user namespace whose
root is the host's root, owns the host's files: the review's program set `security.capability` on a host copy
of Python, and the host's `nobody` then ran it and became root (issue 60). Here the program's process takes
`SANDBOX_ID` as its real, effective and saved uid and gid, with no supplementary groups and no capabilities,
so it owns no host file and may change none, whatever else fails.

One capability may stay: `CAP_DAC_READ_SEARCH`, and only where the interpreter's own files are out of reach of
other users (a Python under `/root`, mode 0700, without namespaces): without it the program could not import its
standard library. It passes every read and search permission check, of files too (root's 0600 files in `/etc`:
as the caller, root, read them before): Landlock still bounds what it reads to the readable roots, and it grants
no write and no metadata change. Where the program keeps the caller's uid, it keeps no capability at all
(`drop_capabilities`).

`no_new_privs` is set always: an `exec` then never gains privileges from a set-user-ID bit or a file
capability (Landlock and libseccomp set it too, where they run).

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
"""

from __future__ import annotations

import os
import stat

SANDBOX_ID = 2_000_000_000
"""The program's uid and gid, where the caller is root: above every range that useradd (`SUB_UID_MAX`,
600100000), systemd (`0x6FFF0000` at most for containers) and Docker's user namespace remapping hand out,
so that no host file or process has it. Every sandboxed run shares it: the pid namespace (or, without one,
Landlock's scopes and the seccomp filter) keeps runs from reaching each other's processes."""

CAP_DAC_READ_SEARCH = 2
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
CAP_SYS_ADMIN = 21
_PR_SET_KEEPCAPS = 8
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_SECBIT_NOROOT_AND_LOCKED = 0b11  # SECBIT_NOROOT | SECBIT_NOROOT_LOCKED: uid 0 gains nothing by exec
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


def effective_capabilities() -> int:
    """This process's effective capability set (`CapEff` of /proc/self/status), as a bit mask."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def has_capability(capability: int) -> bool:
    return bool(effective_capabilities() >> capability & 1)


def others_can_read(path: str) -> bool:
    """Whether a user that owns nothing reaches `path` and lists it: every directory on the way searchable by
    others, `path` itself readable and searchable by others (mode bits, as the kernel checks them)."""
    current = "/"
    parts = [p for p in os.path.abspath(path).split("/") if p]
    try:
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            mode = os.stat(current).st_mode
            if not stat.S_ISDIR(mode):
                return bool(mode & stat.S_IROTH)
            needed = stat.S_IXOTH | (stat.S_IROTH if index == len(parts) - 1 else 0)
            if mode & needed != needed:
                return False
    except OSError:
        return False
    return True


def can_drop_privileges(read_roots: list[str]) -> bool:
    """Whether this process can run a program as `SANDBOX_ID` that still reads `read_roots`: root with
    `CAP_SETUID` and `CAP_SETGID`, and either the roots readable by others or `CAP_DAC_READ_SEARCH` to keep."""
    if os.geteuid() != 0 or not (has_capability(CAP_SETUID) and has_capability(CAP_SETGID)):
        return False
    return has_capability(CAP_DAC_READ_SEARCH) or all(others_can_read(r) for r in read_roots if os.path.exists(r))


def set_no_new_privs() -> None:
    """No `exec` of this process or its children gains privileges (set-user-ID bits and file capabilities
    are ignored); it cannot be undone."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def drop_capabilities() -> None:
    """Empties this process's capability sets (effective, permitted, inheritable, ambient), where the program keeps
    the caller's uid (no `SANDBOX_ID` to drop to: a non-root caller's user namespace, whose root would otherwise
    hold every capability there; a root caller without `CAP_SETUID`). Found in review: the root of a user
    namespace cleared the read-only flag of its private root's bind mounts with `mount_setattr`, which Landlock
    does not govern. Where it may (`CAP_SETPCAP`), also `SECBIT_NOROOT`, locked: an exec as uid 0 gains no
    capability (`no_new_privs` already keeps it to none). Raises OSError if the capabilities stay."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if has_capability(CAP_SETPCAP):
        libc.prctl(_PR_SET_SECUREBITS, _SECBIT_NOROOT_AND_LOCKED, 0, 0, 0)  # a kernel that refuses: NNP holds
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _set_capabilities(0)
    if effective_capabilities() != 0:
        raise OSError(f"capabilities after the drop are {effective_capabilities():#x}, expected none")


def _set_capabilities(keep: int) -> None:
    """capset(2): effective and permitted `keep`, inheritable none (of the first 32 capabilities; the rest none)."""
    import ctypes

    class CapHeader(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class CapData(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    libc = ctypes.CDLL(None, use_errno=True)
    data = (CapData * 2)(CapData(keep, keep, 0), CapData(0, 0, 0))
    if libc.capset(ctypes.byref(CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def drop_privileges(identity: int, read_roots: list[str]) -> None:
    """Makes this process `identity` (real, effective and saved uid and gid; no supplementary groups) with no
    capabilities, or with `CAP_DAC_READ_SEARCH` alone where `read_roots` are out of other users' reach (see
    the module docstring). Raises OSError if the kernel refuses any step or the result is not exactly that:
    the caller must then not run the program."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    keep = 1 << CAP_DAC_READ_SEARCH if not all(others_can_read(r) for r in read_roots if os.path.exists(r)) else 0
    if keep and not has_capability(CAP_DAC_READ_SEARCH):
        raise OSError(f"the readable roots are out of reach of uid {identity} and CAP_DAC_READ_SEARCH is not held")
    if keep and libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS)")
    # The run's own pipes (stdin, stdout, stderr: made by the host, root's, mode 0600) become the program's,
    # so that it can reopen them as /dev/stdin and /dev/stdout, as any program can.
    for fd in (0, 1, 2):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.fchown(fd, identity, identity)
        except OSError:
            pass
    os.setgroups([])
    os.setresgid(identity, identity, identity)
    os.setresuid(identity, identity, identity)  # clears every effective capability (and, without KEEPCAPS, all)
    if keep:
        _set_capabilities(keep)
        if libc.prctl(_PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_KEEPCAPS, 0)")
    # A change of credentials makes the process non-dumpable, and its /proc/<pid> root's: the program
    # could no longer read its own /proc entries. Other processes of the same uid are kept away by the
    # pid namespace, or by Landlock and seccomp (no ptrace in any mode).
    if libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE)")
    if os.getresuid() != (identity,) * 3 or os.getresgid() != (identity,) * 3 or os.getgroups():
        raise OSError(f"credentials after the drop are {os.getresuid()} / {os.getresgid()} / {os.getgroups()}")
    if effective_capabilities() != keep:
        raise OSError(f"capabilities after the drop are {effective_capabilities():#x}, expected {keep:#x}")
