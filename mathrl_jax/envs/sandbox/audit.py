"""The audit hook (PEP 578): the refusal layer, which names what it refused.

The entry script (`child.py`) installs it in the user program's process, last, just
before the program runs. It refuses network calls, writes outside the working
directory, reads outside it and the system / interpreter directories, symlinks and,
wherever the kernel does not cap them, process creation and `ctypes` calls (see the
package docstring for why it is not a boundary on its own).

Paths are checked as the kernel will open them: `normalise` resolves symlinks and `..`
in order and follows `/proc/self` to the pid, so `/proc/self/root/<host path>` is
checked as `<host path>`, and a path through `/proc/<pid>/root`, `cwd` or `fd/<n>/...`
is refused. Where processes are refused, `extension_guard.install_extension_guard` lets
only the standard library's native extension modules load.

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
_PROC_MAGIC_LINKS = ("root", "cwd", "exe", "fd", "map_files", "ns")
"""Entries of `/proc/<pid>` (and `/proc/<pid>/task/<tid>`) that are the kernel's "magic links": opening a path
through them jumps to that process's root, working directory or open files, whatever its `readlink` text says,
so they are never followed when a path is resolved, and a path through them is refused (`/proc/self/fd/<n>`
itself, the target of `/dev/fd/<n>`, stays allowed: it reopens a file the program already holds)."""
_MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP)

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
_INTROSPECTION_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
"""Refused where processes are: they would hand the program the real `_imp.create_dynamic` behind the guard."""
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
        _proc_magic=_PROC_MAGIC_LINKS,
        _max_links=_MAX_SYMLINKS,
        _lstat=os.lstat,
        _readlink=os.readlink,
        _islink=stat.S_ISLNK,
        _list=builtins.list,
        _reversed=builtins.reversed,
        _introspection_events=_INTROSPECTION_EVENTS,
        _any=builtins.any,
        _OSError=builtins.OSError,
        _ValueError=builtins.ValueError,
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
            except _OSError:
                pass
            raise (exc if exc is not None else _violation(kind, detail))

        def absolute(path):
            """Absolute path as an exact str (None for a file descriptor); `..` and symlinks still in it."""
            if _isinstance(path, _int):
                return None
            path = _fspath(path)
            if _isinstance(path, _bytes):
                path = _bytes.decode(_bytes_add(b"", path), "utf-8", "surrogateescape")
            path = _str_add("", path)
            if not _str.startswith(path, "/"):
                path = _str_add(_str_add(_getcwd(), "/"), path)
            return path

        def normalise(path):
            """The path the kernel opens: symlinks resolved and `..` applied in order, as the kernel's walk does.

            A lexical check alone is fooled by `/proc/self/root/<host path>` (a link to `/`), by a symlink
            followed by `..`, and by `/proc/<pid>/root`: those are resolved here before anything is checked.
            `/proc/self` and `/proc/thread-self` are followed (to this process's pid); the magic links below
            `/proc/<pid>` are not (see `_PROC_MAGIC_LINKS`), so `readable` sees and refuses them. A component
            that does not exist (a file about to be created) is kept as it is. Only C functions bound at
            install time are used: the program could replace `os.path.realpath`'s helpers.
            """
            path = absolute(path)
            if path is None:
                return None
            pending = _list(_reversed(_str.split(path, "/")))
            parts = []
            links = 0
            magic = False  # the walk has entered one of /proc/<pid>'s magic links (fd/<n>, cwd, root, ...)
            while pending:
                part = _list.pop(pending)
                if part == "" or part == ".":
                    continue
                if part == "..":
                    if magic:  # the kernel goes up from where the link leads, not from its text: refuse
                        refuse("filesystem", f"resolving {path} (.. below a /proc magic link)")
                    if parts:
                        _list.pop(parts)
                    continue
                _list.append(parts, part)
                if parts[0] == "proc" and _len(parts) > 2:
                    rest = parts[2:]
                    if rest[0] == "task" and _len(rest) > 2:
                        rest = rest[2:]
                    if rest[0] in _proc_magic:
                        magic = True
                    continue  # below /proc/<pid>: magic links, never followed
                current = _str_add("/", _str.join("/", parts))
                try:
                    is_link = _islink(_lstat(current).st_mode)
                except (_OSError, _ValueError):
                    is_link = False
                if not is_link:
                    continue
                links += 1
                if links > _max_links:
                    refuse("filesystem", f"resolving {path} (too many symlinks)")
                target = _readlink(current)
                _list.pop(parts)
                if _str.startswith(target, "/"):
                    parts = []
                _list.extend(pending, _reversed(_str.split(target, "/")))
            return _str_add("/", _str.join("/", parts))

        def under(path, top):
            return path == top or _str.startswith(path, top + "/")

        def inside(path):
            return path is None or under(path, _root)

        def ours(filename):
            return _isinstance(filename, _str) and _str.startswith(filename, _sources)

        def readable_proc(path):
            """Only this process's own `/proc/<pid>` (never another's), and no path through its magic links."""
            parts = _str.split(path, "/")[2:]
            head = parts[0] if parts else ""
            if head in _proc_refused:
                return False
            if not _str.isdigit(head):
                return True  # /proc/meminfo, /proc/sys/...: `self` and `thread-self` were resolved to a pid
            if _int(head) != _getpid():
                return False
            rest = parts[1:]
            if _len(rest) >= 2 and rest[0] == "task":
                rest = rest[2:]
            if not rest or rest[0] not in _proc_magic:
                return True
            return rest[0] == "fd" and _len(rest) <= 2  # /proc/self/fd/<n> (/dev/fd/<n>): a file it already holds

        def readable(path):
            if path == "/proc" or _str.startswith(path, "/proc/"):
                return readable_proc(path)
            if _str.startswith(path, "/dev/"):
                return path in _devices or _any(under(path, link) for link in _device_links)
            return _any(under(path, top) for top in _read_roots)

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
                except (_OSError, _ValueError):
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
        elif event in _introspection_events:
            if not _allow_proc:
                refuse("forbidden", f"{event} (it would reach the sandbox's guarded functions)")
        elif event in _ctypes_events:
            # ctypes' types stay usable (sympy needs them); calling, loading and raw memory do not.
            if not _allow_proc and not (event == "ctypes.dlopen" and args[0] is None):
                refuse("forbidden", f"{event} (no foreign calls in this sandbox)")
        elif event == "sqlite3.enable_load_extension" or event == "sqlite3.load_extension":
            refuse("forbidden", event)
        elif event == "object.__getattr__":
            # The guards' defaults hold the functions they guard (see `extension_guard.install_extension_guard`).
            if args[1] in ("__defaults__", "__kwdefaults__") and not _allow_proc:
                code = _getattr(args[0], "__code__", None)
                if code is not None and ours(_getattr(code, "co_filename", None)):
                    refuse("forbidden", "reading the sandbox's functions' defaults")
        elif event == "object.__setattr__" or event == "object.__delattr__":
            code = _getattr(args[0], "__code__", None)
            if (
                args[1] in ("__code__", "__defaults__", "__kwdefaults__")
                and code is not None
                and ours(_getattr(code, "co_filename", None))
            ):
                refuse("forbidden", "changing the sandbox's functions")

    return hook
