"""The pids cgroup that caps a run's processes and threads (`SandboxLimits.max_processes`).

We run as root, and `RLIMIT_NPROC` never binds a process whose real uid is root (not
even inside a user namespace mapped to root), so a pids cgroup is the process cap:
`pids_cgroup_parent` finds a cgroup (v1 or v2) under which this process may create
pids-limited children, and each run gets its own `PidsCgroup` under it.
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid


def _own_cgroup_paths() -> dict[str, str]:
    """controller list (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                paths[controllers] = path
    except OSError:
        pass
    return paths


def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, options) of the cgroup file systems."""
    mounts = []
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                    mounts.append((fields[1], fields[2], fields[3]))
    except OSError:
        pass
    return mounts


@functools.cache
def pids_cgroup_parent() -> str | None:
    """A cgroup directory under which this process may create pids-limited children, or None."""
    own = _own_cgroup_paths()
    for mount_point, fs_type, options in _cgroup_mounts():
        if fs_type == "cgroup" and "pids" in options.split(","):
            relative = next((p for c, p in own.items() if "pids" in c.split(",")), "/")
        elif fs_type == "cgroup2":
            relative = own.get("", "/")
        else:
            continue
        parent = os.path.join(mount_point, relative.lstrip("/"))
        if fs_type == "cgroup2":
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    if "pids" not in f.read().split():
                        continue
            except OSError:
                continue
        probe = os.path.join(parent, f"mathrl_sandbox_probe_{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            usable = os.path.exists(os.path.join(probe, "pids.max")) and os.access(
                os.path.join(probe, "cgroup.procs"), os.W_OK
            )
        finally:
            try:
                os.rmdir(probe)
            except OSError:
                pass
        if usable:
            _remove_stale_cgroups(parent)
            return parent
    return None


def _remove_stale_cgroups(parent: str) -> None:
    """Removes the empty per-run cgroups of processes that died before cleaning up (named mathrl_sandbox_<pid>_*)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        fields = name.split("_")
        if name.startswith("mathrl_sandbox_") and len(fields) == 4 and fields[2].isdigit():
            if not os.path.exists(f"/proc/{fields[2]}"):
                try:
                    os.rmdir(os.path.join(parent, name))
                except OSError:
                    pass


class PidsCgroup:
    """A per-run pids cgroup: created with `pids.max`, killed and removed at the end."""

    def __init__(self, parent: str, max_pids: int):
        self.path = os.path.join(parent, f"mathrl_sandbox_{os.getpid()}_{uuid.uuid4().hex[:12]}")
        os.mkdir(self.path)
        with open(os.path.join(self.path, "pids.max"), "w") as f:
            f.write(str(max_pids))

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

    def hit_max(self) -> bool:
        try:
            with open(os.path.join(self.path, "pids.events")) as f:
                return any(line.split()[:1] == ["max"] and int(line.split()[1]) > 0 for line in f)
        except (OSError, ValueError, IndexError):
            return False

    def pids(self) -> list[int]:
        try:
            with open(self.procs) as f:
                return [int(line) for line in f if line.strip()]
        except OSError:
            return []

    def kill_all_and_remove(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)
