"""The host side of a run: `run_python` starts the sandbox's entry script and collects what it writes.

It writes the run's config (code, limits, layers) to a private temporary directory,
starts `child.py` with a cleaned environment (under `unshare` and in fresh pids and
memory cgroups where available), feeds stdin, reads stdout / stderr / the supervisor's status
pipe up to `max_output_bytes` until the wall clock, kills whatever is left and removes
the directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from mathrl_jax.envs.sandbox import child
from mathrl_jax.envs.sandbox.cgroup import MemoryCgroup, PidsCgroup, RunCgroup, memory_cgroup_parent, pids_cgroup_parent
from mathrl_jax.envs.sandbox.cleanup import remove_tree
from mathrl_jax.envs.sandbox.isolation import readable_roots, require_isolation, unshare_flags
from mathrl_jax.envs.sandbox.limits import Isolation, SandboxLimits
from mathrl_jax.envs.sandbox.outcome import classify, parse_status
from mathrl_jax.envs.sandbox.privileges import SANDBOX_ID
from mathrl_jax.envs.sandbox.result import SandboxResult
from mathrl_jax.processes import descendants


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


def run_python(
    code: str,
    limits: SandboxLimits = SandboxLimits(),
    *,
    stdin: str = "",
    isolation: str | Isolation = "auto",
    site_packages: bool = True,
    allow_not_a_sandbox: bool = False,
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
      allow_not_a_sandbox: run even where the kernel cannot contain the program (no namespaces, and no
        Landlock or no seccomp: `Isolation.contains`), under the audit hook and whatever layers there are.
        That is not a sandbox: a program that switches the hook off reads and writes the host's files.

    Returns:
      a `SandboxResult`; it never raises for anything the program does.

    Raises:
      RuntimeError: a requested layer is missing here, or the isolation cannot contain the program and
        `allow_not_a_sandbox` is False.
    """
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}")
    iso = require_isolation(isolation, allow_not_a_sandbox)
    base = os.path.realpath(tempfile.mkdtemp(prefix="mathrl_sandbox_"))
    cgroup = memory = None
    try:
        if iso.pids_cgroup:
            try:
                # The supervisor and (with namespaces) `unshare` are tasks on top of the user program's.
                cgroup = PidsCgroup(pids_cgroup_parent(), limits.max_processes + (2 if iso.namespaces else 1))
            except OSError:  # the cgroup parent went away: run without it, and so without child processes
                iso = dataclasses.replace(iso, pids_cgroup=False)
        if iso.memory_cgroup:
            try:
                # cgroup v2 (one hierarchy): the limit goes on the run's pids cgroup, which the run is in already.
                v2 = cgroup is not None and os.path.exists(os.path.join(cgroup.path, "memory.max"))
                shared = cgroup if v2 else None
                memory = MemoryCgroup(memory_cgroup_parent(), limits.memory_bytes, within=shared)
            except OSError:  # the cgroup parent went away: RLIMIT_AS (per process) is left
                iso = dataclasses.replace(iso, memory_cgroup=False)
        workdir = os.path.join(base, "work")
        os.mkdir(workdir, 0o700)
        unprivileged_id = SANDBOX_ID if iso.unprivileged_uid else None
        if unprivileged_id is not None and not iso.namespaces:  # the program's own directory, on the host
            os.chown(workdir, unprivileged_id, unprivileged_id)
            os.chmod(base, 0o711)  # searchable, not listable: the config (0600) stays the supervisor's
        config_path = os.path.join(base, "config.json")
        python = [
            sys.executable,
            "-I",  # isolated: no PYTHON* variables, no user site, no script directory on sys.path
            "-B",  # no .pyc writes (they would be refused outside the working directory)
            "-u",
            *([] if site_packages else ["-S"]),
            os.path.abspath(child.__file__),  # the entry script
            config_path,
        ]
        command = python
        if iso.namespaces:
            command = [shutil.which("unshare") or "unshare", *unshare_flags(iso.unprivileged_uid), "--", *python]
        run_cgroups = [c for c in (cgroup, memory) if c is not None and (c is cgroup or c.owned)]
        if run_cgroups:  # the shell joins the run's cgroups, then becomes the sandbox: all its processes are in them
            joins = " && ".join(f'echo $$ > "${i + 1}"' for i in range(len(run_cgroups)))
            script = f'{joins} && shift {len(run_cgroups)} && exec "$@"'
            command = ["/bin/sh", "-c", script, "sandbox", *(c.procs for c in run_cgroups), *command]
        status_r, status_w = os.pipe()
        config = {
            "code": code,
            "workdir": workdir,
            "status_fd": status_w,
            "namespaces": iso.namespaces,
            "landlock_abi": iso.landlock_abi,
            "seccomp": iso.seccomp,
            "processes_allowed": iso.processes_allowed,
            "threads_allowed": iso.pids_cgroup,
            "unprivileged_id": unprivileged_id,
            "read_only_roots": iso.read_only_roots,
            "read_roots": readable_roots(),
            "cpu_time_s": limits.cpu_time_s,
            "memory_bytes": limits.memory_bytes,
            "file_size_bytes": limits.file_size_bytes,
            "disk_bytes": limits.disk_bytes,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
        }
        with open(os.open(config_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(config, f)
        result = _communicate(command, workdir, status_r, status_w, stdin, limits, iso, cgroup, memory)
    finally:
        for run_cgroup in (cgroup, memory):
            if run_cgroup is not None:
                run_cgroup.kill_all_and_remove()
        left = remove_tree(base)
    if left:  # never "ok" over data left on the host: say what stayed, and where
        detail = f"the sandbox's directory {base} could not be removed: {left}"
        return dataclasses.replace(result, status="sandbox_error", stderr=result.stderr + f"\n{detail}\n")
    return result


def _kill(proc, *cgroups: RunCgroup | None) -> None:
    """SIGKILLs every process of the run: the supervisor's descendants (children first: a killed child stays
    its living parent's zombie, so its pid cannot be reused before the parent is killed), wherever they moved
    (`setsid` where seccomp does not refuse it), the run's process group, and every process in its cgroups."""
    for pid in reversed(descendants(proc.pid)):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in {pid for c in cgroups if c is not None for pid in c.pids()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _communicate(command, workdir, status_r, status_w, stdin, limits, iso, cgroup, memory) -> SandboxResult:
    """Starts `command`, feeds `stdin`, reads stdout, stderr and the status pipe under the wall clock and output cap."""
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
            _kill(proc, cgroup, memory)
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
            _kill(proc, cgroup, memory)
            proc.wait()
    elapsed = time.monotonic() - start
    stdout = bytes(buffers[out_fd]).decode("utf-8", "replace")
    stderr = bytes(buffers[err_fd]).decode("utf-8", "replace")
    report = parse_status(bytes(buffers[status_r]))
    status, returncode, sig, violations, cpu = classify(report, proc.returncode, killed_for, limits, cgroup, memory)
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
