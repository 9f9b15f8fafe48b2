"""Landlock (Linux >= 5.13): the kernel confines the user program's file, network and signal access.

The host asks `landlock_abi()` which ABI the kernel has (it becomes `Isolation.landlock_abi`);
the sandbox's entry script calls `apply_landlock` in the user program's process, before the
program runs. Landlock also binds what the program `exec`s, which the audit hook cannot see.

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
"""

from __future__ import annotations

import functools
import os
import sys

# Landlock (include/uapi/linux/landlock.h). Syscall numbers are the same on every
# architecture that has them (they were added after the syscall tables were unified).
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
_FS_EXECUTE = 1 << 0
_FS_WRITE_FILE = 1 << 1
_FS_READ_FILE = 1 << 2
_FS_READ_DIR = 1 << 3
_FS_ALL_ABI1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
_SCOPE_SIGNAL = 1 << 1


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 when Landlock is unavailable."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        version = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION)
    except (OSError, AttributeError):
        return 0
    return max(int(version), 0)


def apply_landlock(
    abi: int, workdir: str, read_roots: list[str], devices: tuple[str, ...], allow_execute: bool = True
) -> None:
    """Writes only under `workdir`; read/exec only under `read_roots`; no TCP; scoped signals/sockets.

    `devices` may be read (and /dev/null written): the rest of /dev (raw disks) stays closed.
    `allow_execute=False` (where processes are refused) grants `execve` of no file at all: the kernel's
    stop for a process started where the audit hook cannot see it (native code: libuv, `posix_spawn`).
    Loading shared libraries (`mmap` with PROT_EXEC) is not an `execve`, so imports still work.
    """
    import ctypes

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fs = _FS_ALL_ABI1 | (_FS_REFER if abi >= 2 else 0) | (_FS_TRUNCATE if abi >= 3 else 0)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if abi >= 6 else 0
    attr = RulesetAttr(fs, net, scoped)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    execute = _FS_EXECUTE if allow_execute else 0
    read = execute | _FS_READ_FILE | _FS_READ_DIR
    workdir_access = fs if allow_execute else fs & ~_FS_EXECUTE
    file_write = _FS_WRITE_FILE | _FS_READ_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
    rules = [(root, read) for root in read_roots] + [(workdir, workdir_access), ("/dev/null", file_write)]
    rules += [(device, _FS_READ_FILE) for device in devices]
    try:
        for path, access in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = PathBeneath(access, fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
