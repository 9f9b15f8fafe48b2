"""What one sandboxed run reports: a `SandboxResult`, whose `status` is one of `STATUSES`."""

from __future__ import annotations

import dataclasses

from mathrl_jax.envs.sandbox.limits import Isolation

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
