"""Which isolation layers this machine offers (`detect_isolation`), and checking a run's request against them.

A layer is used only where it works here: `unshare` with user namespaces, a writable
pids cgroup, a writable memory cgroup, a kernel with Landlock. `run_python(isolation="auto")` takes them all.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

from mathrl_jax.envs.sandbox.cgroup import memory_cgroup_parent, pids_cgroup_parent
from mathrl_jax.envs.sandbox.landlock import landlock_abi
from mathrl_jax.envs.sandbox.limits import Isolation
from mathrl_jax.envs.sandbox.seccomp import seccomp_available

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
    return path is not None and _exits_zero([path, *UNSHARE_FLAGS, "--", "/bin/sh", "-c", "exit 0"], timeout_s=10)


def _exits_zero(command: list[str], timeout_s: float) -> bool:
    """Whether a probe `command` (no input or output, a minimal PATH) exits 0 within `timeout_s`."""
    try:
        probe = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            env={"PATH": "/usr/bin:/bin"},
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


@functools.cache
def _private_root_works(unshare: str) -> bool:
    """Whether a namespaced run can build its own root file system here (bind mounts and `pivot_root`,
    `private_root.enter_private_root`). A namespaced run fails closed without it (host sockets would be reachable), so
    a machine where `unshare` works but this does not is given the modes without namespaces instead."""
    from mathrl_jax.envs.sandbox import audit, child

    base = os.path.realpath(tempfile.mkdtemp(prefix="mathrl_sandbox_probe_"))
    try:
        os.mkdir(os.path.join(base, "work"), 0o700)
        roots = [r for r in (sys.prefix, sys.base_prefix, *audit.READ_ROOTS) if os.path.exists(r)]
        command = [shutil.which(unshare), *UNSHARE_FLAGS, "--", sys.executable, "-I", "-B", "-S", child.__file__]
        return _exits_zero(command + ["--probe-root", base, json.dumps(roots)], timeout_s=30)
    except OSError:  # the probe's directory could not be made
        return False
    finally:
        shutil.rmtree(base, ignore_errors=True)


def detect_isolation(unshare: str = "unshare") -> Isolation:
    """The strongest isolation this machine offers (`unshare` is the binary to probe)."""
    return Isolation(
        namespaces=sys.platform.startswith("linux") and _unshare_works(unshare) and _private_root_works(unshare),
        pids_cgroup=pids_cgroup_parent() is not None,
        landlock_abi=landlock_abi(),
        memory_cgroup=memory_cgroup_parent() is not None,
        seccomp=sys.platform.startswith("linux") and seccomp_available(),
    )


NOT_A_SANDBOX = (
    "it is not a sandbox: the kernel would not hold the program once it switches the audit hook off (from Python, "
    "with ctypes): it could read and write host files, reach host sockets and run programs. Run on a machine with "
    "user namespaces, or Landlock (Linux >= 5.13) and libseccomp; or pass allow_not_a_sandbox=True to accept that"
)


def check_contains(isolation: Isolation, allow_not_a_sandbox: bool) -> None:
    """Raises (RuntimeError, naming the missing layers) if `isolation` cannot contain model code and the caller did
    not accept that with `allow_not_a_sandbox=True` (see `Isolation.contains`)."""
    if isolation.contains or allow_not_a_sandbox:
        return
    missing = ["namespaces"]
    if not isolation.landlock_abi:
        missing.append("Landlock")
    if not isolation.seccomp:
        missing.append("seccomp")
    raise RuntimeError(
        f"refusing to run model code under isolation {isolation.name!r} (no {', no '.join(missing)}): {NOT_A_SANDBOX}"
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
    if requested.memory_cgroup and not available.memory_cgroup:
        missing.append("memory_cgroup")
    if requested.seccomp and not available.seccomp:
        missing.append("seccomp (libseccomp.so.2)")
    if requested.landlock_abi > available.landlock_abi:
        missing.append(f"landlock_abi={requested.landlock_abi} (kernel has {available.landlock_abi})")
    if missing:
        raise RuntimeError(f"requested isolation {requested} but this machine lacks: {', '.join(missing)}")
    return requested


def require_isolation(isolation: str | Isolation, allow_not_a_sandbox: bool = False) -> Isolation:
    """The layers `run_python(isolation=..., allow_not_a_sandbox=...)` would use; raises (RuntimeError) where a
    requested layer is missing here or the layers cannot contain model code and that was not accepted. For a
    caller that must know before its first run (the Python tool, at construction)."""
    resolved = resolve_isolation(isolation)
    check_contains(resolved, allow_not_a_sandbox)
    return resolved
