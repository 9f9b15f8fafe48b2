"""The native extension guard: where processes are refused, only the standard library's extension modules load.

Standard library only, and no imports of its siblings: `child.py` loads this file by path.
"""

from __future__ import annotations

import json
import os

_MAX_SYMLINKS = 40  # as the kernel's path walk (ELOOP), and as `audit._MAX_SYMLINKS`

STANDARD_EXTENSIONS = frozenset(
    """
    _asyncio _bisect _blake2 _bz2 _codecs_cn _codecs_hk _codecs_iso2022 _codecs_jp _codecs_kr _codecs_tw
    _contextvars _crypt _csv _ctypes _datetime _decimal _elementtree _hashlib _heapq _hmac _json _lsprof _lzma
    _md5 _multibytecodec _opcode _pickle _queue _random _sha1 _sha2 _sha256 _sha3 _sha512 _socket _ssl
    _statistics _struct _typing _uuid _zoneinfo _zstd array audioop binascii cmath fcntl grp math mmap pyexpat
    resource select termios unicodedata zlib
    """.split()
)
"""The native extension modules a program may load where processes are refused (from `lib-dynload` only).

Each is computation, or acts through calls that raise audit events (sockets, `mmap`, `ctypes`, `fcntl`).
Left out on purpose: `_tkinter` (Tcl's `exec` and `open` run without audit events), `_sqlite3` (`ATTACH`
and `VACUUM INTO` write files without one), `_dbm` / `_gdbm` and `_posixshmem` (files without `open`
events), `_posixsubprocess` (forks unaudited), `_multiprocessing`, `_curses`, `readline`, `nis`, `spwd`,
`syslog`, `ossaudiodev`, CPython's test and example modules (`_testcapi` runs code in a sub-interpreter,
which has no audit hook; `_xxsubinterpreters` too), and every module a later CPython adds until it is
reviewed and named here."""


# ----------------------------------------------------------------------------- native extension modules


def install_extension_guard(allowed_dirs: list[str], report_fd: int, import_violation: type[ImportError]) -> None:
    """Where processes are refused, loads native extension modules only from the standard library's `lib-dynload`.

    Native code is outside the audit hook's sight: an installed extension can fork, exec or
    connect without a single audit event (uvloop spawns a shell through libuv). The audit
    hook has no event for loading one (`dlopen` of an extension raises none), so the single
    function that loads them, `_imp.create_dynamic`, is replaced by a guard; `_imp.create_builtin`
    is guarded too, as it could make a fresh `_imp` module with the real function.

    An allow-list, not a deny-list of known spawners: the packages a program might find
    installed are open-ended (uvloop, gevent, psutil, pty helpers, any library linking
    libuv or calling `posix_spawn`), and a deny-list misses the next one. The standard
    library's extensions are a fixed set, reviewed one by one (`STANDARD_EXTENSIONS`: their
    process, file and network calls raise audit events); a module is loaded only when its
    name is listed there and its file lies in `lib-dynload`.

    The guard resolves the file's real path with C functions only and passes the loader a
    fresh spec of exact `str` copies (a program's spec object could answer differently on a
    second read). The real functions sit in the guards' defaults, which the audit hook keeps
    the program from reading, and `gc` introspection (which would find them) is refused.
    """
    import _imp
    import builtins
    import stat
    import types

    allowed = tuple(os.path.realpath(d) for d in allowed_dirs if os.path.isdir(d))

    # Every name the guards (and the hook) use is a default argument: `_imp.create_dynamic.__globals__` (readable
    # without an audit event) is this module's namespace, which the program could otherwise rebind (`any`, ...).
    def refuse(
        message,
        _fd=report_fd,
        _write=os.write,
        _dumps=json.dumps,
        _violation=import_violation,
        _str=str,
        _OSError=OSError,
    ):
        try:
            _write(_fd, _str.encode(_dumps({"event": "violation", "kind": "forbidden", "detail": message}) + "\n"))
        except _OSError:
            pass
        raise _violation("forbidden", message)

    def real_path(
        path,
        _lstat=os.lstat,
        _readlink=os.readlink,
        _islink=stat.S_ISLNK,
        _str=builtins.str,
        _list=builtins.list,
        _reversed=builtins.reversed,
        _getcwd=os.getcwd,
        _max_links=_MAX_SYMLINKS,
        _OSError=builtins.OSError,
        _ValueError=builtins.ValueError,
    ):
        """`os.path.realpath` with bound C functions only (the program could rebind posixpath's helpers)."""
        if not _str.startswith(path, "/"):
            path = _getcwd() + "/" + path
        pending, parts, links = _list(_reversed(_str.split(path, "/"))), [], 0
        while pending:
            part = pending.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if parts:
                    parts.pop()
                continue
            parts.append(part)
            current = "/" + "/".join(parts)
            try:
                is_link = _islink(_lstat(current).st_mode)
            except (_OSError, _ValueError):
                is_link = False
            if is_link:
                links += 1
                if links > _max_links:
                    return None
                target = _readlink(current)
                parts.pop()
                if _str.startswith(target, "/"):
                    parts = []
                pending.extend(_reversed(_str.split(target, "/")))
        return "/" + "/".join(parts)

    def create_dynamic(
        spec,
        file=None,
        _real_create_dynamic=_imp.create_dynamic,
        _allowed=allowed,
        _real_path=real_path,
        _standard=STANDARD_EXTENSIONS,
        _refuse=refuse,
        _namespace=types.SimpleNamespace,
        _str=builtins.str,
        _isinstance=builtins.isinstance,
        _getattr=builtins.getattr,
        _any=builtins.any,
        _repr=builtins.repr,
    ):
        name, origin = _getattr(spec, "name", None), _getattr(spec, "origin", None)
        if not (_isinstance(name, _str) and _isinstance(origin, _str)):
            _refuse(f"loading a native extension from the spec {_repr(spec)[:200]}")
        name, origin = _str.__add__("", name), _str.__add__("", origin)
        path = _real_path(origin)
        stem = _str.partition(_str.rpartition(path or "", "/")[2], ".")[0]
        if (
            path is None
            or not _any(_str.startswith(path, top + "/") for top in _allowed)
            or _str.rpartition(name, ".")[2] not in _standard
            or stem not in _standard
        ):
            _refuse(f"loading the native extension {name} from {origin} (only the standard library's are allowed)")
        return _real_create_dynamic(_namespace(name=name, origin=path))

    def create_builtin(
        spec,
        _real_create_builtin=_imp.create_builtin,
        _refuse=refuse,
        _namespace=types.SimpleNamespace,
        _str=builtins.str,
        _isinstance=builtins.isinstance,
        _getattr=builtins.getattr,
    ):
        name = _getattr(spec, "name", None)
        if not _isinstance(name, _str):
            _refuse("creating a built-in module from a spec without a name")
        name = _str.__add__("", name)
        if name == "_imp":  # a fresh `_imp` would carry the real create_dynamic
            _refuse(f"creating a fresh built-in module {name}")
        return _real_create_builtin(_namespace(name=name))

    _imp.create_dynamic = create_dynamic
    _imp.create_builtin = create_builtin
