"""Which isolation layers this machine offers (`detect_isolation`), and checking a run's request against them.

A layer is used only where it works here: `unshare` with user namespaces, a writable
pids cgroup, a kernel with Landlock. `run_python(isolation="auto")` takes them all.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import subprocess
import sys

from mathrl_jax.envs.sandbox.cgroup import pids_cgroup_parent
from mathrl_jax.envs.sandbox.landlock import landlock_abi
from mathrl_jax.envs.sandbox.limits import Isolation

UNSHARE_FLAGS = (
    "--user",
    "--map-root-user",
    "--net",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount",
    "--mount-proc",
    "--ipc",
    "--uts",
    "--cgroup",
)
"""`unshare` options of a namespaced run: fresh user (mapped to root), net, pid (with its own /proc), mount,
ipc, uts and cgroup namespaces; `--kill-child` ends the namespace's processes when `unshare` dies."""


@functools.cache
def _unshare_works(unshare: str) -> bool:
    """Whether the `unshare` binary can create the sandbox's namespaces here (containers often forbid it)."""
    path = shutil.which(unshare)
    if path is None:
        return False
    try:
        probe = subprocess.run(
            [path, *UNSHARE_FLAGS, "--", "/bin/sh", "-c", "exit 0"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=10,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def detect_isolation(unshare: str = "unshare") -> Isolation:
    """The strongest isolation this machine offers (`unshare` is the binary to probe)."""
    return Isolation(
        namespaces=sys.platform.startswith("linux") and _unshare_works(unshare),
        pids_cgroup=pids_cgroup_parent() is not None,
        landlock_abi=landlock_abi(),
    )


def resolve_isolation(isolation: str | Isolation) -> Isolation:
    """The layers of `run_python(isolation=...)`; raises if a requested layer is missing or the name is unknown."""
    available = detect_isolation()
    if isinstance(isolation, Isolation):
        requested = isolation
    elif isolation == "auto":
        return available
    elif isolation == "namespace":
        if not available.namespaces:
            raise RuntimeError("isolation='namespace' requested but `unshare` with user namespaces does not work here")
        return available
    elif isolation == "audit":
        requested = dataclasses.replace(available, namespaces=False)
    else:
        raise ValueError(f"isolation must be 'auto', 'namespace', 'audit' or an Isolation, got {isolation!r}")
    missing = []
    if requested.namespaces and not available.namespaces:
        missing.append("namespaces")
    if requested.pids_cgroup and not available.pids_cgroup:
        missing.append("pids_cgroup")
    if requested.landlock_abi > available.landlock_abi:
        missing.append(f"landlock_abi={requested.landlock_abi} (kernel has {available.landlock_abi})")
    if missing:
        raise RuntimeError(f"requested isolation {requested} but this machine lacks: {', '.join(missing)}")
    return requested
