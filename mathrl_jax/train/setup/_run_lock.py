"""One run per run directory: an advisory lock (`fcntl.flock`) on `run_dir/.lock`, held until the process ends.

Two runs writing one directory would interleave checkpoints, metrics and exports (one dies on the other's
temporary checkpoint directory). The kernel drops the lock with its process, killed or not, so a crashed run
never leaves a stale lock; the file keeps the holder's pid for the refusal message. Written here because the
standard library's `fcntl` is the whole mechanism (no kept library adds to it); `flock` does not lock across
NFS clients on every system, which the message of `acquire_run_dir` cannot detect.
"""

from __future__ import annotations

import errno
import fcntl
import os
from typing import Dict

from mathrl_jax.errors import fail
from mathrl_jax.train import run_directory

LOCK_NAME = run_directory.LOCK
_HELD: Dict[str, int] = {}  # real path of a run dir -> the descriptor holding its lock (this process)


def acquire_run_dir(run_dir: str) -> None:
    """Locks `run_dir` (created if missing) for this process; a second process gets `TrainingError` naming the
    holder. Taking it again in the same process is a no-op (a resumed run built twice in one interpreter). A run
    dir that cannot be written (a read-only file system, no permission, a full disk) is a `TrainingError` naming
    it: the lock is the run's first write."""
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as error:
        _unwritable(run_dir, error)
    key = os.path.realpath(run_dir)
    if key in _HELD:
        return
    path = os.path.join(run_dir, LOCK_NAME)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            _unwritable(run_dir, error)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            fail(
                f"run_dir {run_dir!r} is in use by another run (process {holder} holds {path}): wait for it to "
                "end, or use another --config.run_dir"
            )
        try:  # the file locked is still the one at `path` (a releasing run unlinks it): else lock the new one
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except OSError as error:
        os.close(fd)
        _unwritable(run_dir, error)
    _HELD[key] = fd


def _unwritable(run_dir: str, error: OSError) -> None:
    where = f" ({error.filename})" if error.filename and os.fspath(error.filename) != os.fspath(run_dir) else ""
    fail(
        f"cannot write the run dir {run_dir}: {error.strerror or error}{where}; give a writable --config.run_dir "
        "(a run writes its checkpoints, metrics and model there)"
    )


def release_run_dir(run_dir: str) -> None:
    """Gives up this process's lock of `run_dir` and removes the lock file: when a run ends (`loop.train`), and
    for a run that stops on bad input before writing anything else, so the directory is left as it was."""
    fd = _HELD.pop(os.path.realpath(run_dir), None)
    if fd is None:
        return
    try:
        os.unlink(os.path.join(run_dir, LOCK_NAME))
    except FileNotFoundError:
        pass
    os.close(fd)  # after the unlink: a waiting run never locks a file that is about to vanish
