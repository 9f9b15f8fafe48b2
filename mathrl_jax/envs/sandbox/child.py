"""The sandbox's entry script: everything that runs inside, in the sandbox's own interpreter.

The host runs `python -I -B -u [-S] .../sandbox/child.py config.json` (under `unshare`
when namespaces are available). `_supervise` is that interpreter: the namespace's first
process (pid 1), it mounts the working directory's tmpfs, forks `_worker`, waits for it
and writes the outcome to the host's status pipe; its exit ends the namespace. `_worker`
is the user program's process: a uid that owns nothing, Landlock, rlimits, seccomp, the audit
hook, then `exec(code)`.

Only the standard library is imported here: `subprocess` (and with it `_posixsubprocess`,
which forks without an audit event) must never be loaded on this side. The child-side
siblings (`audit.py`, `extension_guard.py`, `landlock.py`, `private_root.py`, `privileges.py`,
`seccomp.py`) are loaded by path: `python -I` puts no script directory on `sys.path`, and
importing the package would load the host side too.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

if __package__:  # imported from the package, which re-exports the exception classes below
    from mathrl_jax.envs.sandbox import audit, extension_guard, landlock, private_root, privileges, seccomp
else:  # run by path as the sandbox's entry script (see the module docstring)
    import importlib.util

    def _load_sibling(name: str):
        """This file's sibling `<name>.py`, kept out of `sys.modules` so the program's imports never find it."""
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(f"_mathrl_sandbox_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    audit = _load_sibling("audit")
    extension_guard = _load_sibling("extension_guard")
    landlock = _load_sibling("landlock")
    private_root = _load_sibling("private_root")
    privileges = _load_sibling("privileges")
    seccomp = _load_sibling("seccomp")


# The refusals are defined here, in the script that runs as `__main__`, so that the program's
# traceback names them bare (`SandboxViolation: sandbox refused ...`); the audit hook is given them.


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


# ----------------------------------------------------------------------------- kernel limits


def _set_rlimits(config: dict[str, Any]) -> None:
    import resource

    cpu = config["cpu_time_s"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (config["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (config["file_size_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (config["max_open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if config["namespaces"] and config["unprivileged_id"] is None:
        # Counted per (fresh) user namespace; binds only a non-root caller (see cgroup.py). Not for
        # `SANDBOX_ID`: every run shares that uid, and the count is per uid; the pids cgroup caps each run.
        resource.setrlimit(resource.RLIMIT_NPROC, (config["max_processes"],) * 2)


# ----------------------------------------------------------------------------- the user program's process


def _classify_exception(exc: BaseException, process_attempted: bool) -> str:
    """The status (one of `STATUSES`) that the program's uncaught `exc` stands for."""
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
    """Replaces `_posixsubprocess` by a stand-in that refuses, and unloads what imported the real one."""
    import types

    for name in audit.NO_PROCESS_STAND_INS:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]
    stand_in = types.ModuleType("_posixsubprocess", "Stand-in: process creation is refused in this sandbox.")
    stand_in.fork_exec = _refused_fork_exec
    sys.modules["_posixsubprocess"] = stand_in
    for name in ("subprocess", "multiprocessing"):  # re-imported against the stand-in
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


def _format_exception(exc: BaseException) -> str:
    """The program's traceback without the sandbox's own frames (those of any file in `audit.SOURCE_DIR`)."""
    import traceback

    # lookup_lines=False: source lines are read when formatting, after the sandbox's own frames are cut, so the
    # traceback never asks the audit hook for the sandbox's files (which would read as refusals).
    formatted = traceback.TracebackException(type(exc), exc, exc.__traceback__, lookup_lines=False)
    seen = set()
    pending = [formatted]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        current.stack = traceback.StackSummary.from_list(
            [f for f in current.stack if not f.filename.startswith(audit.SOURCE_DIR)]
        )
        pending.extend(x for x in (current.__cause__, current.__context__) if x is not None)
    return "".join(formatted.format())


