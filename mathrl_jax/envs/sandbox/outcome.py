"""Reading a run's outcome: the supervisor's status report and the host's kill reason, turned into a status.

The report comes through the user program's process (the audit hook's events, the
uncaught exception's kind): the program could have forged it, so no field is trusted
to have a shape, and a kind outside `STATUSES` reads as "error".
"""

from __future__ import annotations

import json
import signal
from typing import Any

from mathrl_jax.envs.sandbox.result import STATUSES


def parse_status(raw: bytes) -> dict[str, Any] | None:
    """The supervisor's JSON report from the status pipe, None when it wrote none (or not JSON)."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None


def classify(report, host_returncode, killed_for, limits, cgroup, memory=None):
    """(status, returncode, signal, violations, cpu seconds) from the supervisor's report.

    `killed_for` is the limit the host killed the run for ("timeout", "output_limit") or None;
    `cgroup` the run's `PidsCgroup` (its `pids.events` tell whether the process cap was hit) or None;
    `memory` the run's `MemoryCgroup` (whether the OOM killer ended one of its processes) or None.
    """
    capped = cgroup is not None and cgroup.hit_max()
    cap_note = (f"process_limit: the cap of {limits.max_processes} processes was reached",) if capped else ()
    out_of_memory = memory is not None and memory.oom_killed()
    if out_of_memory:
        cap_note += (f"memory: the run's limit of {limits.memory_bytes} bytes (all processes) was reached",)
    if report is None:
        if killed_for is not None:
            return killed_for, None, signal.SIGKILL, cap_note, None
        if out_of_memory:  # the OOM killer chose the supervisor itself
            return "memory", None, signal.SIGKILL, cap_note, None
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
    if setup_error is None and out_of_memory:  # whichever process the OOM killer chose, the run passed its limit
        return "memory", returncode, sig, violations, cpu
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
