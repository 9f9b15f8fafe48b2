"""The sandbox's modes the tests run in, and `run_python` that opts in to the one that is not a sandbox.

- the strongest isolation here (namespaces + pids / memory cgroups + Landlock + seccomp);
- no namespaces (what Docker usually leaves): Landlock + cgroups + seccomp;
- no namespaces and no cgroups: Landlock + seccomp (threads refused: nothing caps them), run as the caller
  (no uid to drop to, as where the caller lacks `CAP_SETUID`): seccomp alone holds file metadata there;
- the audit hook alone (no namespaces, Landlock, seccomp): not a sandbox, refused by `run_python` unless
  `allow_not_a_sandbox=True`, which the wrapper below passes for it (and only for it), so that the
  hook's own refusals keep being tested there.

A mode this machine lacks is skipped with the reason.
"""

import dataclasses
import os

import pytest

from mathrl_jax.envs import sandbox
from mathrl_jax.envs.sandbox import child  # the entry script, whose path the processes run

AVAILABLE = sandbox.detect_isolation()
NO_NAMESPACES = dataclasses.replace(AVAILABLE, namespaces=False)
LANDLOCK_SECCOMP = sandbox.Isolation(
    namespaces=False, pids_cgroup=False, landlock_abi=AVAILABLE.landlock_abi, seccomp=AVAILABLE.seccomp
)
AUDIT_ONLY = sandbox.Isolation(namespaces=False, pids_cgroup=False, landlock_abi=0)


def _mode(isolation, id, needs):
    return pytest.param(isolation, id=id, marks=pytest.mark.skipif(needs is not None, reason=needs or ""))


_NO_CONTAINMENT = (
    None if AVAILABLE.landlock_abi and AVAILABLE.seccomp else f"needs Landlock and seccomp, have {AVAILABLE.name}"
)
CONTAINED_MODES = [
    _mode(
        AVAILABLE,
        "namespaces+cgroups+landlock",
        None if AVAILABLE.processes_allowed else f"needs namespaces + pids cgroup + Landlock, have {AVAILABLE.name}",
    ),
    _mode(NO_NAMESPACES, "landlock+cgroups+seccomp-without-namespaces", _NO_CONTAINMENT),
    _mode(LANDLOCK_SECCOMP, "landlock+seccomp-without-namespaces-or-cgroups", _NO_CONTAINMENT),
]
"""The modes that run model code by default: the kernel holds the program with the audit hook off."""
ALL_MODES = CONTAINED_MODES + [_mode(AUDIT_ONLY, "audit-hook-only-not-a-sandbox", None)]


def run_python(code, limits=sandbox.SandboxLimits(), **kwargs):  # noqa: B008 - frozen
    """`sandbox.run_python`, opting in to run where the isolation does not contain (the audit-hook-only mode)."""
    isolation = kwargs.get("isolation", "auto")
    if isinstance(isolation, sandbox.Isolation) and not isolation.contains:
        kwargs.setdefault("allow_not_a_sandbox", True)
    return sandbox.run_python(code, limits, **kwargs)


def sandbox_processes():
    """Pids of processes running the sandbox's entry script (any leftover would show here)."""
    script = os.path.abspath(child.__file__).encode()
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if script in f.read():
                        pids.add(int(entry))
            except OSError:
                pass
    return pids
