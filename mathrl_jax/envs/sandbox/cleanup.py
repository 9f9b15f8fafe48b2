"""Removing a run's directory from the host, inode flags included, and saying what could not be removed.

A program that held `CAP_LINUX_IMMUTABLE` (root, with the uid layer and seccomp both off) can mark a file in
its working directory immutable or append-only (`chattr +i`); `shutil.rmtree(ignore_errors=True)` then left the
file, and its data, on the host while the run said "ok". Here a removal that fails clears those flags on the
entry and its directory and tries again; whatever still stands is returned, for the run to report.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import struct

_FS_IOC_GETFLAGS = 0x80086601
_FS_IOC_SETFLAGS = 0x40086602
_FS_IMMUTABLE_FL = 0x10
_FS_APPEND_FL = 0x20


def clear_inode_flags(path: str) -> None:
    """Clears the immutable and append-only flags of `path` (a regular file or directory, never followed
    through a symlink; other kinds are not opened: opening a device or FIFO can act or block)."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode) and not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    try:
        (flags,) = struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))
        if flags & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("i", flags & ~(_FS_IMMUTABLE_FL | _FS_APPEND_FL)))
    except OSError:  # a file system without inode flags (tmpfs before Linux 6.0, say): nothing to clear
        pass
    finally:
        os.close(fd)


def remove_tree(path: str) -> str:
    """Removes the directory `path` and everything in it; returns "" when it is gone, else what stayed (the
    first failure and how many entries are left). Never raises for what the tree holds."""
    failures = []
    inside = path.rstrip("/") + "/"

    def unlock(_function, failed_path, _exc_info):
        # Only `path` and what lies in it are touched: never the directory that holds `path` (/tmp, say). A
        # directory the program made unreadable (mode 0300) or immutable is opened up for the second pass.
        for candidate in (failed_path, os.path.dirname(failed_path)):
            if candidate == path or candidate.startswith(inside):
                clear_inode_flags(candidate)
                try:
                    os.chmod(candidate, stat.S_IRWXU, follow_symlinks=False)
                except (OSError, NotImplementedError):
                    pass

    def record(_function, failed_path, exc_info):
        failures.append(f"{failed_path}: {getattr(exc_info[1], 'strerror', None) or exc_info[1]}")

    for handler in (unlock, unlock, record):  # a locked directory inside a locked one takes a pass of its own
        if not os.path.lexists(path):
            return ""
        try:
            shutil.rmtree(path, onerror=handler)
        except Exception as error:  # noqa: BLE001 - reported, never raised at the caller of a sandboxed run
            failures.append(f"{path}: {error}")
    if not os.path.lexists(path):
        return ""
    left = sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))
    first = failures[0] if failures else "unknown error"
    return f"{left} entries left ({first})"
