"""Runs untrusted Python (model-generated code) in a confined child process.

`run_python(code, limits)` starts a fresh interpreter in a temporary working
directory with a cleaned environment and returns its (truncated) stdout,
stderr and a `status` naming the limit that stopped it. Model-generated code is
hostile input: it only ever runs through here.

Layers, each used where the machine offers it (`detect_isolation`):

- rlimits (always): CPU seconds (`RLIMIT_CPU`), address space (`RLIMIT_AS`), file
  size (`RLIMIT_FSIZE`), open files; no core files.
- wall clock (always): the process group (and namespace, and cgroup) is SIGKILLed
  at `wall_time_s`.
- bounded capture (always): at most `max_output_bytes` of stdout and of stderr are
  kept; more ends the run ("output_limit").
- namespaces (`unshare`): fresh user, pid, net, mount, ipc, uts and cgroup
  namespaces. No network but a down loopback; `/proc` shows only the sandbox's
  processes; everything dies with the namespace's first process; the working
  directory is a tmpfs of `disk_bytes`.
- pids cgroup (a writable v1 or v2 pids controller): at most `max_processes`
  processes and threads.
- Landlock (Linux >= 5.13): writes only inside the working directory; reads and
  exec only of system and interpreter directories; no mount changes; no TCP bind
  or connect (ABI >= 4); no signals or abstract sockets outside the sandbox (ABI >= 6).
- audit hook (always, PEP 578): refuses, with a `SandboxViolation` naming the
  operation, network calls, writes outside the working directory, reads outside
  it and the system / interpreter directories (so: no raw disks, no other
  processes' `/proc` entries, no caller's files) and symlinks; and, wherever the
  kernel does not cap them, process creation and `ctypes` calls.

Reads of system directories (`/etc`, `/usr`, ...) stay allowed: keep secrets out of them.

The audit hook (PEP 578) is not a security boundary on its own (the PEP says
so): it is the refusal layer that names what was refused, and the fallback
when `unshare` / cgroups / Landlock are missing. Processes (and `ctypes`) are
allowed only where the kernel confines what they could do without the hook:
namespaces + a process cap + Landlock. Otherwise `os.fork`, `subprocess`,
`os.system`, `os.exec*`, `posix_spawn` are refused (`status="process_limit"`).

We run as root here, and `RLIMIT_NPROC` never binds a process whose real uid
is root (not even inside a user namespace mapped to root), so the process cap
is the pids cgroup (or, for a non-root caller, `RLIMIT_NPROC` in the fresh user
namespace).

GEM's python tool (axon-rl/gem `gem/tools/python_code_tool.py`) runs code with
`subprocess.run(["python3", file], timeout=5)` in a shared directory with a
filtered environment; this module keeps its 5 s default and its cleaned
environment and adds the limits above.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import selectors
import shutil
import signal
import sys
import tempfile
import time
import uuid
from typing import Any

# `subprocess` (and with it `_posixsubprocess`, which forks without an audit event) is imported
# only on the host side, inside functions: this file is also the sandbox's entry point.

STATUSES = (
    "ok",  # exited 0
    "error",  # exited non-zero / uncaught exception, no limit involved
    "timeout",  # wall clock
    "cpu_time",  # RLIMIT_CPU
    "memory",  # RLIMIT_AS (MemoryError)
    "file_size",  # RLIMIT_FSIZE, or the working directory's size limit
    "process_limit",  # process creation refused or over max_processes
    "network",  # network access refused
    "filesystem",  # write outside the working directory / other processes' /proc refused
    "forbidden",  # another refused operation (ctypes where not allowed, killing other processes, ...)
    "output_limit",  # more than max_output_bytes of stdout or stderr
    "sandbox_error",  # the sandbox itself failed to start
)
"""Every `SandboxResult.status`."""

_UNSHARE_FLAGS = (
    "--user",
    "--map-root-user",
    "--net",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--mount-proc",
    "--ipc",
    "--uts",
    "--cgroup",
)

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

_READ_ROOTS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys")
"""System directories the sandboxed code may read and execute from (with the interpreter's prefixes).
Not /dev (raw disks): only `_DEVICES` there; `/proc` only the sandbox's own processes (pid namespace / hook)."""
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
_DEVICE_LINKS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")  # -> /proc/self/fd
_PROC_REFUSED = ("kcore", "kmem", "mem", "kpagecount", "kpageflags", "kpagecgroup", "sysrq-trigger")

_MS_NOSUID = 2
_MS_NODEV = 4


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
      wall_time_s: wall-clock seconds from start to kill (GEM's python tool: 5).
      cpu_time_s: CPU seconds of the user program (`RLIMIT_CPU`, whole seconds).
      memory_bytes: address-space limit of each process (`RLIMIT_AS`).
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
    """Which confinement layers a run uses (see the module table).

    Attributes:
      namespaces: run under `unshare` in fresh user/pid/net/mount/ipc/uts/cgroup namespaces.
      pids_cgroup: cap processes with a pids cgroup.
      landlock_abi: Landlock ABI version to apply (0: none).
    """

    namespaces: bool
    pids_cgroup: bool
    landlock_abi: int

    @property
    def processes_allowed(self) -> bool:
        """Child processes are allowed only where the kernel confines them without the audit hook."""
        return self.namespaces and self.pids_cgroup and self.landlock_abi >= 1

    @property
    def name(self) -> str:
        """e.g. "namespace+cgroup+landlock7" or "audit"."""
        parts = ["namespace" if self.namespaces else "audit"]
        if self.pids_cgroup:
            parts.append("cgroup")
        if self.landlock_abi:
            parts.append(f"landlock{self.landlock_abi}")
        return "+".join(parts)


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """Outcome of `run_python`.

    Attributes:
      status: one of `STATUSES`: "ok", or what stopped the program.
      stdout, stderr: decoded output, each cut to `max_output_bytes`.
      returncode: the program's exit code; None when it was killed by a signal
        or the sandbox killed it.
      isolation: the layers that were applied.
      violations: operations the audit hook refused, as "kind: detail" strings
        (also when the program caught the refusal and exited 0).
      stdout_truncated, stderr_truncated: whether output was cut.
      signal: the signal that ended the program, if any.
      wall_time_s: seconds from start to end.
      cpu_time_s: CPU seconds of the program, when known.
    """

    status: str
    stdout: str
    stderr: str
    returncode: int | None
    isolation: Isolation
    violations: tuple[str, ...] = ()
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    signal: int | None = None
    wall_time_s: float = 0.0
    cpu_time_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


# ----------------------------------------------------------------------------- detection


@functools.cache
def _unshare_works(unshare: str) -> bool:
    import subprocess

    path = shutil.which(unshare)
    if path is None:
        return False
    try:
        probe = subprocess.run(
            [path, *_UNSHARE_FLAGS, "--", "/bin/sh", "-c", "exit 0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


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


def detect_isolation(unshare: str = "unshare") -> Isolation:
    """The strongest isolation this machine offers (`unshare` is the binary to probe)."""
    return Isolation(
        namespaces=sys.platform.startswith("linux") and _unshare_works(unshare),
        pids_cgroup=pids_cgroup_parent() is not None,
        landlock_abi=landlock_abi(),
    )


def _resolve_isolation(isolation: str | Isolation) -> Isolation:
    available = detect_isolation()
    if isinstance(isolation, Isolation):
        requested = isolation
    elif isolation == "auto":
        return available
    elif isolation == "namespace":
        if not available.namespaces:
            raise RuntimeError("isolation='namespace' requested but `unshare` with user namespaces does not work here")
        return available
    elif isolation == "audit":
        requested = dataclasses.replace(available, namespaces=False)
    else:
        raise ValueError(f"isolation must be 'auto', 'namespace', 'audit' or an Isolation, got {isolation!r}")
    missing = []
    if requested.namespaces and not available.namespaces:
        missing.append("namespaces")
    if requested.pids_cgroup and not available.pids_cgroup:
        missing.append("pids_cgroup")
    if requested.landlock_abi > available.landlock_abi:
        missing.append(f"landlock_abi={requested.landlock_abi} (kernel has {available.landlock_abi})")
    if missing:
        raise RuntimeError(f"requested isolation {requested} but this machine lacks: {', '.join(missing)}")
    return requested


# ----------------------------------------------------------------------------- host side


def _clean_env(workdir: str) -> dict[str, str]:
    """Only PATH / locale / thread-count essentials: none of the caller's variables reach the code."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": workdir,
        "TMPDIR": workdir,
        "PYTHONIOENCODING": "utf-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _interpreter_roots() -> list[str]:
    roots = []
    for path in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        for candidate in (path, os.path.realpath(path)):
            if candidate and candidate not in roots:
                roots.append(candidate)
    return roots


class _Cgroup:
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


def run_python(
    code: str,
    limits: SandboxLimits = SandboxLimits(),
    *,
    stdin: str = "",
    isolation: str | Isolation = "auto",
    site_packages: bool = True,
) -> SandboxResult:
    """Runs `code` as a Python program in a confined child process.

    Args:
      code: the program's source (run as `__main__`).
      limits: resource limits.
      stdin: text fed to the program's standard input.
      isolation: "auto" (the strongest available), "namespace" (require
        `unshare`), "audit" (no namespaces: rlimits + Landlock + audit hook), or
        an explicit `Isolation` (e.g. to run without a layer in tests).
      site_packages: whether the program may import the interpreter's installed
        packages (sympy, numpy, ...); False runs `python -S`.

    Returns:
      a `SandboxResult`; it never raises for anything the program does.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
    iso = _resolve_isolation(isolation)
    base = os.path.realpath(tempfile.mkdtemp(prefix="mathrl_sandbox_"))
    cgroup = None
    try:
        if iso.pids_cgroup:
            try:
                # The supervisor and (with namespaces) `unshare` are two tasks on top of the user program's.
                cgroup = _Cgroup(pids_cgroup_parent(), limits.max_processes + 2)
            except OSError:  # the cgroup parent went away: run without it, and so without child processes
                iso = dataclasses.replace(iso, pids_cgroup=False)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        config_path = os.path.join(base, "config.json")
        python = [
            sys.executable,
            "-I",  # isolated: no PYTHON* variables, no user site, no script directory on sys.path
            "-B",  # no .pyc writes (they would be refused outside the working directory)
            "-u",
            *([] if site_packages else ["-S"]),
            os.path.abspath(__file__),
            config_path,
        ]
        command = [shutil.which("unshare") or "unshare", *_UNSHARE_FLAGS, "--", *python] if iso.namespaces else python
        if cgroup is not None:
            command = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', cgroup.procs, *command]
        status_r, status_w = os.pipe()
        config = {
            "code": code,
            "workdir": workdir,
            "status_fd": status_w,
            "namespaces": iso.namespaces,
            "landlock_abi": iso.landlock_abi,
            "processes_allowed": iso.processes_allowed,
            "read_roots": [r for r in (*_interpreter_roots(), *_READ_ROOTS) if os.path.exists(r)],
            "cpu_time_s": limits.cpu_time_s,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "disk_bytes": limits.disk_bytes,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
        }
        with open(config_path, "w") as f:
            json.dump(config, f)
        return _communicate(command, workdir, status_r, status_w, stdin, limits, iso, cgroup)
    finally:
        if cgroup is not None:
            cgroup.kill_all_and_remove()
        shutil.rmtree(base, ignore_errors=True)


def _kill(proc, cgroup: _Cgroup | None) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if cgroup is not None:
        for pid in cgroup.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _communicate(command, workdir, status_r, status_w, stdin, limits, iso, cgroup) -> SandboxResult:
    import subprocess

    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_clean_env(workdir),
            cwd=workdir,
            start_new_session=True,
            pass_fds=(status_w,),
            close_fds=True,
        )
    except OSError as e:
        os.close(status_r)
        os.close(status_w)
        return SandboxResult("sandbox_error", "", f"could not start the sandbox: {e}", None, iso)
    os.close(status_w)
    cap = limits.max_output_bytes
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray(), status_r: bytearray()}
    truncated = {out_fd: False, err_fd: False}
    pending = stdin.encode("utf-8")
    selector = selectors.DefaultSelector()
    for fd in buffers:
        selector.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    if pending:
        os.set_blocking(stdin_fd, False)
        selector.register(stdin_fd, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    deadline = start + limits.wall_time_s
    killed_for = None
    open_reads = set(buffers)
    try:
        while open_reads and killed_for is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_for = "timeout"
                break
            for key, _ in selector.select(remaining):
                fd = key.fd
                if fd == stdin_fd:
                    try:
                        written = os.write(fd, pending[:65536])
                        pending = pending[written:]
                    except BlockingIOError:
                        continue
                    except (BrokenPipeError, OSError):
                        pending = b""
                    if not pending:
                        selector.unregister(fd)
                        proc.stdin.close()
                    continue
                data = os.read(fd, 65536)
                if not data:
                    selector.unregister(fd)
                    open_reads.discard(fd)
                    continue
                buf = buffers[fd]
                if fd == status_r:
                    if len(buf) < (1 << 20):
                        buf += data
                    continue
                room = cap - len(buf)
                buf += data[: max(room, 0)]
                if len(data) > room:
                    truncated[fd] = True
                    killed_for = "output_limit"
                    break
    finally:
        if killed_for is not None:
            _kill(proc, cgroup)
        selector.close()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass
        os.close(status_r)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _kill(proc, cgroup)
            proc.wait()
    elapsed = time.monotonic() - start
    stdout = bytes(buffers[out_fd]).decode("utf-8", "replace")
    stderr = bytes(buffers[err_fd]).decode("utf-8", "replace")
    report = _parse_status(bytes(buffers[status_r]))
    status, returncode, sig, violations, cpu = _classify(report, proc.returncode, killed_for, limits, cgroup)
    return SandboxResult(
        status=status,
        stdout=stdout,
        stderr=stderr,
        returncode=returncode,
        isolation=iso,
        violations=violations,
        stdout_truncated=truncated[out_fd],
        stderr_truncated=truncated[err_fd],
        signal=sig,
        wall_time_s=elapsed,
        cpu_time_s=cpu,
    )


def _parse_status(raw: bytes) -> dict[str, Any] | None:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def _classify(report, host_returncode, killed_for, limits, cgroup):
    """(status, returncode, signal, violations, cpu seconds) from the supervisor's report."""
    capped = cgroup is not None and cgroup.hit_max()
    cap_note = (f"process_limit: the cap of {limits.max_processes} processes was reached",) if capped else ()
    if report is None:
        if killed_for is not None:
            return killed_for, None, signal.SIGKILL, cap_note, None
        detail = "" if host_returncode is None else f" (exit {host_returncode})"
        return "sandbox_error", host_returncode, None, ("sandbox: no status from the supervisor" + detail,), None
    # The events came through the program's process: it could have forged them, so trust no field's shape.
    events = [e for e in report.get("events", []) if isinstance(e, dict)]
    violations = tuple(f"{e.get('kind')}: {e.get('detail', '')}" for e in events if e.get("event") == "violation")
    violations += cap_note
    exceptions = [e for e in events if e.get("event") == "exception"]
    setup_error = next((e for e in events if e.get("event") == "setup_error"), None)
    sig = report.get("signal")
    returncode = report.get("returncode")
    cpu = report.get("cpu_s")
    if killed_for is not None:
        return killed_for, None, signal.SIGKILL, violations, cpu
    if setup_error is not None:
        return "sandbox_error", returncode, sig, violations + (f"sandbox: {setup_error.get('detail')}",), cpu
    if sig is not None:
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu is not None and cpu >= limits.cpu_time_s):
            status = "cpu_time"
        elif sig == signal.SIGXFSZ:
            status = "file_size"
        else:
            status = "error"
        return status, None, sig, violations, cpu
    if returncode == 0:
        return "ok", 0, None, violations, cpu
    status = exceptions[0].get("kind", "error") if exceptions else "error"
    if status not in STATUSES:
        status = "error"
    if status == "error" and capped:
        status = "process_limit"
    return status, returncode, None, violations, cpu


# ----------------------------------------------------------------------------- child side
# Everything below runs in the sandbox's interpreter (`python -I sandbox.py config.json`),
# which imports only the standard library.


class SandboxViolation(PermissionError):
    """Raised inside the sandbox when the audit hook refuses an operation; `.kind` is its status."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"sandbox refused {detail} ({kind})")
        self.kind = kind


class SandboxImportViolation(ImportError):
    """A refused module load (an ImportError, so `try: import x except ImportError` still works)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"sandbox refused {detail} ({kind})")
        self.kind = kind


def _mount_tmpfs(path: str, size_bytes: int) -> None:
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    options = f"size={size_bytes},mode=0700".encode()
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        raise OSError(ctypes.get_errno(), f"mount tmpfs on {path}")


def _apply_landlock(abi: int, workdir: str, read_roots: list[str]) -> None:
    """Writes only under `workdir`; read/exec only under `read_roots`; no TCP; scoped signals/sockets."""
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
    read = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR
    file_write = _FS_WRITE_FILE | _FS_READ_FILE | (_FS_TRUNCATE if abi >= 3 else 0)
    rules = [(root, read) for root in read_roots] + [(workdir, fs), ("/dev/null", file_write)]
    rules += [(device, _FS_READ_FILE) for device in _DEVICES]
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


def _set_rlimits(config: dict[str, Any]) -> None:
    import resource

    cpu = config["cpu_time_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_size_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config["namespaces"]:
        # Counted per (fresh) user namespace; binds only a non-root caller (see the module docstring).
        resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"],) * 2)


_PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen")
_NETWORK_EVENTS = (
    "socket.connect",
    "socket.bind",
    "socket.sendto",
    "socket.sendmsg",
    "socket.getaddrinfo",
    "socket.gethostbyname",
    "socket.gethostbyaddr",
    "socket.getnameinfo",
)
_PATH_EVENTS = {
    # audit event -> (indices of the paths it writes, indices of its dir_fd arguments; -1 when unused)
    "os.remove": ((0,), (1,)),
    "os.rmdir": ((0,), (1,)),
    "os.mkdir": ((0,), (2,)),
    "os.rename": ((0, 1), (2, 3)),
    "os.link": ((0, 1), (2, 3)),
    "os.chmod": ((0,), (2,)),
    "os.chown": ((0,), (3,)),
    "os.truncate": ((0,), ()),
    "os.utime": ((0,), (3,)),
    "os.mkfifo": ((0,), (2,)),
    "os.mknod": ((0,), (3,)),
    "os.setxattr": ((0,), ()),
    "os.removexattr": ((0,), ()),
    "os.chflags": ((0,), ()),
    "os.lchflags": ((0,), ()),
    "shutil.copyfile": ((1,), ()),
    "shutil.copymode": ((1,), ()),
    "shutil.copystat": ((1,), ()),
    "shutil.copytree": ((1,), ()),
    "shutil.move": ((0, 1), ()),
    "shutil.rmtree": ((0,), ()),
    "shutil.chown": ((0,), ()),
    "tempfile.mkstemp": ((0,), ()),
    "tempfile.mkdtemp": ((0,), ()),
    "sqlite3.connect": ((0,), ()),
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_NO_PROCESS_STAND_INS = ("_posixsubprocess",)
"""Where processes are refused, these modules are stand-ins whose functions raise the refusal
(`_posixsubprocess.fork_exec` forks without an audit event), and loading the real ones is refused;
`import subprocess` still works (sympy imports it), `subprocess.run` is refused."""
_CTYPES_EVENTS = (
    "ctypes.dlopen",
    "ctypes.dlsym",
    "ctypes.dlsym/handle",
    "ctypes.call_function",
    "ctypes.cdata",
    "ctypes.string_at",
    "ctypes.wstring_at",
    "ctypes.PyObj_FromPtr",
)


def _make_audit_hook(root: str, report_fd: int, processes_allowed: bool, read_roots: tuple[str, ...]):
    """The refusal layer (see the module docstring).

    Everything the hook uses is bound as a default argument (no module globals, no
    closure cells, exact `str` copies of paths), and changing the `__code__` /
    `__defaults__` of a function defined in this file is itself refused, so the
    program cannot rewire it from Python.
    """
    import builtins
    import stat

    def hook(
        event,
        args,
        _root=root,
        _read_roots=tuple(read_roots),
        _devices=_DEVICES,
        _device_links=_DEVICE_LINKS,
        _proc_refused=_PROC_REFUSED,
        _fd=report_fd,
        _allow_proc=processes_allowed,
        _violation=SandboxViolation,
        _process_events=_PROCESS_EVENTS,
        _network_events=_NETWORK_EVENTS,
        _path_events=_PATH_EVENTS,
        _write_flags=_WRITE_FLAGS,
        _stand_ins=_NO_PROCESS_STAND_INS,
        _ctypes_events=_CTYPES_EVENTS,
        _getcwd=os.getcwd,
        _getpid=os.getpid,
        _fspath=os.fspath,
        _stat=os.stat,
        _isdir=stat.S_ISDIR,
        _write=os.write,
        _dumps=json.dumps,
        _isinstance=builtins.isinstance,
        _getattr=builtins.getattr,
        _str=builtins.str,
        _str_add=builtins.str.__add__,
        _bytes=builtins.bytes,
        _bytes_add=builtins.bytes.__add__,
        _int=builtins.int,
        _len=builtins.len,
        _repr=builtins.repr,
        _import_violation=SandboxImportViolation,
        _filename=__file__,
        _af_unix=1,
    ):
        def refuse(kind, detail, exc=None):
            try:
                _write(_fd, _str.encode(_dumps({"event": "violation", "kind": kind, "detail": detail}) + "\n"))
            except OSError:
                pass
            raise (exc if exc is not None else _violation(kind, detail))

        def normalise(path):
            """Absolute, `..`-free path as an exact str (None for a file descriptor)."""
            if _isinstance(path, _int):
                return None
            path = _fspath(path)
            if _isinstance(path, _bytes):
                path = _bytes.decode(_bytes_add(b"", path), "utf-8", "surrogateescape")
            path = _str_add("", path)
            if not _str.startswith(path, "/"):
                path = _str_add(_str_add(_getcwd(), "/"), path)
            parts = []
            for part in _str.split(path, "/"):
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if parts:
                        parts.pop()
                    continue
                parts.append(part)
            return "/" + "/".join(parts)

        def under(path, top):
            return path == top or _str.startswith(path, top + "/")

        def inside(path):
            return path is None or under(path, _root)

        def readable(path):
            if _str.startswith(path, "/proc/"):
                head = _str.split(path[6:], "/")[0]
                return not (_str.isdigit(head) and _int(head) != _getpid()) and head not in _proc_refused
            if _str.startswith(path, "/dev/"):
                return path in _devices or any(under(path, link) for link in _device_links)
            return any(under(path, top) for top in _read_roots)

        if event == "open":
            path, mode, flags = args[0], args[1], args[2]
            norm = normalise(path)
            writing = (_isinstance(flags, _int) and flags & _write_flags) or (
                _isinstance(mode, _str) and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)
            )
            if not inside(norm):
                if writing and norm != "/dev/null":
                    refuse("filesystem", f"writing {norm}")
                if not readable(norm):
                    refuse("filesystem", f"reading {norm}")
                try:
                    is_dir = _isdir(_stat(norm).st_mode)
                except (OSError, ValueError):
                    is_dir = False
                if is_dir:  # a directory descriptor outside would let dir_fd-relative writes escape
                    refuse("filesystem", f"opening the directory {norm}")
        elif event in _path_events:
            path_indices, dir_fd_indices = _path_events[event]
            for index in dir_fd_indices:
                if index < _len(args) and args[index] is not None and args[index] != -1:
                    refuse("filesystem", f"{event} relative to a directory descriptor")
            for index in path_indices:
                if index < _len(args) and not inside(normalise(args[index])):
                    refuse("filesystem", f"{event} on {normalise(args[index])}")
        elif event == "os.symlink":
            refuse("filesystem", "creating a symlink")
        elif event in _network_events:
            refuse("network", f"{event} {_repr(args[1:] if event != 'socket.getaddrinfo' else args[:2])[:120]}")
        elif event == "socket.__new__":
            if args[1] != _af_unix:
                refuse("network", f"creating a socket of address family {args[1]}")
        elif event in _process_events:
            if not _allow_proc:
                refuse("process_limit", f"{event} (no process creation in this sandbox)")
        elif event == "os.kill" or event == "os.killpg":
            if not _allow_proc and args[0] != _getpid():
                refuse("forbidden", f"{event} of pid {args[0]}")
        elif event == "import":
            if not _allow_proc and args[0] in _stand_ins:
                message = f"loading {args[0]} (no process creation in this sandbox)"
                refuse("process_limit", message, _import_violation("process_limit", message))
        elif event in _ctypes_events:
            # ctypes' types stay usable (sympy needs them); calling, loading and raw memory do not.
            if not _allow_proc and not (event == "ctypes.dlopen" and args[0] is None):
                refuse("forbidden", f"{event} (no foreign calls in this sandbox)")
        elif event == "sqlite3.enable_load_extension" or event == "sqlite3.load_extension":
            refuse("forbidden", event)
        elif event == "object.__setattr__" or event == "object.__delattr__":
            code = _getattr(args[0], "__code__", None)
            if (
                args[1] in ("__code__", "__defaults__", "__kwdefaults__")
                and code is not None
                and _getattr(code, "co_filename", None) == _filename
            ):
                refuse("forbidden", "changing the sandbox's functions")

    return hook


def _classify_exception(exc: BaseException, process_attempted: bool) -> str:
    import errno

    # A refusal may come wrapped (urllib's URLError(reason=...), `raise ... from`): look through the chain.
    pending, seen = [exc], set()
    while pending:
        current = pending.pop()
        if id(current) in seen or len(seen) > 50:
            continue
        seen.add(id(current))
        if isinstance(current, (SandboxViolation, SandboxImportViolation)):
            return current.kind
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        pending.extend(x for x in linked if isinstance(x, BaseException))
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError):
        if exc.errno in (errno.EFBIG, errno.ENOSPC, errno.EDQUOT):
            return "file_size"
        if exc.errno == errno.EAGAIN and process_attempted:
            return "process_limit"
        if exc.errno in (errno.ENETUNREACH, errno.ECONNREFUSED, errno.EHOSTUNREACH):
            return "network"
    return "error"


def _refused_fork_exec(*args, _audit=sys.audit):
    """`_posixsubprocess.fork_exec` where processes are refused: raises the audit hook's refusal."""
    _audit("subprocess.Popen", "_posixsubprocess.fork_exec", None, None, None)
    raise SandboxViolation("process_limit", "_posixsubprocess.fork_exec")


def _install_stand_ins() -> None:
    import types

    for name in _NO_PROCESS_STAND_INS:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
    stand_in = types.ModuleType("_posixsubprocess", "Stand-in: process creation is refused in this sandbox.")
    stand_in.fork_exec = _refused_fork_exec
    sys.modules["_posixsubprocess"] = stand_in
    for name in ("subprocess", "multiprocessing"):  # re-imported against the stand-in
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


def _format_exception(exc: BaseException) -> str:
    """The program's traceback without the sandbox's own frames."""
    import traceback

    formatted = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    seen = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list([f for f in current.stack if f.filename != __file__])
        pending.extend(x for x in (current.__cause__, current.__context__) if x is not None)
    return "".join(formatted.format())


def _worker(config: dict[str, Any], report_fd: int) -> None:
    """The user program's process: limits, Landlock, audit hook, then `exec(code)`. Never returns."""
    import builtins
    import linecache
    import traceback  # noqa: F401 - imported before the limits, used by _format_exception
    import types

    def report(payload):
        try:
            os.write(report_fd, (json.dumps(payload) + "\n").encode())
        except OSError:
            pass

    workdir = config["workdir"]
    try:
        os.chdir(workdir)
        if config["landlock_abi"]:
            _apply_landlock(config["landlock_abi"], workdir, config["read_roots"])
        _set_rlimits(config)
        if not config["processes_allowed"]:
            _install_stand_ins()
        sys.addaudithook(_make_audit_hook(workdir, report_fd, config["processes_allowed"], config["read_roots"]))
    except BaseException as e:  # noqa: BLE001 - reported to the host as a sandbox failure
        report({"event": "setup_error", "detail": f"{type(e).__name__}: {e}"})
        os._exit(70)

    code = config.pop("code")
    filename = "<sandbox>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    process_attempted = [False]

    def track(event, args):
        if event in _PROCESS_EVENTS:
            process_attempted[0] = True

    sys.addaudithook(track)
    returncode = 0
    try:
        exec(compile(code, filename, "exec"), main.__dict__)  # noqa: S102 - running it is the point
    except SystemExit as e:
        if e.code is None:
            returncode = 0
        elif isinstance(e.code, int):
            returncode = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            returncode = 1
    except BaseException as e:  # noqa: BLE001 - the program's uncaught exception
        report({"event": "exception", "kind": _classify_exception(e, process_attempted[0]), "type": type(e).__name__})
        try:
            sys.stderr.write(_format_exception(e))
        except BaseException:  # noqa: BLE001, S110 - nothing left to report to
            pass
        returncode = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a closed stream has nothing to flush
            pass
    os._exit(returncode)


def _read_available(fd: int, into: bytearray, cap: int = 1 << 20) -> bool:
    """Reads what `fd` has without blocking; False at end of file."""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        if len(into) < cap:
            into += chunk[: cap - len(into)]


def _supervise(config_path: str) -> None:
    """The sandbox's first process (pid 1 of the namespace): forks the worker, waits, reports.

    Its exit ends the namespace, which kills every process the program left behind.
    """
    import select

    with open(config_path) as f:
        config = json.load(f)
    status_fd = config["status_fd"]
    events: list[dict[str, Any]] = []
    workdir = config["workdir"]
    if config["namespaces"]:
        try:
            _mount_tmpfs(workdir, config["disk_bytes"])
        except OSError as e:
            events.append({"event": "note", "detail": f"no tmpfs working directory: {e}"})
    os.chdir(workdir)
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        os.close(status_fd)
        _worker(config, report_w)
    os.close(report_w)
    os.set_blocking(report_r, False)
    raw = bytearray()
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    reading = True
    while True:
        # Descendants (of a fork bomb, say) may hold the report pipe after the worker exits:
        # wait for the worker, not for the end of the pipe.
        waiting = [report_r] if reading else []
        if pidfd is not None:
            waiting.append(pidfd)
        ready, _, _ = select.select(waiting, [], [], 0.05 if pidfd is None or not waiting else None)
        if report_r in ready:
            reading = _read_available(report_r, raw)
        finished, status, rusage = os.wait4(pid, os.WNOHANG)
        if finished:
            break
    _read_available(report_r, raw)
    for line in bytes(raw).decode("utf-8", "replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and len(events) < 100:
            events.append(event)
    result = {
        "returncode": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
        "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        "cpu_s": rusage.ru_utime + rusage.ru_stime,
        "events": events,
    }
    os.write(status_fd, json.dumps(result).encode())
    os.close(status_fd)
    os._exit(0)


if __name__ == "__main__":
    _supervise(sys.argv[1])
