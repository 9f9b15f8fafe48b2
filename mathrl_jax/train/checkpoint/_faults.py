"""A failed checkpoint save in one line, for `train.checkpoint`: the error names the step that failed and its
directory, and what Orbax's threads log about the same failure is not printed beside it.

A save that meets a full disk fails in Orbax's background threads: each thread logs the error with its traceback
(absl's ERROR records), asyncio logs every write future whose error nobody retrieved ("exception was never
retrieved"), and TensorStore's callbacks, finding the event loop of the failed write closed, raise into
`sys.unraisablehook` ("Event loop is closed"): hundreds of lines for one `ENOSPC`. And the error surfaces where
the next save waits for the previous one, under the next step's number.

`SaveNoise` holds those records back while a save is in flight: if the save succeeds they are printed after all
(nothing that was not about a failure is hidden); if it fails they are dropped, the failure being reported once
by the `CheckpointError` that `save_failure` words. Written here because neither Orbax nor the standard library
has it: `logging.Filter` and `sys.unraisablehook` are the whole mechanism.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sys
import threading
from typing import Any, List, Sequence

from mathrl_jax.train.checkpoint._errors import CheckpointError

_LOGGERS = ("absl", "asyncio")  # Orbax logs through absl's logger; asyncio logs futures whose error was dropped
_ORBAX = f"{os.sep}orbax{os.sep}"
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")  # how TensorStore's messages carry the errno
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)
"""The errors of a file system that refuses a write (full, over quota, read-only, not permitted, failing): the
environment's, named in one line, not a bug's traceback."""


class SaveNoise(logging.Filter):
    """Holds back Orbax's and asyncio's log records and the TensorStore callbacks' "Event loop is closed" while a
    save of one checkpoint directory is in flight (`hold`); prints them after all when it succeeds (`release`),
    drops them when it fails (`drop`, the failure reported by the caller) and from then on drops those that name
    the directory (asyncio logs a failed write's futures when they are collected, at any later time)."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self._directory = directory
        self._lock = threading.Lock()
        self._mode = "pass"  # "hold": a save in flight; "failed": a save failed and was reported
        self._held: List[Any] = []  # log records and unraisable-hook arguments, in order
        self._previous_hook = None
        self._installed = False

    # ---- what it holds ----

    @staticmethod
    def _is_noise(record: logging.LogRecord) -> bool:
        if record.name == "asyncio":
            return record.levelno >= logging.ERROR
        return record.levelno >= logging.WARNING and _ORBAX in (record.pathname or "")

    def _names_directory(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += str(record.exc_info[1])
        return self._directory in text

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if self._mode == "pass" or not self._is_noise(record):
                return True
            if self._mode == "hold":
                self._held.append(record)
                return False
            return not self._names_directory(record)  # failed: the failed save's futures, collected late

    def _unraisable(self, unraisable: Any) -> None:
        closed_loop = (
            unraisable.object is None
            and isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"
        )
        with self._lock:
            if closed_loop and self._mode == "hold":
                self._held.append(unraisable)
                return
            if closed_loop and self._mode == "failed":
                return
        (self._previous_hook or sys.__unraisablehook__)(unraisable)

    # ---- its states ----

    def hold(self) -> None:
        """A save starts: hold its noise (installs the filter and the hook on first use)."""
        with self._lock:
            if not self._installed:
                for name in _LOGGERS:
                    logging.getLogger(name).addFilter(self)
                self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
                self._installed = True
            if self._mode == "pass":
                self._mode = "hold"

    def release(self) -> None:
        """The save succeeded: print what was held."""
        with self._lock:
            if self._mode != "hold":
                return
            self._mode, held, self._held = "pass", self._held, []
        for item in held:
            if isinstance(item, logging.LogRecord):
                logger = logging.getLogger(item.name)
                if logger.isEnabledFor(item.levelno):
                    logger.handle(item)
            else:
                (self._previous_hook or sys.__unraisablehook__)(item)

    def drop(self) -> None:
        """The save failed (and its error is reported by the caller): drop what was held and what follows of it."""
        with self._lock:
            self._mode, self._held = "failed", []

    def uninstall(self) -> None:
        """Removes the filter and the hook, unless a save failed: the futures of its writes may still be collected
        (and logged) until the process ends."""
        self.release()
        with self._lock:
            if not self._installed or self._mode == "failed":
                return
            for name in _LOGGERS:
                logging.getLogger(name).removeFilter(self)
            if sys.unraisablehook == self._unraisable:
                sys.unraisablehook = self._previous_hook or sys.__unraisablehook__
            self._installed = False


def _os_errno(error: BaseException) -> int | None:
    """The errno of the OSError in `error`'s chain, or of the `os_error_code` in its text (TensorStore's)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno:
            return error.errno
        found = _OS_ERROR_CODE.search(str(error))
        if found:
            return int(found.group(1))
        error = error.__cause__ or error.__context__
    return None


def save_failure(directory: str, step: int, error: BaseException, intact: Sequence[int]) -> CheckpointError:
    """The one-line error of a failed save of `step` into `directory`, naming the step's path, the cause (the OS's
    words for a full or read-only disk) and the steps left intact."""
    code = _os_errno(error)
    if code in DISK_ERRNOS:
        cause = f"{os.strerror(code)} (errno {code})"
    else:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        cause = f"{type(error).__name__}: {lines[0][:300]}"
    kept = (
        f"the steps {', '.join(map(str, intact))} there are kept, and a rerun resumes from the newest"
        if intact
        else "no earlier step was saved there"
    )
    where = os.path.join(directory, str(step))
    return CheckpointError(f"cannot save checkpoint step {step} to {where}: {cause}; {kept}")
