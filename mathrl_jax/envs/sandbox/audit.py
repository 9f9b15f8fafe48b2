"""The audit hook (PEP 578): the refusal layer, which names what it refused.

The entry script (`child.py`) installs it in the user program's process, last, just
before the program runs. It refuses network calls, writes outside the working
directory, reads outside it and the system / interpreter directories, symlinks and,
wherever the kernel does not cap them, process creation and `ctypes` calls (see the
package docstring for why it is not a boundary on its own).

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
The host reads `READ_ROOTS` from here, so that both sides share one list.
"""

from __future__ import annotations

import json
import os

# ----------------------------------------------------------------------------- what the program may read
# Landlock enforces these too: the entry script passes them to `apply_landlock`.

READ_ROOTS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys")
"""System directories the sandboxed code may read and execute from (with the interpreter's prefixes).
Not /dev (raw disks): only `DEVICES` there; `/proc` only the sandbox's own processes (pid namespace / hook)."""
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
DEVICE_LINKS = ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr")  # -> /proc/self/fd
_PROC_REFUSED = ("kcore", "kmem", "mem", "kpagecount", "kpageflags", "kpagecgroup", "sysrq-trigger")

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""Prefix of the sandbox's own source files (this package's directory): their frames are cut from the program's
tracebacks, and their functions' code and defaults cannot be changed from the program."""

# ----------------------------------------------------------------------------- audit events

PROCESS_EVENTS = ("os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "subprocess.Popen")
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
NO_PROCESS_STAND_INS = ("_posixsubprocess",)
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


# ----------------------------------------------------------------------------- the hook


def make_audit_hook(
    root: str,
    report_fd: int,
    processes_allowed: bool,
    read_roots: tuple[str, ...],
    violation: type[PermissionError],
    import_violation: type[ImportError],
):
    """The refusal layer (see the module docstring).

    Each refusal is reported on `report_fd` and raised as `violation(kind, detail)`
    (`import_violation` for a refused module load). Both classes are the entry
    script's: it runs as `__main__`, so the program's traceback names them bare
    (`SandboxViolation: sandbox refused ...`), as Python does for `__main__`'s classes.

    Everything the hook uses is bound as a default argument (no module globals, no
    closure cells, exact `str` copies of paths), and changing the `__code__` /
    `__defaults__` of a function defined in the sandbox's files (`SOURCE_DIR`) is
    itself refused, so the program cannot rewire it from Python.
    """
    import builtins
    import stat

    def hook(
        event,
        args,
        _root=root,
        _read_roots=tuple(read_roots),
        _devices=DEVICES,
        _device_links=DEVICE_LINKS,
        _proc_refused=_PROC_REFUSED,
        _fd=report_fd,
        _allow_proc=processes_allowed,
        _violation=violation,
        _process_events=PROCESS_EVENTS,
        _network_events=_NETWORK_EVENTS,
        _path_events=_PATH_EVENTS,
        _write_flags=_WRITE_FLAGS,
        _stand_ins=NO_PROCESS_STAND_INS,
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
        _import_violation=import_violation,
        _sources=SOURCE_DIR,
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

        def ours(filename):
            return _isinstance(filename, _str) and _str.startswith(filename, _sources)

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
                and ours(_getattr(code, "co_filename", None))
            ):
                refuse("forbidden", "changing the sandbox's functions")

    return hook
