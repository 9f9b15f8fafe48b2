"""Files written whole or not at all: a reader (or a crash) never sees half of one.

The standard library has the parts (a temporary file in the same directory, `os.fsync`, `os.replace`, which is
atomic on POSIX) but no helper that puts them together; this is that helper, used for every file the package
rewrites, and for directories written whole (an exported model). Each writer gets a temporary name of its own,
so two writers of one path never clash: the last `os.replace` wins, whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import uuid
from typing import IO, Any, Callable, Iterator


def _unique() -> str:
    """This writer's part of a temporary name: host, pid (to find it again) and a random tail."""
    return f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"


def remove_stale_temporaries(directory: str, name: str) -> None:
    """Removes the temporaries of `name` that a writer on this host left when it was killed (its pid is gone):
    a killed export would otherwise leave a whole model's copy behind at every try."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.{re.escape(socket.gethostname())}\.(\d+)\.[0-9a-f]{{12}}\.(tmp|old)$")
    try:
        entries = os.listdir(directory)
    except OSError:
        return
    for entry in entries:
        found = pattern.match(entry)
        if found is None or _alive(int(found.group(1))):
            continue
        stale = os.path.join(directory, entry)
        if os.path.isdir(stale) and not os.path.islink(stale):
            shutil.rmtree(stale, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Yields a file opened on a fresh temporary name beside `path`; on a clean exit it is flushed, synced and
    renamed over `path`; on an exception it is removed and `path` is left as it was.

    The temporary file is created with `open(..., "x")`, so it takes the process's umask, as `path` would.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write mode {mode!r}; expected 'w' or 'wb'")
    directory, name = os.path.split(os.path.abspath(path))
    remove_stale_temporaries(directory, name)
    temporary = os.path.join(directory, f".{name}.{_unique()}.tmp")
    binary = mode == "wb"
    try:
        with open(temporary, "xb" if binary else "x", encoding=None if binary else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


def write_json(path: str, value: Any, **dump_options) -> None:
    """`value` as JSON at `path`, whole or not at all (`json.dump`'s options, e.g. `indent=2`)."""
    with atomic_write(path) as f:
        json.dump(value, f, **dump_options)


def write_directory(
    directory: str, write: Callable[[str], None], check_existing: Callable[[str], None] | None = None
) -> None:
    """`write(tmp)` fills a fresh sibling of `directory`, which is then renamed to `directory`: a crash leaves the
    old directory or the new one, never half of either.

    An existing `directory` is moved aside, replaced, and removed only once the new one is in place; if the swap
    fails it is put back. `check_existing(directory)` runs just before an existing one is replaced and may raise
    to keep it (e.g. a non-empty export directory without `--force`). The new directory takes the umask.
    """
    directory = os.path.abspath(directory)
    parent, name = os.path.split(directory)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(parent, name)
    unique = _unique()
    temporary, aside = os.path.join(parent, f".{name}.{unique}.tmp"), os.path.join(parent, f".{name}.{unique}.old")
    os.mkdir(temporary)
    moved = False
    try:
        write(temporary)
        if os.path.isdir(directory):
            if check_existing is not None:
                check_existing(directory)
            os.replace(directory, aside)
            moved = True
        os.replace(temporary, directory)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        if moved and not os.path.exists(directory):
            os.replace(aside, directory)  # put the previous one back
        raise
    finally:
        shutil.rmtree(aside, ignore_errors=True)
