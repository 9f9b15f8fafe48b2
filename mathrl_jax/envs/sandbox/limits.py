"""What one sandboxed run may use (`SandboxLimits`) and which confinement layers hold it to that (`Isolation`)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
      wall_time_s: wall-clock seconds from start to kill (GEM's python tool: 5).
      cpu_time_s: CPU seconds of the user program (`RLIMIT_CPU`, whole seconds).
      memory_bytes: address-space limit of each process (`RLIMIT_AS`) and, with a memory cgroup, the
        memory of the whole run, all its processes together (without one, the limit is per process:
        processes are then refused unless namespaces + a pids cgroup + Landlock confine them, and
        `max_processes` of them may each use `memory_bytes`).
      file_size_bytes: largest file the program may write (`RLIMIT_FSIZE`).
      disk_bytes: size of the working directory (a tmpfs; namespace isolation only).
      max_processes: processes + threads of the user program, itself included
        (kernel-enforced with a pids cgroup; without one, 1: creation is refused).
      max_open_files: `RLIMIT_NOFILE`.
      max_output_bytes: bytes of stdout and of stderr kept; more kills the run
        with status "output_limit", so a program printing forever cannot fill memory.
    """

    wall_time_s: float = 5.0
    cpu_time_s: int = 5
    memory_bytes: int = 512 << 20
    file_size_bytes: int = 16 << 20
    disk_bytes: int = 64 << 20
    max_processes: int = 16
    max_open_files: int = 256
    max_output_bytes: int = 8192

    def __post_init__(self):
        if not self.wall_time_s > 0:
            raise ValueError(f"wall_time_s must be > 0, got {self.wall_time_s!r}")
        for name in ("cpu_time_s", "memory_bytes", "file_size_bytes", "disk_bytes", "max_processes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.max_open_files, int) or self.max_open_files < 16:
            raise ValueError(f"max_open_files must be an int >= 16, got {self.max_open_files!r}")
        if not isinstance(self.max_output_bytes, int) or self.max_output_bytes < 0:
            raise ValueError(f"max_output_bytes must be an int >= 0, got {self.max_output_bytes!r}")


@dataclasses.dataclass(frozen=True)
class Isolation:
    """Which confinement layers a run uses (see the table in the package docstring).

    Attributes:
      namespaces: run under `unshare` in fresh user/pid/net/mount/ipc/uts/cgroup namespaces.
      pids_cgroup: cap processes with a pids cgroup.
      landlock_abi: Landlock ABI version to apply (0: none).
      memory_cgroup: hold the whole run's memory to `memory_bytes` with a memory cgroup.
      seccomp: a seccomp-bpf filter (`seccomp.py`) in the user program's process: in every mode no change to
        any file's metadata, no new namespaces, no call newer than libseccomp; wherever processes are refused,
        also no sockets, no processes, nothing done to another process.
      unprivileged_uid: the program runs as `privileges.SANDBOX_ID` (a uid and gid that own nothing on the
        host), without capabilities: it can change no host file's mode, owner, times, extended attributes or
        flags. Needs a root caller (`CAP_SETUID`); with namespaces, also `CAP_SYS_ADMIN` (the namespaces are
        then made without a user namespace, whose root would be the caller).
      read_only_roots: (with namespaces) the private root's bind mounts of the readable roots and devices are
        read-only and `nosuid`: no write, mode, owner, times or attribute change reaches a host file through
        them, and no set-user-ID program gains anything. False only to test the other layers without it.
    """

    namespaces: bool
    pids_cgroup: bool
    landlock_abi: int
    memory_cgroup: bool = False
    seccomp: bool = False
    unprivileged_uid: bool = False
    read_only_roots: bool = True

    @property
    def processes_allowed(self) -> bool:
        """Child processes are allowed only where the kernel confines them without the audit hook."""
        return self.namespaces and self.pids_cgroup and self.landlock_abi >= 1

    @property
    def contains(self) -> bool:
        """Whether the kernel holds the program with the audit hook switched off (from Python, by `ctypes`):
        its own namespaces (a private root, no network, its own pids), or, without them, Landlock (files) and
        the seccomp filter (sockets, processes, other processes). Anything less is not a sandbox: `run_python`
        refuses it unless told `allow_not_a_sandbox=True`."""
        return self.namespaces or (self.landlock_abi >= 1 and self.seccomp)

    @property
    def name(self) -> str:
        """e.g. "namespace+cgroup+memcg+landlock7+seccomp+uid" or "audit"."""
        parts = ["namespace" if self.namespaces else "audit"]
        if self.namespaces and not self.read_only_roots:
            parts.append("writable-roots")
        if self.pids_cgroup:
            parts.append("cgroup")
        if self.memory_cgroup:
            parts.append("memcg")
        if self.landlock_abi:
            parts.append(f"landlock{self.landlock_abi}")
        if self.seccomp:
            parts.append("seccomp")
        if self.unprivileged_uid:
            parts.append("uid")
        return "+".join(parts)
