"""The sandbox's private root: the namespace's file system rebuilt from the readable roots alone (`pivot_root`).

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
"""

from __future__ import annotations

import os
import re
from typing import Any

_MS_RDONLY = 1
_MS_NOSUID = 2
_MS_NODEV = 4
_MS_REMOUNT = 32
_MS_BIND = 4096
_MS_REC = 16384
_MS_PRIVATE = 1 << 18
_MNT_DETACH = 2
_MOUNTINFO_FLAGS = {"nosuid": 2, "nodev": 4, "noexec": 8, "noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
"""Per-mount flags as /proc/self/mountinfo spells them: a remount must repeat those the kernel has locked."""
_SYS_MOUNT_SETATTR = 442  # the same on every architecture (added after the tables were unified)
_MOUNT_ATTR_RDONLY = 0x1
_MOUNT_ATTR_NOSUID = 0x2
_MOUNT_ATTR_NODEV = 0x4
_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
"""pivot_root(2) has no glibc wrapper; its number differs between architectures."""


def _libc_call(name: str, *args) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        raise OSError(ctypes.get_errno(), f"{name}{args}")


def _mount_tmpfs(path: str, size_bytes: int, mode: int = 0o700, owner: int | None = None) -> None:
    """Mounts a tmpfs of `size_bytes` on `path` (in the run's mount namespace): the disk limit. `owner` owns its
    root directory (uid and gid; None: this process)."""
    options = f"size={size_bytes},mode={mode:o}" + ("" if owner is None else f",uid={owner},gid={owner}")
    _libc_call("mount", b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode())


def _mount_points_under(path: str) -> list[tuple[str, int]]:
    """(mount point, the per-mount flags to keep) of every mount at or below `path`, from /proc/self/mountinfo."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])  # octal escapes
            if point == path or point.startswith(path.rstrip("/") + "/"):
                flags = sum(_MOUNTINFO_FLAGS.get(option, 0) for option in fields[5].split(","))
                found.append((point, flags))
    return found


def _make_read_only(path: str, nodev: bool) -> None:
    """Makes the bind mount at `path` and every mount below it read-only and `nosuid` (and `nodev`): no write and
    no change of mode, owner, times, attributes or flags reaches the host's files through them (EROFS), whoever
    asks. `mount_setattr` (Linux >= 5.12) changes just those flags, recursively; older kernels get a remount of
    each mount that repeats the flags the kernel has locked on it."""
    import ctypes

    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("attr_set", "attr_clr", "propagation", "userns_fd")]

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    wanted = _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | (_MOUNT_ATTR_NODEV if nodev else 0)
    attr = MountAttr(wanted, 0, 0, 0)
    flags = ctypes.c_uint(_AT_RECURSIVE)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    if libc.syscall(_SYS_MOUNT_SETATTR, _AT_FDCWD, path.encode(), flags, ctypes.byref(attr), size) != 0:
        remount_read_only(path, nodev)


def remount_read_only(path: str, nodev: bool) -> None:
    """`_make_read_only` on a kernel without `mount_setattr` (< 5.12): a remount of each mount at or below `path`,
    repeating the flags the kernel may have locked on it (in a user namespace it refuses to clear them)."""
    for point, kept in _mount_points_under(path):
        remount = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | (_MS_NODEV if nodev else 0) | kept
        _libc_call("mount", None, point.encode(), None, remount, None)


def _bind(source: str, target: str) -> None:
    """Makes `source` (a directory, or a file such as /dev/null) visible at `target`, submounts included."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _libc_call("mount", source.encode(), target.encode(), None, _MS_BIND | _MS_REC, None)


def enter_private_root(config: dict[str, Any], devices: tuple[str, ...], device_links: tuple[str, ...]) -> None:
    """Replaces the namespace's file system by one holding only the readable roots and the working directory.

    Landlock does not govern `connect` on a pathname UNIX socket (nor does the network namespace), so a
    program that escapes the audit hook (an exec'd interpreter has none) could reach any host server whose
    socket file it can name: /tmp/.X11-unix, /run/docker.sock, an agent's socket in $HOME. Hiding the host's
    directories with tmpfs mounts would be a deny-list of places sockets live; instead the namespace gets a
    new root (`pivot_root`, the old root detached) built from the allow-list that Landlock and the audit
    hook already use: each read root bind-mounted at its own path, the `devices` (`audit.DEVICES`), and a fresh
    tmpfs working directory of `disk_bytes`. A host socket outside those roots does not exist in there.

    With `config["read_only_roots"]`, every bind mount (the roots, `/proc`'s and `/sys`'s submounts, the devices)
    is made read-only and `nosuid` before the working directory is mounted: Landlock governs no metadata call,
    and the bind mounts are the host's own files. The working directory's tmpfs belongs to
    `config["unprivileged_id"]` where the program takes that uid.
    """
    machine = os.uname().machine
    if machine not in _SYS_PIVOT_ROOT:
        raise OSError(f"no pivot_root syscall number known for {machine}")
    workdir = config["workdir"]
    new_root = os.path.dirname(workdir)  # the host's private temporary directory of this run
    # Nothing may propagate to the host's mounts (unshare makes them private already; be sure).
    _libc_call("mount", None, b"/", None, _MS_REC | _MS_PRIVATE, None)
    _mount_tmpfs(new_root, 1 << 20, mode=0o755)  # holds only the directories that the mounts need
    roots = sorted({os.path.normpath(r) for r in config["read_roots"]})
    bound_roots, bound_devices = [], []
    for root in roots:
        if any(root != other and root.startswith(other.rstrip("/") + "/") for other in roots):
            continue  # inside another root's bind mount already
        target = new_root + root
        if os.path.islink(root):  # e.g. /lib -> usr/lib on merged-/usr systems: the same link inside
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.symlink(os.readlink(root), target)
        elif os.path.exists(root):
            _bind(root, target)
            bound_roots.append(target)
    for device in devices:
        if os.path.exists(device):
            _bind(device, new_root + device)
            bound_devices.append(new_root + device)
    for link in device_links:  # /dev/fd -> /proc/self/fd, /dev/stdin -> /proc/self/fd/0, ...
        if os.path.islink(link):
            os.symlink(os.readlink(link), new_root + link)
    os.makedirs(new_root + "/tmp", exist_ok=True)
    os.chmod(new_root + "/tmp", 0o1777)
    os.makedirs(new_root + workdir, exist_ok=True)
    if config.get("read_only_roots", True):
        for target in bound_roots:
            _make_read_only(target, nodev=True)
        for target in bound_devices:
            _make_read_only(target, nodev=False)
    _mount_tmpfs(new_root + workdir, config["disk_bytes"], owner=config.get("unprivileged_id"))
    import ctypes

    os.chdir(new_root)
    libc = ctypes.CDLL(None, use_errno=True)
    # pivot_root(".", ".") stacks the old root on the new one; detaching it leaves only the new root.
    if libc.syscall(ctypes.c_long(_SYS_PIVOT_ROOT[machine]), b".", b".") != 0:
        raise OSError(ctypes.get_errno(), "pivot_root")
    _libc_call("umount2", b".", _MNT_DETACH)
    os.chdir("/")
