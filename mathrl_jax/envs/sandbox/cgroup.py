"""The per-run cgroups: pids (`SandboxLimits.max_processes`) and memory (`SandboxLimits.memory_bytes`).

We run as root, and `RLIMIT_NPROC` never binds a process whose real uid is root (not
even inside a user namespace mapped to root), so a pids cgroup is the process cap:
`pids_cgroup_parent` finds a cgroup (v1 or v2) under which this process may create
pids-limited children, and each run gets its own `PidsCgroup` under it.

`RLIMIT_AS` is per process: six children of 300 MB each fit under a 512 MB `RLIMIT_AS`.
Where a memory controller is writable (`memory_cgroup_parent`), each run also gets a
`MemoryCgroup` whose limit (`memory.max` in v2, `memory.limit_in_bytes` in v1) holds
all of the run's processes together; the kernel's OOM killer ends a process of the run
that would pass it, and the run's status is "memory".
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


def _usable_parent(controller: str, limit_file: str) -> str | None:
    """A cgroup directory (v1 or v2) under which this process may create children limited by `controller`."""
    own = _own_cgroup_paths()
    for mount_point, fs_type, options in _cgroup_mounts():
        if fs_type == "cgroup" and controller in options.split(","):
            relative = next((p for c, p in own.items() if controller in c.split(",")), "/")
        elif fs_type == "cgroup2":
            relative = own.get("", "/")
        else:
            continue
        parent = os.path.join(mount_point, relative.lstrip("/"))
        if fs_type == "cgroup2":
            try:
                with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                    if controller not in f.read().split():
                        continue
            except OSError:
                continue
        probe = os.path.join(parent, f"mathrl_sandbox_probe_{uuid.uuid4().hex[:12]}")
        try:
            os.mkdir(probe)
        except OSError:
            continue
        try:
            usable = os.path.exists(os.path.join(probe, limit_file)) and os.access(
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


@functools.cache
def pids_cgroup_parent() -> str | None:
    """A cgroup directory under which this process may create pids-limited children, or None."""
    return _usable_parent("pids", "pids.max")


@functools.cache
def memory_cgroup_parent() -> str | None:
    """A cgroup directory under which this process may create memory-limited children, or None."""
    return _usable_parent("memory", "memory.max") or _usable_parent("memory", "memory.limit_in_bytes")


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


class RunCgroup:
    """A cgroup of one run: created under `parent`, every process in it killed and the cgroup removed at the end."""

    def __init__(self, parent: str):
        self.path = os.path.join(parent, f"mathrl_sandbox_{os.getpid()}_{uuid.uuid4().hex[:12]}")
        os.mkdir(self.path)

    def _write(self, name: str, value: int) -> None:
        with open(os.path.join(self.path, name), "w") as f:
            f.write(str(value))

    def _events(self, name: str) -> dict[str, int]:
        """A flat-keyed cgroup file (`pids.events`, `memory.events`, `memory.oom_control`) as {key: count}."""
        counts = {}
        try:
            with open(os.path.join(self.path, name)) as f:
                for line in f:
                    fields = line.split()
                    if len(fields) == 2 and fields[1].isdigit():
                        counts[fields[0]] = int(fields[1])
        except OSError:
            pass
        return counts

    @property
    def procs(self) -> str:
        return os.path.join(self.path, "cgroup.procs")

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


class PidsCgroup(RunCgroup):
    """A per-run pids cgroup: at most `max_pids` processes and threads."""

    def __init__(self, parent: str, max_pids: int):
        super().__init__(parent)
        self._write("pids.max", max_pids)

    def hit_max(self) -> bool:
        return self._events("pids.events").get("max", 0) > 0


class MemoryCgroup(RunCgroup):
    """A per-run memory cgroup: all the run's processes together use at most `max_bytes` (no swap).

    `within`: a run cgroup that already exists (cgroup v2's pids cgroup of the run) to put the limit on rather
    than a cgroup of its own. In v2 a process belongs to one cgroup of the unified hierarchy: joining a second
    would take it out of the first, and its pids limit with it. That cgroup is then removed by its owner.
    """

    def __init__(self, parent: str, max_bytes: int, within: RunCgroup | None = None):
        self.owned = within is None
        if within is None:
            super().__init__(parent)
        else:
            self.path = within.path
        self.max_bytes = max_bytes
        try:
            if os.path.exists(os.path.join(self.path, "memory.max")):  # v2
                self._write("memory.max", max_bytes)
                if os.path.exists(os.path.join(self.path, "memory.swap.max")):
                    self._write("memory.swap.max", 0)
            else:  # v1; memory+swap may not be below memory, so it is written second
                self._write("memory.limit_in_bytes", max_bytes)
                if os.path.exists(os.path.join(self.path, "memory.memsw.limit_in_bytes")):
                    self._write("memory.memsw.limit_in_bytes", max_bytes)
        except OSError:
            if self.owned:  # not left behind
                os.rmdir(self.path)
            raise

    def kill_all_and_remove(self, timeout_s: float = 5.0) -> None:
        if self.owned:
            super().kill_all_and_remove(timeout_s)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of the run for passing the limit."""
        events = self._events("memory.events") or self._events("memory.oom_control")
        return events.get("oom_kill", 0) > 0