def _die_with_parent(supervisor: int) -> None:
    """SIGKILL this process when the supervisor dies (the host's kill at the time limit ends the supervisor;
    seccomp keeps the program from undoing this or leaving the process group). Exits if it died already."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != supervisor:
        os._exit(70)


def _worker(config: dict[str, Any], report_fd: int, supervisor: int) -> None:
    """The user program's process: its own uid, limits, Landlock, seccomp, audit hook, then `exec(code)`.
    Never returns."""
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
        if config["unprivileged_id"] is not None:
            # First: a change of credentials clears the parent-death signal set below.
            privileges.drop_privileges(config["unprivileged_id"], config["read_roots"])
        else:  # the caller's uid (the root of a user namespace, say): without its capabilities
            privileges.drop_capabilities()
        _die_with_parent(supervisor)
        os.chdir(workdir)
        privileges.set_no_new_privs()  # also where neither Landlock nor seccomp runs (they set it too)
        if config["seccomp"]:
            seccomp.load_library()  # opened before Landlock and the rlimits narrow what may be read and mapped
        if config["landlock_abi"]:
            read_roots = config["read_roots"]
            if not config["namespaces"]:  # /proc shows the host's processes (their `environ`): only our own entries
                read_roots = [r for r in read_roots if r != "/proc"] + [f"/proc/{os.getpid()}"]
            landlock.apply_landlock(
                config["landlock_abi"],
                workdir,
                read_roots,
                audit.DEVICES,
                allow_execute=config["processes_allowed"],
            )
        _set_rlimits(config)
        if config["seccomp"]:
            seccomp.apply_seccomp(os.getpid(), config["processes_allowed"], config["threads_allowed"])
        if not config["processes_allowed"]:
            _install_stand_ins()
            # Native code spawns without audit events: only the standard library's extensions load.
            standard_extensions = [p for p in sys.path if os.path.basename(p) == "lib-dynload"]
            extension_guard.install_extension_guard(standard_extensions, report_fd, SandboxImportViolation)
        hook = audit.make_audit_hook(
            workdir,
            report_fd,
            config["processes_allowed"],
            config["read_roots"],
            SandboxViolation,
            SandboxImportViolation,
        )
        sys.addaudithook(hook)
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

    def track(event, args, _process_events=audit.PROCESS_EVENTS):
        if event in _process_events:
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
    # The private root's directories are made here: never with the caller's umask (027 would close them to the
    # program's uid, which would then keep CAP_DAC_READ_SEARCH to read its own interpreter, or fail to start).
    os.umask(0o022)
    if config["namespaces"]:
        try:
            private_root.enter_private_root(config, audit.DEVICES, audit.DEVICE_LINKS)
        except OSError as e:  # fail closed: without its own root the program could reach host sockets
            failure = {"event": "setup_error", "detail": f"could not build the sandbox's root file system: {e}"}
            report = {"returncode": None, "signal": None, "cpu_s": 0.0, "events": [failure]}
            os.write(status_fd, json.dumps(report).encode())
            os._exit(70)
    os.chdir(workdir)
    report_r, report_w = os.pipe()
    supervisor = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(report_r)
        os.close(status_fd)
        _worker(config, report_w, supervisor)
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


def _probe_private_root(base: str, read_roots: list[str]) -> None:
    """`child.py --probe-root BASE ROOTS` (under `unshare`, from `isolation.detect_isolation`): builds a private
    root as a run would, in BASE; exits 0 when it could, 1 otherwise."""
    os.umask(0o022)
    try:
        private_root.enter_private_root(
            {
                "workdir": os.path.join(base, "work"),
                "read_roots": read_roots,
                "disk_bytes": 1 << 20,
                "read_only_roots": True,
            },
            audit.DEVICES,
            audit.DEVICE_LINKS,
        )
        os.listdir("/")
    except OSError:
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    if sys.argv[1] == "--probe-root":
        _probe_private_root(sys.argv[2], json.loads(sys.argv[3]))
    _supervise(sys.argv[1])
